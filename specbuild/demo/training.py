"""Training the demo models: random initialisation, the target's next-token training, the draft's distillation
from the target, the Medusa heads on the frozen target, and the held-out evaluation.

The draft is distilled from the target (top-k soft labels computed once after the target is trained) on the
target's own greedy text, which makes it agree with the target far more often than an independently trained model
of the same size would, and most often on the text it drafts for when serving.
Everything runs under `deterministic_torch`: the same recipe and thread count give the same bytes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specbuild.demo.recipe import MedusaHeads, Recipe, Shape, Training, train_threads
from specbuild.demo.tokenizer import BOS_ID, EOS_ID, PAD_ID

if TYPE_CHECKING:
    import torch
    from rich.progress import Progress
    from transformers import PreTrainedModel


@contextlib.contextmanager
def deterministic_torch() -> Iterator[None]:
    """Fixed threads, deterministic kernels and a private RNG; the caller's torch settings are restored."""
    import torch
    from transformers.utils import logging as hf_logging

    threads = torch.get_num_threads()
    deterministic = torch.are_deterministic_algorithms_enabled()
    hf_bars = hf_logging.is_progress_bar_enabled()
    torch.set_num_threads(train_threads())
    torch.use_deterministic_algorithms(True)
    hf_logging.disable_progress_bar()  # "Writing model shards" bars would interleave with ours
    try:
        with torch.random.fork_rng(devices=[]):
            yield
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)
        if hf_bars:
            hf_logging.enable_progress_bar()



def _common_config(recipe: Recipe) -> dict[str, Any]:
    return {
        "vocab_size": recipe.vocab_size,
        "max_position_embeddings": recipe.max_positions,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "pad_token_id": PAD_ID,
    }


def _llama_family_config(recipe: Recipe, shape: Shape) -> dict[str, Any]:
    return {
        **_common_config(recipe),
        **dataclasses.asdict(shape),
        "rope_theta": recipe.rope_theta,
        "rms_norm_eps": 1e-5,
    }


def _seeded(seed: int) -> None:
    import torch

    torch.manual_seed(seed)


def llama(recipe: Recipe, shape: Shape, *, seed: int) -> PreTrainedModel:
    from transformers import LlamaConfig, LlamaForCausalLM

    _seeded(seed)
    config = LlamaConfig(**_llama_family_config(recipe, shape), tie_word_embeddings=False)
    return LlamaForCausalLM(config)


