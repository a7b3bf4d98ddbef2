"""The demo specs use exactly what `specbuild tune` wrote: configs/demo.yaml's, demo-self-draft.yaml's,
demo-eagle3.yaml's and demo-pytorch.yaml's (on its reference copy) K and schedule, configs/demo-medusa.yaml's and
demo-medusa2.yaml's trees and schedules (the schedules measured behind tritonserver, `tune --served`) and
demo-lookahead.yaml's (W, N, G) are the settings of the
bench/results/tune-*.json each cites, which
`make bench` (bench/run_all.py) wrote on the machine that measured them, beside the tables it printed.

Only files are compared (the spec, the report, the tables, all written on one machine), never figures: other
weights or another CPU tune other values, which `make bench` then writes into the specs beside the new reports.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest

from specbuild.spec import load_spec
from specbuild.tune.report import read_report, spec_differences
from tests.bench_scripts import bench_module

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"


@pytest.fixture(scope="module")
def run_all() -> ModuleType:
    """bench/run_all.py imported as `make bench` runs it (bench/ first on sys.path)."""
    return bench_module("run_all")


@pytest.mark.parametrize(("spec", "report", "settings"), [
    ("configs/demo.yaml", "tune-draft-target.json", {"num_draft_tokens", "draft_len_schedule"}),
    ("configs/demo-medusa.yaml", "tune-medusa.json", {"medusa_choices", "draft_len_schedule"}),
    ("configs/demo-medusa2.yaml", "tune-medusa2.json", {"medusa_choices", "draft_len_schedule"}),
    ("configs/demo-lookahead.yaml", "tune-lookahead.json", {"lookahead", "draft_len_schedule"}),
    ("configs/demo-self-draft.yaml", "tune-self-draft.json", {"num_draft_tokens", "draft_len_schedule"}),
    ("configs/demo-eagle3.yaml", "tune-eagle3.json", {"num_draft_tokens", "draft_len_schedule"}),
    ("configs/demo-pytorch.yaml", "tune-pytorch.json", {"num_draft_tokens", "draft_len_schedule"}),
])
def test_the_demo_spec_cites_and_holds_what_tune_wrote(run_all: ModuleType, spec: str, report: str,
                                                       settings: set[str]) -> None:
    text = (REPO / spec).read_text(encoding="utf-8")
    assert f"bench/results/{report}" in text, f"{spec} does not cite the tune report its settings come from"
    assert run_all.TUNE_TABLES[report.removesuffix(".json")][0] == spec  # make bench writes that report
    data = read_report(RESULTS / report)
    assert data["spec"] == spec and set(data["settings"]) == settings
    assert spec_differences(load_spec(REPO / spec), data["settings"]) == []


def test_every_spec_citing_a_tune_report_holds_it(run_all: ModuleType) -> None:
    """The check `make bench` ends with, on the committed files."""
    assert run_all.tuned_spec_problems() == []


@pytest.mark.parametrize("name", ["tune-draft-target", "tune-medusa", "tune-medusa2", "tune-self-draft",
                                  "tune-eagle3", "tune-pytorch"])
def test_the_tables_show_the_schedule_and_the_choices_the_report_holds(run_all: ModuleType, name: str) -> None:
    """The tables and the report come from one make-bench run: the schedule the report chose is the one the served
    tune's table shows (with the tokens/s it was chosen by, behind the server), and the tables end each tune with
    its choices."""
    data = json.loads((RESULTS / f"{name}.json").read_text(encoding="utf-8"))
    tables = (RESULTS / f"{name}.txt").read_text(encoding="utf-8")
    assert len(data["runs"]) == len(run_all.TUNE_TABLES[name][1]) == tables.count("tune chose: ")
    schedule = {int(k): v for k, v in data["settings"]["draft_len_schedule"].items()}
    assert "Load-aware speculation: tokens/s" in tables
    (served,) = [run for run in data["runs"] if run["search"].get("served")]
    kept = served["schedule"].get("spec_schedule_kept")  # the spec's own schedule, said so (reports before it: absent)
    said = ", the spec's own" if kept else ":"
    assert f"draft_len_schedule {schedule}{said}" in tables
    section = tables.split("Load-aware speculation: tokens/s", 1)[1].split("draft_len_schedule {", 1)[0]
    shown = [[cell.strip() for cell in line.strip("│").split("│")] for line in section.splitlines()
             if line.startswith("│")]
    assert served["schedule"]["measured"] == "behind tritonserver (tune --served)"
    measured = served["schedule"]["tokens_per_second_by_batch"]
    assert [(int(cells[0]), int(cells[-1])) for cells in shown] == [(row["batch"], row["best"]) for row in measured]
    for cells, row in zip(shown, measured, strict=True):  # the table's whole tokens/s, the report's to 0.1
        rates = list(row["tokens_per_second"].values())  # "–": a length not measured at that batch size
        assert all(abs(float(c) - r) <= 0.55 for c, r in zip([c for c in cells[1:-1] if c != "–"], rates, strict=True))
    if "num_draft_tokens" in data["settings"]:  # the own tune's choice, or the served tune's (the BLS's K) with
        k = data["settings"]["num_draft_tokens"]  # its schedule on the same line
        chose = f"tune chose: speculative.num_draft_tokens {k}"
        assert f"{chose}\n" in tables or (served["settings"].get("num_draft_tokens") == k and f"{chose};" in tables)


def test_a_spec_tensorrt_llm_serves_is_tuned_on_its_reference_copy(run_all: ModuleType) -> None:
    """configs/demo-pytorch.yaml is served by TensorRT-LLM's LLM API (a GPU host), which tune cannot measure here
    (`specbuild tune` refuses it and says to tune a build.backend: reference copy): make bench tunes the copy that
    bench/serving_bench.py serves, and the report is the spec's own, naming the copy it measured."""
    data = read_report(RESULTS / "tune-pytorch.json")
    assert "configs/demo-pytorch.yaml" in run_all.TUNED_ON_REFERENCE and data["spec"] == "configs/demo-pytorch.yaml"
    copy = data["tuned_copy"]
    assert copy.startswith("demo/specs/") and copy.endswith("-reference.yaml"), copy


