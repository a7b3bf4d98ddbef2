"""bench/round_cost_bench.py's pure parts on synthetic numbers: splitting a request's timings into the round's
parts, reading Triton's statistics, the engine table, the account, the targets, the markdown tables, and the
instrumented BLS (run against a stand-in for the deployed model, so its timers are checked without tritonserver)."""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.bench_scripts import bench_module


@pytest.fixture(scope="module")
def rc() -> ModuleType:
    """The script imported as the bench scripts import each other (bench/ first on sys.path)."""
    return bench_module("round_cost_bench")


def served(rc: ModuleType, **changes: Any) -> Any:
    """A served request: 100 ms end to end, the BLS 90 ms of it (preprocessing 2), 4 rounds of one draft call
    (5 ms each) and one target call (10 ms each), detokenisation 1 ms in all."""
    values = {"total_s": 0.100, "serve_s": 0.090, "preprocessing_s": 0.002, "draft_s": 0.020, "target_s": 0.040,
              "detok_s": 0.001, "draft_calls": 4, "target_calls": 4, "respond_s": 0.004, "accepted": 8,
              "drafted": 16, "text": "abc", **changes}
    return rc.RequestTiming(**values)


def test_the_bls_work_is_its_request_less_preprocessing_calls_and_detokenisation(rc: ModuleType) -> None:
    out = rc.split([served(rc), served(rc, serve_s=0.070, total_s=0.080, target_calls=2, draft_calls=2,
                                       draft_s=0.010, target_s=0.020)])
    assert out["rounds"] == 6 and out["requests"] == 2
    # BLS work: (90 - 2 - 20 - 40 - 1) + (70 - 2 - 10 - 20 - 1) = 27 + 37 = 64 ms over 6 rounds
    assert out["per_round_ms"]["BLS work"] == pytest.approx(64 / 6)
    assert out["per_round_ms"]["draft calls"] == pytest.approx(30 / 6)
    assert out["per_round_ms"]["target call"] == pytest.approx(60 / 6)
    assert out["per_round_ms"]["detokenisation"] == pytest.approx(2 / 6)
    assert out["round_ms"] == pytest.approx((88 + 68) / 6)
    assert sum(out["per_round_ms"].values()) == pytest.approx(out["round_ms"])
    assert out["per_call_ms"] == pytest.approx({"tensorrt_llm_draft": 5.0, "tensorrt_llm": 10.0})
    assert out["per_request_ms"]["outside the BLS"] == pytest.approx(10.0)
    assert out["per_request_ms"]["preprocessing"] == pytest.approx(2.0)
    assert out["bls_timed_over_client"] == pytest.approx(160 / 180)
    assert out["accepted_per_round"] == pytest.approx(16 / 6)
    assert "parts_over_round" not in out  # served requests have no replayed loop


def test_in_process_parts_are_checked_against_the_round(rc: ModuleType) -> None:
    local = served(rc, total_s=0.090, loop_s=0.012)  # the replay: 12 ms, so 20 + 40 + 1 + 12 = 73 of 88
    out = rc.split([local])
    assert out["loop_replayed_ms"] == pytest.approx(3.0)
    assert out["parts_over_round"] == pytest.approx(73 / 88)
    with pytest.raises(ValueError):
        rc.split([served(rc, target_calls=0)])


def test_a_bls_record_becomes_a_request(rc: ModuleType) -> None:
    record = {"serve": 0.09, "call preprocessing": 0.002, "call preprocessing n": 1, "call tensorrt_llm_draft": 0.02,
              "call tensorrt_llm_draft n": 4, "call tensorrt_llm": 0.04, "call tensorrt_llm n": 4,
              "detokenise": 0.001, "detokenise n": 5, "respond": 0.004, "respond n": 6}
    assert rc.RequestTiming.from_bls(record, 0.1, text="abc", accepted=8, drafted=16) == served(rc)
    bare = rc.RequestTiming.from_bls({"serve": 0.01}, 0.02)
    assert (bare.draft_calls, bare.target_calls, bare.detok_s) == (0, 0, 0.0)


