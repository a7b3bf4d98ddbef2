"""Which `tritonserver` to run and the environment it needs.

Two installations are supported. Inside an NGC Triton container `tritonserver` is on PATH and brings its own
backends (tensorrtllm, python). Elsewhere we run the binary bundled in `nvidia-pytriton`. The nvidia-pytriton
0.7.0 wheel (Triton 2.51, python backend only) holds the tree `pytriton/tritonserver/` with `bin/tritonserver`,
a `backends/python/` without a stub and one `python_backend_stubs/3.x/triton_python_backend_stub` per Python minor
version, and the shared libraries in `site-packages/nvidia_pytriton.libs`. So the tree is copied once into a cache
directory with the stub for the running Python minor version put into `backends/python/`, and it needs
`LD_LIBRARY_PATH` to hold `nvidia_pytriton.libs` and the interpreter's `LIBDIR` (for libpython), with this
interpreter's `bin` first on PATH so that the stub's python models import this environment's packages (with
another python first, the stub runs it and fails on `import numpy`). Setting
PYTHONUTF8 or a UTF-8 locale here would not make non-ASCII paths work: the stub's interpreter ignores both (see
serve/launch.py, "Paths").
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
import tempfile
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from specbuild.errors import SpecbuildError

DEFAULT_THREADS = 1
"""OMP/MKL threads per python model process: each model runs in its own stub process, so a repository of five
models with torch's default (one thread per core) would oversubscribe a small machine many times over.
Override with `SPECBUILD_SERVER_THREADS`, which also overrides each python model's `torch_threads` parameter."""


@dataclass(frozen=True)
class TritonInstallation:
    """A runnable tritonserver: the binary, its backend directory (None = its built-in default), and env."""

    binary: Path
    backend_directory: Path | None
    env: dict[str, str] = field(repr=False)
    source: str
    """"path" (tritonserver found on PATH) or "pytriton" (the nvidia-pytriton bundle)."""


def cache_root() -> Path:
    """Where specbuild keeps the prepared server tree (`SPECBUILD_CACHE`, else the XDG cache directory)."""
    if env := os.environ.get("SPECBUILD_CACHE"):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "specbuild"


def server_env(extra_library_paths: list[str] | None = None) -> dict[str, str]:
    """The environment python models should see: this interpreter's bin first, bounded thread counts."""
    env = dict(os.environ)
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([bin_dir, *[p for p in env.get("PATH", "").split(os.pathsep) if p and p != bin_dir]])
    if sys.prefix != sys.base_prefix:
        env["VIRTUAL_ENV"] = sys.prefix
    threads = os.environ.get("SPECBUILD_SERVER_THREADS", str(DEFAULT_THREADS))
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[name] = threads
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    if extra_library_paths:
        current = [p for p in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p]
        env["LD_LIBRARY_PATH"] = os.pathsep.join([*extra_library_paths, *current])
    return env


def find_tritonserver() -> TritonInstallation:
    """tritonserver from PATH when present (the NGC container), else the nvidia-pytriton bundle."""
    on_path = shutil.which("tritonserver")
    if on_path:
        return TritonInstallation(Path(on_path), None, server_env(), "path")
    return bundled_tritonserver()


def bundled_tritonserver() -> TritonInstallation:
    """The nvidia-pytriton tritonserver, set up in the cache directory on first use."""
    try:
        import pytriton
    except ImportError:
        raise SpecbuildError(
            "no tritonserver: not on PATH and nvidia-pytriton is not installed",
            hint="run inside an NGC Triton container, or `pip install nvidia-pytriton==0.7.0`",
        ) from None
    package = Path(pytriton.__file__).parent
    source = package / "tritonserver"
    libs = package.parent / "nvidia_pytriton.libs"
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = source / "python_backend_stubs" / python / "triton_python_backend_stub"
    if not stub.is_file():
        raise SpecbuildError(
            f"nvidia-pytriton has no python backend stub for Python {python} ({stub} is missing)",
            hint="use a Python version the installed nvidia-pytriton supports",
        )
    version = metadata.version("nvidia-pytriton")
    tree = cache_root() / f"tritonserver-pytriton{version}-py{python}"
    if not (tree / ".complete").is_file():
        _prepare_tree(source, stub, tree)
    libdir = sysconfig.get_config_var("LIBDIR") or str(Path(sys.base_prefix) / "lib")
    env = server_env([str(libs), libdir])
    return TritonInstallation(tree / "bin" / "tritonserver", tree / "backends", env, "pytriton")


def _prepare_tree(source: Path, stub: Path, tree: Path) -> None:
    """Copy the server tree with the matching stub, atomically so concurrent first runs don't collide."""
    tree.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{tree.name}.tmp-", dir=tree.parent))
    try:
        shutil.copytree(source, tmp / "t", ignore=shutil.ignore_patterns("python_backend_stubs"), symlinks=True)
        shutil.copy2(stub, tmp / "t" / "backends" / "python" / "triton_python_backend_stub")
        (tmp / "t" / ".complete").write_text("ok\n")
        try:
            (tmp / "t").rename(tree)
        except OSError:
            if not (tree / ".complete").is_file():  # another process finished first: theirs is as good as ours
                shutil.rmtree(tree, ignore_errors=True)
                (tmp / "t").rename(tree)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
