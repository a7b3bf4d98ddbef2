"""Which backend builds the engines: TensorRT-LLM where it and a GPU are present, the reference one elsewhere."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from dataclasses import dataclass

from specbuild.build.gpu import Gpu, visible_gpus
from specbuild.build.trtllm_flags import CONTAINER, TRTLLM_VERSION
from specbuild.errors import SpecbuildError


@dataclass(frozen=True)
class TensorrtStatus:
    """Whether `trtllm-build` can run here, and if not, why."""

    version: str | None
    gpus: tuple[Gpu, ...]
    problem: str | None

    @property
    def available(self) -> bool:
        return self.problem is None


def tensorrt_llm_version() -> tuple[str | None, str | None]:
    """(version, problem): imports tensorrt_llm in a child process (its import initialises CUDA and MPI)."""
    if importlib.util.find_spec("tensorrt_llm") is None:
        return None, "tensorrt_llm is not installed"
    try:
        done = subprocess.run(
            [sys.executable, "-c", "import tensorrt_llm; print(tensorrt_llm.__version__)"],
            capture_output=True, text=True, timeout=300,
        )
    except (OSError, subprocess.SubprocessError) as err:
        return None, f"importing tensorrt_llm failed ({err})"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        return None, f"importing tensorrt_llm failed ({last})"
    return done.stdout.strip().splitlines()[-1], None


def tensorrt_status() -> TensorrtStatus:
    version, problem = tensorrt_llm_version()
    gpus = tuple(visible_gpus())
    if problem is None and shutil.which("trtllm-build") is None:
        problem = "trtllm-build is not on PATH"
    if problem is None and not gpus:
        problem = "no NVIDIA GPU is visible (nvidia-smi lists none)"
    return TensorrtStatus(version, gpus, problem)


def tensorrt_missing_error(status: TensorrtStatus) -> SpecbuildError:
    """The documented failure of `--backend tensorrt` where TensorRT-LLM or a GPU is missing."""
    return SpecbuildError(
        f"backend 'tensorrt' needs TensorRT-LLM {TRTLLM_VERSION}.x and an NVIDIA GPU, but {status.problem}",
        hint=f"run `specbuild build` inside the TensorRT-LLM {TRTLLM_VERSION} release container, e.g. "
        f"`docker run --gpus all --rm -v $PWD:$PWD -w $PWD {CONTAINER} specbuild build SPEC`; or use "
        "--dry-run to write build.sh scripts to run there; or --backend reference to build for specbuild's "
        "PyTorch runtime",
    )


def resolve_backend(requested: str, status: TensorrtStatus | None = None) -> tuple[str, TensorrtStatus]:
    """`auto` -> tensorrt when tensorrt_llm imports and a GPU is visible, else reference."""
    if requested not in ("auto", "tensorrt", "reference"):  # before the checks below spawn any process
        raise SpecbuildError(f"unknown backend {requested!r}", hint="use auto, tensorrt or reference")
    status = status or tensorrt_status()
    if requested == "reference":
        return "reference", status
    if requested == "tensorrt" and not status.available:
        raise tensorrt_missing_error(status)
    return ("tensorrt" if status.available else "reference"), status
