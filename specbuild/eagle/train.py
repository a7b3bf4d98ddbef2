"""Training an EAGLE-3 draft on a frozen Hugging Face target, with training-time test.

EAGLE-3 (Li et al. 2025, arXiv 2503.01840) drops EAGLE's feature-regression loss and trains the draft only on
the target's next-token distribution, and makes the draft see its own outputs during training ("training-time
test", TTT): the draft is unrolled for `ttt_steps` passes over the same window; pass k reads, at every
position, the pre-norm output the previous pass produced one position earlier (in place of the target's
features), attends to the true context up to k positions back plus its own earlier passes along that chain,
and is scored against the target's distribution at every position. That is exactly what the k-th drafted
token sees at inference, so the draft learns to continue from its own hidden states.

The unrolling follows NVIDIA/Model-Optimizer (nvidia-modelopt 0.47.0, the pinned release):
modelopt/torch/speculative/plugins/hf_eagle.py `HFEagleModel.forward` (the draft's pre-norm output rolled one
position right between passes, the loss of pass k on positions k.. against the target's softmax one position
later, weight `eagle_loss_decay_factor`**k = 0.9**k, `eagle_ttt_steps` = 3) and
modelopt/torch/speculative/utils.py `get_ttt_msk_func` (pass k's query at q sees pass 0's keys <= q-k and pass
i's key at q-(k-i)). The loss is soft cross-entropy against the target's full softmax, as there and in
sgl-project/SpecForge specforge/core/eagle3.py @01dd7144 `OnlineEagle3Model.forward`.

Why our own loop and not ModelOpt's `mtsp.convert(model, [("eagle", cfg)])`: (1) its EAGLE-3 first layer applies
`hidden_norm` to the output of the decoder layer's own `input_layernorm` (modeling_eagle.py
`_eagle3_attention_forward_pre_hook` receives the already-normed hidden state), while vLLM, SGLang and
specbuild's runtime apply `hidden_norm` to the raw hidden state, so a trained ModelOpt draft computes something
else than what serves it once `input_layernorm` moves away from ones; (2) it wraps the whole target for HF's
Trainer and needs its own export step, where the draft here is written by `specbuild.eagle.format` (one writer)
and its logits are checked against the runtime's `Eagle3Draft`; (3) a few dozen lines give a seeded,
single-process loop that fits the demo's one-minute budget on one CPU core.

The draft starts from the target where shapes allow: `lm_head` and the final `norm` are copies of the
target's (the draft's output stands in for the target's last hidden state; the norm's scale as the target applies
it), the token embedding is the target's, frozen. Which targets are trained on is `contracts.family_support`'s
("eagle3_training": a family some engine serves EAGLE-3 drafts on): Llama, Mistral, Qwen2, Qwen3, Qwen3-MoE, Phi-3
and Gemma 3 (SGLang), each read through transformers' own model (`output_hidden_states`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from specbuild.atomic import Inputs, atomic_directory
from specbuild.contracts.family_support import family, refusal
from specbuild.eagle.format import Eagle3DraftConfig, default_layer_ids, write_eagle3_draft
from specbuild.eagle.model import Eagle3DraftModule, StepKV
from specbuild.errors import CheckpointError, SpecbuildError
from specbuild.manifest import input_name
from specbuild.tokenizer import load_tokenizer
from specbuild.training import (
    bar,
    check_weights,
    lr_schedule,
    no_transformers_bars,
    optimizer_step,
    trainer_inputs,
    training_streams,
    window_batches,
)

if TYPE_CHECKING:
    from rich.progress import Progress
    from transformers import PreTrainedModel

__all__ = ["Eagle3TrainSettings", "build_draft", "check_target", "evaluate", "train_eagle3", "ttt_losses"]
EVAL_STEPS = 3
"""Held-out agreement is reported for draft steps 1..3 (the draft's first three tokens of a round)."""


@dataclass(frozen=True)
class Eagle3TrainSettings:
    """How the draft is trained; every field is recorded in the output's manifest."""

    steps: int = 300
    lr: float = 3e-3
    seq_len: int = 64
    batch_size: int = 8
    ttt_steps: int = 3
    loss_decay: float = 0.9  # ModelOpt `eagle_loss_decay_factor`
    weight_decay: float = 0.0
    seed: int = 0
    regenerate: int = 0  # > 0: train on this many of the target's own greedy continuations of text prompts
    prompt_tokens: int = 16  # each continuation's prompt, cut from the text (the rest is the target's)
    eval_sequences: int = 32  # held-out continuations scored (when regenerating)

    def check(self) -> None:
        for name in ("steps", "seq_len", "batch_size", "ttt_steps"):
            if getattr(self, name) < 1:
                raise SpecbuildError(f"{name} must be >= 1 (got {getattr(self, name)})")
        if self.seq_len <= self.ttt_steps + 1:
            raise SpecbuildError(f"seq_len {self.seq_len} leaves no scored position after {self.ttt_steps} TTT "
                                 "steps", hint=f"use --seq-len > {self.ttt_steps + 1}")
        if not self.lr > 0:
            raise SpecbuildError(f"lr must be > 0 (got {self.lr})")
        if self.regenerate < 0 or self.eval_sequences < 1:
            raise SpecbuildError("regenerate must be >= 0 and eval_sequences >= 1")
        if self.regenerate and not 1 <= self.prompt_tokens < self.seq_len:
            raise SpecbuildError(f"prompt_tokens must be in [1, seq_len) (got {self.prompt_tokens})")


# ---------------------------------------------------------------------------------------------------- the target


def check_target(target_dir: Path) -> dict[str, Any]:
    """The target's config.json, refused with the field to fix unless it is a HF checkpoint of a family some engine
    serves EAGLE-3 drafts on (`contracts.family_support`) with layers to capture (`format.default_layer_ids`). Read
    by hand: nothing of the target's own code is run."""
    path = Path(target_dir) / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{path}: not found", hint="pass a Hugging Face model directory (config.json + "
                              "*.safetensors) as the target") from None
    except (OSError, ValueError) as err:
        raise CheckpointError(f"{path}: cannot read it as JSON ({err})") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    architectures = config.get("architectures")
    architecture = architectures[0] if isinstance(architectures, list) and architectures else None
    if not isinstance(architecture, str):
        raise CheckpointError(f"{path}: architectures is {architectures!r}, not a list naming the model class",
                              hint="pass a Hugging Face causal LM directory as saved by transformers")
    refused = refusal(architecture, "eagle3_training", "specbuild")
    if refused is not None:
        raise CheckpointError(f"{path}: a {family(architecture)} target: {refused.reason}", hint=refused.instead)
    layers = config.get("num_hidden_layers")
    if isinstance(layers, bool) or not isinstance(layers, int):
        raise CheckpointError(f"{path}: num_hidden_layers must be an integer, got {layers!r}")
    try:
        default_layer_ids(layers)
    except CheckpointError as err:
        raise CheckpointError(f"{path}: num_hidden_layers: {err.message}", hint=err.hint) from None
    return config


def load_target(target_dir: Path) -> PreTrainedModel:
    """The frozen target in float32, from local files only and never with remote code."""
    from transformers import AutoModelForCausalLM

    check_target(target_dir)
    try:
        model = AutoModelForCausalLM.from_pretrained(Path(target_dir), local_files_only=True,
                                                     trust_remote_code=False, dtype=torch.float32)
    except (OSError, ValueError) as err:
        raise CheckpointError(f"{target_dir}: cannot load the target ({err})") from None
    model.eval().requires_grad_(False)
    return model


def draft_config(model: PreTrainedModel) -> Eagle3DraftConfig:
    """The draft's shape from the target's config: EAGLE-3 drafts copy the target's layer sizes and RoPE, and
    capture TensorRT-LLM's default layers, written out so that every engine reads the same ones."""
    cfg = model.config
    heads = cfg.num_attention_heads
    rope = dict(getattr(cfg, "rope_parameters", None) or {})  # transformers 5: rope_theta and the scaling together
    if isinstance(rope.get("full_attention"), dict):  # Gemma 3: one per layer type; the draft attends globally
        rope = dict(rope["full_attention"])
    theta = float(rope.pop("rope_theta", getattr(cfg, "rope_theta", 10000.0)))
    scaling = rope if rope.get("rope_type", rope.get("type", "default")) != "default" else None
    return Eagle3DraftConfig(
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_attention_heads=heads,
        num_key_value_heads=getattr(cfg, "num_key_value_heads", None) or heads,
        head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // heads,
        vocab_size=cfg.vocab_size,
        draft_vocab_size=cfg.vocab_size,
        target_layer_ids=default_layer_ids(cfg.num_hidden_layers),
        rms_norm_eps=cfg.rms_norm_eps,
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=cfg.max_position_embeddings,
    )


def build_draft(model: PreTrainedModel, cfg: Eagle3DraftConfig | None = None) -> Eagle3DraftModule:
    """A fresh draft for `model`: linear weights N(0, 0.02) (HF's initializer_range), norms at one, lm_head and
    the final norm copied from the target, the target's token embedding."""
    cfg = cfg or draft_config(model)
    draft = Eagle3DraftModule(cfg, model.get_input_embeddings().weight)
    with torch.no_grad():
        for module in draft.modules():
            if isinstance(module, torch.nn.Linear):
                torch.nn.init.normal_(module.weight, std=0.02)
        draft.lm_head.weight.copy_(model.get_output_embeddings().weight)
        draft.norm.weight.copy_(norm_scale(model.get_decoder().norm, cfg.rms_norm_eps, cfg.hidden_size))
    return draft


def norm_scale(norm: torch.nn.Module, eps: float, hidden: int) -> torch.Tensor:
    """The per-channel scale the target's final RMSNorm applies, as the draft's RMSNorm weight: read off the norm
    itself (an all-ones input has RMS 1), so a family that stores its weight as an offset from one (Gemma's
    `1 + weight`) starts the draft where the target is, with no per-family rule."""
    with torch.no_grad():
        ones = torch.ones(1, hidden, dtype=next(norm.parameters()).dtype)
        return (norm(ones)[0] * (1.0 + eps) ** 0.5).to(torch.float32)


def target_outputs(model: PreTrainedModel, ids: torch.Tensor, aux_layers: Sequence[int]
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """(captured features [B, T, 3H], logits [B, T, V]). `hidden_states[i + 1]` is decoder layer i's output
    (index 0 is the embedding): the residual stream before the final norm for every layer but the last, which
    `default_layer_ids` never captures."""
    with torch.no_grad():
        out = model(input_ids=ids, output_hidden_states=True, use_cache=False)
    return torch.cat([out.hidden_states[i + 1] for i in aux_layers], dim=-1), out.logits.float()


# ---------------------------------------------------------------------------------------------------- TTT


def ttt_mask(length: int, step: int) -> torch.Tensor:
    """Pass `step`'s boolean mask [T, T*(step+1)] over the keys of passes 0..step: query q sees pass 0's keys
    <= q-step (the true context where this chain of drafts began) and pass i's key at q-(step-i) (the i-th draft
    of that chain). Rows q < step have no true context; they keep their own key so softmax stays finite."""
    q = torch.arange(length)[:, None]
    kv = torch.arange(length)[None, :]
    blocks = [kv <= q - step]
    blocks += [kv == q - (step - i) for i in range(1, step + 1)]
    return torch.cat(blocks, dim=1)


def ttt_losses(
    draft: Eagle3DraftModule,
    aux: torch.Tensor,
    target_logits: torch.Tensor,
    input_ids: torch.Tensor,
    ttt_steps: int,
) -> tuple[list[torch.Tensor], list[tuple[int, int]]]:
    """Per pass k: the soft cross-entropy against the target's distribution, and (agreements, positions) of the
    draft's argmax with the target's. `aux`/`target_logits` [B, T, .] cover tokens 0..T-1, `input_ids` [B, T]
    are tokens 1..T (the token after each position); position t predicts token t+2 ~ target_logits[:, t+1]."""
    b, t, _ = aux.shape
    positions = torch.arange(t)[None, :].expand(b, t)
    target_p = torch.softmax(target_logits[:, 1:], dim=-1)
    target_top = target_logits[:, 1:].argmax(-1)
    hidden = draft.project(aux)
    earlier: list[StepKV] = []
    losses, agreement = [], []
    for k in range(ttt_steps):
        out, kv = draft.step(hidden, input_ids, positions, earlier, ttt_mask(t, k))
        earlier.append(kv)
        logits = draft.logits(out)[:, k:-1]
        loss = -(target_p[:, k:] * F.log_softmax(logits.float(), dim=-1)).sum(-1).mean()
        losses.append(loss)
        with torch.no_grad():
            agreement.append((int((logits.argmax(-1) == target_top[:, k:]).sum()), logits.shape[0] * logits.shape[1]))
        hidden = out.roll(1, dims=1)  # position t of the next pass continues from this pass's output at t-1
    return losses, agreement


def regenerate(model: PreTrainedModel, ids: torch.Tensor, count: int, prompt_tokens: int, span: int,
               batch_size: int = 32) -> torch.Tensor:
    """[count, span] sequences: `prompt_tokens` of the stream `ids` at evenly spaced offsets, continued by the
    target's own greedy decoding (end-of-sequence suppressed). What the draft meets when it serves greedy requests
    is the target's own text, not the corpus; SpecForge regenerates its training data with the target for the
    same reason (sgl-project/SpecForge scripts/regenerate_train_data.py @54d44774)."""
    last = ids.numel() - prompt_tokens
    if last < 0:
        raise SpecbuildError(f"the text has {ids.numel()} tokens, fewer than one prompt of {prompt_tokens}")
    starts = torch.linspace(0, last, count).round().long().tolist()
    prompts = torch.stack([ids[s : s + prompt_tokens] for s in starts])
    new = span - prompt_tokens
    rows = []
    with torch.no_grad():
        for chunk in prompts.split(batch_size):
            out = model.generate(chunk, attention_mask=torch.ones_like(chunk), max_new_tokens=new,
                                 min_new_tokens=new, do_sample=False, pad_token_id=model.config.pad_token_id)
            rows.append(out[:, :span])
    return torch.cat(rows)


def _windows(ids: torch.Tensor, span: int) -> torch.Tensor:
    """The stream's disjoint `span`-token windows (the stream holds one at least: `training_streams` checked)."""
    count = ids.numel() // span
    return ids[: count * span].view(count, span)


def evaluate(
    draft: Eagle3DraftModule,
    model: PreTrainedModel,
    windows: torch.Tensor,
    steps: int = EVAL_STEPS,
) -> dict[str, float]:
    """Held-out `loss` (pass 1's soft cross-entropy) and `step{k}_top1`: how often the k-th drafted token's
    argmax equals the target's, teacher-forced on the windows' tokens (k = 1..steps)."""
    agree, total = [0] * steps, [0] * steps
    loss_sum, loss_count = 0.0, 0
    with torch.no_grad():
        for chunk in windows.split(16):
            aux, logits = target_outputs(model, chunk[:, :-1], draft.cfg.target_layer_ids)
            losses, agreement = ttt_losses(draft, aux, logits, chunk[:, 1:], steps)
            loss_sum += float(losses[0]) * chunk.shape[0]
            loss_count += chunk.shape[0]
            for k, (a, n) in enumerate(agreement):
                agree[k] += a
                total[k] += n
    metrics = {"loss": round(loss_sum / loss_count, 4)}
    metrics.update({f"step{k + 1}_top1": round(agree[k] / total[k], 4) for k in range(steps)})
    return metrics


# ---------------------------------------------------------------------------------------------------- training


def train_eagle3(
    target_dir: Path,
    out_dir: Path,
    settings: Eagle3TrainSettings | None = None,
    *,
    texts: Sequence[str] | None = None,
    eval_texts: Sequence[str] | None = None,
    progress: bool | Progress = True,
    text_files: Sequence[Path] = (),
) -> dict[str, float]:
    """Train an EAGLE-3 draft for the HF model in `target_dir` (`check_target`) and write it to `out_dir`
    (atomically, through `specbuild.eagle.format`).

    `texts` default to the built-in corpus's training part, `eval_texts` to its held-out part; `text_files` are
    the files `texts` came from (the command's --text). An output that would replace an input, a target that is
    not one, unreadable weights and too little text are refused before any work. Seeded: the same
    inputs, settings and thread count give the same bytes. Returns the held-out metrics of the untrained draft
    (`init_loss`, `init_step{k}_top1`) and the trained one (`loss`, `step{k}_top1`, k = 1..3), `final_train_loss`
    and `train_seconds`."""
    settings = settings or Eagle3TrainSettings()
    target_dir, out_dir = Path(target_dir), Path(out_dir)
    inputs = trainer_inputs(out_dir, "OUT_DIR", {"TARGET_DIR": target_dir}, text_files)
    settings.check()
    check_target(target_dir)
    check_weights(target_dir, "TARGET_DIR")
    span = settings.seq_len + 1
    with torch.random.fork_rng(devices=[]), no_transformers_bars():
        torch.manual_seed(settings.seed)
        tokenizer = load_tokenizer(target_dir)
        train_ids, held_ids = training_streams(
            tokenizer, texts, eval_texts, window=span, seq_len=settings.seq_len, text_files=text_files,
            held_window=settings.prompt_tokens if settings.regenerate else span)  # regenerating: prompts only
        model = load_target(target_dir)
        data: torch.Tensor | None = None
        if settings.regenerate:
            data = regenerate(model, train_ids, settings.regenerate, settings.prompt_tokens, span)
            held_windows = regenerate(model, held_ids, settings.eval_sequences, settings.prompt_tokens, span)
        else:
            held_windows = _windows(held_ids, span)
        draft = build_draft(model)
        initial = evaluate(draft, model, held_windows)
        started = time.perf_counter()
        final_loss = _train(draft, model, train_ids if data is None else data, settings, progress)
        train_seconds = time.perf_counter() - started
        trained = evaluate(draft, model, held_windows)
    metrics = {**{f"init_{k}": v for k, v in initial.items()}, **trained,
               "final_train_loss": round(final_loss, 4), "train_seconds": round(train_seconds, 1)}
    save_draft(draft, out_dir, target_dir, settings, metrics, inputs)
    return metrics


@dataclass(frozen=True)
class TargetSet:
    """The frozen target's outputs over a fixed set of training sequences, computed once and reused by every step
    that draws those rows: `features` [N, T, 3H], `log_probs` [N, T, V] (its log-softmax, the soft labels), the
    sequences `ids` [N, T + 1]. A frozen target gives the same outputs each time a row comes back, so running it
    again per step (a third of a step's arithmetic on the demo target) buys nothing."""

    ids: torch.Tensor
    features: torch.Tensor
    log_probs: torch.Tensor

    @classmethod
    def compute(cls, model: PreTrainedModel, ids: torch.Tensor, aux_layers: Sequence[int],
                chunk: int = 16) -> TargetSet:
        features, log_probs = [], []
        for rows in ids.split(chunk):
            aux, logits = target_outputs(model, rows[:, :-1], aux_layers)
            features.append(aux)
            log_probs.append(torch.log_softmax(logits, dim=-1))
        return cls(ids, torch.cat(features), torch.cat(log_probs))

    def rows(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(features, target logits (log-probabilities: the same softmax), next tokens) of rows `index`."""
        return self.features[index], self.log_probs[index], self.ids[index, 1:]


PRECOMPUTE_BYTES = 1 << 30
"""A fixed training set whose target outputs fit in this many bytes is run through the target once; a larger one
(or a token stream's random windows) runs the target per batch."""


def _batches(data: torch.Tensor, model: PreTrainedModel, aux_layers: Sequence[int], settings: Eagle3TrainSettings
             ) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """(features, target logits, next tokens) per step: random windows of a token stream (1-D, the Medusa
    trainers' `window_batches`, the target run per batch) or random rows of a set of sequences (2-D,
    regenerated: the target's outputs computed once for the whole set when they fit `PRECOMPUTE_BYTES`), seeded."""
    if data.dim() == 1:
        for batch in window_batches(data, settings.seq_len + 1, settings.steps, settings.batch_size, settings.seed):
            yield (*target_outputs(model, batch[:, :-1], aux_layers), batch[:, 1:])
        return
    generator = torch.Generator().manual_seed(settings.seed)
    width = len(aux_layers) * model.config.hidden_size + model.config.vocab_size
    fits = data.shape[0] * (data.shape[1] - 1) * width * 4 <= PRECOMPUTE_BYTES
    cached = TargetSet.compute(model, data, aux_layers) if fits else None
    for _ in range(settings.steps):
        index = torch.randint(0, data.shape[0], (settings.batch_size,), generator=generator)
        if cached is not None:
            yield cached.rows(index)
        else:
            batch = data[index]
            yield (*target_outputs(model, batch[:, :-1], aux_layers), batch[:, 1:])


def _train(draft: Eagle3DraftModule, model: PreTrainedModel, data: torch.Tensor,
           settings: Eagle3TrainSettings, progress: bool | Progress) -> float:
    """AdamW on the draft (the Medusa trainers' warmup-cosine schedule and bar) against the frozen target's
    outputs (`_batches`); returns the last step's loss."""
    optimizer = torch.optim.AdamW([p for p in draft.parameters() if p.requires_grad], lr=settings.lr,
                                  weight_decay=settings.weight_decay)
    scheduler = lr_schedule(optimizer, settings.steps)
    loss_value = float("nan")
    draft.train()
    batches = _batches(data, model, draft.cfg.target_layer_ids, settings)
    with bar(progress, settings.steps, "eagle3") as advance:
        for aux, logits, next_ids in batches:
            losses, _ = ttt_losses(draft, aux, logits, next_ids, settings.ttt_steps)
            loss = sum(settings.loss_decay**k * step_loss for k, step_loss in enumerate(losses))
            loss_value = optimizer_step(loss, optimizer, scheduler, advance)
    draft.eval()
    return loss_value


def save_draft(draft: Eagle3DraftModule, out_dir: Path, target_dir: Path, settings: Eagle3TrainSettings,
               metrics: dict[str, float], inputs: Inputs) -> None:
    """The draft through the format's one writer, inside an atomic directory with our manifest (refused there, too,
    when `out_dir` overlaps one of `inputs`)."""
    with atomic_directory(out_dir, inputs=inputs) as tmp:
        write_eagle3_draft(tmp, draft.cfg, draft.state_dict())
        (tmp / "manifest.json").write_text(json.dumps(
            {"producer": "specbuild.eagle.train", "target": input_name(target_dir, out_dir),
             "settings": asdict(settings), "metrics": metrics}, indent=2, sort_keys=True) + "\n")


def with_overrides(settings: Eagle3TrainSettings, **overrides: Any) -> Eagle3TrainSettings:
    """`settings` with the non-None overrides (the command line's options) applied."""
    return replace(settings, **{k: v for k, v in overrides.items() if v is not None})
