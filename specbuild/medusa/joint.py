"""Medusa-2: fine-tune the base together with its Medusa heads (Cai et al. 2024, arXiv 2401.10774, §2.3.2-2.3.3).

Medusa-1 heads read a frozen base's last hidden state, so they can only learn what that state already encodes
about tokens t+2, t+3, ...; Medusa-2 lets the base change too, so its hidden state carries more of the future and
the heads guess it more often. The base must stay the model the user chose, so the recipe keeps it close:

- loss = L_base + λ0 · Σ_k 0.8^k · CE(head k at t, token t+k+2), the paper's combined loss (eq. 2). λ0 is
  `heads_coefficient` (0.2: ModelOpt's and FasterDecoding's axolotl `medusa_heads_coefficient`), 0.8^k the
  Medusa-1 decay (`medusa_decay_coefficient`) and the head loss is Medusa-1's own (`train.head_loss`).
- L_base is self-distillation (§2.3.3): KL(p_original ‖ p_new) of the next-token distribution against a frozen
  copy of the original base, not cross-entropy on the text, so the base learns nothing that changes what it
  would say; there is no chat data to fine-tune on anyway (ModelOpt's `medusa_self_distillation`).
- heads warm up first (the paper's "heads warmup", confirmed in FasterDecoding/Medusa issue 74: heads alone,
  then together): pass Medusa-1 heads, or they are trained here on the frozen base first (`train.train_frozen_heads`).
- differential learning rates: the base's much lower than the heads' (the axolotl configs use a heads LR
  multiplier of 4 on a 1e-5 base LR); both follow Medusa-1's warmup + cosine schedule (`train.lr_schedule`).
- training text: by default half of each batch is the original base's own greedy continuations of training-text
  prompts (the paper's self-distillation data: the model's outputs, what the heads must guess at serving time)
  and half the text itself.

Sources read: the paper §2.3; FasterDecoding/Medusa at e2a5d20c (README "Medusa-2", medusa/train/train_legacy.py
for the heads' loss and file format); NVIDIA/TensorRT-Model-Optimizer modelopt/torch/speculative/plugins/
transformers.py at 4c611e47 (HFMedusaModel: freeze_base_model, medusa_heads_coefficient 0.2,
medusa_decay_coefficient 0.8) and its earlier replace_medusa_compute_loss, adapted from ctlllll/axolotl f86767e
src/axolotl/monkeypatch/medusa_utils.py (medusa_only_heads, medusa_self_distillation as KL against the
original model's logits, medusa_lr_multiplier in its examples).

What it costs: serving, nothing beyond Medusa-1 (the new base replaces the old one, the heads have the same
shape). Training holds two copies of the base (the frozen teacher and the student) and AdamW's two moments of
the student, about 4x the base's weights plus activations, against Medusa-1's one frozen copy.

What changes for the user: greedy output is the *new* base's greedy output, not the original's. Speculation stays
exact with respect to the model it serves, and the new base is held close to the original (metrics below), but
it is another model.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from specbuild.atomic import Inputs, atomic_directory
from specbuild.errors import CheckpointError, SpecbuildError
from specbuild.manifest import input_name
from specbuild.medusa.train import (
    LOSS_DECAY,
    build_heads,
    check_base_family,
    check_hidden_state,
    evaluate_heads,
    final_hidden,
    head_loss,
    load_medusa_heads,
    train_frozen_heads,
    write_heads,
)
from specbuild.tokenizer import TOKENIZER_OWN_FILES, load_tokenizer
from specbuild.training import (
    WARMUP_FRACTION,
    bar,
    check_weights,
    greedy_rows,
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

__all__ = ["BASE_DIR", "HEADS_BASE_NAME", "HEADS_DIR", "JointSettings", "check_start_heads", "own_text_scores",
           "train_medusa_joint", "unigram_loss"]

BASE_DIR = "base"
HEADS_DIR = "heads"
HEADS_BASE_NAME = f"../{BASE_DIR}"
"""The heads' `base_model_name_or_path`: the fine-tuned base beside them, relative, so the output can move."""
PRODUCER = "specbuild.medusa.joint"
OWN_TEXT_SEQUENCES = 32  # held-out prompts whose greedy continuations score the heads (before and after)


