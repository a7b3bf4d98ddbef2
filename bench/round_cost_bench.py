"""Round-cost benchmark: where the time of one draft-target speculative round goes, served and in-process, and
what one serving-engine step costs at 1, 8 and 16 active sequences.

1. One round as the served BLS runs it: the demo draft-target repository (configs/demo.yaml, built and deployed as
   bench/serving_bench.py does) on a real tritonserver, driven over gRPC streaming at concurrency 1, split into the
   draft call(s), the target call, the BLS's own work (the loop's Python, building calls and responses) and
   detokenisation. Triton's per-model statistics (`get_inference_statistics`) give each called model's executions
   and the time Triton accounts to them; they cannot give the model-side time of a call, because the repository's
   `tensorrt_llm` models (like the C++ backend) return from execute() once the request is queued and answer from
   the engine's thread. So the script serves a copy of the repository (bench/work/round-cost/) whose
   `tensorrt_llm_bls/1/model.py` is the deployed file unchanged (loaded as `served_model.py`) with timers around
   its calls, its detokenisation and its responses; the BLS's own work is its request's time minus those. Of what
   serving adds to a call, Triton's own share is measured apart (bench/triton_floor.py): the warm-up's recorded
   calls replayed to models with the deployed configs that answer at once; the rest is the served model's.
2. The same round in-process, without Triton: the same loop (`bls_loop.speculate`) with the same call tensors
   (`bls_calls.RowCalls`) handed to the same backend (`llm_backend.Backend`) over the same engines
   (`runtime.serving.ServingEngine`), and the loop replayed once more with the recorded answers in place of the
   models (its own Python, measured directly). Served / in-process is the Triton overhead, side by side.
3. The account, for bench/serving_bench.py's concurrency-1 target (>= 1.3x plain, or a measured account of why
   the 1.2 flow caps the BLS): the same requests, in-process and interleaved with the rounds above, decoded plainly
   by the target alone and by one serving engine with the same draft as its proposer and the same K (as the llmapi
   repository serves Draft_Target). It holds when the flow's rounds stay below 1.3x plain while one engine reaches
   it: the speculation pays, the flow's two requests per round and its continuations after a rejection eat it. The
   flow is also run in-process at every K up to the target engine's max_draft_len (beside plain decoding's own
   passes), and must stay below 1.3x plain at each: the K served is chosen behind the server (`tune --served`),
   where a round's Triton calls favour a longer K, so the account must not hold merely because that K is a poor one
   in-process.
4. One engine step of the demo target at 1, 8 and 16 active sequences (decode steps only, prefill excluded): ms
   per step, tokens/s and the ratio to 1 sequence; and tokens/s of whole generations (prefill included).

Targets (sanity checks, ratios): the in-process parts, each measured on its own, sum to the measured round within
15%; Triton's execution counts equal the calls the BLS made (postprocessing: none, the BLS detokenises itself);
what the BLS timed fits inside the client's end-to-end time; the served and in-process rounds are the same rounds
(same text, same number of target calls); plain, one engine and the BLS make the same tokens; served costs at least
in-process; the engine's tokens/s at 8 and at 16 sequences exceed 1 sequence's. The account itself is reported (it
is serving_bench's to judge by).

Writes bench/results/round-cost.json (every figure, settings, machine info) and round-cost.md (the tables).
Run with `.venv/bin/python bench/round_cost_bench.py [--help]`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from machine_info import machine_info, machine_line, uncommitted
from results_files import write_results
from serving_bench import SPEEDUP_MIN, existing, prepare
from targets import Target, finish
from triton_floor import Call, measure_floor

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT))

SPEC = ROOT / "configs" / "demo.yaml"
WORK = BENCH / "work" / "round-cost"
SUM_TOLERANCE = 0.15  # the in-process parts vs the measured round
TIMINGS = "timings.jsonl"  # written by the instrumented BLS into its model directory, one line per request
LLM_MODELS = ("tensorrt_llm_draft", "tensorrt_llm")
PART_NAMES = ("draft calls", "target call", "BLS work", "detokenisation")

# -- the instrumented BLS ------------------------------------------------------------------------------------------
TIMED_BLS = '''"""tensorrt_llm_bls exactly as deployed (served_model.py, the repository's own model.py moved aside) with
timers around its calls to the other models, its detokenisation and its responses. Written by
bench/round_cost_bench.py; one JSON line per request goes to ../timings.jsonl."""

import importlib.util
import json
import sys
import threading
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent
_SPEC = importlib.util.spec_from_file_location("served_tensorrt_llm_bls", _HERE / "served_model.py")
served = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = served  # its dataclasses look their module up there
_SPEC.loader.exec_module(served)
_LOG = _HERE.parent / "timings.jsonl"
_WRITE = threading.Lock()
_local = threading.local()


def _add(part, seconds):
    record = getattr(_local, "record", None)
    if record is not None:
        record[part] = record.get(part, 0.0) + seconds
        record[part + " n"] = record.get(part + " n", 0) + 1


def _timed(part, function, *args, **kwargs):
    start = time.perf_counter()
    try:
        return function(*args, **kwargs)
    finally:
        _add(part, time.perf_counter() - start)


class _TimedText(served.StreamedText):
    def add(self, tokens, final):
        return _timed("detokenise", super().add, tokens, final)


_decode_chunk = served.decode_chunk


def _timed_decode_chunk(*args, **kwargs):
    return _timed("detokenise", _decode_chunk, *args, **kwargs)


class _TimedReply(served._Decoupled):
    def send(self, part, final=False):
        return _timed("respond", super().send, part, final)

    def finish(self):
        return _timed("respond", super().finish)


served.StreamedText = _TimedText
served.decode_chunk = _timed_decode_chunk
served._Decoupled = _TimedReply


class TritonPythonModel(served.TritonPythonModel):
    def _serve(self, *args, **kwargs):
        _local.record, _local.in_llm = {}, False
        start = time.perf_counter()
        try:
            return super()._serve(*args, **kwargs)
        finally:
            record, _local.record = _local.record, None
            record["serve"] = time.perf_counter() - start
            with _WRITE, _LOG.open("a", encoding="utf-8") as out:
                out.write(json.dumps(record) + "\\n")

    def _llm(self, model, *args, **kwargs):
        _local.in_llm = True
        try:
            return _timed("call " + getattr(model, "name", str(model)), super()._llm, model, *args, **kwargs)
        finally:
            _local.in_llm = False

    def _call(self, model, *args, **kwargs):
        if getattr(_local, "in_llm", False):  # inside _llm: already timed as that LLM call
            return super()._call(model, *args, **kwargs)
        return _timed("call " + str(model), super()._call, model, *args, **kwargs)
'''


def instrumented_copy(repository: Path, work: Path) -> Path:
    """A fresh copy of `repository` under `work` whose BLS is the deployed one with timers (TIMED_BLS)."""
    copy = work / "model_repository"
    if copy.exists():
        shutil.rmtree(copy)
    shutil.copytree(repository, copy, ignore=shutil.ignore_patterns("__pycache__"))
    bls = copy / "tensorrt_llm_bls" / "1"
    (bls / "model.py").rename(bls / "served_model.py")
    (bls / "model.py").write_text(TIMED_BLS, encoding="utf-8")
    return copy


# -- what one request cost ------------------------------------------------------------------------------------------
@dataclass
class RequestTiming:
    """One request's seconds by part: served, as the instrumented BLS timed them (`serve_s` its whole request) plus
    the client's end-to-end time (`total_s`); in-process, the same parts of the same loop (`total_s` = `serve_s`).
    `loop_s`: in-process only, the loop replayed with recorded answers (its own Python, measured directly)."""

    total_s: float
    serve_s: float
    preprocessing_s: float
    draft_s: float
    target_s: float
    detok_s: float
    draft_calls: int
    target_calls: int
    respond_s: float = 0.0
    loop_s: float | None = None
    draft_forwards: int = 0
    target_forwards: int = 0
    accepted: int = 0
    drafted: int = 0
    text: str = ""
    tokens: list[int] = field(default_factory=list)  # in-process: the row's generated tokens

    @property
    def rounds_s(self) -> float:
        """The request's rounds: the BLS's time for it less preprocessing's."""
        return self.serve_s - self.preprocessing_s

    @classmethod
    def from_bls(cls, record: Mapping[str, float], total_s: float, *, draft: str = "tensorrt_llm_draft",
                 target: str = "tensorrt_llm", preprocessing: str = "preprocessing", text: str = "",
                 accepted: int = 0, drafted: int = 0) -> RequestTiming:
        """A served request from the instrumented BLS's record (part -> seconds, `part n` -> count)."""
        return cls(total_s=total_s, serve_s=record["serve"], preprocessing_s=record.get(f"call {preprocessing}", 0.0),
                   draft_s=record.get(f"call {draft}", 0.0), target_s=record.get(f"call {target}", 0.0),
                   detok_s=record.get("detokenise", 0.0), respond_s=record.get("respond", 0.0),
                   draft_calls=int(record.get(f"call {draft} n", 0)),
                   target_calls=int(record.get(f"call {target} n", 0)),
                   text=text, accepted=accepted, drafted=drafted)


def split(timings: Sequence[RequestTiming]) -> dict[str, Any]:
    """Per round (one target call each): the four parts in ms, the BLS's work being its request's time less
    preprocessing, the calls and detokenisation; per call, per request (preprocessing, the time outside the BLS:
    client, gRPC and Triton's handling of the BLS request), and the counts."""
    n = len(timings)
    rounds = sum(t.target_calls for t in timings)
    drafts = sum(t.draft_calls for t in timings)
    if not n or not rounds:
        raise ValueError("no request or no round to split")

    def total(name: str) -> float:
        return sum(getattr(t, name) for t in timings)

    work = total("serve_s") - total("preprocessing_s") - total("draft_s") - total("target_s") - total("detok_s")
    per_round = {"draft calls": total("draft_s"), "target call": total("target_s"), "BLS work": work,
                 "detokenisation": total("detok_s")}
    out: dict[str, Any] = {
        "requests": n, "rounds": rounds, "draft_calls": drafts,
        "rounds_per_request": rounds / n, "draft_calls_per_round": drafts / rounds,
        "accepted_per_round": total("accepted") / rounds,
        "per_round_ms": {name: 1e3 * seconds / rounds for name, seconds in per_round.items()},
        "round_ms": 1e3 * (total("serve_s") - total("preprocessing_s")) / rounds,
        "responses_ms_per_round": 1e3 * total("respond_s") / rounds,
        "per_call_ms": {"tensorrt_llm_draft": 1e3 * total("draft_s") / drafts if drafts else None,
                        "tensorrt_llm": 1e3 * total("target_s") / rounds},
        "per_request_ms": {"preprocessing": 1e3 * total("preprocessing_s") / n,
                           "outside the BLS": 1e3 * (total("total_s") - total("serve_s")) / n,
                           "request": 1e3 * total("total_s") / n},
        "forwards_per_call": {"tensorrt_llm_draft": total("draft_forwards") / drafts if drafts else None,
                              "tensorrt_llm": total("target_forwards") / rounds},
    }
    if all(t.loop_s is not None for t in timings):
        out["loop_replayed_ms"] = 1e3 * sum(t.loop_s or 0.0 for t in timings) / rounds
        measured = out["per_round_ms"]["draft calls"] + out["per_round_ms"]["target call"] + \
            out["per_round_ms"]["detokenisation"] + out["loop_replayed_ms"]
        out["parts_over_round"] = measured / out["round_ms"]
    out["bls_timed_over_client"] = (total("serve_s")) / total("total_s")
    return out


# -- Triton's statistics --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelStats:
    """One model's cumulative inference statistics (tritonclient's JSON of `get_inference_statistics`)."""

    executions: int = 0
    inferences: int = 0
    queue_ns: int = 0
    compute_input_ns: int = 0
    compute_infer_ns: int = 0
    compute_output_ns: int = 0

    def __sub__(self, other: ModelStats) -> ModelStats:
        return ModelStats(*(a - b for a, b in zip(astuple(self), astuple(other), strict=True)))

    def per_execution_ms(self) -> dict[str, float | None]:
        """Queue and execute (compute input + infer + output) per execution, as Triton accounts them."""
        if not self.executions:
            return {"queue": None, "execute": None}
        execute = self.compute_input_ns + self.compute_infer_ns + self.compute_output_ns
        return {"queue": self.queue_ns / self.executions / 1e6, "execute": execute / self.executions / 1e6}


def astuple(stats: ModelStats) -> tuple[int, ...]:
    return tuple(asdict(stats).values())


def parse_statistics(stats: Mapping[str, Any]) -> dict[str, ModelStats]:
    """Model name -> its statistics, from `InferenceServerClient.get_inference_statistics(as_json=True)` (counts
    and nanoseconds come as strings, and absent where zero)."""
    out = {}
    for model in stats.get("model_stats", []):
        infer = model.get("inference_stats", {})

        def ns(key: str, infer: Mapping[str, Any] = infer) -> int:
            return int(infer.get(key, {}).get("ns", 0))

        out[model["name"]] = ModelStats(int(model.get("execution_count", 0)), int(model.get("inference_count", 0)),
                                        ns("queue"), ns("compute_input"), ns("compute_infer"), ns("compute_output"))
    return out


def stats_delta(before: Mapping[str, ModelStats], after: Mapping[str, ModelStats]) -> dict[str, ModelStats]:
    return {name: stats - before.get(name, ModelStats()) for name, stats in after.items()}


def counts_agree(delta: Mapping[str, ModelStats], timings: Sequence[RequestTiming]) -> dict[str, Any]:
    """Triton's executions per model against the calls the BLS made: each LLM call one execution, preprocessing
    one per request, postprocessing none (the speculating BLS detokenises itself)."""
    expected = {"tensorrt_llm_draft": sum(t.draft_calls for t in timings),
                "tensorrt_llm": sum(t.target_calls for t in timings),
                "preprocessing": len(timings), "postprocessing": 0, "tensorrt_llm_bls": len(timings)}
    seen = {name: delta.get(name, ModelStats()).executions for name in expected}
    return {"expected": expected, "triton": seen, "agree": seen == expected}


# -- the serving engine's step --------------------------------------------------------------------------------------
@dataclass
class StepRun:
    """One generation of `batch` sequences on a fresh engine: every step's seconds, active sequences and whether it
    was a decode step (every active sequence had its first token before it), and the whole generation's time."""

    batch: int
    new_tokens: int
    step_s: list[float] = field(default_factory=list)
    step_tokens: list[int] = field(default_factory=list)
    decode: list[bool] = field(default_factory=list)
    wall_s: float = 0.0

    def decode_ms(self) -> float:
        """The median decode step with all `batch` sequences active."""
        return 1e3 * statistics.median(s for s, d in zip(self.step_s, self.decode, strict=True) if d)

    def decode_tokens_per_s(self) -> float:
        seconds = sum(s for s, d in zip(self.step_s, self.decode, strict=True) if d)
        return sum(n for n, d in zip(self.step_tokens, self.decode, strict=True) if d) / seconds

    def generation_tokens_per_s(self) -> float:
        return self.batch * self.new_tokens / self.wall_s


def engine_table(runs: Mapping[int, Sequence[StepRun]]) -> list[dict[str, Any]]:
    """Per batch size its fastest round by decode tokens/s (rounds interleave the batch sizes), with its ratios to
    batch 1's."""
    chosen = {b: max(rs, key=StepRun.decode_tokens_per_s) for b, rs in runs.items() if rs}
    base = chosen.get(1)
    rows = []
    for batch, run in sorted(chosen.items()):
        rows.append({
            "sequences": batch,
            "decode_step_ms": run.decode_ms(),
            "decode_tokens_per_s": run.decode_tokens_per_s(),
            "decode_x_1": run.decode_tokens_per_s() / base.decode_tokens_per_s() if base else None,
            "step_ms_x_1": run.decode_ms() / base.decode_ms() if base else None,
            "generation_tokens_per_s": run.generation_tokens_per_s(),
            "generation_x_1": run.generation_tokens_per_s() / base.generation_tokens_per_s() if base else None,
            "decode_steps": sum(run.decode),
            "rounds_decode_tokens_per_s": [round(r.decode_tokens_per_s(), 1) for r in runs[batch]],
        })
    return rows


# -- targets and tables ---------------------------------------------------------------------------------------------
def judged(report: Mapping[str, Any]) -> list[Target]:
    """The sanity targets of the figures in `report` (each a ratio or a count, measured in the one run)."""
    served, local, counts = report["served"], report["in_process"], report["triton_counts"]
    ratio = local["parts_over_round"]
    targets = [
        Target(f"in-process parts sum to the measured round within {SUM_TOLERANCE:.0%}",
               abs(ratio - 1) <= SUM_TOLERANCE, f"{ratio:.3f}"),
        Target("Triton's executions per model equal the BLS's calls", bool(counts["agree"]),
               ", ".join(f"{name} {counts['triton'][name]}/{n}" for name, n in counts["expected"].items())),
        Target("what the BLS timed fits in the client's end-to-end time", served["bls_timed_over_client"] <= 1.0,
               f"{served['bls_timed_over_client']:.3f}"),
        Target("served and in-process rounds are the same (text, target calls)", bool(report["same_rounds"]["all"]),
               f"{report['same_rounds']['same']} of {report['same_rounds']['requests']} requests"),
        Target("a served round costs at least an in-process one", report["served_over_in_process"] >= 1.0,
               f"{report['served_over_in_process']:.2f}x"),
        Target("plain, one engine and the BLS's rounds make the same tokens (greedy)",
               bool(report["account"]["same_tokens"]["all"]),
               f"{report['account']['same_tokens']['same']} of {report['account']['same_tokens']['requests']} "
               "requests"),
        Target(account_claim(report["account"]), None, account_figures(report["account"])),
    ]
    engine = {row["sequences"]: row for row in report["engine"]}
    for batch in (8, 16):
        x = engine.get(batch, {}).get("decode_x_1")
        targets.append(Target(f"engine decode tokens/s at {batch} sequences > 1 sequence's", x is not None and x > 1.0,
                              "not measured" if x is None else f"{x:.2f}x"))
    return targets


def account_claim(acc: Mapping[str, Any]) -> str:
    """The account's claim, as round-cost.md states it and serving_bench cites it."""
    return (f"the 1.2 flow caps the BLS below {acc['floor']}x plain at one request (in-process: its rounds at every "
            f"K < {acc['floor']}x <= one engine with the same models and K)")


def summary(x: Mapping[str, float], by_k: Mapping[int, float] | None = None) -> str:
    """The account's figures in a line, as serving_bench cites them beside the ratio they judge."""
    best = f" (at its best K, {max(by_k, key=by_k.__getitem__)}: {max(by_k.values()):.2f}x)" if by_k else ""
    return f"in-process, the 1.2 flow's rounds {x['flow']:.2f}x plain{best}, one engine with the same models and " \
           f"K {x['one engine']:.2f}x"


def account_figures(acc: Mapping[str, Any]) -> str:
    by_k = {int(k): x for k, x in acc.get("flow_x_plain_by_k", {}).items()}
    return f"{'holds' if acc['holds'] else 'does not hold'}: {summary(acc['x_plain'], by_k)}"


def _ms(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _x(a: float | None, b: float | None) -> str:
    return "–" if a is None or b is None or not b else f"{a / b:.2f}x"


def account_markdown(acc: Mapping[str, Any], local: Mapping[str, Any]) -> list[str]:
    """The account's section: the same requests three ways in-process, and what a round of the flow is made of."""
    ms, x, per_token = acc["ms_per_request"], acc["x_plain"], acc["ms_per_token"]
    rows = (("plain", "plain decoding: the target alone"),
            ("one engine", f"one engine: the same draft as the serving engine's proposer, K = {acc['k']}, verified "
                           "in the target's step (the llmapi repository's Draft_Target)"),
            ("flow", f"the 1.2 flow: the BLS's rounds, a draft request and a target request each, K = {acc['k']}"))
    call = local["per_call_ms"]
    lines = [
        f"## The account: why the BLS's rounds stay below {acc['floor']}x plain at one request",
        "",
        f"The same {acc['requests']} requests decoded in-process (no Triton) on the BLS's own models, each at its "
        f"fastest pass, interleaved with the passes above.",
        "",
        "| in-process | ms per request | ms per token | × plain |",
        "|---|---:|---:|---:|",
        *(f"| {label} | {_ms(ms[name])} | {_ms(per_token[name])} | {x[name]:.2f}x |" for name, label in rows),
        "",
        f"A round of the flow makes {acc['flow_tokens_per_round']:.2f} tokens in {_ms(local['round_ms'])} ms: the "
        f"draft request {_ms(call['tensorrt_llm_draft'])} ms ({_ms(local['forwards_per_call']['tensorrt_llm_draft'])}"
        f" draft forwards), the target request {_ms(call['tensorrt_llm'])} ms (the verification forward and "
        f"{acc['continuation_forwards_per_round']:.2f} forwards of plain decoding after a rejection: TensorRT-LLM "
        f"1.2's target generates len(drafts) + 1 tokens whatever it accepts). Plain decoding makes those tokens in "
        f"{_ms(acc['plain_ms_for_a_rounds_tokens'])} ms. One engine makes {acc['one_engine_tokens_per_forward']:.2f} "
        "tokens per target forward with no request per round and no continuation.",
        "",
        *(["The flow's rounds at every K the target engine verifies (the same requests, in-process, each at its "
           "fastest pass, beside plain decoding's own passes): "
           + ", ".join(f"K {k}: {x:.2f}x" for k, x in acc["flow_x_plain_by_k"].items()) + " plain.", ""]
          if acc.get("flow_x_plain_by_k") else []),
        f"**{account_claim(acc)}: {account_figures(acc)}.** `bench/serving_bench.py` judges the served BLS at "
        f"concurrency 1 by {acc['floor']}x plain, or by this account where it holds on the same commit and machine.",
    ]
    return lines


def markdown(report: Mapping[str, Any]) -> str:
    """The tables of round-cost.md: the round by part, the calls, the per-request costs, the engine's step."""
    served, local, s = report["served"], report["in_process"], report["settings"]
    lines = [
        "# Round cost: one draft-target round, served and in-process; one engine step",
        "",
        f"{s['spec']}, K = {s['k']} (the repository's num_draft_tokens; the schedule keeps it at concurrency 1), "
        f"{s['max_tokens']} new tokens per request, {len(s['prompts'])} prompts, gRPC streaming at concurrency 1; "
        f"each request at its fastest of {s['passes']} passes, served and in-process interleaved request by "
        f"request; torch threads "
        f"{s['torch_threads']} (the repository's torch_threads). Served: the instrumented copy of the repository "
        "(the deployed BLS with timers). A round = one target call.",
        "",
        "| part | served via Triton, ms per round | in-process, ms per round | served / in-process |",
        "|---|---:|---:|---:|",
    ]
    for name in PART_NAMES:
        a, b = served["per_round_ms"][name], local["per_round_ms"][name]
        lines.append(f"| {name} | {_ms(a)} | {_ms(b)} | {_x(a, b)} |")
    lines.append(f"| **one round** | **{_ms(served['round_ms'])}** | **{_ms(local['round_ms'])}** | "
                 f"**{_x(served['round_ms'], local['round_ms'])}** |")
    lines += [
        "",
        f"BLS work includes building and sending the responses: {_ms(served['responses_ms_per_round'])} ms per round "
        f"served. In-process the loop replayed with the recorded answers in place of the models takes "
        f"{_ms(local['loop_replayed_ms'])} ms per round; draft + target + detokenisation + that replay = "
        f"{local['parts_over_round']:.3f} of the measured in-process round. Rounds per request "
        f"{served['rounds_per_request']:.2f}, draft calls per round {served['draft_calls_per_round']:.2f}, accepted "
        f"drafts per round {served['accepted_per_round']:.2f}.",
        "",
        "| called model | served call, ms (as the BLS waits) | Triton's statistics per execution: queue / execute ms "
        "| in-process call, ms | engine forwards per call | served less in-process, ms | Triton's floor, ms "
        "| beyond the floor, ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    floor = report.get("triton_floor_ms", {})
    for model in LLM_MODELS:
        a, b = served["per_call_ms"][model], local["per_call_ms"][model]
        t = report["triton_per_execution_ms"].get(model, {})
        extra = None if a is None or b is None else a - b
        least = floor.get(model)
        lines.append(f"| {model} | {_ms(a)} | {_ms(t.get('queue'), 3)} / {_ms(t.get('execute'), 3)} | {_ms(b)} | "
                     f"{_ms(local['forwards_per_call'][model])} | {_ms(extra)} | {_ms(least)} | "
                     f"{_ms(None if extra is None or least is None else extra - least)} |")
    lines += [
        "",
        "Triton's statistics account to `tensorrt_llm` / `tensorrt_llm_draft` only their execute(), which queues "
        "the request and returns (the engine's thread answers through the response sender, as the C++ backend "
        "does), so the model-side time of a call is the in-process call's, and the served call less that is what "
        "serving adds. Triton's floor is Triton's own share of it (bench/triton_floor.py): the warm-up's calls, "
        "the very tensors the BLS sent, replayed from a python model with the BLS's exec() to models with the "
        "deployed config.pbtxt that answer at once from a worker thread (the fastest of its passes, each call's mean). "
        "Beyond the floor is what the served reference model adds on top of its in-process call: its stub reading "
        "the request and writing the response, the engine thread's wake-up, and sharing this machine's cores with "
        "the other processes of the server.",
        "",
        "| per request | served, ms | in-process, ms |",
        "|---|---:|---:|",
    ]
    for name in ("preprocessing", "outside the BLS", "request"):
        b = local["per_request_ms"][name] if name != "outside the BLS" else None
        lines.append(f"| {name} | {_ms(served['per_request_ms'][name])} | {_ms(b)} |")
    lines += [
        "",
        "Outside the BLS: the client's end-to-end time less the BLS's own request time (gRPC streaming of the "
        "responses, Triton's handling of the BLS request, the client).",
        "",
        *account_markdown(report["account"], local),
        "",
        f"## One engine step (ServingEngine, demo target, {s['engine_new_tokens']} new tokens per sequence, "
        f"fastest of {s['engine_rounds']} rounds)",
        "",
        "| active sequences | ms per decode step | decode tokens/s | × 1 sequence | step ms × 1 sequence "
        "| generation tokens/s (prefill included) | × 1 sequence |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in report["engine"]:
        lines.append(f"| {row['sequences']} | {_ms(row['decode_step_ms'])} | {row['decode_tokens_per_s']:.0f} | "
                     f"{_ms(row['decode_x_1'])}x | {_ms(row['step_ms_x_1'])}x | "
                     f"{row['generation_tokens_per_s']:.0f} | {_ms(row['generation_x_1'])}x |")
    lines += ["", "| target | measured | verdict |", "|---|---|---|"]
    for t in report["targets"]:
        verdict = "reported" if t["met"] is None else "PASS" if t["met"] else "FAIL"
        lines.append(f"| {t['target']} | {t['measured'] or ''} | {verdict} |")
    m = report["machine"]
    lines += [
        "",
        f"{machine_line(m)}, load average at start {m['loadavg_start']}, at the end {m['loadavg_end']}. Whole "
        f"benchmark: {report['bench_runtime_s']:.0f} s.",
        "",
    ]
    dirty = s.get("uncommitted_specbuild_files")
    if dirty:
        lines[-1:-1] = ["", f"Measured with uncommitted changes to {', '.join(f'`{f}`' for f in dirty)}.", ""]
    return "\n".join(lines)


# -- in-process: the BLS's loop over the backend and engines, no Triton ------------------------------------------
class LocalModel:
    """One LLM model of the repository as its Triton adapter runs it (`triton_models/tensorrt_llm/1/model.py`:
    the engine from the config's gpt_model_path and kv_cache_slots, `llm_backend.Backend` over it), without
    Triton: `call` is what a BLS exec() of that model gets answered."""

    def __init__(self, model_dir: Path) -> None:
        from specbuild.deploy.pbtxt import read_model
        from specbuild.python_models.llm_backend import Backend
        from specbuild.python_models.llm_engine import build_engine

        params, model_config = read_model(model_dir)
        if params.get("draft_len_schedule") or params.get("max_concurrency") or params.get("medusa_choices"):
            raise SystemExit(f"{model_dir}: a schedule or Medusa tree on the LLM model; this script runs neither")
        built = build_engine(params, model_config, model_dir)
        self.engine = built.engine
        self.engine.start()
        self.backend = Backend(built.config, self.engine, log_info=lambda _: None, log_warn=lambda _: None)
        self.declared = frozenset(o["name"] for o in model_config.get("output", []))
        self.info = built.info

    def call(self, inputs: Mapping[str, np.ndarray], outputs: list[str]) -> tuple[dict[str, np.ndarray], int]:
        """The final response's outputs, and the engine forwards the call took."""
        responses: list[Any] = []
        forwards = self.engine.stats.forwards
        job = self.backend.receive(inputs, outputs, responses.append)
        if job is not None:
            self.backend.run(job, timeout=120)
        final = responses[-1]
        if final.error:
            raise RuntimeError(f"{self.backend.config.model_name}: {final.error}")
        return dict(final.outputs or {}), self.engine.stats.forwards - forwards

    def stop(self) -> None:
        self.engine.stop()


class LocalBls:
    """The served BLS's `_speculate` for one row (tensorrt_llm_bls/1/model.py), in-process: the same preprocessing
    tensors, `RowCalls`, `speculate`, draft length, streamed detokenisation and response parts."""

    def __init__(self, repository: Path) -> None:
        from specbuild.deploy.pbtxt import parameters, read_config
        from specbuild.python_models import preprocess as pre
        from specbuild.python_models.bls_loop import PLAIN_ROUND_PARAMETER, plain_round_most
        from specbuild.runtime.schedule import bls_schedule
        from specbuild.tokenizer import load_tokenizer

        def params(name: str) -> dict[str, str]:
            return parameters(read_config(repository / name / "config.pbtxt"))

        bls, post, prep = params("tensorrt_llm_bls"), params("postprocessing"), params("preprocessing")
        self.draft, self.target = LocalModel(repository / "tensorrt_llm_draft"), LocalModel(repository / "tensorrt_llm")
        self.default_k = int(bls.get("num_draft_tokens") or 0)
        self.max_draft_len = int(bls.get("max_draft_len") or 0)
        self.use_draft_logits = (bls.get("use_draft_logits") or "").lower() in ("1", "true", "yes", "t", "y", "on")
        self.schedule = bls_schedule(bls, self.default_k)
        self.plain_round_max = plain_round_most(bls.get(PLAIN_ROUND_PARAMETER))
        self.tokenizer = load_tokenizer(repository / "postprocessing" / post.get("tokenizer_dir", "tokenizer"))
        self.skip_special_tokens = pre.nvidia_flag(post.get("skip_special_tokens"))
        self.add_special_tokens = pre.nvidia_flag(prep.get("add_special_tokens"))
        self.pre_tokenizer = load_tokenizer(repository / "preprocessing" / prep.get("tokenizer_dir", "tokenizer"))
        self.recorded: list[Call] | None = None  # a list: every call the requests make is kept (triton_floor)

    def k(self) -> int:
        """This round's K at one request in flight (the BLS's draft_len)."""
        from specbuild.runtime.schedule import scheduled_draft_len

        return scheduled_draft_len(self.default_k, self.schedule, 1)

    def preprocess(self, request: Any) -> Any:
        """preprocessing's outputs for a text-only request without word lists (triton_models/preprocessing)."""
        from specbuild.python_models import preprocess as pre
        from specbuild.python_models.bls_calls import Preprocessed

        tok = self.pre_tokenizer
        end, pad = pre.default_ids(tok)
        ids, lengths = pre.encode_prompts(tok, pre.texts(request.tensors["text_input"]),
                                          add_special_tokens=self.add_special_tokens, pad_id=pad)
        return Preprocessed.from_outputs({
            "INPUT_ID": ids, "REQUEST_INPUT_LEN": lengths, "DECODER_INPUT_ID": np.full((1, 1), pad, np.int32),
            "BAD_WORDS_IDS": pre.word_list(tok, None, 1), "STOP_WORDS_IDS": pre.word_list(tok, None, 1),
            "EMBEDDING_BIAS": pre.embedding_bias(tok, None, None, 1),
            "OUT_END_ID": np.full((1, 1), end, np.int32), "OUT_PAD_ID": np.full((1, 1), pad, np.int32)})

    def row_limits(self, request: Any, pre: Any) -> tuple[list[int], int]:
        """The row's prompt tokens and its token budget, as the BLS sizes them (max_tokens within the engine)."""
        max_tokens = int(np.asarray(request.tensors["max_tokens"]).reshape(-1)[0])
        prompt = pre.prompt(0).tolist()
        return prompt, min(max_tokens, self.target.info.max_seq_len - len(prompt) - self.target.info.max_draft_len)

    def row(self, fields: Mapping[str, Any]) -> tuple[list[int], int, int | None]:
        """(prompt tokens, token budget, end id) of a request: what the account's engines decode for it."""
        from specbuild.python_models.bls_calls import BlsRequest

        request = BlsRequest({name: _array(value) for name, value in fields.items()})
        pre = self.preprocess(request)
        prompt, budget = self.row_limits(request, pre)
        return prompt, budget, pre.end_id(0)

    def request(self, fields: Mapping[str, Any], k: int | None = None) -> RequestTiming:
        """One request as the served BLS serves it, every part timed; then the loop replayed without models. With
        `k`, every round drafts k (alone on a server whose full length is at least k)."""
        from specbuild.python_models.bls_calls import BlsRequest, RowCalls, acceptance, loop_outputs
        from specbuild.python_models.bls_loop import Chunk, Proposal, Row, Verdict, speculate
        from specbuild.python_models.detokenize import StreamedText

        start = time.perf_counter()
        request = BlsRequest({name: _array(value) for name, value in fields.items()})
        asked = request.validate(draft_model="tensorrt_llm_draft", default_k=self.default_k,
                                 max_draft_len=self.max_draft_len, decoupled=True)
        draft_len = self.k if k is None else (lambda: k)
        pre = self.preprocess(request)
        preprocessing_s = time.perf_counter() - start
        use_logits = request.flag("use_draft_logits", 0, self.use_draft_logits)
        prompt, budget = self.row_limits(request, pre)
        timing = RequestTiming(0.0, 0.0, preprocessing_s, 0.0, 0.0, 0.0, 0, 0, loop_s=0.0)
        answers: dict[str, list[dict[str, np.ndarray]]] = {"draft": [], "target": []}

        def run(replay: bool) -> tuple[Row, list[str]]:
            calls = RowCalls.build(request, pre, 0, use_draft_logits=use_logits, declared=self.target.declared,
                                   draft_declared=self.draft.declared)
            row = Row(prompt, budget, pre.end_id(0), pre.stop_words(0))
            text = StreamedText(self.tokenizer, self.skip_special_tokens)
            replies: list[str] = []
            draft_answers, target_answers = iter(answers["draft"]), iter(answers["target"])

            def propose(sequence: np.ndarray, n: int) -> Proposal:
                inputs = calls.draft_call(sequence, n)
                if replay:
                    return calls.proposal(next(draft_answers), n)
                begin = time.perf_counter()
                answer, forwards = self.draft.call(inputs, calls.draft_outputs)
                timing.draft_s += time.perf_counter() - begin
                if self.recorded is not None:
                    self.recorded.append(Call(LLM_MODELS[0], inputs, calls.draft_outputs, answer))
                timing.draft_calls += 1
                timing.draft_forwards += forwards
                answers["draft"].append(answer)
                return calls.proposal(answer, n)

            def verify(sequence: np.ndarray, drafts: list[int], logits: Any, out_len: int) -> Verdict:
                inputs = calls.target_call(sequence, drafts, logits, out_len)
                if replay:
                    return calls.verdict(next(target_answers))
                begin = time.perf_counter()
                answer, forwards = self.target.call(inputs, calls.target_outputs)
                timing.target_s += time.perf_counter() - begin
                if self.recorded is not None:
                    self.recorded.append(Call(LLM_MODELS[1], inputs, calls.target_outputs, answer))
                timing.target_calls += 1
                timing.target_forwards += forwards
                answers["target"].append(answer)
                return calls.verdict(answer)

            def on_chunk(chunk: Chunk) -> None:
                words = ""
                if not replay:
                    begin = time.perf_counter()
                    words = text.add(chunk.tokens, chunk.final)
                    timing.detok_s += time.perf_counter() - begin
                    replies.append(words)
                part = {"text_output": np.array([words.encode()], dtype=object)}
                part.update(loop_outputs(calls, kept=chunk.start + len(chunk.tokens), counted=len(chunk.tokens),
                                         prompt_len=len(row.prompt), include_prompt=False, request=request, row=0))
                part.update(acceptance(row.accepted, row.drafted))

            if asked <= 0 or not speculate(row, draft_len, propose, verify, on_chunk=on_chunk,
                                           plain_round_max=self.plain_round_max):
                raise RuntimeError("the in-process request did not speculate to its end")
            return row, replies

        row, replies = run(replay=False)
        timing.serve_s = timing.total_s = time.perf_counter() - start
        timing.accepted, timing.drafted, timing.text = row.accepted, row.drafted, "".join(replies)
        timing.tokens = list(row.generated)
        begin = time.perf_counter()
        run(replay=True)
        timing.loop_s = time.perf_counter() - begin
        return timing

    def stop(self) -> None:
        self.draft.stop()
        self.target.stop()


@dataclass
class EngineTiming:
    """One request decoded by one of the account's engines, in-process: its seconds (submit to result, the engine
    on its own thread as in the repository's model), tokens and target forwards."""

    total_s: float
    tokens: list[int]
    forwards: int


class LocalEngines:
    """The account's two other ways to decode the BLS's requests, in-process on the BLS's own models: `plain`, the
    target alone; `one engine`, the serving engine's draft-target (the same draft as its proposer, the same K,
    drafted and verified inside the target's step, as the llmapi repository serves Draft_Target): no draft request
    and no target request per round, and no plain continuation after a rejection."""

    NAMES = ("plain", "one engine")

    def __init__(self, bls: LocalBls) -> None:
        from specbuild.runtime.proposers import ModelProposer
        from specbuild.runtime.serving import ServingEngine

        info, target, draft = bls.target.info, bls.target.engine.model, bls.draft.engine.model
        self.engines = {}
        for name, extra in zip(self.NAMES, ({}, {"proposer": ModelProposer(draft, bls.k())}), strict=True):
            engine = ServingEngine(target, max_batch=info.max_batch_size, max_seq_len=info.max_seq_len, **extra)
            engine.start()
            self.engines[name] = engine

    def request(self, name: str, prompt: list[int], budget: int, end_id: int | None) -> EngineTiming:
        from specbuild.runtime.serving import EngineRequest

        engine = self.engines[name]
        forwards = engine.stats.forwards
        start = time.perf_counter()
        result = engine.submit(EngineRequest(list(prompt), budget, end_id=end_id)).wait(120)
        return EngineTiming(time.perf_counter() - start, list(result.tokens), engine.stats.forwards - forwards)

    def stop(self) -> None:
        for engine in self.engines.values():
            engine.stop()


def flow_by_k(sweep: Mapping[int, Sequence[RequestTiming]], plain: Sequence[EngineTiming]) -> dict[int, float]:
    """The 1.2 flow's rounds at each K over plain decoding of the same requests, in-process (the sweep's own plain
    passes, interleaved with it)."""
    plain_s = sum(t.total_s for t in plain)
    return {k: plain_s / sum(t.rounds_s for t in timings) for k, timings in sorted(sweep.items())}


def account(bls: Sequence[RequestTiming], engines: Mapping[str, Sequence[EngineTiming]], in_process: Mapping[str, Any],
            k: int, by_k: Mapping[int, float] | None = None, sweep_same: bool = True) -> dict[str, Any]:
    """Why the BLS's rounds make plain decoding only so much faster at one request, in-process (no Triton): the same
    requests decoded plainly, by one engine drafting and verifying in its step, and by the 1.2 flow's rounds (a
    draft request and a target request each, the target decoding on after a rejection); each request at its
    fastest pass. The flow caps the BLS when its rounds stay below serving_bench's SPEEDUP_MIN times plain while
    one engine with the same models and K reaches it: the speculation pays, the flow's requests and continuations
    eat it. `by_k` (flow_by_k: the flow at every K the engine verifies) must stay below it too, so that a K chosen
    for the served flow cannot make the account hold by being a poor K in-process; `sweep_same`: those rounds made
    the plain tokens."""
    plain, one = engines["plain"], engines["one engine"]
    tokens = sum(len(t.tokens) for t in plain)
    seconds = {"plain": sum(t.total_s for t in plain), "one engine": sum(t.total_s for t in one),
               "flow": sum(t.rounds_s for t in bls)}
    same = sum(a.tokens == b.tokens == c.tokens for a, b, c in zip(plain, one, bls, strict=True))
    x = {name: seconds["plain"] / s for name, s in seconds.items()}
    plain_token_ms = 1e3 * seconds["plain"] / tokens
    rounds = in_process["rounds"]
    return {
        "k": k, "floor": SPEEDUP_MIN, "requests": len(plain), "tokens": tokens,
        "same_tokens": {"requests": len(plain), "same": same, "all": same == len(plain)},
        "ms_per_request": {name: 1e3 * s / len(plain) for name, s in seconds.items()},
        "ms_per_token": {name: 1e3 * s / tokens for name, s in seconds.items()},
        "x_plain": x,
        "one_engine_tokens_per_forward": tokens / max(1, sum(t.forwards for t in one)),
        "flow_tokens_per_round": tokens / rounds,
        "plain_ms_for_a_rounds_tokens": plain_token_ms * tokens / rounds,
        "continuation_forwards_per_round": in_process["forwards_per_call"]["tensorrt_llm"] - 1,
        "flow_x_plain_by_k": {str(size): ratio for size, ratio in (by_k or {}).items()},
        "holds": bool(same == len(plain) and sweep_same and max([x["flow"], *(by_k or {}).values()]) < SPEEDUP_MIN
                      <= x["one engine"]),
        "summary": summary(x, by_k),
    }


def _array(value: Any) -> np.ndarray:
    """A client field as the BLS receives it ([1, 1]; the types of the BLS's config)."""
    if isinstance(value, str):
        return np.array([[value.encode()]], dtype=object)
    if isinstance(value, bool):
        return np.array([[value]], dtype=np.bool_)
    return np.array([[value]], dtype=np.int32)


# -- served: the instrumented repository on tritonserver -----------------------------------------------------------
def served_request(client: Any, prompt: str, max_tokens: int, log: Path, index: int) -> RequestTiming:
    """One request over gRPC streaming, its BLS record (the `index`-th line of the log) joined with the client's
    time."""
    g = client.generate(prompt, max_tokens, stream=True)
    return RequestTiming.from_bls(_record(log, index), g.latency_s, text=g.text,
                                  accepted=g.accepted_draft_tokens or 0, drafted=g.draft_tokens or 0)


def _record(log: Path, index: int, timeout_s: float = 10.0) -> dict[str, float]:
    """The instrumented BLS's `index`-th line (written just after the request's final response went out, so the
    client may read the log while that line is being written: only lines ended by their newline count)."""
    deadline = time.monotonic() + timeout_s
    while True:
        lines = log.read_text(encoding="utf-8").split("\n")[:-1] if log.is_file() else []
        if len(lines) > index or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    if len(lines) != index + 1:
        raise SystemExit(f"{log}: {len(lines)} BLS records after request {index + 1}")
    return json.loads(lines[index])


# -- the engine's step ---------------------------------------------------------------------------------------------
def engine_run(model: Any, info: Any, prompts: Sequence[list[int]], batch: int, new_tokens: int) -> StepRun:
    """`batch` sequences (the prompts cycled) generated to `new_tokens` each on a fresh engine, stepped here."""
    from specbuild.runtime.serving import EngineRequest, ServingEngine

    engine = ServingEngine(model, max_batch=info.max_batch_size, max_seq_len=info.max_seq_len,
                           max_draft_len=info.max_draft_len)
    got = [0] * batch
    run = StepRun(batch, new_tokens)

    def counter(i: int) -> Callable[[Any], None]:
        def on_update(update: Any) -> None:
            got[i] += len(update.tokens)
        return on_update

    start = time.perf_counter()
    for i in range(batch):
        engine.submit(EngineRequest(list(prompts[i % len(prompts)]), new_tokens, on_update=counter(i)))
    while True:
        started = all(got) and len(engine.active) == batch and not engine.waiting
        before = sum(got)
        begin = time.perf_counter()
        if not engine.step():
            break
        run.step_s.append(time.perf_counter() - begin)
        run.step_tokens.append(sum(got) - before)
        run.decode.append(started and run.step_tokens[-1] == batch)
    run.wall_s = time.perf_counter() - start
    if sum(got) != batch * new_tokens or not any(run.decode):
        raise SystemExit(f"engine run at batch {batch}: {sum(got)} tokens, {sum(run.decode)} decode steps")
    return run


# -- main ------------------------------------------------------------------------------------------------------------
def fastest(passes: Sequence[Sequence[RequestTiming]]) -> list[RequestTiming]:
    """Per request (position in a pass) its fastest pass by round time (the BLS's request less preprocessing):
    damps bursts of other work on a shared machine, as runtime_bench keeps each call's fastest round."""
    return [min(column, key=lambda t: t.rounds_s) for column in zip(*passes, strict=True)]


def assemble(settings: Mapping[str, Any], served_passes: Sequence[list[RequestTiming]], delta: Mapping[str, ModelStats],
             local_passes: Sequence[list[RequestTiming]], engine_passes: Mapping[str, Sequence[list[EngineTiming]]],
             runs: Mapping[int, Sequence[StepRun]], machine: Mapping[str, Any],
             sweep: Mapping[int, Sequence[list[RequestTiming]]] | None = None,
             sweep_plain: Sequence[list[EngineTiming]] | None = None,
             floor: Mapping[str, float] | None = None) -> dict[str, Any]:
    """The report (without its targets): each side's requests, each at its fastest pass, split into the parts;
    Triton's statistics over all measured passes (`delta`), checked against every served request; Triton's floor
    per call (triton_floor.measure_floor); the account (the same requests decoded plainly and by one engine,
    in-process); the engine's table."""
    served_timings, local_timings = fastest(served_passes), fastest(local_passes)
    served, in_process = split(served_timings), split(local_timings)
    engine_timings = {name: _fastest_engine(passes) for name, passes in engine_passes.items()}
    by_k, sweep_same = None, True
    if sweep and sweep_plain:  # the flow at every K, each request at its fastest pass, over the sweep's plain
        plain = _fastest_engine(sweep_plain)
        flows = {k: fastest(passes) for k, passes in sweep.items()}
        by_k = flow_by_k(flows, plain)
        sweep_same = all(t.tokens == p.tokens for timings in flows.values()
                         for t, p in zip(timings, plain, strict=True))
    return {
        "what": "one draft-target round served by tritonserver (instrumented BLS, Triton statistics) and in-process; "
                "one serving-engine step at several batch sizes",
        "settings": dict(settings),
        "served": served,
        "in_process": in_process,
        "served_over_in_process": served["round_ms"] / in_process["round_ms"],
        "triton_per_execution_ms": {name: stats.per_execution_ms() for name, stats in delta.items()},
        "triton_floor_ms": dict(floor or {}),
        "triton_statistics": {name: asdict(stats) for name, stats in delta.items()},
        "triton_counts": counts_agree(delta, [t for p in served_passes for t in p]),
        "same_rounds": same_rounds(served_timings, local_timings),
        "account": account(local_timings, engine_timings, in_process, settings["k"], by_k, sweep_same),
        "passes": {"served_round_ms": [round(split(p)["round_ms"], 3) for p in served_passes],
                   "in_process_round_ms": [round(split(p)["round_ms"], 3) for p in local_passes]},
        "requests": {"served": [asdict(t) for t in served_timings], "in_process": [asdict(t) for t in local_timings]},
        "engine": engine_table(runs),
        "machine": dict(machine),
    }


def _fastest_engine(passes: Sequence[Sequence[EngineTiming]]) -> list[EngineTiming]:
    """Per request its fastest pass (as `fastest`, for the account's engines)."""
    return [min(column, key=lambda t: t.total_s) for column in zip(*passes, strict=True)]


def same_rounds(served: Sequence[RequestTiming], local: Sequence[RequestTiming]) -> dict[str, Any]:
    """Whether both sides made the same requests' rounds: the same text and target calls, request by request."""
    same = sum(a.text == b.text and a.target_calls == b.target_calls for a, b in zip(served, local, strict=False))
    return {"requests": len(served), "same": same, "all": same == len(served) == len(local)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-tokens", type=int, default=48, help="new tokens per request (serving_bench's)")
    parser.add_argument("--passes", type=int, default=5,
                        help="passes over the prompts, served and in-process request by request; per request the "
                             "fastest pass is kept")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 16], help="engine step: active sequences")
    parser.add_argument("--engine-tokens", type=int, default=48, help="engine step: new tokens per sequence")
    parser.add_argument("--engine-rounds", type=int, default=5,
                        help="engine step: rounds per batch size (interleaved); the fastest is kept")
    parser.add_argument("--sweep-passes", type=int, default=3,
                        help="passes of the in-process flow at every K up to max_draft_len (the account's sweep)")
    parser.add_argument("--no-prepare", action="store_true", help="serve demo/build as it is (no convert/build/deploy)")
    parser.add_argument("--out", type=Path, default=BENCH / "results")
    args = parser.parse_args(argv)

    bench_start = time.perf_counter()
    load_start = [round(x, 2) for x in os.getloadavg()]
    import torch
    import tritonclient.grpc as grpcclient

    from specbuild.bench.client import LLMClient
    from specbuild.bench.load import DEFAULT_PROMPTS
    from specbuild.demo.models import build_demo_models
    from specbuild.serve.server import TritonServer

    threads = 1  # the repository's torch_threads for every model (set_threads)
    torch.set_num_threads(threads)
    build_demo_models(ROOT / "demo" / "models")
    repository = existing(SPEC) if args.no_prepare else prepare(SPEC)
    copy = instrumented_copy(repository, WORK)
    log = copy / "tensorrt_llm_bls" / TIMINGS
    prompts = list(DEFAULT_PROMPTS)

    local = LocalBls(copy)
    engines = LocalEngines(local)
    served_passes: list[list[RequestTiming]] = []
    local_passes: list[list[RequestTiming]] = []
    engine_passes: dict[str, list[list[EngineTiming]]] = {name: [] for name in LocalEngines.NAMES}
    with TritonServer(copy, log_file=WORK / "tritonserver.log") as server, \
            LLMClient(server.grpc_url) as client:
        stats_client = grpcclient.InferenceServerClient(server.grpc_url)
        fields = [client.request_fields(p, args.max_tokens, True, None) for p in prompts]
        rows = [local.row(f) for f in fields]
        local.recorded = []
        for f, row in zip(fields, rows, strict=True):  # warm-up, every side
            client.generate(f["text_input"], args.max_tokens, stream=True)
            local.request(f)
            for name in LocalEngines.NAMES:
                engines.request(name, *row)
        recorded, local.recorded = local.recorded, None
        _record(log, len(fields) - 1)
        log.unlink()
        before = parse_statistics(stats_client.get_inference_statistics(as_json=True))
        for index in range(args.passes):  # request by request: a burst of other work hits both sides alike
            print(f"pass {index + 1}/{args.passes}", flush=True)
            served_passes.append([])
            local_passes.append([])
            for passes in engine_passes.values():
                passes.append([])
            for i, (f, row) in enumerate(zip(fields, rows, strict=True)):
                served_passes[-1].append(served_request(client, f["text_input"], args.max_tokens, log,
                                                        index * len(fields) + i))
                local_passes[-1].append(local.request(f))
                for name, passes in engine_passes.items():
                    passes[-1].append(engines.request(name, *row))
        delta = stats_delta(before, parse_statistics(stats_client.get_inference_statistics(as_json=True)))
        stats_client.close()
    print("Triton's floor: the warm-up's calls replayed to models that answer at once", flush=True)
    decoupled = {m: bool(_config(copy / m).model_transaction_policy.decoupled) for m in LLM_MODELS}
    floor = measure_floor(copy, recorded, decoupled, WORK)
    ks = list(range(1, local.max_draft_len + 1))
    sweep: dict[int, list[list[RequestTiming]]] = {k: [] for k in ks}
    sweep_plain: list[list[EngineTiming]] = []
    from specbuild.bench.load import rotations

    # in-process only: the flow at every K, beside plain decoding; each pass in another order, so that no K always
    # runs first or last (a drift over a pass would otherwise favour one end of the Ks)
    for index, order in enumerate(rotations(ks, args.sweep_passes)):
        print(f"the flow at K {ks[0]}-{ks[-1]}, pass {index + 1}/{args.sweep_passes}", flush=True)
        sweep_plain.append([engines.request("plain", *row) for row in rows])
        for k in order:
            sweep[k].append([local.request(f, k) for f in fields])
    local.stop()
    engines.stop()

    print("engine steps at " + ", ".join(map(str, args.batches)) + " sequences", flush=True)
    from specbuild.contracts.engine_info import read_engine_info, reference_checkpoint
    from specbuild.dtypes import torch_dtype
    from specbuild.runtime.model import CausalLM
    from specbuild.tokenizer import load_tokenizer

    engine_dir = Path(_config(copy / "tensorrt_llm").parameters["gpt_model_path"].string_value)
    info = read_engine_info(engine_dir)
    model = CausalLM.from_checkpoint(reference_checkpoint(engine_dir), dtype=torch_dtype(info.dtype))
    tokenizer = load_tokenizer(copy / "preprocessing" / "tokenizer")
    token_prompts = [tokenizer.encode(p, add_special_tokens=False) for p in prompts]
    engine_run(model, info, token_prompts, 1, args.engine_tokens)  # warm-up
    runs: dict[int, list[StepRun]] = {b: [] for b in args.batches}
    for _ in range(args.engine_rounds):
        for batch in args.batches:
            runs[batch].append(engine_run(model, info, token_prompts, batch, args.engine_tokens))

    settings = {"spec": str(SPEC.relative_to(ROOT)), "k": local.k(), "max_tokens": args.max_tokens,
                "prompts": prompts, "passes": args.passes, "torch_threads": threads, "stream": True, "concurrency": 1,
                "engine_new_tokens": args.engine_tokens, "engine_rounds": args.engine_rounds,
                "batches": args.batches, "sum_tolerance": SUM_TOLERANCE, "prepared": not args.no_prepare}
    # the served path's code, imported by the stubs from the work tree (the deployed BLS too, when prepare wrote it)
    settings["uncommitted_specbuild_files"] = uncommitted("specbuild/python_models", "specbuild/triton_models",
                                                          "specbuild/runtime")
    machine = machine_info(["nvidia-pytriton", "tritonclient", "transformers"], torch_threads=threads,
                           loadavg_start=load_start)
    report = assemble(settings, served_passes, delta, local_passes, engine_passes, runs, machine, sweep, sweep_plain,
                      floor)
    targets = judged(report)
    report["targets"] = [{"target": t.name, "met": t.met, "measured": t.measured} for t in targets]
    report["bench_runtime_s"] = round(time.perf_counter() - bench_start, 1)
    text = markdown(report)
    write_results(args.out, "round-cost", report, text)
    print(text)
    for t in targets:
        print(f"{'REPORTED' if t.met is None else 'PASS' if t.met else 'FAIL'}: {t.name} ({t.measured})", flush=True)
    return finish("round_cost_bench", targets)


def _config(model_dir: Path) -> Any:
    """The model's config.pbtxt as Triton reads it (ModelConfig)."""
    from specbuild.deploy.pbtxt import read_config

    return read_config(model_dir / "config.pbtxt")


if __name__ == "__main__":
    sys.exit(main())
