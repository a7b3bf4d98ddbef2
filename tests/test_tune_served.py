"""`specbuild tune --served`: the load-aware schedule measured behind tritonserver on the deployed repository.

What a user relies on: each candidate length really is what the served models ran (the override reaches the
tensorrt_llm model and the BLS, and the server log says so), the schedule is built from those served figures with
the full length at batch size 1, and a spec that cannot be measured that way is refused before anything loads.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from specbuild.errors import SpecbuildError
from specbuild.runtime.schedule import (
    DRAFT_LEN_ENV,
    SCHEDULE_ENV,
    DraftSchedule,
    fixed_length,
    served_draft_len,
    served_steps,
)
from specbuild.spec import load_spec
from specbuild.tune.schedule import halvings, shortest_within_noise
from specbuild.tune.served import ONE_CLIENT_PASSES
from specbuild.tune.stage import TuneOptions, run_tune
from tests.deploy_fixtures import Deployed

QUIET = Console(quiet=True)
BUILD = "build:\n  backend: reference\n  max_batch_size: 4\n  max_input_len: 64\n  max_output_len: 16\n"


def test_the_override_wins_over_the_configuration_and_is_said(monkeypatch: pytest.MonkeyPatch) -> None:
    said: list[str] = []
    monkeypatch.delenv(SCHEDULE_ENV, raising=False)
    assert served_steps('{"1": 4, "8": 0}', said.append) == {1: 4, 8: 0} and said == []
    assert served_steps({"1": 4}, said.append) == {1: 4} and served_steps(None) == {} and said == []
    monkeypatch.setenv(SCHEDULE_ENV, '{"1": 4, "2": 1, "16": 1}')
    assert served_steps('{"1": 4, "8": 0}', said.append) == {1: 4, 2: 1, 16: 1}
    assert said == [f'draft_len_schedule {{"1": 4, "2": 1, "16": 1}} from {SCHEDULE_ENV}, not the configuration\'s']
    monkeypatch.setenv(SCHEDULE_ENV, "[4, 1]")
    with pytest.raises(ValueError, match="must map batch sizes"):
        served_steps(None)


def test_the_k_override_wins_within_the_engines_max_draft_len(monkeypatch: pytest.MonkeyPatch) -> None:
    said: list[str] = []
    monkeypatch.delenv(DRAFT_LEN_ENV, raising=False)
    assert served_draft_len(3, 8, said.append) == 3 and said == []
    monkeypatch.setenv(DRAFT_LEN_ENV, "6")
    assert served_draft_len(3, 8, said.append) == 6
    assert said == [f"num_draft_tokens 6 from {DRAFT_LEN_ENV}, not the configuration's 3"]
    for wrong in ("9", "0", "five"):  # the engine cannot verify more than max_draft_len drafts
        monkeypatch.setenv(DRAFT_LEN_ENV, wrong)
        with pytest.raises(ValueError, match=r"an integer in 1\.\.8 \(the target engine's max_draft_len\)"):
            served_draft_len(3, 8)


@pytest.mark.parametrize("lookup", ["from", "up_to"])
def test_a_fixed_length_drafts_it_at_every_load_under_either_lookup(lookup: str) -> None:
    for length in (0, 2, 4):
        schedule = DraftSchedule(fixed_length(4, length, 16), 4, lookup=lookup)  # type: ignore[arg-type]
        assert schedule.draft_len(1) == 4
        assert {schedule.draft_len(active) for active in range(2, 17)} == {length}


def test_served_is_refused_before_any_model_loads(tmp_path: Path) -> None:
    spec = tmp_path / "lookahead.yaml"
    spec.write_text(f"name: la\noutput_dir: {tmp_path / 'out'}\ntarget:\n  model: {tmp_path / 'none'}\n"
                    "speculative:\n  mode: lookahead\n" + BUILD)
    with pytest.raises(SpecbuildError, match="has none at"):  # Lookahead is measured too, once deployed
        run_tune(spec, TuneOptions(served=True, write=False), console=QUIET, out=QUIET)
    with pytest.raises(SpecbuildError, match="which --no-schedule leaves out"):
        TuneOptions(served=True, schedule=False)
    with pytest.raises(SpecbuildError, match="without --served they would be ignored"):
        TuneOptions(load_prompts=("The for statement",))
    with pytest.raises(SpecbuildError, match="holds no prompt"):
        TuneOptions(served=True, load_prompts=("", "  "))


def test_load_prompts_come_from_a_file_of_one_prompt_a_line(tmp_path: Path) -> None:
    """`tune --served --load-prompts FILE` reads the prompts as `specbuild bench --prompts` does; a file that is not
    UTF-8 text or holds none is named in the error."""
    from typer.testing import CliRunner

    from specbuild.bench.run import read_prompts
    from specbuild.cli.app import app

    given = tmp_path / "load.txt"
    given.write_text("The for statement\n\n  Class definitions  \n", encoding="utf-8")
    assert read_prompts(given) == ("The for statement", "Class definitions")
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"\xff\xfe prompt")
    with pytest.raises(SpecbuildError, match=r"bad\.txt: the prompt file is not UTF-8"):
        read_prompts(bad)
    result = CliRunner().invoke(app, ["tune", str(tmp_path / "none.yaml"), "--load-prompts", str(given)])
    assert result.exit_code != 0 and "without --served they would be ignored" in result.output


def test_an_undeployed_spec_is_told_to_deploy(tmp_path: Path, demo_models: dict[str, Path]) -> None:
    spec = tmp_path / "medusa.yaml"
    spec.write_text(f"name: m\noutput_dir: {tmp_path / 'out'}\ntarget:\n  model: {demo_models['target']}\n"
                    f"medusa:\n  heads: {demo_models['medusa-heads']}\n  choices: mc_sim_7b_top8\n"
                    "speculative:\n  mode: medusa\n" + BUILD)
    with pytest.raises(SpecbuildError, match="has none at") as err:
        run_tune(spec, TuneOptions(served=True, write=False), console=QUIET, out=QUIET)
    assert "specbuild convert/build/deploy" in (err.value.hint or "")


@pytest.mark.tritonserver
def test_the_schedule_is_measured_on_the_deployed_repository_at_each_length(deployed: Deployed) -> None:
    """The Medusa deployment (8-node tree, max batch 4): one server per length, each running that length from
    batch size 2 on (its log says the override replaced the repository's schedule), tokens/s at batch 2 and 4
    for 0 tree paths, all 8 and their halvings (4, 2, 1), and the schedule built from them keeps the full tree at
    batch size 1. Measured on the load's own prompts (--load-prompts): those, and only those, are sent."""
    from specbuild.bench import load
    from specbuild.tune.report import _calibration

    spec = deployed.specs["medusa"]
    text = spec.path.read_text(encoding="utf-8")
    sent: list[tuple[str, ...]] = []
    real_run_load = load.run_load

    def recorded(url: str, given: load.Load, **kwargs: object) -> load.Summary:  # the real load, its prompts noted
        sent.append(tuple(given.prompts))
        return real_run_load(url, given, **kwargs)  # type: ignore[arg-type]

    options = TuneOptions(served=True, repeats=1, new_tokens=8, write=False,
                          load_prompts=("The for statement", "", "Class definitions"))
    load.run_load = recorded  # type: ignore[assignment]
    try:
        report = run_tune(spec.path, options, console=QUIET, out=QUIET)
    finally:
        load.run_load = real_run_load  # type: ignore[assignment]
    assert set(sent) == {("The for statement", "Class definitions")}, "the load's prompts, not the calibration's"
    calibration = _calibration(report)[0]
    assert calibration["load_prompts"] == ["The for statement", "Class definitions"]
    assert calibration["prompts"] == 2 and calibration["new_tokens"] == 8
    t = report.schedule
    assert t is not None and t.served and t.full_length == 8
    assert sorted(t.tokens_per_second) == [2, 4]
    assert all(sorted(rates) == [0, 1, 2, 4, 8] and min(rates.values()) > 0
               for rates in t.tokens_per_second.values())
    assert report.settings == {"draft_len_schedule": t.schedule} and t.schedule[1] == 8  # nothing else measured
    logs = spec.deploy.model_repository.parent / "tune-served"  # type: ignore[union-attr]
    for length in (0, 1, 2, 4, 8):
        log = (logs / f"tritonserver-k{length}.log").read_text(encoding="utf-8", errors="replace")
        log = log.replace('\\"', '"')  # the server log escapes the quotes of python models' lines
        assert f"draft_len_schedule {json.dumps(fixed_length(8, length, 4))} from {SCHEDULE_ENV}" in log
    assert spec.path.read_text(encoding="utf-8") == text  # a dry run writes nothing


@pytest.mark.tritonserver
def test_the_bls_k_is_measured_served_at_batch_one_and_written_with_the_schedule(deployed: Deployed,
                                                                                 tmp_path: Path) -> None:
    """The draft-target BLS (K 4, so its engine verifies up to 4): served, a round is a draft call and a target
    call, whose cost a longer K spreads over more tokens, so `tune --served` measures every K up to the engine's
    max_draft_len at batch size 1 (one client asking it with NVIDIA's num_draft_tokens input, on a server whose
    BLS takes the full length from the override and says so) and makes the shortest K within the run's noise of
    the fastest the spec's K; the loaded sizes are measured with that K, plain and its halvings. Written, the spec
    holds both and keeps the engine's max_draft_len where the K is smaller, so the repository's engines still fit
    it."""
    spec = deployed.specs["draft_target"]
    written = tmp_path / "tuned.yaml"
    options = TuneOptions(served=True, repeats=1, prompts=2, new_tokens=8, output=written)
    report = run_tune(spec.path, options, console=QUIET, out=QUIET)
    t = report.schedule
    assert t is not None and t.served and t.measured_full_length
    assert sorted(t.tokens_per_second[1]) == [1, 2, 3, 4] and min(t.tokens_per_second[1].values()) > 0
    assert all(len(rates) == ONE_CLIENT_PASSES and t.tokens_per_second[1][k] == max(rates)
               for k, rates in t.one_client.items())  # every pass kept, the table shows each K's fastest
    k = shortest_within_noise(t.one_client)[0]
    assert t.full_length == k and t.schedule[1] == k
    assert sorted(t.tokens_per_second) == [1, 2, 4]
    assert all(sorted(t.tokens_per_second[size]) == sorted({0, k, *halvings(k)}) for size in (2, 4))
    assert report.settings == {"num_draft_tokens": k, "draft_len_schedule": t.schedule}
    logs = spec.deploy.model_repository.parent / "tune-served"  # type: ignore[union-attr]
    log = (logs / "tritonserver-batch1.log").read_text(encoding="utf-8", errors="replace").replace('\\"', '"')
    assert f"num_draft_tokens 4 from {DRAFT_LEN_ENV}, not the configuration's 4" in log
    tuned = load_spec(written)
    assert tuned.speculative.num_draft_tokens == k and tuned.speculative.draft_len_schedule == t.schedule
    assert tuned.speculative.max_draft_len == (None if k == 4 else 4)


@pytest.mark.tritonserver
def test_the_bls_runs_the_overriding_schedule(deployed: Deployed, tmp_path: Path) -> None:
    """The draft-target BLS reads the same override (the engine flow's draft_len_schedule is the BLS's)."""
    from specbuild.serve.server import TritonServer

    steps = fixed_length(4, 1, 4)
    with TritonServer(deployed.repository("draft_target"), env={SCHEDULE_ENV: json.dumps(steps)},
                      log_file=tmp_path / "bls.log", ready_timeout_s=420):
        pass
    log = (tmp_path / "bls.log").read_text(encoding="utf-8", errors="replace").replace('\\"', '"')  # as logged
    assert f"draft_len_schedule {json.dumps(steps)} from {SCHEDULE_ENV}" in log


@pytest.mark.parametrize(("given", "said"), [("x", "is not a JSON object"), ('{"2": 3}', "must map batch size 1"),
                                             ('{"1": 2, "4": 3}', "must be an integer in 0..2")])
def test_serve_refuses_a_schedule_the_models_would_refuse(given: str, said: str, tmp_path: Path) -> None:
    """`specbuild serve --draft-len-schedule` (the same override, by hand) says what is wrong before any server
    starts, rather than a model failing to load."""
    from typer.testing import CliRunner

    from specbuild.cli import app

    result = CliRunner().invoke(app, ["serve", str(tmp_path), "--draft-len-schedule", given])
    assert result.exit_code == 1 and said in " ".join(result.output.split())



@pytest.mark.tritonserver
def test_models_that_do_not_read_the_override_are_refused(deployed: Deployed, monkeypatch: pytest.MonkeyPatch) -> None:
    """NVIDIA's C++ tensorrtllm backend and its llmapi model never read SPECBUILD_DRAFT_LEN_SCHEDULE and would
    serve their own schedule at every length: a server whose models did not say they read it ends the tune with
    the reason, instead of a table of one schedule measured three times. Simulated here by passing the length
    under a name the served models do not read."""
    import specbuild.runtime.schedule as schedule

    monkeypatch.setattr(schedule, "SCHEDULE_ENV", "SPECBUILD_NOT_READ_BY_ANY_MODEL")
    options = TuneOptions(served=True, repeats=1, prompts=2, new_tokens=4, write=False)
    with pytest.raises(SpecbuildError, match="did not read SPECBUILD_NOT_READ_BY_ANY_MODEL"):
        run_tune(deployed.specs["medusa"].path, options, console=QUIET, out=QUIET)
