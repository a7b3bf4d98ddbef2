"""The model dtypes specbuild knows, by the names TensorRT-LLM's checkpoint `config.json` uses (`dtype`).

One table for every stage: the converter, the runtime, the build's size estimates and the ModelOpt export all
look names up here, and an unknown name is an error naming the choices, never a silent float32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from specbuild.errors import SpecbuildError

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class DType:
    name: str
    itemsize: int
    modelopt_export: bool
    """Whether ModelOpt 0.47.0's `export_tensorrt_llm_checkpoint` (NVIDIA/Model-Optimizer,
    modelopt/torch/export/model_config_export.py) writes quantized checkpoints in it: half dtypes only."""


DTYPES: dict[str, DType] = {
    d.name: d
    for d in (
        DType("float32", 4, modelopt_export=False),
        DType("float16", 2, modelopt_export=True),
        DType("bfloat16", 2, modelopt_export=True),
    )
}
EXPORT_DTYPES = tuple(name for name, d in DTYPES.items() if d.modelopt_export)


def quantized_export_dtype(requested: str, written: str, *, quantized: bool) -> bool:
    """Whether a checkpoint in `written` for a pipeline in `requested` is what ModelOpt's export makes, not stale:
    a quantized checkpoint is written in an EXPORT_DTYPES dtype only, so one planned in another (float32) is half."""
    return quantized and requested in DTYPES and requested not in EXPORT_DTYPES and written in EXPORT_DTYPES


def dtype(name: str, *, where: str = "dtype") -> DType:
    """The table row for `name`; SpecbuildError naming `where` and the known names otherwise."""
    try:
        return DTYPES[name]
    except KeyError:
        raise SpecbuildError(f"{where}: unknown dtype {name!r}", hint=f"use one of {', '.join(DTYPES)}") from None


def torch_dtype(name: str, *, where: str = "dtype") -> torch.dtype:
    """The torch dtype of a known name (torch is imported only here, so the table stays cheap to import)."""
    import torch

    return getattr(torch, dtype(name, where=where).name)


def dtype_name(value: torch.dtype) -> str | None:
    """The table name of a torch dtype, or None when the table has none (e.g. float64, int8)."""
    name = str(value).removeprefix("torch.")
    return name if name in DTYPES else None
