"""Load-aware speculation: how many tokens to draft per step for a given number of active sequences, and when
to stop speculating for good - the rules TensorRT-LLM's PyTorch backend applies, in one place for the serving
engine (every proposer, the Medusa tree) and the Triton models.

A speculative step costs more than a plain one; with few sequences the hardware has room and drafting pays,
with many it does not. TensorRT-LLM's LLM API has the same knobs on every speculative config (`DecodingBaseConfig`
in NVIDIA/TensorRT-LLM `tensorrt_llm/llmapi/llm_args.py`):

- `max_concurrency`: no speculation when more sequences are active (`Drafter.should_use_spec_decode`,
  tensorrt_llm/_torch/speculative/drafter.py @83ab45a5: `len(requests) <= max_concurrency`, the requests capped
  by max_batch_size and by max_num_tokens // (1 + max_total_draft_tokens); the engine's rows are its batch cap).
- `draft_len_schedule` (batch size -> draft length). Two lookups, by TensorRT-LLM line:
  `"from"` (the 1.2 line; drafter.py's `get_draft_len_for_batch_size` by `bisect_right`): a key is the smallest
  batch size its length applies from - the entry of the largest key <= the batch - and the schedule must map 1
  to max_draft_len ({1: 4, 4: 2, 8: 0}: from 1 draft 4, from 4 draft 2, from 8 none);
  `"up_to"` (main after 1.2, `get_draft_len_for_batch_size` in tensorrt_llm/_torch/speculative/ by
  `bisect_left`, "New semantics"): a key is the largest batch size its length applies to - the entry of the
  smallest key >= the batch, 0 above the largest key - the smallest key must map to max_draft_len, and
  max_concurrency is the schedule {max_concurrency: max_draft_len} (the two are mutually exclusive there).
- `acceptance_window` / `acceptance_length_threshold` (`SpeculationGate`, tensorrt_llm/_torch/speculative/
  speculation_gate.py @41080dc5): once `window` requests have completed, speculation is switched off for good when
  the mean over the last `window` completed requests of (avg decoded tokens per iteration - 1) is below the
  threshold; it never switches back on. Off when either is unset or the window is 0.
"""

from __future__ import annotations

import json
import os
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

Lookup = Literal["from", "up_to"]
"""How a batch size between draft_len_schedule keys is looked up (the module docstring: TensorRT-LLM 1.2 / main)."""


SCHEDULE_ENV = "SPECBUILD_DRAFT_LEN_SCHEDULE"
"""A draft_len_schedule (JSON, batch size -> length) that the served models run instead of their repository's, when
set in the server's environment: `specbuild tune --served` serves one deployed repository at one fixed length after
another without redeploying it, and `specbuild serve --draft-len-schedule` tries a schedule the same way. It is in
the spec's form, each length from its batch size on, whatever TensorRT-LLM line the repository was deployed for
(`served_lookup`): one JSON means one schedule on every repository."""


DRAFT_LEN_ENV = "SPECBUILD_NUM_DRAFT_TOKENS"
"""The full draft length K (the one at batch size 1, and a request's K when it sends no num_draft_tokens) that the
draft-target BLS runs instead of its repository's num_draft_tokens, when set in the server's environment; at most the
target engine's max_draft_len. `specbuild tune --served` sets it to max_draft_len, so that every K a request may ask
for (NVIDIA's `num_draft_tokens` input) can be measured on one deployed repository."""


def served_draft_len(configured: int, max_draft_len: int, log: Callable[[str], None] | None = None) -> int:
    """The full draft length the BLS runs: DRAFT_LEN_ENV's where the server was started with it (said to `log`),
    else its configuration's; ValueError when the override is not a K in 1..max_draft_len."""
    override = os.environ.get(DRAFT_LEN_ENV)
    if not override:
        return configured
    try:
        k = int(override)
    except ValueError:
        k = 0
    if not 1 <= k <= max_draft_len:
        raise ValueError(f"{DRAFT_LEN_ENV}={override!r}: the full draft length must be an integer in "
                         f"1..{max_draft_len} (the target engine's max_draft_len)")
    if log is not None:
        log(f"num_draft_tokens {k} from {DRAFT_LEN_ENV}, not the configuration's {configured}")
    return k


