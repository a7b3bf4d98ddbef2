"""`specbuild deploy` for `deploy.target: dynamo`: the local launch and the Kubernetes DynamoGraphDeployment.

Writes `<output_dir>/dynamo/` atomically:
- `launch.json`: what `specbuild serve DIR` starts (the frontend's arguments, each worker role's command and
  replicas, the model name, the HTTP port deploy.http_port, the longest prompt build.max_input_len), and
  `launch.sh`, the same launch for a GPU host with the engines installed: the Dynamo frontend (`python -m
  dynamo.frontend --router-mode ...`, file discovery, loopback, HTTP on DYN_HTTP_HOST or loopback) and N workers.
- The workers' engine settings, from the one writer each engine has in specbuild: TensorRT-LLM's LLM-API settings
  as `build` checked them (`specbuild.deploy.llmapi`, the same mapping trtllm-serve's options file and Triton's
  llmapi model.yaml carry) in `engine.yaml`, passed as `--extra-engine-args` (ai-dynamo/dynamo
  examples/backends/trtllm/launch/, 1.6.1 wheel dynamo/trtllm/backend_args.py); vLLM's and SGLang's arguments from
  `specbuild export`'s plan (`specbuild.export.build_plan`), after `python -m dynamo.vllm --model M` /
  `python -m dynamo.sglang`.
- export's files its SGLang arguments name (`speculative_adaptive.json`, for --speculative-adaptive-config), which
  a pod reads from the models' PVC at /models/<name> (the manifest's header says so).
- `reference.json` on build.backend: reference (engine trtllm): the converted checkpoints specbuild's reference
  serving engine loads when `specbuild serve` runs the workers on CPU.
- `k8s/dynamographdeployment.yaml`: a `nvidia.com/v1beta1` DynamoGraphDeployment (the storage version since Dynamo
  1.5; v1alpha1 is deprecated) in the shape of the ai-dynamo 1.6.1 wheel's own templates
  (dynamo/profiler/templates/dgd/{trtllm,vllm,sglang}/{agg,disagg}.yaml), validated against the CRD's v1beta1 schema
  in the tests (specbuild/data/dynamo/dynamographdeployment-v1beta1.schema.json, its sources in its header):
  `spec.components`, a frontend and the worker components (aggregated, or prefill and decode) with their
  replicas, each a podTemplate whose `main` container runs it; GPUs per worker = tp x pp as the container's
  `nvidia.com/gpu`, the models' PVC a pod volume mounted at /models, and the engine settings inline
  (`--override-engine-args` JSON for trtllm) with the models' paths moved to the mount.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console

from specbuild.atomic import atomic_directory, refuse_overlap
from specbuild.errors import SpecbuildError
from specbuild.manifest import comment, output_sizes, write_manifest
from specbuild.spec import PipelineSpec
from specbuild.spec.dynamo import FRONTEND_SERVICE, WORKER_SERVICES
from specbuild.spec.kubernetes import object_name

DEPLOY_DIR = "dynamo"
LAUNCH_FILE = "launch.json"
LAUNCH_SCRIPT = "launch.sh"
ENGINE_FILE = "engine.yaml"
REFERENCE_FILE = "reference.json"
MANIFEST = "k8s/dynamographdeployment.yaml"
MODEL_MOUNT = "/models"
NAMESPACE = "specbuild"
COMPONENT = "backend"
KV_BLOCK_SIZE = 16
WORKER_MODULES = {"trtllm": "dynamo.trtllm", "vllm": "dynamo.vllm", "sglang": "dynamo.sglang"}
TRTLLM_KV_BACKENDS = {"nixl": "NIXL", "ucx": "UCX", "mpi": "MPI"}
"""deploy.dynamo.kv_transfer -> TensorRT-LLM's CacheTransceiverConfig.backend (NVIDIA/TensorRT-LLM
tensorrt_llm/llmapi/llm_args.py: DEFAULT, UCX, NIXL, MPI)."""
SGLANG_KV_BACKENDS = {"nixl": "nixl", "mooncake": "mooncake"}
VLLM_KV_CONNECTORS = {"nixl": "NixlConnector"}
VLLM_KV_ROLES = {"prefill": "kv_producer", "decode": "kv_consumer"}
"""vLLM's --kv-transfer-config per role, as the 1.6.1 wheel's dynamo/profiler/templates/dgd/vllm/disagg.yaml."""


def deployment_dir(spec: PipelineSpec) -> Path:
    return spec.output_dir / DEPLOY_DIR


def served_name(spec: PipelineSpec) -> str:
    """The model name clients ask for (/v1/models lists it): the spec's name."""
    return spec.name


