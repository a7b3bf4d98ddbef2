"""A real tritonserver on a model repository, for as long as a `with` block (or until `stop()`).

`start()` returns only when every model in the repository is READY; if one fails to load, or the process
dies, or the wait times out, everything is stopped and a `SpecbuildError` names the failing model and quotes
Triton's reason. The server runs in its own process group (so a Ctrl-C in the terminal reaches us, not it) and
`stop()` takes down the server and its `triton_python_backend_stub` children: SIGTERM, a grace period, then
SIGKILL for whatever is left, and the python backend's shared-memory regions in /dev/shm.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import psutil

from specbuild.deploy.server_launch import Ports, free_ports, mpi_command, server_args, tensorrt_models
from specbuild.deploy.triton_env import TritonInstallation, find_tritonserver
from specbuild.errors import SpecbuildError

DEFAULT_READY_TIMEOUT_S = 600.0
"""Loading a speculative repository imports torch/transformers in five stub processes; on two busy cores
that can take minutes, and a broken model is reported as soon as Triton gives up on it, not at the timeout."""

_BIND_FAILURE = re.compile(r"address already in use|failed to start .*(service|endpoint)", re.IGNORECASE)
_running: set[TritonServer] = set()  # strong refs: a dropped, still-running server is stopped at exit


class TritonServer:
    """tritonserver serving `repository`; use as a context manager, or `start()`/`stop()`."""

    def __init__(
        self,
        repository: Path,
        *,
        http_port: int | None = None,
        grpc_port: int | None = None,
        metrics_port: int | None = None,
        log_file: Path | None = None,
        ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S,
        host: str = "127.0.0.1",
        log_verbose: int = 0,
        stop_timeout_s: float = 10.0,
        installation: TritonInstallation | None = None,
    ) -> None:
        self.repository = Path(repository).resolve()
        self._requested = (http_port, grpc_port, metrics_port)
        self.log_file = Path(log_file) if log_file is not None else self.repository.parent / "tritonserver.log"
        self.ready_timeout_s = ready_timeout_s
        self.host = host
        self.log_verbose = log_verbose
        self.stop_timeout_s = stop_timeout_s
        self._installation = installation
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._shm_prefix = f"specbuild_{os.getpid()}_{uuid.uuid4().hex[:8]}_"
        self.ports: Ports | None = None
        self.command: list[str] = []

    # -- public surface -------------------------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def http_url(self) -> str:
        return f"{self.host}:{self._ports().http}"

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self._ports().grpc}"

    @property
    def metrics_url(self) -> str:
        return f"{self.host}:{self._ports().metrics}"

    def __enter__(self) -> TritonServer:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> TritonServer:
        """Launch tritonserver and wait until every model is READY (or raise, with everything stopped)."""
        if self._proc is not None:
            raise RuntimeError("server already started")
        if not self.repository.is_dir():
            raise SpecbuildError(f"{self.repository}: no such model repository")
        installation = self._installation or find_tritonserver()
        auto_ports = all(port is None for port in self._requested)
        for attempt in range(3):
            self._launch(installation)
            try:
                self._wait_until_ready()
                return self
            except _BindFailure as err:
                self._stop(grace_s=0.0)  # it serves nothing and would wait out its exit timeout
                if not auto_ports or attempt == 2:
                    raise SpecbuildError(
                        f"tritonserver could not open its ports ({err})",
                        hint="choose other --http-port/--grpc-port/--metrics-port, or leave them out",
                    ) from None
            except BaseException:
                self.stop()
                raise
        raise AssertionError("unreachable")

    def stop(self) -> None:
        """Stop the server and every process it started; safe to call twice or before start."""
        self._stop(grace_s=self.stop_timeout_s)

    # -- internals ------------------------------------------------------------------------------------------

    def _stop(self, grace_s: float) -> None:
        proc = self._proc
        if proc is None:
            return
        try:
            family = _family(proc.pid)
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM if grace_s > 0 else signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=grace_s or None)
            _reap(proc, family)
        finally:
            self._proc = None
            _running.discard(self)
            if self._log is not None:
                self._log.close()
                self._log = None
            _remove_shared_memory(self._shm_prefix)

    @property
    def running(self) -> bool:
        """Whether the server process is still alive (it can die under us, e.g. killed by the OOM killer)."""
        return self._proc is not None and self._proc.poll() is None

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join(self._log_text().strip().splitlines()[-lines:])

    def models(self) -> list[dict[str, Any]]:
        """The repository index: name, version, state and (for failures) reason of every model."""
        return _post_json(f"http://{self.http_url}/v2/repository/index")

    def _ports(self) -> Ports:
        if self.ports is None:
            raise RuntimeError("server not started: ports are chosen by start()")
        return self.ports

    def _launch(self, installation: TritonInstallation) -> None:
        self.ports = free_ports(*self._requested, host=self.host)
        trt = tensorrt_models(self.repository)
        if trt.world_size > 1:
            mpirun = shutil.which("mpirun")
            if mpirun is None:
                raise SpecbuildError(
                    f"the engines need {trt.world_size} MPI ranks (tp×pp) but mpirun is not on PATH",
                    hint="serve inside the TensorRT-LLM Triton container, which ships OpenMPI",
                )
            self.command = mpi_command(
                installation.binary, self.repository, self.ports, world_size=trt.world_size,
                tensorrt_model_names=trt.names, backend_directory=installation.backend_directory,
                log_verbose=self.log_verbose, mpirun=mpirun,
            )
        else:
            self.command = [str(installation.binary), *server_args(
                self.repository, self.ports, host=self.host, backend_directory=installation.backend_directory,
                shm_prefix=self._shm_prefix, log_verbose=self.log_verbose,
                exit_timeout_s=max(1, int(self.stop_timeout_s) - 2),
            )]
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_file, "ab")  # noqa: SIM115 - lives as long as the server
        self._log.write(f"\n=== specbuild: {' '.join(self.command)}\n".encode())
        self._log.flush()
        self._log_start = self._log.tell()
        try:
            self._proc = subprocess.Popen(
                self.command, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
                env=installation.env, start_new_session=True,
            )
        except OSError as err:
            self._log.close()
            self._log = None
            raise SpecbuildError(f"cannot run {self.command[0]}: {err.strerror}") from None
        _running.add(self)

    def _wait_until_ready(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self.ready_timeout_s
        delay = 0.1
        while True:
            code = self._proc.poll()
            if code is not None:
                log = self._log_text()
                if _BIND_FAILURE.search(log):
                    raise _BindFailure(_last_error_line(log) or "address in use")
                raise SpecbuildError(
                    f"tritonserver exited with code {code} before the repository was ready\n"
                    + _failure_summary(_log_failures(log), log),
                    hint=f"full server log: {self.log_file}",
                )
            if _BIND_FAILURE.search(log := self._log_text()):
                raise _BindFailure(_last_error_line(log))  # the server would linger unloading; stop it now
            index = self._try_index()
            if index is not None:
                failed = [m for m in index if m.get("state") not in ("READY", "LOADING", "UNLOADING")]
                if failed:
                    raise SpecbuildError(
                        _failure_summary(_index_failures(failed, self._log_text()), ""),
                        hint=f"full server log: {self.log_file}",
                    )
                if index and all(m.get("state") == "READY" for m in index) and self._health_ready():
                    return
                if not index:
                    raise SpecbuildError(f"{self.repository}: the repository has no models")
            if time.monotonic() > deadline:
                raise SpecbuildError(
                    f"the repository was not ready after {self.ready_timeout_s:.0f}s",
                    hint=f"see the server log {self.log_file}; raise the ready timeout for large models",
                )
            time.sleep(delay)
            delay = min(delay * 1.5, 1.0)

    def _try_index(self) -> list[dict[str, Any]] | None:
        try:
            return self.models()
        except (OSError, urllib.error.URLError, json.JSONDecodeError):
            return None  # endpoints start only after every model's load has finished

    def _health_ready(self) -> bool:
        try:
            with _DIRECT.open(f"http://{self.http_url}/v2/health/ready", timeout=5) as response:
                return response.status == 200
        except (OSError, urllib.error.URLError):
            return False

    def _log_text(self) -> str:
        """What the server wrote to the log since this start."""
        if self._log is not None:
            self._log.flush()
        try:
            with open(self.log_file, "rb") as handle:
                handle.seek(self._log_start)
                return handle.read().decode("utf-8", errors="replace")
        except OSError:
            return ""


class _BindFailure(Exception):
    """The server could not bind a port (e.g. another process took an auto-picked one)."""


_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))
"""Our own server is local: an http_proxy in the environment must not intercept the readiness checks."""


def _post_json(url: str) -> Any:
    request = urllib.request.Request(url, data=b"{}", method="POST", headers={"Content-Type": "application/json"})
    with _DIRECT.open(request, timeout=2) as response:
        return json.loads(response.read())


def _index_failures(failed: list[dict[str, Any]], log: str) -> list[tuple[str, str]]:
    """(model, reason) for each failed index entry; config errors have no reason in the index, only in the log."""
    from_log = dict(_log_failures(log))
    out = []
    for entry in failed:
        name = str(entry.get("name"))
        reason = entry.get("reason") or from_log.get(name) or f"state {entry.get('state', 'unknown')}"
        out.append((name, str(reason)))
    # Root causes first: an ensemble's failure usually only says that a step it needs is missing.
    return sorted(out, key=lambda item: (item[1].startswith("ensemble step"), item[0]))


_LOG_LINE = re.compile(r'^E\d{4} [\d:.]+\s+\d+ [\w.]+:\d+\] "(.*)"\s*$')
_FAILED_LOAD = re.compile(r"failed to load '([^']+)' version \d+: (.*)", re.DOTALL)
_POLL_FAILED = re.compile(r"Poll failed for model directory '([^']+)': (.*)", re.DOTALL)
_PARSE_ERROR = re.compile(r"(Error parsing text-format .*)$")
_ENSEMBLE_DEPENDS = re.compile(r"ensemble '([^']+)' depends on '([^']+)' which (has no loaded version|[^.]*)")


def _log_failures(log: str) -> list[tuple[str, str]]:
    """(model, reason) pairs from Triton's error lines: load failures and unreadable config.pbtxt files."""
    failures: list[tuple[str, str]] = []
    previous = ""
    for line in log.splitlines():
        match = _LOG_LINE.match(line)
        if match:
            message = match.group(1).replace("\\n", "\n").replace('\\"', '"')
            if m := _FAILED_LOAD.match(message):
                failures.append((m.group(1), m.group(2)))
            elif m := _ENSEMBLE_DEPENDS.search(message):
                failures.append((m.group(1), f"ensemble step '{m.group(2)}' {m.group(3)} (it failed to load)"))
            elif m := _POLL_FAILED.match(message):
                parse = _PARSE_ERROR.search(previous)
                failures.append((m.group(1), m.group(2) + (f" ({parse.group(1)})" if parse else "")))
        previous = line
    return failures


