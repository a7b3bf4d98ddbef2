"""Real NVIDIA Dynamo 1.6.1 on CPU: `specbuild serve` on a `deploy.target: dynamo` deployment starts Dynamo's
frontend with its KV router and two workers running specbuild's reference serving engine with EAGLE-3 speculation
(the demo target and its demo EAGLE-3 draft, as configs/demo-dynamo.yaml).

One `specbuild serve` process for the module (started as a user starts it, with no options, stopped with SIGTERM
in the kill test):
- every socket its processes listen on is on loopback (read from the sockets), HTTP on the spec's deploy.http_port;
- /v1/models and /v1/completions, streamed and not: every answer equals that prompt's plain greedy completion by the
  same converted target, computed in-process by the reference runtime (two paths of one model), and the usage
  reports the workers' speculation (draft tokens proposed and accepted);
- the deployment's limits (build.max_input_len, max_seq_len) refused with a 400 naming the limit, /v1/models
  advertising the deployment's window; /v1/chat/completions on a tokenizer without a chat template a 400 naming it;
- a second `specbuild serve` of the deployment refused naming the first's pid, the first's logs untouched;
- requests sharing a long prefix land on one worker, read from the workers' own request logs;
- that worker killed with SIGKILL while it streams: every stream goes on on the other worker (Dynamo's request
  migration) and ends with the text it had before the kill; new requests are served by the other worker;
- SIGTERM to `specbuild serve`: it exits 0, every process it started is gone, and its discovery directory too.

Then, on a second deployment (one worker, a tokenizer with a chat template), the options: the tritonserver-only ones
and a file as the log directory refused by name before anything starts; `--host`, `--http-port` and `--model-name`
honoured (the bind address read from the frontend's socket) and /v1/chat/completions answered with the chat
template applied; `--prompt` answered, and a prompt over the limit refused in the server's words; a worker killed
while the deployment starts reported at once, by name.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
import requests

from specbuild.bench.client import Generation
from specbuild.bench.openai import OpenAIClient, ServerRefused
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


def _deploy(root: Path, models: dict[str, Path], eagle3_draft: Path, workers: int = 2) -> Path:
    from specbuild.build.llm_api import build_llm_api
    from specbuild.convert.run import convert_spec
    from specbuild.dynamo.write import deploy_dynamo
    from specbuild.serve.launch import free_ports

    data = pipeline_data("dynamo-eagle3", models, "eagle3", root / "out")
    data["draft"] = {"model": str(eagle3_draft)}
    data["speculative"]["num_draft_tokens"] = 4
    data["build"]["flow"] = "pytorch"
    data["deploy"] = {"target": "dynamo", "http_port": free_ports(None, 1, 1).http,
                      "dynamo": {"workers": workers, "router_mode": "kv"}}
    spec = write_spec(root / "spec", data)
    convert_spec(spec.path)
    build_llm_api(spec)
    return deploy_dynamo(spec).directory


def _plain_greedy(deployment: Path, chat: bool = False) -> dict[str, str]:
    """Each prompt's plain greedy completion by the converted target the workers load (reference.json); `chat`:
    of the prompt as the one user message, through the tokenizer's chat template."""
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
            ids = (tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                                 return_dict=True)["input_ids"]
                   if chat else tokenizer.encode(prompt, add_special_tokens=True))
            tokens = generate(target, [ids], stop=StopCriteria(MAX_TOKENS, tokenizer.eos_token_id)).output_ids[0]
            out[prompt] = tokenizer.decode(tokens, skip_special_tokens=True)
    return out


@pytest.fixture(scope="module", name="deployment")
def deployment_fixture(tmp_path_factory: pytest.TempPathFactory, demo_models: dict[str, Path],
                       demo_extra: Any) -> Path:
    return _deploy(tmp_path_factory.mktemp("dynamo"), demo_models, demo_extra("eagle3-draft"))


def _serve(deployment: Path, *options: str) -> subprocess.Popen[str]:
    """`specbuild serve DEPLOYMENT OPTIONS` as a user starts it, in a session of its own."""
    return subprocess.Popen([sys.executable, "-m", "specbuild.cli", "serve", str(deployment), *options],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "COLUMNS": "300"}, start_new_session=True)


