"""TensorRT-LLM's load rules for speculation (`specbuild.runtime.schedule`) in the serving engine, driven by
counted steps and forwards, never wall time.

TensorRT-LLM's code cannot run here; the rules are read from NVIDIA/TensorRT-LLM: `draft_len_schedule` looked up
per line (1.2: the entry of the largest key <= the batch, drafter.py `bisect_right`, must contain {1:
max_draft_len}; main: the entry of the smallest key >= the batch and 0 above the largest, `bisect_left`, the smallest
key must be max_draft_len, exclusive of max_concurrency - llm_args.py DecodingBaseConfig), `max_concurrency`
(drafter.py @83ab45a5 should_use_spec_decode) and the acceptance switch-off (speculation_gate.py @41080dc5:
permanent once the mean acceptance length of the last `window` completed requests is below the threshold).
What a user relies on: EAGLE-3 (and every proposer) drafts exactly as those rules say at each batch size, output
stays the plain greedy output, and a switched-off engine stays off.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from specbuild.python_models.llmapi_model import draft_schedule
from specbuild.runtime.eagle3 import Eagle3Draft
from specbuild.runtime.model import CausalLM
from specbuild.runtime.proposers import Eagle3Proposer, ModelProposer
from specbuild.runtime.schedule import DraftSchedule, SpeculationGate
from specbuild.runtime.serving import EngineRequest, ServingEngine
from tests.eagle3_fixtures import write_random_draft
from tests.test_serving_proposers import _greedy, _prompts, target, tiny  # noqa: F401

K = 4


def test_draft_len_schedule_lookups_per_line() -> None:
    """1.2's "from" and main's "up_to" lookups at and between keys, and each line's refusals."""
    from_ = DraftSchedule({1: 4, 4: 2, 8: 0}, 4)
    assert [from_.draft_len(n) for n in (1, 3, 4, 7, 8, 50)] == [4, 4, 2, 2, 0, 0]
    up_to = DraftSchedule({4: 4, 8: 2, 32: 1}, 4, lookup="up_to")
    assert [up_to.draft_len(n) for n in (1, 4, 5, 8, 9, 32, 33)] == [4, 4, 2, 2, 1, 1, 0]
    assert DraftSchedule({}, 4, max_concurrency=3).draft_len(3) == 4
    assert DraftSchedule({}, 4, max_concurrency=3).draft_len(4) == 0
    with pytest.raises(ValueError, match="batch size 1"):
        DraftSchedule({2: 4}, 4)
    with pytest.raises(ValueError, match=r"draft_len_schedule\[2\] must equal max_draft_len"):
        DraftSchedule({2: 3, 8: 1}, 4, lookup="up_to")
    with pytest.raises(ValueError, match="mutually exclusive"):
        DraftSchedule({2: 4}, 4, max_concurrency=2, lookup="up_to")


def test_the_gate_switches_off_for_good_below_the_threshold() -> None:
    """Nothing is decided before `window` completions; then a rolling mean below the threshold disables, and
    later good requests do not bring it back."""
    gate = SpeculationGate(2, 0.5)
    assert not gate.record(10, 4)  # acceptance 1.5, one completion only
    assert not gate.record(10, 10) and not gate.disabled  # mean (1.5 + 0) / 2 = 0.75
    assert gate.record(10, 10) and gate.disabled  # mean (0 + 0) / 2 < 0.5
    assert not gate.record(40, 10) and gate.disabled


@pytest.fixture(scope="module")
def eagle3(target: CausalLM, tiny: dict[str, Path]) -> Eagle3Draft:  # noqa: F811
    directory = tiny["root"] / "eagle3-rules"
    if not directory.exists():
        write_random_draft(directory, target, seed=3, layer_ids=(0, 1, 3))
    return Eagle3Draft.from_directory(directory, target)


class _Recording(ServingEngine):
    """The engine, recording the draft length each step asked for at its number of active sequences."""

    asked: list[tuple[int, int]]

    def draft_len(self, active: int) -> int:
        k = super().draft_len(active)
        self.asked.append((active, k))
        return k


def _run(engine: _Recording, prompts: list[list[int]], lengths: list[int]) -> list[tuple[int, int, int]]:
    """Submit all at once, step to the end; per step (active sequences, K asked, draft forwards run)."""
    engine.asked = []
    handles = [engine.submit(EngineRequest(p, n)) for p, n in zip(prompts, lengths, strict=True)]
    steps = []
    while True:
        before = engine.stats.draft_forwards
        if not engine.step():
            break
        if engine.asked:
            steps.append((*engine.asked[-1], engine.stats.draft_forwards - before))
            engine.asked = []
    assert [h.wait(0).tokens for h in handles] == [_greedy(engine.model, p, n) for p, n in zip(prompts, lengths,
                                                                                                   strict=True)]
    return steps


