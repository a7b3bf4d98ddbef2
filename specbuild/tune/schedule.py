"""`specbuild tune`'s load-aware speculation: which draft length pays at which number of active sequences.

At each batch size the serving engine runs the calibration prompts side by side, plainly and speculating with
each candidate length (draft-target: K tokens per round; Medusa: the tree's first K paths), and the fastest wins;
0 (plain decoding) where speculation does not pay. The result is TensorRT-LLM's `draft_len_schedule` shape,
thresholds only where the choice changes ({1: 4, 5: 0}), with the full length at batch size 1 as TensorRT-LLM
requires. Tokens/s here is wall-clock, the fastest of `repeats` interleaved runs, so a busy machine slows every
candidate alike.

The lengths never grow with the batch: the more sequences share each forward, the less a round's extra draft
and verification work can pay (TensorRT-LLM's reason for the schedule). Of the schedules whose lengths never grow,
the one kept comes closest to the fastest length at every batch size together: it has the highest sum, over the
batch sizes, of its length's tokens/s over that batch size's fastest. So a near tie at one batch size (a
measurement on a shared machine decides it either way) cannot turn speculation off at the larger ones where it
wins clearly, and a clear loss at one batch size is not taken back for a win at a larger one.

At a batch size above 1 speculation is charged that batch size's noise (the median spread of its lengths' passes,
as at batch size 1): each length's tokens/s there counts that much less against plain's. A length that wins by
less than the noise has not been shown to win, and costs where tokens/s does not show it (a coarser stream, more
work per step); measured: Medusa's 2 tree paths at 8 clients, 1.4% ahead of plain in `tune --served` within a
3.1% spread, made 0.97x plain in the serving benchmark that followed (bench/results at 5623eb8).

The spec's own schedule stays unless the schedule measured now comes closer to the fastest lengths (the same sum)
in every repeat, each repeat's rates on their own: neighbouring lengths often lie within a few percent at a batch
size, and the fastest of the repeats alone would then move a threshold on the machine's noise (demo-pytorch's
{1: 4, 9: 2} and {1: 4, 5: 2} swapped between two runs a day apart, K 2 and K 4 within 1-6 % at batch 8).

A length changes right after the last batch size measured at the longer one, not at the batch size where the
shorter one was measured: the sizes in between were not measured, and the longer length is known to lose at the
far end of them. A load of C clients keeps fewer than C sequences active between a finished request and its
successor's arrival, so a change placed at C would run the losing length much of the time at that load (measured
behind tritonserver: Lookahead's {1: 2, 16: 0} made 0.91x plain with 16 streaming clients, its windows on at 15).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise, product

from specbuild.runtime.schedule import DraftSchedule

Run = Callable[[list[list[int]], int], int]
"""(prompts run side by side, draft length or 0) -> tokens generated."""


@dataclass
class ScheduleTuning:
    """Measured tokens/s by batch size and draft length, and the schedule they give."""

    full_length: int
    tokens_per_second: dict[int, dict[int, float]] = field(default_factory=dict)
    served: bool = False  # measured behind tritonserver on the deployment (specbuild.tune.served), not in-process
    one_client: dict[int, list[float]] = field(default_factory=dict)
    """Served, the BLS's K at batch size 1: every pass's tokens/s by K (`tokens_per_second[1]` keeps the fastest)."""
    passes: dict[int, dict[int, list[float]]] = field(default_factory=dict)
    """Every repeat's tokens/s by batch size and length (`tokens_per_second` keeps the fastest): what tells a better
    schedule from the noise (`schedule`)."""
    current: dict[int, int] | None = None
    """The spec's own schedule, kept where the measured one is not better in every repeat (`schedule`)."""

    def record(self, batch: int, length: int, rate: float) -> None:
        """One repeat's tokens/s at (batch, length): kept with the others, and the fastest in tokens_per_second."""
        self.passes.setdefault(batch, {}).setdefault(length, []).append(rate)
        cell = self.tokens_per_second.setdefault(batch, {})
        cell[length] = max(cell.get(length, 0.0), rate)

    def choose_full_length(self) -> None:
        """The full length from the batch-size-1 passes (shortest_within_noise)."""
        self.full_length = shortest_within_noise(self.one_client)[0]

    @property
    def one_client_noise(self) -> float | None:
        """The noise the full length was chosen within (None: it was not measured, see measured_full_length)."""
        return shortest_within_noise(self.one_client)[1] if self.one_client else None

    @property
    def one_client_medians(self) -> dict[int, float]:
        """Each length's median pass at one client, what the full length was chosen by ({}: not measured)."""
        return median_passes(self.one_client) if self.one_client else {}

    @property
    def one_client_best(self) -> int | None:
        """The length with the best median pass at one client, which the full length was judged against."""
        medians = self.one_client_medians
        return max(medians, key=lambda k: medians[k]) if medians else None

    def best(self, batch: int) -> int:
        """The fastest length measured at `batch` (the schedule may keep another: see the module docstring)."""
        rates = self.tokens_per_second[batch]
        return max(rates, key=lambda k: rates[k])

    @property
    def measured_full_length(self) -> bool:
        """Whether the full length itself was measured, at batch size 1 (served, the BLS's K): then it is a choice
        of its own (shortest_within_noise)."""
        return bool(self.one_client)

    @property
    def schedule(self) -> dict[int, int]:
        """What tune writes: the measured schedule, or the spec's own where that one is not closer to each batch
        size's fastest length in every repeat (see the module docstring)."""
        return self.current if self.kept_current and self.current is not None else self.measured_schedule

    @property
    def kept_current(self) -> bool:
        """Whether the spec's own schedule, other than the measured one, is kept: it sets a measured length at every
        measured batch size, and the measured schedule does not come closer to the fastest in every repeat."""
        current, measured = self.current, self.measured_schedule
        if current is None or current == measured or not self._comparable(current):
            return False
        return self.repeat_wins(measured, current) < self.repeats

    @property
    def repeats(self) -> int:
        """Repeats recorded at every measured (batch size, length) above batch size 1 (0: none recorded)."""
        return min((len(rates) for b in self._sizes() for rates in self.passes.get(b, {}).values()), default=0)

    def repeat_wins(self, steps: dict[int, int], other: dict[int, int]) -> int:
        """In how many repeats `steps` comes closer to each batch size's fastest length than `other` (the sum of
        its lengths' tokens/s over the fastest, that repeat's rates alone)."""
        return sum(self._closeness(steps, r) > self._closeness(other, r) for r in range(self.repeats))

    def length_at(self, steps: dict[int, int], batch: int) -> int:
        """The length a schedule in the spec's ("from") form runs with `batch` active sequences, as served."""
        return DraftSchedule(steps, self.full_length).draft_len(batch)

    def _comparable(self, steps: dict[int, int]) -> bool:
        return (steps.get(1) == self.full_length and self.repeats > 0
                and all(self.length_at(steps, b) in self.passes.get(b, {}) for b in self._sizes()))

    def _closeness(self, steps: dict[int, int], repeat: int) -> float:
        total = 0.0
        for b in self._sizes():
            rates = {k: runs[repeat] for k, runs in self.passes[b].items()}
            total += _over_fastest(rates)[self.length_at(steps, b)]
        return total

    @property
    def measured_schedule(self) -> dict[int, int]:
        """{1: full length, then each batch size where the length changes}: of the lengths that never grow, those
        with the highest sum of tokens/s over each batch size's fastest; a change takes effect right after the last
        batch size measured at the longer length (see the module docstring)."""
        steps = {1: self.full_length}
        current, previous = self.full_length, 1
        for batch, length in zip(self._sizes(), self._lengths(), strict=True):
            if length != current:
                steps[previous + 1] = current = length
            previous = batch
        return steps

    def noise(self, batch: int) -> float:
        """The spread of the passes at `batch` (`spread`; 0 with fewer than two passes per length), which a
        length above 0 is charged there (see the module docstring)."""
        runs = {k: rates for k, rates in self.passes.get(batch, {}).items() if len(rates) > 1}
        return spread(runs) if runs else 0.0

    def charged(self, batch: int) -> dict[int, float]:
        """The tokens/s at `batch` the schedule is chosen by: plain's as measured, each length above 0's less the
        batch size's noise."""
        noise = self.noise(batch) if batch > 1 else 0.0
        return {k: rate if k == 0 else rate * (1 - noise) for k, rate in self.tokens_per_second[batch].items()}

    def _sizes(self) -> list[int]:
        return sorted(b for b in self.tokens_per_second if b > 1)

    def _lengths(self) -> list[int]:
        """One length per batch size above 1: of the measured ones that never grow from the full length, those with
        the highest sum of tokens/s over each batch size's fastest, speculation charged the noise (`charged`; at an
        exact tie the longer lengths, the full length being TensorRT-LLM's default). A few lengths at a few batch
        sizes: every choice is tried."""
        share = [_over_fastest(self.charged(b)) for b in self._sizes()]
        choices = [c for c in product(*(sorted(s) for s in share))
                   if all(a >= b for a, b in pairwise((self.full_length, *c)))]
        return list(max(choices, key=lambda c: (sum(s[k] for s, k in zip(share, c, strict=True)), c), default=()))


