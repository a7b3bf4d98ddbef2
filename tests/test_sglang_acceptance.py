"""`specbuild bench`'s OpenAI client reads SGLang 0.5.23's per-request acceptance (`sglext.spec_tokens_details`),
judged by SGLang's own serving code.

SGLang's own code, run in its virtualenv by tests/engine_checkers/sglang_spec_server.py: the argument resolution of
an NGRAM deployment (`prepare_server_args`, `publish`), http_server.py's `/v1/completions` endpoint function (FastAPI
validates the body the client sends with SGLang's `CompletionRequest`) and `/v1/models` (SGLang's ModelCard/ModelList,
`owned_by: sglang`), `OpenAIServingCompletion.handle_request` (which builds the answer, its `sglext`, and streamed,
the `sglext` chunk before the usage chunk), and the tokenizer manager's `_calculate_spec_decoding_metrics` (which
turns a finished request's verify steps and correct drafts into meta_info's spec fields).
Stood in, because SGLang does not serve on CPU (its scheduler and model runner need CUDA): the GPU queries (as in
tests/engine_checkers/sglang_check.py) and the tokenizer manager's `generate_request`, which yields, for the verify
steps this module plans, the text and meta_info the scheduler and detokenizer would have produced.
Checked:
- the client recognises SGLang from /v1/models and asks for `return_spec_tokens_details`, which SGLang's request
  model accepts; streamed and not, it reads the acceptance SGLang reported (accepted of proposed drafts) and the text;
- a client that does not ask gets no details from SGLang (acceptance not reported), and a server of another owner is
  not sent the field.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.test_engines_judge import CHECKERS, engine_python

pytestmark = pytest.mark.engines
MODEL = "sglang-acceptance-probe"
READY_TIMEOUT_S = 180
DRAFT_LEN = 4
"""K drafts per verify step: SGLang's `--speculative-num-draft-tokens` counts the verified token too (K + 1)."""
STEPS = [{"text": "Speculative", "accepted": 2}, {"text": " decoding", "accepted": 0},
         {"text": " reads", "accepted": 4}, {"text": " ahead.", "accepted": 1}]
"""The verify steps the stand-in answers with: each emits its accepted drafts and the target's own token."""
TOKENS = sum(step["accepted"] + 1 for step in STEPS)


@dataclass
class SGLang:
    url: str
    record: Path

    def last(self, key: str) -> dict[str, Any]:
        """The last record the server wrote with `key` (a body received, or the final meta_info yielded)."""
        lines = [json.loads(line) for line in self.record.read_text(encoding="utf-8").splitlines()]
        return [line for line in lines if key in line][-1]


@pytest.fixture(scope="module", name="sglang")
def sglang_fixture(tmp_path_factory: pytest.TempPathFactory, demo_models: dict[str, Path]) -> Iterator[SGLang]:
    """SGLang's OpenAI serving on loopback (tests/engine_checkers/sglang_spec_server.py), the GPU part stood in."""
    python = engine_python("sglang")  # skips (naming `make test-engines`) without SGLang's virtualenv
    from specbuild.bench.openai import listed_models
    from specbuild.serve.launch import free_ports

    root = tmp_path_factory.mktemp("sglang-acceptance")
    plan = {"model_path": str(demo_models["target"]), "served_model_name": MODEL, "num_draft_tokens": DRAFT_LEN + 1,
            "prompt_tokens": 3, "steps": STEPS}
    (root / "plan.json").write_text(json.dumps(plan), encoding="utf-8")
    port = free_ports(None, 1, 1).http
    with (root / "server.log").open("w", encoding="utf-8") as log:
        process = subprocess.Popen([str(python), str(CHECKERS / "sglang_spec_server.py"), str(root / "plan.json"),
                                    str(port), str(root / "record.jsonl")], stdout=log, stderr=subprocess.STDOUT,
                                   cwd=root, env={**os.environ, "PYTHONPATH": ""})
        url = f"http://127.0.0.1:{port}/v1"
        try:
            deadline = time.monotonic() + READY_TIMEOUT_S
            while MODEL not in (listed_models(url) or []):
                if process.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"SGLang's serving did not list {MODEL} (exit {process.poll()}): "
                                + (root / "server.log").read_text(encoding="utf-8")[-3000:])
                time.sleep(0.5)
            yield SGLang(url, root / "record.jsonl")
        finally:
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "not-streamed"])
def test_acceptance_is_read_from_sglangs_spec_tokens_details(sglang: SGLang, stream: bool) -> None:
    from specbuild.bench.openai import OpenAIClient

    with OpenAIClient(sglang.url) as client:
        assert client.model.name == MODEL and client.spec_details and not client.engine_data, "SGLang not recognised"
        answer = client.generate("The for statement", TOKENS, stream=stream)
    received = sglang.last("body")
    assert received["body"]["return_spec_tokens_details"] is True and received["return_spec_tokens_details"] is True
    reported = sglang.last("meta_info")["meta_info"]
    # SGLang's own counting of what the stand-in planned: every verify step proposes K drafts.
    assert (reported["spec_num_correct_drafts"], reported["spec_num_proposed_drafts"]) == (
        sum(step["accepted"] for step in STEPS), len(STEPS) * DRAFT_LEN)
    assert (answer.accepted_draft_tokens, answer.draft_tokens) == (reported["spec_num_correct_drafts"],
                                                                    reported["spec_num_proposed_drafts"])
    assert answer.acceptance_rate == pytest.approx(reported["spec_accept_rate"])
    assert answer.text == "".join(step["text"] for step in STEPS)
    assert answer.reported_tokens == reported["completion_tokens"] == TOKENS


