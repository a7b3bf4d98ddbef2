"""Load-aware speculation never trades streaming away, served by a real tritonserver.

The deployed draft-target repository with its BLS's `draft_len_schedule` forced to `{"1": 4, "2": 0}` (speculation
off as soon as two requests are in flight, as the demo's schedule turns it off from 4): concurrent streaming
requests still get their answers in many responses, and their text is the target's greedy text. Before issue 22
the BLS asked the target for the whole rest of the answer in one non-streaming call once K was 0: one response at
the end. The loop-level tests in
tests/test_bls_loop.py switch the schedule off and on again inside one request. And a request that arrives while
another is in flight gets its first token from the target alone, as an engine makes it, not after a speculative
round.
"""

from __future__ import annotations

import re
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.deploy_fixtures import PROMPTS, Deployed, _server
from tests.test_deploy_serving import _input, grpc_generate

pytestmark = pytest.mark.tritonserver


@pytest.fixture(scope="module", name="off_server")
def off_server_fixture(deployed: Deployed, tmp_path_factory: pytest.TempPathFactory) -> Any:
    repository = tmp_path_factory.mktemp("schedule-off") / "model_repository"
    shutil.copytree(deployed.repository("draft_target"), repository, symlinks=True)
    config = repository / "tensorrt_llm_bls" / "config.pbtxt"
    text, count = re.subn(r'(key: "draft_len_schedule" value: \{ string_value: )"[^"\\]*(?:\\.[^"\\]*)*"',
                          r'\1"{\\"1\\": 4, \\"2\\": 0}"', config.read_text(encoding="utf-8"))
    assert count == 1, "the BLS config has no draft_len_schedule parameter to force"
    config.write_text(text, encoding="utf-8")
    yield from _server(repository, tmp_path_factory.mktemp("logs") / "schedule-off.log")


def _streamed(chunks: list[str]) -> int:
    return len([c for c in chunks if c])


def test_concurrent_streams_stream_when_the_schedule_turns_speculation_off(
        off_server: Any, greedy_reference: dict[str, str]) -> None:
    prompts = list(PROMPTS[:4])
    with ThreadPoolExecutor(len(prompts)) as pool:
        answers = list(pool.map(
            lambda p: grpc_generate(off_server.grpc_url, "tensorrt_llm_bls", [p], stream=True)[0][0], prompts))
    for prompt, chunks in zip(prompts, answers, strict=True):
        assert "".join(chunks) == greedy_reference[prompt], prompt
        assert _streamed(chunks) > 2, f"{prompt!r}: {len(chunks)} responses: not streamed"


class _Stream:
    """One streaming BLS request in the background: each response's arrival time, text and draft count."""

    def __init__(self, url: str, prompt: str, max_tokens: int) -> None:
        import threading

        self.responses: list[tuple[float, str, int]] = []
        self.first = threading.Event()
        self.error: str | None = None
        self.done = threading.Event()
        self._client = grpcclient.InferenceServerClient(url)
        self._client.start_stream(callback=self._on_response)
        self._client.async_stream_infer("tensorrt_llm_bls", [
            _input("text_input", np.array([[prompt]], dtype=object)),
            _input("max_tokens", np.array([[max_tokens]], dtype=np.int32)),
            _input("stream", np.array([[True]]))], enable_empty_final_response=True)

    def _on_response(self, result: Any, error: Any) -> None:
        if error is not None:
            self.error = str(error)
            self.done.set()
            return
        text = result.as_numpy("text_output")
        if text is not None:
            drafted = result.as_numpy("total_draft_tokens")
            self.responses.append((time.monotonic(), text.reshape(-1)[0].decode("utf-8"),
                                   -1 if drafted is None else int(drafted.reshape(-1)[0])))
            self.first.set()
        if result.get_response(as_json=True)["parameters"]["triton_final_response"]["bool_param"]:
            self.done.set()

    def wait(self) -> list[tuple[float, str, int]]:
        try:
            assert self.done.wait(120), "no final response within 120 s"
            assert self.error is None, self.error
            return self.responses
        finally:
            self._client.stop_stream()
            self._client.close()


def test_a_request_arriving_under_load_gets_its_first_token_from_the_target_alone(dt_server: Any) -> None:
    """The demo's BLS (its own schedule): a request alone on the server drafts in its first round (its first response
    already counts drafts); one that arrives while another streams gets its first token from the target alone (no
    draft counted yet), as an engine makes a new request's first token, and drafts from its second round. Both
    texts are the target's greedy text (the ensemble's, on the same server). NVIDIA's loop drafts first at every load,
    so under load the first token waited for a draft request and a verification: about twice plain decoding's
    time to first token in bench/results/serving.md."""
    alone_prompt, late_prompt = PROMPTS[0], PROMPTS[1]
    alone = _Stream(dt_server.grpc_url, alone_prompt, 60)
    assert alone.first.wait(60), alone.error
    late = _Stream(dt_server.grpc_url, late_prompt, 20)
    late_responses, alone_responses = late.wait(), alone.wait()
    assert alone_responses[-1][0] > late_responses[0][0], \
        "the first request ended before the second one's first response: no load to test under"
    assert alone_responses[0][2] > 0, "alone on the server, the first round drafts"
    assert late_responses[0][2] == 0, "under load, the first token comes from the target alone"
    assert late_responses[-1][2] > 0, "and the request drafts from its second round on"
    for prompt, responses, max_tokens in ((alone_prompt, alone_responses, 60), (late_prompt, late_responses, 20)):
        plain = grpc_generate(dt_server.grpc_url, "ensemble", [prompt], max_tokens, stream=False,
                              exclude_input_in_output=np.array([[True]]))[0][0]
        assert "".join(text for _, text, _ in responses) == "".join(plain), prompt