STATS = {"model_stats": [
    {"name": "tensorrt_llm", "version": "1", "execution_count": "14", "inference_count": "14",
     "inference_stats": {"success": {"count": "14", "ns": "31056709"}, "queue": {"count": "14", "ns": "1400000"},
                         "compute_input": {"count": "14", "ns": "700000"},
                         "compute_infer": {"count": "14", "ns": "14000000"},
                         "compute_output": {"count": "14", "ns": "7000000"}}},
    {"name": "postprocessing", "version": "1", "inference_stats": {"success": {}, "queue": {}}},
]}


def test_a_bls_record_still_being_written_is_not_read(rc: ModuleType, tmp_path: Path) -> None:
    """The instrumented BLS writes a request's record just after its final response went out, so the client can
    read the log mid-line (a bench run crashed on such a half line): only lines ended by their newline count, and a
    request whose record never completes is named as missing, not read as broken JSON."""
    log = tmp_path / "bls.jsonl"
    log.write_text(json.dumps({"serve": 0.5}) + "\n" + '{"serve": 0.', encoding="utf-8")
    assert rc._record(log, 0) == {"serve": 0.5}
    with pytest.raises(SystemExit, match="1 BLS records after request 2"):
        rc._record(log, 1, timeout_s=0.05)
    log.write_text(log.read_text(encoding="utf-8") + "25}\n", encoding="utf-8")
    assert rc._record(log, 1) == {"serve": 0.25}


def test_triton_statistics_are_read_and_differenced(rc: ModuleType) -> None:
    after = rc.parse_statistics(STATS)
    assert after["postprocessing"] == rc.ModelStats()  # absent counts are zeros
    assert after["tensorrt_llm"].executions == 14
    before = {"tensorrt_llm": rc.ModelStats(4, 4, 400000, 200000, 4000000, 2000000)}
    delta = rc.stats_delta(before, after)
    assert delta["tensorrt_llm"] == rc.ModelStats(10, 10, 1000000, 500000, 10000000, 5000000)
    assert delta["tensorrt_llm"].per_execution_ms() == pytest.approx({"queue": 0.1, "execute": 1.55})
    assert delta["postprocessing"].per_execution_ms() == {"queue": None, "execute": None}


def test_triton_counts_must_match_the_bls_calls(rc: ModuleType) -> None:
    timings = [served(rc), served(rc)]
    delta = {"tensorrt_llm_draft": rc.ModelStats(8), "tensorrt_llm": rc.ModelStats(8),
             "preprocessing": rc.ModelStats(2), "postprocessing": rc.ModelStats(0),
             "tensorrt_llm_bls": rc.ModelStats(2)}
    assert rc.counts_agree(delta, timings)["agree"]
    delta["postprocessing"] = rc.ModelStats(8)  # detokenised through postprocessing after all: not the BLS's loop
    assert not rc.counts_agree(delta, timings)["agree"]


def step_run(rc: ModuleType, batch: int, step_ms: float) -> Any:
    """A prefill step (10 ms, not a decode step), then 4 decode steps of `step_ms`, `batch` tokens each."""
    run = rc.StepRun(batch, 5, [0.010] + [step_ms / 1e3] * 4, [batch] * 5, [False] + [True] * 4)
    run.wall_s = 0.010 + 4 * step_ms / 1e3
    return run


def test_the_engine_table_counts_decode_steps_and_takes_the_fastest_round(rc: ModuleType) -> None:
    runs = {1: [step_run(rc, 1, 2.0)], 8: [step_run(rc, 8, 4.0), step_run(rc, 8, 8.0), step_run(rc, 8, 3.2)]}
    one, eight = rc.engine_table(runs)
    assert one["decode_step_ms"] == pytest.approx(2.0) and one["decode_tokens_per_s"] == pytest.approx(500)
    assert eight["decode_step_ms"] == pytest.approx(3.2)  # the fastest of the three rounds; the prefill step is out
    assert eight["decode_x_1"] == pytest.approx(5.0) and eight["step_ms_x_1"] == pytest.approx(1.6)
    assert eight["generation_tokens_per_s"] == pytest.approx(40 / (0.010 + 4 * 0.0032))
    assert eight["decode_steps"] == 4


