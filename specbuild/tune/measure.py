"""Measurements `specbuild tune` decides from, made with the reference runtime on calibration prompts.

Greedy decoding throughout: its acceptance counts are deterministic (the same prompts give the same tokens per
step on every run and machine), which is what makes a tuned setting reproducible. Only the per-forward costs
are wall-clock figures; they are measured interleaved and repeated, and the fastest repeat is kept, because
other work on a shared machine only ever adds time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import torch

from specbuild.runtime.generation import generate, generate_proposed
from specbuild.runtime.medusa_decoding import MedusaConfig, generate_medusa
from specbuild.runtime.model import CausalLM
from specbuild.runtime.proposers import Proposer
from specbuild.runtime.sequence import GenerationStats, StopCriteria
from specbuild.runtime.speculative import DraftTargetConfig, generate_draft_target
from specbuild.spec import MAX_DRAFT_TOKENS

Prompts = list[list[int]]
Tick = Callable[[], None]
MAX_BLOCK_TOKENS = MAX_DRAFT_TOKENS + 1
"""The largest block (new tokens of one forward) whose cost is measured: K + 1 for K up to the spec's maximum
draft length, a Lookahead block of the grid's (W, N, G)."""


def _no_tick() -> None:
    return None


# ----------------------------------------------------------------------------------------------- calibration


def calibration_prompts(encode: Callable[[str], list[int]], texts: Sequence[str], count: int, length: int) -> Prompts:
    """`count` prompts of exactly `length` tokens: the opening of each text long enough, or, where there are
    fewer such texts (one big file), windows spread evenly over all the text's tokens."""
    if count < 1 or length < 1:
        raise ValueError("need at least one calibration prompt of at least one token")
    streams = [encode(text) for text in texts if text.strip()]
    prompts = [ids[:length] for ids in streams if len(ids) >= length][:count]
    if len(prompts) == count:
        return prompts
    tokens = [token for ids in streams for token in ids]
    windows = len(tokens) // length
    if windows < count:
        raise ValueError(f"the calibration text has {len(tokens)} tokens: too few for {count} prompts of {length} "
                         "tokens; give more text or fewer/shorter prompts")
    stride = windows // count
    return [tokens[i * stride * length : (i * stride + 1) * length] for i in range(count)]


# ----------------------------------------------------------------------------------------------- forward costs


@dataclass
class ForwardCosts:
    """Seconds per forward after a `context`-token prefix: the target for 1..n new tokens, the draft for one."""

    context: int
    target: dict[int, float]
    draft: float
    repeats: list[ForwardCosts] = field(default_factory=list)
    """Each interleaved repeat's own costs (the fields above keep the fastest of them): what tells a difference
    between two settings from the noise, by whether it holds in every repeat (DraftLengthTuning.chosen)."""

    def __post_init__(self) -> None:
        # A forward over more new tokens never costs less than one over fewer: a block timed below a smaller one
        # (a quiet moment of a busy machine, the fastest of repeats) is raised to it, so noise cannot make a longer
        # K's verification look cheaper than a shorter one's and win K (one run timed 6 tokens at 0.81x 4 tokens).
        sizes = sorted(self.target)
        self.target = {n: max(self.target[m] for m in sizes[: i + 1]) for i, n in enumerate(sizes)}

    @property
    def cost_ratio(self) -> float:
        """Leviathan et al.'s c: one draft forward over one target forward."""
        return self.draft / self.target[1]

    def verify_cost(self, k: int) -> float:
        """A target forward over K + 1 tokens (one verification) relative to one over a single token."""
        return self.target[k + 1] / self.target[1]

    def step_seconds(self, k: int) -> float:
        """One draft-target round: K draft forwards and one K + 1 token verification."""
        return k * self.draft + self.target[k + 1]


Step = Callable[[int], None]
"""One forward of n new tokens after a fixed context, never committed, so every call measures the same step."""
StepFactory = Callable[[list[int], int, int], Step]
"""(prompt, context, most new tokens) -> a Step after `context` tokens made from the prompt: how a model that is
not a CausalLM (an EAGLE-3 draft) is timed."""


