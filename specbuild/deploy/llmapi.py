"""`deploy` on `build.flow: pytorch`: a Triton repository around NVIDIA's llmapi model, and a trtllm-serve command.

Writes `spec.deploy.model_repository` atomically, with the manifest and freshness rule of every stage:
- `tensorrt_llm/config.pbtxt`: the llmapi model's inputs and outputs (contracts.llm_api LLMAPI_INPUTS/OUTPUTS,
  from NVIDIA/TensorRT-LLM triton_backend/all_models/llmapi/tensorrt_llm/config.pbtxt), python backend, one CPU
  instance, and no max_batch_size or transaction policy: NVIDIA's model.py sets both from model.yaml.
- `tensorrt_llm/1/model.yaml`: the LLM-API settings build checked, plus `triton_config`.
- `trtllm-serve.sh` and `trtllm-serve.yaml`: the same settings for TensorRT-LLM's OpenAI server, flags plus an
  `--extra_llm_api_options` file (tritonserver ignores files at the repository's top level).
NVIDIA's `1/model.py` and `1/helpers.py` are not copied (they are TensorRT-LLM's code, shipped in its container
under triton_backend/all_models/llmapi/tensorrt_llm/1/); the summary says so, and model.yaml's header too.

With `build.backend: reference` the repository is served on CPU instead: `tensorrt_llm/1/model.py` is specbuild's
(`specbuild/triton_models/llmapi/1/model.py`, answering as NVIDIA's model.py does, over the reference runtime) and
`tensorrt_llm/1/reference.json` names the checkpoints `convert` wrote for it; model.yaml and config.pbtxt are the
same files either way. The checkpoints' manifests are inputs, so a reconverted checkpoint redeploys.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console

from specbuild.atomic import Inputs, atomic_directory, output_lock, refuse_overlap
from specbuild.contracts.checkpoint_facts import stale_conversion
from specbuild.contracts.llm_api import (
    CODE_NOTE,
    LLM_API_PLAN,
    LLMAPI_INPUTS,
    LLMAPI_MODEL,
    LLMAPI_MODEL_SOURCE,
    LLMAPI_MODEL_YAML,
    LLMAPI_OUTPUTS,
    REFERENCE_FILE,
    SERVE_OPTIONS,
    SERVE_SCRIPT,
    SERVE_SOURCE,
    Tensor,
    line_of,
    llm_api_dir,
    llm_args,
    llmapi_backend,
    model_yaml,
    quantized_draft_dir,
    reference_roles,
    reference_settings,
    refuse_pytorch_flow_problems,
    serve_command,
)
from specbuild.contracts.quant_formats import HF_QUANT_CONFIG
from specbuild.deploy.model_code import LLMAPI_CODE_FILE, llmapi_reference_code
from specbuild.deploy.pbtxt import parse_config
from specbuild.errors import SpecbuildError
from specbuild.manifest import (
    Status,
    bytes_hash,
    fingerprint_files,
    is_fresh,
    output_sizes,
    read_manifest,
    tool_versions,
    write_manifest,
)
from specbuild.spec import PipelineSpec

CONFIG = f"{LLMAPI_MODEL}/config.pbtxt"
MODEL_YAML = LLMAPI_MODEL_YAML


@dataclass
class LlmApiDeployResult:
    repository: Path
    status: Status
    files: dict[str, str]

    def summary(self) -> str:
        if REFERENCE_FILE in self.files:
            return (f"{self.status}: {self.repository} ({LLMAPI_MODEL}: Triton llmapi model served by specbuild's "
                    f"reference on CPU, build.backend reference; {SERVE_SCRIPT} for TensorRT-LLM)")
        return (f"{self.status}: {self.repository} ({LLMAPI_MODEL}: Triton llmapi model, PyTorch backend; "
                f"{SERVE_SCRIPT}); {CODE_NOTE}")


def _tensor_text(tensor: Tensor) -> str:
    dims = ", ".join(str(d) for d in tensor.dims)
    optional = "\n    optional: true" if tensor.optional else ""
    return f'  {{\n    name: "{tensor.name}"\n    data_type: {tensor.data_type}\n    dims: [ {dims} ]{optional}\n  }}'


def config_text() -> str:
    """The llmapi model's config.pbtxt, parsed back with Triton's ModelConfig before it is written."""
    text = (f"# Triton's llmapi model ({LLMAPI_MODEL_SOURCE}), written by specbuild.\n"
            "# max_batch_size and the transaction policy come from 1/model.yaml triton_config (model.py's\n"
            "# auto_complete_config), so they are not set here.\n"
            f'name: "{LLMAPI_MODEL}"\nbackend: "python"\n\n'
            "instance_group [\n  {\n    count: 1\n    kind: KIND_CPU\n  }\n]\n\n"
            "input [\n" + ",\n".join(_tensor_text(t) for t in LLMAPI_INPUTS) + "\n]\n"
            "output [\n" + ",\n".join(_tensor_text(t) for t in LLMAPI_OUTPUTS) + "\n]\n")
    parse_config(text, where=CONFIG)
    return text


def _yaml(data: dict[str, Any], header: str) -> str:
    return header + yaml.safe_dump(data, sort_keys=False, default_flow_style=False)


def repository_files(spec: PipelineSpec, args: dict[str, Any]) -> dict[str, str]:
    """{relative path: text} of the repository for these LLM-API settings."""
    command, options = serve_command(spec, args, SERVE_OPTIONS)
    # The options file beside the script, wherever the repository is moved to.
    shown = " ".join(shlex.quote(part) for part in command[:-1]) + f' "$(dirname "$0")/{command[-1]}"'
    script = ("#!/bin/sh\n"
              f"# TensorRT-LLM {line_of(spec).name}'s OpenAI server on the same settings ({SERVE_SOURCE}); "
              "written by specbuild.\n"
              f'exec {shown} "$@"\n')
    reference = llmapi_backend(spec) == "reference"
    note = (f"{LLMAPI_MODEL}/1/model.py is specbuild's reference (build.backend: reference); for TensorRT-LLM put "
            "NVIDIA's model.py and helpers.py there") if reference else CODE_NOTE
    files = {
        CONFIG: config_text(),
        MODEL_YAML: _yaml(model_yaml(spec, args),
                          f"# LLM-API settings for Triton's llmapi model ({LLMAPI_MODEL_SOURCE}), as TensorRT-LLM "
                          f"{line_of(spec).name} names them.\n# {note}.\n"),
        SERVE_OPTIONS: _yaml(options, "# trtllm-serve --extra_llm_api_options: LLM-API settings beyond its flags.\n"),
        SERVE_SCRIPT: script,
    }
    if reference:
        files[LLMAPI_CODE_FILE] = llmapi_reference_code().decode("utf-8")
        files[REFERENCE_FILE] = json.dumps(reference_settings(spec), indent=2, sort_keys=True) + "\n"
    return files


def _reference_inputs(spec: PipelineSpec) -> list[Path]:
    """The checkpoints a reference repository loads: refused when convert has not written them."""
    paths, missing = [], []
    for role in reference_roles(spec):
        directory = spec.checkpoint_dir(role)
        found = [directory / name for name in ("config.json", "manifest.json") if (directory / name).is_file()]
        if len(found) < 2:
            missing.append(f"{role}: {directory}")
        paths += found
    if missing:
        raise SpecbuildError(f"{spec.where}: build.backend reference serves converted checkpoints, and convert has "
                             f"not written them ({'; '.join(missing)})",
                             hint="run `specbuild convert SPEC` (on build.flow: pytorch with build.backend: "
                                  "reference it converts the target and a draft-target draft), then deploy again")
    stale = [problem for role in reference_roles(spec)
             if (problem := stale_conversion(role, spec.checkpoint_dir(role))) is not None]
    if stale:  # the repository would serve the old model, and its inputs (the manifests) say "up to date"
        raise SpecbuildError(f"{spec.where}: build.backend reference serves converted checkpoints, and "
                             f"{'; '.join(stale)}: it would serve the old model",
                             hint="run `specbuild convert SPEC`, then deploy again")
    return paths


def _draft_export_inputs(spec: PipelineSpec) -> list[Path]:
    """A quantized draft's ModelOpt HF export (what speculative_model names): an input on either backend, so a
    reconverted draft redeploys; refused when convert has not written it."""
    directory = quantized_draft_dir(spec)
    if directory is None:
        return []
    paths = [directory / name for name in ("config.json", HF_QUANT_CONFIG, "manifest.json")]
    if not all(path.is_file() for path in paths):
        raise SpecbuildError(f"{spec.where}: speculative_model is the quantized draft convert writes to {directory} "
                             "(ModelOpt's Hugging Face export), and it is not there",
                             hint="run `specbuild convert SPEC`, then deploy again")
    return paths


def _built_settings(spec: PipelineSpec) -> dict[str, Any]:
    """The settings `build` recorded, refused when missing or not what the spec says now."""
    path = llm_api_dir(spec) / LLM_API_PLAN
    hint = "run `specbuild build SPEC` (on build.flow: pytorch it checks the LLM-API settings), then deploy again"
    try:
        recorded = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise SpecbuildError(f"{path}: not found or unreadable; build has not run for this spec", hint=hint) from None
    current = json.loads(json.dumps(llm_args(spec)))  # JSON's view: schedule keys become strings as recorded
    if recorded != current:
        changed = sorted(k for k in set(recorded) | set(current) if recorded.get(k) != current.get(k))
        raise SpecbuildError(f"{path}: the LLM-API settings build checked are not what the spec says now "
                             f"({', '.join(changed)} changed)", hint=hint)
    return llm_args(spec)


def spec_file(spec: PipelineSpec) -> Path | None:
    """The spec's file, an input of deploy (None for a spec made in memory)."""
    try:
        return spec.path
    except RuntimeError:
        return None


