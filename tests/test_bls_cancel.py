"""A client's cancellation reaches the models tensorrt_llm_bls calls: the LLM stops generating for a client that
is gone, whether the BLS request streams or not, speculates or not.

Counted in engine work, not wall time: tensorrt_llm logs how many tokens each request it stopped had generated
(one per engine step without speculation), which must be within a few steps of what the client had received when
it cancelled; with speculation, Triton's own inference statistics count the BLS's calls to tensorrt_llm and
tensorrt_llm_draft (one each per round), which must stop growing. Before the BLS passed cancellation on, its
requests ran on to max_tokens (440 steps) after the client had gone. Also here: the Triton-free pieces that do it
(`bls_calls.Cancellation`, `CancelWatch`).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import np_to_triton_dtype

from specbuild.python_models.bls_calls import Cancellation, CancelWatch

MAX_TOKENS = 440
"""Long rows (the demo target allows 512 positions): the work a cancellation must save is hundreds of steps."""
STEPS_AFTER_CANCEL = 32
"""Steps a row may still make once its client cancelled: the BLS asks every cancellation_check_period_ms (100 ms)
and the LLM stops at its next step (about 20 ms per step for four rows on two busy cores)."""
CALLS_AFTER_CANCEL = 40
"""LLM calls the speculating rows may still make: at most a few rounds of a draft and a target call each, plus
one stop command per call in flight, for four rows."""
ROWS = 4  # the engines' max_batch_size: every row runs in the same batch, so their step counts go together
STOPPED = re.compile(r"tensorrt_llm: request '(\w+)' stopped by (.+?) after (\d+) generated tokens")


# -- the pieces, without a server ----------------------------------------------------------------------------


def test_a_cancellation_stops_every_call_in_flight_and_any_call_started_after() -> None:
    cancellation = Cancellation()
    stopped: list[str] = []
    with cancellation.call(lambda: stopped.append("first")), cancellation.call(lambda: stopped.append("second")):
        assert not cancellation.is_set and stopped == []
        cancellation.set()
        cancellation.set()  # once only
        assert cancellation.is_set and stopped == ["first", "second"]
    with cancellation.call(lambda: stopped.append("late")):
        assert stopped[-1] == "late", "a call started after the cancellation is stopped at once"
    cancellation.set()
    assert stopped.count("first") == 1 and stopped.count("late") == 1, "a finished call is not stopped again"


def test_a_canceller_that_fails_does_not_keep_the_others_from_running() -> None:
    warnings: list[str] = []
    cancellation = Cancellation(warn=warnings.append)
    stopped: list[str] = []

    def fails() -> None:
        raise RuntimeError("the LLM is gone")

    with cancellation.call(fails), cancellation.call(lambda: stopped.append("other")):
        cancellation.set()
    assert stopped == ["other"]
    assert warnings == ["cancelling a call failed: the LLM is gone"]


def test_the_watch_sets_the_cancellation_of_the_requests_whose_client_cancelled() -> None:
    watch = CancelWatch(period_s=0.01)
    gone = threading.Event()
    asked = {"stays": 0, "goes": 0}

    def stays() -> bool:
        asked["stays"] += 1
        return False

    def goes() -> bool:
        asked["goes"] += 1
        return gone.is_set()

    try:
        with watch.watching(stays) as staying, watch.watching(goes) as going:
            stopped = threading.Event()
            with going.call(stopped.set):
                gone.set()
                assert stopped.wait(10), "the call in flight of the cancelled request is stopped"
            assert going.is_set and not staying.is_set
        after = dict(asked)
        time.sleep(0.1)
        assert asked == after, "a request no longer being served is no longer asked about"
        with watch.watching(None) as unwatched:
            assert not unwatched.is_set  # a Triton without is_cancelled: nothing to ask
    finally:
        watch.close()


# -- through tritonserver --------------------------------------------------------------------------------------


def _serve(mode: str, tmp_path: Path, models: dict[str, Path]) -> Iterator[Any]:
    """tritonserver on a demo pipeline built for long rows (max_output_len 448), for one test."""
    from specbuild.deploy.repository import deploy_repository
    from specbuild.serve.server import TritonServer
    from tests.deploy_fixtures import convert_and_build, pipeline_data, write_spec

    data = pipeline_data(f"cancel-{mode}", models, mode, tmp_path / "build")
    data["build"].update(max_input_len=32, max_output_len=448)
    spec = write_spec(tmp_path / "specs", data)
    convert_and_build(spec)
    deploy_repository(spec)
    assert spec.deploy.model_repository is not None
    with TritonServer(spec.deploy.model_repository, log_file=tmp_path / "server.log", ready_timeout_s=420) as server:
        yield server


@pytest.fixture
def long_plain_server(demo_models: dict[str, Path], tmp_path: Path) -> Iterator[Any]:
    """No speculation: a decoupled tensorrt_llm that streams, as TensorRT-LLM's inflight_batcher_llm repository."""
    yield from _serve("none", tmp_path, demo_models)


@pytest.fixture
def long_dt_server(demo_models: dict[str, Path], tmp_path: Path) -> Iterator[Any]:
    """Draft-target: tensorrt_llm and tensorrt_llm_draft not decoupled, called once per round by the BLS."""
    yield from _serve("draft_target", tmp_path, demo_models)


def _input(name: str, value: np.ndarray) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(value.shape), np_to_triton_dtype(value.dtype))
    tensor.set_data_from_numpy(value)
    return tensor


