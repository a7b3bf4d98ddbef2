"""Plain (non-speculative) decoding, and the bookkeeping every decoding loop shares.

Invariant of every loop in this package: a model's KV cache holds each sequence's prompt and output except the
last generated token (the "pending" token), which is the next input. Speculative loops add verified tokens
to the caches in bulk but keep the invariant, which is what makes their greedy output identical to this one.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from specbuild.runtime.sampling import SamplingParams, next_tokens

if TYPE_CHECKING:
    from specbuild.runtime.kv_cache import KVCache
    from specbuild.runtime.model import CausalLM


@dataclass(frozen=True)
class StopCriteria:
    """When a sequence is finished: `max_new_tokens`, the end id (not emitted), or a stop word (not emitted)."""

    max_new_tokens: int = 64
    end_id: int | None = None
    stop_words: tuple[tuple[int, ...], ...] = ()


@dataclass
class SequenceState:
    """One request's progress."""

    prompt: list[int]
    output: list[int] = field(default_factory=list)
    done: bool = False

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output

    def emit(self, token: int, stop: StopCriteria) -> bool:
        """Append one token unless it ends the sequence; True while the sequence goes on."""
        if self.done:
            return False
        if stop.end_id is not None and token == stop.end_id:
            self.done = True
            return False
        self.output.append(token)
        for word in stop.stop_words:
            if word and self.output[-len(word):] == list(word):
                del self.output[-len(word):]
                self.done = True
                return False
        if len(self.output) >= stop.max_new_tokens:
            self.done = True
        return not self.done


@dataclass
class GenerationStats:
    """Counters that the CLI, Triton models and benchmarks report."""

    target_forwards: int = 0
    draft_forwards: int = 0
    generated_tokens: int = 0
    proposed_by_position: list[int] = field(default_factory=list)
    accepted_by_position: list[int] = field(default_factory=list)
    seconds: float = 0.0

    def record_acceptance(self, proposed: int, accepted: int) -> None:
        """One sequence's round: `proposed` draft positions, the first `accepted` of them accepted."""
        while len(self.proposed_by_position) < proposed:
            self.proposed_by_position.append(0)
            self.accepted_by_position.append(0)
        for position in range(proposed):
            self.proposed_by_position[position] += 1
            self.accepted_by_position[position] += int(position < accepted)

    @property
    def tokens_per_target_forward(self) -> float:
        return self.generated_tokens / self.target_forwards if self.target_forwards else 0.0

    @property
    def acceptance_by_position(self) -> list[float]:
        return [a / p if p else 0.0 for a, p in zip(self.accepted_by_position, self.proposed_by_position, strict=True)]

    @property
    def tokens_per_second(self) -> float:
        return self.generated_tokens / self.seconds if self.seconds else 0.0


@dataclass
class GenerationResult:
    output_ids: list[list[int]]
    stats: GenerationStats


def padded(rows: Sequence[Sequence[int]], pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded [B, T] ids and each row's real length."""
    lengths = torch.tensor([len(r) for r in rows], dtype=torch.long)
    ids = torch.full((len(rows), int(lengths.max())), pad, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
    return ids, lengths


def last_logits(logits: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Each row's logits at its last real (non-padding) position: [B, T, V] -> [B, V]."""
    return logits[torch.arange(logits.shape[0]), lengths - 1]


def check_prompts(prompts: Sequence[Sequence[int]], vocab_size: int) -> None:
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    for p in prompts:
        if min(p) < 0 or max(p) >= vocab_size:
            raise ValueError(f"prompt token ids must be in [0, {vocab_size}) (got {min(p)}..{max(p)})")


def prefill(
    model: CausalLM, cache: KVCache, seqs: list[SequenceState], params: SamplingParams, gen: torch.Generator,
    stop: StopCriteria,
) -> torch.Tensor:
    """Run the prompts through the model, commit them, and emit each sequence's first token, which becomes
    the pending token returned here ([B])."""
    ids, lengths = padded([s.prompt for s in seqs])
    out = model(ids, cache)
    cache.advance(lengths)
    first = next_tokens(last_logits(out.logits, lengths), params, gen)
    for seq, token in zip(seqs, first.tolist(), strict=True):
        seq.emit(token, stop)
    return first


def generate(
    model: CausalLM,
    prompts: Sequence[Sequence[int]],
    params: SamplingParams = SamplingParams(),
    stop: StopCriteria = StopCriteria(),
) -> GenerationResult:
    """Plain autoregressive decoding of a batch of prompts: one target forward per generated token."""
    check_prompts(prompts, model.config.vocab_size)
    start = time.perf_counter()
    seqs = [SequenceState(list(p)) for p in prompts]
    gen = params.generator(model.device)
    cache = model.new_cache(len(seqs), max(len(p) for p in prompts) + stop.max_new_tokens + 1)
    stats = GenerationStats()
    pending = prefill(model, cache, seqs, params, gen, stop)
    stats.target_forwards += 1
    while not all(s.done for s in seqs):
        out = model(pending[:, None], cache)
        stats.target_forwards += 1
        active = torch.tensor([not s.done for s in seqs])
        cache.advance(active.long())
        pending = next_tokens(out.logits[:, -1], params, gen)
        for seq, token in zip(seqs, pending.tolist(), strict=True):
            seq.emit(token, stop)
    stats.generated_tokens = sum(len(s.output) for s in seqs)
    stats.seconds = time.perf_counter() - start
    return GenerationResult([s.output for s in seqs], stats)
