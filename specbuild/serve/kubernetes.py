"""Kubernetes manifests for tritonserver on a repository of TensorRT-LLM engines: the same launch `specbuild serve`
runs, in a pod.

`<output_dir>/k8s/tritonserver.yaml` holds an apps/v1 Deployment and a v1 Service:
- the container runs the command `launch` builds for the repository: one tritonserver, or for engines built with
  tp×pp > 1 the TensorRT-LLM launcher's `mpirun` line with one rank per GPU (`launch.mpi_command`), with
  `/opt/tritonserver/bin/tritonserver`, the launcher's default binary (tensorrtllm_backend
  scripts/launch_triton_server.py @c2e65b88), and requests and limits `nvidia.com/gpu: tp×pp`;
- readiness is Triton's `/v2/health/ready` (ready once every model has loaded), liveness `/v2/health/live`;
- the build (repository and engines, whose absolute paths the config.pbtxt files hold) comes from the
  PersistentVolumeClaim `deploy.kubernetes.models_pvc`, mounted at the same path as here, and /dev/shm is a memory
  volume (the python backend's BLS and tokenizer models exchange tensors there; a container's default is 64 MiB);
- the Service exposes deploy's HTTP, gRPC and metrics ports.

The tests validate both objects with Kubernetes' own JSON schemas (strict: unknown fields fail).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from specbuild.atomic import atomic_directory
from specbuild.errors import SpecbuildError
from specbuild.manifest import comment, output_sizes, write_manifest
from specbuild.serve.launch import (
    Ports,
    TensorrtModels,
    mpi_command,
    server_args,
    string_parameters,
    tensorrt_models,
)
from specbuild.spec import PipelineSpec
from specbuild.spec.kubernetes import object_name

K8S_DIR = "k8s"
MANIFEST = "tritonserver.yaml"
TRITONSERVER = Path("/opt/tritonserver/bin/tritonserver")
SHM_PREFIX = "specbuild_"
CONTAINER = "tritonserver"
STARTUP_S = 1800
"""How long a pod may take to become live (engines of a large model load for minutes) before it is restarted."""


class _PlainDumper(yaml.SafeDumper):
    """Writes a value used twice (the labels) out twice, not as a YAML anchor and alias: what a reader expects."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


BUILD_PATHS = ("gpt_model_path", "encoder_model_path", "tokenizer_dir")
"""The config parameters that name what deploy's build holds (engines, a tokenizer); the others with absolute paths,
such as the backend's `executor_worker_path`, name files of the image."""


def build_root(repository: Path) -> Path:
    """The one directory the pod must see at the same path: the repository and the engines its configs name.
    Refused when they share no directory but `/`."""
    paths = [str(repository)]
    for config in sorted(repository.glob("*/config.pbtxt")):
        body = config.read_text(encoding="utf-8", errors="replace")
        paths += [value for key, value in string_parameters(body, config)
                  if key in BUILD_PATHS and value.startswith("/")]
    root = Path(os.path.commonpath(paths))
    if root == Path("/"):
        raise SpecbuildError(
            f"{repository}: the repository and the engines its configs name share no directory, so no one volume "
            "can give a pod all of them",
            hint="keep deploy.model_repository and the engines under the spec's output_dir (the defaults)")
    return root


def tritonserver_command(spec: PipelineSpec, repository: Path, trt: TensorrtModels) -> tuple[list[str], int]:
    """The container's command (as `specbuild serve` launches it, with the image's binary) and its GPUs, for the
    repository's tensorrtllm models `trt`."""
    ports = Ports(spec.deploy.http_port, spec.deploy.grpc_port, spec.deploy.metrics_port)
    if trt.world_size > 1:
        return mpi_command(TRITONSERVER, repository, ports, world_size=trt.world_size,
                           tensorrt_model_names=trt.names, shm_prefix=SHM_PREFIX), trt.world_size
    args = server_args(repository, ports, host="0.0.0.0", backend_directory=None, shm_prefix=SHM_PREFIX)
    return [str(TRITONSERVER), *args], 1