def served_steps(configured: Mapping[str, object] | Mapping[int, object] | str | None,
                 log: Callable[[str], None] | None = None) -> dict[int, int]:
    """The draft_len_schedule a served model runs: SCHEDULE_ENV's where the server was started with it (said to
    `log`, so the server log shows which schedule ran), else its own configuration's (a repository parameter's
    JSON text or model.yaml's mapping); {} for none."""
    override = os.environ.get(SCHEDULE_ENV)
    raw = override or configured
    if not raw:
        return {}
    steps = parse_steps(raw)
    if override and log is not None:
        log(f"draft_len_schedule {json.dumps(steps)} from {SCHEDULE_ENV}, not the configuration's")
    return steps


def served_lookup(configured: Lookup) -> Lookup:
    """The lookup a served model reads its schedule with: `configured` (its line's, which deploy wrote the
    repository's schedule for) unless SCHEDULE_ENV overrides the schedule, which is always in the spec's "from"
    form. Read as a 1.3 LLM-API line reads its own, '{"1": 4, "2": 2}' would turn speculation off above 2 sequences
    (measured: a served EAGLE-3 probe decoded plainly at 8 and 16 clients with it)."""
    return "from" if os.environ.get(SCHEDULE_ENV) else configured


def parse_steps(raw: Mapping[str, object] | Mapping[int, object] | str) -> dict[int, int]:
    """A draft_len_schedule from JSON text or a mapping, keys and lengths as ints; ValueError when it is not one."""
    try:
        data = json.loads(raw) if isinstance(raw, str) else raw
        if not isinstance(data, Mapping):
            raise TypeError
        return {int(size): int(length) for size, length in data.items()}
    except (ValueError, TypeError):
        raise ValueError(f"draft_len_schedule must map batch sizes to draft lengths, not {raw!r}") from None


def fixed_length(full_draft_len: int, length: int, max_batch: int) -> dict[int, int]:
    """A schedule that drafts `length` at every batch size from 2 to `max_batch` (the full length at 1, as every
    TensorRT-LLM line requires), read alike by the "from" and the "up_to" lookup."""
    return {1: full_draft_len, 2: length, max(2, max_batch): length}


def lookup_for_line(line: str | None) -> Lookup:
    """The draft_len_schedule lookup of a TensorRT-LLM line ("1.2", "1.3", "main", ...; None: 1.2, the line
    specbuild's LLM-API contract follows). Every later line is given main's rule: the index read showed main's
    and the 1.2 line's, not the release where it changed."""
    return "from" if line in (None, "", "1.2") or str(line).startswith("1.2.") else "up_to"


