"""What an export is before it is written: the engine's command line, its config files, and what was left out.

Each engine module declares its options as a table of `Option` rows (flag, upstream source, value read off the
spec); `command_line` turns the rows into argv, so the flags written and the flags a test checks come from one
list. A value of None leaves the flag out, True writes a bare switch.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specbuild.errors import SpecbuildError
from specbuild.export.sources import Source
from specbuild.spec.schema import NGramSpec

if TYPE_CHECKING:
    from specbuild.spec import PipelineSpec

ENGINES = ("vllm", "sglang")


MEDUSA_INSTEAD = ("train an EAGLE-3 draft for target.model (`specbuild eagle train TARGET_DIR DRAFT_DIR`) and export "
                  "speculative.mode: eagle3 with draft.model: DRAFT_DIR; or serve the Medusa heads with TensorRT-LLM "
                  "1.2's engine flow (`specbuild convert`, `build`, `deploy` SPEC)")
"""What to do instead of a Medusa export: neither vLLM 0.33 nor SGLang has Medusa."""


class ExportRefused(SpecbuildError):
    """The spec asks for something the engine cannot run; the message says what and why."""


@dataclass(frozen=True)
class Option:
    """One command-line option: its spelling, where that spelling is defined, and its value for a spec."""

    flag: str
    source: Source
    value: Callable[[PipelineSpec], Any]


@dataclass
class ExportPlan:
    """Everything `write_export` writes for one engine."""

    engine: str
    argv: list[str]
    files: dict[str, str]
    """Text files by name (relative to the export directory)."""
    sources: list[Source]
    notes: list[str] = field(default_factory=list)
    """Spec settings the engine has no counterpart for (said, not silently dropped)."""

    def command(self) -> str:
        """The command as one shell line."""
        return shlex.join(self.argv)


def command_line(prefix: Sequence[str], options: Sequence[Option], spec: PipelineSpec) -> list[str]:
    argv = list(prefix)
    for option in options:
        value = option.value(spec)
        if value is None or value is False:
            continue
        argv += [option.flag] if value is True else [option.flag, str(value)]
    return argv


def refuse(spec: PipelineSpec, engine: str, what: str, why: str, *, hint: str | None = None) -> ExportRefused:
    return ExportRefused(f"{spec.where}: {what}: {engine} cannot serve this ({why})", hint=hint)


def longest_ngram(spec: PipelineSpec) -> int:
    """The longest suffix an n-gram proposer looks up: speculative.ngram.max_matching_ngram_size (its default
    when the section is left out)."""
    ngram = spec.speculative.ngram
    return (ngram if ngram is not None else NGramSpec()).max_matching_ngram_size


def ngram_notes(spec: PipelineSpec, proposer: str) -> list[str]:
    """The speculative.ngram settings beyond the longest n-gram, which neither engine's proposer has."""
    ngram = spec.speculative.ngram
    given = sorted(ngram.model_fields_set - {"max_matching_ngram_size"}) if ngram is not None else []
    return [f"speculative.ngram {', '.join(given)}: not exported; {proposer} has no such setting"] if given else []


def batch_schedule(spec: PipelineSpec) -> list[tuple[int, int, int]] | None:
    """The spec's load-aware draft lengths (draft_len_schedule and max_concurrency) as inclusive batch-size ranges
    `(first, last, K)` covering 1..build.max_batch_size, equal neighbours merged; None when the spec has neither.
    The lengths are `runtime.schedule.DraftSchedule`'s, the one rule the served models and the BLS run (each key from
    that many active sequences on, none above max_concurrency), so an engine given these ranges drafts what
    TensorRT-LLM would at every load."""
    speculative = spec.speculative
    if speculative.draft_len_schedule is None and speculative.max_concurrency is None:
        return None
    from specbuild.runtime.schedule import DraftSchedule

    rule = DraftSchedule(dict(speculative.draft_len_schedule or {}), speculative.num_draft_tokens,
                         speculative.max_concurrency)
    ranges: list[tuple[int, int, int]] = []
    for batch in range(1, spec.build.max_batch_size + 1):
        length = rule.draft_len(batch)
        if ranges and ranges[-1][2] == length:
            ranges[-1] = (ranges[-1][0], batch, length)
        else:
            ranges.append((batch, batch, length))
    return ranges


def load_notes(spec: PipelineSpec, engine: str, *, by_load: bool = False) -> list[str]:
    """The load-dependent speculation settings the engine has no counterpart for: draft_len_schedule and
    max_concurrency unless `by_load` (the engine was given them as draft lengths by batch size), and always the
    BLS's plain_round_tokens."""
    notes = []
    if not by_load and spec.speculative.draft_len_schedule is not None:
        notes.append(f"speculative.draft_len_schedule: not exported; {engine} speculates the same length at any load")
    if not by_load and spec.speculative.max_concurrency is not None:
        notes.append(f"speculative.max_concurrency: not exported; {engine} has no load above which it stops "
                     "speculating")
    if spec.speculative.plain_round_tokens is not None:
        notes.append(f"speculative.plain_round_tokens: not exported; the BLS's rounds without speculation have no "
                     f"counterpart in {engine}, which streams every token")
    return notes


def default_directory(spec: PipelineSpec, engine: str) -> Path:
    """Where an export goes unless the user names a directory: `<output_dir>/export/<engine>`."""
    return spec.output_dir / "export" / engine
