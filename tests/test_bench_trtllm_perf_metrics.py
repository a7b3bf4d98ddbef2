"""`specbuild bench` reads per-request acceptance from trtllm-serve, which specbuild's trtllm-serve options switch on.

TensorRT-LLM does not install here (no GPU, no CPU wheel), so trtllm-serve is stood in by a small HTTP server that
keeps its books the way NVIDIA's does, from the source (specbuild.contracts.llm_api.SERVE_PERF_METRICS_SOURCE:
tensorrt_llm/serve/openai_server.py @00057725): each finished request appends {request_id, perf_metrics} to a
store of at most perf_metrics_max_requests entries; GET /perf_metrics answers the store and empties it;
`perf_metrics.speculative_decoding` is {acceptance_rate, total_accepted_draft_tokens, total_draft_tokens}, present
only when the request drafted; GET /metrics answers iteration stats as a JSON list (not Prometheus text); /v1/models
lists the model `owned_by: tensorrt_llm` (openai_protocol.py ModelCard). The answers themselves carry no
acceptance, as trtllm-serve's do not.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from specbuild.bench.engine_metrics import PERF_RECORDS, parse_perf_metrics
from specbuild.bench.load import Load, run_load


class StandIn(ThreadingHTTPServer):
    """trtllm-serve's books (module docstring); `drafted(prompt)` says what a request drafts and has accepted."""

    def __init__(self, keep: int) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.store: deque[dict[str, Any]] = deque(maxlen=keep)
        self.lock = threading.Lock()
        self.next_id = 0

    @staticmethod
    def drafted(prompt: str) -> tuple[int, int]:
        """(accepted, drafted) for one request: 0 drafted for prompts of even length (a request that did not
        speculate has no speculative_decoding entry)."""
        return (len(prompt) % 5, 8) if len(prompt) % 2 else (0, 0)

    def finish(self, prompt: str) -> None:
        accepted, drafted = self.drafted(prompt)
        metrics: dict[str, Any] = {"first_iter": 1, "last_iter": 9, "timing_metrics": {}, "kv_cache_metrics": {}}
        if drafted > 0:
            metrics["speculative_decoding"] = {"acceptance_rate": accepted / drafted,
                                               "total_accepted_draft_tokens": accepted,
                                               "total_draft_tokens": drafted}
        with self.lock:
            self.store.append({"request_id": self.next_id, "perf_metrics": metrics})
            self.next_id += 1

    def take(self) -> list[dict[str, Any]]:
        with self.lock:
            taken, self.store = list(self.store), deque(maxlen=self.store.maxlen)
        return taken


class Handler(BaseHTTPRequestHandler):
    server: StandIn

    def log_message(self, *args: object) -> None:
        pass

    def _json(self, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            self._json({"object": "list", "data": [{"id": "target", "object": "model", "created": 0,
                                                    "owned_by": "tensorrt_llm"}]})
        elif self.path == "/perf_metrics":
            self._json(self.server.take())
        elif self.path == "/metrics":
            self._json([{"iter": 3, "numActiveRequests": 0}])
        else:
            self.send_error(404)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        text = " ok" * int(body["max_tokens"])
        usage = {"prompt_tokens": 3, "completion_tokens": int(body["max_tokens"]), "total_tokens": 0}
        if body.get("stream"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            chunks = [{"choices": [{"index": 0, "text": text}]}, {"choices": [], "usage": usage}]
            for chunk in chunks:
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")
        else:
            self._json({"choices": [{"index": 0, "text": text, "finish_reason": "length"}], "usage": usage})
        self.server.finish(body["prompt"])  # trtllm-serve keeps the record once the request has finished


@pytest.fixture
def trtllm_serve() -> Iterator[StandIn]:
    server = StandIn(keep=64)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


PROMPTS = ("one", "three", "a longer prompt", "four", "seven words", "xy")


@pytest.mark.parametrize("stream", [True, False])
def test_bench_reads_trtllm_serves_perf_metrics_of_the_run_alone(trtllm_serve: StandIn, stream: bool) -> None:
    """The acceptance is the sum over the measured requests' records: the warm-up's records, taken before the clock
    starts, are not counted; requests that did not draft add nothing; the run's record count is kept."""
    load = Load(prompts=PROMPTS, max_tokens=4, concurrency=2, stream=stream)
    url = f"http://127.0.0.1:{trtllm_serve.server_address[1]}/v1"
    summary = run_load(url, load, protocol="openai")
    assert summary.errors == 0 and summary.requests == load.total_requests
    sent = [PROMPTS[i % len(PROMPTS)] for i in range(load.total_requests)]
    accepted = sum(trtllm_serve.drafted(p)[0] for p in sent)
    drafted = sum(trtllm_serve.drafted(p)[1] for p in sent)
    assert drafted > 0 and 0 < accepted < drafted
    assert summary.acceptance_reported and summary.acceptance_from == PERF_RECORDS
    assert (summary.accepted_draft_tokens, summary.draft_tokens) == (accepted, drafted)
    assert summary.acceptance_rate == pytest.approx(accepted / drafted)
    assert summary.extra["engine_spec_decode"]["requests"] == load.total_requests
    assert trtllm_serve.take() == []  # the bench took the run's records


def test_a_server_that_keeps_no_records_reports_no_acceptance(trtllm_serve: StandIn) -> None:
    """return_perf_metrics off (or perf_metrics_max_requests 0): /perf_metrics answers [] and the bench says
    acceptance is not reported rather than 0."""
    trtllm_serve.store = deque(maxlen=0)
    summary = run_load(f"http://127.0.0.1:{trtllm_serve.server_address[1]}", Load(prompts=PROMPTS[:2], max_tokens=2),
                       protocol="openai")
    assert summary.errors == 0 and not summary.acceptance_reported and summary.acceptance_rate is None


def test_records_without_drafts_or_of_another_shape() -> None:
    assert parse_perf_metrics([]) is None
    assert parse_perf_metrics([{"request_id": 1, "perf_metrics": {"first_iter": 0}}]) is None
    summed = parse_perf_metrics([
        {"request_id": 1, "perf_metrics": {"speculative_decoding": {"total_accepted_draft_tokens": 2,
                                                                    "total_draft_tokens": 6}}},
        {"request_id": 2, "perf_metrics": {}}])
    assert summed is not None and (summed.accepted_tokens, summed.draft_tokens, summed.requests) == (2, 6, 2)
    with pytest.raises(ValueError, match="not a list"):
        parse_perf_metrics({"error": "x"})


def test_trtllm_serve_options_switch_the_records_on(tmp_path: Path, demo_models: dict[str, Path]) -> None:
    """deploy on the PyTorch flow writes return_perf_metrics and a store larger than a default bench run into
    trtllm-serve's options, and leaves them out of the llmapi model.yaml (which asks per request)."""
    from specbuild.build.llm_api import build_llm_api
    from specbuild.contracts import llm_api
    from specbuild.deploy.llmapi import deploy_llm_api
    from tests.test_llm_api import _spec

    spec = _spec(tmp_path, demo_models, build={"dtype": "float32"})
    build_llm_api(spec)
    deploy_llm_api(spec)
    repository = spec.deploy.model_repository
    options = yaml.safe_load((repository / llm_api.SERVE_OPTIONS).read_text())
    assert options["return_perf_metrics"] is True
    assert options["perf_metrics_max_requests"] >= Load(concurrency=64).total_requests
    model_yaml = yaml.safe_load((repository / llm_api.LLMAPI_MODEL_YAML).read_text())
    assert "return_perf_metrics" not in model_yaml and "perf_metrics_max_requests" not in model_yaml