def schedule_problems(schedule: Mapping[int, int], full_draft_len: int, lookup: Lookup = "from") -> list[str]:
    """What is wrong with a schedule whose full draft length (batch size 1: K, or the Medusa tree's node count)
    is `full_draft_len`; TensorRT-LLM's LLM API calls that length max_draft_len."""
    problems = []
    if lookup == "up_to":
        sizes = [size for size in schedule if type(size) is int]
        if sizes and schedule[min(sizes)] != full_draft_len:
            problems.append(f"the smallest batch size {min(sizes)} must draft the full length {full_draft_len} "
                            f"(draft_len_schedule[{min(sizes)}] must equal max_draft_len), not "
                            f"{schedule[min(sizes)]}")
    elif 1 not in schedule:
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
    """Draft length by number of active sequences (`steps`, looked up per `lookup`); `max_concurrency`: none above
    it; `acceptance_window` / `acceptance_threshold`: the switch-off rule (`SpeculationGate`)."""

    steps: dict[int, int] = field(default_factory=dict)
    full_draft_len: int = 0
    """The draft length at batch size 1 (K, or the Medusa tree's node count)."""
    max_concurrency: int | None = None
    lookup: Lookup = "from"
    acceptance_window: int | None = None
    acceptance_threshold: float | None = None

    def __post_init__(self) -> None:
        if self.steps:
            problems = schedule_problems(self.steps, self.full_draft_len, self.lookup)
            if problems:
                raise ValueError("draft_len_schedule " + "; ".join(problems))
            if self.lookup == "up_to" and self.max_concurrency is not None:
                raise ValueError("max_concurrency and draft_len_schedule are mutually exclusive. Use "
                                 "max_concurrency for a simple speculation cutoff, or draft_len_schedule for "
                                 "dynamic draft-length control.")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be a positive integer (got {self.max_concurrency})")
        if self.acceptance_window is not None and self.acceptance_window < 0:
            raise ValueError(f"acceptance_window must be >= 0 (got {self.acceptance_window})")
        if self.acceptance_threshold is not None and self.acceptance_threshold < 0:
            raise ValueError(f"acceptance_length_threshold must be >= 0 (got {self.acceptance_threshold})")

    def draft_len(self, active: int) -> int:
        """The draft length for `active` sequences."""
        if self.max_concurrency is not None and active > self.max_concurrency:
            return 0
        if not self.steps:
            return self.full_draft_len
        sizes = sorted(self.steps)
        if self.lookup == "up_to":
            index = bisect_left(sizes, active)
            return self.steps[sizes[index]] if index < len(sizes) else 0
        return self.steps[sizes[max(0, bisect_right(sizes, max(1, active)) - 1)]]

    def gate(self) -> SpeculationGate | None:
        """A fresh switch-off gate for one engine (None: the rule is off)."""
        if not self.acceptance_window or self.acceptance_threshold is None:
            return None
        return SpeculationGate(self.acceptance_window, self.acceptance_threshold)


def bls_schedule(params: Mapping[str, str], full_draft_len: int,
                 log: Callable[[str], None] | None = None) -> DraftSchedule | None:
    """The load-aware schedule of a draft-target BLS, from its repository parameters: draft_len_schedule
    (`served_steps`: SCHEDULE_ENV's where set) and max_concurrency; None when it has neither."""
    steps = served_steps(params.get("draft_len_schedule"), log)
    limit = params.get("max_concurrency")
    if not steps and not limit:
        return None
    return DraftSchedule(steps, full_draft_len, int(limit) if limit else None)


def scheduled_draft_len(k: int, schedule: DraftSchedule | None, active: int) -> int:
    """A request's K cut by the schedule for `active` requests in flight: what the BLS drafts in a round."""
    return k if schedule is None else min(k, schedule.draft_len(active))


class SpeculationGate:
    """TensorRT-LLM's rolling acceptance gate: each completed request records its acceptance length (its
    decoded tokens per iteration - 1, at least 0); from the `window`-th completion on, a mean over the last
    `window` below `threshold` disables speculation permanently."""

    def __init__(self, window: int, threshold: float) -> None:
        self.window, self.threshold = window, threshold
        self.history: deque[float] = deque()
        self.completed = 0
        self.disabled = False

    def record(self, tokens: int, iterations: int) -> bool:
        """A request finished with `tokens` decoded over `iterations` target iterations; returns whether this
        completion switched speculation off."""
        if self.disabled or self.window <= 0:
            return False
        self.history.append(max(0.0, tokens / iterations - 1.0) if iterations else 0.0)
        if len(self.history) > self.window:
            self.history.popleft()
        self.completed += 1
        if self.completed >= self.window and sum(self.history) / len(self.history) < self.threshold:
            self.disabled = True
            return True
        return False
