"""Fault injection against a real tritonserver: what `specbuild serve` does when things die under it.

Each test kills or breaks something on purpose and asserts what the user sees (the message, the exit code) and
what is left (no tritonserver or python stub of ours, found by the PIDs we started, and no /dev/shm region of
ours). Bounds are generous: these run on two busy cores next to other servers.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from specbuild.bench.client import LLMClient
from specbuild.errors import SpecbuildError
from specbuild.serve.server import TritonServer
from tests.serve_fixtures import (
    crashing_stub_repository,
    processes_using,
    serve_regions,
    shm_regions,
    slow_repository,
    still_running,
    tinyllm_repository,
)

pytestmark = [pytest.mark.slow, pytest.mark.tritonserver]

STREAM_TOKENS = 200
STEP_S = 0.05
"""16 streams of 200 steps of 50 ms: each runs 10 s or more, plenty of time to kill something under them."""


def _specbuild(*args: str) -> list[str]:
    return [sys.executable, "-m", "specbuild.cli", *args]


def _as_a_background_job() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as CI runners and nohup start jobs (see test_serve.py)


@dataclass
class Serving:
    """A `specbuild serve` process that reported ready, and the server family it started."""

    proc: subprocess.Popen[str]
    lines: list[str]
    server: psutil.Process
    family: list[psutil.Process] = field(default_factory=list)

    def url(self, kind: str) -> str:
        return next(line.split()[-1] for line in self.lines if line.strip().startswith(kind))

    def stubs(self) -> list[psutil.Process]:
        return [p for p in self.family if p.pid != self.server.pid]

    def stderr_after_exit(self, timeout: float) -> tuple[int, str]:
        code = self.proc.wait(timeout=timeout)
        assert self.proc.stderr is not None
        return code, self.proc.stderr.read()


def _serve(repo: Path, log: Path, *extra: str) -> Serving:
    proc = subprocess.Popen(_specbuild("serve", str(repo), "--log-file", str(log), *extra),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_as_a_background_job, env={**os.environ, "COLUMNS": "250"})
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if "metrics" in line:
            break
    if not lines or not lines[0].startswith("ready:"):
        proc.kill()
        raise AssertionError("serve never got ready:\n" + "".join(lines) + (proc.stderr.read() if proc.stderr else ""))
    server = next(p for p in psutil.Process(proc.pid).children() if p.name() == "tritonserver")
    return Serving(proc, lines, server, [server, *server.children(recursive=True)])


@pytest.fixture
def cleanup() -> Iterator[list[Serving]]:
    """Whatever a failing test leaves is killed by PID: only processes these tests started."""
    started: list[Serving] = []
    yield started
    for serving in started:
        if serving.proc.poll() is None:
            serving.proc.kill()
            serving.proc.wait()
        for p in still_running(serving.family):
            with contextlib.suppress(psutil.Error):
                p.kill()


def _assert_nothing_left(serving: Serving) -> None:
    left = still_running(serving.family, timeout=30)
    assert left == [], f"left running: {[(p.pid, p.name()) for p in left]}"
    assert serve_regions(serving.proc.pid) == [], "shared memory left in /dev/shm"


def _refused(url: str) -> bool:
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # an http_proxy must not answer for it
    try:
        direct.open(f"{url}/v2/health/ready", timeout=5)
    except (urllib.error.URLError, OSError):
        return True
    return False


def _stream(grpc: str, index: int, results: dict[int, object]) -> None:
    try:
        with LLMClient(grpc, "tinyllm", "grpc", timeout_s=300) as client:
            results[index] = client.generate(f"s{index} go", STREAM_TOKENS).text
    except SpecbuildError as err:
        results[index] = err


def test_a_stub_killed_mid_stream_is_reported_and_everything_stops(tmp_path: Path, cleanup: list[Serving]) -> None:
    repo = tinyllm_repository(tmp_path / "repo", ensemble=False, step_delay_s=STEP_S)
    serving = _serve(repo, tmp_path / "s.log")
    cleanup.append(serving)
    victim = next(p for p in serving.stubs() if p.cmdline()[8] == "tinyllm_0_0")
    results: dict[int, object] = {}
    clients = [threading.Thread(target=_stream, args=(serving.url("gRPC"), i, results)) for i in range(16)]
    for client in clients:
        client.start()
    time.sleep(3)  # every stream is under way (each needs 10 s or more)
    victim.kill()

    code, stderr = serving.stderr_after_exit(timeout=120)
    assert code == 1, stderr
    assert "model 'tinyllm' is broken" in stderr
    assert f"instance tinyllm_0_0 (pid {victim.pid}) was killed by SIGKILL while serving" in stderr
    assert "Stub process is not healthy" in stderr, "the message says what Triton would have done"
    assert "Traceback" not in stderr
    for client in clients:
        client.join(timeout=120)
    assert not any(client.is_alive() for client in clients), "a client hangs on a stream nobody will finish"
    for index, result in results.items():
        words = " ".join(f"s{index}{i}" for i in range(STREAM_TOKENS))
        assert isinstance(result, SpecbuildError) or result == words, f"stream {index} ended short without error"
    assert sum(isinstance(r, SpecbuildError) for r in results.values()) >= 1, "the dead stub's streams failed"
    assert _refused(serving.url("HTTP")), "nothing answers 'ready' after the fault"
    _assert_nothing_left(serving)


def test_a_killed_tritonserver_is_reported_and_its_stubs_go(tmp_path: Path, cleanup: list[Serving]) -> None:
    repo = tinyllm_repository(tmp_path / "repo", ensemble=False)
    serving = _serve(repo, tmp_path / "s.log")
    cleanup.append(serving)
    serving.server.kill()
    code, stderr = serving.stderr_after_exit(timeout=60)
    assert code == 1, stderr
    assert f"tritonserver (pid {serving.server.pid}) was killed by SIGKILL while serving" in stderr
    assert "Traceback" not in stderr
    _assert_nothing_left(serving)


def test_sigkill_of_serve_takes_the_server_along_and_the_next_serve_cleans_up(tmp_path: Path,
                                                                             cleanup: list[Serving]) -> None:
    repo = tinyllm_repository(tmp_path / "repo", ensemble=False)
    first = _serve(repo, tmp_path / "first.log")
    cleanup.append(first)
    assert serve_regions(first.proc.pid), "one region per python stub"
    first.proc.kill()
    first.proc.wait()
    left = still_running(first.family, timeout=30)
    assert left == [], f"the server outlived `serve`: {[(p.pid, p.name()) for p in left]}"

    # The same death, but the stubs killed with the server (a kill -9 of the whole group, the OOM killer): now
    # nothing unlinks the regions, and the next `serve` must, without touching a live server's.
    with TritonServer(repo, log_file=tmp_path / "live.log") as live:  # owned by this test process, alive
        live_regions = shm_regions(live.shm_prefix)
        assert live_regions
        second = _serve(repo, tmp_path / "second.log")
        cleanup.append(second)
        orphaned = serve_regions(second.proc.pid)
        assert orphaned
        second.proc.kill()
        os.killpg(second.server.pid, signal.SIGKILL)
        second.proc.wait()
        assert still_running(second.family, timeout=30) == []
        assert serve_regions(second.proc.pid) == orphaned, "SIGKILLed stubs leave their regions"

        done = subprocess.run(_specbuild("serve", str(repo), "--log-file", str(tmp_path / "third.log"), "--prompt",
                                         "hi there", "--max-tokens", "2"), capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stderr
        assert serve_regions(second.proc.pid) == [], "the next serve removed the dead server's regions"
        assert shm_regions(live.shm_prefix) == live_regions, "a live server's regions are never touched"
        assert "removed shared memory left by dead servers" in (tmp_path / "third.log").read_text()


def test_a_second_signal_while_stopping_kills_at_once_and_still_cleans_up(tmp_path: Path,
                                                                         cleanup: list[Serving]) -> None:
    repo = tinyllm_repository(tmp_path / "repo", ensemble=False, step_delay_s=0.5)
    serving = _serve(repo, tmp_path / "s.log")
    cleanup.append(serving)
    results: dict[int, object] = {}
    clients = [threading.Thread(target=_stream, args=(serving.url("gRPC"), i, results)) for i in range(4)]
    for client in clients:
        client.start()
    time.sleep(2)  # streams of 100 s: a graceful stop would wait its whole grace period for them
    serving.proc.send_signal(signal.SIGTERM)
    time.sleep(1)
    serving.proc.send_signal(signal.SIGTERM)
    code, stderr = serving.stderr_after_exit(timeout=60)
    assert code == 0, stderr
    log = (tmp_path / "s.log").read_text()
    assert "Waiting for in-flight requests" in log, "the first signal started a graceful stop"
    assert "Exit timeout expired" not in log, "the second one did not wait for its end"
    assert "Traceback" not in stderr
    _assert_nothing_left(serving)
    for client in clients:
        client.join(timeout=60)
    assert all(isinstance(r, SpecbuildError) for r in results.values()), "cut streams end with an error"


@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_signal_while_models_load_stops_everything_and_leaves_nothing(tmp_path: Path, stop_signal: int) -> None:
    repo = slow_repository(tmp_path / "repo")
    proc = subprocess.Popen(_specbuild("serve", str(repo), "--log-file", str(tmp_path / "s.log")),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_as_a_background_job)
    family: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 90
        while not any(p.name() == "triton_python_backend_stub" or "triton_python_backend_stub" in " ".join(
                p.cmdline()) for p in family):
            assert time.monotonic() < deadline and proc.poll() is None, "the model never started loading"
            time.sleep(0.2)
            family = [p for p in processes_using(repo) if p.pid != proc.pid]
        assert serve_regions(proc.pid), "the loading stub's region exists"
        started = time.monotonic()
        proc.send_signal(stop_signal)
        code = proc.wait(timeout=90)
        # The model takes 120 s to load; 90 s leaves a loaded machine room and still fails a stop that waits.
        assert time.monotonic() - started < 90, "stopping must not wait for the load to finish"
        assert code == 0, "a requested stop is not a failure"
        assert proc.stderr is not None and "Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for p in still_running(family):
            p.kill()
    assert still_running(family, timeout=30) == []
    assert processes_using(repo) == []
    assert serve_regions(proc.pid) == []


def test_a_repository_path_with_spaces_and_shell_characters_is_served(tmp_path: Path) -> None:
    repo = tinyllm_repository(tmp_path / "my models (v1) $HOME 'x'" / "repo", ensemble=False)
    proc = subprocess.Popen(_specbuild("serve", str(repo), "--prompt", "hello world", "--max-tokens", "3"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "COLUMNS": "200"})
    link_prefix = str(Path(tempfile.gettempdir()) / f"specbuild-serve-{proc.pid}-")
    stdout, stderr = proc.communicate(timeout=180)
    assert proc.returncode == 0, stderr
    assert "gRPC stream (3 responses): hello0 hello1 hello2" in stdout
    assert "HTTP generate: hello0 hello1 hello2" in stdout
    assert processes_using(Path(link_prefix)) == [] and processes_using(repo) == []
    assert not list(Path(tempfile.gettempdir()).glob(f"specbuild-serve-{proc.pid}-*")), "the plain link is removed"
    assert serve_regions(proc.pid) == []
    assert "symlink to" in (repo.parent / "tritonserver.log").read_text()


def test_a_non_ascii_repository_path_is_refused_at_once(tmp_path: Path) -> None:
    repo = tinyllm_repository(tmp_path / "modèles" / "repo", ensemble=False)
    started = time.monotonic()
    done = subprocess.run(_specbuild("serve", str(repo)), capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "250"})
    assert done.returncode == 1
    assert time.monotonic() - started < 60, "refused before any server starts"
    message = " ".join(done.stderr.split())
    assert str(repo) in message and "non-ASCII characters ('è')" in message
    assert "ASCII-only path" in message
    assert "Traceback" not in done.stderr and "UnicodeEncodeError:" not in done.stderr
    assert processes_using(repo) == []
    assert not (repo.parent / "tritonserver.log").exists(), "no server was started"


def test_a_non_ascii_path_parameter_is_refused_naming_the_model_and_parameter(tmp_path: Path) -> None:
    repo = tinyllm_repository(tmp_path / "repo", ensemble=False)
    config = repo / "tinyllm" / "config.pbtxt"
    config.write_text(config.read_text() + 'parameters { key: "tokenizer_dir" value: { string_value: "'
                      f'{tmp_path}/tökenizer" }} }}\n')
    with pytest.raises(SpecbuildError) as caught:
        TritonServer(repo, log_file=tmp_path / "s.log").start()
    assert f"parameter tokenizer_dir is the non-ASCII path {tmp_path}/tökenizer" in caught.value.message
    assert "model 'tinyllm' would fail to load" in caught.value.message
    assert processes_using(repo) == []


def test_a_stub_that_dies_while_starting_is_named_and_not_blamed_on_the_timeout(tmp_path: Path) -> None:
    repo = crashing_stub_repository(tmp_path / "repo")
    started = time.monotonic()
    proc = subprocess.Popen(_specbuild("serve", str(repo), "--log-file", str(tmp_path / "s.log"), "--ready-timeout",
                                       "600"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "COLUMNS": "250"})
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 1
    assert time.monotonic() - started < 240, "reported when the stub dies, not at the ready timeout"
    message = " ".join(stderr.split())
    assert "model 'crashy' failed to load: its python stub (pid" in message
    assert "was killed by SIGABRT before it started" in message
    assert "std::invalid_argument" in message and "stol" in message, "the log lines that say why"
    assert "not ready after" not in message and "ready-timeout" not in message
    assert "Traceback" not in stderr
    assert processes_using(repo) == []
    assert serve_regions(proc.pid) == []
