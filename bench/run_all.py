"""`make bench`: every bench script in turn, then the tune dry-run tables, without stopping at a failure; ends
with one line per script saying which targets it missed, and exits 1 if any script missed one or failed.

Each script writes its figures under bench/results/ and its verdict under bench/work/verdicts/ (`targets.finish`);
a script that ends without a verdict (it crashed) is reported as such, never as having met its targets.
Run with `.venv/bin/python bench/run_all.py [SCRIPT ...]` (default: all of SCRIPTS).
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from targets import VERDICTS, says_missed, verdict_file

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
SCRIPTS = ("convert_bench", "runtime_bench", "quantize_bench", "serving_bench")
"""Every bench/*_bench.py, in the order `make bench` runs them (runtime_bench builds the demo models the later
ones and the tune tables use)."""

TUNE_TABLES = {
    "tune-draft-target.txt": [["configs/demo.yaml", "--dry-run"]],
    "tune-medusa.txt": [["configs/demo-medusa.yaml", "--dry-run", "--nodes", str(n)] for n in (8, 24, 63)],
    "tune-lookahead.txt": [["configs/demo-lookahead.yaml", "--dry-run"]],
    # serving_bench converts these two specs before the tables; the self-draft's adapter fixes L, so K is tuned
    "tune-self-draft.txt": [["configs/demo-self-draft.yaml", "--dry-run"]],
    "tune-eagle3.txt": [["configs/demo-eagle3.yaml", "--dry-run"]],
}
"""bench/results/ files holding `specbuild tune ... --dry-run` tables (no targets: figures to compare by eye)."""


@dataclass(frozen=True)
class Outcome:
    """How one script ended: its exit status and the verdict line it left (None: it left none)."""

    script: str
    status: int
    verdict: str | None

    def line(self) -> str:
        if self.verdict is None:
            return f"{self.script}: exited {self.status} before judging its targets (see its output above)"
        expected = 1 if says_missed(self.verdict) else 0
        return self.verdict if self.status == expected else f"{self.verdict} (but exited {self.status})"


def summary(outcomes: list[Outcome]) -> tuple[list[str], int]:
    """The closing lines, one per script, and the exit status of the whole run (1 if any script exited non-zero
    or left no verdict)."""
    failed = any(o.status != 0 or o.verdict is None for o in outcomes)
    return [o.line() for o in outcomes], 1 if failed else 0


def run_script(script: str, bench: Path = BENCH, verdicts: Path = VERDICTS) -> Outcome:
    """Run `bench/<script>.py` to its end (its output goes to the terminal) and collect its verdict."""
    path = verdict_file(script, verdicts)
    path.unlink(missing_ok=True)  # a verdict left by an earlier run must not stand for this one
    status = subprocess.run([sys.executable, str(bench / f"{script}.py")], cwd=ROOT).returncode
    return Outcome(script, status, path.read_text(encoding="utf-8").strip() if path.is_file() else None)


def write_tune_tables() -> list[str]:
    """The tune dry-run tables; the lines naming any that failed."""
    specbuild = Path(sys.executable).parent / "specbuild"
    env = {**os.environ, "COLUMNS": "120"}
    problems = []
    (BENCH / "results").mkdir(parents=True, exist_ok=True)
    for name, runs in TUNE_TABLES.items():
        with (BENCH / "results" / name).open("w", encoding="utf-8") as out:
            for args in runs:
                status = subprocess.run([str(specbuild), "tune", *args], cwd=ROOT, env=env, stdout=out).returncode
                if status:
                    problems.append(f"{name}: `specbuild tune {' '.join(args)}` exited {status}")
                    break
    return problems


def main(argv: list[str] | None = None) -> int:
    scripts = argv if argv else list(SCRIPTS)
    outcomes = [run_script(script) for script in scripts]
    tune_problems = write_tune_tables() if not argv else []
    lines, status = summary(outcomes)
    print("--- bench targets:")
    for line in lines + tune_problems:
        print(line)
    return 1 if status or tune_problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