def test_each_request_is_taken_at_its_fastest_pass(rc: ModuleType) -> None:
    slow_first = [served(rc, serve_s=0.2, text="a"), served(rc, serve_s=0.05, text="b")]
    slow_second = [served(rc, serve_s=0.06, text="a"), served(rc, serve_s=0.3, text="b")]
    assert [t.serve_s for t in rc.fastest([slow_first, slow_second])] == [0.06, 0.05]
    with pytest.raises(ValueError):  # a pass that lost a request
        rc.fastest([slow_first, slow_second[:1]])


TOKENS = [5, 6, 7, 8, 9, 10, 11, 12]


def engines(rc: ModuleType, plain_s: float, one_s: float, requests: int = 2, tokens: list[int] = TOKENS,
            one_tokens: list[int] | None = None) -> dict[str, list[Any]]:
    """Each account engine's requests: `requests` of 8 tokens, plain at 8 target forwards each, one engine at 3."""
    return {"plain": [rc.EngineTiming(plain_s, list(tokens), 8)] * requests,
            "one engine": [rc.EngineTiming(one_s, list(one_tokens or tokens), 3)] * requests}


def test_the_account_holds_when_the_flow_stays_below_the_floor_that_one_engine_reaches(rc: ModuleType) -> None:
    # the BLS's rounds: 43 ms a request (45 less 2 of preprocessing), 8 tokens in 4 rounds
    bls = [served(rc, serve_s=0.045, tokens=TOKENS)] * 2
    in_process = rc.split(bls)
    acc = rc.account(bls, engines(rc, plain_s=0.0516, one_s=0.030), in_process, k=3)
    assert acc["x_plain"]["flow"] == pytest.approx(51.6 / 43)  # 1.2x: below 1.3
    assert acc["x_plain"]["one engine"] == pytest.approx(51.6 / 30)  # 1.72x: the same speculation in one engine
    assert acc["holds"] and acc["same_tokens"]["all"]
    assert acc["ms_per_token"]["plain"] == pytest.approx(51.6 / 8)
    assert acc["flow_tokens_per_round"] == pytest.approx(2.0)
    assert acc["plain_ms_for_a_rounds_tokens"] == pytest.approx(2 * 51.6 / 8)
    assert acc["one_engine_tokens_per_forward"] == pytest.approx(8 / 3)
    # the flow reaching the floor: nothing to account for
    assert not rc.account(bls, engines(rc, plain_s=0.060, one_s=0.030), in_process, k=3)["holds"]
    # one engine below the floor too: the speculation itself does not pay, the flow is not what caps it
    assert not rc.account(bls, engines(rc, plain_s=0.0516, one_s=0.045), in_process, k=3)["holds"]
    # the flow reaching the floor at another K in-process: the repository's K does not show what caps the flow
    swept = rc.account(bls, engines(rc, plain_s=0.0516, one_s=0.030), in_process, k=3, by_k={1: 1.1, 3: 1.2})
    assert swept["holds"] and "(at its best K, 3: 1.20x)" in swept["summary"]
    assert not rc.account(bls, engines(rc, plain_s=0.0516, one_s=0.030), in_process, k=3,
                          by_k={1: 1.1, 3: 1.2, 5: 1.31})["holds"]
    assert not rc.account(bls, engines(rc, plain_s=0.0516, one_s=0.030), in_process, k=3, by_k={3: 1.2},
                          sweep_same=False)["holds"]  # a K whose rounds made other tokens
    # a path that decodes other tokens is no account at all
    other = rc.account(bls, engines(rc, plain_s=0.0516, one_s=0.030, one_tokens=[5, 6, 7, 8, 9, 10, 11, 99]),
                       in_process, k=3)
    assert not other["holds"] and other["same_tokens"] == {"requests": 2, "same": 0, "all": False}


