"""Small hand-written Triton repositories for the server-lifecycle, fault-injection and bench-client tests.

`tinyllm` speaks the deployed LLM protocol (text_input, max_tokens, stream, num_draft_tokens → text_output
and the acceptance outputs) without a real model: it streams `max_tokens` words, several per response like a
speculative decoder that accepts `accept` of each `num_draft_tokens` guesses, with a fixed delay per step (a
larger `step_delay_s` makes a slow stream, to kill things under).
"""

from __future__ import annotations

import os
import stat
import textwrap
import time
from pathlib import Path

import psutil

TINYLLM_CONFIG = """
name: "tinyllm"
backend: "python"
max_batch_size: 8
model_transaction_policy { decoupled: true }
input [
  { name: "text_input", data_type: TYPE_STRING, dims: [1] },
  { name: "max_tokens", data_type: TYPE_INT32, dims: [1] },
  { name: "stream", data_type: TYPE_BOOL, dims: [1], optional: true },
  { name: "num_draft_tokens", data_type: TYPE_INT32, dims: [1], optional: true }
]
output [
  { name: "text_output", data_type: TYPE_STRING, dims: [-1] },
  { name: "num_output_tokens", data_type: TYPE_INT32, dims: [1] },
  { name: "acceptance_rate", data_type: TYPE_FP32, dims: [1] },
  { name: "total_accepted_draft_tokens", data_type: TYPE_INT32, dims: [1] },
  { name: "total_draft_tokens", data_type: TYPE_INT32, dims: [1] }
]
instance_group [{ kind: KIND_CPU, count: 2 }]
parameters { key: "step_delay_s", value: { string_value: "STEP_DELAY" } }
"""

TINYLLM_MODEL = '''
import json
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def _scalar(request, name, default):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return default if tensor is None else tensor.as_numpy().reshape(-1)[0]


class TritonPythonModel:
    """Echo-like LLM: `max_tokens` words; with K draft tokens, accepts K//2 per step (rate 0.5)."""

    def initialize(self, args):
        params = json.loads(args["model_config"])["parameters"]
        self.delay = float(params["step_delay_s"]["string_value"])

    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self._run, args=(request,), daemon=True).start()
        return None

    def _run(self, request):
        sender = request.get_response_sender()
        prompt = _scalar(request, "text_input", b"").decode()
        n = int(_scalar(request, "max_tokens", 8))
        stream = bool(_scalar(request, "stream", False))
        k = int(_scalar(request, "num_draft_tokens", 0))
        words = [f"{prompt.split()[0] if prompt.split() else 'w'}{i}" for i in range(n)]
        per_step = 1 + k // 2
        done, accepted, drafted, chunks = 0, 0, 0, []
        while done < n:
            time.sleep(self.delay)
            take = min(per_step, n - done)
            chunks.append((" " if done else "") + " ".join(words[done:done + take]))
            done += take
            if k:
                accepted += take - 1
                drafted += k
            if stream:
                sender.send(self._response(chunks[-1], take, accepted, drafted))
        if not stream:
            sender.send(self._response("".join(chunks), n, accepted, drafted))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    @staticmethod
    def _response(text, count, accepted, drafted):
        rate = accepted / drafted if drafted else 0.0
        return pb_utils.InferenceResponse([
            pb_utils.Tensor("text_output", np.array([[text.encode()]], dtype=object)),
            pb_utils.Tensor("num_output_tokens", np.array([[count]], dtype=np.int32)),
            pb_utils.Tensor("acceptance_rate", np.array([[rate]], dtype=np.float32)),
            pb_utils.Tensor("total_accepted_draft_tokens", np.array([[accepted]], dtype=np.int32)),
            pb_utils.Tensor("total_draft_tokens", np.array([[drafted]], dtype=np.int32)),
        ])
'''

ENSEMBLE_CONFIG = """
name: "ensemble"
platform: "ensemble"
max_batch_size: 8
input [
  { name: "text_input", data_type: TYPE_STRING, dims: [1] },
  { name: "max_tokens", data_type: TYPE_INT32, dims: [1] },
  { name: "stream", data_type: TYPE_BOOL, dims: [1], optional: true }
]
output [
  { name: "text_output", data_type: TYPE_STRING, dims: [-1] },
  { name: "num_output_tokens", data_type: TYPE_INT32, dims: [1] }
]
ensemble_scheduling {
  step [{
    model_name: "tinyllm"
    model_version: -1
    input_map { key: "text_input" value: "text_input" }
    input_map { key: "max_tokens" value: "max_tokens" }
    input_map { key: "stream" value: "stream" }
    output_map { key: "text_output" value: "text_output" }
    output_map { key: "num_output_tokens" value: "num_output_tokens" }
  }]
}
"""