REPOSITORY_NAME = "deploy.model_repository"
"""How a refusal names the repository deploy writes (the spec field the user changes)."""


def llmapi_inputs(spec: PipelineSpec) -> Inputs:
    """What the llmapi repository is made from or names: build's settings, the reference's checkpoints, the
    quantized draft's export, the models the LLM API loads, and the spec."""
    checkpoints = {f"output_dir's {role} checkpoint": spec.checkpoint_dir(role) for role in reference_roles(spec)}
    return {"output_dir's llm_api directory": llm_api_dir(spec), **checkpoints,
            "output_dir's draft-hf checkpoint": quantized_draft_dir(spec), "target.model": spec.target.model,
            "draft.model": spec.draft.model if spec.draft is not None else None, "SPEC": spec_file(spec)}


def deploy_llm_api(spec: PipelineSpec, *, dry_run: bool = False, force: bool = False,
                   console: Console | None = None) -> LlmApiDeployResult:
    """Write the llmapi repository of a `build.flow: pytorch` spec (see the module docstring)."""
    console = console or Console(stderr=True)
    repository = spec.deploy.model_repository
    assert repository is not None
    named = llmapi_inputs(spec)
    refuse_overlap(repository, named, output_name=REPOSITORY_NAME)
    refuse_pytorch_flow_problems(spec, "deploy")
    args = _built_settings(spec)
    files = repository_files(spec, args)
    if dry_run:
        for name in files:
            console.print(f"would write {repository / name}", highlight=False, soft_wrap=True)
        return LlmApiDeployResult(repository, "planned", files)
    with output_lock(repository):
        known = read_manifest(repository)
        inputs = fingerprint_files([llm_api_dir(spec) / LLM_API_PLAN, *_reference_inputs(spec),
                                    *_draft_export_inputs(spec)], (known or {}).get("inputs"))
        settings = {"files": {name: bytes_hash(text.encode()) for name, text in files.items()}}
        tools = tool_versions()
        if not force and is_fresh(known, settings=settings, tools=tools, inputs=inputs, directory=repository):
            return LlmApiDeployResult(repository, "up to date", files)
        with atomic_directory(repository, inputs=named) as tmp:
            for name, text in files.items():
                (tmp / name).parent.mkdir(parents=True, exist_ok=True)
                (tmp / name).write_text(text, encoding="utf-8")
            (tmp / SERVE_SCRIPT).chmod(0o755)
            write_manifest(tmp, {"stage": "deploy", "flow": "pytorch", "spec": spec.where, "inputs": inputs,
                                 "settings": settings, "tools": tools, "outputs": output_sizes(tmp)})
    return LlmApiDeployResult(repository, "written", files)
