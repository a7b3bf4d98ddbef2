"""Write an export directory whole or not at all: serve.sh, the engine's config, manifest.json.

`serve.sh` is the command with the export's notes as comments above it, so what the engine will not do is read where
the command is; `manifest.json` says which spec and which upstream files it came from (and lets the next export
replace the directory, as `atomic.check_replaceable` asks).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from specbuild.atomic import Inputs, atomic_directory
from specbuild.contracts.llm_api import quantized_draft_dir
from specbuild.export.plan import ExportPlan
from specbuild.manifest import Status, comment, write_manifest
from specbuild.spec import PipelineSpec

SCRIPT = "serve.sh"


@dataclass
class ExportResult:
    plan: ExportPlan
    directory: Path
    status: Status


def serve_script(plan: ExportPlan, spec_path: str) -> str:
    """serve.sh: the notes as comments, then the command, every word quoted (`ExportPlan.command`)."""
    lines = ["#!/bin/sh", comment(f"Written by `specbuild export {plan.engine}` from {spec_path}."),
             comment("Names from: " + "; ".join(str(source) for source in plan.sources))]
    lines += [comment(f"Note: {note}") for note in plan.notes]
    lines.append(f'exec {plan.command()} "$@"')
    return "\n".join(lines) + "\n"


def manifest(plan: ExportPlan, spec_path: str) -> dict[str, object]:
    return {"stage": "export", "engine": plan.engine, "spec": spec_path, "argv": plan.argv,
            "files": sorted([SCRIPT, *plan.files]),
            "sources": [str(source) for source in plan.sources], "notes": plan.notes}


def export_inputs(spec: PipelineSpec) -> Inputs:
    """What an export reads or names: the models the engine loads (a quantized draft: convert's ModelOpt export),
    the Medusa heads (both engines refuse Medusa; the heads are still never overwritten) and the spec. The export
    directory may not be, contain or lie inside any."""
    try:
        spec_file: Path | None = spec.path
    except RuntimeError:  # a spec made in memory has no file
        spec_file = None
    return {"target.model": spec.target.model, "draft.model": spec.draft.model if spec.draft is not None else None,
            "output_dir's draft-hf checkpoint": quantized_draft_dir(spec),
            "medusa.heads": spec.medusa.heads if spec.medusa is not None else None, "SPEC": spec_file}


def write_export(plan: ExportPlan, directory: Path, spec_path: str, *, inputs: Inputs | None = None) -> ExportResult:
    """Write the export into `directory` whole; `inputs` (`export_inputs`) are refused again under its lock."""
    with atomic_directory(directory, inputs=inputs) as tmp:
        script = tmp / SCRIPT
        script.write_text(serve_script(plan, spec_path), encoding="utf-8")
        os.chmod(script, 0o755)
        for name, text in plan.files.items():
            (tmp / name).write_text(text, encoding="utf-8")
        write_manifest(tmp, manifest(plan, spec_path))
    return ExportResult(plan, directory, "written")
