"""Training a self-draft adapter: one decoder layer after the frozen target's first L layers, distilled from the
target's own logits.

The draft is `lm_head(norm(adapter(h_L)))`, where h_L is the target's residual stream after L layers and norm and
lm_head are the target's own (frozen; only the adapter learns). The loss is KL(p_target || p_draft) over every
position of windows of the training text: the draft learns to predict what the target will say, not the text
(what speculative acceptance rewards). The adapter starts as a copy of the target's own layer L, so the untrained
draft is the (L+1)-layer cut of the target; distillation then teaches that one layer the work of the remaining
N - L. Seeded: the same inputs and thread count give the same bytes.

The design is Kangaroo's (Liu et al. 2024, arXiv 2404.18911: a shallow sub-network of the target plus a small
trained adapter drafts, the whole target verifies); the loss is the forward KL, one of the divergences DistillSpec
(Zhou et al. 2023, arXiv 2310.08461) compares for aligning a draft with its target (here on the training text,
not on the draft's own samples).

Targets: Llama, Mistral, Qwen2, Qwen3 and Phi-3 (`contracts.family_support` says why not the others): their
decoder layers run standalone given rotary embeddings (huggingface/transformers 5.14
src/transformers/models/llama/modeling_llama.py `LlamaDecoderLayer.forward(hidden_states, attention_mask,
position_ids, ..., position_embeddings)`, the same call in models/qwen3/modeling_qwen3.py and
models/phi3/modeling_phi3.py), with causal attention when no mask is
given (src/transformers/integrations/sdpa_attention.py: `is_causal` when `attention_mask is None`); a Mistral
window longer than seq_len changes nothing.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from specbuild.atomic import MANIFEST, Inputs, atomic_directory
from specbuild.contracts.family_support import SELF_DRAFT_ADAPTER_FAMILIES, architecture_of, family, refusal
from specbuild.errors import CheckpointError, SpecbuildError
from specbuild.manifest import input_name
from specbuild.self_draft.adapter_format import CONFIG_NAME, FORMAT, WEIGHTS_NAME
from specbuild.tokenizer import load_tokenizer

# The shared training pieces: one token stream, schedule, batch order and progress bar for every trainer.
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

PRODUCER = "specbuild.self_draft.train"
FAMILIES = tuple(SELF_DRAFT_ADAPTER_FAMILIES.values())
"""model_type of the targets adapters are trained on (contracts.family_support, with the reason for the others)."""
_INSTEAD = "use draft.source: target_layers without draft.adapter for this model"
EVAL_WINDOWS = 64  # held-out windows scored (enough for a figure; each costs two target forwards)


def train_adapter(
    target_dir: Path,
    output_dir: Path,
    *,
    layers: int,
    steps: int = 200,
    seq_len: int = 64,
    batch_size: int = 8,
    lr: float = 1e-3,
    seed: int = 0,
    texts: Sequence[str] | None = None,
    eval_texts: Sequence[str] | None = None,
    progress: bool | Progress = True,
    text_files: Sequence[Path] = (),
) -> dict[str, float]:
    """Train an adapter after the first `layers` layers of the frozen HF model in `target_dir` and write it to
    `output_dir` atomically (`specbuild.self_draft.adapter_format`). Texts default to the built-in corpus's
    training and held-out parts; `text_files` are the files `texts` came from (the command's --text). An output
    that would replace an input, unreadable weights and too little text are refused before any work. Returns
    held-out figures, each for the L-layer cut without adapter
    (`no_adapter_*`), the adapter at its start (`init_*`) and trained: `*_kl` (the distillation loss) and
    `*_agree` (how often the draft's argmax is the target's: greedy acceptance of the first draft token), with
    `final_loss` and `train_seconds`."""
    from transformers import AutoModelForCausalLM

    for name, value in (("steps", steps), ("seq_len", seq_len), ("batch_size", batch_size)):
        if value < 1:
            raise SpecbuildError(f"{name} must be >= 1 (got {value})")
    if not lr > 0:
        raise SpecbuildError(f"lr must be > 0 (got {lr})", hint="give --lr a positive learning rate")
    target_dir, output_dir = Path(target_dir), Path(output_dir)
    inputs = trainer_inputs(output_dir, "--output", {"--target": target_dir}, text_files)
    check_weights(target_dir, "--target")
    _check_family(target_dir, architecture_of(target_dir))  # before the tokenizer, the texts and the model load
    with torch.random.fork_rng(devices=[]), no_transformers_bars():
        torch.manual_seed(seed)
        tokenizer = load_tokenizer(target_dir)
        train_ids, held_ids = training_streams(tokenizer, texts, eval_texts, window=seq_len, seq_len=seq_len,
                                               text_files=text_files)
        model = AutoModelForCausalLM.from_pretrained(target_dir, local_files_only=True, trust_remote_code=False,
                                                     dtype=torch.float32, attn_implementation="sdpa").eval()
        model.requires_grad_(False)
        prefix = _check_model(model, target_dir, layers)
        adapter = copy.deepcopy(model.get_decoder().layers[layers])
        evaluate_before = _evaluate(model, adapter, layers, held_ids, seq_len)
        started = time.perf_counter()
        final_loss = _train(model, adapter, layers, train_ids, steps, seq_len, batch_size, lr, seed, progress)
        seconds = time.perf_counter() - started
        trained = _evaluate(model, adapter, layers, held_ids, seq_len)
    metrics = {"no_adapter_kl": evaluate_before["cut_kl"], "no_adapter_agree": evaluate_before["cut_agree"],
               "init_kl": evaluate_before["kl"], "init_agree": evaluate_before["agree"], "kl": trained["kl"],
               "agree": trained["agree"], "final_loss": round(final_loss, 4), "train_seconds": round(seconds, 1)}
    config = {"format": FORMAT, "layers": layers, "hidden_size": model.config.hidden_size,
              "num_hidden_layers": model.config.num_hidden_layers, "model_type": model.config.model_type,
              "target": input_name(target_dir, output_dir),
              "training": {"steps": steps, "seq_len": seq_len, "batch_size": batch_size, "lr": lr, "seed": seed,
                           "loss": "KL(target || draft)", "init": f"target layer {layers}"},
              "metrics": metrics}
    tensors = {prefix + key: value.detach().contiguous() for key, value in adapter.state_dict().items()}
    _save(output_dir, tensors, config, inputs)
    return metrics


def _check_family(target_dir: Path, architecture: str | None) -> None:
    """Refuse a target of a family adapters are not trained on (`contracts.family_support`, with the reason)."""
    refused = None if architecture is None else refusal(architecture, "self_draft_adapter", "specbuild")
    if architecture is not None and refused is not None:
        raise CheckpointError(f"{target_dir / 'config.json'}: a {family(architecture)} target: {refused.reason}",
                              hint=refused.instead)


def _check_model(model: PreTrainedModel, target_dir: Path, layers: int) -> str:
    """The HF name prefix of the target's layer `layers` (the adapter's tensors take its names)."""
    architecture = type(model).__name__
    _check_family(target_dir, architecture)
    if model.config.model_type not in FAMILIES:
        raise CheckpointError(f"{target_dir / 'config.json'}: a {family(architecture)} target: adapters are trained "
                              f"for {', '.join(FAMILIES)}", hint=_INSTEAD)
    total = model.config.num_hidden_layers
    if not 1 <= layers < total:
        raise CheckpointError(f"{target_dir / 'config.json'}: --layers {layers} must be 1 to {total - 1} (the "
                              f"target has {total} layers; the adapter runs after the first L of them)")
    layer = model.get_decoder().layers[layers]
    return next(name for name, module in model.named_modules() if module is layer) + "."


def _draft_logits(model: PreTrainedModel, adapter: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    decoder = model.get_decoder()
    positions = torch.arange(hidden.shape[1])[None].expand(hidden.shape[0], -1)
    out = adapter(hidden, attention_mask=None, position_ids=positions,
                  position_embeddings=decoder.rotary_emb(hidden, positions))
    out = out[0] if isinstance(out, tuple) else out
    return model.get_output_embeddings()(decoder.norm(out))


def _teacher(model: PreTrainedModel, ids: torch.Tensor, layers: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(the target's log-probabilities, its residual stream after `layers` layers) for a batch of windows."""
    with torch.no_grad():
        out = model(input_ids=ids, output_hidden_states=True)
    return torch.log_softmax(out.logits.float(), -1), out.hidden_states[layers]


