"""The tritonserver command line for a repository: one process, or one MPI rank per GPU for sharded engines.

A TensorRT-LLM engine built with tp×pp > 1 needs tp×pp MPI ranks (TensorRT-LLM asserts `mpiSize == tp * pp`).
We build the same command as the TensorRT-LLM backend's `scripts/launch_triton_server.py`
(triton-inference-server/tensorrtllm_backend @c2e65b88): `mpirun --allow-run-as-root` followed by one
`-n 1 tritonserver ... :` block per rank, each with its own python-backend shared-memory prefix (the launcher's
`prefix{i}_`; ours is the server's own prefix plus `r{i}_`, so watch.SHM_REGION and the server's cleanup find the
regions of every rank of a dead server); ranks above 0 load only the tensorrtllm models (explicit model control),
and never reach their endpoints because the backend keeps them in its worker loop, so all ranks may name the same
ports.

Paths. The python backend (r24.10, Triton 2.51) starts each stub as `bash -c " exec <stub> <model path> <shm
region> <sizes> ..."` with the paths pasted in unquoted (`StubLauncher::Launch`, src/stub_launcher.cc), and the stub
reads its third argument with `std::stol(argv[3])` (pb_stub.cc `main`): a space in the repository path splits the
model path and the stub dies with `std::invalid_argument: stol`, a `$` or a quote is read by bash. So a repository
(or backend directory) whose path is not shell-plain is served through a symlink at a plain path. A non-ASCII path
cannot be served at all: the stub starts Python with pybind11 2.10's `scoped_interpreter`, which on Python >= 3.11
uses `PyConfig_InitIsolatedConfig` (no environment, so PYTHONUTF8 is ignored; no setlocale, so the C locale of a
process that never called it), hence a file system encoding of ASCII and a UnicodeEncodeError for any non-ASCII file
name it is given (the model.py import, a tokenizer or engine path). Such paths are refused before the server starts.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import signal
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from specbuild.contracts.engine_info import ENGINE_INFO, read_engine_info
from specbuild.errors import SpecbuildError

_BACKEND = re.compile(r'^\s*backend\s*:\s*"([^"]+)"', re.MULTILINE)


_PLAIN = re.compile(r"[A-Za-z0-9_./+,:@%=-]+")
"""Characters bash takes literally in an unquoted word."""


def is_plain(path: str | Path) -> bool:
    """Whether `path` survives being pasted unquoted into a bash command line (the stub launcher does that)."""
    return _PLAIN.fullmatch(str(path)) is not None


def check_serving_paths(repository: Path) -> bool:
    """Refuse, naming the path and the fix, what the python stubs cannot open; True when the repository must be
    served through a plain-path symlink (its path has spaces or shell characters)."""
    text = str(repository)
    if not text.isascii():
        raise SpecbuildError(
            f"{text}: the repository path has non-ASCII characters ({_odd(text)}); Triton's python backend stub "
            "decodes file names as ASCII, so its models would fail to load with a UnicodeEncodeError",
            hint="move or rename the build to an ASCII-only path, `specbuild deploy` it there, and serve that",
        )
    for config in sorted(repository.glob("*/config.pbtxt")):
        model = config.parent.name
        body = config.read_text(encoding="utf-8", errors="replace")
        backend = _BACKEND.search(body)
        if backend is None or backend.group(1) != "python":
            continue
        if not is_plain(model) or not model.isascii():
            raise SpecbuildError(
                f"{config.parent}: the model directory name {model!r} has characters the python backend cannot "
                "pass to its stub (it pastes the path unquoted into a bash command line and decodes it as ASCII)",
                hint="use letters, digits, '_', '-' and '.' in model names (and `name:` in its config.pbtxt)",
            )
        for key, value in string_parameters(body, config):
            if value.startswith("/") and not value.isascii():
                raise SpecbuildError(
                    f"{config}: parameter {key} is the non-ASCII path {value} ({_odd(value)}); Triton's python "
                    f"backend stub decodes file names as ASCII, so model '{model}' would fail to load",
                    hint="move what it names (and the build) to an ASCII-only path and `specbuild deploy` again",
                )
    return not is_plain(text)


def _odd(text: str) -> str:
    return ", ".join(repr(c) for c in dict.fromkeys(c for c in text if not c.isascii()))


def string_parameters(body: str, config: Path) -> list[tuple[str, str]]:
    """The config's string parameters as Triton reads them (escapes decoded); a regex when protobuf refuses."""
    from specbuild.deploy.pbtxt import parse_config

    try:
        parsed = parse_config(body, where=str(config))
        return [(key, value.string_value) for key, value in parsed.parameters.items()]
    except (SpecbuildError, ImportError):  # Triton reports an unparsable config itself, with the model's name
        return re.findall(r'key\s*:\s*"([^"]+)"\s*,?\s*value\s*:?\s*\{\s*string_value\s*:\s*"([^"]*)"', body)


_PR_SET_PDEATHSIG = 1
try:
    _prctl: Callable[..., int] | None = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux
    _prctl = None


def die_with_this_thread() -> Callable[[], None] | None:
    """A Popen `preexec_fn` that makes the child receive SIGKILL when the thread starting it dies (so also when
    this process is killed with SIGKILL), or None where prctl(2) is missing. Resolved here, in the parent, so the
    forked child only makes the one call; a parent that died before the call is caught by comparing getppid."""
    if _prctl is None:
        return None
    prctl, parent = _prctl, os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return preexec


