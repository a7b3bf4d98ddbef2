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

if TYPE_CHECKING:
    from specbuild.export.medusa_heads import VllmMedusaHeads
    from specbuild.spec import PipelineSpec

ENGINES = ("vllm", "sglang")


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
    medusa: VllmMedusaHeads | None = None
    """Medusa heads converted to vLLM's format, written under MEDUSA_DIR."""

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


def default_directory(spec: PipelineSpec, engine: str) -> Path:
    """Where an export goes unless the user names a directory: `<output_dir>/export/<engine>`."""
    return spec.output_dir / "export" / engine
