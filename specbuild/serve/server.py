"""A real tritonserver on a model repository, for as long as a `with` block (or until `stop()`).

`start()` returns only when every model in the repository is READY; if one fails to load, a python stub dies
while loading, the process dies, or the wait times out, everything is stopped and a `SpecbuildError` names the
failing model and quotes what the server log says. While it serves, `check()` raises the same way when the server
died, a python stub died (Triton 2.51 would keep answering ready and fail that model's requests, see
serve/watch.py) or a model is no longer READY.

Where a load failure is read. The repository index (`POST /v2/repository/index`: each model's state and reason)
answers only once the server's endpoints are up, and tritonserver starts them only after every model's load has
ended; a model stuck LOADING (a stub that died before its first message, an `initialize` that never returns) keeps
it silent for ever. So while the index does not answer, the server log's report of a failure ends the wait, a
second later (`FAILURE_SETTLE_S`, so that what follows from it is reported along), or once the models still loading
have ended too, for at most `FAILURE_OTHERS_S` more (so that every failing model is named). `_log_failures` reads every
form tritonserver 2.51 writes: "failed to load 'X' version N: ...", "failed to load model 'X': ...", an unreadable
config.pbtxt, an ensemble's missing or failed step, a python stub that could not start. Once the index answers it
decides, with the log's reasons for entries that have none and the log's failures of models it does not list (a
model without a version directory).

The server runs in its own process group (so a Ctrl-C in the terminal reaches us, not it) and gets SIGKILL when
the thread that started it dies (PR_SET_PDEATHSIG, set when that is the main thread), so a `kill -9` of this
process takes the server along, and its stubs follow (each stub exits when its parent is gone, pb_stub.cc).
`stop()` takes down the server and its `triton_python_backend_stub` children: SIGTERM, a grace period, then
SIGKILL for whatever is left (at once on a second Ctrl-C), and the python backend's shared-memory regions in
/dev/shm. `start()` first removes regions and plain-path links that dead servers left behind (never a live one's).
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
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import psutil

from specbuild.contracts.llm_api import refuse_incomplete_llmapi
from specbuild.errors import SpecbuildError
from specbuild.serve.launch import (
    Ports,
    check_serving_paths,
    die_with_this_thread,
    free_ports,
    is_plain,
    mpi_command,
    server_args,
    tensorrt_models,
)
from specbuild.serve.triton_env import TritonInstallation, find_tritonserver
from specbuild.serve.watch import (
    LOADING_ZOMBIE_GRACE_S,
    StubDeath,
    StubWatch,
    describe_returncode,
    remove_link_dir,
    remove_stale_link_dirs,
    remove_stale_shared_memory,
)

DEFAULT_READY_TIMEOUT_S = 600.0
"""Loading a speculative repository imports torch/transformers in five stub processes; on two busy cores
that can take minutes, and a broken model is reported as soon as Triton gives up on it, not at the timeout."""

PROBE_INTERVAL_S = 5.0
"""How often `check()` asks the server for its models' states (process and stub checks are on every call)."""
FAILURE_SETTLE_S = 1.0
"""How long a load failure the log reports waits, at least, for the index to answer (the failed model may have been
the last to load) and for the failures that follow from it (an ensemble over it) before it is reported from the log."""
FAILURE_OTHERS_S = 30.0
"""How long past that the report waits while other models are still loading (a python stub that imports torch and
reads its engine takes seconds before its own failure reaches the log, over 20 s on two cores under heavy load), so
that every model that fails is named, not only the first; a model stuck LOADING holds the report this long at most,
not the ready-timeout (tests/test_serve_load_failure.py wants the report within a tenth of a 600 s one)."""
UNANSWERED_LIMIT_S = 60.0
"""A live server that has not answered its repository index for this long is reported as hung."""
KILL_WAIT_S = 30.0
"""How long to wait for a SIGKILLed process to be gone (only a process stuck in the kernel takes longer)."""

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
        failure_others_s: float = FAILURE_OTHERS_S,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.repository = Path(repository).resolve()
        self.env = dict(env or {})
        """Variables added to the server's environment, which its python models see (e.g. SCHEDULE_ENV)."""
        self._requested = (http_port, grpc_port, metrics_port)
        self.log_file = Path(log_file) if log_file is not None else self.repository.parent / "tritonserver.log"
        self.ready_timeout_s = ready_timeout_s
        self.host = host
        self.log_verbose = log_verbose
        self.stop_timeout_s = stop_timeout_s
        self.failure_others_s = failure_others_s
        """`FAILURE_OTHERS_S` for this server (the tests of a model stuck loading wait less)."""
        self._installation = installation
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._log_start = 0
        self._shm_prefix = f"specbuild_{os.getpid()}_{uuid.uuid4().hex[:8]}_"
        self._link_dir: Path | None = None
        self._watch: StubWatch | None = None
        self._next_probe = 0.0
        self._unanswered_since: float | None = None
        self._leftovers: list[str] = []
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

    @property
    def shm_prefix(self) -> str:
        """The python backend's shared-memory region prefix: this server's regions are /dev/shm/<prefix>*."""
        return self._shm_prefix

    @property
    def stub_pids(self) -> dict[int, str]:
        """pid → instance name of the python stubs seen so far (complete once `start()` returned)."""
        return {pid: stub.instance for pid, stub in (self._watch.stubs if self._watch else {}).items()}

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
        refuse_incomplete_llmapi(self.repository, "serve")  # else a generic load failure of tensorrt_llm
        link_repository = check_serving_paths(self.repository)
        installation = self._installation or find_tritonserver()
        self._leftovers = remove_stale_shared_memory()
        for parent in _link_parents():
            remove_stale_link_dirs(parent)
        auto_ports = all(port is None for port in self._requested)
        try:
            repository, backends = self._plain_paths(link_repository, installation)
            for attempt in range(3):
                self._launch(installation, repository, backends)
                try:
                    self._wait_until_ready()
                    return self
                except _BindFailure as err:
                    self._stop_process(grace_s=0.0)  # it serves nothing and would wait out its exit timeout
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
        """Stop the server and every process it started; safe to call twice or before start. Bounded: SIGTERM,
        `stop_timeout_s`, then SIGKILL of the whole family; a KeyboardInterrupt meanwhile skips to the SIGKILL."""
        try:
            self._stop_process(grace_s=self.stop_timeout_s)
        finally:
            if self._link_dir is not None:
                remove_link_dir(self._link_dir)
                self._link_dir = None

    def kill(self) -> None:
        """SIGKILL the server's process group now (safe from a signal handler); `stop()` still cleans up."""
        proc = self._proc
        if proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)

    @property
    def running(self) -> bool:
        """Whether the server process is still alive (it can die under us, e.g. killed by the OOM killer)."""
        return self._proc is not None and self._proc.poll() is None

    def check(self) -> None:
        """Raise SpecbuildError, naming what and quoting the log, if the server died, a python stub died, or a
        model is no longer READY; call it while serving (the process checks are cheap, the HTTP one is paced)."""
        proc = self._proc
        if proc is None or self._watch is None:
            raise RuntimeError("server not started")
        code = proc.poll()
        if code is not None:
            raise SpecbuildError(
                f"tritonserver (pid {proc.pid}) {describe_returncode(code)} while serving"
                + (" (SIGKILL from outside is often the OOM killer: see `dmesg`)" if code == -signal.SIGKILL else "")
                + "\n" + _clues_or_tail(self.log_text()),
                hint=f"full server log: {self.log_file}",
            )
        death = self._watch.poll(loading=False)
        if death is not None:
            raise SpecbuildError(self._serving_death(death), hint=(
                "find out what killed it (`dmesg` shows the OOM killer), then start `specbuild serve` again; a "
                f"supervisor can restart it on this non-zero exit. Full server log: {self.log_file}"))
        now = time.monotonic()
        if now < self._next_probe:
            return
        self._next_probe = now + PROBE_INTERVAL_S
        index = self._try_index(timeout_s=10.0)
        if index is None:
            self._unanswered_since = self._unanswered_since or now
            if now - self._unanswered_since >= UNANSWERED_LIMIT_S:
                raise SpecbuildError(
                    f"tritonserver (pid {proc.pid}) has not answered on http://{self.http_url} for "
                    f"{now - self._unanswered_since:.0f}s\n" + _clues_or_tail(self.log_text()),
                    hint=f"full server log: {self.log_file}",
                )
            return
        self._unanswered_since = None
        unready = [m for m in index if m.get("state") != "READY"]
        if unready:
            raise SpecbuildError(
                "\n".join(f"model '{m.get('name')}' is no longer ready: state {m.get('state')}"
                          + (f" ({m['reason']})" if m.get("reason") else "") for m in unready),
                hint=f"full server log: {self.log_file}",
            )

    def models(self, timeout_s: float = 2.0) -> list[dict[str, Any]]:
        """The repository index: name, version, state and (for failures) reason of every model."""
        return _post_json(f"http://{self.http_url}/v2/repository/index", timeout_s)

    # -- internals ------------------------------------------------------------------------------------------

    def _stop_process(self, grace_s: float) -> None:
        proc = self._proc
        if proc is None:
            return
        interrupted: BaseException | None = None
        try:
            family = _family(proc.pid) + self._known_stubs()
            try:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM if grace_s > 0 else signal.SIGKILL)
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(timeout=grace_s if grace_s > 0 else KILL_WAIT_S)
            except KeyboardInterrupt as err:  # asked again: no more grace
                interrupted = err
            while True:
                try:
                    _reap(proc, family)
                    break
                except KeyboardInterrupt as err:
                    interrupted = err
        finally:
            self._proc = None
            _running.discard(self)
            if self._log is not None:
                self._log.close()
                self._log = None
            _remove_shared_memory(self._shm_prefix)
        if interrupted is not None:
            raise interrupted

    def _known_stubs(self) -> list[psutil.Process]:
        found = []
        for pid, stub in (self._watch.stubs if self._watch else {}).items():
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(pid)
                if proc.create_time() == stub.started:
                    found.append(proc)
        return found

    def _ports(self) -> Ports:
        if self.ports is None:
            raise RuntimeError("server not started: ports are chosen by start()")
        return self.ports

    def _plain_paths(self, link_repository: bool, installation: TritonInstallation) -> tuple[Path, Path | None]:
        """The repository and backend directory as the stubs' bash command line can take them: as they are, or
        symlinks at a plain path (removed by `stop()`, or by the next start if this process is killed)."""
        backends = installation.backend_directory
        link_backends = backends is not None and not is_plain(backends)
        if not (link_repository or link_backends):
            return self.repository, backends
        parent = next((p for p in _link_parents() if os.access(p, os.W_OK)), None)
        if parent is None:
            raise SpecbuildError(
                f"{self.repository if link_repository else backends}: the path has spaces or shell characters, "
                "which Triton's python backend cannot pass to its stub, and no writable temporary directory with "
                "a plain path exists to serve it through a symlink",
                hint="set TMPDIR to a directory whose path has only letters, digits and ._-/ characters",
            )
        self._link_dir = Path(tempfile.mkdtemp(prefix=f"specbuild-serve-{os.getpid()}-", dir=parent))
        repository = self.repository
        if link_repository:
            repository = self._link_dir / "repository"
            repository.symlink_to(self.repository, target_is_directory=True)
        if link_backends:
            assert backends is not None
            (self._link_dir / "backends").symlink_to(backends, target_is_directory=True)
            backends = self._link_dir / "backends"
        return repository, backends

    def _launch(self, installation: TritonInstallation, repository: Path, backends: Path | None) -> None:
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
                installation.binary, repository, self.ports, world_size=trt.world_size,
                tensorrt_model_names=trt.names, shm_prefix=self._shm_prefix, backend_directory=backends,
                log_verbose=self.log_verbose, mpirun=mpirun,
            )
        else:
            self.command = [str(installation.binary), *server_args(
                repository, self.ports, host=self.host, backend_directory=backends,
                shm_prefix=self._shm_prefix, log_verbose=self.log_verbose,
                exit_timeout_s=max(1, int(self.stop_timeout_s) - 2),
            )]
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_file, "ab")  # noqa: SIM115 - lives as long as the server
        if repository != self.repository:
            self._log.write(f"\n=== specbuild: {repository} is a symlink to {self.repository}".encode())
        if self._leftovers:
            self._log.write(f"\n=== specbuild: removed shared memory left by dead servers: "
                            f"{' '.join(self._leftovers)}".encode())
        self._log.write(f"\n=== specbuild: {' '.join(self.command)}\n".encode())
        self._log.flush()
        self._log_start = self._log.tell()
        # Tied to the main thread only: the signal comes when the *thread* that forked exits.
        preexec = die_with_this_thread() if threading.current_thread() is threading.main_thread() else None
        try:
            self._proc = subprocess.Popen(
                self.command, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
                env={**installation.env, **self.env}, start_new_session=True, preexec_fn=preexec,
            )
        except OSError as err:
            self._log.close()
            self._log = None
            raise SpecbuildError(f"cannot run {self.command[0]}: {err.strerror}") from None
        self._watch = StubWatch(self._proc.pid)
        self._next_probe = 0.0
        self._unanswered_since = None
        _running.add(self)

    def _wait_until_ready(self) -> None:
        assert self._proc is not None and self._watch is not None
        deadline = time.monotonic() + self.ready_timeout_s
        delay = 0.1
        unnamed_since: float | None = None
        failed_since: float | None = None
        while True:
            code = self._proc.poll()
            if code is not None:
                log = self.log_text()
                if _BIND_FAILURE.search(log):
                    raise _BindFailure(_last_error_line(log) or "address in use")
                raise SpecbuildError(
                    f"tritonserver {describe_returncode(code)} before the repository was ready\n"
                    + _failure_summary(_ordered(_log_failures(log)), log),
                    hint=f"full server log: {self.log_file}",
                )
            index = self._try_index()
            log = self.log_text()  # (read after the index: it holds at least what the index reflects)
            if _BIND_FAILURE.search(log):
                raise _BindFailure(_last_error_line(log))  # the server would linger unloading; stop it now
            failures = _index_failures(index, log) if index is not None else _ordered(_log_failures(log))
            if failures:
                failed_since = failed_since or time.monotonic()
                now = time.monotonic()
                settled = now - failed_since >= FAILURE_SETTLE_S and (
                    not _still_loading(log) or now - failed_since >= FAILURE_SETTLE_S + self.failure_others_s)
                if index is not None or settled:
                    raise SpecbuildError(_failure_summary(failures, ""), hint=f"full server log: {self.log_file}")
            death = None if failures else self._watch.poll(loading=True, log=log)  # (the log's reasons come first)
            if death is not None:
                # A stub that died at once is not seen alive, so its model is the one left loading once the others
                # are done: give them a moment to be, to name it.
                unnamed_since = unnamed_since or time.monotonic()
                if (death.model is not None or len(_still_loading(log)) <= 1
                        or time.monotonic() - unnamed_since > LOADING_ZOMBIE_GRACE_S):
                    raise SpecbuildError(self._loading_death(death, log), hint=f"full server log: {self.log_file}")
            if index is not None:
                if index and all(m.get("state") == "READY" for m in index) and self._health_ready():
                    self._watch.poll(loading=False)  # every stub is up now: record them all
                    return
                if not index:
                    raise SpecbuildError(f"{self.repository}: the repository has no models")
            if time.monotonic() > deadline:
                raise self._not_ready(log)
            time.sleep(0.1 if failed_since else delay)
            delay = min(delay * 1.5, 1.0)

    def _not_ready(self, log: str) -> SpecbuildError:
        """The ready timeout: with what the log says when it says something (then size is not the reason)."""
        loading = _still_loading(log)
        message = f"the repository was not ready after {self.ready_timeout_s:.0f}s" + (
            f" (still loading: {', '.join(loading)})" if loading else "")
        clues = _log_clues(log)
        if clues:
            return SpecbuildError(f"{message}; the server log says:\n{clues}",
                                  hint=f"full server log: {self.log_file}")
        return SpecbuildError(message, hint=f"the server log ({self.log_file}) reports no error: large models may "
                                            "need a longer --ready-timeout")

    def _loading_death(self, death: StubDeath, log: str) -> str:
        loading = _still_loading(log)
        if death.model:
            who = f"model '{death.model}'"
        elif len(loading) == 1:
            who = f"model '{loading[0]}'"
        else:
            who = "one of the models still loading" + (f" ({', '.join(loading)})" if loading else "")
        return (f"{who} failed to load: its python stub (pid {death.pid}) {death.how} before it started, and "
                f"tritonserver would wait for it forever\n{_clues_or_tail(log)}")

    def _serving_death(self, death: StubDeath) -> str:
        instance = f"instance {death.instance}" if death.instance else "an instance"
        return (f"model '{death.model or '?'}' is broken: the python stub of its {instance} (pid {death.pid}) "
                f"{death.how} while serving. Triton 2.51 neither restarts a dead stub nor marks its model unready "
                "(its requests fail with 'Stub process is not healthy' or never finish), so the server was "
                f"stopped\n{_clues_or_tail(self.log_text(), quiet='the server log says nothing about it')}")

    def _try_index(self, timeout_s: float = 2.0) -> list[dict[str, Any]] | None:
        try:
            return self.models(timeout_s)
        except (OSError, urllib.error.URLError, json.JSONDecodeError):
            return None  # endpoints start only after every model's load has finished

    def _health_ready(self) -> bool:
        try:
            with _DIRECT.open(f"http://{self.http_url}/v2/health/ready", timeout=5) as response:
                return response.status == 200
        except (OSError, urllib.error.URLError):
            return False

    def log_text(self) -> str:
        """What the server wrote to its log since it started (its python models' log lines among it)."""
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