@dataclass
class DynamoDeployResult:
    directory: Path
    status: str
    files: dict[str, str]

    def summary(self) -> str:
        return (f"{self.status}: {self.directory} (NVIDIA Dynamo: {LAUNCH_FILE} for `specbuild serve`, "
                f"{LAUNCH_SCRIPT}, {MANIFEST})")


# -- the engines' settings, each from its one writer -------------------------------------------------------------
def trtllm_settings(spec: PipelineSpec, role: str) -> dict[str, Any]:
    """The LLM-API settings build checked (refused when build has not run or the spec changed since), with the
    KV cache transceiver a disaggregated worker needs."""
    from specbuild.deploy.llmapi import _built_settings

    settings = {key: value for key, value in _built_settings(spec).items() if key != "model"}
    dynamo = spec.deploy.dynamo
    if role in ("prefill", "decode") and dynamo.kv_transfer is not None:
        settings["cache_transceiver_config"] = {"backend": TRTLLM_KV_BACKENDS[dynamo.kv_transfer]}
    return settings


def export_args(spec: PipelineSpec, engine: str, directory: Path) -> list[str]:
    """vLLM's or SGLang's server arguments as `specbuild export` writes them, after their program (and model)."""
    from specbuild.export import build_plan

    plan = build_plan(spec, engine, directory)
    if engine == "vllm":  # `vllm serve MODEL --flag ...`: Dynamo's worker takes --model and vLLM's flags
        return ["--model", *plan.argv[2:]]
    return plan.argv[3:]  # `python -m sglang.launch_server --model-path M ...`: the flags as they are


def exported_files(spec: PipelineSpec) -> dict[str, str]:
    """The files of export's plan that the workers' arguments name by path (SGLang's --speculative-adaptive-config
    JSON): written into the deployment directory, where those arguments point, and moved to the models' mount in a
    pod. The engine's own config file export writes beside its command is not named, so not written."""
    from specbuild.export import build_plan

    engine = spec.deploy.dynamo.engine
    if engine == "trtllm":
        return {}
    directory = deployment_dir(spec)
    plan = build_plan(spec, engine, directory)
    return {name: text for name, text in plan.files.items() if str(directory / name) in plan.argv}


def worker_args(spec: PipelineSpec, role: str, engine_file: str | None) -> list[str]:
    """One worker role's arguments after `python -m dynamo.<engine>`; `engine_file` names the trtllm settings
    file (None: the settings inline as --override-engine-args JSON, for a pod)."""
    dynamo = spec.deploy.dynamo
    engine = dynamo.engine
    disaggregated = role in ("prefill", "decode")
    if engine == "trtllm":
        args = ["--model", str(spec.target.model), "--served-model-name", served_name(spec)]
        if engine_file is not None:
            args += ["--extra-engine-args", engine_file]
        else:
            args += ["--override-engine-args", json.dumps(trtllm_settings(spec, role), sort_keys=True)]
        if dynamo.router_mode == "kv":
            args.append("--publish-kv-events")
        if disaggregated:
            args += ["--disaggregation-mode", role]
        return args
    args = export_args(spec, engine, deployment_dir(spec))
    if "--served-model-name" not in args:  # export names it (the spec's name): once, as clients ask for it
        args += ["--served-model-name", served_name(spec)]
    if disaggregated:
        args += ["--disaggregation-mode", role]
        assert dynamo.kv_transfer is not None
        if engine == "vllm":
            config = {"kv_connector": VLLM_KV_CONNECTORS[dynamo.kv_transfer], "kv_role": VLLM_KV_ROLES[role]}
            args += ["--kv-transfer-config", json.dumps(config, separators=(",", ":"))]
        else:
            args += ["--disaggregation-transfer-backend", SGLANG_KV_BACKENDS[dynamo.kv_transfer]]
    return args


def frontend_args(spec: PipelineSpec) -> list[str]:
    """`python -m dynamo.frontend` arguments: the router mode and the HTTP port (deploy.http_port)."""
    return ["--http-port", str(spec.deploy.http_port), "--router-mode", spec.deploy.dynamo.router_mode]


