"""Load-aware speculation never trades streaming away, served by a real tritonserver.

The deployed draft-target repository with its BLS's `draft_len_schedule` forced to `{"1": 4, "2": 0}` (speculation
off as soon as two requests are in flight, as the demo's schedule turns it off from 4): concurrent streaming
requests still get their answers in many responses, and their text is the target's greedy text. Before issue 22
the BLS asked the target for the whole rest of the answer in one non-streaming call once K was 0: one response at
the end. The loop-level tests in
tests/test_bls_loop.py switch the schedule off and on again inside one request. And every request gets its first
token from the target alone, as an engine makes it, not after a speculative round.
"""

from __future__ import annotations

import re
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.deploy_fixtures import PROMPTS, Deployed, _server
from tests.test_deploy_serving import grpc_generate

pytestmark = pytest.mark.tritonserver


PLAIN_ROUND_MOST = 2
"""The off server's BLS `plain_round_tokens`: fewer than its default, so rounds that keep to it show it was read."""


@pytest.fixture(scope="module", name="off_server")
def off_server_fixture(deployed: Deployed, tmp_path_factory: pytest.TempPathFactory) -> Any:
    repository = tmp_path_factory.mktemp("schedule-off") / "model_repository"
    shutil.copytree(deployed.repository("draft_target"), repository, symlinks=True)
    config = repository / "tensorrt_llm_bls" / "config.pbtxt"
    text, count = re.subn(r'(key: "draft_len_schedule" value: \{ string_value: )"[^"\\]*(?:\\.[^"\\]*)*"',
                          r'\1"{\\"1\\": 4, \\"2\\": 0}"', config.read_text(encoding="utf-8"))
    assert count == 1, "the BLS config has no draft_len_schedule parameter to force"
    text, count = re.subn(r'(key: "plain_round_tokens" value: \{ string_value: )"[^"]*"', rf'\1"{PLAIN_ROUND_MOST}"',
                          text)
    assert count == 1, "the BLS config has no plain_round_tokens parameter to set"
    config.write_text(text, encoding="utf-8")
    yield from _server(repository, tmp_path_factory.mktemp("logs") / "schedule-off.log")


def _streamed(chunks: list[str]) -> int:
    return len([c for c in chunks if c])


def test_concurrent_streams_stream_when_the_schedule_turns_speculation_off(
        off_server: Any, greedy_reference: dict[str, str]) -> None:
    """Four streaming requests at once: every answer is the target's greedy text in many responses, and every
    response of a round without drafts (the count of drafts did not grow) carries at most the repository's
    `plain_round_tokens` tokens (num_output_tokens, which the BLS counts per response)."""
    prompts = list(PROMPTS[:4])

    def generate(prompt: str) -> tuple[list[str], list[dict[str, Any]]]:
        chunks, outputs = grpc_generate(off_server.grpc_url, "tensorrt_llm_bls", [prompt], stream=True,
                                        return_num_output_tokens=np.array([[True]]))
        return chunks[0], outputs

    with ThreadPoolExecutor(len(prompts)) as pool:
        answers = list(pool.map(generate, prompts))
    plain_sizes = []
    for prompt, (chunks, outputs) in zip(prompts, answers, strict=True):
        assert "".join(chunks) == greedy_reference[prompt], prompt
        assert _streamed(chunks) > 2, f"{prompt!r}: {len(chunks)} responses: not streamed"
        drafts = [int(out["total_draft_tokens"].reshape(-1)[0]) for out in outputs]
        plain_sizes += [int(out["num_output_tokens"].reshape(-1)[0]) for before, out, now
                        in zip([0, *drafts], outputs, drafts, strict=False) if now == before]
    assert plain_sizes and max(plain_sizes) == PLAIN_ROUND_MOST, plain_sizes


def test_a_request_gets_its_first_token_from_the_target_alone_and_drafts_from_its_second_round(
        dt_server: Any) -> None:
    """The demo's BLS (its own schedule), a request alone on the server and one that arrives while it streams: each
    first response counts no draft (the target alone made it, one token, as an engine makes a request's first
    token), and each request drafts from its second round. Both texts are the target's greedy text (the ensemble's,
    on the same server). NVIDIA's loop drafts first: the first response then waits for a draft request and a
    verification (bench/serving_bench.py reports TTFT against plain decoding's)."""
    alone_prompt, late_prompt = PROMPTS[0], PROMPTS[1]
    arrived: dict[str, list[float]] = {"alone": [], "late": []}
    first = threading.Event()

    def on_alone() -> None:
        arrived["alone"].append(time.monotonic())
        first.set()

    def bls(prompt: str, max_tokens: int, on_response: Callable[[], None]) -> list[tuple[str, int]]:
        """Each response's text and the drafts counted so far."""
        chunks, outputs = grpc_generate(dt_server.grpc_url, "tensorrt_llm_bls", [prompt], max_tokens, stream=True,
                                        on_response=on_response)
        return [(text, int(out["total_draft_tokens"].reshape(-1)[0])) for text, out in zip(chunks[0], outputs,
                                                                                             strict=True)]

    with ThreadPoolExecutor(1) as pool:
        alone_future = pool.submit(bls, alone_prompt, 60, on_alone)
        assert first.wait(60), "no first response from the request alone"
        late = bls(late_prompt, 20, lambda: arrived["late"].append(time.monotonic()))
        alone = alone_future.result(timeout=120)
    assert arrived["alone"][-1] > arrived["late"][0], \
        "the first request ended before the second one's first response: no load to test under"
    for prompt, responses, max_tokens in ((alone_prompt, alone, 60), (late_prompt, late, 20)):
        assert responses[0][1] == 0, f"{prompt!r}: the first token comes from the target alone"
        if len(responses) > 1:  # other weights could end the answer at its first token (the end id)
            assert responses[1][1] > 0, f"{prompt!r}: the request drafts from its second round on"
        plain = grpc_generate(dt_server.grpc_url, "ensemble", [prompt], max_tokens, stream=False,
                              exclude_input_in_output=np.array([[True]]))[0][0]
        assert "".join(text for text, _ in responses) == "".join(plain), prompt


def test_a_bad_plain_round_tokens_fails_loading_and_names_the_parameter(deployed: Deployed,
                                                                        tmp_path: Path) -> None:
    """A value that is not a whole number of at least 1 stops the BLS from loading, so the server does not start
    and the error names the model and the parameter, instead of every request failing later."""
    from specbuild.errors import SpecbuildError
    from specbuild.serve.server import TritonServer

    broken = tmp_path / "repo"
    shutil.copytree(deployed.repository("draft_target"), broken, symlinks=True)
    config = broken / "tensorrt_llm_bls" / "config.pbtxt"
    text, count = re.subn(r'(key: "plain_round_tokens" value: \{ string_value: )"[^"]*"', r'\1"0"',
                          config.read_text(encoding="utf-8"))
    assert count == 1
    config.write_text(text, encoding="utf-8")
    with pytest.raises(SpecbuildError) as failure, TritonServer(broken, log_file=tmp_path / "log",
                                                                ready_timeout_s=300):
        pass
    message = str(failure.value)
    assert "tensorrt_llm_bls" in message and "plain_round_tokens" in message and "'0'" in message, message