def qwen3(recipe: Recipe, shape: Shape, *, head_dim: int, seed: int) -> PreTrainedModel:
    """A Qwen3ForCausalLM shaped as the small Qwen3s ship: q/k norm (Qwen3 always has it), an explicit head_dim
    that need not be hidden_size / heads (Qwen3-0.6B: 16 x 128 over 1024), tied embeddings, no QKV bias."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    _seeded(seed)
    config = Qwen3Config(**{**_llama_family_config(recipe, shape), "rms_norm_eps": 1e-6}, head_dim=head_dim,
                         tie_word_embeddings=True, attention_bias=False, use_sliding_window=False)
    return Qwen3ForCausalLM(config)


def untrained_models(recipe: Recipe) -> dict[str, PreTrainedModel]:
    """Random models for converter coverage, with 1-D weights (biases, norms) perturbed away from 0 and 1 so
    that a converter mixing them up produces visibly wrong logits."""
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        MistralConfig,
        MistralForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    small = recipe.small
    _seeded(recipe.init_seed + 10)
    qwen2 = Qwen2ForCausalLM(Qwen2Config(**_llama_family_config(recipe, small), tie_word_embeddings=True))
    _seeded(recipe.init_seed + 11)
    mistral = MistralForCausalLM(
        MistralConfig(
            **_llama_family_config(recipe, small), sliding_window=recipe.sliding_window, tie_word_embeddings=False
        )
    )
    _seeded(recipe.init_seed + 12)
    gpt2 = GPT2LMHeadModel(
        GPT2Config(
            **_common_config(recipe),
            n_positions=recipe.max_positions,
            n_embd=small.hidden_size,
            n_layer=small.num_hidden_layers,
            n_head=small.num_attention_heads,
            n_inner=4 * small.hidden_size,
        )
    )
    models = {"qwen2": qwen2, "mistral": mistral, "gpt2": gpt2}
    for offset, model in enumerate(models.values()):
        _perturb_vectors(model, seed=recipe.init_seed + 20 + offset)
    return models


def _perturb_vectors(model: PreTrainedModel, *, seed: int) -> None:
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, param in sorted(model.named_parameters()):
            if param.ndim == 1:
                param.add_(0.1 * torch.randn(param.shape, generator=generator))


# ---------------------------------------------------------------------------------------------------- training


def _lr_factor(step: int, settings: Training) -> float:
    """Linear warmup, then cosine decay to `final_lr_frac` of the peak."""
    warmup = max(1, round(settings.warmup * settings.steps))
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, settings.steps - warmup))
    floor = settings.final_lr_frac
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def _optimizer(model: PreTrainedModel, settings: Training) -> tuple[Any, Any]:
    import torch

    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": settings.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=settings.lr,
        betas=(0.9, 0.95),
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: _lr_factor(step, settings))
    return optimizer, scheduler


def _step(model: PreTrainedModel, loss: torch.Tensor, optimizer: Any, scheduler: Any, clip: float) -> float:
    import torch

    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return float(loss.detach())


def _track(bars: Progress | None, name: str, total: int) -> Any:
    return None if bars is None else bars.add_task(name, total=total, loss=float("nan"))


def _advance(bars: Progress | None, task: Any, loss: float) -> None:
    if bars is not None:
        bars.update(task, advance=1, loss=loss)


def train_target(model: PreTrainedModel, ids: torch.Tensor, settings: Training, bars: Progress | None) -> float:
    """Plain next-token training on random windows of the training text; returns the last step's loss."""
    import torch
    import torch.nn.functional as F

    model.train()
    optimizer, scheduler = _optimizer(model, settings)
    generator = torch.Generator().manual_seed(settings.seed)
    span = settings.seq_len + 1
    task = _track(bars, "target", settings.steps)
    loss_value = float("nan")
    for _ in range(settings.steps):
        starts = torch.randint(0, ids.numel() - span, (settings.batch_size,), generator=generator)
        batch = torch.stack([ids[s : s + span] for s in starts.tolist()])
        logits = model(input_ids=batch[:, :-1]).logits
        loss = F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
        loss_value = _step(model, loss, optimizer, scheduler, settings.grad_clip)
        _advance(bars, task, loss_value)
    model.eval()
    return loss_value


