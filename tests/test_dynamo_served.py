"""Real NVIDIA Dynamo 1.6.1 on CPU: `specbuild serve` on a `deploy.target: dynamo` deployment starts Dynamo's
frontend with its KV router and two workers running specbuild's reference serving engine with EAGLE-3 speculation
(the demo target and its demo EAGLE-3 draft, as configs/demo-dynamo.yaml).

One `specbuild serve` process for the module (started as a user starts it, stopped with SIGTERM in the last test):
- /v1/models and /v1/completions, streamed and not: every answer equals that prompt's plain greedy completion by the
  same converted target, computed in-process by the reference runtime (two paths of one model), and the usage
  reports the workers' speculation (draft tokens proposed and accepted);
- requests sharing a long prefix land on one worker, read from the workers' own request logs;
- a worker killed with SIGKILL while requests run: every request then in flight ends within a bound (answered, or
  failed with an HTTP error), and new requests are served by the other worker;
- SIGTERM to `specbuild serve`: it exits 0, every process it started is gone, and its discovery directory too.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from tests.deploy_fixtures import PROMPTS, pipeline_data, write_spec

pytestmark = pytest.mark.slow
MAX_TOKENS = 24
READY_TIMEOUT_S = 240
BOUND_S = 60.0
"""No request may wait longer than this, also while a worker is killed."""


@dataclass
class Served:
    process: subprocess.Popen[str]
    url: str
    model: str
    logs: Path
    output: list[str]


def _deploy(root: Path, models: dict[str, Path], eagle3_draft: Path) -> Path:
    from specbuild.build.llm_api import build_llm_api
    from specbuild.convert.run import convert_spec
    from specbuild.dynamo.write import deploy_dynamo

    data = pipeline_data("dynamo-eagle3", models, "eagle3", root / "out")
    data["draft"] = {"model": str(eagle3_draft)}
    data["speculative"]["num_draft_tokens"] = 4
    data["build"]["flow"] = "pytorch"
    data["deploy"] = {"target": "dynamo", "dynamo": {"workers": 2, "router_mode": "kv"}}
    spec = write_spec(root / "spec", data)
    convert_spec(spec.path)
    build_llm_api(spec)
    return deploy_dynamo(spec).directory


def _plain_greedy(deployment: Path) -> dict[str, str]:
    """Each prompt's plain greedy completion by the converted target the workers load (reference.json)."""
    import torch

    from specbuild.runtime.generation import generate
    from specbuild.runtime.model import CausalLM
    from specbuild.runtime.sequence import StopCriteria
    from specbuild.tokenizer import load_tokenizer

    reference = json.loads((deployment / "reference.json").read_text())
    tokenizer = load_tokenizer(Path(reference["tokenizer"]))
    target = CausalLM.from_checkpoint(Path(reference["checkpoints"]["target"]))
    out = {}
    with torch.inference_mode():
        for prompt in PROMPTS:
            ids = tokenizer.encode(prompt, add_special_tokens=True)
            tokens = generate(target, [ids], stop=StopCriteria(MAX_TOKENS, tokenizer.eos_token_id)).output_ids[0]
            out[prompt] = tokenizer.decode(tokens, skip_special_tokens=True)
    return out


@pytest.fixture(scope="module", name="deployment")
def deployment_fixture(tmp_path_factory: pytest.TempPathFactory, demo_models: dict[str, Path],
                       demo_extra: Any) -> Path:
    return _deploy(tmp_path_factory.mktemp("dynamo"), demo_models, demo_extra("eagle3-draft"))


@pytest.fixture(scope="module", name="served")
def served_fixture(deployment: Path) -> Iterator[Served]:
    env = {**os.environ, "COLUMNS": "300"}
    process = subprocess.Popen([sys.executable, "-m", "specbuild.cli", "serve", str(deployment)],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                               start_new_session=True)
    output: list[str] = []
    ready = threading.Event()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            output.append(line)
            if line.startswith("ready:"):
                ready.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        if not ready.wait(READY_TIMEOUT_S):
            pytest.fail("specbuild serve did not get ready:\n" + "".join(output[-30:]))
        found = re.search(r"ready: (\S+) at (http://\S+)/v1", "".join(output))
        assert found, output
        yield Served(process, found.group(2), found.group(1), deployment.parent / "dynamo-logs", output)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)


def _complete(served: Served, prompt: str, *, stream: bool, max_tokens: int = MAX_TOKENS) -> Any:
    from specbuild.dynamo.client import complete

    return complete(served.url, served.model, prompt, max_tokens, stream=stream, timeout_s=BOUND_S)