@dataclass(frozen=True)
class Ports:
    http: int
    grpc: int
    metrics: int


def free_ports(http: int | None, grpc: int | None, metrics: int | None, host: str = "127.0.0.1") -> Ports:
    """The given ports, with free ones picked for those left as None (all held open at once, so distinct)."""
    held: list[socket.socket] = []
    try:
        picked = []
        for port in (http, grpc, metrics):
            if port is not None:
                picked.append(port)
                continue
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((host, 0))
            held.append(sock)
            picked.append(sock.getsockname()[1])
        return Ports(*picked)
    finally:
        for sock in held:
            sock.close()


@dataclass(frozen=True)
class TensorrtModels:
    """The repository's tensorrtllm-backend models and the MPI world size their engines need."""

    names: tuple[str, ...]
    world_size: int


def tensorrt_models(repository: Path) -> TensorrtModels:
    """Find `backend: "tensorrtllm"` models and read tp×pp from their engines (engine.json or config.json)."""
    names: list[str] = []
    world = 1
    for config in sorted(repository.glob("*/config.pbtxt")):
        text = config.read_text(encoding="utf-8", errors="replace")
        backend = _BACKEND.search(text)
        if backend is None or backend.group(1) != "tensorrtllm":
            continue
        names.append(config.parent.name)
        path = dict(string_parameters(text, config)).get("gpt_model_path")  # escapes decoded, as Triton reads it
        if not path or "${" in path:
            raise SpecbuildError(f"{config}: tensorrtllm model without a filled gpt_model_path parameter")
        engine = Path(path)
        if not engine.is_absolute():
            engine = (repository / engine).resolve()
        world = max(world, engine_world_size(engine))
    return TensorrtModels(tuple(names), world)


def engine_world_size(engine: Path) -> int:
    """tp×pp of a built engine: specbuild's engine.json, else TensorRT-LLM's own config.json."""
    if (engine / ENGINE_INFO).is_file():
        return read_engine_info(engine).world_size
    config = engine / "config.json"
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SpecbuildError(
            f"{engine}: no {ENGINE_INFO} or config.json, so the engine's tp×pp is unknown",
            hint="build the engine with `specbuild build` (or point gpt_model_path at a trtllm-build output)",
        ) from None
    except (OSError, json.JSONDecodeError) as err:
        raise SpecbuildError(f"{config}: unreadable ({err})") from None
    mapping = data.get("pretrained_config", {}).get("mapping", {})
    if "tp_size" in mapping or "pp_size" in mapping:
        return int(mapping.get("tp_size", 1)) * int(mapping.get("pp_size", 1))
    if "world_size" in mapping:
        return int(mapping["world_size"])
    builder = data.get("builder_config", {})  # engines from TensorRT-LLM < 0.8
    return int(builder.get("tensor_parallel", 1)) * int(builder.get("pipeline_parallel", 1))


def server_args(
    repository: Path,
    ports: Ports,
    *,
    host: str,
    backend_directory: Path | None,
    shm_prefix: str,
    log_verbose: int = 0,
    exit_timeout_s: int = 10,
) -> list[str]:
    """tritonserver options for one process that loads the whole repository."""
    args = [
        f"--model-repository={repository}",
        f"--http-address={host}", f"--http-port={ports.http}",
        f"--grpc-address={host}", f"--grpc-port={ports.grpc}",
        f"--metrics-address={host}", f"--metrics-port={ports.metrics}",
        # Stay up when a model fails, so the repository index can tell us which one and why.
        "--exit-on-error=false",
        f"--exit-timeout-secs={exit_timeout_s}",
        f"--log-verbose={log_verbose}",
        f"--backend-config=python,shm-region-prefix-name={shm_prefix}",
    ]
    if backend_directory is not None:
        args.append(f"--backend-directory={backend_directory}")
    return args


def rank_shm_prefix(shm_prefix: str, rank: int) -> str:
    """MPI rank `rank`'s python-backend region prefix: distinct per rank (the ranks share /dev/shm) and starting with
    the server's prefix, which is what the server's cleanup and `watch.remove_stale_shared_memory` match."""
    return f"{shm_prefix}r{rank}_"


def mpi_command(
    binary: Path,
    repository: Path,
    ports: Ports,
    *,
    world_size: int,
    tensorrt_model_names: tuple[str, ...],
    shm_prefix: str,
    backend_directory: Path | None = None,
    log_verbose: int = 0,
    mpirun: str = "mpirun",
) -> list[str]:
    """`mpirun` with one tritonserver per rank, as the TensorRT-LLM launcher writes it (see the module docstring);
    rank i's shared-memory prefix is `{shm_prefix}r{i}_`, under the server's own (`rank_shm_prefix`)."""
    cmd = [mpirun, "--allow-run-as-root"]
    for rank in range(world_size):
        cmd += ["-n", "1", str(binary), f"--model-repository={repository}"]
        if rank > 0:
            cmd.append("--model-control-mode=explicit")
            cmd += [f"--load-model={name}" for name in tensorrt_model_names]
        cmd += [
            f"--grpc-port={ports.grpc}", f"--http-port={ports.http}", f"--metrics-port={ports.metrics}",
            "--disable-auto-complete-config", f"--log-verbose={log_verbose}",
            f"--backend-config=python,shm-region-prefix-name={rank_shm_prefix(shm_prefix, rank)}",
        ]
        if backend_directory is not None:
            cmd.append(f"--backend-directory={backend_directory}")
        cmd.append(":")
    return cmd[:-1]