def _post_json(url: str, timeout_s: float = 2.0) -> Any:
    request = urllib.request.Request(url, data=b"{}", method="POST", headers={"Content-Type": "application/json"})
    with _DIRECT.open(request, timeout=timeout_s) as response:
        return json.loads(response.read())


def _index_failures(index: list[dict[str, Any]], log: str) -> list[tuple[str, str]]:
    """(model, reason) for each index entry that is neither READY nor on its way, and for each model the log says
    failed that the index does not list; entries without a reason (config errors) take the log's."""
    from_log = dict(_log_failures(log))
    listed = {str(entry.get("name")) for entry in index}
    out = []
    for entry in index:
        if entry.get("state") in ("READY", "LOADING", "UNLOADING"):
            continue
        name = str(entry.get("name"))
        reason = entry.get("reason") or from_log.get(name) or f"state {entry.get('state', 'unknown')}"
        out.append((name, str(reason)))
    out += [(name, reason) for name, reason in from_log.items() if name not in listed]
    return _ordered(out)


def _ordered(failures: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """One entry per model (the first report), root causes first: an ensemble's failure usually only says that a
    step it needs is missing."""
    unique = dict(reversed(failures))
    return sorted(unique.items(), key=lambda item: (item[1].startswith("ensemble step"), item[0]))


_LOG_LINE = re.compile(r"^(?:[EWI]\d{4} [\d:.]+|\d{4}-\d\d-\d\dT[\d:.]+Z [EWI])\s+\d+ [\w.]+:\d+\] ?(.*)$")
"""A tritonserver log line (default or ISO8601 format): its message, quoted and escaped since Triton 2.4x."""
_FAILED_LOAD = re.compile(r"failed to load '([^']+)' version \d+: (.*)", re.DOTALL)
_FAILED_MODEL = re.compile(r"failed to load model '([^']+)': (.*)", re.DOTALL)
_POLL_FAILED = re.compile(r"Poll failed for model directory '([^']+)': (.*)", re.DOTALL)
_PARSE_ERROR = re.compile(r"(Error parsing text-format .*)$")
_ENSEMBLE_DEPENDS = re.compile(r"ensemble '([^']+)' depends on '([^']+)' which (has no loaded version|[^.]*)")
_ENSEMBLE_MISSING = re.compile(r"ensemble '?([^' ]+)'? contains models that are not available or ambiguous: (.*)")
_STUB_PREINIT = re.compile(r"Failed to preinitialize Python stub: (.*'(?:[^']*/)?([^/']+)/\d+/model\.py'.*)")


def _log_failures(log: str) -> list[tuple[str, str]]:
    """(model, reason) pairs from what tritonserver logs when a model cannot load: load failures, unreadable or
    inconsistent config.pbtxt files, ensembles without their steps, python stubs that could not start."""
    failures: list[tuple[str, str]] = []
    for message, previous in _log_messages(log):
        if m := _FAILED_LOAD.match(message) or _FAILED_MODEL.match(message):
            failures.append((m.group(1), m.group(2)))
        elif m := _ENSEMBLE_DEPENDS.search(message):
            failures.append((m.group(1), f"ensemble step '{m.group(2)}' {m.group(3)} (it failed to load)"))
        elif m := _ENSEMBLE_MISSING.search(message):
            failures.append((m.group(1), f"ensemble steps missing: {m.group(2)} (no such model in the repository)"))
        elif m := _POLL_FAILED.match(message):
            parse = _PARSE_ERROR.search(previous)
            failures.append((m.group(1), m.group(2) + (f" ({parse.group(1)})" if parse else "")))
        elif m := _STUB_PREINIT.search(message):
            failures.append((m.group(2), f"its python stub could not start: {m.group(1)}"))
    return failures


def _log_messages(log: str) -> list[tuple[str, str]]:
    """(message, the line before it) for every tritonserver log line; a quoted message is unescaped, an unquoted
    one (older servers) takes the lines after it that are not log lines (a traceback) along."""
    out: list[tuple[str, str]] = []
    previous = ""
    continued: list[str] | None = None
    for line in log.splitlines():
        match = _LOG_LINE.match(line)
        if match is None:
            if continued is not None:
                continued.append(line)
            previous = line
            continue
        if continued is not None:
            out[-1] = ("\n".join(continued), out[-1][1])
            continued = None
        message = match.group(1).strip()
        if len(message) >= 2 and message[0] == message[-1] == '"':
            message = message[1:-1].replace("\\n", "\n").replace('\\"', '"')
        else:
            continued = [message]
        out.append((message, previous))
        previous = line
    if continued is not None:
        out[-1] = ("\n".join(continued), out[-1][1])
    return out


def _last_error_line(log: str) -> str:
    lines = [line for line in log.splitlines() if line.startswith("E") or "error" in line.lower()]
    return lines[-1].strip() if lines else ""


def _failure_summary(failures: list[tuple[str, str]], log: str) -> str:
    if failures:
        parts = [f"model '{name}' failed to load: {reason.strip()}" for name, reason in failures]
        return "\n".join(parts)
    tail = "\n".join(log.strip().splitlines()[-15:])
    return f"last lines of the server log:\n{tail}" if tail else "the server wrote nothing to its log"


_LOADING = re.compile(r'model_lifecycle\.cc:\d+\] "loading: ([^:"]+):\d+"')
_LOADED = re.compile(r"successfully loaded '([^']+)'|failed to load '([^']+)'")
_TRITON_LINE = re.compile(r"^[IWE]\d{4} [\d:.]+\s+\d+ [\w.]+:\d+\](?: |$)")
_NOISE = re.compile(r"CUDA driver|CudaDriverHelper|NVML|DCGM|pinned (system )?memory|^Signal \(\d+\) received")


def _still_loading(log: str) -> list[str]:
    """Models the log shows loading and not (yet) loaded or failed."""
    done = {a or b for a, b in _LOADED.findall(log)}
    return sorted({name for name in _LOADING.findall(log)} - done)


def _log_clues(log: str, lines: int = 12) -> str:
    """The log lines that say something went wrong: Triton's errors and whatever a stub printed (a C++ abort, a
    Python traceback), without the table, the info lines and the CPU-only CUDA/NVML noise."""
    clues = []
    for line in log.splitlines():
        text = line.strip()
        if not text or text[0] in "|+" or text.startswith("==="):
            continue
        if _TRITON_LINE.match(text) and not text.startswith("E"):
            continue
        if _NOISE.search(text) or "failed to stop server" in text or "Non-graceful termination" in text:
            continue
        clues.append(text)
    return "\n".join(clues[-lines:])


def _clues_or_tail(log: str, quiet: str = "") -> str:
    clues = _log_clues(log)
    if clues:
        return f"the server log says:\n{clues}"
    if quiet:
        return quiet
    tail = "\n".join(line for line in log.strip().splitlines()[-12:] if not line.startswith(("|", "+")))
    return f"last lines of the server log:\n{tail}" if tail else "the server wrote nothing to its log"


def _link_parents() -> list[Path]:
    """Plain-path directories where a plain symlink to a repository may go (the temporary directory first)."""
    out = []
    for candidate in (tempfile.gettempdir(), "/tmp", "/var/tmp"):
        path = Path(candidate)
        if is_plain(path) and path.is_dir() and path not in out:
            out.append(path)
    return out


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
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=KILL_WAIT_S)
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