def _cited_spec(root: Path, report: str, edit: tuple[str, str] | None = None) -> Path:
    """configs/demo.yaml copied under `root`, citing bench/results/`report`, one line edited."""
    text = (REPO / "configs" / "demo.yaml").read_text(encoding="utf-8")
    text = text.replace("bench/results/tune-draft-target.json", f"bench/results/{report}")
    if edit is not None:
        assert edit[0] in text
        text = text.replace(edit[0], edit[1])
    path = root / "configs" / "demo.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_a_spec_that_differs_from_the_report_it_cites_is_named(run_all: ModuleType, tmp_path: Path) -> None:
    """A hand edit (or a re-tune the spec did not follow) fails `make bench`'s check, naming the field, both
    values and the report; so does a citation of a report that does not exist or tuned another spec."""
    results = tmp_path / "bench" / "results"
    results.mkdir(parents=True)
    settings = read_report(RESULTS / "tune-draft-target.json")["settings"]
    k, schedule = settings["num_draft_tokens"], settings["draft_len_schedule"]
    flow = "{" + ", ".join(f"{size}: {length}" for size, length in schedule.items()) + "}"
    (results / "tune-draft-target.json").write_text((RESULTS / "tune-draft-target.json").read_text())
    _cited_spec(tmp_path, "tune-draft-target.json")
    assert run_all.tuned_spec_problems(tmp_path, results) == []
    edited = f"num_draft_tokens: {k + 1}\n  draft_len_schedule: {{1: {k + 1}}}"
    _cited_spec(tmp_path, "tune-draft-target.json", (f"num_draft_tokens: {k}\n  draft_len_schedule: {flow}", edited))
    assert run_all.tuned_spec_problems(tmp_path, results) == [
        f"configs/demo.yaml: speculative.num_draft_tokens is {k + 1}, tune chose {k} "
        "(bench/results/tune-draft-target.json)",
        f"configs/demo.yaml: speculative.draft_len_schedule is {{1: {k + 1}}}, tune chose {schedule} "
        "(bench/results/tune-draft-target.json)"]
    _cited_spec(tmp_path, "tune-draft-target.json", (f"draft_len_schedule: {flow}", "draft_len_schedule: {2: 0}"))
    assert run_all.tuned_spec_problems(tmp_path, results)[0].startswith("configs/demo.yaml does not load: ")
    _cited_spec(tmp_path, "tune-missing.json")
    assert run_all.tuned_spec_problems(tmp_path, results) == [
        "configs/demo.yaml cites bench/results/tune-missing.json, which does not exist"]
    (results / "tune-medusa.json").write_text((RESULTS / "tune-medusa.json").read_text())
    _cited_spec(tmp_path, "tune-medusa.json")
    assert run_all.tuned_spec_problems(tmp_path, results) == [
        "configs/demo.yaml cites bench/results/tune-medusa.json, a tune of configs/demo-medusa.yaml"]


