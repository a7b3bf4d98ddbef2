"""The training loop's shared pieces for every trainer on a frozen (or distilled) HF model: Medusa-1 heads and
Medusa-2 (`specbuild.medusa`), EAGLE-3 drafts (`specbuild.eagle`), self-draft adapters (`specbuild.self_draft`).

One token stream, one window sampler, one learning-rate schedule, one optimizer step and one progress bar, so the
trainers differ only in what they learn and their loss. (The demo models' own pre-training keeps its recipe in
`specbuild.demo.training`: its bytes are part of the demo cache key.)
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from rich.progress import Progress

WARMUP_FRACTION = 0.1  # FasterDecoding's legacy Medusa recipe: cosine schedule with 10% warmup, no weight decay


@contextlib.contextmanager
def no_transformers_bars() -> Iterator[None]:
    """transformers' "Loading weights" bar would interleave with ours; the caller's setting is restored."""
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


def token_stream(tokenizer: Any, texts: Sequence[str]) -> torch.Tensor:
    """All documents as one `<s> doc </s> <s> doc </s> ...` stream (as the demo models were trained on)."""
    ids: list[int] = []
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    for encoded in tokenizer(list(texts), add_special_tokens=False, verbose=False).input_ids:
        ids += [*bos, *encoded, *eos]
    return torch.tensor(ids, dtype=torch.long)


def _lr_factor(step: int, steps: int) -> float:
    warmup = max(1, round(WARMUP_FRACTION * steps))
    if step < warmup:
        return (step + 1) / warmup
    return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, steps - warmup))))


def lr_schedule(optimizer: torch.optim.Optimizer, steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """The one schedule of every Medusa trainer: linear warmup over WARMUP_FRACTION, then cosine to zero; it
    scales each parameter group's own learning rate, so Medusa-2's base and heads keep their ratio."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: _lr_factor(step, steps))


def window_batches(ids: torch.Tensor, span: int, steps: int, batch_size: int, seed: int) -> Iterator[torch.Tensor]:
    """`steps` batches of `batch_size` random `span`-token windows of the stream `ids`, seeded."""
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        starts = torch.randint(0, ids.numel() - span + 1, (batch_size,), generator=generator)
        yield torch.stack([ids[s : s + span] for s in starts.tolist()])


@contextlib.contextmanager
def bar(progress: bool | Progress, steps: int, description: str = "medusa") -> Iterator[Any]:
    """A rich bar on stderr: our own, a task on the caller's running Progress, or nothing."""
    if progress is False:
        yield lambda loss: None
        return
    if progress is True:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        columns = (TextColumn("{task.description:<8}"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("loss {task.fields[loss]:.3f}"), TimeElapsedColumn())
        with Progress(*columns, console=Console(stderr=True)) as bars:
            task = bars.add_task(description, total=steps, loss=float("nan"))
            yield lambda loss: bars.update(task, advance=1, loss=loss)
        return
    task = progress.add_task(description, total=steps, loss=float("nan"))
    yield lambda loss: progress.update(task, advance=1, loss=loss)


def optimizer_step(loss: torch.Tensor, optimizer: torch.optim.Optimizer,
                   scheduler: torch.optim.lr_scheduler.LRScheduler, advance: Callable[[float], None]) -> float:
    """Back-propagate `loss`, step the optimizer and the schedule, clear the gradients, move the bar; returns the
    loss as a float (what a trainer reports as its last step's loss)."""
    loss.backward()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    value = float(loss.detach())
    advance(value)
    return value