def shortest_within_noise(passes: Mapping[int, Sequence[float]]) -> tuple[int, float]:
    """(the shortest length whose median pass lies within the noise of the best length's median pass, that
    noise). The noise is measured in the same run: the median over lengths of (fastest pass - slowest pass) /
    fastest pass. A longer length has to win by more than that, because it costs where tokens/s at one client does
    not show it: in the 1.2 flow a round's tokens come in one response, so a longer K streams in coarser chunks,
    and under load each round does more work. Neighbouring lengths often lie within a few percent of each other,
    inside one pass's noise on a shared machine, so the fastest alone would be chosen by that noise. Each length
    is judged by its median pass, not its fastest: the fastest of six passes is one pass, and in one measured re-run
    a single quick pass of K 2 (181 tok/s, its other five 152-171) made K 2 the choice although K 3's median was
    185 tok/s against K 2's 161 (tests/test_tune.py holds those passes); one pass does not move a median far.
    Passes without a token are left out."""
    kept = _made_tokens(passes)
    noise = spread(kept)
    typical = median_passes(kept)
    top = max(typical.values())
    return min(length for length, rate in typical.items() if rate >= top * (1 - noise)), noise


def spread(passes: Mapping[int, Sequence[float]]) -> float:
    """A run's noise: the median over lengths of (fastest pass - slowest pass) / fastest pass, passes without a
    token left out."""
    return statistics.median((max(rates) - min(rates)) / max(rates) for rates in _made_tokens(passes).values())


