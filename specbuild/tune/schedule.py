"""`specbuild tune`'s load-aware speculation: which draft length pays at which number of active sequences.

At each batch size the serving engine runs the calibration prompts side by side, plainly and speculating with
each candidate length (draft-target: K tokens per round; Medusa: the tree's first K paths), and the fastest wins;
0 (plain decoding) where speculation does not pay. The result is TensorRT-LLM's `draft_len_schedule` shape,
thresholds only where the choice changes ({1: 4, 8: 0}), with the full length at batch size 1 as TensorRT-LLM
requires. Tokens/s here is wall-clock, the fastest of `repeats` interleaved runs, so a busy machine slows every
candidate alike.

The lengths never grow with the batch: the more sequences share each forward, the less a round's extra draft
and verification work can pay (TensorRT-LLM's reason for the schedule), so a length winning at a larger batch
after a shorter one won at a smaller batch is noise on a shared machine, not a measurement to serve. Each batch
size therefore takes the fastest of the lengths no longer than the one before it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

Run = Callable[[list[list[int]], int], int]
"""(prompts run side by side, draft length or 0) -> tokens generated."""


@dataclass
class ScheduleTuning:
    """Measured tokens/s by batch size and draft length, and the schedule they give."""

    full_length: int
    tokens_per_second: dict[int, dict[int, float]] = field(default_factory=dict)
    served: bool = False  # measured behind tritonserver on the deployment (specbuild.tune.served), not in-process

    def best(self, batch: int, longest: int | None = None) -> int:
        """The fastest length measured at `batch` (of those no longer than `longest`)."""
        rates = {k: rate for k, rate in self.tokens_per_second[batch].items() if longest is None or k <= longest}
        return max(rates, key=lambda k: rates[k])

    @property
    def schedule(self) -> dict[int, int]:
        """{1: full length, then each batch size where the length changes}: at each batch size the fastest length
        no longer than the smaller batch's (see the module docstring)."""
        steps = {1: self.full_length}
        current = self.full_length
        for batch in sorted(self.tokens_per_second):
            if batch == 1:
                continue
            best = self.best(batch, current)
            if best != current:
                steps[batch] = current = best
        return steps


def batch_sizes(max_batch: int) -> list[int]:
    """1, 2, 4, ... up to the engine's max batch size (and that size itself)."""
    sizes = [1]
    while sizes[-1] * 2 <= max_batch:
        sizes.append(sizes[-1] * 2)
    if sizes[-1] != max_batch:
        sizes.append(max_batch)
    return sizes


def tune_schedule(run: Run, prompts: Sequence[list[int]], sizes: Sequence[int], lengths: Sequence[int],
                  full_length: int, repeats: int = 2, tick: Callable[[], None] = lambda: None) -> ScheduleTuning:
    """Measure every (batch size, length) with `run`; `lengths` holds the candidates besides 0 (plain)."""
    tuning = ScheduleTuning(full_length)
    candidates = sorted({0, full_length, *lengths})
    for size in sizes:
        batch = [list(prompts[i % len(prompts)]) for i in range(size)]
        best: dict[int, float] = {}
        for _ in range(repeats):
            for length in candidates:  # interleaved, so a busy neighbour slows all of them alike
                start = time.perf_counter()
                tokens = run(batch, length)
                rate = tokens / max(time.perf_counter() - start, 1e-9)
                best[length] = max(best.get(length, 0.0), rate)
            tick()
        tuning.tokens_per_second[size] = best
    return tuning
