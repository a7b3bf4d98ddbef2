"""Measurements `specbuild tune` decides from, made with the reference runtime on calibration prompts.

Greedy decoding throughout: its acceptance counts are deterministic (the same prompts give the same tokens per
step on every run and machine), which is what makes a tuned setting reproducible. Only the per-forward costs
are wall-clock figures; they are measured interleaved and repeated, and the fastest repeat is kept, because
other work on a shared machine only ever adds time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from specbuild.runtime.generation import generate
from specbuild.runtime.medusa_decoding import MedusaConfig, generate_medusa
from specbuild.runtime.model import CausalLM
from specbuild.runtime.sequence import GenerationStats, StopCriteria
from specbuild.runtime.speculative import DraftTargetConfig, generate_draft_target

Prompts = list[list[int]]
Tick = Callable[[], None]


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


def _prefilled(model: CausalLM, prompt: list[int], context: int) -> Callable[[int], None]:
    """A forward of n new tokens after `context` committed ones; the block is never committed, so every call
    measures the same step."""
    ids = (prompt * (context // len(prompt) + 1))[:context]
    cache = model.new_cache(1, context + 70)
    model(torch.tensor([ids]), cache)
    cache.advance(context)
    token = ids[-1]

    def step(n: int) -> None:
        model(torch.full((1, n), token, dtype=torch.long), cache)

    return step


def measure_forward_costs(target: CausalLM, draft: CausalLM, prompt: list[int], context: int, max_tokens: int,
                          repeats: int = 7, inner: int = 4, tick: Tick = _no_tick) -> ForwardCosts:
    """Per-forward seconds for the target at 1..max_tokens new tokens and the draft at one, at `context`.

    Every repeat times each configuration once (`inner` forwards in a row), interleaved, so a burst of other
    work on the machine hits them alike; per configuration the fastest repeat is kept.
    """
    if max_tokens > 64:
        raise ValueError("at most 64 verification tokens")
    target_step = _prefilled(target, prompt, context)
    draft_step = _prefilled(draft, prompt, context)
    jobs: list[tuple[str, int, Callable[[int], None]]] = [("draft", 1, draft_step)]
    jobs += [("target", n, target_step) for n in range(1, max_tokens + 1)]
    best: dict[tuple[str, int], float] = {}
    with torch.inference_mode():
        for _, n, step in jobs:  # warm-up
            step(n)
        for _ in range(repeats):
            for name, n, step in jobs:
                start = time.perf_counter()
                for _ in range(inner):
                    step(n)
                seconds = (time.perf_counter() - start) / inner
                best[name, n] = min(seconds, best.get((name, n), float("inf")))
            tick()
    return ForwardCosts(context, {n: best["target", n] for n in range(1, max_tokens + 1)}, best["draft", 1])


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


@dataclass
class KSweep:
    """Draft-target at each K over the calibration prompts (batch 1), and plain decoding for reference."""

    acceptance: dict[int, Acceptance]
    wall_seconds: dict[int, float]  # K -> summed per-prompt fastest-repeat seconds; 0 = plain decoding
    generated_tokens: int

    def tokens_per_second(self, k: int) -> float:
        return self.generated_tokens / self.wall_seconds[k]


def sweep_draft_lengths(target: CausalLM, draft: CausalLM, prompts: Prompts, new_tokens: int, ks: Sequence[int],
                        repeats: int = 1, tick: Tick = _no_tick) -> KSweep:
    """Generate every prompt at every K (and plainly), batch 1, the settings interleaved prompt by prompt and
    the whole pass repeated; per (setting, prompt) the fastest repeat's wall time is kept. Counts come from the
    last pass (greedy: the same in every pass)."""
    stop = _stop(new_tokens)
    runs: dict[int, Callable[[list[int]], GenerationStats]] = {
        0: lambda p: generate(target, [p], stop=stop).stats}
    for k in ks:
        runs[k] = (lambda p, k=k: generate_draft_target(
            target, draft, [p], stop=stop, config=DraftTargetConfig(num_draft_tokens=k)).stats)
    best: dict[tuple[int, int], float] = {}
    acceptance: dict[int, Acceptance] = {}
    generated = 0
    with torch.inference_mode():
        for setting in runs.values():  # warm-up
            setting(prompts[0])
        for _ in range(max(1, repeats)):
            acceptance = {k: Acceptance() for k in ks}
            generated = 0
            for index, prompt in enumerate(prompts):
                for k, run in runs.items():
                    start = time.perf_counter()
                    stats = run(prompt)
                    seconds = time.perf_counter() - start
                    best[k, index] = min(seconds, best.get((k, index), float("inf")))
                    if k:
                        acceptance[k].add(stats)
                    else:
                        generated += stats.generated_tokens
                tick()
    wall = {k: sum(best[k, i] for i in range(len(prompts))) for k in runs}
    return KSweep(acceptance, wall, generated)


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