def median_passes(passes: Mapping[int, Sequence[float]]) -> dict[int, float]:
    """Each length's median pass (tokens/s), over its passes that made a token; what shortest_within_noise judges."""
    return {length: statistics.median(rates) for length, rates in _made_tokens(passes).items()}


def _made_tokens(passes: Mapping[int, Sequence[float]]) -> dict[int, list[float]]:
    kept = {length: [rate for rate in rates if rate > 0] for length, rates in passes.items()}
    kept = {length: rates for length, rates in kept.items() if rates}
    if not kept:
        raise ValueError("no passes to choose a length from")
    return kept


def _over_fastest(rates: dict[int, float]) -> dict[int, float]:
    """Each length's tokens/s over the fastest's at the same batch size (1.0: the fastest)."""
    fastest = max(max(rates.values()), 1e-9)
    return {k: rate / fastest for k, rate in rates.items()}


def halvings(full_length: int) -> list[int]:
    """The lengths measured between plain and the full one at every batch size: half of it, half of that, and so
    down to 1 (8: 4, 2, 1). A step's cost grows with its length and its accepted tokens less than in proportion, so
    under load a short length can pay where half the full one no longer does."""
    lengths, length = [], full_length // 2
    while length >= 1:
        lengths.append(length)
        length //= 2
    return lengths


def carried_schedule(schedule: Mapping[int, int], old_full: int, new_full: int) -> dict[int, int]:
    """A schedule that was not measured again, carried to a new full length (a tune that changed K, the tree's size
    or Lookahead's window without measuring the schedule): where it ran the old full length it runs the new one,
    elsewhere no more than the new one. Its thresholds and its zeros stay, its lengths still never grow with load,
    and batch size 1 runs the new full length, as TensorRT-LLM requires of a schedule."""
    return {size: new_full if length == old_full else min(length, new_full) for size, length in schedule.items()}


def schedule_lengths(full_length: int, between: Sequence[int]) -> list[int]:
    """Every length a schedule is measured at: 0 (plain), the full length and `between` (halvings), each once."""
    return sorted({0, full_length, *between})


def length_orders(full_length: int, between: Sequence[int], repeats: int) -> list[list[int]]:
    """The order of the lengths in each repeat of a served schedule measurement: every repeat starts at another one
    (`specbuild.bench.load.rotations`), as the batch-1 Ks and the serving benchmark's deployments are: the first
    server of a series measures slower, and plain (0), the length every other is judged against, came first in
    every repeat. (It did not close the gap it was suspected of: rotated too, `tune --served` measured Medusa's 2
    tree paths and Lookahead ahead of plain at batch 8, where the serving benchmark then measured them behind;
    bench/results at 1036a22.)"""
    from specbuild.bench.load import rotations

    return rotations(schedule_lengths(full_length, between), repeats)


def batch_sizes(max_batch: int) -> list[int]:
    """1, 2, 4, ... up to the engine's max batch size (and that size itself)."""
    sizes = [1]
    while sizes[-1] * 2 <= max_batch:
        sizes.append(sizes[-1] * 2)
    if sizes[-1] != max_batch:
        sizes.append(max_batch)
    return sizes


def tune_schedule(run: Run, prompts: Sequence[list[int]], sizes: Sequence[int], lengths: Sequence[int],
                  full_length: int, repeats: int = 2, tick: Callable[[], None] = lambda: None,
                  current: dict[int, int] | None = None) -> ScheduleTuning:
    """Measure every (batch size, length) with `run`; `lengths` holds the candidates besides 0 (plain); `current`
    is the spec's own schedule (see ScheduleTuning.schedule)."""
    tuning = ScheduleTuning(full_length, current=current)
    candidates = schedule_lengths(full_length, lengths)
    for size in sizes:
        batch = [list(prompts[i % len(prompts)]) for i in range(size)]
        for _ in range(repeats):
            for length in candidates:  # interleaved, so a busy neighbour slows all of them alike
                start = time.perf_counter()
                tokens = run(batch, length)
                tuning.record(size, length, tokens / max(time.perf_counter() - start, 1e-9))
            tick()
    return tuning
