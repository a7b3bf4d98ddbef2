"""`build` on `build.flow: pytorch`: no engine step; the LLM-API settings checked and recorded.

The PyTorch backend builds nothing ahead of serving (the LLM API loads the HF checkpoints when it starts), so this
stage only runs every check the flow has (`contracts.llm_api.pytorch_flow_problems`: the mode, the settings against
the llm_args.py tables of the spec's TensorRT-LLM line (`build.trtllm`), engine-flow settings the flow would ignore,
a quantized draft) and writes
`<output_dir>/llm_api/llm_api.json` with its manifest. Why write anything: deploy then serves exactly what build
checked, and a spec edited after build is caught by deploy as a stale engine is on the engine flow; the manifest
hashes the checkpoints' config.json files so a changed checkpoint reruns the checks.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from specbuild.atomic import Inputs, atomic_directory, output_lock, refuse_overlap
from specbuild.contracts.llm_api import (
    LLM_API_PLAN,
    line_of,
    llm_api_dir,
    llm_args,
    quantized_draft_dir,
    refuse_pytorch_flow_problems,
)
from specbuild.errors import SpecbuildError
from specbuild.manifest import (
    Status,
    fingerprint_files,
    is_fresh,
    output_sizes,
    read_manifest,
    tool_versions,
    write_manifest,
)
from specbuild.spec import PipelineSpec


@dataclass
class LlmApiResult:
    """What `build` did for a PyTorch-flow spec: the settings file it wrote (or found up to date, or planned)."""

    directory: Path
    status: Status
    settings: dict[str, Any]
    line: str

    def summary(self) -> str:
        speculative = self.settings.get("speculative_config") or {}
        method = speculative.get("decoding_type", "no speculation")
        return (f"{self.status}: {self.directory / LLM_API_PLAN} (PyTorch backend, no engine step; {method}; "
                f"checked against TensorRT-LLM {self.line} (LLM API settings))")


def _config_files(spec: PipelineSpec) -> list[Path]:
    """The checkpoints' config.json: what the LLM API reads first, and what the settings were checked with."""
    models = [("target.model", spec.target.model)]
    exported = quantized_draft_dir(spec)  # a quantized draft: the LLM API loads convert's ModelOpt HF export
    if exported is not None and not (exported / "manifest.json").is_file():
        raise SpecbuildError(f"{spec.where}: draft.quantization on build.flow: pytorch: the LLM API loads the draft "
                             f"from ModelOpt's Hugging Face export, which convert writes to {exported}; not written "
                             "yet", hint="run `specbuild convert SPEC`, then build again")
    if spec.draft is not None:
        models.append(("draft.model", exported or spec.draft.model))
    missing = [f"{field}: {path / 'config.json'}" for field, path in models if not (path / "config.json").is_file()]
    if missing:
        raise SpecbuildError(f"{spec.where}: no Hugging Face config.json for " + "; ".join(missing),
                             hint="point the field at a Hugging Face checkpoint directory")
    return [path / "config.json" for _, path in models]


def spec_file(spec: PipelineSpec) -> Path | None:
    """The spec's file, an input of every stage (None for a spec made in memory)."""
    try:
        return spec.path
    except RuntimeError:
        return None


def llm_api_inputs(spec: PipelineSpec) -> Inputs:
    """What build reads on the PyTorch flow: the models the LLM API loads (a quantized draft: convert's export)
    and the spec."""
    exported = quantized_draft_dir(spec)
    draft = spec.draft.model if spec.draft is not None else None
    return {"target.model": spec.target.model, "draft.model": draft,
            "output_dir's draft-hf checkpoint": exported, "SPEC": spec_file(spec)}


def build_llm_api(spec: PipelineSpec, *, dry_run: bool = False, force: bool = False,
                  console: Console | None = None) -> LlmApiResult:
    """Check a `build.flow: pytorch` spec and record its LLM-API settings in `<output_dir>/llm_api/`."""
    console = console or Console(stderr=True)
    directory = llm_api_dir(spec)
    inputs_named = llm_api_inputs(spec)
    refuse_overlap(directory, inputs_named, output_name="output_dir's llm_api directory")
    refuse_pytorch_flow_problems(spec, "build")
    settings = llm_args(spec)
    line = line_of(spec)
    files = _config_files(spec)
    if dry_run:
        console.print_json(json.dumps(settings))
        return LlmApiResult(directory, "planned", settings, line.name)
    # As the manifest's JSON will read back (draft_len_schedule's keys become strings), or it is never fresh.
    manifest_settings = json.loads(json.dumps({"llm_args": settings, "trtllm": line.name, "source": line.source}))
    with output_lock(directory):  # the decision and the write, by one run at a time (as every stage)
        known = read_manifest(directory)
        inputs = fingerprint_files(files, (known or {}).get("inputs"))
        tools = tool_versions()
        if not force and is_fresh(known, settings=manifest_settings, tools=tools, inputs=inputs,
                                  directory=directory):
            return LlmApiResult(directory, "up to date", settings, line.name)
        with atomic_directory(directory, inputs=inputs_named) as tmp:
            (tmp / LLM_API_PLAN).write_text(json.dumps(settings, indent=2, sort_keys=True) + "\n",
                                            encoding="utf-8")
            write_manifest(tmp, {"stage": "build", "flow": "pytorch", "spec": spec.where, "inputs": inputs,
                                 "settings": manifest_settings, "tools": tools, "outputs": output_sizes(tmp)})
    return LlmApiResult(directory, "written", settings, line.name)