def _last_error_line(log: str) -> str:
    lines = [line for line in log.splitlines() if line.startswith("E") or "error" in line.lower()]
    return lines[-1].strip() if lines else ""


def _failure_summary(failures: list[tuple[str, str]], log: str) -> str:
    if failures:
        parts = [f"model '{name}' failed to load: {reason.strip()}" for name, reason in failures]
        return "\n".join(parts)
    tail = "\n".join(log.strip().splitlines()[-15:])
    return f"last lines of the server log:\n{tail}" if tail else "the server wrote nothing to its log"


def _family(pid: int) -> list[psutil.Process]:
    """The server and its descendants (stubs, MPI ranks), found before signalling so none is orphaned unseen."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def _reap(proc: subprocess.Popen[bytes], family: list[psutil.Process]) -> None:
    """Give the server's children a moment to exit after it, then SIGKILL the group and any stragglers."""
    family = family + [p for p in _family(proc.pid) if p not in family]
    _, alive = psutil.wait_procs([p for p in family if p.pid != proc.pid], timeout=3)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    proc.wait()
    psutil.wait_procs(alive, timeout=5)


def _remove_shared_memory(prefix: str) -> None:
    """Remove python-backend regions a killed stub could not clean up (they would fill /dev/shm over time)."""
    shm = Path("/dev/shm")
    if not shm.is_dir():
        return
    for region in shm.glob(f"{prefix}*"):
        with contextlib.suppress(OSError):
            region.unlink()


@atexit.register
def _stop_all() -> None:
    """Last line of defence: no server outlives the Python process that started it (short of SIGKILL)."""
    for server in list(_running):
        server.stop()
