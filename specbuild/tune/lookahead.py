"""`specbuild tune` for Lookahead decoding: which (W, N, G) of a small grid decodes the calibration text fastest.

Lookahead has no draft model, so there is no acceptance rate to plug into a formula: every candidate is run
(greedy, batch 1, `generate_lookahead`) and two things are measured per decoding step, both exact or stable:

- tokens per step: tokens the step yields (the accepted n-gram prefix plus the target's own token), over the
  decoding steps after the prefill. Greedy decoding makes it the same on every run and machine;
- the tokens each step feeds the target (its block: the last token, the window, the candidates; smaller while the
  window fills and while the pool has fewer than G n-grams), counted at the model's forward.

Cost model: a step costs one target forward over its block, and a forward's seconds depend on the block's size
(on a CPU a 16-token forward costs visibly more than a 1-token one; on a GPU much less so), measured once per size
at the calibration's mean context (fastest of interleaved repeats, `measure_forward_seconds`), then made
non-decreasing in the block size (a size's cost is the least measured at it or any larger size: a forward over
more tokens never costs less, and other work on the machine only ever adds time). A candidate's
cost-model tokens/s is its tokens over the summed cost of its steps; plain decoding's is one token per 1-token
forward. Per-step bookkeeping (the pool, the tree mask) is left out, so the figure reads higher than wall-clock,
which is printed next to it.

Under load: (W, N, G) is fixed per engine (TensorRT-LLM's C++ backend takes no schedule for it; the reference
backend's on/off schedule is measured served, `tune --served`), and with many
sequences in flight every one feeds its block to the same forward, so a block that is cheap beside one token alone
can cost several plain steps beside 15 other sequences' tokens. Each forward is therefore also timed with the
engine's max batch size of rows (build.max_batch_size), every row feeding the block, and each candidate's cost
model recomputed with those costs against plain decoding at that batch. The candidate chosen is the fastest by
the batch-1 cost model among those that keep at least plain's speed at the max batch; where none does, the one
that loses least there. Rows of a real batch are padded to its longest block, so the loaded figure is an upper
bound.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from rich.table import Table

from specbuild.contracts import lookahead as la
from specbuild.contracts.engine_limits import verification_tokens
from specbuild.errors import SpecbuildError
from specbuild.runtime.lookahead import LookaheadConfig
from specbuild.runtime.model import CausalLM
from specbuild.spec import PipelineSpec
from specbuild.tune.measure import MAX_BLOCK_TOKENS, Prompts, Tick, fed_tokens, measure_forward_seconds, sweep

DEFAULT_WINDOWS = (2, 4, 7)
DEFAULT_NGRAMS = (2, 3, 4, 5)
DEFAULT_VERIFICATION_SETS = (1, 4, 7)
"""The default grid: W and G from the smallest meaningful 2 and 1 (TensorRT-LLM examples/lookahead/README.md) to 7,
N from 2 to 5 (the paper's range on 7B models); 36 settings, with the spec's own (W, N, G) always added."""

PLAIN = LookaheadConfig(1, 1, 0)
"""TensorRT-LLM's plain-decoding (W, N, G) (examples/lookahead/README.md): the baseline row."""


@dataclass(frozen=True)
class LookaheadGrid:
    """Candidate values per axis; the grid is every combination the rules and the spec's engine limits allow."""

    windows: Sequence[int] = DEFAULT_WINDOWS
    ngrams: Sequence[int] = DEFAULT_NGRAMS
    verification_sets: Sequence[int] = DEFAULT_VERIFICATION_SETS


@dataclass
class Candidates:
    """The grid's settings tune measures, and those the spec's engine limits leave out (with the reason)."""

    configs: list[LookaheadConfig]
    excluded: dict[LookaheadConfig, str] = field(default_factory=dict)


def grid_candidates(grid: LookaheadGrid, spec: PipelineSpec) -> Candidates:
    """Every (W, N, G) of the grid, plus the spec's own; a value below the smallest meaningful configuration is
    refused with the rule (contracts.lookahead.server_problems), a setting the spec's engine limits cannot hold
    is left out with the limit it breaks, and no setting left is an error naming the limits."""
    axes = {"--window": grid.windows, "--ngram": grid.ngrams, "--verification-set": grid.verification_sets}
    for (option, values), field_name, least in zip(axes.items(), la.LookaheadConfig._fields, la.SMALLEST_MEANINGFUL,
                                                   strict=True):
        if not values:
            raise SpecbuildError(f"lookahead grid: {option} needs at least one value")
        for value in values:
            probe = [*la.SMALLEST_MEANINGFUL]
            probe[la.LookaheadConfig._fields.index(field_name)] = value
            problems = la.server_problems(*probe)
            if problems:
                raise SpecbuildError(f"lookahead grid: {option} {value}: {field_name} {problems[0][1]}",
                                     hint=f"give {option} values of at least {least}")
    current = spec.speculative.lookahead_config().config
    product = {LookaheadConfig(*c) for c in itertools.product(grid.windows, grid.ngrams, grid.verification_sets)}
    candidates = Candidates([])
    for config in sorted(product | {LookaheadConfig(*current)}):
        reason = engine_limit_problem(config, spec)
        if reason is None:
            candidates.configs.append(config)
        else:
            candidates.excluded[config] = reason
    if not candidates.configs:
        reasons = sorted(set(candidates.excluded.values()))
        raise SpecbuildError(f"no (W, N, G) of the lookahead grid fits the spec's engine limits: {'; '.join(reasons)}",
                             hint="give other --window/--ngram/--verification-set values, or change those limits")
    return candidates


def engine_limit_problem(config: LookaheadConfig, spec: PipelineSpec) -> str | None:
    """Why an engine built from the spec could not run `config`, or None. The engine's max_draft_len must be the
    one (W, N, G) gives (so a spec that fixes speculative.max_draft_len fixes it), one verification step of the
    whole batch must fit build.max_num_tokens where the spec sets it (the checks `specbuild build` makes), and
    the block must be one tune can time."""
    draft_len = la.max_draft_len(*config)
    fixed = spec.speculative.max_draft_len
    if fixed is not None and draft_len != fixed:
        return (f"speculative.max_draft_len is {fixed}, and TensorRT-LLM's executor needs an engine's max_draft_len "
                f"to be exactly the one (W, N, G) gives (examples/lookahead/README.md)")
    tokens, limit = verification_tokens(spec.build.max_batch_size, draft_len), spec.build.max_num_tokens
    if limit is not None and tokens > limit:
        return (f"build.max_num_tokens {limit} is less than max_batch_size x (max_draft_len + 1), the tokens one "
                "verification step of a full batch needs")
    if draft_len + 1 > MAX_BLOCK_TOKENS:
        return f"a step would feed {draft_len + 1} tokens, more than the {MAX_BLOCK_TOKENS} tune measures"
    return None


@dataclass
class LookaheadRun:
    """One (W, N, G) over the calibration prompts: decoding steps after the prefill, what they yielded and fed."""

    config: LookaheadConfig
    tokens: int = 0  # tokens yielded by decoding steps (the prefill's own token left out)
    fed: Counter[int] = field(default_factory=Counter)  # block size -> decoding steps that fed it
    wall_seconds: float = 0.0  # the whole generation, prefill included (fastest repeat per prompt, summed)
    generated_tokens: int = 0

    @property
    def steps(self) -> int:
        return sum(self.fed.values())

    @property
    def tokens_per_step(self) -> float:
        return self.tokens / self.steps if self.steps else 0.0

    @property
    def mean_block(self) -> float:
        return sum(size * count for size, count in self.fed.items()) / self.steps if self.steps else 0.0

    def model_seconds(self, seconds_at: dict[int, float]) -> float:
        """The steps' summed cost: each one target forward over its block (the module's cost model)."""
        return sum(seconds_at[size] * count for size, count in self.fed.items())

    def model_tokens_per_second(self, seconds_at: dict[int, float]) -> float:
        return self.tokens / self.model_seconds(seconds_at)

    @property
    def wall_tokens_per_second(self) -> float:
        return self.generated_tokens / self.wall_seconds


@dataclass
class LookaheadTuning:
    """The measured candidates, the per-forward costs by block size, and the choice they give."""

    runs: dict[LookaheadConfig, LookaheadRun]  # PLAIN first, then the candidates
    seconds_at: dict[int, float]  # block size -> seconds of one target forward at the calibration's mean context
    context: int
    current: LookaheadConfig
    excluded: dict[LookaheadConfig, str] = field(default_factory=dict)
    batch: int = 1  # the engine's max batch size, the load every candidate is also costed at
    loaded_seconds_at: dict[int, float] = field(default_factory=dict)  # block size -> one forward of `batch` rows

    @property
    def candidates(self) -> list[LookaheadConfig]:
        return [config for config in self.runs if config != PLAIN]

    def model_tokens_per_second(self, config: LookaheadConfig) -> float:
        return self.runs[config].model_tokens_per_second(self.seconds_at)

    def speedup(self, config: LookaheadConfig) -> float:
        """Cost-model tokens/s against plain decoding's."""
        return self.model_tokens_per_second(config) / self.model_tokens_per_second(PLAIN)

    def loaded_speedup(self, config: LookaheadConfig) -> float:
        """The cost model's speed against plain decoding's with `batch` sequences in every forward (the batch
        factor cancels: both decode `batch` rows per step); at batch 1 the same as `speedup`."""
        costs = self.loaded_seconds_at or self.seconds_at
        return self.runs[config].model_tokens_per_second(costs) / self.runs[PLAIN].model_tokens_per_second(costs)

    def holds_under_load(self, config: LookaheadConfig) -> bool:
        return self.loaded_speedup(config) >= 1.0

    @property
    def chosen(self) -> LookaheadConfig:
        """What tune writes: the fastest by the batch-1 cost model of the candidates that hold plain's speed at
        the max batch, or where none does, the one losing least there (ties: the smaller engine)."""
        holding = [c for c in self.candidates if self.holds_under_load(c)]
        if holding:
            return max(holding, key=lambda c: (self.model_tokens_per_second(c), -la.max_draft_len(*c)))
        return max(self.candidates, key=lambda c: (self.loaded_speedup(c), -la.max_draft_len(*c)))


def tune_lookahead(model: CausalLM, prompts: Prompts, candidates: Candidates, current: Sequence[int],
                   new_tokens: int, context: int, repeats: int = 1,
                   ticks: Callable[[str, int], Tick] | None = None, batch: int = 1) -> LookaheadTuning:
    """Run plain decoding and every candidate on every prompt (batch 1, `sweep`), counting each step's block,
    then time one target forward at every block size seen, alone and (`batch` > 1) with `batch` rows, and choose
    by the module's cost model."""
    from specbuild.runtime.generation import generate
    from specbuild.runtime.lookahead_decoding import generate_lookahead
    from specbuild.runtime.sequence import GenerationStats, StopCriteria

    ticks = ticks or (lambda _label, _total: lambda: None)
    stop = StopCriteria(max_new_tokens=new_tokens)  # no end id: every prompt yields exactly new_tokens

    def run(config: LookaheadConfig) -> Callable[[list[int]], tuple[GenerationStats, list[int]]]:
        def one(prompt: list[int]) -> tuple[GenerationStats, list[int]]:
            with fed_tokens(model) as sizes:
                result = (generate(model, [prompt], stop=stop) if config == PLAIN
                          else generate_lookahead(model, [prompt], config, stop=stop))
            return result.stats, sizes

        return one

    configs = [PLAIN, *candidates.configs]
    measured = sweep({config: run(config) for config in configs}, prompts, repeats,
                     ticks(f"lookahead: {len(configs) - 1} (W, N, G) settings", repeats * len(prompts)))
    runs = {}
    for config in configs:
        record = LookaheadRun(config, wall_seconds=measured.wall_seconds[config])
        for stats, sizes in measured.outcomes[config]:
            record.generated_tokens += stats.generated_tokens
            record.tokens += stats.generated_tokens - 1  # the prefill (the first forward) yields one token
            record.fed.update(sizes[1:])
        runs[config] = record
    sizes = sorted({size for record in runs.values() for size in record.fed})
    cost_repeats = 7
    seconds = measure_forward_seconds({"target": (model, sizes)}, prompts[0], context, repeats=cost_repeats,
                                      tick=ticks(f"forward costs at {len(sizes)} block sizes", cost_repeats))
    loaded: dict[int, float] = {}
    if batch > 1:
        loaded = measure_forward_seconds({"target": (model, sizes)}, prompts[0], context, repeats=cost_repeats,
                                         tick=ticks(f"forward costs of {batch} rows at {len(sizes)} block sizes",
                                                    cost_repeats), batch=batch)["target"]
    return LookaheadTuning(runs, non_decreasing(seconds["target"]), context, LookaheadConfig(*current),
                           candidates.excluded, batch, non_decreasing(loaded))


def non_decreasing(seconds_at: dict[int, float]) -> dict[int, float]:
    """Each block size's cost as the least measured at that size or any larger one (see the module docstring)."""
    envelope: dict[int, float] = {}
    least = float("inf")
    for size in sorted(seconds_at, reverse=True):
        least = envelope[size] = min(least, seconds_at[size])
    return dict(sorted(envelope.items()))


def lookahead_table(t: LookaheadTuning) -> Table:
    """The measured candidates, best cost-model speed first, plain decoding as the last row."""
    table = Table(title=(f"Lookahead (W, N, G): tokens per decoding step and cost-model tokens/s (one target forward "
                         f"per step over its block, timed at {t.context} tokens of context; target forward "
                         f"{t.seconds_at[1] * 1e3:.2f} ms at 1 token)"), title_justify="left")
    for name in ("W,N,G", "max_draft_len", "block\ntokens", "tokens/step\nmeasured", "step\nms",
                 "tokens/s\ncost model", "vs plain\ncost model", f"vs plain\nat batch {t.batch}", "tokens/s\nwall",
                 ""):
        table.add_column(name, justify="right" if name else "left")
    chosen = t.chosen
    order = sorted(t.candidates, key=t.model_tokens_per_second, reverse=True)
    for config in [*order, PLAIN]:
        run = t.runs[config]
        marks = ", ".join(m for m, on in (("chosen", config == chosen), ("spec", config == t.current),
                                          ("plain", config == PLAIN)) if on)
        step_ms = run.model_seconds(t.seconds_at) / run.steps * 1e3 if run.steps else 0.0
        table.add_row(",".join(map(str, config)), str(la.max_draft_len(*config)), f"{run.mean_block:.1f}",
                      f"{run.tokens_per_step:.2f}", f"{step_ms:.2f}", f"{t.model_tokens_per_second(config):.0f}",
                      f"{t.speedup(config):.2f}x", f"{t.loaded_speedup(config):.2f}x",
                      f"{run.wall_tokens_per_second:.0f}", marks)
    held = ("the fastest at batch 1 of those holding plain's speed" if t.holds_under_load(chosen)
            else "none holds plain's speed there, so the one losing least")
    caption = (f"block tokens: mean tokens a step feeds the target; vs plain at batch {t.batch}: the cost model with "
               f"{t.batch} rows in every forward; chosen (W, N, G) = {tuple(chosen)} ({held} at batch {t.batch}), "
               f"{t.speedup(chosen):.2f}x plain at batch 1 and {t.loaded_speedup(chosen):.2f}x at batch {t.batch} "
               "by the cost model")
    if t.excluded:
        caption += f"; left out by the spec's engine limits: {len(t.excluded)} ({next(iter(t.excluded.values()))})"
    table.caption = caption
    return table
