"""Load-aware speculation: how many tokens to draft per step for a given number of active sequences.

A speculative step costs more than a plain one; with few sequences the hardware has room and drafting pays,
with many it does not. TensorRT-LLM's LLM API has the same two knobs on every speculative config
(NVIDIA/TensorRT-LLM `tensorrt_llm/llmapi/llm_args.py`, `DecodingBaseConfig`, 1.2 line): `draft_len_schedule`
maps batch-size thresholds to draft lengths ({1: 4, 4: 2, 8: 0}: from 1 active sequence draft 4, from 4 draft 2,
from 8 none) and must contain 1 with the full draft length; `max_concurrency` turns speculation off above that
many active sequences. The n-gram drafter's auto-disable works the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


def schedule_problems(schedule: Mapping[int, int], full_draft_len: int) -> list[str]:
    """What is wrong with a schedule whose full draft length (batch size 1: K, or the Medusa tree's node count)
    is `full_draft_len`; TensorRT-LLM's LLM API calls that length max_draft_len."""
    problems = []
    if 1 not in schedule:
        problems.append(f"must map batch size 1 to the full draft length ({{1: {full_draft_len}}}), as "
                        "TensorRT-LLM requires")
    elif schedule[1] != full_draft_len:
        problems.append(f"batch size 1 must draft the full length {full_draft_len}, not {schedule[1]}")
    for size, length in schedule.items():
        if type(size) is not int or size < 1:
            problems.append(f"batch size {size!r} must be an integer >= 1")
        if type(length) is not int or not 0 <= length <= full_draft_len:
            problems.append(f"draft length {length!r} (batch size {size}) must be an integer in 0..{full_draft_len}")
    return problems


@dataclass(frozen=True)
class DraftSchedule:
    """Draft length by number of active sequences; `max_concurrency`: none above it."""

    steps: dict[int, int] = field(default_factory=dict)
    full_draft_len: int = 0
    """The draft length at batch size 1 (K, or the Medusa tree's node count)."""
    max_concurrency: int | None = None

    def __post_init__(self) -> None:
        if self.steps:
            problems = schedule_problems(self.steps, self.full_draft_len)
            if problems:
                raise ValueError("draft_len_schedule " + "; ".join(problems))

    def draft_len(self, active: int) -> int:
        """The draft length for `active` sequences: the entry of the largest threshold <= active."""
        if self.max_concurrency is not None and active > self.max_concurrency:
            return 0
        if not self.steps:
            return self.full_draft_len
        return self.steps[max(size for size in self.steps if size <= max(1, active))]
