"""Medusa-1 heads: trained on a frozen base, saved and loaded in the FasterDecoding format.

Head k (0-based) reads the base's final normalised hidden state at position t, the tensor the base's lm_head
reads, and predicts token t+k+2 (the base itself predicts t+1). Each head is `ResBlock x L` then a vocab
projection; the ResBlocks start as (almost) identity and each projection starts as a copy of the base lm_head,
the usual Medusa practice, so a head begins by guessing the base's next token and learns the shift from there.
Losses are weighted 0.8^k (Medusa-1 paper, ModelOpt's decay coefficient): later heads are less accurate anyway.

File format (what FasterDecoding's `train_legacy.py` writes and TensorRT-LLM's `load_medusa_hf` reads):
`medusa_lm_head.safetensors` with `{h}.{l}.linear.weight` [H, H], `{h}.{l}.linear.bias` [H] and `{h}.{L}.weight`
[V, H] (no prefix), `config.json` with `medusa_num_heads` / `medusa_num_layers` / `base_model_name_or_path`, and
the tokenizer files. Published configs are known to state the wrong head count, so loading counts from the keys.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from specbuild.atomic import Inputs, atomic_directory
from specbuild.errors import CheckpointError, SpecbuildError
from specbuild.medusa.heads_format import PICKLE_NAME, WEIGHTS_NAME, count_heads, heads_file, read_heads
from specbuild.tokenizer import TOKENIZER_OWN_FILES, load_tokenizer
from specbuild.training import (
    WARMUP_FRACTION,
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

__all__ = [
    "CONFIG_NAME",
    "LOSS_DECAY",
    "PICKLE_NAME",
    "WEIGHTS_NAME",
    "ResBlock",
    "apply_heads",
    "build_heads",
    "check_hidden_state",
    "evaluate_heads",
    "final_hidden",
    "head_loss",
    "load_medusa_heads",
    "train_frozen_heads",
    "train_medusa_heads",
    "write_heads",
]

CONFIG_NAME = "config.json"
LOSS_DECAY = 0.8
"""Head k's loss weight is LOSS_DECAY**k (Medusa-1 paper; ModelOpt `medusa_decay_coefficient`)."""
TOP_K_EVAL = 5