@dataclass(frozen=True)
class JointSettings:
    """How Medusa-2 trains. The defaults are the demo's (bench/runtime_bench.py measures them)."""

    steps: int = 100
    seq_len: int = 64
    batch_size: int = 8
    heads_lr: float = 2e-3
    base_lr: float = 1e-4  # the base moves slowly: it is already trained, the heads are not (paper §2.3.2)
    heads_coefficient: float = 0.2  # λ0 of the combined loss
    generated_sequences: int = 256  # the original base's greedy continuations (self-distillation data); 0: text only
    prompt_tokens: int = 16  # the training-text prompt each continuation starts from
    num_heads: int = 4  # heads and layers only when no Medusa-1 heads are given
    num_layers: int = 1
    warmup_steps: int = 200  # Medusa-1 steps on the frozen base when no heads are given
    warmup_lr: float = 3e-3
    seed: int = 0

    def check(self) -> None:
        for name in ("steps", "seq_len", "batch_size", "num_heads", "num_layers", "prompt_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1 (got {getattr(self, name)})")
        for name in ("heads_lr", "base_lr", "heads_coefficient", "warmup_lr"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0 (got {getattr(self, name)})")
        if self.generated_sequences < 0 or self.warmup_steps < 0:
            raise ValueError("generated_sequences and warmup_steps must be >= 0")


def train_medusa_joint(
    base_dir: Path,
    heads_dir: Path | None,
    out_dir: Path,
    settings: JointSettings | None = None,
    *,
    texts: Sequence[str] | None = None,
    eval_texts: Sequence[str] | None = None,
    progress: bool | Progress = True,
    text_files: Sequence[Path] = (),
) -> dict[str, Any]:
    """Fine-tune the HF model in `base_dir` with Medusa heads (those in `heads_dir`, or new ones warmed up here)
    and write `out_dir/base` (an HF checkpoint with the tokenizer files) and `out_dir/heads` (FasterDecoding
    format, naming `../base`) atomically: both or neither.

    `texts` defaults to the built-in corpus's training part, `eval_texts` to its held-out part; `text_files` are
    the files `texts` came from (the command's --text). An output that would replace an input, unreadable
    weights or heads and too little text are refused before any work. Returns, for the
    held-out text, `before` (the original base with the starting heads) and `after` (the new base with the new
    heads), each with `base_heldout_loss`, `heads_heldout_loss` and every head's top-1/top-5 on the text, and
    `heads_own_loss` / `head{k}_own_top1` on the base's own greedy continuations of held-out prompts, plus
    `unigram_heldout_loss` (a model that knows only token frequencies: the scale for the base's loss),
    `kl_to_original` and `greedy_agreement` (how often the new base's next token is the original's).
    """
    from transformers import AutoModelForCausalLM

    settings = settings or JointSettings()
    settings.check()
    base_dir, out_dir = Path(base_dir), Path(out_dir)
    inputs = trainer_inputs(out_dir, "--output", {"--base": base_dir, "--heads": heads_dir}, text_files)
    if not (base_dir / "config.json").is_file():
        raise CheckpointError(f"{base_dir / 'config.json'}: not found; --base must be a Hugging Face model directory")
    check_weights(base_dir, "--base")
    check_base_family(base_dir)  # a base no engine serves Medusa heads on is not trained
    start = None if heads_dir is None else load_medusa_heads(Path(heads_dir))
    num_heads = settings.num_heads if start is None else start[1]
    span = settings.seq_len + num_heads + 1  # inputs plus every head's label for the last input

    with torch.random.fork_rng(devices=[]), no_transformers_bars():
        torch.manual_seed(settings.seed)
        tokenizer = load_tokenizer(base_dir)
        train_ids, held_ids = training_streams(tokenizer, texts, eval_texts, window=span, seq_len=settings.seq_len,
                                               text_files=text_files)

        def load() -> PreTrainedModel:
            return AutoModelForCausalLM.from_pretrained(
                base_dir, local_files_only=True, trust_remote_code=False, dtype=torch.float32
            ).eval()

        original, model = load(), load()
        original.requires_grad_(False)
        saved_dtype = _config_dtype(base_dir)
        vocab_size, hidden_size = model.get_output_embeddings().weight.shape
        heads = _starting_heads(heads_dir, start, settings, int(vocab_size), int(hidden_size), model)
        check_hidden_state(model, train_ids[:span][None, : settings.seq_len])

        started = time.perf_counter()
        warmup_loss = None
        if heads_dir is None and settings.warmup_steps:
            model.requires_grad_(False)
            warmup_loss = train_frozen_heads(heads, model, train_ids, span, settings.seq_len, settings.warmup_steps,
                                 settings.batch_size, settings.warmup_lr, settings.seed, progress, "heads")
        before = evaluate_heads(heads, original, held_ids, train_ids, settings.seq_len, span)
        before.update(own_text_scores(original, heads, held_ids, settings, span, tokenizer.eos_token_id))
        generated = _generate(original, train_ids, settings.generated_sequences, settings, span,
                              tokenizer.eos_token_id)
        final_loss = _train_joint(model, original, heads, train_ids, generated, span, settings, progress)
        train_seconds = time.perf_counter() - started
        after = evaluate_heads(heads, model, held_ids, train_ids, settings.seq_len, span)
        after.update(own_text_scores(model, heads, held_ids, settings, span, tokenizer.eos_token_id))
        closeness = _closeness(model, original, held_ids, settings.seq_len)

    metrics: dict[str, Any] = {
        "before": before,
        "after": after,
        **closeness,
        "unigram_heldout_loss": unigram_loss(train_ids, held_ids, int(vocab_size)),
        "final_loss": round(final_loss, 4),
        "heads_warmup_loss": None if warmup_loss is None else round(warmup_loss, 4),
        "generated_sequences": 0 if generated is None else int(generated.shape[0]),
        "train_seconds": round(train_seconds, 1),
    }
    recorded = {**asdict(settings), "loss_decay": LOSS_DECAY, "warmup_fraction": WARMUP_FRACTION,
                "start_heads": None if heads_dir is None else input_name(heads_dir, out_dir), "num_heads": num_heads,
                "num_layers": len(heads[0]) - 1}
    with no_transformers_bars():
        _save(model, heads, out_dir, base_dir, saved_dtype, metrics, recorded, inputs)
    return metrics


# ---------------------------------------------------------------------------------------------------- inputs


def check_start_heads(heads_dir: Path, given: Mapping[str, int]) -> None:
    """Refuse a head shape the user asked for (`given`: {"--num-heads": n, "--num-layers": l}) that the Medusa-1
    heads in `heads_dir` contradict: Medusa-2 continues those heads as they are, so the option would be silently
    ignored. Named: the heads, their figure and the option."""
    _, num_heads, num_layers = load_medusa_heads(Path(heads_dir))
    found = {"--num-heads": (num_heads, "head count"), "--num-layers": (num_layers, "layers per head")}
    for option, value in given.items():
        figure, what = found[option]
        if value != figure:
            raise SpecbuildError(
                f"{heads_dir}: {option} {value} contradicts the given --heads ({what}: {figure}); Medusa-2 "
                "continues them as they are, so the option would be ignored",
                hint=f"drop {option} (or give {option} {figure}), or leave out --heads to train new heads",
            )


def _config_dtype(base_dir: Path) -> torch.dtype:
    """The dtype the base was saved in (config.json `dtype`, older `torch_dtype`): the new base is saved in it."""
    config = json.loads((base_dir / "config.json").read_text())
    name = config.get("dtype") or config.get("torch_dtype") or "float32"
    dtype = getattr(torch, str(name), None)
    return dtype if isinstance(dtype, torch.dtype) and dtype.is_floating_point else torch.float32


def _starting_heads(heads_dir: Path | None, start: tuple[dict[str, torch.Tensor], int, int] | None,
                    settings: JointSettings, vocab_size: int, hidden_size: int,
                    model: PreTrainedModel) -> nn.ModuleList:
    """The given Medusa-1 heads (`start`, as `load_medusa_heads` read them from `heads_dir`; their shapes checked
    against the base) or fresh ones from the base's lm_head."""
    lm_head = model.get_output_embeddings().weight.detach()
    if start is None:
        return build_heads(hidden_size, vocab_size, settings.num_heads, settings.num_layers, lm_head)
    state_dict, num_heads, num_layers = start
    shape = tuple(state_dict[f"0.{num_layers}.weight"].shape)
    if shape != (vocab_size, hidden_size):
        raise CheckpointError(
            f"{heads_dir}: head 0.{num_layers}.weight has shape {list(shape)}, but the base's lm_head is "
            f"{[vocab_size, hidden_size]}", hint="pass the heads that were trained on this base",
        )
    heads = build_heads(hidden_size, vocab_size, num_heads, num_layers)
    heads.load_state_dict({key: value.float() for key, value in state_dict.items()})
    return heads


def _generate(model: PreTrainedModel, ids: torch.Tensor, count: int, settings: JointSettings, span: int,
              eos_id: int | None, seed_offset: int = 1) -> torch.Tensor | None:
    """`count` rows of `model`'s greedy continuations of `prompt_tokens` prompts from `ids` (`greedy_rows`), None
    for none."""
    if not count:
        return None
    return greedy_rows(model, ids, count=count, prompt_tokens=settings.prompt_tokens, span=span,
                       seed=settings.seed + seed_offset, pad_id=eos_id)


def _row_batches(rows: torch.Tensor, steps: int, batch_size: int, seed: int) -> Iterator[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        yield rows[torch.randint(0, rows.shape[0], (batch_size,), generator=generator)]


# ---------------------------------------------------------------------------------------------------- training


def _train_joint(model: PreTrainedModel, original: PreTrainedModel, heads: nn.ModuleList, train_ids: torch.Tensor,
                 generated: torch.Tensor | None, span: int, settings: JointSettings,
                 progress: bool | Progress) -> float:
    """The combined loss on every batch; the base and the heads in one AdamW with their own learning rates."""
    seq_len = settings.seq_len
    model.requires_grad_(True)
    model.train()
    heads.train()
    optimizer = torch.optim.AdamW(
        [{"params": [p for p in model.parameters() if p.requires_grad], "lr": settings.base_lr},
         {"params": list(heads.parameters()), "lr": settings.heads_lr}],
        weight_decay=0.0,
    )
    scheduler = lr_schedule(optimizer, settings.steps)
    text_size = settings.batch_size if generated is None else max(1, settings.batch_size // 2)
    text = window_batches(train_ids, span, settings.steps, text_size, settings.seed)
    own = None if generated is None else _row_batches(generated, settings.steps, settings.batch_size - text_size,
                                                      settings.seed + 2)
    loss_value = float("nan")
    with bar(progress, settings.steps, "medusa-2") as advance:
        for _ in range(settings.steps):
            window = next(text)
            if own is not None and settings.batch_size > text_size:
                window = torch.cat([window, next(own)])
            inputs = window[:, :seq_len]
            with torch.no_grad():
                teacher = original(input_ids=inputs).logits.log_softmax(-1)
            hidden = final_hidden(model, inputs)
            student = model.get_output_embeddings()(hidden).log_softmax(-1)
            distill = F.kl_div(student.flatten(0, 1), teacher.flatten(0, 1), log_target=True, reduction="batchmean")
            loss = distill + settings.heads_coefficient * head_loss(heads, hidden, window, seq_len)
            loss_value = optimizer_step(loss, optimizer, scheduler, advance)
    model.eval()
    heads.eval()
    model.requires_grad_(False)
    return loss_value


# ---------------------------------------------------------------------------------------------------- measures


def _closeness(model: PreTrainedModel, original: PreTrainedModel, held_ids: torch.Tensor,
               seq_len: int) -> dict[str, float]:
    """How far the new base moved on held-out text: mean KL(p_original ‖ p_new) per token, and how often both
    pick the same next token (greedy agreement)."""
    count = held_ids.numel() // seq_len
    windows = held_ids[: count * seq_len].view(count, seq_len)
    kl = agree = 0.0
    with torch.no_grad():
        for chunk in windows.split(16):
            new = model(input_ids=chunk).logits.log_softmax(-1).flatten(0, 1)
            old = original(input_ids=chunk).logits.log_softmax(-1).flatten(0, 1)
            kl += float(F.kl_div(new, old, log_target=True, reduction="sum"))
            agree += float((new.argmax(-1) == old.argmax(-1)).sum())
    positions = windows.numel()
    return {"kl_to_original": round(kl / positions, 4), "greedy_agreement": round(agree / positions, 4)}


def own_text_scores(model: PreTrainedModel, heads: nn.ModuleList, held_ids: torch.Tensor, settings: JointSettings,
                     span: int, eos_id: int | None) -> dict[str, float]:
    """The heads scored on `model`'s own greedy continuations of held-out prompts: what they must guess when
    they speculate for it. `heads_own_loss` is the training loss (Σ_k 0.8^k CE_k), `head{k}_own_top1` how often
    head k's first choice is the token the model itself says k+2 steps on."""
    rows = _generate(model, held_ids, OWN_TEXT_SEQUENCES, settings, span, eos_id, seed_offset=3)
    assert rows is not None
    seq_len = settings.seq_len
    with torch.no_grad():
        hidden = final_hidden(model, rows[:, :seq_len])
        scores = {"heads_own_loss": round(float(head_loss(heads, hidden, rows, seq_len)), 4)}
        for k, head in enumerate(heads):
            hits = head(hidden).argmax(-1) == rows[:, k + 2 : k + 2 + seq_len]
            scores[f"head{k}_own_top1"] = round(float(hits.float().mean()), 4)
    return scores


def unigram_loss(train_ids: torch.Tensor, held_ids: torch.Tensor, vocab_size: int) -> float:
    """Held-out cross-entropy of the training text's token frequencies (add-one smoothed): what a model that has
    learnt nothing about context scores, the far end of the scale the base's loss is judged on."""
    counts = torch.bincount(train_ids, minlength=vocab_size).double() + 1
    log_p = (counts / counts.sum()).log()
    return round(float(-log_p[held_ids[1:]].mean()), 4)


# ---------------------------------------------------------------------------------------------------- saving


def _save(model: PreTrainedModel, heads: nn.ModuleList, out_dir: Path, base_dir: Path, dtype: torch.dtype,
          metrics: dict[str, Any], settings: dict[str, Any], inputs: Inputs) -> None:
    """`out_dir/base` + `out_dir/heads` + manifest.json, swapped in together."""
    with atomic_directory(out_dir, inputs=inputs) as tmp:
        base_out = tmp / BASE_DIR
        model.to(dtype).save_pretrained(str(base_out))
        for name in TOKENIZER_OWN_FILES:
            if (base_dir / name).is_file():
                shutil.copy2(base_dir / name, base_out / name)
        write_heads(tmp / HEADS_DIR, heads, base_out, HEADS_BASE_NAME, metrics["after"], settings, PRODUCER)
        manifest = {"producer": PRODUCER, "base": input_name(base_dir, out_dir), "settings": settings,
                    "metrics": metrics}
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True, default=str) + "\n")
