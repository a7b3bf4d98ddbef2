"""`specbuild serve DIR` on a Dynamo deployment: the real Dynamo frontend and N reference workers on this machine.

Starts `python -m dynamo.frontend` (ai-dynamo 1.6.1) with the deployment's `--router-mode`, its HTTP server on
`--http-host` (the frontend's default is 0.0.0.0: every interface) and `--http-port`, request migration
(`--migration-limit`: a stream whose worker dies goes on on another worker, while its prompt and the tokens
streamed so far fit build.max_input_len: `--migration-max-seq-len`), file discovery in a fresh temporary directory
(`DYN_FILE_KV`) and every internal plane on loopback (`DYN_TCP_RPC_HOST`, `DYN_TCP_RESPONSE_STREAM_HOST`,
`DYN_EVENT_PLANE_HOST`: otherwise Dynamo advertises the machine's non-loopback address; they carry no
authentication, so they stay there whatever `--host` says), then the workers (`specbuild.dynamo.worker`:
specbuild's reference serving engine on the LLM-API settings deploy wrote). With `--router-mode kv` the frontend
gets `--no-router-kv-events`: the reference engine publishes no KV events, so the router predicts each worker's
cache from its own routing decisions (ai-dynamo 1.6.1 dynamo/common/configuration/groups/kv_router_args.py). Ready
when the discovery directory lists every worker and /v1/models the model; a process that exits before that (also
one killed outright, as by the OOM killer) is reported at once by name.

Stopping (Ctrl-C, SIGTERM, or the end of `--prompt`s): SIGTERM to every worker (each shuts its runtime down, which
removes its discovery entries), then the frontend, SIGKILL for whatever is still running after a grace period, and
the discovery directory removed, so nothing started here is left running and no stale entry stays (a worker killed
with SIGKILL cannot remove its own).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from specbuild.dynamo.write import LAUNCH_FILE
from specbuild.errors import SpecbuildError
from specbuild.serve.lifetime import serve_until_stopped, stopped_on_signal

LOOPBACK = "127.0.0.1"
STOP_GRACE_S = 10.0
POLL_S = 0.2
MIGRATION_LIMIT = 3
"""How many times the frontend moves a request whose worker died to another worker (Dynamo's request migration:
it resends the prompt and the tokens streamed so far, so the client's stream goes on)."""
PROMPT_SHOWN = 80
"""At most this many characters of a refused --prompt are repeated in its error (a long prompt buries the reason)."""
TRITON_ONLY = {
    "--grpc-port": ("Dynamo's frontend serves OpenAI over HTTP only", "use --http-port"),
    "--metrics-port": ("Dynamo's frontend serves its Prometheus metrics on the HTTP port",
                       "scrape http://HOST:HTTP_PORT/metrics"),
    "--num-draft-tokens": ("the workers draft as the deployment's engine.yaml (speculative_config) says",
                           "change speculative.num_draft_tokens in the spec and `specbuild deploy` it again"),
    "--draft-len-schedule": ("the workers read the deployment's schedule, not an override",
                             "put the schedule in the spec and `specbuild deploy` it again"),
}
"""`specbuild serve` options that act on tritonserver only: refused on a Dynamo deployment, with why and what to
do, instead of being ignored."""


def is_dynamo_deployment(path: Path) -> bool:
    return (path / LAUNCH_FILE).is_file()


def read_plan(directory: Path) -> dict[str, Any]:
    """launch.json, refused unless this machine can serve it (the reference engine, aggregated)."""
    path = directory / LAUNCH_FILE
    try:
        plan = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise SpecbuildError(f"{path}: not a readable Dynamo launch ({err})",
                             hint="run `specbuild deploy SPEC` with deploy.target: dynamo") from None
    if plan.get("reference") is None:
        raise SpecbuildError(f"{path}: engine {plan.get('engine')!r} is served by its own workers "
                             f"({plan['workers'][0]['command'][2]}), which need the engine and a GPU",
                             hint=f"run {directory / 'launch.sh'} on a GPU host; `specbuild serve` runs Dynamo on "
                                  "this machine with specbuild's reference engine for engine: trtllm with "
                                  "build.backend: reference")
    if "max_input_len" not in plan:
        raise SpecbuildError(f"{path}: written by an older specbuild (no max_input_len: the workers could not enforce "
                             "the deployment's limits)", hint="run `specbuild deploy SPEC` again")
    if plan.get("mode") != "aggregated":
        raise SpecbuildError(f"{path}: mode {plan.get('mode')!r}: the reference workers on this machine serve "
                             "aggregated only (no KV transfer between processes)",
                             hint="serve an aggregated deployment here, or run launch.sh on GPU hosts")
    return plan


def dynamo_env(discovery: Path) -> dict[str, str]:
    """The environment every process gets: file discovery in `discovery`, loopback only."""
    env = dict(os.environ)
    env.update({"DYN_FILE_KV": str(discovery), "DYN_DISCOVERY_BACKEND": "file", "DYN_TCP_RPC_HOST": LOOPBACK,
                "DYN_TCP_RESPONSE_STREAM_HOST": LOOPBACK, "DYN_EVENT_PLANE_HOST": LOOPBACK,
                "DYN_REQUEST_PLANE": "tcp", "PYTHONUNBUFFERED": "1"})
    return env


def discovery_instances(discovery: Path) -> list[Path]:
    """The worker instances the discovery directory lists (one file per registered endpoint instance)."""
    return sorted(p for p in (discovery / "v1" / "instances").glob("*") if p.is_file())


@dataclass
class DynamoServer:
    """The frontend and the workers of one deployment, started and stopped together."""

    directory: Path
    http_port: int | None = None
    host: str = LOOPBACK
    model_name: str | None = None
    """The name the deployment serves under (/v1/models); None: the one deploy wrote (the spec's name)."""
    workers: int | None = None
    log_dir: Path | None = None
    ready_timeout_s: float = 180.0
    threads: int = 1
    plan: dict[str, Any] = field(init=False)
    discovery: Path | None = field(init=False, default=None)
    frontend: subprocess.Popen[bytes] | None = field(init=False, default=None)
    worker_processes: list[subprocess.Popen[bytes]] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        self.directory = Path(self.directory).resolve()
        self.plan = read_plan(self.directory)
        if self.workers is None:
            self.workers = int(self.plan["workers"][0]["replicas"])
        if self.log_dir is None:
            self.log_dir = self.directory.parent / "dynamo-logs"
        if self.http_port is None:
            from specbuild.serve.launch import free_ports

            self.http_port = free_ports(None, 1, 1, self.host).http

    @property
    def url(self) -> str:
        return f"http://{f'[{self.host}]' if ':' in self.host else self.host}:{self.http_port}"

    @property
    def model(self) -> str:
        return self.model_name or str(self.plan["model_name"])

    def requests_log(self, index: int) -> Path:
        assert self.log_dir is not None
        return self.log_dir / f"worker-{index}.requests.jsonl"

    def _spawn(self, argv: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
        """A new session (a terminal's Ctrl-C reaches us, and we stop them in order) that dies with us: a serve
        killed with SIGKILL (the OOM killer, a CI timeout) leaves no frontend holding the port, no worker."""
        from specbuild.serve.launch import die_with_this_thread

        with log.open("wb") as handle:
            return subprocess.Popen(argv, stdout=handle, stderr=subprocess.STDOUT, env=env, cwd=self.directory,
                                    start_new_session=True, preexec_fn=die_with_this_thread())

    def worker_argv(self, index: int) -> list[str]:
        plan = self.plan
        return [sys.executable, "-m", "specbuild.dynamo.worker",
                "--settings", str(self.directory / plan["engine_file"]),
                "--reference", str(self.directory / plan["reference"]), "--tokenizer", plan["tokenizer"],
                "--model-name", self.model, "--namespace", plan["namespace"], "--component",
                plan["component"], "--block-size", str(plan["kv_block_size"]), "--index", str(index),
                "--max-input-len", str(plan["max_input_len"]),
                "--requests-log", str(self.requests_log(index)), "--threads", str(self.threads)]

    def start_worker(self, index: int) -> subprocess.Popen[bytes]:
        assert self.discovery is not None and self.log_dir is not None
        self.requests_log(index).unlink(missing_ok=True)
        process = self._spawn(self.worker_argv(index), self.log_dir / f"worker-{index}.log",
                              dynamo_env(self.discovery))
        self.worker_processes.append(process)
        return process

    def start(self) -> None:
        """Start everything and wait until it serves; on any failure stop what was started and raise."""
        assert self.log_dir is not None and self.workers is not None
        try:
            self.log_dir.mkdir(parents=True, exist_ok=True)
        except OSError as err:  # a file by that name, or under one
            raise SpecbuildError(f"{self.log_dir}: cannot hold the deployment's logs ({err.strerror})",
                                 hint="--log-file names a directory for a Dynamo deployment (the frontend's and "
                                      "each worker's logs go in it): name a new or an existing directory") from None
        self.discovery = Path(tempfile.mkdtemp(prefix="specbuild-dynamo-"))
        env = dynamo_env(self.discovery)
        frontend = [sys.executable, "-m", "dynamo.frontend", "--http-host", self.host, "--http-port",
                    str(self.http_port), "--router-mode", self.plan["router_mode"], "--discovery-backend", "file",
                    "--migration-limit", str(MIGRATION_LIMIT), "--migration-max-seq-len",
                    str(self.plan["max_input_len"])]  # a migrated request's prompt holds what it streamed
        if self.plan["router_mode"] == "kv":
            frontend.append("--no-router-kv-events")
        try:
            self.frontend = self._spawn(frontend, self.log_dir / "frontend.log", env)
            for index in range(self.workers):
                self.start_worker(index)
            self.wait_ready(self.workers)
        except BaseException:
            self.stop()
            raise

    def _failed(self, process: subprocess.Popen[bytes], name: str, log: Path) -> SpecbuildError:
        tail = log.read_text(encoding="utf-8", errors="replace").splitlines()[-15:] if log.is_file() else []
        code = process.returncode
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with {code}"
        hint = f"the whole log: {log}"
        if code == -signal.SIGKILL:
            hint += " (SIGKILL from outside, e.g. the kernel's OOM killer: see `dmesg`)"
        if name == "frontend":
            hint += f"; is {self.host}:{self.http_port} free? (--http-port, deploy.http_port)"
        return SpecbuildError(f"Dynamo {name} (pid {process.pid}) {how} before it was ready"
                              + "".join(f"\n{line}" for line in tail), hint=hint)

    def wait_ready(self, workers: int) -> None:
        """Until the discovery directory lists `workers` instances and /v1/models lists the model."""
        from specbuild.bench.openai import listed_models

        assert self.discovery is not None and self.log_dir is not None and self.frontend is not None
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self.frontend.poll() is not None:
                raise self._failed(self.frontend, "frontend", self.log_dir / "frontend.log")
            for index, process in enumerate(self.worker_processes):
                if process.poll() is not None:
                    raise self._failed(process, f"worker {index}", self.log_dir / f"worker-{index}.log")
            if len(discovery_instances(self.discovery)) >= workers and self.model in (
                    listed_models(self.url, timeout_s=2) or ()):
                return
            time.sleep(POLL_S)
        raise SpecbuildError(f"Dynamo did not serve {self.model} with {workers} workers within "
                             f"{self.ready_timeout_s:.0f} s", hint=f"the logs: {self.log_dir}")

    def check(self) -> None:
        """SpecbuildError when the frontend died (a dead worker leaves the others serving)."""
        if self.frontend is not None and self.frontend.poll() is not None:
            assert self.log_dir is not None
            raise self._failed(self.frontend, "frontend", self.log_dir / "frontend.log")

    def processes(self) -> list[subprocess.Popen[bytes]]:
        return [*self.worker_processes, *([self.frontend] if self.frontend is not None else [])]

    def stop(self) -> None:
        """Workers first (each removes its discovery entries), then the frontend; SIGKILL after the grace period;
        then the discovery directory."""
        for group in (self.worker_processes, [self.frontend] if self.frontend is not None else []):
            for process in group:
                if process.poll() is None:
                    _signal_group(process, signal.SIGTERM)
            deadline = time.monotonic() + STOP_GRACE_S
            for process in group:
                try:
                    process.wait(max(deadline - time.monotonic(), 0.1))
                except subprocess.TimeoutExpired:
                    _signal_group(process, signal.SIGKILL)
                    process.wait()
            for process in group:  # anything the process itself started (its session) goes too
                _signal_group(process, signal.SIGKILL)
        if self.discovery is not None:
            shutil.rmtree(self.discovery, ignore_errors=True)


def _signal_group(process: subprocess.Popen[bytes], signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signum)


def refuse_triton_only(given: dict[str, object]) -> None:
    """SpecbuildError naming the first given option that acts on tritonserver only (TRITON_ONLY)."""
    for option, value in given.items():
        if value is not None and option in TRITON_ONLY:
            why, hint = TRITON_ONLY[option]
            raise SpecbuildError(f"{option} does not apply to a Dynamo deployment: {why}", hint=hint)


@contextlib.contextmanager
def one_serve(directory: Path) -> Iterator[None]:
    """Hold the deployment's lock (specbuild.atomic's, which deploy takes too) while serving: a second serve of one
    deployment is refused naming the first, before it starts anything or touches the logs."""
    from specbuild.atomic import OutputLocked, output_lock

    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(output_lock(directory))
        except OutputLocked as err:
            raise SpecbuildError(f"one `specbuild serve` per deployment at a time: {err.message}",
                                 hint="stop that run first (Ctrl-C, or kill its pid), then serve again") from None
        yield


def serve(directory: Path, *, http_port: int | None, host: str, model_name: str | None, log_dir: Path | None,
          ready_timeout_s: float, prompts: tuple[str, ...], max_tokens: int, console: Console, out: Console) -> None:
    """`specbuild serve DIR` on a Dynamo deployment: serve until Ctrl-C/SIGTERM, or answer the prompts and stop.
    HTTP on `http_port`, else the port deploy wrote (deploy.http_port)."""
    server = DynamoServer(directory, http_port=http_port, host=host, model_name=model_name, log_dir=log_dir,
                          ready_timeout_s=ready_timeout_s)
    if http_port is None:
        server.http_port = int(server.plan["http_port"])
    with one_serve(server.directory):
        console.print(f"starting NVIDIA Dynamo (frontend, router {server.plan['router_mode']}, {server.workers} "
                      f"reference workers) on {escape(str(server.directory))} (logs: {escape(str(server.log_dir))})",
                      highlight=False)
        with stopped_on_signal("Dynamo", server.stop, console):  # a second signal waits for the stop's SIGKILLs
            with console.status("waiting until every worker is registered…"):
                server.start()
            out.print(f"ready: {server.model} at {server.url}/v1 (OpenAI: /v1/chat/completions, /v1/completions, "
                      "/v1/models; metrics: /metrics)", highlight=False)
            if prompts:
                ask(server, prompts, max_tokens, out)
                return
            serve_until_stopped(server.check, console)


def ask(server: DynamoServer, prompts: tuple[str, ...], max_tokens: int, out: Console) -> None:
    """Each prompt, streamed through the frontend as any OpenAI client sends it: the answer and the workers'
    acceptance. A refusal (e.g. which of the deployment's limits a prompt breaks) is a SpecbuildError with the
    server's words; the prompt is shortened in it, as a long one would bury them."""
    from specbuild.bench.openai import OpenAIClient

    with OpenAIClient(server.url, server.model) as client:
        for prompt in prompts:
            out.rule(escape(prompt))
            try:
                answer = client.generate(prompt, max_tokens)
            except SpecbuildError as err:
                raise SpecbuildError(f"--prompt {textwrap.shorten(prompt, PROMPT_SHOWN)!r}: {err.message}",
                                     hint=f"the frontend's and workers' logs: {server.log_dir}") from None
            out.print(escape(answer.text), highlight=False, soft_wrap=True)
            out.print(f"  {answer.acceptance_line()}; first text after {answer.ttft_s * 1e3:.0f} ms", highlight=False)