class ResBlock(nn.Module):
    """y = x + SiLU(W x + b), W zero-initialised so that a fresh head starts from the base's own hidden state."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        nn.init.zeros_(self.linear.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.silu(self.linear(x))


def build_heads(
    hidden_size: int, vocab_size: int, num_heads: int, num_layers: int, lm_head: torch.Tensor | None = None
) -> nn.ModuleList:
    """Heads whose `state_dict()` has exactly the FasterDecoding keys. Every ResBlock is its own module
    (FasterDecoding's `[ResBlock(H)] * L` shares one, which safetensors then refuses to save)."""
    heads = nn.ModuleList()
    for _ in range(num_heads):
        projection = nn.Linear(hidden_size, vocab_size, bias=False)
        if lm_head is not None:
            with torch.no_grad():
                projection.weight.copy_(lm_head)
        heads.append(nn.Sequential(*(ResBlock(hidden_size) for _ in range(num_layers)), projection))
    return heads


def apply_heads(
    state_dict: Mapping[str, torch.Tensor], num_heads: int, num_layers: int, hidden: torch.Tensor
) -> torch.Tensor:
    """Head logits [heads, *hidden.shape[:-1], V] straight from the saved tensors: plain PyTorch with no
    modules, the reference that converted checkpoints and runtimes are compared against."""
    outputs = []
    for head in range(num_heads):
        x = hidden
        for layer in range(num_layers):
            weight = state_dict[f"{head}.{layer}.linear.weight"]
            bias = state_dict[f"{head}.{layer}.linear.bias"]
            x = x + F.silu(x @ weight.T + bias)
        outputs.append(x @ state_dict[f"{head}.{num_layers}.weight"].T)
    return torch.stack(outputs)


# ---------------------------------------------------------------------------------------------------- loading


def load_medusa_heads(directory: Path, *, allow_pickle: bool = False) -> tuple[dict[str, torch.Tensor], int, int]:
    """(state_dict, num_heads, num_layers) of a FasterDecoding heads checkpoint (a directory or the file itself).

    Counts come from the tensor keys, not config.json, which is wrong in published checkpoints. A `.pt` file is
    a pickle, which can run code when loaded: it is refused unless `allow_pickle` (`heads_format.read_heads`).
    """
    path = heads_file(directory)
    state_dict = read_heads(path, allow_pickle=allow_pickle)
    num_heads, num_layers = _count_heads(state_dict, path)
    return state_dict, num_heads, num_layers


def _count_heads(state_dict: Mapping[str, torch.Tensor], path: Path) -> tuple[int, int]:
    """Heads and layers from the keys (`count_heads`), then every tensor's shape checked against head 0's."""
    num_heads, num_layers = count_heads(state_dict, path)
    heads = range(num_heads)
    vocab, hidden = state_dict[f"0.{num_layers}.weight"].shape
    for head in heads:
        expected = {f"{head}.{num_layers}.weight": (vocab, hidden)}
        for layer in range(num_layers):
            expected[f"{head}.{layer}.linear.weight"] = (hidden, hidden)
            expected[f"{head}.{layer}.linear.bias"] = (hidden,)
        for key, shape in expected.items():
            if tuple(state_dict[key].shape) != shape:
                raise CheckpointError(f"{path}: {key} has shape {list(state_dict[key].shape)}, expected {list(shape)}")
    return len(heads), num_layers


# ---------------------------------------------------------------------------------------------------- training


def train_medusa_heads(
    base_dir: Path,
    output_dir: Path,
    *,
    num_heads: int = 4,
    num_layers: int = 1,
    steps: int = 300,
    seq_len: int = 128,
    batch_size: int = 8,
    lr: float = 1e-3,
    seed: int = 0,
    texts: Sequence[str] | None = None,
    eval_texts: Sequence[str] | None = None,
    base_model_name_or_path: str | None = None,
    progress: bool | Progress = True,
    text_files: Sequence[Path] = (),
) -> dict[str, float]:
    """Train Medusa-1 heads on the frozen model in `base_dir` and save them atomically to `output_dir`.

    `texts` defaults to the built-in corpus's training part (`specbuild.corpus`), `eval_texts` to its held-out
    part; `text_files` are the files `texts` came from (the command's --text), named in refusals and never
    replaced by the output. An output that would replace an input, unreadable weights and too little text are
    refused before any work. `base_model_name_or_path` is what config.json records (default: `base_dir`'s
    absolute path; the demo build records the target relative to the heads, so its directory can be moved).
    `progress` may also be a running rich Progress to add a bar to. Seeded: the same inputs and thread count
    give the same bytes. Returns held-out `head{k}_top1` / `head{k}_top5` accuracies, two chance levels for
    head 0 (`base_top1_at_t2`: the base's next-token guess scored against t+2; `unigram_top1`: always the most
    frequent training token), `base_top1` (the base's own next-token accuracy), `final_loss` and `train_seconds`.
    """
    from transformers import AutoModelForCausalLM

    for name, value in (("num_heads", num_heads), ("num_layers", num_layers), ("steps", steps),
                        ("seq_len", seq_len), ("batch_size", batch_size)):
        if value < 1:
            raise SpecbuildError(f"{name} must be >= 1 (got {value})")
    if not lr > 0:
        raise SpecbuildError(f"lr must be > 0 (got {lr})", hint="give --lr a positive learning rate")
    base_dir, output_dir = Path(base_dir), Path(output_dir)
    inputs = trainer_inputs(output_dir, "--output", {"--base": base_dir}, text_files)
    check_weights(base_dir, "--base")
    check_base_family(base_dir)
    span = seq_len + num_heads + 1  # inputs plus every head's label for the last input

    with torch.random.fork_rng(devices=[]), no_transformers_bars():
        torch.manual_seed(seed)
        tokenizer = load_tokenizer(base_dir)
        train_ids, held_ids = training_streams(tokenizer, texts, eval_texts, window=span, seq_len=seq_len,
                                               text_files=text_files)
        model = AutoModelForCausalLM.from_pretrained(
            base_dir, local_files_only=True, trust_remote_code=False, dtype=torch.float32
        ).eval()
        model.requires_grad_(False)
        lm_head = model.get_output_embeddings()
        vocab_size, hidden_size = lm_head.weight.shape
        check_hidden_state(model, train_ids[:span][None, :seq_len])

        heads = build_heads(hidden_size, vocab_size, num_heads, num_layers, lm_head.weight.detach())
        started = time.perf_counter()
        final_loss = train_frozen_heads(heads, model, train_ids, span, seq_len, steps, batch_size, lr, seed, progress)
        train_seconds = time.perf_counter() - started
        metrics = evaluate_heads(heads, model, held_ids, train_ids, seq_len, span)
    metrics = {**metrics, "final_loss": round(final_loss, 4), "train_seconds": round(train_seconds, 1)}
    _save(heads, output_dir, base_dir, base_model_name_or_path or str(base_dir.absolute()), metrics,
          {"steps": steps, "seq_len": seq_len, "batch_size": batch_size, "lr": lr, "seed": seed,
           "loss_decay": LOSS_DECAY, "warmup_fraction": WARMUP_FRACTION}, inputs)
    return metrics


def check_base_family(base_dir: Path) -> None:
    """Refuse, before anything is loaded, a base of a family no engine serves Medusa heads on
    (`contracts.family_support`: TensorRT-LLM 1.2's Medusa converter takes Llama, Mistral, Mixtral and Qwen2)."""
    from specbuild.contracts.family_support import architecture_of, family, refusal

    architecture = architecture_of(base_dir)
    refused = refusal(architecture, "medusa_training", "specbuild") if architecture is not None else None
    if refused is not None:
        raise CheckpointError(f"{Path(base_dir) / 'config.json'}: a {family(architecture)} base: {refused.reason}",
                              hint=refused.instead)


def final_hidden(model: PreTrainedModel, input_ids: torch.Tensor) -> torch.Tensor:
    """The final normalised hidden state: the decoder's `last_hidden_state` (Llama/Qwen2/Mistral apply the
    final norm inside `model.model`, GPT-2 its ln_f inside `transformer`)."""
    return model.get_decoder()(input_ids=input_ids).last_hidden_state


def check_hidden_state(model: PreTrainedModel, input_ids: torch.Tensor) -> None:
    """The heads are only right if they read what lm_head reads; models that scale or soft-cap their logits
    after lm_head (or apply the norm outside the decoder) would silently train on the wrong tensor."""
    with torch.no_grad():
        through_head = model.get_output_embeddings()(final_hidden(model, input_ids))
        logits = model(input_ids=input_ids).logits
    if not torch.allclose(through_head, logits, rtol=1e-4, atol=1e-4):
        difference = float((through_head - logits).abs().max())
        raise CheckpointError(
            f"{type(model).__name__}: lm_head(last_hidden_state) differs from the model's logits by {difference:.3g}",
            hint="this architecture post-processes its hidden state or logits; Medusa heads cannot be trained on it",
        )


def head_loss(heads: nn.ModuleList, hidden: torch.Tensor, window: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Σ_k 0.8^k · CE(head k at t, token t+k+2)."""
    loss = hidden.new_zeros(())
    for k, head in enumerate(heads):
        labels = window[:, k + 2 : k + 2 + seq_len]
        loss = loss + LOSS_DECAY**k * F.cross_entropy(head(hidden).flatten(0, 1), labels.flatten())
    return loss


def train_frozen_heads(
    heads: nn.ModuleList,
    model: PreTrainedModel,
    ids: torch.Tensor,
    span: int,
    seq_len: int,
    steps: int,
    batch_size: int,
    lr: float,
    seed: int,
    progress: bool | Progress,
    description: str = "medusa",
) -> float:
    """Medusa-1's loop: the heads learn on the frozen base's hidden states; returns the last step's loss."""
    heads.train()
    optimizer = torch.optim.AdamW(heads.parameters(), lr=lr, weight_decay=0.0)
    scheduler = lr_schedule(optimizer, steps)
    loss_value = float("nan")
    with bar(progress, steps, description) as advance:
        for window in window_batches(ids, span, steps, batch_size, seed):
            with torch.no_grad():  # the base is frozen: its hidden states are inputs, not part of the graph
                hidden = final_hidden(model, window[:, :seq_len])
            loss_value = optimizer_step(head_loss(heads, hidden, window, seq_len), optimizer, scheduler, advance)
    heads.eval()
    return loss_value


def evaluate_heads(
    heads: nn.ModuleList,
    model: PreTrainedModel,
    held_ids: torch.Tensor,
    train_ids: torch.Tensor,
    seq_len: int,
    span: int,
) -> dict[str, float]:
    """Teacher-forced scores on held-out windows; each position is scored once for every head. Besides each
    head's top-1/top-5 and the chance levels, `base_heldout_loss` (the base's next-token cross-entropy) and
    `heads_heldout_loss` (the training loss, Σ_k 0.8^k CE_k) on the same positions: Medusa-2 changes the base,
    and these are what say by how much, and whether the heads gained."""
    count = (held_ids.numel() - span) // seq_len + 1
    if count < 1:
        raise ValueError(f"held-out text has {held_ids.numel()} tokens, fewer than one window of {span}")
    windows = held_ids[: (count - 1) * seq_len + span].unfold(0, span, seq_len)
    top1 = torch.zeros(len(heads))
    top5 = torch.zeros(len(heads))
    base_top1 = base_at_t2 = unigram = base_loss = heads_loss = 0.0
    most_frequent = int(torch.bincount(train_ids).argmax())
    with torch.no_grad():
        for chunk in windows.split(16):
            hidden = final_hidden(model, chunk[:, :seq_len])
            logits = model.get_output_embeddings()(hidden)
            guesses = logits.argmax(-1)
            next_tokens = chunk[:, 1 : 1 + seq_len]
            base_loss += float(F.cross_entropy(logits.flatten(0, 1), next_tokens.flatten(), reduction="sum"))
            heads_loss += float(head_loss(heads, hidden, chunk, seq_len)) * chunk.shape[0] * seq_len
            base_top1 += float((guesses == next_tokens).sum())
            base_at_t2 += float((guesses == chunk[:, 2 : 2 + seq_len]).sum())
            unigram += float((chunk[:, 2 : 2 + seq_len] == most_frequent).sum())
            for k, head in enumerate(heads):
                labels = chunk[:, k + 2 : k + 2 + seq_len]
                best = head(hidden).topk(TOP_K_EVAL, dim=-1).indices
                top1[k] += float((best[..., 0] == labels).sum())
                top5[k] += float((best == labels[..., None]).any(-1).sum())
    positions = windows.shape[0] * seq_len
    metrics = {}
    for k in range(len(heads)):
        metrics[f"head{k}_top1"] = round(float(top1[k]) / positions, 4)
        metrics[f"head{k}_top5"] = round(float(top5[k]) / positions, 4)
    metrics["base_top1"] = round(base_top1 / positions, 4)
    metrics["base_top1_at_t2"] = round(base_at_t2 / positions, 4)
    metrics["unigram_top1"] = round(unigram / positions, 4)
    metrics["base_heldout_loss"] = round(base_loss / positions, 4)
    metrics["heads_heldout_loss"] = round(heads_loss / positions, 4)
    metrics["eval_positions"] = positions
    return metrics


def _save(
    heads: nn.ModuleList,
    output_dir: Path,
    base_dir: Path,
    base_name: str,
    metrics: Mapping[str, float],
    settings: Mapping[str, Any],
    inputs: Inputs,
) -> None:
    """Weights, config and tokenizer land together or not at all; manifest.json marks the directory as ours,
    so a rerun may replace it (and records how the heads were made)."""
    with atomic_directory(output_dir, inputs=inputs) as tmp:
        write_heads(tmp, heads, base_dir, base_name, metrics, settings)


def write_heads(
    directory: Path,
    heads: nn.ModuleList,
    base_dir: Path,
    base_name: str,
    metrics: Mapping[str, float],
    settings: Mapping[str, Any],
    producer: str = "specbuild.medusa.train",
) -> None:
    """The FasterDecoding files of `heads` into `directory` (the caller makes it atomic): the weights,
    config.json naming `base_name` as the base, the tokenizer files of `base_dir`, and manifest.json."""
    from safetensors.torch import save_file

    num_layers = len(heads[0]) - 1
    vocab_size, hidden_size = heads[0][num_layers].weight.shape
    tensors = {key: value.detach().contiguous() for key, value in heads.state_dict().items()}
    config = {
        "medusa_num_heads": len(heads),
        "medusa_num_layers": num_layers,
        "base_model_name_or_path": base_name,
        "hidden_size": int(hidden_size),
        "vocab_size": int(vocab_size),
    }
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / WEIGHTS_NAME), metadata={"format": "pt"})
    _write_json(directory / CONFIG_NAME, config)
    for name in TOKENIZER_OWN_FILES:
        if (base_dir / name).is_file():
            shutil.copy2(base_dir / name, directory / name)
    _write_json(directory / "manifest.json", {"producer": producer, "settings": dict(settings),
                                              "metrics": dict(metrics)})


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