def test_the_flow_at_each_k_is_its_rounds_over_plain_decoding_of_the_same_requests(rc: ModuleType) -> None:
    plain = engines(rc, plain_s=0.060, one_s=0.030)["plain"]  # 2 requests, 120 ms in all
    sweep = {2: [served(rc, serve_s=0.052, tokens=TOKENS)] * 2,  # 50 ms of rounds each (2 of preprocessing)
             1: [served(rc, serve_s=0.082, tokens=TOKENS)] * 2}
    assert rc.flow_by_k(sweep, plain) == {1: pytest.approx(120 / 160), 2: pytest.approx(120 / 100)}
    assert list(rc.flow_by_k(sweep, plain)) == [1, 2]


def report(rc: ModuleType, *, local_loop_s: float = 0.027, engine_step_8: float = 4.0) -> dict[str, Any]:
    settings = {"spec": "configs/demo.yaml", "k": 4, "max_tokens": 48, "prompts": ["a", "b"], "passes": 1,
                "torch_threads": 1, "engine_new_tokens": 5, "engine_rounds": 1}
    delta = {"tensorrt_llm_draft": rc.ModelStats(16, 16, 1600000, 0, 16000000, 0), "tensorrt_llm": rc.ModelStats(16),
             "preprocessing": rc.ModelStats(4), "tensorrt_llm_bls": rc.ModelStats(4)}  # over both served passes
    local = [served(rc, total_s=0.045, serve_s=0.045, draft_s=0.010, target_s=0.020, loop_s=local_loop_s / 2,
                    tokens=TOKENS)] * 2
    machine = {"nproc": 2, "ram_gib": 23.5, "platform": "Linux", "python": "3.11", "torch": "2.13",
               "git_commit": "abc", "date": "today", "loadavg_start": [1, 1, 1], "loadavg_end": [2, 2, 2]}
    runs = {1: [step_run(rc, 1, 2.0)], 8: [step_run(rc, 8, engine_step_8)], 16: [step_run(rc, 16, 6.0)]}
    slower = [served(rc, serve_s=0.2, total_s=0.21), served(rc, serve_s=0.3, total_s=0.31)]
    # the account's engines: plain 51.6 ms a request (1.2x the flow's 43), one engine 30; the slower pass is not kept
    passes = {name: [timings, [rc.EngineTiming(t.total_s * 2, t.tokens, t.forwards) for t in timings]]
              for name, timings in engines(rc, plain_s=0.0516, one_s=0.030).items()}
    out = rc.assemble(settings, [[served(rc), served(rc)], slower], delta, [local, local], passes, runs, machine,
                      floor={"tensorrt_llm_draft": 0.5, "tensorrt_llm": 0.75})
    out["bench_runtime_s"] = 12.0
    return out


def test_the_targets_pass_on_consistent_figures_and_miss_on_inconsistent_ones(rc: ModuleType) -> None:
    good = rc.judged(report(rc))
    assert all(t.met for t in good if t.met is not None), [t for t in good if t.met is False]
    (claim,) = [t for t in good if t.met is None]  # the account is reported, for serving_bench to judge by
    assert claim.measured == ("holds: in-process, the 1.2 flow's rounds 1.20x plain, one engine with the same "
                              "models and K 1.72x")
    # the replayed loop far larger than the round's remainder: the parts no longer sum to the round
    loose = {t.name: t for t in rc.judged(report(rc, local_loop_s=0.040))}
    assert not loose["in-process parts sum to the measured round within 15%"].met
    # 8 sequences slower per token than 1 (a step 9x as long)
    slow = {t.name: t.met for t in rc.judged(report(rc, engine_step_8=18.0))}
    assert slow["engine decode tokens/s at 8 sequences > 1 sequence's"] is False
    # no postprocessing statistics reported at all: counts still agree (absent is zero)
    assert report(rc)["triton_counts"]["agree"]