def _container_paths(spec: PipelineSpec) -> dict[str, str]:
    """Host model directories -> where the models' PVC puts them in a pod."""
    from specbuild.contracts.llm_api import draft_model_dir

    paths = {str(spec.target.model): f"{MODEL_MOUNT}/target"}
    draft = draft_model_dir(spec) if spec.build.flow == "pytorch" else None
    if draft is None and spec.draft is not None and spec.draft.model is not None:
        draft = spec.draft.model
    if draft is not None:
        paths[str(draft)] = f"{MODEL_MOUNT}/draft"
    for name in exported_files(spec):  # a pod reads them from the models' PVC (the manifest's header says so)
        paths[str(deployment_dir(spec) / name)] = f"{MODEL_MOUNT}/{name}"
    return paths


def _moved(value: str, paths: dict[str, str]) -> str:
    for host, mounted in sorted(paths.items(), key=lambda item: -len(item[0])):
        value = value.replace(host, mounted)
    return value


# -- the files ---------------------------------------------------------------------------------------------------
def launch_plan(spec: PipelineSpec) -> dict[str, Any]:
    """launch.json: everything `specbuild serve` and launch.sh start, with the host's paths."""
    dynamo = spec.deploy.dynamo
    engine_file = ENGINE_FILE if dynamo.engine == "trtllm" else None
    roles = [{"role": role, "replicas": count, "gpus": spec.build.world_size,
              "command": ["python3", "-m", WORKER_MODULES[dynamo.engine], *worker_args(spec, role, engine_file)]}
             for role, count in dynamo.worker_counts().items()]
    reference = dynamo.engine == "trtllm" and spec.build.backend == "reference"
    return {"engine": dynamo.engine, "mode": dynamo.mode, "model_name": served_name(spec),
            "tokenizer": str(Path(spec.target.model).resolve()), "namespace": NAMESPACE, "component": COMPONENT,
            "kv_block_size": KV_BLOCK_SIZE, "router_mode": dynamo.router_mode, "http_port": spec.deploy.http_port,
            "max_input_len": spec.build.max_input_len,  # the longest prompt the reference workers serve
            "frontend": ["python3", "-m", "dynamo.frontend", *frontend_args(spec)],
            "workers": roles, "engine_file": engine_file, "reference": REFERENCE_FILE if reference else None}


def launch_script(plan: dict[str, Any]) -> str:
    """launch.sh: the frontend and every worker on this host (file discovery, loopback), stopped together."""
    lines = ["#!/bin/sh",
             "# NVIDIA Dynamo 1.6.1 on one host, written by specbuild: the frontend and its router, then the workers",
             "# (each on its own GPUs). Needs ai-dynamo and the engine installed. Ctrl-C stops everything.",
             'cd "$(dirname "$0")" || exit 1',
             'export DYN_FILE_KV="${DYN_FILE_KV:-$(mktemp -d)}" DYN_DISCOVERY_BACKEND=file',
             "export DYN_TCP_RPC_HOST=127.0.0.1 DYN_TCP_RESPONSE_STREAM_HOST=127.0.0.1 DYN_EVENT_PLANE_HOST=127.0.0.1",
             "# the frontend's HTTP on loopback unless DYN_HTTP_HOST says otherwise (Dynamo's own default: 0.0.0.0)",
             'export DYN_HTTP_HOST="${DYN_HTTP_HOST:-127.0.0.1}"',
             "trap 'kill 0' INT TERM",
             f"{shlex.join(plan['frontend'])} --discovery-backend file &"]
    gpu = 0
    for role in plan["workers"]:
        for _ in range(role["replicas"]):
            devices = ",".join(str(gpu + i) for i in range(role["gpus"]))
            gpu += role["gpus"]
            lines.append(f"CUDA_VISIBLE_DEVICES={devices} {shlex.join(role['command'])} &")
    lines.append("wait")
    return "\n".join(lines) + "\n"


MAIN_CONTAINER = "main"
"""The container the operator injects its defaults into; every v1beta1 component's podTemplate must hold it, with
an image (ai-dynamo/dynamo deploy/operator/api/v1beta1/dynamocomponentdeployment_types.go @006b6e10,
MainContainerName)."""
MODELS_VOLUME = "models"
GPU_RESOURCE = "nvidia.com/gpu"