def _kl(teacher: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """Mean over positions of KL(p_target || p_draft)."""
    draft = torch.log_softmax(logits.float(), -1)
    return F.kl_div(draft.flatten(0, 1), teacher.flatten(0, 1), log_target=True, reduction="batchmean")


def _train(model: PreTrainedModel, adapter: torch.nn.Module, layers: int, ids: torch.Tensor, steps: int,
           seq_len: int, batch_size: int, lr: float, seed: int, progress: bool | Progress) -> float:
    adapter.train().requires_grad_(True)
    optimizer = torch.optim.AdamW(adapter.parameters(), lr=lr, weight_decay=0.0)
    scheduler = lr_schedule(optimizer, steps)
    loss_value = float("nan")
    with bar(progress, steps, "adapter") as advance:
        for window in window_batches(ids, seq_len, steps, batch_size, seed):
            teacher, hidden = _teacher(model, window, layers)
            loss = _kl(teacher, _draft_logits(model, adapter, hidden))
            loss_value = optimizer_step(loss, optimizer, scheduler, advance)
    adapter.eval().requires_grad_(False)
    return loss_value


def _evaluate(model: PreTrainedModel, adapter: torch.nn.Module, layers: int, ids: torch.Tensor,
              seq_len: int) -> dict[str, float]:
    """Held-out KL and argmax agreement of the adapter draft and of the plain L-layer cut, over the first
    EVAL_WINDOWS disjoint windows."""
    windows = ids[: (ids.numel() // seq_len) * seq_len].view(-1, seq_len)[:EVAL_WINDOWS]
    sums = {"kl": 0.0, "agree": 0.0, "cut_kl": 0.0, "cut_agree": 0.0}
    head, norm = model.get_output_embeddings(), model.get_decoder().norm
    with torch.no_grad():
        for chunk in windows.split(16):
            teacher, hidden = _teacher(model, chunk, layers)
            best = teacher.argmax(-1)
            for key, logits in (("", _draft_logits(model, adapter, hidden)), ("cut_", head(norm(hidden)))):
                sums[key + "kl"] += float(_kl(teacher, logits)) * chunk.numel()
                sums[key + "agree"] += float((logits.argmax(-1) == best).sum())
    return {key: round(value / windows.numel(), 4) for key, value in sums.items()}


def _save(output_dir: Path, tensors: dict[str, torch.Tensor], config: dict[str, Any], inputs: Inputs) -> None:
    """Weights and config land together or not at all; manifest.json, as every trainer writes one, marks the
    directory as specbuild's, so a rerun into the same output may replace it (`atomic.check_replaceable`)."""
    from safetensors.torch import save_file

    manifest = {"producer": PRODUCER, "target": config["target"],
                "settings": {"layers": config["layers"], **config["training"]}, "metrics": config["metrics"]}
    with atomic_directory(output_dir, inputs=inputs) as tmp:
        save_file(tensors, str(tmp / WEIGHTS_NAME), metadata={"format": "pt"})
        (tmp / CONFIG_NAME).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
