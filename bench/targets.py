"""A benchmark's targets, judged one way by every bench script: a missed target makes the script exit 1 (after its
figures are written), and its one-line verdict is left where `bench/run_all.py` (`make bench`) collects it.

A script that printed FAIL and exited 0 let `make bench` and CI report success on a missed target; a verdict file
per script lets the run name every miss at the end, also after a later script crashed.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

VERDICTS = Path(__file__).resolve().parent / "work" / "verdicts"
"""One `<script>.txt` per bench script, its verdict line; gitignored with the rest of bench/work/."""


@dataclass(frozen=True)
class Target:
    """One target a benchmark checks: `met` True or False, or None for a figure shown for information only."""

    name: str
    met: bool | None
    measured: str = ""


def missed(targets: Iterable[Target]) -> list[Target]:
    """The targets not met, in order; informational ones (met None) are never missed."""
    return [t for t in targets if t.met is False]


def exit_status(targets: Iterable[Target]) -> int:
    """1 when any target is missed, else 0."""
    return 1 if missed(targets) else 0


def verdict(script: str, targets: Sequence[Target]) -> str:
    """One line: every judged target met, or which were missed (with the measured figure where there is one)."""
    judged = [t for t in targets if t.met is not None]
    misses = missed(targets)
    if not misses:
        return f"{script}: all {len(judged)} targets met"
    names = "; ".join(f"{t.name} ({t.measured})" if t.measured else t.name for t in misses)
    return f"{script}: missed {len(misses)} of {len(judged)} targets: {names}"


def says_missed(line: str) -> bool:
    """Whether a verdict line (as `verdict` writes it) reports a missed target."""
    return ": missed " in line


def verdict_file(script: str, verdicts: Path = VERDICTS) -> Path:
    return verdicts / f"{script}.txt"


def finish(script: str, targets: Sequence[Target], verdicts: Path = VERDICTS) -> int:
    """Print and store `script`'s verdict; the exit status for `sys.exit` (1 when a target was missed)."""
    line = verdict(script, targets)
    path = verdict_file(script, verdicts)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(line + "\n", encoding="utf-8")
    print(line, flush=True)
    return exit_status(targets)