def _component(name: str, kind: str, replicas: int, container: dict[str, Any],
               volumes: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """One v1beta1 component, in the key order of the wheel's templates."""
    pod: dict[str, Any] = {"containers": [{"name": MAIN_CONTAINER, **container}]}
    if volumes:
        pod["volumes"] = volumes
    return {"name": name, "type": kind, "replicas": replicas, "podTemplate": {"spec": pod}}


def manifest(spec: PipelineSpec) -> dict[str, Any]:
    """The DynamoGraphDeployment (nvidia.com/v1beta1) for this spec: `spec.components`, each with a podTemplate
    whose `main` container runs the frontend or a worker, the models' PVC as a pod volume mounted at /models and
    the worker's GPUs as the container's `nvidia.com/gpu` limit (the wheel's dgd/*/agg.yaml and disagg.yaml)."""
    dynamo = spec.deploy.dynamo
    paths = _container_paths(spec)
    image = dynamo.container_image
    gpus = str(spec.build.world_size)
    components = [_component(FRONTEND_SERVICE, "frontend", 1, {
        "image": image, "command": ["python3"], "args": ["-m", "dynamo.frontend", *frontend_args(spec)]})]
    volumes = [{"name": MODELS_VOLUME, "persistentVolumeClaim": {"claimName": dynamo.models_pvc}}]
    for role, count in dynamo.worker_counts().items():
        name = WORKER_SERVICES[dynamo.engine] if role == "worker" else role
        container = {"image": image, "workingDir": "/workspace",
                     "command": ["python3", "-m", WORKER_MODULES[dynamo.engine]],
                     "args": [_moved(arg, paths) for arg in worker_args(spec, role, None)],
                     "resources": {"limits": {GPU_RESOURCE: gpus}, "requests": {GPU_RESOURCE: gpus}},
                     "volumeMounts": [{"name": MODELS_VOLUME, "mountPath": MODEL_MOUNT}]}
        components.append(_component(name, role, count, container, volumes))
    return {"apiVersion": "nvidia.com/v1beta1", "kind": "DynamoGraphDeployment",
            "metadata": {"name": object_name(spec.name)},
            "spec": {"backendFramework": dynamo.engine, "components": components}}


def deployment_files(spec: PipelineSpec) -> dict[str, str]:
    """{relative path: text} of the deployment directory."""
    from specbuild.contracts.llm_api import reference_settings

    plan = launch_plan(spec)
    exported = exported_files(spec)
    also = "".join(f", this directory's {name} at {MODEL_MOUNT}/{name}" for name in exported)
    header = comment(f"DynamoGraphDeployment for {spec.where}, written by specbuild. The models' PVC "
                     f"({spec.deploy.dynamo.models_pvc}) holds the target at {MODEL_MOUNT}/target{also} and a draft "
                     f"at {MODEL_MOUNT}/draft.") + "\n"
    files = {LAUNCH_FILE: json.dumps(plan, indent=2) + "\n", LAUNCH_SCRIPT: launch_script(plan),
             MANIFEST: header + yaml.safe_dump(manifest(spec), sort_keys=False), **exported}
    if plan["engine_file"] is not None:
        files[ENGINE_FILE] = ("# TensorRT-LLM LLM-API settings (python -m dynamo.trtllm --extra-engine-args), as "
                              "`specbuild build` checked them.\n"
                              + yaml.safe_dump(trtllm_settings(spec, plan["workers"][0]["role"]), sort_keys=False))
    if plan["reference"] is not None:
        files[REFERENCE_FILE] = json.dumps(reference_settings(spec), indent=2, sort_keys=True) + "\n"
    return files


def deploy_dynamo(spec: PipelineSpec, *, dry_run: bool = False, force: bool = False,
                  console: Console | None = None) -> DynamoDeployResult:
    """Write the Dynamo deployment of `spec` (see the module docstring); everything is computed, and refused,
    before the directory is touched."""
    console = console or Console(stderr=True)
    if spec.deploy.target != "dynamo":
        raise SpecbuildError(f"{spec.where}: deploy.target is {spec.deploy.target!r}, not 'dynamo'")
    directory = deployment_dir(spec)
    inputs = {"target.model": spec.target.model, "draft.model": spec.draft.model if spec.draft else None}
    refuse_overlap(directory, inputs, output_name="output_dir's dynamo directory")
    files = deployment_files(spec)
    if dry_run:
        for name in files:
            console.print(f"would write {directory / name}", highlight=False, soft_wrap=True)
        return DynamoDeployResult(directory, "planned", files)
    del force  # the directory is rewritten every time: it is small and made only from the spec and build's record
    with atomic_directory(directory, inputs=inputs, output_name="output_dir's dynamo directory") as tmp:
        for name, text in files.items():
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp / name).write_text(text, encoding="utf-8")
        (tmp / LAUNCH_SCRIPT).chmod(0o755)
        write_manifest(tmp, {"stage": "deploy", "target": "dynamo", "spec": spec.where,
                             "outputs": output_sizes(tmp)})
    return DynamoDeployResult(directory, "written", files)