def test_a_medusa_tree_or_schedule_other_than_the_reports_is_named() -> None:
    spec = load_spec(REPO / "configs" / "demo-medusa.yaml")
    assert spec.medusa is not None
    tree = spec.medusa.resolved_choices()
    settings = {"medusa_choices": [*tree[1:], tree[0]], "draft_len_schedule": {1: len(tree), 4: 0}}
    problems = spec_differences(spec, settings)
    assert len(problems) == 2 and problems[0].startswith(f"medusa.choices is a {len(tree)}-node tree, tune chose "
                                                         f"another, of {len(tree)} nodes")
    assert problems[1] == (f"speculative.draft_len_schedule is {spec.speculative.draft_len_schedule}, tune chose "
                           f"{settings['draft_len_schedule']}")


def test_make_bench_tunes_the_specs_before_it_serves_them(run_all: ModuleType) -> None:
    """`make bench` measures the demo specs as tune chose them on its machine: the tune step comes after the demo
    models are built and before every script that serves or times the specs' speculation."""
    steps = list(run_all.STEPS)
    tune = steps.index(run_all.TUNE)
    assert steps.index("runtime_bench") < tune
    assert all(tune < steps.index(script) for script in ("round_cost_bench", "medusa_cost_bench", "serving_bench"))


def test_tune_choices_are_written_into_the_spec_as_tune_writes_them(run_all: ModuleType, tmp_path: Path) -> None:
    """make bench writes a tune's choices into the demo spec with `specbuild tune`'s own writer: only the tuned
    values change (every comment stays), an inline Medusa tree stays inline, and the spec then holds exactly the
    settings the report records, which `make bench`'s closing check asks of it."""
    from specbuild.tune.stage import SpecUpdate

    source = REPO / "configs" / "demo-medusa.yaml"
    path = tmp_path / "configs" / "demo-medusa.yaml"
    path.parent.mkdir()
    path.write_text(source.read_text(encoding="utf-8"), encoding="utf-8")
    spec = load_spec(source)
    assert spec.medusa is not None and not isinstance(spec.medusa.choices, str)
    tree = spec.medusa.resolved_choices()
    chosen = sorted(tree, key=lambda path: (len(path), path))  # another order: every path after its prefix
    settings = {"medusa_choices": chosen, "draft_len_schedule": {1: len(tree), 3: 0}}
    assert spec_differences(spec, settings) != []

    class Report:  # the part of a TuneReport the writer reads
        update = SpecUpdate(choices=chosen, tree_source="a test", draft_len_schedule=settings["draft_len_schedule"])

    assert run_all.write_choices(path, Report()) == [path.absolute()]
    assert spec_differences(load_spec(path), settings) == []
    before, after = source.read_text(encoding="utf-8"), path.read_text(encoding="utf-8")
    comments = [line for line in before.splitlines() if line.lstrip().startswith("#")]
    assert comments and comments == [line for line in after.splitlines() if line.lstrip().startswith("#")]
    assert "choices: [[" in after and not (path.parent / "medusa_choices").exists()