def _listening(process: subprocess.Popen[str]) -> dict[tuple[str, int], str]:
    """(address, port) -> the command of the process that listens there, over `process` and its descendants:
    where the servers really are, whatever flags they were given."""
    family = [psutil.Process(process.pid), *psutil.Process(process.pid).children(recursive=True)]
    sockets = {}
    for member in family:
        with contextlib.suppress(psutil.NoSuchProcess):
            for connection in member.net_connections(kind="inet"):
                if connection.status == psutil.CONN_LISTEN:
                    sockets[(connection.laddr.ip, connection.laddr.port)] = " ".join(member.cmdline())
    return sockets


def _ready(process: subprocess.Popen[str], deployment: Path) -> Served:
    """Wait until `specbuild serve` says it is ready (its output read on a thread, kept in Served.output)."""
    output: list[str] = []
    ready = threading.Event()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            output.append(line)
            if line.startswith("ready:"):
                ready.set()

    threading.Thread(target=read, daemon=True).start()
    if not ready.wait(READY_TIMEOUT_S):
        pytest.fail("specbuild serve did not get ready:\n" + "".join(output[-30:]))
    found = re.search(r"ready: (\S+) at (http://\S+)/v1", "".join(output))
    assert found, output
    return Served(process, found.group(2), found.group(1), deployment.parent / "dynamo-logs", output)


def _stop(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)


@pytest.fixture(scope="module", name="served")
def served_fixture(deployment: Path) -> Iterator[Served]:
    process = _serve(deployment)
    try:
        yield _ready(process, deployment)
    finally:
        _stop(process)


def _complete(served: Served, prompt: str, *, stream: bool, max_tokens: int = MAX_TOKENS) -> Generation:
    """One greedy completion through specbuild's OpenAI client (what `serve --prompt` and `bench` send)."""
    with OpenAIClient(served.url, served.model, timeout_s=BOUND_S) as client:
        return client.generate(prompt, max_tokens, stream=stream)


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
    listed = requests.get(f"{served.url}/v1/models", timeout=30).json()
    assert [entry["id"] for entry in listed["data"]] == [served.model]
    expected = _plain_greedy(deployment)
    drafted = accepted = 0
    for prompt in PROMPTS:
        whole = _complete(served, prompt, stream=False)
        streamed = _complete(served, prompt, stream=True)
        assert whole.text == expected[prompt], prompt
        assert streamed.text == expected[prompt], prompt
        assert len(streamed.response_times) > 1  # streamed as it is generated, not in one piece
        for answer in (whole, streamed):
            assert answer.reported_tokens
            drafted += answer.draft_tokens or 0
            accepted += answer.accepted_draft_tokens or 0
    assert drafted > 0, "the workers reported no speculation"
    assert 0 <= accepted <= drafted


def test_every_server_listens_on_loopback_and_http_on_the_specs_port(served: Served, deployment: Path) -> None:
    """Dynamo's frontend listens on 0.0.0.0 unless told otherwise; `specbuild serve` puts everything on 127.0.0.1
    (its --host default) and HTTP on the port deploy wrote (deploy.http_port), not a random one."""
    http_port = json.loads((deployment / "launch.json").read_text())["http_port"]
    sockets = _listening(served.process)
    assert sockets and {address for address, _ in sockets} == {"127.0.0.1"}, sockets
    assert "dynamo.frontend" in sockets.get(("127.0.0.1", http_port), ""), (http_port, sockets)
    assert served.url == f"http://127.0.0.1:{http_port}"


def test_the_deployments_limits_are_refused_naming_them_and_advertised(served: Served, deployment: Path) -> None:
    """build.max_input_len and max_seq_len (max_input_len + max_output_len) hold for a client, who reads which
    limit in the 400's message, and /v1/models advertises that window, not the checkpoint's."""
    from specbuild.spec import load_spec

    build = load_spec(next((deployment.parent.parent / "spec").glob("*.yaml"))).build
    listed = requests.get(f"{served.url}/v1/models", timeout=30).json()["data"][0]
    assert listed["context_window"] == build.max_input_len + build.max_output_len
    for prompt, max_tokens, limit in ((" the cat" * build.max_input_len, 4, "max_input_len"),
                                      (PROMPTS[0], build.max_input_len + build.max_output_len, "max_seq_len")):
        with pytest.raises(ServerRefused, match=limit) as refused:
            _complete(served, prompt, stream=False, max_tokens=max_tokens)
        assert refused.value.status == 400
        with pytest.raises(ServerRefused, match=limit):  # streamed: the stream's error event says it
            _complete(served, prompt, stream=True, max_tokens=max_tokens)
    assert _complete(served, PROMPTS[0], stream=False, max_tokens=build.max_output_len).reported_tokens


