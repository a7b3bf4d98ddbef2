"""`specbuild tune` on an EAGLE-3 spec (build.flow: pytorch, build.backend: reference): K by the draft-target search.

The draft is the demo extra "eagle3-draft" (trained on the demo target); the expectations are derived from the
run's own measurements, never from figures only these weights give.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from specbuild.cli import app
from specbuild.runtime.speculative import expected_speedup
from specbuild.spec import load_spec
from specbuild.tune.measure import Acceptance
from specbuild.tune.stage import TuneOptions, run_tune

QUIET = Console(quiet=True)

EAGLE3_SPEC = """\
# EAGLE-3 on the PyTorch flow, served by specbuild's reference backend; tune rewrites K only.
name: tune-eagle3
output_dir: {out}

target:
  model: {target}

draft:
  model: {draft}

speculative:
  mode: eagle3
  num_draft_tokens: 4   # K: keep this comment

build:
  flow: pytorch
  backend: reference
  dtype: float32
  max_batch_size: 2
  max_input_len: 256
  max_output_len: 64
"""


@pytest.fixture(scope="module")
def eagle3_spec(tmp_path_factory: pytest.TempPathFactory, demo_models: dict[str, Path],
                demo_extra: Callable[[str], Path]) -> Path:
    """The spec on the demo target and its EAGLE-3 draft; the target converted as `specbuild convert` does for
    the reference backend."""
    from specbuild.convert.run import convert_spec

    root = tmp_path_factory.mktemp("tune-eagle3")
    path = root / "pipeline.yaml"
    path.write_text(EAGLE3_SPEC.format(out=root / "build", target=demo_models["target"],
                                       draft=demo_extra("eagle3-draft")))
    convert_spec(path, console=QUIET)
    return path


def test_tune_picks_k_for_eagle3_by_the_formula(eagle3_spec: Path, tmp_path: Path) -> None:
    """K is the expected-speedup formula's best for the measured alpha and costs; the sweep's counts are EAGLE-3
    decoding's own (the batch loop's, which the served engine's equal); the written spec holds that K and only it
    changed."""
    from specbuild.runtime.eagle3 import Eagle3Draft
    from specbuild.runtime.eagle3_decoding import Eagle3Config, generate_eagle3
    from specbuild.runtime.model import CausalLM
    from specbuild.runtime.sequence import StopCriteria

    out = tmp_path / "tuned.yaml"
    options = TuneOptions(prompts=2, new_tokens=16, max_k=3, repeats=1, schedule=False, output=out)
    report = run_tune(eagle3_spec, options, console=QUIET, out=QUIET)
    t = report.draft_length
    assert t is not None and t.ks == [1, 2, 3]
    formula = {k: expected_speedup(t.alpha, k, t.costs.cost_ratio, t.costs.verify_cost(k)) for k in t.ks}
    assert t.chosen == max(formula, key=formula.__getitem__)
    spec = load_spec(eagle3_spec)
    target = CausalLM.from_checkpoint(spec.checkpoint_dir("target"))
    assert spec.draft is not None and spec.draft.model is not None
    draft = Eagle3Draft.from_directory(spec.draft.model, target)
    expected = Acceptance()
    for prompt in report.prompts:
        expected.add(generate_eagle3(target, draft, [prompt], Eagle3Config(3), stop=StopCriteria(16)).stats)
    assert t.sweep.acceptance[3].accepted_by_position == expected.accepted_by_position
    assert t.sweep.acceptance[3].rounds == expected.rounds > 0
    assert load_spec(out).speculative.num_draft_tokens == t.chosen
    changed = [(a, b) for a, b in zip(eagle3_spec.read_text().splitlines(), out.read_text().splitlines(),
                                      strict=True) if a != b]
    assert changed in ([], [("  num_draft_tokens: 4   # K: keep this comment",
                             f"  num_draft_tokens: {t.chosen}   # K: keep this comment")])


def test_dry_run_writes_nothing(eagle3_spec: Path) -> None:
    text = eagle3_spec.read_text()
    args = ["tune", str(eagle3_spec), "--dry-run", "--prompts", "2", "--new-tokens", "12", "--max-k", "2",
            "--no-schedule"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "Draft length K" in result.output and eagle3_spec.read_text() == text


def test_tune_times_k_and_the_schedule_on_the_engine_the_server_runs(
        eagle3_spec: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engines_built: list[Any]
) -> None:
    """The llmapi model serves EAGLE-3 as a proposer in the target's serving engine (`llmapi_model.proposer`):
    every K and schedule cell tune times runs there, at each batch size of the schedule, with that proposer
    built the way the served model builds it (same class, same draft head, same K), never in the batch round
    loop `generate_eagle3`."""
    from specbuild.python_models.llmapi_model import proposer as served_proposer
    from specbuild.tune.schedule import batch_sizes

    def round_loop(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("tune timed generate_eagle3's round loop, which the server does not run")

    monkeypatch.setattr("specbuild.runtime.eagle3_decoding.generate_eagle3", round_loop)
    options = TuneOptions(prompts=2, new_tokens=12, max_k=2, repeats=1, output=tmp_path / "t.yaml")
    report = run_tune(eagle3_spec, options, console=QUIET, out=QUIET)
    assert report.draft_length is not None and report.schedule is not None
    drafting = [engine for engine in engines_built if engine.proposer is not None]
    assert {engine.proposer.max_draft_len for engine in drafting} == {1, 2}  # type: ignore[union-attr]
    assert {engine.max_batch for engine in drafting} == set(batch_sizes(2))
    for engine in drafting:
        ours = engine.proposer
        assert ours is not None
        served = served_proposer({"decoding_type": "Eagle3", "max_draft_len": ours.max_draft_len},
                                 lambda: None, lambda ours=ours: ours.draft)  # type: ignore[attr-defined]
        assert type(ours) is type(served)
        assert all(getattr(ours, name) == getattr(served, name) for name in ("max_draft_len", "block_tokens"))