@pytest.mark.parametrize("rules", ["max_concurrency", "from", "up_to"])
def test_eagle3_drafts_as_the_schedule_says_at_each_batch_size(rules: str, target: CausalLM,  # noqa: F811
                                                               eagle3: Eagle3Draft) -> None:
    """Four EAGLE-3 requests of different lengths: while more are active than the rule allows, no draft forward
    runs; as they finish, drafting resumes with the scheduled K (every step's K and draft forwards counted)."""
    schedule = {"max_concurrency": DraftSchedule({}, K, max_concurrency=2),
                "from": DraftSchedule({1: K, 2: 2, 4: 0}, K),
                "up_to": DraftSchedule({1: K, 3: 2}, K, lookup="up_to")}[rules]
    engine = _Recording(target, max_batch=4, max_seq_len=160, proposer=Eagle3Proposer(eagle3, K), schedule=schedule)
    steps = _run(engine, _prompts(4, seed=1), [4, 8, 14, 22])
    expected = {"max_concurrency": lambda n: K if n <= 2 else 0, "from": lambda n: {1: K, 2: 2, 3: 2}.get(n, 0),
                "up_to": lambda n: {1: K, 2: 2, 3: 2}.get(n, 0)}[rules]
    assert {n for n, _, _ in steps} == {1, 2, 3, 4}
    for active, k, forwards in steps:
        assert k == expected(active)
        if k == 0:
            assert forwards == 0
    assert any(forwards for _, k, forwards in steps if k)  # drafting did run once the load allowed it


def test_a_poorly_accepting_eagle3_switches_speculation_off_for_good(target: CausalLM,  # noqa: F811
                                                                     eagle3: Eagle3Draft) -> None:
    """A random EAGLE-3 draft accepts (almost) nothing: after the window's two completions speculation is off,
    later requests draft nothing and output is unchanged; a draft that accepts everything (the target itself)
    keeps it on under the same threshold."""
    rules = draft_schedule({"acceptance_window": 2, "acceptance_length_threshold": 0.5}, K)
    engine = _Recording(target, max_batch=1, max_seq_len=160, proposer=Eagle3Proposer(eagle3, K), schedule=rules)
    prompts = _prompts(4, seed=2)
    _run(engine, prompts[:2], [10, 10])
    assert engine.gate is not None and engine.gate.disabled and engine.stats.speculation_disabled == 1
    forwards = engine.stats.draft_forwards
    later = _run(engine, prompts[2:], [10, 10])
    assert all(k == 0 for _, k, _ in later) and engine.stats.draft_forwards == forwards
    same = _Recording(target, max_batch=1, max_seq_len=160, proposer=ModelProposer(target, K), schedule=rules)
    _run(same, prompts, [10, 10, 10, 10])
    assert same.gate is not None and not same.gate.disabled and same.gate.completed == 4


def test_the_llmapi_model_reads_the_rules_by_line() -> None:
    """model.yaml's speculative_config names (both lines' acceptance names) map onto one DraftSchedule; the
    line picks the lookup; a bad schedule is refused naming model.yaml."""
    old = draft_schedule({"draft_len_schedule": {1: 4, 4: 1}}, 4)
    assert old.lookup == "from" and old.draft_len(5) == 1
    new = draft_schedule({"draft_len_schedule": {4: 4, 8: 1}, "acceptance_rate_window_size": 3,
                          "acceptance_rate_threshold": 0.2}, 4, "1.4")
    assert new.lookup == "up_to" and new.draft_len(9) == 0 and new.acceptance_window == 3
    with pytest.raises(RuntimeError, match=r"model\.yaml speculative_config: draft_len_schedule"):
        draft_schedule({"draft_len_schedule": {1: 2}}, 4)


def test_a_schedule_served_instead_of_the_repositorys_reads_as_the_spec_does_on_every_line(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`specbuild serve --draft-len-schedule` and `tune --served` pass a schedule in the spec's form (each length from
    its batch size on): a repository deployed for a line that reads "up to" runs it as written, not with
    speculation off above its largest key; without it, the repository's own schedule keeps its line's lookup."""
    from specbuild.runtime.schedule import SCHEDULE_ENV

    monkeypatch.setenv(SCHEDULE_ENV, '{"1": 4, "2": 2}')
    served = draft_schedule({"draft_len_schedule": {4: 4, 16: 2}}, 4, "1.3")
    assert served.steps == {1: 4, 2: 2} and [served.draft_len(n) for n in (1, 2, 8, 16)] == [4, 2, 2, 2]
    monkeypatch.delenv(SCHEDULE_ENV)
    own = draft_schedule({"draft_len_schedule": {4: 4, 16: 2}}, 4, "1.3")
    assert own.lookup == "up_to" and [own.draft_len(n) for n in (1, 8, 16, 17)] == [4, 2, 2, 0]
