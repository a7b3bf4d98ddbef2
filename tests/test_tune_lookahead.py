"""`specbuild tune` on a Lookahead spec: the (W, N, G) grid, its limits, the choice and the spec it writes.

The choice is checked against the report's own measurements (tokens per step are exact under greedy decoding;
the per-forward costs are measured once in the run), never against figures only the demo weights give.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import yaml
from rich.console import Console
from typer.testing import CliRunner

from specbuild.cli import app
from specbuild.contracts import lookahead as la
from specbuild.errors import SpecbuildError
from specbuild.spec import load_spec
from specbuild.tune.lookahead import (
    PLAIN,
    LookaheadGrid,
    LookaheadRun,
    LookaheadTuning,
    grid_candidates,
    non_decreasing,
)
from specbuild.tune.stage import TuneOptions, run_tune

QUIET = Console(quiet=True)
GRID = {"windows": (2, 4), "ngrams": (2, 3), "verification_sets": (1, 4)}

LOOKAHEAD_SPEC = """\
# Lookahead pipeline; tune rewrites (W, N, G) only.
name: tune-lookahead
output_dir: {out}

target:
  model: {target}

speculative:
  mode: lookahead
  lookahead:
    window_size: 4             # W: keep this comment
    ngram_size: 3              # N
    verification_set_size: 4   # G
{extra}
build:
  backend: reference
  dtype: float32
  max_batch_size: 4
  max_input_len: 256
  max_output_len: 64
{build_extra}"""


def _spec(directory: Path, target: Path | str = "target", extra: str = "", build_extra: str = "") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "pipeline.yaml"
    path.write_text(LOOKAHEAD_SPEC.format(out=directory / "build", target=target, extra=extra,
                                          build_extra=build_extra))
    return path


# ------------------------------------------------------------------------------------------------ the grid


@pytest.mark.parametrize(("grid", "says"), [
    ({"windows": (1, 4)}, "--window 1: window_size must be at least 2"),
    ({"ngrams": (1,)}, "--ngram 1: ngram_size must be at least 2"),
    ({"verification_sets": (0, 2)}, "--verification-set 0: verification_set_size must be at least 1"),
    ({"windows": ()}, "--window needs at least one value"),
])
def test_an_invalid_grid_is_refused_with_the_rule(tmp_path: Path, grid: dict, says: str) -> None:
    spec = load_spec(_spec(tmp_path))
    with pytest.raises(SpecbuildError, match=says) as raised:
        grid_candidates(LookaheadGrid(**grid), spec)
    if "must be at least" in says:
        assert "smallest meaningful" in raised.value.message


def test_the_grid_keeps_only_what_the_engine_limits_hold(tmp_path: Path) -> None:
    """Every combination plus the spec's own (4, 3, 4); a spec that fixes max_draft_len keeps only the settings
    that give exactly it, and build.max_num_tokens leaves out those whose full-batch verification step is bigger."""
    candidates = grid_candidates(LookaheadGrid(**GRID), load_spec(_spec(tmp_path / "a")))
    assert len(candidates.configs) == 8 and la.LookaheadConfig(4, 3, 4) in candidates.configs  # in the grid
    assert not candidates.excluded
    fixed = load_spec(_spec(tmp_path / "b", extra="  max_draft_len: 15\n"))
    kept = grid_candidates(LookaheadGrid(**GRID), fixed).configs
    assert kept and all(la.max_draft_len(*c) == 15 for c in kept)
    budget = load_spec(_spec(tmp_path / "c", build_extra="  max_num_tokens: 40\n"))  # 4 x (draft + 1) <= 40
    limited = grid_candidates(LookaheadGrid(**GRID), budget)
    assert all(4 * (la.max_draft_len(*c) + 1) <= 40 for c in limited.configs)
    assert limited.excluded and all("build.max_num_tokens 40" in why for why in limited.excluded.values())
    with pytest.raises(SpecbuildError, match="no \\(W, N, G\\) of the lookahead grid fits"):
        grid_candidates(LookaheadGrid(windows=(7,), ngrams=(5,), verification_sets=(7,)), budget)


def test_block_costs_never_fall_with_more_tokens() -> None:
    """A burst of other work makes one size's timing too high; the cost model takes the least measured at that
    size or any larger one, so a bigger block is never cheaper than a smaller one."""
    assert non_decreasing({1: 3.0, 2: 2.5, 4: 4.0, 8: 3.9, 9: 5.0}) == {1: 2.5, 2: 2.5, 4: 3.9, 8: 3.9, 9: 5.0}


def _tuning(fed: dict[la.LookaheadConfig, dict[int, int]], alone: dict[int, float],
            loaded: dict[int, float]) -> LookaheadTuning:
    runs = {PLAIN: LookaheadRun(PLAIN, tokens=12, fed=Counter({1: 12}))}
    runs |= {c: LookaheadRun(c, tokens=12, fed=Counter(sizes)) for c, sizes in fed.items()}
    return LookaheadTuning(runs, alone, 32, next(iter(fed)), batch=16, loaded_seconds_at=loaded)


def test_under_load_the_choice_keeps_plain_speed_before_it_is_fastest_alone() -> None:
    """(W, N, G) is fixed per engine, so a setting that wins alone by feeding big blocks but loses to plain
    decoding with 16 sequences per forward is passed over for one that holds at 16; where none holds, the one
    losing least there is chosen."""
    big, small = la.LookaheadConfig(4, 3, 4), la.LookaheadConfig(2, 2, 1)
    fed = {big: {12: 4}, small: {3: 8}}  # 12 tokens in 4 steps of 12-token blocks, or in 8 steps of 3
    alone = {1: 1.0, 3: 1.0, 12: 1.2}  # alone a block costs about one token's forward: big is fastest
    holds = _tuning(fed, alone, {1: 1.0, 3: 1.2, 12: 6.0})  # at 16 rows big costs 6 plain steps, small 1.2
    assert holds.speedup(big) > holds.speedup(small) > 1.0
    assert holds.loaded_speedup(big) < 1.0 <= holds.loaded_speedup(small) and holds.chosen == small
    cheap = _tuning(fed, alone, {1: 1.0, 3: 1.0, 12: 1.5})  # a machine where big holds at 16 too
    assert cheap.chosen == big
    neither = _tuning(fed, alone, {1: 1.0, 3: 2.0, 12: 6.0})
    assert not any(neither.holds_under_load(c) for c in fed) and neither.chosen == small  # 0.75x beats 0.5x


# ------------------------------------------------------------------------------------------------ demo target


@pytest.fixture(scope="module")
def lookahead_spec(tmp_path_factory: pytest.TempPathFactory, demo_models: dict[str, Path]) -> Path:
    """The Lookahead spec on the demo target, its target checkpoint converted as `specbuild convert` would."""
    from specbuild.convert.pipeline import convert_checkpoint, requests_from_spec

    path = _spec(tmp_path_factory.mktemp("tune-lookahead"), demo_models["target"])
    for request in requests_from_spec(load_spec(path)):
        convert_checkpoint(request, console=QUIET)
    return path


def test_tune_picks_the_fastest_setting_that_holds_under_load_and_writes_it(lookahead_spec: Path,
                                                                           tmp_path: Path) -> None:
    """Recomputed from the report: each setting's tokens over the summed measured cost of its steps' blocks, alone
    and with the spec's max batch size of rows per forward; the chosen one is the fastest alone of those at least
    as fast as plain decoding at that batch (or, none being, the least slow there); the counts are those
    generate_lookahead reports; the new spec holds the choice, validates, and differs from the old one only in
    those three values."""
    from specbuild.runtime.lookahead_decoding import generate_lookahead
    from specbuild.runtime.model import CausalLM
    from specbuild.runtime.sequence import StopCriteria

    out = tmp_path / "tuned.yaml"
    options = TuneOptions(prompts=2, new_tokens=24, repeats=1, output=out, **GRID)
    report = run_tune(lookahead_spec, options, console=QUIET, out=QUIET)
    t = report.lookahead
    assert t is not None and set(t.candidates) == set(grid_candidates(LookaheadGrid(**GRID),
                                                                      load_spec(lookahead_spec)).configs)
    speed = {c: r.tokens / sum(t.seconds_at[size] * n for size, n in r.fed.items()) for c, r in t.runs.items()}
    assert t.batch == load_spec(lookahead_spec).build.max_batch_size == 4
    assert set(t.loaded_seconds_at) == set(t.seconds_at)  # every block size also timed with 4 rows
    loaded = {c: r.tokens / sum(t.loaded_seconds_at[size] * n for size, n in r.fed.items())
              for c, r in t.runs.items()}
    holding = [c for c in t.candidates if loaded[c] >= loaded[PLAIN]]
    assert t.chosen == (max(holding, key=speed.__getitem__) if holding else max(t.candidates, key=loaded.__getitem__))
    assert speed[PLAIN] == pytest.approx(1 / t.seconds_at[1]) and t.runs[PLAIN].tokens_per_step == 1.0
    model = CausalLM.from_checkpoint(load_spec(lookahead_spec).checkpoint_dir("target"))
    chosen = t.runs[t.chosen]
    stats = [generate_lookahead(model, [p], t.chosen, stop=StopCriteria(24)).stats for p in report.prompts]
    assert chosen.tokens == sum(s.generated_tokens - 1 for s in stats) == len(report.prompts) * 23
    assert chosen.steps == sum(s.target_forwards - 1 for s in stats)
    assert max(chosen.fed) <= la.max_draft_len(*t.chosen) + 1  # a step never feeds more than the engine holds
    tuned = load_spec(out)
    assert tuple(tuned.speculative.lookahead_config().config) == t.chosen
    changed = [(a, b) for a, b in zip(lookahead_spec.read_text().splitlines(), out.read_text().splitlines(),
                                      strict=True) if a != b]
    assert all(a.split(":")[0] == b.split(":")[0] and "#" in b for a, b in changed)
    assert "    window_size: " + str(t.chosen.window_size) + "             # W: keep this comment" in out.read_text()


def test_a_spec_without_a_lookahead_section_gets_one(lookahead_spec: Path, tmp_path: Path) -> None:
    text = lookahead_spec.read_text()
    section = text[text.index("  lookahead:\n"):text.index("\nbuild:")]
    bare = lookahead_spec.parent / "bare.yaml"
    bare.write_text(text.replace(section, ""))
    out = tmp_path / "bare-tuned.yaml"
    grid = {"windows": (2,), "ngrams": (2,), "verification_sets": (1,)}
    report = run_tune(bare, TuneOptions(prompts=2, new_tokens=16, output=out, **grid), console=QUIET, out=QUIET)
    assert report.lookahead is not None
    assert set(report.lookahead.candidates) == {(2, 2, 1), (4, 3, 4)}  # the grid and the spec's (default) own
    written = yaml.safe_load(out.read_text())["speculative"]["lookahead"]
    assert tuple(written.values()) == report.lookahead.chosen
    assert tuple(load_spec(out).speculative.lookahead_config().config) == report.lookahead.chosen


def test_dry_run_prints_the_table_and_writes_nothing(lookahead_spec: Path) -> None:
    before = sorted(p.name for p in lookahead_spec.parent.iterdir())
    text = lookahead_spec.read_text()
    args = ["tune", str(lookahead_spec), "--dry-run", "--prompts", "2", "--new-tokens", "16", "--window", "2",
            "--ngram", "2", "--ngram", "3", "--verification-set", "1"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "Lookahead (W, N, G)" in result.output and "chosen" in result.output and "plain" in result.output
    assert lookahead_spec.read_text() == text and sorted(p.name for p in lookahead_spec.parent.iterdir()) == before
    refused = CliRunner().invoke(app, ["tune", str(lookahead_spec), "--window", "1"])
    assert refused.exit_code == 1 and "window_size must be at least 2" in " ".join(refused.output.split())