def test_chat_without_a_chat_template_is_a_400_naming_it(served: Served) -> None:
    """The demo tokenizer has no chat template: chat is refused saying so (it answered 404 with an empty body)."""
    answer = requests.post(f"{served.url}/v1/chat/completions", timeout=BOUND_S,
                           json={"model": served.model, "messages": [{"role": "user", "content": PROMPTS[0]}],
                                 "max_tokens": 4})
    assert answer.status_code == 400, (answer.status_code, answer.text)
    assert "no chat template" in answer.json()["message"]


def test_a_second_serve_is_refused_naming_the_first_and_leaves_its_logs(served: Served, deployment: Path) -> None:
    logs = {path: path.stat().st_size for path in served.logs.glob("*.log")}
    second = _serve(deployment, "--ready-timeout", "30")
    try:
        output, _ = second.communicate(timeout=BOUND_S)
    finally:
        _stop(second)
    assert second.returncode == 1, output
    assert f"pid {served.process.pid}" in output and "Traceback" not in output, output
    assert all(path.stat().st_size >= size for path, size in logs.items()), "the second serve truncated a log"
    assert _complete(served, PROMPTS[0], stream=False, max_tokens=4).reported_tokens


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


def test_a_killed_workers_streams_go_on_on_the_other_and_sigterm_stops_everything(served: Served) -> None:
    root = psutil.Process(served.process.pid)
    family = root.children(recursive=True)
    workers = {int(p.cmdline()[p.cmdline().index("--index") + 1]): p for p in family
               if "specbuild.dynamo.worker" in " ".join(p.cmdline())}
    frontend = [p for p in family if "dynamo.frontend" in " ".join(p.cmdline())]
    assert len(workers) == 2 and len(frontend) == 1
    discovery = Path(frontend[0].environ()["DYN_FILE_KV"])
    assert discovery.is_dir()

    # Prompts sharing a long prefix land on one worker (the test above): each asked once, whole, to learn its
    # answer and which worker serves them; then streamed, and that worker killed while every stream is under way.
    prefix = ("The for statement in Python differs a bit from what you may be used to in C or Pascal. Rather "
              "than always iterating over an arithmetic progression of numbers, or giving the user the ability ")
    prompts = [prefix + suffix for suffix in ("to define", "to halt", "to step", "to iterate")]
    before = {worker: len(lines) for worker, lines in _served_requests(served).items()}
    expected = {prompt: _complete(served, prompt, stream=False, max_tokens=MAX_TOKENS * 2) for prompt in prompts}
    serving = {w: lines[before.get(w, 0):] for w, lines in _served_requests(served).items()
               if len(lines) > before.get(w, 0)}
    assert len(serving) == 1, serving
    victim, asked = serving.popitem()
    lengths = {line["prompt_tokens"] for line in asked}  # each prompt's own length, as its worker counted it
    other_before = len(_served_requests(served).get(1 - victim, []))

    chunks = dict.fromkeys(prompts, 0)
    outcomes: dict[str, tuple[str, float]] = {}

    def stream(prompt: str) -> None:
        start, parts = time.monotonic(), []
        body = {"model": served.model, "prompt": prompt, "max_tokens": MAX_TOKENS * 2, "stream": True}
        try:
            with requests.post(f"{served.url}/v1/completions", json=body, stream=True, timeout=BOUND_S) as response:
                for line in (raw.decode("utf-8") for raw in response.iter_lines()):  # SSE is UTF-8
                    if line.startswith("data:") and line[5:].strip() != "[DONE]":
                        chunk = json.loads(line[5:])
                        parts += [choice.get("text") or "" for choice in chunk.get("choices") or []]
                        parts.append(json.dumps(chunk["error"]) if "error" in chunk else "")
                        chunks[prompt] += 1
            outcomes[prompt] = ("".join(parts), time.monotonic() - start)
        except requests.RequestException as error:
            outcomes[prompt] = (f"{type(error).__name__}: {error}", time.monotonic() - start)

    threads = [threading.Thread(target=stream, args=(prompt,)) for prompt in prompts]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + BOUND_S
    while min(chunks.values()) < 2 and time.monotonic() < deadline and any(t.is_alive() for t in threads):
        time.sleep(0.01)
    workers[victim].kill()  # SIGKILL while every stream is under way
    for thread in threads:
        thread.join(BOUND_S + 10)
    assert {prompt: text for prompt, (text, _) in outcomes.items()} == {p: a.text for p, a in expected.items()}
    assert all(seconds <= BOUND_S for _, seconds in outcomes.values()), outcomes
    migrated = _served_requests(served).get(1 - victim, [])[other_before:]
    assert any(line["prompt_tokens"] not in lengths for line in migrated), "no stream was migrated"  # prompt + so far
    # New requests after the kill: until Dynamo drops the dead worker's discovery entry (its lease runs out, a
    # few seconds) the router may still pick it, and the client gets a prompt 503; then the other worker serves
    # every request. Both within the bound.
    deadline, served_in_a_row, refusals = time.monotonic() + BOUND_S, 0, []
    while served_in_a_row < 4:
        assert time.monotonic() < deadline, f"no steady service {BOUND_S:.0f} s after the kill ({refusals})"
        start = time.monotonic()
        try:
            answer = _complete(served, PROMPTS[served_in_a_row], stream=False, max_tokens=8)
            assert answer.reported_tokens
            served_in_a_row += 1
        except ServerRefused as error:
            refusals.append((error.status, round(time.monotonic() - start, 2)))
            assert error.status == 503 and time.monotonic() - start < 5, refusals
            served_in_a_row = 0
            time.sleep(0.5)

    os.kill(served.process.pid, signal.SIGTERM)
    assert served.process.wait(60) == 0, "".join(served.output[-20:])
    _gone, alive = psutil.wait_procs(family, timeout=10)
    assert not alive, [p.cmdline() for p in alive]
    assert not discovery.exists(), "the discovery directory (and its entries) outlived serve"


CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")


@pytest.fixture(scope="module", name="chat_deployment")
def chat_deployment_fixture(tmp_path_factory: pytest.TempPathFactory, demo_models: dict[str, Path],
                            demo_extra: Any) -> Path:
    """One worker, and a target whose tokenizer has a chat template (a copy of the demo target's, which has none)."""
    root = tmp_path_factory.mktemp("dynamo-chat")
    target = root / "target"
    shutil.copytree(demo_models["target"], target)
    config = json.loads((target / "tokenizer_config.json").read_text())
    (target / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": CHAT_TEMPLATE}))
    return _deploy(root, {**demo_models, "target": target}, demo_extra("eagle3-draft"), workers=1)


def test_tritonserver_options_and_a_file_for_logs_are_refused_by_name(chat_deployment: Path, tmp_path: Path) -> None:
    """Each of them was silently ignored (or, --log-file naming a file, a traceback); now each is one error naming
    it, before anything starts."""
    from typer.testing import CliRunner

    from specbuild.cli import app

    log_file = tmp_path / "serve.log"
    log_file.write_text("kept\n")
    for options, named in ((["--grpc-port", "8001"], "--grpc-port"), (["--metrics-port", "8002"], "--metrics-port"),
                           (["--num-draft-tokens", "2"], "--num-draft-tokens"),
                           (["--log-file", str(log_file)], str(log_file))):
        result = CliRunner().invoke(app, ["serve", str(chat_deployment), "--ready-timeout", "5", *options],
                                    env={"COLUMNS": "300"})
        assert result.exit_code == 1 and isinstance(result.exception, SystemExit), (options, result.output)
        assert named in result.output, result.output
    assert log_file.read_text() == "kept\n"
    assert not (chat_deployment.parent / "dynamo-logs").exists(), "a refused serve started something"


def test_host_port_and_model_name_are_honoured_and_chat_applies_the_template(chat_deployment: Path) -> None:
    from specbuild.serve.launch import free_ports

    host = "127.0.0.2"  # loopback too (127/8), but not the default: where the frontend listens shows the flag works
    port = free_ports(None, 1, 1, host).http
    process = _serve(chat_deployment, "--host", host, "--http-port", str(port), "--model-name", "chatty")
    try:
        served = _ready(process, chat_deployment)
        assert (served.url, served.model) == (f"http://{host}:{port}", "chatty")
        assert "dynamo.frontend" in _listening(process).get((host, port), ""), _listening(process)
        assert [entry["id"] for entry in requests.get(f"{served.url}/v1/models", timeout=30).json()["data"]] == [
            "chatty"]
        expected = _plain_greedy(chat_deployment, chat=True)
        for prompt in PROMPTS[:2]:
            answer = requests.post(f"{served.url}/v1/chat/completions", timeout=BOUND_S,
                                   json={"model": "chatty", "messages": [{"role": "user", "content": prompt}],
                                         "max_tokens": MAX_TOKENS, "temperature": 0})
            assert answer.status_code == 200, answer.text
            assert answer.json()["choices"][0]["message"]["content"] == expected[prompt], prompt
    finally:
        _stop(process)


def test_serve_prompt_prints_the_answer_and_a_refusal_in_the_servers_words(chat_deployment: Path) -> None:
    """`serve DIR --prompt` asks through specbuild's OpenAI client: the greedy answer and the workers' acceptance;
    a prompt over build.max_input_len then ends serve with exit 1 and the server's reason naming the limit, no
    traceback, the prompt shortened in the error (it was repeated whole: thousands of characters before the
    reason)."""
    from specbuild.spec import load_spec

    build = load_spec(next((chat_deployment.parent.parent / "spec").glob("*.yaml"))).build
    expected = _plain_greedy(chat_deployment)[PROMPTS[0]]
    too_long = " the cat" * build.max_input_len
    process = _serve(chat_deployment, "--prompt", PROMPTS[0], "--prompt", too_long, "--max-tokens", str(MAX_TOKENS))
    try:
        output, _ = process.communicate(timeout=READY_TIMEOUT_S)
    finally:
        _stop(process)
    assert process.returncode == 1 and "Traceback" not in output, output[-3000:]
    answered, _, error = output.partition("error:")
    assert expected in answered, (expected, answered)
    assert re.search(r"acceptance_rate [\d.]+, total_accepted_draft_tokens \d+, total_draft_tokens [1-9]", answered), (
        answered)
    assert f"max_input_len {build.max_input_len}" in error, error[-3000:]
    assert error.count("the cat") < 20, error  # the prompt shortened, the reason readable


def test_a_worker_killed_while_starting_is_reported_at_once_by_name(chat_deployment: Path) -> None:
    """As the OOM killer would: SIGKILL to the worker before it is ready ends serve within seconds, exit 1, naming
    the worker and the signal (it waited out the whole --ready-timeout), and nothing it started stays."""
    process = _serve(chat_deployment, "--ready-timeout", "600")
    try:
        deadline, worker = time.monotonic() + BOUND_S, None
        while worker is None and time.monotonic() < deadline:
            family = psutil.Process(process.pid).children(recursive=True)
            worker = next((p for p in family if "specbuild.dynamo.worker" in " ".join(p.cmdline())), None)
            time.sleep(0.05)
        assert worker is not None, "no worker started"
        worker.kill()
        killed = time.monotonic()
        output, _ = process.communicate(timeout=BOUND_S)
        assert time.monotonic() - killed < 15, output
        assert process.returncode == 1 and "Traceback" not in output, output
        assert "worker 0" in output and "SIGKILL" in output, output
        _gone, alive = psutil.wait_procs(family, timeout=10)
        assert not alive, [p.cmdline() for p in alive]
    finally:
        _stop(process)


def test_a_serve_killed_with_sigkill_leaves_nothing_running(chat_deployment: Path) -> None:
    """SIGKILL to `specbuild serve` itself (the OOM killer, a CI job's timeout) cannot run its stop: the frontend
    and the workers, each in a session of its own, used to live on, holding the port and the discovery entries
    (one was found still running 49 minutes after its test run was killed). They die with it now."""
    process = _serve(chat_deployment, "--ready-timeout", "600")
    family: list[psutil.Process] = []
    try:
        _ready(process, chat_deployment)
        family = psutil.Process(process.pid).children(recursive=True)
        assert any("dynamo.frontend" in " ".join(p.cmdline()) for p in family), [p.cmdline() for p in family]
        process.kill()
        process.wait(BOUND_S)
        _gone, alive = psutil.wait_procs(family, timeout=15)
        assert not alive, [p.cmdline() for p in alive]
    finally:
        _stop(process)
        for member in family:  # what a serve that does not take them with it leaves
            with contextlib.suppress(psutil.NoSuchProcess):
                member.kill()
