"""`specbuild tune` on a self-draft spec (draft.source: target_layers): the layer count L, then K at that L.

The choice of L is checked against the report's own measurements (each L's acceptance rate and cost ratio, put
through the expected-speedup formula here), never against figures only the demo weights give.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from specbuild.cli import app
from specbuild.runtime.speculative import expected_speedup
from specbuild.spec import load_spec
from specbuild.tune.stage import TuneOptions, run_tune

QUIET = Console(quiet=True)

SELF_DRAFT_SPEC = """\
# A self-draft pipeline; tune rewrites L and K only.
name: tune-self-draft
output_dir: {out}

target:
  model: {target}

draft:
  source: target_layers
  layers: 2            # L: keep this comment
{adapter}
speculative:
  mode: draft_target
  num_draft_tokens: 3  # K

build:
  backend: reference
  dtype: float32
  max_batch_size: 4
  max_input_len: 256
  max_output_len: 64
"""


def _spec(directory: Path, target: Path | str, adapter: str = "") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "pipeline.yaml"
    path.write_text(SELF_DRAFT_SPEC.format(out=directory / "build", target=target, adapter=adapter))
    return path


def test_an_adapter_fixes_l(tmp_path: Path) -> None:
    """An adapter is trained after layer L: asking for other L's is refused before any model is loaded."""
    path = _spec(tmp_path, tmp_path / "target", adapter=f"  adapter: {tmp_path / 'adapter'}\n")
    result = CliRunner().invoke(app, ["tune", str(path), "--layers", "1", "--layers", "3"])
    output = " ".join(result.output.split())
    assert result.exit_code == 1 and "so tune keeps draft.layers 2" in output and "remove draft.adapter" in output


@pytest.fixture(scope="module")
def self_draft_spec(tmp_path_factory: pytest.TempPathFactory, demo_models: dict[str, Path]) -> Path:
    """The self-draft spec on the demo target, its target converted as `specbuild convert` would (tune makes
    each L's draft from it)."""
    from specbuild.convert.pipeline import convert_checkpoint, requests_from_spec

    path = _spec(tmp_path_factory.mktemp("tune-self-draft"), demo_models["target"])
    for request in requests_from_spec(load_spec(path)):
        if request.name == "target":
            convert_checkpoint(request, console=QUIET)
    return path


def test_tune_picks_l_by_the_formula_then_k_at_it(self_draft_spec: Path, tmp_path: Path) -> None:
    out = tmp_path / "tuned.yaml"
    options = TuneOptions(prompts=2, new_tokens=24, max_k=4, repeats=1, schedule=False, layers=(1, 3, 5),
                          output=out)
    report = run_tune(self_draft_spec, options, console=QUIET, out=QUIET)
    t, k = report.layers, report.draft_length
    assert t is not None and k is not None and sorted(t.rows) == [1, 3, 5] and t.k == 4
    best = {layers: max(expected_speedup(row.alpha, kk, row.costs.cost_ratio, row.costs.verify_cost(kk))
                        for kk in range(1, 5)) for layers, row in t.rows.items()}
    assert t.chosen == max(best, key=best.__getitem__)
    assert all(row.acceptance.rounds > 0 and row.costs.cost_ratio > 0 for row in t.rows.values())
    assert t.drafts[t.chosen].config.num_layers == t.chosen  # K was searched with that draft
    assert k.ks == [1, 2, 3, 4]
    tuned = load_spec(out)
    assert tuned.draft is not None and tuned.draft.layers == t.chosen
    assert tuned.speculative.num_draft_tokens == k.chosen
    changed = [(a, b) for a, b in zip(self_draft_spec.read_text().splitlines(), out.read_text().splitlines(),
                                      strict=True) if a != b]
    assert {a.split(":")[0] for a, _ in changed} <= {"  layers", "  num_draft_tokens"}
    assert f"  layers: {t.chosen}            # L: keep this comment" in out.read_text()


def test_dry_run_writes_nothing_and_an_impossible_l_is_refused(self_draft_spec: Path) -> None:
    text = self_draft_spec.read_text()
    args = ["tune", str(self_draft_spec), "--dry-run", "--prompts", "2", "--new-tokens", "16", "--max-k", "2",
            "--no-schedule", "--layers", "1", "--layers", "2"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "Self-draft layers L" in result.output and "Draft length K" in result.output
    assert self_draft_spec.read_text() == text
    refused = CliRunner().invoke(app, ["tune", str(self_draft_spec), "--layers", "8", "--no-schedule"])
    output = " ".join(refused.output.split())
    assert refused.exit_code == 1 and "--layers 8: a self-draft keeps 1 to 7 of the target's 8 layers" in output
    assert self_draft_spec.read_text() == text


def test_tune_times_l_k_and_the_schedule_on_the_engine_the_server_runs(
        self_draft_spec: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engines_built: list[Any]
) -> None:
    """The server self-drafts inside the target's serving engine and KV cache (the tensorrt_llm model builds
    `self_draft_proposer`): every L, K and schedule cell tune times runs there, as a proposer whose draft layers
    are the target's own objects, at each batch size of the schedule, and never in the two-engine draft-target
    loop (the BLS's costs: a second cache to prefill, a draft engine of its own)."""
    from specbuild.runtime.proposers import ModelProposer
    from specbuild.tune.schedule import batch_sizes

    def two_engines(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("tune timed the two-engine draft-target loop, which does not serve a self-draft")

    monkeypatch.setattr("specbuild.tune.measure.generate_draft_target", two_engines)
    options = TuneOptions(prompts=2, new_tokens=12, max_k=2, repeats=1, layers=(1, 2), output=tmp_path / "t.yaml")
    report = run_tune(self_draft_spec, options, console=QUIET, out=QUIET)
    assert report.layers is not None and report.schedule is not None
    drafting = [engine for engine in engines_built if engine.proposer is not None]
    assert drafting and all(isinstance(engine.proposer, ModelProposer) and engine.proposer.shared
                            for engine in drafting)
    for engine in drafting:
        draft = engine.proposer.draft  # type: ignore[union-attr]
        assert all(mine is theirs for mine, theirs in zip(draft.layers, engine.model.layers, strict=False))
    assert {len(engine.proposer.draft.layers) for engine in drafting} == {1, 2}  # type: ignore[union-attr]
    assert {engine.proposer.max_draft_len for engine in drafting} == {1, 2}  # type: ignore[union-attr]
    assert {engine.max_batch for engine in drafting} == set(batch_sizes(4))
