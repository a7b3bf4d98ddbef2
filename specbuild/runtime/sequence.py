"""What every decoding loop shares: when a sequence stops, its progress, and the counters reported about it.

Invariant of every loop in the runtime: a model's KV cache holds each sequence's prompt and output except the
last generated token (the "pending" token), which is the next input. Speculative loops add verified tokens to
the caches in bulk but keep the invariant, which is what makes their greedy output identical to plain decoding.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class StopCriteria:
    """When a sequence is finished: `max_new_tokens`, the end id (never emitted), or a stop word. TensorRT-LLM's
    executor keeps the stop word in the output (its stop criterion only marks the sequence finished:
    NVIDIA/TensorRT-LLM cpp/tensorrt_llm/kernels/stopCriteriaKernels.h, FINISHED_STOP_WORDS);
    `include_stop_words=False` drops it, as `specbuild generate --stop` does."""

    max_new_tokens: int = 64
    end_id: int | None = None
    stop_words: tuple[tuple[int, ...], ...] = ()
    include_stop_words: bool = False

    def held_back(self, output: Sequence[int]) -> int:
        """How many trailing tokens of `output` could still become a stop word that is dropped: a stream must
        not send them yet (0 when stop words are kept, or none could start here)."""
        if self.include_stop_words:
            return 0
        hold = 0
        for word in self.stop_words:
            for n in range(min(len(word) - 1, len(output)), hold, -1):
                if list(output[-n:]) == list(word[:n]):
                    hold = n
                    break
        return hold


@dataclass
class SequenceState:
    """One request's progress."""

    prompt: list[int]
    output: list[int] = field(default_factory=list)
    done: bool = False
    finish_reason: str | None = None  # end_id, stop_word or length

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output

    def emit(self, token: int, stop: StopCriteria) -> bool:
        """Append one token unless it ends the sequence; True while the sequence goes on."""
        if self.done:
            return False
        if stop.end_id is not None and token == stop.end_id:
            self.done, self.finish_reason = True, "end_id"
            return False
        self.output.append(token)
        for word in stop.stop_words:
            if word and self.output[-len(word):] == list(word):
                if not stop.include_stop_words:
                    del self.output[-len(word):]
                self.done, self.finish_reason = True, "stop_word"
                return False
        if len(self.output) >= stop.max_new_tokens:
            self.done, self.finish_reason = True, "length"
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


def check_prompts(prompts: Sequence[Sequence[int]], vocab_size: int) -> None:
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    for p in prompts:
        if min(p) < 0 or max(p) >= vocab_size:
            raise ValueError(f"prompt token ids must be in [0, {vocab_size}) (got {min(p)}..{max(p)})")


class RoundLoop:
    """A batched speculative generation run round by round: every round advances each unfinished sequence of
    `seqs` (drafts proposed, verified, accepted tokens emitted through `SequenceState`'s stop rules) until all are
    done. Subclasses give `round` (and `prefill`, `finish` where they need them); the loop and the result are one."""

    seqs: list[SequenceState]
    stats: GenerationStats

    def prefill(self) -> None:
        """Before the first round (e.g. the prompts' forward); nothing by default."""

    def round(self) -> None:
        raise NotImplementedError

    def finish(self) -> None:
        """After the last round, before the result (e.g. forward counts kept elsewhere); nothing by default."""

    def run(self) -> GenerationResult:
        start = time.perf_counter()
        self.prefill()
        while not all(s.done for s in self.seqs):
            self.round()
        self.finish()
        self.stats.generated_tokens = sum(len(s.output) for s in self.seqs)
        self.stats.seconds = time.perf_counter() - start
        return GenerationResult([s.output for s in self.seqs], self.stats)