def manifests(spec: PipelineSpec, repository: Path, trt: TensorrtModels, root: Path) -> list[dict[str, Any]]:
    """The Deployment and the Service for `repository` (written by deploy from `spec`; its tensorrtllm models
    `trt`, the build mounted from `root`)."""
    name = object_name(spec.name)
    labels = {"app.kubernetes.io/name": "tritonserver", "app.kubernetes.io/instance": name,
              "app.kubernetes.io/managed-by": "specbuild"}
    command, gpus = tritonserver_command(spec, repository, trt)
    deploy = spec.deploy
    ports = {"http": deploy.http_port, "grpc": deploy.grpc_port, "metrics": deploy.metrics_port}
    probe = {"httpGet": {"path": "/v2/health/live", "port": "http"}, "periodSeconds": 10}
    container = {
        "name": CONTAINER, "image": deploy.kubernetes.container_image, "command": command,
        "ports": [{"name": port, "containerPort": number, "protocol": "TCP"} for port, number in ports.items()],
        "startupProbe": {**probe, "failureThreshold": STARTUP_S // 10},
        "livenessProbe": {**probe, "failureThreshold": 3},
        "readinessProbe": {"httpGet": {"path": "/v2/health/ready", "port": "http"}, "periodSeconds": 5,
                           "failureThreshold": 3},
        "resources": {"limits": {"nvidia.com/gpu": gpus}, "requests": {"nvidia.com/gpu": gpus}},
        "volumeMounts": [{"name": "build", "mountPath": str(root)}, {"name": "dshm", "mountPath": "/dev/shm"}],
    }
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "labels": labels},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels}, "spec": {
                     "containers": [container],
                     "volumes": [{"name": "build",
                                  "persistentVolumeClaim": {"claimName": deploy.kubernetes.models_pvc}},
                                 {"name": "dshm", "emptyDir": {"medium": "Memory"}}]}}},
    }
    service = {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "labels": labels},
        "spec": {"type": "ClusterIP", "selector": labels,
                 "ports": [{"name": port, "port": number, "targetPort": port, "protocol": "TCP"}
                           for port, number in ports.items()]},
    }
    return [deployment, service]


def manifest_text(spec: PipelineSpec, repository: Path) -> str | None:
    """tritonserver.yaml for `repository`, or None when it holds no TensorRT-LLM engine (a reference build runs
    on this machine's CPU: there is no image for it)."""
    trt = tensorrt_models(repository)
    if not trt.names:
        return None
    root = build_root(repository)
    header = comment(f"tritonserver for {repository},\nwritten by specbuild deploy from {spec.where}.\n"
                     f"The PersistentVolumeClaim {spec.deploy.kubernetes.models_pvc} must hold {root}\n(the model "
                     "repository and the engines) as it is on the machine that ran deploy: it is mounted at the same "
                     "path.\nApply with `kubectl apply -f` this file.") + "\n"
    return header + yaml.dump_all(manifests(spec, repository, trt, root), Dumper=_PlainDumper, sort_keys=False)


def write_kubernetes(spec: PipelineSpec, repository: Path) -> Path | None:
    """Write `<output_dir>/k8s/` for the repository deploy wrote (whole, or not at all); None when there is no
    engine to serve on a cluster."""
    text = manifest_text(spec, repository)
    if text is None:
        return None
    directory = spec.output_dir / K8S_DIR
    with atomic_directory(directory, output_name="output_dir's k8s directory") as tmp:
        (tmp / MANIFEST).write_text(text, encoding="utf-8")
        write_manifest(tmp, {"stage": "deploy", "target": "kubernetes", "spec": spec.where,
                             "repository": str(repository), "outputs": output_sizes(tmp)})
    return directory / MANIFEST
