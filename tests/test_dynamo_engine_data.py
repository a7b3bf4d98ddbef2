"""`specbuild bench`'s OpenAI client reads per-request acceptance through the real NVIDIA Dynamo 1.6.1 frontend's
engine data (`nvext.extra_fields: ["engine_data"]`, ai-dynamo/dynamo PR #8099).

The frontend is Dynamo's own (`python -m dynamo.frontend`, file discovery, loopback); the worker is a Dynamo worker on
the real runtime (tests/dynamo_engine_data_worker.py) that reports acceptance in engine data, in vLLM's
`speculative_decoding` names, only when the request asks for it: no Dynamo 1.6.1 engine worker reports acceptance
there (specbuild.bench.openai's docstring), so this is the path the client reads and the frontend carries, with the
counts the worker derives from the request. Checked:
- the client recognises Dynamo's frontend from /v1/models and asks for engine data; streamed and not, it reads the
  worker's acceptance over the whole answer (the frontend passes it under the response's `nvext.engine_data`);
- a request that does not ask gets none (the frontend adds no engine data unasked): acceptance not reported, which
  `specbuild bench` prints as "not reported" rather than zero.
(Named test_dynamo_*: ai-dynamo's pytest plugins skip test_vllm_*/test_sglang_*/test_trtllm_* files.)
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.dynamo_engine_data_worker import ACCEPTED_PER_STEP, DRAFTS_PER_STEP

pytestmark = pytest.mark.slow
MODEL = "engine-data-probe"
READY_TIMEOUT_S = 120
MAX_TOKENS = 5


@pytest.fixture(scope="module", name="frontend")
def frontend_fixture(tmp_path_factory: pytest.TempPathFactory, demo_models: dict[str, Path]) -> Iterator[str]:
    """Dynamo's frontend and the engine-data worker on loopback; yields the frontend's URL."""
    pytest.importorskip("dynamo.frontend")
    from specbuild.bench.openai import listed_models
    from specbuild.serve.launch import free_ports

    root = tmp_path_factory.mktemp("dynamo-engine-data")
    port = free_ports(None, 1, 1).http
    env = {**os.environ, "DYN_FILE_KV": str(root / "discovery"), "DYN_DISCOVERY_BACKEND": "file",
           "DYN_TCP_RPC_HOST": "127.0.0.1", "DYN_TCP_RESPONSE_STREAM_HOST": "127.0.0.1",
           "DYN_EVENT_PLANE_HOST": "127.0.0.1", "DYN_HTTP_HOST": "127.0.0.1", "HOME": str(root / "home")}
    (root / "home").mkdir()
    logs = [open(root / name, "w", encoding="utf-8") for name in ("frontend.log", "worker.log")]  # noqa: SIM115
    processes = [
        subprocess.Popen([sys.executable, "-m", "dynamo.frontend", "--http-port", str(port), "--router-mode",
                          "round-robin", "--discovery-backend", "file"], env=env, stdout=logs[0],
                         stderr=subprocess.STDOUT),
        subprocess.Popen([sys.executable, "-m", "tests.dynamo_engine_data_worker", str(demo_models["target"]), MODEL],
                         env=env, stdout=logs[1], stderr=subprocess.STDOUT, cwd=Path(__file__).parent.parent)]
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while MODEL not in (listed_models(url) or []):
            dead = [p.args[2] for p in processes if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                pytest.fail(f"Dynamo did not list {MODEL} ({dead or 'timed out'}): "
                            + " | ".join((root / n).read_text()[-1500:] for n in ("frontend.log", "worker.log")))
            time.sleep(0.5)
        yield url
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for log in logs:
            log.close()


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "not-streamed"])
def test_acceptance_is_read_from_dynamos_engine_data(frontend: str, stream: bool) -> None:
    from specbuild.bench.openai import OpenAIClient

    with OpenAIClient(frontend) as client:
        assert client.model.name == MODEL and client.engine_data, "Dynamo's frontend not recognised"
        answer = client.generate("The for statement", MAX_TOKENS, stream=stream)
    assert answer.reported_tokens == MAX_TOKENS
    # The worker's totals over the whole answer, as it derived them from this request.
    assert (answer.accepted_draft_tokens, answer.draft_tokens) == (ACCEPTED_PER_STEP * MAX_TOKENS,
                                                                    DRAFTS_PER_STEP * MAX_TOKENS)
    assert answer.acceptance_rate == pytest.approx(ACCEPTED_PER_STEP / DRAFTS_PER_STEP)


def test_without_asking_no_engine_data_comes_and_acceptance_is_not_reported(frontend: str) -> None:
    from specbuild.bench.client import Generation
    from specbuild.bench.openai import OpenAIClient

    with OpenAIClient(frontend) as client:
        client.engine_data = False  # as a client that does not know the server is Dynamo's
        answer = client.generate("The for statement", MAX_TOKENS)
    assert answer.reported_tokens == MAX_TOKENS and answer.text
    assert answer.draft_tokens is None and answer.acceptance_rate is None
    assert Generation().acceptance_line() == answer.acceptance_line() == "the model returned no acceptance outputs"