BROKEN_MODEL = '''
class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("tokenizer_dir /no/such/tokenizer does not exist")

    def execute(self, requests):
        return []
'''

SLOW_MODEL = '''
import time


class TritonPythonModel:
    def initialize(self, args):
        time.sleep(120)  # a large checkpoint loading

    def execute(self, requests):
        return []
'''

BAD_CONFIG = 'name: "badcfg"\nbackend: "python"\nmax_batch_size: eight\n'

CRASHING_STUB = """#!/bin/sh
# A python stub that dies before it talks to the server, as the real one does when the launcher's unquoted
# command line was split at a space: `std::stol` of a path fragment. The python backend runs a
# `triton_python_backend_stub` found in the model's directory instead of its own (StubLauncher::Launch).
[ "$#" -eq 0 ] && exit 1  # the launcher's `system(stub)` probe: 1 is what the real stub answers
echo "terminate called after throwing an instance of 'std::invalid_argument'" >&2
echo "  what():  stol" >&2
ulimit -c 0
kill -ABRT $$
"""


def _model(repo: Path, name: str, config: str, code: str | None) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(textwrap.dedent(config).lstrip())
    if code is not None:
        (repo / name / "1" / "model.py").write_text(textwrap.dedent(code).lstrip())


def tinyllm_repository(repo: Path, *, step_delay_s: float = 0.02, ensemble: bool = True) -> Path:
    """A working repository: the decoupled `tinyllm` and (optionally) an `ensemble` in front of it."""
    _model(repo, "tinyllm", TINYLLM_CONFIG.replace("STEP_DELAY", str(step_delay_s)), TINYLLM_MODEL)
    if ensemble:
        _model(repo, "ensemble", ENSEMBLE_CONFIG, None)
    return repo


def broken_repository(repo: Path) -> Path:
    """tinyllm, a model whose initialize raises (as a wrong tokenizer_dir would) and an ensemble over it."""
    tinyllm_repository(repo, ensemble=False)
    _model(repo, "broken", TINYLLM_CONFIG.replace('"tinyllm"', '"broken"').replace("STEP_DELAY", "0"), BROKEN_MODEL)
    _model(repo, "ensemble", ENSEMBLE_CONFIG.replace('model_name: "tinyllm"', 'model_name: "broken"'), None)
    return repo


def bad_config_repository(repo: Path) -> Path:
    """tinyllm plus a config.pbtxt Triton cannot parse, as an unfilled template variable would leave."""
    tinyllm_repository(repo, ensemble=False)
    _model(repo, "badcfg", BAD_CONFIG, BROKEN_MODEL)
    return repo


def slow_repository(repo: Path) -> Path:
    """A model that takes two minutes to initialize: for interrupting a server while it loads."""
    _model(repo, "slow", TINYLLM_CONFIG.replace('"tinyllm"', '"slow"').replace("STEP_DELAY", "0"), SLOW_MODEL)
    return repo


def crashing_stub_repository(repo: Path) -> Path:
    """tinyllm, and `crashy`, whose python stub aborts before its first message (tritonserver then waits forever)."""
    tinyllm_repository(repo, ensemble=False)
    _model(repo, "crashy", TINYLLM_CONFIG.replace('"tinyllm"', '"crashy"').replace("STEP_DELAY", "0"), TINYLLM_MODEL)
    stub = repo / "crashy" / "triton_python_backend_stub"
    stub.write_text(CRASHING_STUB)
    stub.chmod(stub.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return repo


def shm_regions(prefix: str) -> list[str]:
    """/dev/shm entries whose name starts with `prefix` (a server's python-backend regions)."""
    shm = Path("/dev/shm")
    return sorted(p.name for p in shm.iterdir() if p.name.startswith(prefix)) if shm.is_dir() else []


def serve_regions(serve_pid: int) -> list[str]:
    """The regions of every server a `specbuild serve` process (or this test process) started."""
    return shm_regions(f"specbuild_{serve_pid}_")


def still_running(procs: list[psutil.Process], timeout: float = 0.0) -> list[psutil.Process]:
    """Those of `procs` that are still alive (zombies count as gone) after waiting up to `timeout` seconds."""
    alive = list(procs)
    deadline = time.monotonic() + timeout
    while True:
        alive = [p for p in alive if _alive(p)]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.2)


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def processes_using(path: Path) -> list[psutil.Process]:
    """Processes (tritonserver, python stubs) whose command line mentions `path`: none may outlive a test."""
    needle = str(path)
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if proc.info["pid"] == os.getpid():
            continue
        if any(needle in arg for arg in proc.info["cmdline"] or []):
            found.append(proc)
    return found
