"""The training loop's shared pieces for every trainer on a frozen (or distilled) HF model: Medusa-1 heads and
Medusa-2 (`specbuild.medusa`), EAGLE-3 drafts (`specbuild.eagle`), self-draft adapters (`specbuild.self_draft`).

One token stream, one window sampler, one learning-rate schedule, one optimizer step and one progress bar, so the
trainers differ only in what they learn and their loss. (The demo models' own pre-training keeps its recipe in
`specbuild.demo.training`: its bytes are part of the demo cache key.)
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from specbuild import corpus
from specbuild.atomic import refuse_overlap
from specbuild.errors import CheckpointError, SpecbuildError

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


def trainer_inputs(output: Path, output_name: str, models: Mapping[str, Path | None],
                   text_files: Sequence[Path] = ()) -> dict[str, Path | None]:
    """What a trainer reads, by the names the user typed (its model directories, each --text file), refused
    before any work when the output is, contains or lies inside one of them (`atomic.refuse_overlap`: the atomic
    swap would delete or change it); returned for the save's `atomic_directory(inputs=...)`, which checks again
    under the output's lock."""
    named = dict(models)
    for index, path in enumerate(text_files):
        named["--text" if len(text_files) == 1 else f"--text #{index + 1}"] = path
    refuse_overlap(output, named, output_name=output_name)
    return named


def check_weights(model_dir: Path, name: str) -> None:
    """Refuse, before any work, a model directory whose safetensors files are truncated or corrupt, naming the
    file: transformers would fail deep inside `from_pretrained` with safetensors' own error, which names neither
    the file nor the directory. Reads the headers only (safetensors checks them against the file's size)."""
    from safetensors import SafetensorError, safe_open

    for path in sorted(Path(model_dir).glob("*.safetensors")):
        try:
            with safe_open(str(path), "pt"):
                pass
        except (SafetensorError, OSError) as err:
            raise CheckpointError(f"{path}: cannot read this safetensors file of {name} {model_dir} ({err})",
                                  hint="the file is truncated or corrupt (an interrupted download or copy?): fetch "
                                  "or save the model again") from None


def _text_source(files: Sequence[Path], given: bool, part: str) -> str:
    """How a message names a token stream's text: the --text files, the caller's text, or the built-in corpus."""
    if files:
        return "--text " + ", ".join(str(path) for path in files)
    return f"the {part} text" if given else f"the built-in corpus's {part} part"


def training_streams(
    tokenizer: Any,
    texts: Sequence[str] | None,
    eval_texts: Sequence[str] | None,
    *,
    window: int,
    seq_len: int,
    held_window: int | None = None,
    text_files: Sequence[Path] = (),
) -> tuple[torch.Tensor, torch.Tensor]:
    """The training and held-out token streams (`texts` default to the built-in corpus's training part,
    `eval_texts` to its held-out part), each refused before any training unless it holds one `window` of tokens
    (`held_window` for the held-out stream, default `window`): every trainer's one rule for too little text, named
    by its files (`text_files`, the command's --text) with the counts and what to change."""
    train = token_stream(tokenizer, list(texts) if texts is not None else corpus.training_texts())
    held = token_stream(tokenizer, list(eval_texts) if eval_texts is not None else corpus.heldout_texts())
    checks = ((train, window, _text_source(text_files, texts is not None, "training")),
              (held, held_window or window, _text_source((), eval_texts is not None, "held-out")))
    for ids, needed, source in checks:
        if ids.numel() < needed:
            raise SpecbuildError(
                f"{source}: {ids.numel()} tokens, fewer than one window of {needed} tokens (--seq-len {seq_len})",
                hint="give more text (longer or more --text files), or a smaller --seq-len",
            )
    return train, held


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


def greedy_rows(model: Any, ids: torch.Tensor, *, count: int, prompt_tokens: int, span: int, seed: int,
                pad_id: int | None, batch_size: int = 64,
                advance: Callable[[], None] | None = None) -> torch.Tensor:
    """[count, span] rows: a `prompt_tokens` prompt drawn (seeded) from the stream `ids`, then `model`'s greedy
    continuation to `span` tokens with no early stop, so every row is one whole window. The text a drafter must
    guess when speculation verifies greedily: Medusa-2's self-distillation data, the demo draft's training text
    (sequence-level distillation). `advance` is called once per generated batch (a progress bar). The demo build's
    bytes depend on this code: a change here that alters its rows needs `demo.recipe.RECIPE_VERSION` bumped."""
    prompt = min(prompt_tokens, span - 1)
    generator = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, ids.numel() - prompt + 1, (count,), generator=generator)
    prompts = torch.stack([ids[s : s + prompt] for s in starts.tolist()])
    rows = []
    with torch.no_grad():
        for chunk in prompts.split(batch_size):
            out = model.generate(chunk, attention_mask=torch.ones_like(chunk), max_new_tokens=span - prompt,
                                 min_new_tokens=span - prompt, do_sample=False, pad_token_id=pad_id)
            rows.append(out[:, :span])
            if advance is not None:
                advance()
    return torch.cat(rows)


def bar_columns() -> tuple[Any, ...]:
    """The training bars' columns: name, bar, steps, the last loss (blank for work that has none, such as
    generating text), time."""
    from rich.progress import BarColumn, MofNCompleteColumn, ProgressColumn, TextColumn, TimeElapsedColumn
    from rich.text import Text

    class LossColumn(ProgressColumn):
        def render(self, task: Any) -> Text:
            loss = task.fields.get("loss")
            return Text("" if loss is None or math.isnan(loss) else f"loss {loss:.3f}")

    return (TextColumn("{task.description:<8}"), BarColumn(), MofNCompleteColumn(), LossColumn(), TimeElapsedColumn())


@contextlib.contextmanager
def bar(progress: bool | Progress, steps: int, description: str = "medusa") -> Iterator[Any]:
    """A rich bar on stderr: our own, a task on the caller's running Progress, or nothing."""
    if progress is False:
        yield lambda loss: None
        return
    if progress is True:
        from rich.console import Console
        from rich.progress import Progress

        with Progress(*bar_columns(), console=Console(stderr=True)) as bars:
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