def _windows(ids: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Non-overlapping windows of seq_len + 1 tokens (inputs plus the next token), [N, seq_len + 1]."""
    span = seq_len + 1
    count = (ids.numel() - 1) // seq_len
    return ids[: count * seq_len + 1].unfold(0, span, seq_len)


def _teacher_top_k(
    teacher: PreTrainedModel, inputs: torch.Tensor, top_k: int, batch_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The teacher's top-k tokens and their renormalised probabilities at every position, computed once (a
    forward pass per window) instead of at every draft step."""
    import torch

    indices, probs = [], []
    with torch.inference_mode():
        for chunk in inputs.split(batch_size):
            values, idx = teacher(input_ids=chunk).logits.topk(top_k, dim=-1)
            indices.append(idx.int())  # int32 halves the memory; widened again per batch
            probs.append(values.softmax(dim=-1))
    return torch.cat(indices), torch.cat(probs)


def target_text(target: PreTrainedModel, ids: torch.Tensor, recipe: Recipe, *, count: int, span: int, seed: int,
                bars: Progress | None, name: str) -> torch.Tensor:
    """[count, span] rows of the target's greedy continuations of `draft_prompt_tokens` prompts from `ids`: what
    the draft must guess when a greedy request is served."""
    from specbuild.training import greedy_rows

    task = _track(bars, name, -(-count // recipe.generation_batch))
    return greedy_rows(target, ids, count=count, prompt_tokens=recipe.draft_prompt_tokens, span=span, seed=seed,
                       pad_id=PAD_ID, batch_size=recipe.generation_batch,
                       advance=lambda: _advance(bars, task, float("nan")))


def train_draft(
    draft: PreTrainedModel, target: PreTrainedModel, ids: torch.Tensor, recipe: Recipe, bars: Progress | None
) -> float:
    """Distil the draft on the target's own greedy text (`target_text`) and on the training text's windows:
    cross-entropy against the target's top-k distribution (weight `distill_weight`) plus ordinary next-token loss.
    Training on what the target predicts, on the text it generates, is what raises acceptance; the corpus windows
    keep the draft close to the target off that path (sampled requests)."""
    import torch
    import torch.nn.functional as F

    settings = recipe.draft_training
    generator = torch.Generator().manual_seed(settings.seed)
    generated = target_text(target, ids, recipe, count=recipe.draft_generated_rows, span=settings.seq_len + 1,
                            seed=settings.seed, bars=bars, name="generate")
    rows = torch.cat([generated, _windows(ids, settings.seq_len)])
    teacher_idx, teacher_prob = _teacher_top_k(target, rows[:, :-1], recipe.distill_top_k, settings.batch_size)

    draft.train()
    optimizer, scheduler = _optimizer(draft, settings)
    task = _track(bars, "draft", settings.steps)
    epochs = -(-settings.steps * settings.batch_size // rows.shape[0])
    order = torch.cat([torch.randperm(rows.shape[0], generator=generator) for _ in range(epochs)])
    loss_value = float("nan")
    for step in range(settings.steps):
        pick = order[step * settings.batch_size : (step + 1) * settings.batch_size]
        batch = rows[pick]
        log_probs = draft(input_ids=batch[:, :-1]).logits.log_softmax(dim=-1)
        soft = -(teacher_prob[pick] * log_probs.gather(-1, teacher_idx[pick].long())).sum(-1).mean()
        hard = F.nll_loss(log_probs.flatten(0, 1), batch[:, 1:].flatten())
        loss = recipe.distill_weight * soft + (1 - recipe.distill_weight) * hard
        loss_value = _step(draft, loss, optimizer, scheduler, settings.grad_clip)
        _advance(bars, task, loss_value)
    draft.eval()
    return loss_value


def train_medusa_heads(
    target_dir: Path, heads_dir: Path, settings: MedusaHeads, base_name: str, train_texts: list[str],
    held_texts: list[str], bars: Progress | None,
) -> dict[str, float]:
    """Heads on the saved target, trained on the same text. config.json names the target as `base_name` (relative
    to the heads), neither the temporary build directory nor an absolute path that a copy would break."""
    from specbuild.medusa.train import train_medusa_heads as train

    started = time.perf_counter()
    metrics = train(
        target_dir,
        heads_dir,
        num_heads=settings.num_heads,
        num_layers=settings.num_layers,
        steps=settings.steps,
        seq_len=settings.seq_len,
        batch_size=settings.batch_size,
        lr=settings.lr,
        seed=settings.seed,
        texts=train_texts,
        eval_texts=held_texts,
        base_model_name_or_path=base_name,
        progress=bars if bars is not None else False,
    )
    return {**metrics, "step_seconds": round(time.perf_counter() - started, 1)}  # with loading, evaluation, saving


def evaluate(
    target: PreTrainedModel, draft: PreTrainedModel, held_ids: torch.Tensor, recipe: Recipe, bars: Progress | None
) -> dict[str, float]:
    """Held-out next-token losses and how often the draft's greedy token equals the target's, teacher-forced on
    real text (`top1_agreement`) and on the target's own greedy continuations of held-out prompts
    (`top1_agreement_on_target_text`, the generated positions only): the per-token acceptance proxy of greedy
    speculative decoding, on the text it is served."""
    import torch
    import torch.nn.functional as F

    windows = _windows(held_ids, recipe.eval_seq_len)
    inputs, labels = windows[:, :-1], windows[:, 1:].flatten()
    generated = target_text(target, held_ids, recipe, count=recipe.eval_generated_rows, span=recipe.eval_seq_len + 1,
                            seed=recipe.init_seed, bars=bars, name="evaluate")
    start = min(recipe.draft_prompt_tokens, recipe.eval_seq_len) - 1  # the first position predicting a generated token
    with torch.inference_mode():
        target_logits = target(input_ids=inputs).logits.flatten(0, 1)
        draft_logits = draft(input_ids=inputs).logits.flatten(0, 1)
        on_text = [model(input_ids=generated[:, :-1]).logits[:, start:].argmax(-1) for model in (target, draft)]
    return {
        "target_heldout_loss": round(float(F.cross_entropy(target_logits, labels)), 4),
        "draft_heldout_loss": round(float(F.cross_entropy(draft_logits, labels)), 4),
        "top1_agreement": round(float((target_logits.argmax(-1) == draft_logits.argmax(-1)).float().mean()), 4),
        "top1_agreement_on_target_text": round(float((on_text[0] == on_text[1]).float().mean()), 4),
        "target_heldout_top1_accuracy": round(float((target_logits.argmax(-1) == labels).float().mean()), 4),
    }
