"""Write an export directory whole or not at all: serve.sh, the engine's config, converted heads, manifest.json.

`serve.sh` is the command with the export's notes as comments above it, so what the engine will not do is read where
the command is; `manifest.json` says which spec and which upstream files it came from (and lets the next export
replace the directory, as `atomic.check_replaceable` asks).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from specbuild.atomic import MANIFEST, atomic_directory
from specbuild.export.medusa_heads import MEDUSA_DIR
from specbuild.export.plan import ExportPlan
from specbuild.manifest import Status

SCRIPT = "serve.sh"


@dataclass
class ExportResult:
    plan: ExportPlan
    directory: Path
    status: Status


def serve_script(plan: ExportPlan, spec_path: str) -> str:
    lines = ["#!/bin/sh", f"# Written by `specbuild export {plan.engine}` from {spec_path}.",
             "# Names from: " + "; ".join(str(source) for source in plan.sources)]
    lines += [f"# Note: {note}" for note in plan.notes]
    lines += plan.script_lines
    lines.append(f'exec {plan.script_command or plan.command()} "$@"')
    return "\n".join(lines) + "\n"


def manifest(plan: ExportPlan, spec_path: str) -> dict[str, object]:
    return {"stage": "export", "engine": plan.engine, "spec": spec_path, "argv": plan.argv,
            "files": sorted([SCRIPT, *plan.files] + ([MEDUSA_DIR] if plan.medusa is not None else [])),
            "sources": [str(source) for source in plan.sources], "notes": plan.notes}


def write_export(plan: ExportPlan, directory: Path, spec_path: str) -> ExportResult:
    with atomic_directory(directory) as tmp:
        script = tmp / SCRIPT
        script.write_text(serve_script(plan, spec_path), encoding="utf-8")
        os.chmod(script, 0o755)
        for name, text in plan.files.items():
            (tmp / name).write_text(text, encoding="utf-8")
        if plan.medusa is not None:
            plan.medusa.write(tmp / MEDUSA_DIR)
        (tmp / MANIFEST).write_text(json.dumps(manifest(plan, spec_path), indent=2) + "\n", encoding="utf-8")
    return ExportResult(plan, directory, "written")
