"""Load-aware speculation never trades streaming away, served by a real tritonserver.

The deployed draft-target repository with its BLS's `draft_len_schedule` forced to `{"1": 4, "2": 0}` (speculation
off as soon as two requests are in flight, as the demo's schedule turns it off from 4): concurrent streaming
requests still get their answers in many responses, and their text is the target's greedy text. Before issue 22
the BLS asked the target for the whole rest of the answer in one non-streaming call once K was 0: one response at
the end. The loop-level tests in
tests/test_bls_loop.py switch the schedule off and on again inside one request.
"""

from __future__ import annotations

import re
import shutil
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.deploy_fixtures import PROMPTS, Deployed, _server
from tests.test_deploy_serving import grpc_generate

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
