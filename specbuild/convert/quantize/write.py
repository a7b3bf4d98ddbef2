"""Writing a quantized draft checkpoint: calibrate with ModelOpt, export, repair, check (in that order)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

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
from specbuild.convert.request import ConversionPlan, ConvertRequest

_EXPORT_DIR = ".modelopt-export"
"""ModelOpt's unrepaired export, inside the atomic temporary directory and removed before it is swapped in."""


def write_quantized(request: ConvertRequest, plan: ConversionPlan, qplan: QuantPlan, out: Path,
                    console: Console) -> dict[str, Any]:
    """Calibrate and export into `out` (the atomic temporary directory); returns the written config."""
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as progress:
        model = load_model(request.source, default_device(), qplan.dtype, layers=request.self_draft_layers)
        model = quantize_model(model, qplan, progress)
    match_export(model)
    export_dir = out / _EXPORT_DIR
    try:
        export_modelopt(model, qplan, request.tp_size, request.pp_size, export_dir)
        del model  # the export mutated it: it must not be exported or used again
        return repair_export(export_dir, out, plan, qplan, request.tp_size, request.pp_size, str(request.source))
    finally:
        shutil.rmtree(export_dir, ignore_errors=True)
