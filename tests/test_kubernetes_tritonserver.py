"""`specbuild deploy` on TensorRT-LLM engines writes Kubernetes manifests for tritonserver, judged by Kubernetes'
own schemas.

TensorRT-LLM engines cannot be built on this CPU machine, so the engines here are what `build` writes on a GPU
machine stood in by their metadata (engine.json with backend tensorrt, TensorRT-LLM's config.json, an empty
rank file), as in tests/test_deploy_repository.py. The manifests are validated with `kubernetes-validate`'s JSON
schemas, generated from the Kubernetes API's OpenAPI definitions, in strict mode (an unknown field fails, as
`kubectl apply`'s server-side field validation refuses it); no API server runs here.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from typer.testing import CliRunner

from specbuild.cli import app
from specbuild.contracts.engine_info import engine_dir, read_engine_info, write_engine_info
from specbuild.deploy.pbtxt import parameter, read_config
from specbuild.serve.launch import TensorrtModels, mpi_command, tensorrt_models
from specbuild.spec import PipelineSpec
from tests.deploy_fixtures import Deployed, write_spec

KUBERNETES = ("1.30.0", "1.37.0")
"""The Kubernetes releases whose schemas judge the manifests: an older supported one and the newest bundled."""
runner = CliRunner()


def tensorrt_pipeline(deployed: Deployed, tmp_path: Path, *, tp: int = 1) -> PipelineSpec:
    """The demo draft-target spec with TensorRT-LLM engines (tp `tp`) in a private output_dir."""
    source = deployed.specs["draft_target"]
    data = yaml.safe_load(source.path.read_text())  # type: ignore[union-attr]
    data.update(name="Trt_Demo", output_dir=str(tmp_path / "out"))
    data["build"]["tp_size"] = tp
    spec = write_spec(tmp_path, data)
    for role in ("target", "draft"):
        directory = engine_dir(spec, role)
        directory.mkdir(parents=True)
        info = dataclasses.replace(read_engine_info(engine_dir(source, role)), backend="tensorrt", tp_size=tp)
        write_engine_info(directory, info)
        (directory / "config.json").write_text(json.dumps({"build_config": {"max_batch_size": 4}}))
        for rank in range(tp):
            (directory / f"rank{rank}.engine").write_bytes(b"")
    return spec


def deploy(spec: PipelineSpec) -> list[dict[str, Any]]:
    """`specbuild deploy SPEC` as a user runs it; the objects of the tritonserver manifest it wrote."""
    result = runner.invoke(app, ["deploy", str(spec.path)])
    assert result.exit_code == 0, result.output
    manifest = spec.output_dir / "k8s" / "tritonserver.yaml"
    assert "Kubernetes:" in result.output and manifest.is_file()
    return list(yaml.safe_load_all(manifest.read_text()))


def container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    (only,) = deployment["spec"]["template"]["spec"]["containers"]
    return only


def test_manifests_validate_and_serve_the_repository_deploy_wrote(deployed: Deployed, tmp_path: Path) -> None:
    spec = tensorrt_pipeline(deployed, tmp_path)
    objects = deploy(spec)
    assert sorted(o["kind"] for o in objects) == ["Deployment", "Service"]
    for version in KUBERNETES:
        for obj in objects:
            kubernetes_validate.validate(obj, version, strict=True)

    repository = spec.deploy.model_repository
    assert repository is not None
    main = container(objects)
    command = main["command"]
    assert command[0] == "/opt/tritonserver/bin/tritonserver"
    assert f"--model-repository={repository}" in command
    ports = {p["name"]: p["containerPort"] for p in main["ports"]}
    assert ports == {"http": spec.deploy.http_port, "grpc": spec.deploy.grpc_port,
                     "metrics": spec.deploy.metrics_port}
    for name, number in ports.items():
        assert f"--{name}-port={number}" in command and f"--{name}-address=0.0.0.0" in command
    assert main["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    assert main["resources"]["limits"] == {"nvidia.com/gpu": 1} == main["resources"]["requests"]
    assert main["image"].startswith("nvcr.io/nvidia/tritonserver:") and main["image"].endswith("-trtllm-python-py3")

    # every path the configs name is inside the volume, mounted at the same path
    mount = Path(next(m["mountPath"] for m in main["volumeMounts"] if m["name"] == "build"))
    for model in ("tensorrt_llm", "tensorrt_llm_draft"):
        engine = Path(parameter(read_config(repository / model / "config.pbtxt"), "gpt_model_path"))
        assert engine.is_relative_to(mount) and engine.is_absolute()
    assert repository.is_relative_to(mount)
    volumes = objects[0]["spec"]["template"]["spec"]["volumes"]
    claim = next(v for v in volumes if v["name"] == "build")["persistentVolumeClaim"]["claimName"]
    assert claim == spec.deploy.kubernetes.models_pvc

    service = next(o for o in objects if o["kind"] == "Service")
    assert service["spec"]["selector"] == objects[0]["spec"]["selector"]["matchLabels"]
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == ports
    assert objects[0]["metadata"]["name"] == service["metadata"]["name"] == "trt-demo"


def test_sharded_engines_run_mpirun_with_a_rank_per_gpu(deployed: Deployed, tmp_path: Path) -> None:
    spec = tensorrt_pipeline(deployed, tmp_path, tp=2)
    objects = deploy(spec)
    for obj in objects:
        kubernetes_validate.validate(obj, KUBERNETES[-1], strict=True)
    main = container(objects)
    repository = spec.deploy.model_repository
    assert repository is not None
    found = tensorrt_models(repository)
    assert found == TensorrtModels(("tensorrt_llm", "tensorrt_llm_draft"), 2)
    command = main["command"]
    assert command[:2] == ["mpirun", "--allow-run-as-root"] and command.count(":") == 1
    assert command.count("/opt/tritonserver/bin/tritonserver") == 2
    assert main["resources"]["limits"] == {"nvidia.com/gpu": 2}
    # the same launch `specbuild serve` runs (serve.launch.mpi_command), only with the image's binary
    from specbuild.serve.kubernetes import SHM_PREFIX, TRITONSERVER
    from specbuild.serve.launch import Ports

    ports = Ports(spec.deploy.http_port, spec.deploy.grpc_port, spec.deploy.metrics_port)
    assert command == mpi_command(TRITONSERVER, repository, ports, world_size=2, tensorrt_model_names=found.names,
                                  shm_prefix=SHM_PREFIX)


def test_the_schemas_refuse_what_kubernetes_refuses(deployed: Deployed, tmp_path: Path) -> None:
    """The control: the validator the tests above trust rejects a misspelt field and a wrong type."""
    objects = deploy(tensorrt_pipeline(deployed, tmp_path))
    misspelt = json.loads(json.dumps(objects))
    probes = container(misspelt)
    probes["readinesProbe"] = probes.pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(misspelt[0], KUBERNETES[-1], strict=True)
    wrong = json.loads(json.dumps(objects[1]))
    wrong["spec"]["ports"][0]["port"] = "eight thousand"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(wrong, KUBERNETES[-1], strict=True)


def test_spec_settings_reach_the_manifest(deployed: Deployed, tmp_path: Path) -> None:
    spec = tensorrt_pipeline(deployed, tmp_path)
    data = yaml.safe_load(spec.path.read_text())  # type: ignore[union-attr]
    data["deploy"]["kubernetes"] = {"models_pvc": "team-llm-builds", "image": "registry.local/triton:1.2.0"}
    spec = write_spec(tmp_path, data)
    objects = deploy(spec)
    volumes = objects[0]["spec"]["template"]["spec"]["volumes"]
    assert volumes[0]["persistentVolumeClaim"]["claimName"] == "team-llm-builds"
    assert container(objects)["image"] == "registry.local/triton:1.2.0"


def test_a_reference_repository_gets_no_manifests(deployed: Deployed) -> None:
    """The reference backend runs on this CPU through specbuild's own python models: no image serves it."""
    spec = deployed.specs["draft_target"]
    result = runner.invoke(app, ["deploy", str(spec.path)])
    assert result.exit_code == 0, result.output
    assert not (spec.output_dir / "k8s").exists()
    assert "Kubernetes" not in result.output