def test_the_markdown_tables_carry_the_figures(rc: ModuleType) -> None:
    r = report(rc)
    r["targets"] = [{"target": t.name, "met": t.met, "measured": t.measured} for t in rc.judged(r)]
    text = rc.markdown(r)
    # served: draft 20 ms over 4 rounds; in-process 10 ms over 4
    assert "| draft calls | 5.00 | 2.50 | 2.00x |" in text
    assert "| target call | 10.00 | 5.00 | 2.00x |" in text
    assert "| **one round** | **22.00** | **10.75** | **2.05x** |" in text
    # served less in-process 2.50 ms a draft call, of it Triton's floor 0.50, beyond it 2.00
    assert "| tensorrt_llm_draft | 5.00 | 0.100 / 1.000 | 2.50 | 0.00 | 2.50 | 0.50 | 2.00 |" in text
    assert "| tensorrt_llm | 10.00 | " in text and "| 5.00 | 0.75 | 4.25 |" in text
    assert "| 8 | 4.00 | 2000 | 4.00x | 2.00x |" in text
    assert "| outside the BLS | 10.00 | – |" in text
    assert "| plain decoding: the target alone | 51.60 | 6.45 | 1.00x |" in text
    assert "| 43.00 | 5.38 | 1.20x |" in text and "| 30.00 | 3.75 | 1.72x |" in text
    assert text.count("| PASS |") == len([t for t in r["targets"] if t["met"] is not None])
    json.dumps(r)  # the report is what round-cost.json holds


class _Model:
    def __init__(self, name: str) -> None:
        self.name = name


SERVED_STANDIN = '''
import time
from dataclasses import dataclass


@dataclass
class Marker:  # a dataclass in the served module: it must load as a module of its own
    x: int = 0


class StreamedText:
    def add(self, tokens, final):
        time.sleep(0.002)
        return "t"


def decode_chunk(*args, **kwargs):
    return "whole"


class _Decoupled:
    def send(self, part, final=False):
        time.sleep(0.001)

    def finish(self):
        pass


class TritonPythonModel:
    def _call(self, model, inputs, outputs):
        time.sleep(0.003)
        return {}

    def _llm(self, model, inputs, outputs, cancellation):
        return self._call(model.name, inputs, outputs)  # a non-decoupled LLM goes through _call

    def _serve(self, request, reply, cancellation=None):
        self._call("preprocessing", {}, [])
        for _ in range(2):
            self._llm(request["draft"], {}, [], None)
            self._llm(request["target"], {}, [], None)
            StreamedText().add([1], False)
            _Decoupled().send({})
'''


def test_the_instrumented_bls_times_each_call_once(rc: ModuleType, tmp_path: Path) -> None:
    repository = tmp_path / "repo"
    (repository / "tensorrt_llm_bls" / "1").mkdir(parents=True)
    (repository / "tensorrt_llm_bls" / "1" / "model.py").write_text(SERVED_STANDIN)
    copy = rc.instrumented_copy(repository, tmp_path / "work")
    assert (copy / "tensorrt_llm_bls" / "1" / "served_model.py").read_text() == SERVED_STANDIN
    spec = importlib.util.spec_from_file_location("timed_bls", copy / "tensorrt_llm_bls" / "1" / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        model = module.TritonPythonModel()
        model._serve({"draft": _Model("tensorrt_llm_draft"), "target": _Model("tensorrt_llm")}, None)
    finally:
        sys.modules.pop("served_tensorrt_llm_bls", None)
    (record,) = [json.loads(line) for line in (copy / "tensorrt_llm_bls" / rc.TIMINGS).read_text().splitlines()]
    assert record["call tensorrt_llm n"] == record["call tensorrt_llm_draft n"] == 2  # not again as _call's
    assert record["call preprocessing n"] == 1
    assert record["detokenise n"] == 2 and record["respond n"] == 2
    assert record["call tensorrt_llm"] >= 0.006 and record["detokenise"] >= 0.004
    timing = rc.RequestTiming.from_bls(record, record["serve"] + 0.001)
    assert timing.serve_s >= 0.003 + 4 * 0.003 + 2 * 0.002 + 2 * 0.001
    assert rc.split([timing])["per_round_ms"]["BLS work"] >= 1.0  # 2 ms of responses over 2 rounds: the BLS's work
