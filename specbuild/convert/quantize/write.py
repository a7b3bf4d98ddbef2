"""Writing a quantized draft: calibrate with ModelOpt, then export (a TensorRT-LLM checkpoint, repaired and checked,
or ModelOpt's Hugging Face export, checked).

Both exports mutate the model, so a model is exported once. Inside `shared_quantization()` a draft quantized for one
export is kept and each export gets its own copy of it: `build.flow: pytorch` with `build.backend: reference` writes
the Hugging Face export (what TensorRT-LLM's PyTorch backend would load) and the TensorRT-LLM checkpoint the
reference runtime serves from one calibration, so the reference serves exactly what the export holds. Outside it
nothing is kept (the engine flow: one export, no copy).
"""

from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from specbuild.convert.quantize.modelopt_calls import (
    default_device,
    export_modelopt,
    load_model,
    match_export,
    quantize_model,
)
from specbuild.convert.quantize.plan import QuantPlan
from specbuild.convert.quantize.repair import repair_export
from specbuild.convert.quantize.settings import HF
from specbuild.convert.request import ConversionPlan, ConvertRequest

if TYPE_CHECKING:
    from transformers import PreTrainedModel

_EXPORT_DIR = ".modelopt-export"
"""ModelOpt's unrepaired export, inside the atomic temporary directory and removed before it is swapped in."""

_SHARED: ContextVar[dict[str, PreTrainedModel] | None] = ContextVar("specbuild_shared_quantization", default=None)


@contextmanager
def shared_quantization() -> Iterator[None]:
    """Within this block a draft is calibrated once for every export of it (see the module docstring)."""
    token = _SHARED.set({})
    try:
        yield
    finally:
        _SHARED.reset(token)


def _key(request: ConvertRequest, qplan: QuantPlan) -> str:
    """What makes two requests' quantized models the same: the source, the layers kept, and every quantization
    setting (calibration text included) but the export."""
    settings = {k: v for k, v in qplan.manifest_settings().items() if k != "export"}
    return json.dumps({"source": str(request.source.resolve()), "layers": request.self_draft_layers,
                       "dtype": qplan.dtype, "quantization": settings}, sort_keys=True)


def _calibrate(request: ConvertRequest, qplan: QuantPlan, console: Console) -> PreTrainedModel:
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as progress:
        model = load_model(request.source, default_device(), qplan.dtype, layers=request.self_draft_layers)
        model = quantize_model(model, qplan, progress)
    match_export(model)
    return model


def quantized_model(request: ConvertRequest, qplan: QuantPlan, console: Console) -> PreTrainedModel:
    """The fake-quantized model to export (after `match_export`): calibrated now, or a copy of the one calibrated
    earlier in the same `shared_quantization()` block."""
    shared = _SHARED.get()
    if shared is None:
        return _calibrate(request, qplan, console)
    key = _key(request, qplan)
    if key not in shared:
        shared[key] = _calibrate(request, qplan, console)
    return copy.deepcopy(shared[key])


def write_quantized(request: ConvertRequest, plan: ConversionPlan, qplan: QuantPlan, out: Path,
                    console: Console) -> dict[str, Any]:
    """Calibrate and export into `out` (the atomic temporary directory); returns the written config."""
    model = quantized_model(request, qplan, console)
    if qplan.settings.export == HF:
        from specbuild.convert.quantize.hf_export import write_hf_export

        return write_hf_export(model, request, plan, qplan, out)
    export_dir = out / _EXPORT_DIR
    try:
        export_modelopt(model, qplan, request.tp_size, request.pp_size, export_dir)
        del model  # the export mutated it: it must not be exported or used again
        return repair_export(export_dir, out, plan, qplan, request.tp_size, request.pp_size, str(request.source))
    finally:
        shutil.rmtree(export_dir, ignore_errors=True)