def test_a_repository_apart_from_its_engines_keeps_deploy_and_says_why_no_manifests(deployed: Deployed,
                                                                                      tmp_path: Path) -> None:
    """One volume mounted at one path must give the pod the repository and the engines: a repository on another
    top-level directory than the engines gets a warning naming the fix, and deploy still succeeds."""
    import shutil
    import tempfile

    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)) or os.path.commonpath([shm, tmp_path]) != "/":
        pytest.skip("needs a writable directory beside the test's temporary directory under /")
    elsewhere = Path(tempfile.mkdtemp(prefix="specbuild-k8s-", dir=shm))
    try:
        spec = tensorrt_pipeline(deployed, tmp_path)
        data = yaml.safe_load(spec.path.read_text())  # type: ignore[union-attr]
        data["deploy"]["model_repository"] = str(elsewhere / "repository")
        spec = write_spec(tmp_path, data)
        result = runner.invoke(app, ["deploy", str(spec.path)])
        assert result.exit_code == 0, result.output
        text = " ".join(result.output.split())
        assert "warning: no Kubernetes manifests" in text and "deploy.model_repository" in text
        assert (elsewhere / "repository" / "ensemble" / "config.pbtxt").is_file()
        assert not (spec.output_dir / "k8s").exists()
    finally:
        shutil.rmtree(elsewhere, ignore_errors=True)


@pytest.mark.parametrize("name", ["demo", "Trt_Demo.v2", "démo-日本", "---", "x" * 80, "7b-medusa", "1", "9" * 64])
def test_every_spec_name_becomes_a_valid_object_name(name: str) -> None:
    """The one rule both manifests (tritonserver's here, Dynamo's DynamoGraphDeployment) name their objects by: an
    RFC 1035 label, as Kubernetes requires of a Service's name (kubernetes/kubernetes
    pkg/apis/core/validation/validation.go @000f2605, `ValidateServiceName = NameIsDNS1035Label`; the pattern is
    apimachinery's dns1035LabelFmt), so a spec name that starts with a digit gets a letter in front."""
    import re

    from specbuild.spec.kubernetes import object_name

    label = object_name(name)
    assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", label) and len(label) <= 63
    assert object_name(label) == label


def test_a_path_holding_a_newline_stays_inside_the_manifest_comments(deployed: Deployed, tmp_path: Path) -> None:
    """The header names the spec, the repository and the volume's root; a newline in those paths starts another
    comment line, where it used to end the comment and put the rest of the path into the YAML."""
    home = tmp_path / "builds\nkind: Secret"
    home.mkdir()
    objects = deploy(tensorrt_pipeline(deployed, home))
    assert [o["kind"] for o in objects] == ["Deployment", "Service"]