def prefilled(model: CausalLM, prompt: list[int], context: int, most: int, batch: int = 1) -> Step:
    """A forward of n (at most `most`) new tokens in each of `batch` rows after `context` committed ones; the
    block is never committed, so every call measures the same step."""
    ids = (prompt * (context // len(prompt) + 1))[:context]
    cache = model.new_cache(batch, context + most + 1)
    model(torch.tensor([ids] * batch), cache)
    cache.advance(context)
    token = ids[-1]

    def step(n: int) -> None:
        model(torch.full((batch, n), token, dtype=torch.long), cache)

    return step


def measure_forward_seconds(models: Mapping[str, tuple[CausalLM | StepFactory, Sequence[int]]], prompt: list[int],
                            context: int, repeats: int = 7, inner: int = 4,
                            tick: Tick = _no_tick, batch: int = 1) -> dict[str, dict[int, float]]:
    """Seconds of one forward of each model at each of its block sizes (new tokens), after `context` tokens:
    {name: (model or its StepFactory, sizes)} -> {name: {size: seconds}}, the fastest repeat of
    time_forward_repeats."""
    passes = time_forward_repeats(models, prompt, context, repeats, inner, tick, batch)
    return {name: {n: min(seconds) for n, seconds in sizes.items()} for name, sizes in passes.items()}


def time_forward_repeats(models: Mapping[str, tuple[CausalLM | StepFactory, Sequence[int]]], prompt: list[int],
                         context: int, repeats: int = 7, inner: int = 4,
                         tick: Tick = _no_tick, batch: int = 1) -> dict[str, dict[int, list[float]]]:
    """Every repeat's seconds of one forward of each model at each of its block sizes: {name: {size: [seconds
    per repeat]}}; with `batch`, a CausalLM's forward runs that many rows of the block at once (a StepFactory's
    runs one row).

    Every repeat times each (model, size) once (`inner` forwards in a row), interleaved, so a burst of other
    work on the machine hits them alike.
    """
    if any(n > MAX_BLOCK_TOKENS or n < 1 for _, sizes in models.values() for n in sizes):
        raise ValueError(f"block sizes are 1 to {MAX_BLOCK_TOKENS} tokens")
    jobs = [(name, n, step) for name, (model, sizes) in models.items()
            for step in [prefilled(model, prompt, context, max(sizes), batch) if isinstance(model, CausalLM)
                         else model(prompt, context, max(sizes))]
            for n in sorted(set(sizes))]
    timed: dict[tuple[str, int], list[float]] = {(name, n): [] for name, n, _ in jobs}
    with torch.inference_mode():
        for _, n, step in jobs:  # warm-up
            step(n)
        for _ in range(repeats):
            for name, n, step in jobs:
                start = time.perf_counter()
                for _ in range(inner):
                    step(n)
                timed[name, n].append((time.perf_counter() - start) / inner)
            tick()
    return {name: {n: timed[name, n] for n in sorted(set(sizes))} for name, (_, sizes) in models.items()}


@dataclass(frozen=True)
class Drafter:
    """What the draft-length search needs of a drafting method (a draft model, an EAGLE-3 draft head): one
    generation at K, and how one draft forward of one token is timed. One K search serves every method."""

    name: str
    generate: Callable[[Prompts, int, StopCriteria], GenerationStats]  # (prompts run side by side, K, stop)
    draft_forward: CausalLM | StepFactory


def draft_model(target: CausalLM, draft: CausalLM) -> Drafter:
    """Draft-target speculative decoding with a separate draft model in an engine of its own: the engine flow's
    BLS, which calls a draft engine and a target engine each round."""
    return Drafter("draft-target", lambda prompts, k, stop: generate_draft_target(
        target, draft, prompts, stop=stop, config=DraftTargetConfig(num_draft_tokens=k)).stats, draft)


def one_engine(name: str, target: CausalLM, proposer: Callable[[int], Proposer],
               draft_forward: CausalLM | StepFactory) -> Drafter:
    """Drafting inside the target's serving engine, as the server runs a self-draft (the tensorrt_llm model) and
    the PyTorch flow's DraftTarget and EAGLE-3 (the llmapi model): `proposer(K)` builds the proposer the server
    builds, so tune times the engine that serves the spec, not another loop with the same acceptance."""
    return Drafter(name, lambda prompts, k, stop: generate_proposed(target, prompts, proposer(k), stop=stop).stats,
                   draft_forward)


def measure_forward_costs(target: CausalLM, drafter: Drafter, prompt: list[int], context: int, max_tokens: int,
                          repeats: int = 7, inner: int = 4, tick: Tick = _no_tick) -> ForwardCosts:
    """Per-forward seconds for the target at 1..max_tokens new tokens and the draft at one, at `context`: the
    fastest repeat, and each repeat's own (time_forward_repeats)."""
    passes = time_forward_repeats({"draft": (drafter.draft_forward, [1]),
                                   "target": (target, range(1, max_tokens + 1))},
                                  prompt, context, repeats, inner, tick)
    each = [ForwardCosts(context, {n: seconds[r] for n, seconds in passes["target"].items()}, passes["draft"][1][r])
            for r in range(repeats)]
    return ForwardCosts(context, {n: min(seconds) for n, seconds in passes["target"].items()},
                        min(passes["draft"][1]), each)


@contextmanager
def fed_tokens(model: CausalLM) -> Iterator[list[int]]:
    """The tokens each forward of `model` is fed (its block's length), in order, while the block runs: what a
    step costs depends on it, and the decoding functions do not report it. Batch 1 gives one sequence's steps."""
    sizes: list[int] = []
    handle = model.register_forward_pre_hook(lambda _module, args: sizes.append(int(args[0].shape[1])))
    try:
        yield sizes
    finally:
        handle.remove()


# ----------------------------------------------------------------------------------------------- acceptance


@dataclass
class Acceptance:
    """Per-sequence speculation counts summed over calibration prompts (GenerationStats' positions)."""

    proposed_by_position: list[int] = field(default_factory=list)
    accepted_by_position: list[int] = field(default_factory=list)
    generated_tokens: int = 0
    target_forwards: int = 0

    def add(self, stats: GenerationStats) -> None:
        while len(self.proposed_by_position) < len(stats.proposed_by_position):
            self.proposed_by_position.append(0)
            self.accepted_by_position.append(0)
        for i, (p, a) in enumerate(zip(stats.proposed_by_position, stats.accepted_by_position, strict=True)):
            self.proposed_by_position[i] += p
            self.accepted_by_position[i] += a
        self.generated_tokens += stats.generated_tokens
        self.target_forwards += stats.target_forwards

    @property
    def rounds(self) -> int:
        return self.proposed_by_position[0] if self.proposed_by_position else 0

    @property
    def accepted_per_round(self) -> float:
        return sum(self.accepted_by_position) / self.rounds if self.rounds else 0.0

    @property
    def tokens_per_step(self) -> float:
        """Tokens one verification step yields per sequence: the accepted drafts plus the target's own token."""
        return 1.0 + self.accepted_per_round

    @property
    def alpha(self) -> float:
        """The per-token acceptance rate: maximum-likelihood estimate for Leviathan et al.'s i.i.d. model from
        rounds of K proposals, accepted tokens / (accepted tokens + rounds that stopped at a rejection)."""
        accepted = sum(self.accepted_by_position)
        full = self.accepted_by_position[-1] if self.accepted_by_position else 0
        rejections = self.rounds - full
        return accepted / (accepted + rejections) if accepted + rejections else 0.0


def _stop(new_tokens: int) -> StopCriteria:
    return StopCriteria(max_new_tokens=new_tokens)  # no end id: every prompt yields exactly new_tokens


Setting = TypeVar("Setting", bound=Hashable)
Outcome = TypeVar("Outcome")


@dataclass
class Sweep(Generic[Setting, Outcome]):
    """What each setting's run gave on each calibration prompt (the last pass), and its wall time."""

    outcomes: dict[Setting, list[Outcome]]  # setting -> one outcome per prompt, in prompt order
    wall_seconds: dict[Setting, float]  # setting -> summed per-prompt fastest-repeat seconds


def sweep(runs: Mapping[Setting, Callable[[list[int]], Outcome]], prompts: Prompts, repeats: int = 1,
          tick: Tick = _no_tick) -> Sweep[Setting, Outcome]:
    """Run every prompt with every setting (batch 1), the settings interleaved prompt by prompt and the whole
    pass repeated; per (setting, prompt) the fastest repeat's wall time is kept. Outcomes come from the last
    pass (greedy decoding: the same in every pass). One tick per prompt per pass."""
    best: dict[tuple[Setting, int], float] = {}
    outcomes: dict[Setting, list[Outcome]] = {}
    with torch.inference_mode():
        for run in runs.values():  # warm-up
            run(prompts[0])
        for _ in range(max(1, repeats)):
            outcomes = {setting: [] for setting in runs}
            for index, prompt in enumerate(prompts):
                for setting, run in runs.items():
                    start = time.perf_counter()
                    outcome = run(prompt)
                    seconds = time.perf_counter() - start
                    best[setting, index] = min(seconds, best.get((setting, index), float("inf")))
                    outcomes[setting].append(outcome)
                tick()
    wall = {setting: sum(best[setting, i] for i in range(len(prompts))) for setting in runs}
    return Sweep(outcomes, wall)


@dataclass
class KSweep:
    """Draft-target at each K over the calibration prompts (batch 1), and plain decoding for reference."""

    acceptance: dict[int, Acceptance]
    wall_seconds: dict[int, float]  # K -> summed per-prompt fastest-repeat seconds; 0 = plain decoding
    generated_tokens: int

    def tokens_per_second(self, k: int) -> float:
        return self.generated_tokens / self.wall_seconds[k]


def sweep_draft_lengths(target: CausalLM, drafter: Drafter, prompts: Prompts, new_tokens: int, ks: Sequence[int],
                        repeats: int = 1, tick: Tick = _no_tick, plain: bool = True) -> KSweep:
    """Generate every prompt at every K with the drafter (and plainly, unless `plain` is False), batch 1, by
    `sweep`."""
    stop = _stop(new_tokens)
    runs: dict[int, Callable[[list[int]], GenerationStats]] = {}
    if plain:
        runs[0] = lambda p: generate(target, [p], stop=stop).stats
    for k in ks:
        runs[k] = lambda p, k=k: drafter.generate([p], k, stop)
    measured = sweep(runs, prompts, repeats, tick)
    acceptance = {k: Acceptance() for k in ks}
    for k in ks:
        for stats in measured.outcomes[k]:
            acceptance[k].add(stats)
    generated = sum(stats.generated_tokens for stats in measured.outcomes.get(0, []))
    return KSweep(acceptance, measured.wall_seconds, generated)


# ----------------------------------------------------------------------------------------------- Medusa


@dataclass
class HeadAccuracy:
    """Per head, how often the target's own greedy token is the head's rank-i guess (ranks < top_k)."""

    hits: list[list[int]]  # [head][rank]
    positions: list[int]  # [head] positions evaluated

    @property
    def accuracies(self) -> list[list[float]]:
        return [[h / n if n else 0.0 for h in row] for row, n in zip(self.hits, self.positions, strict=True)]

    def top_k(self, head: int, k: int) -> float:
        """Top-k accuracy: the greedy token is among the head's k best guesses."""
        return sum(self.accuracies[head][:k])


def greedy_continuations(model: CausalLM, prompts: Prompts, new_tokens: int) -> Prompts:
    """The target's own greedy outputs: Medusa's greedy verification accepts a guess iff it equals these."""
    with torch.inference_mode():
        return generate(model, prompts, stop=_stop(new_tokens)).output_ids


def measure_head_accuracy(model: CausalLM, prompts: Prompts, continuations: Prompts, top_k: int,
                          tick: Tick = _no_tick) -> HeadAccuracy:
    """Teacher-forced on prompt + the target's greedy continuation: at each position t of the generated region,
    head h guesses the token at t + h + 2 (the base model's own guess is token t + 1, the tree's root)."""
    heads = model.config.num_medusa_heads
    if heads == 0:
        raise ValueError("this checkpoint has no Medusa heads (architecture MedusaForCausalLM is needed)")
    if not 1 <= top_k <= model.config.vocab_size:
        raise ValueError(f"top_k must be between 1 and the vocabulary size {model.config.vocab_size}")
    hits = [[0] * top_k for _ in range(heads)]
    positions = [0] * heads
    with torch.inference_mode():
        for prompt, output in zip(prompts, continuations, strict=True):
            sequence = [*prompt, *output]
            out = model(torch.tensor([sequence]), model.new_cache(1, len(sequence)), medusa=True)
            assert out.medusa_logits is not None
            guesses = torch.topk(out.medusa_logits[:, 0], top_k, dim=-1).indices  # [heads, T, top_k]
            truth = torch.tensor(sequence)
            for h in range(heads):
                first, last = len(prompt) - 1, len(sequence) - h - 3  # t + h + 2 must exist
                if last < first:
                    continue
                span = guesses[h, first : last + 1]  # [n, top_k]
                target = truth[first + h + 2 : last + h + 3, None]  # [n, 1]
                ranks = (span == target).long()  # at most one rank matches
                for rank, count in enumerate(ranks.sum(0).tolist()):
                    hits[h][rank] += count
                positions[h] += span.shape[0]
            tick()
    return HeadAccuracy(hits, positions)


def medusa_acceptance(model: CausalLM, prompts: Prompts, new_tokens: int, choices: Sequence[Sequence[int]],
                      batch_size: int = 4, tick: Tick = _no_tick) -> Acceptance:
    """Tokens per step of one tree, measured by greedy Medusa decoding of the calibration prompts."""
    config = MedusaConfig(choices=tuple(tuple(c) for c in choices))
    acceptance = Acceptance()
    with torch.inference_mode():
        for start in range(0, len(prompts), batch_size):
            acceptance.add(generate_medusa(model, prompts[start : start + batch_size], config,
                                           stop=_stop(new_tokens)).stats)
            tick()
    return acceptance