class _Rows:
    """Requests to tensorrt_llm_bls, each on a gRPC stream of its own, that run to MAX_TOKENS unless cancelled
    (min_tokens = max_tokens: no end id ends them early); row i streams if `streaming[i]` and speculates with
    `draft_tokens[i]` draft tokens per round (0: no speculation)."""

    def __init__(self, url: str, streaming: list[bool], draft_tokens: list[int]) -> None:
        self.streaming = streaming
        self.responses = [0] * len(streaming)
        self.errors: list[str] = []
        self.cond = threading.Condition()
        self.clients = []
        for i, (stream, k) in enumerate(zip(streaming, draft_tokens, strict=True)):
            client = grpcclient.InferenceServerClient(url)
            client.start_stream(callback=lambda result, error, i=i: self._count(i, error))
            client.async_stream_infer("tensorrt_llm_bls", [
                _input("text_input", np.array([[f"The for statement {i}".encode()]], dtype=object)),
                _input("max_tokens", np.array([[MAX_TOKENS]], dtype=np.int32)),
                _input("min_tokens", np.array([[MAX_TOKENS]], dtype=np.int32)),
                _input("stream", np.array([[stream]], dtype=bool)),
                _input("num_draft_tokens", np.array([[k]], dtype=np.int32)),
            ])
            self.clients.append(client)

    def _count(self, i: int, error: Any) -> None:
        with self.cond:
            self.responses[i] += 1
            if error is not None:
                self.errors.append(str(error))
            self.cond.notify_all()

    def wait_streamed(self, count: int) -> int:
        """Wait until every streaming row has `count` responses; the most any has then."""
        streams = [i for i, stream in enumerate(self.streaming) if stream]
        with self.cond:
            assert self.cond.wait_for(lambda: self.errors or all(self.responses[i] >= count for i in streams),
                                      timeout=180), f"the streams did not start: {self.responses}"
            assert not self.errors, self.errors
            return max(self.responses[i] for i in streams)

    def cancel(self) -> None:
        for client in self.clients:
            client.stop_stream(cancel_requests=True)
            client.close()


def _log_since(server: Any, offset: int) -> str:
    with open(server.log_file, "rb") as handle:
        handle.seek(offset)
        return handle.read().decode("utf-8", errors="replace")


def _stopped_rows(server: Any, offset: int, rows: int, timeout_s: float) -> list[tuple[str, int]]:
    """(what stopped it, generated tokens) of each tensorrt_llm request stopped since `offset`, once there are
    `rows` of them (or what there is after `timeout_s`)."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = [(m.group(2), int(m.group(3))) for m in STOPPED.finditer(_log_since(server, offset))]
        if len(found) >= rows or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def _llm_calls(server: Any) -> int:
    """Requests tensorrt_llm and tensorrt_llm_draft received so far (Triton's inference statistics)."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        total = 0
        for model in ("tensorrt_llm", "tensorrt_llm_draft"):
            stats = client.get_inference_statistics(model, as_json=True)["model_stats"][0]
            total += int(stats.get("inference_count") or 0)
        return total
    finally:
        client.close()


@pytest.mark.tritonserver
def test_cancelled_bls_requests_stop_their_tensorrt_llm_rows_within_a_few_steps(long_plain_server: Any) -> None:
    """Without speculation (NVIDIA's preprocessing -> tensorrt_llm -> postprocessing flow, one decoupled
    tensorrt_llm call per request), two streaming and two non-streaming requests in one batch: once cancelled,
    each tensorrt_llm request stops within STEPS_AFTER_CANCEL steps of what the streams had received (the
    non-streaming rows step alongside them)."""
    server = long_plain_server
    offset = server.log_file.stat().st_size
    rows = _Rows(server.grpc_url, [True, True, False, False], [0, 0, 0, 0])
    received = rows.wait_streamed(5)
    rows.cancel()
    stopped = _stopped_rows(server, offset, ROWS, timeout_s=60)
    assert len(stopped) == ROWS, (f"tensorrt_llm stopped {len(stopped)} of the {ROWS} cancelled requests; the "
                                  f"others ran on towards their {MAX_TOKENS} tokens")
    assert {why for why, _ in stopped} == {"a stop request"}, "the BLS stopped its calls (Triton 2.51 cannot cancel)"
    generated = max(tokens for _, tokens in stopped)
    assert generated - received <= STEPS_AFTER_CANCEL, (
        f"a row generated {generated} tokens, {generated - received} after the cancel ({received} received)")


@pytest.mark.tritonserver
def test_cancelled_speculating_bls_requests_make_no_more_llm_calls(long_dt_server: Any) -> None:
    """Draft-target (non-decoupled LLMs): three rows speculating (one draft and one target call per round), two
    of them streaming, and one not speculating (one whole-row target call): once cancelled, the calls to
    tensorrt_llm and tensorrt_llm_draft stop within CALLS_AFTER_CANCEL and stay stopped, and the whole-row call
    is stopped short of its MAX_TOKENS."""
    server = long_dt_server
    offset = server.log_file.stat().st_size
    rows = _Rows(server.grpc_url, [True, True, False, False], [4, 4, 4, 0])
    rows.wait_streamed(3)
    at_cancel = _llm_calls(server)
    rows.cancel()
    assert _stopped_rows(server, offset, 1, timeout_s=60), "the whole-row call was not stopped"
    settled = _llm_calls(server)
    time.sleep(2)
    later = _llm_calls(server)
    assert settled - at_cancel <= CALLS_AFTER_CANCEL, f"{settled - at_cancel} LLM calls after the cancel"
    assert later == settled, f"the LLM calls went on: {settled} -> {later}"
    stopped = _stopped_rows(server, offset, 1, timeout_s=0)  # also verification calls caught in flight
    assert {why for why, _ in stopped} == {"a stop request"}
    longest = max(tokens for _, tokens in stopped)
    assert longest < MAX_TOKENS // 2, f"the whole-row call ran {longest} of its {MAX_TOKENS} steps"