def _served_requests(served: Served) -> dict[int, list[dict[str, Any]]]:
    """Worker index -> the requests it served, from each worker's own log."""
    out: dict[int, list[dict[str, Any]]] = {}
    for path in sorted(served.logs.glob("worker-*.requests.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                out.setdefault(record["worker"], []).append(record)
    return out


def test_completions_streamed_and_not_equal_plain_greedy_with_speculation_on(served: Served,
                                                                               deployment: Path) -> None:
    listed = httpx.get(f"{served.url}/v1/models", timeout=30).json()
    assert [entry["id"] for entry in listed["data"]] == [served.model]
    expected = _plain_greedy(deployment)
    drafted = accepted = 0
    for prompt in PROMPTS:
        whole = _complete(served, prompt, stream=False)
        streamed = _complete(served, prompt, stream=True)
        assert whole.text == expected[prompt], prompt
        assert streamed.text == expected[prompt], prompt
        assert len(streamed.chunk_times) > 1  # streamed as it is generated, not in one piece
        for answer in (whole, streamed):
            assert answer.completion_tokens > 0
            drafted += answer.drafted or 0
            accepted += answer.accepted or 0
    assert drafted > 0, "the workers reported no speculation"
    assert 0 <= accepted <= drafted


def test_requests_sharing_a_long_prefix_land_on_one_worker(served: Served) -> None:
    prefix = ("The for statement in Python differs a bit from what you may be used to in C or Pascal. Rather "
              "than always iterating over an arithmetic progression of numbers, or giving the user the ability "
              "to define both the iteration step and halting condition, Python's for statement iterates over ")
    before = {worker: len(lines) for worker, lines in _served_requests(served).items()}
    for suffix in ("a list", "a string", "the items", "any sequence", "a range"):
        _complete(served, prefix + suffix, stream=False, max_tokens=4)
    new = {worker: lines[before.get(worker, 0):] for worker, lines in _served_requests(served).items()}
    counts = {worker: len(lines) for worker, lines in new.items() if lines}
    assert sum(counts.values()) == 5 and len(counts) == 1, counts
    assert all(line["prompt_tokens"] > 40 for lines in new.values() for line in lines)


def test_a_killed_worker_leaves_the_other_serving_and_sigterm_stops_everything(served: Served) -> None:
    root = psutil.Process(served.process.pid)
    family = root.children(recursive=True)
    workers = [p for p in family if "specbuild.dynamo.worker" in " ".join(p.cmdline())]
    frontend = [p for p in family if "dynamo.frontend" in " ".join(p.cmdline())]
    assert len(workers) == 2 and len(frontend) == 1
    discovery = Path(frontend[0].environ()["DYN_FILE_KV"])
    assert discovery.is_dir()

    outcomes: list[tuple[str, float]] = []

    def ask(prompt: str) -> None:
        start = time.monotonic()
        try:
            _complete(served, prompt, stream=True, max_tokens=48)
            outcomes.append(("answered", time.monotonic() - start))
        except httpx.HTTPError as error:  # the client sees an HTTP failure, not a hang
            outcomes.append((type(error).__name__, time.monotonic() - start))

    threads = [threading.Thread(target=ask, args=(f"{PROMPTS[i % len(PROMPTS)]} {i}",)) for i in range(6)]
    for thread in threads:
        thread.start()
    time.sleep(1.0)
    workers[1].kill()  # SIGKILL under load
    for thread in threads:
        thread.join(BOUND_S + 10)
    assert len(outcomes) == 6 and all(seconds <= BOUND_S for _, seconds in outcomes), outcomes
    # New requests after the kill: until Dynamo drops the dead worker's discovery entry (its lease runs out, a
    # few seconds) the router may still pick it, and the client gets a prompt 503; then the other worker serves
    # every request. Both within the bound.
    deadline, served_in_a_row, refusals = time.monotonic() + BOUND_S, 0, []
    while served_in_a_row < 4:
        assert time.monotonic() < deadline, f"no steady service {BOUND_S:.0f} s after the kill ({refusals})"
        start = time.monotonic()
        try:
            answer = _complete(served, PROMPTS[served_in_a_row], stream=False, max_tokens=8)
            assert answer.completion_tokens > 0
            served_in_a_row += 1
        except httpx.HTTPStatusError as error:
            refusals.append((error.response.status_code, round(time.monotonic() - start, 2)))
            assert error.response.status_code == 503 and time.monotonic() - start < 5, refusals
            served_in_a_row = 0
            time.sleep(0.5)

    os.kill(served.process.pid, signal.SIGTERM)
    assert served.process.wait(60) == 0, "".join(served.output[-20:])
    _gone, alive = psutil.wait_procs(family, timeout=10)
    assert not alive, [p.cmdline() for p in alive]
    assert not discovery.exists(), "the discovery directory (and its entries) outlived serve"