def test_without_asking_sglang_reports_no_acceptance(sglang: SGLang) -> None:
    from specbuild.bench.openai import OpenAIClient

    with OpenAIClient(sglang.url) as client:
        client.spec_details = False  # as a client that does not know the server is SGLang
        answer = client.generate("The for statement", TOKENS)
    received = sglang.last("body")
    assert "return_spec_tokens_details" not in received["body"] and received["return_spec_tokens_details"] is False
    assert answer.text and answer.draft_tokens is None and answer.acceptance_rate is None


class _Answer:
    status_code = 200

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def raise_for_status(self) -> None:
        pass

    def json(self) -> dict[str, Any]:
        return self.data

    def __enter__(self) -> _Answer:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


class _Server:
    """A session to a server whose one model is owned by `owner`; it keeps the completion bodies it is sent."""

    def __init__(self, owner: str) -> None:
        self.owner, self.bodies = owner, []

    def get(self, url: str, timeout: float) -> _Answer:
        return _Answer({"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": self.owner}]})

    def post(self, url: str, json: dict[str, Any], stream: bool, timeout: float) -> _Answer:
        self.bodies.append(json)
        return _Answer({"choices": [{"index": 0, "text": "x"}], "usage": {"completion_tokens": 1}})

    def close(self) -> None:
        pass


@pytest.mark.parametrize("owner", ["sglang", "vllm", "nvidia", "tensorrt_llm"])
def test_only_sglang_is_asked_for_spec_tokens_details(monkeypatch: pytest.MonkeyPatch, owner: str) -> None:
    from specbuild.bench import openai

    server = _Server(owner)
    monkeypatch.setattr(openai, "_session", lambda: server)
    with openai.OpenAIClient("127.0.0.1:1") as client:
        client.generate("x", 1, stream=False)
    assert server.bodies[0].get("return_spec_tokens_details") is (True if owner == "sglang" else None)


def test_spec_tokens_details_per_choice_are_summed_and_none_proposed_is_not_reported() -> None:
    from specbuild.bench.client import Generation
    from specbuild.bench.openai import _absorb

    answer = Generation()
    _absorb(answer, {"choices": [], "sglext": {"spec_tokens_details": [
        {"spec_num_correct_drafts": 3, "spec_num_proposed_drafts": 8},
        {"spec_num_correct_drafts": 1, "spec_num_proposed_drafts": 4}]}}, 0.0, "test")
    assert (answer.accepted_draft_tokens, answer.draft_tokens, answer.acceptance_rate) == (4, 12, pytest.approx(1 / 3))
    unreported = Generation()
    _absorb(unreported, {"choices": [], "sglext": {"spec_tokens_details": {"spec_num_correct_drafts": 0,
                                                                           "spec_num_proposed_drafts": 0}}}, 0.0, "t")
    assert unreported.draft_tokens is None and unreported.acceptance_rate is None
