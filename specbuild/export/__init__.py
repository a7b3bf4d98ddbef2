"""`specbuild export vllm|sglang SPEC`: the same pipeline served by vLLM or SGLang instead of Triton.

Why: users compare engines, and a user leaving the TensorRT engine flow needs the spec to reach what replaces it.
This stage reads the spec and the Hugging Face checkpoints it names, and of convert's output only the quantized
draft's ModelOpt Hugging Face export (`draft`; never a TensorRT-LLM checkpoint): vLLM and SGLang load HF checkpoints
themselves. It writes the serve command and the engine's config, with the field
names of those engines' current sources (`sources`), or refuses with the reason the engine cannot serve the spec.
"""

from __future__ import annotations

import os
from pathlib import Path

from specbuild.atomic import refuse_overlap
from specbuild.contracts.family_support import family_problems
from specbuild.export.plan import ENGINES, ExportPlan, ExportRefused, default_directory
from specbuild.export.write import ExportResult, export_inputs, write_export
from specbuild.spec import PipelineSpec

__all__ = ["ENGINES", "ExportPlan", "ExportRefused", "ExportResult", "build_plan", "default_directory",
           "export_spec"]


def build_plan(spec: PipelineSpec, engine: str, directory: Path) -> ExportPlan:
    """The engine's plan, after the model families' check (`contracts.family_support`: e.g. EAGLE-3 on a target
    whose class the engine gives no hidden-state capture)."""
    if engine in ENGINES:
        problems = family_problems(spec, (engine,))
        if problems:
            raise ExportRefused(f"{spec.where}: " + "; ".join(message for _, message in problems),
                                hint="the docs' Model families table says which method each engine runs on which "
                                "family")
    if engine == "vllm":
        from specbuild.export import vllm as module
    elif engine == "sglang":
        from specbuild.export import sglang as module  # type: ignore[no-redef]
    else:
        raise ExportRefused(f"unknown engine {engine!r}; expected one of {', '.join(ENGINES)}")
    return module.build_plan(spec, directory)


def export_spec(spec: PipelineSpec, engine: str, directory: Path | None = None, *,
                dry_run: bool = False) -> ExportResult:
    """Plan the export and, unless `dry_run`, write it atomically into `directory` (default
    `<output_dir>/export/<engine>`). A directory that is, contains or lies inside one of the spec's models (or the
    spec) is refused before anything is read (`export_inputs`), and again under the output's lock."""
    given = directory is not None
    target = Path(os.path.abspath(directory if directory is not None else default_directory(spec, engine)))
    inputs = export_inputs(spec)
    refuse_overlap(target, inputs, output_name="--output" if given else "output_dir's export directory")
    plan = build_plan(spec, engine, target)
    if dry_run:
        return ExportResult(plan, target, "planned")
    return write_export(plan, target, spec.where, inputs=inputs)

