"""`specbuild bench` against an OpenAI endpoint: the real NVIDIA Dynamo frontend that `specbuild serve` starts for a
Dynamo deployment (tests/test_dynamo_served.py's fixtures: KV router, two reference workers with EAGLE-3 speculation),
at the address serve prints. The bench streams /v1/completions, counts tokens by the server's usage and reads the
acceptance from the final chunk's usage; what it measured is checked against the same server answering the same
prompt whole to a plain HTTP request (two paths of one model, the second not through specbuild's client), not
against fixed figures.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import requests
from typer.testing import CliRunner

from specbuild.cli import app
from tests.deploy_fixtures import PROMPTS
from tests.test_dynamo_served import Served, deployment_fixture, served_fixture  # noqa: F401 (the fixtures)

pytestmark = pytest.mark.slow
MAX_TOKENS = 16
REQUESTS = 3


def _bench(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["bench", *args], env={"COLUMNS": "200"})
    return result.exit_code, result.stdout, result.stderr


def test_bench_measures_the_url_serve_prints_with_the_workers_acceptance(served: Served, tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(PROMPTS[0] + "\n")
    whole = requests.post(f"{served.url}/v1/completions", timeout=60, json={
        "model": served.model, "prompt": PROMPTS[0], "max_tokens": MAX_TOKENS, "temperature": 0}).json()
    text, tokens = whole["choices"][0]["text"], whole["usage"]["completion_tokens"]
    code, stdout, stderr = _bench(f"{served.url}/v1", "--prompts", str(prompts), "--requests", str(REQUESTS),
                                  "--max-tokens", str(MAX_TOKENS), "--json")
    assert code == 0, stderr
    report = json.loads(stdout)
    summary = report["endpoint"][0]
    assert (summary["protocol"], summary["model"]) == ("openai", served.model)
    assert (summary["requests"], summary["errors"]) == (REQUESTS, 0)
    assert summary["sample_answer"] == text  # streamed to the bench = answered whole to a plain request
    assert report["unit"] == "tokens" and summary["tokens_counted_by"] == "usage.completion_tokens"
    assert summary["output_tokens"] == REQUESTS * tokens
    assert summary["tokens_per_response"] < tokens, "streamed in chunks, not in one piece"
    assert summary["acceptance_reported"] and summary["draft_tokens"] > 0
    assert 0 <= summary["accepted_draft_tokens"] <= summary["draft_tokens"]
    assert summary["acceptance_rate"] == pytest.approx(summary["accepted_draft_tokens"] / summary["draft_tokens"])
    assert f"{REQUESTS}/{REQUESTS} requests" in stderr  # progress on stderr, the JSON alone on stdout


def test_bench_tells_the_frontend_from_triton_and_refuses_what_it_cannot_send(served: Served) -> None:
    address = served.url.removeprefix("http://")  # host:port, as a user types it: /v1/models answers
    code, stdout, stderr = _bench(address, "--requests", "1", "--max-tokens", "4", "--json")
    assert code == 0, stderr
    assert json.loads(stdout)["endpoint"][0]["protocol"] == "openai"

    code, _, stderr = _bench(served.url, "--protocol", "http", "--requests", "1")
    assert code == 1 and "string indices" not in stderr
    assert "not a Triton HTTP endpoint" in stderr and "--protocol openai" in stderr

    code, stdout, stderr = _bench(f"{served.url}/v1", "--num-draft-tokens", "2", "--requests", "1")
    assert code == 1 and stdout == ""
    assert "--num-draft-tokens" in stderr and "OpenAI endpoint" in stderr
