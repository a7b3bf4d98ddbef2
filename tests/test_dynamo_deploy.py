"""`deploy.target: dynamo`: what validate refuses before anything is written, and the DynamoGraphDeployments and
launches deploy writes, each manifest checked against the CRD's v1beta1 openAPIV3Schema (the parts specbuild
writes, kept with their sources as specbuild/data/dynamo/dynamographdeployment-v1beta1.schema.json; the schema itself
is tested in tests/test_dynamo_crd_schema.py) by the `jsonschema` package.

No demo models: tiny model directories (a config.json) are enough for build's LLM-API check and export's plans.
(Named test_dynamo_*: ai-dynamo's pytest plugins skip test_vllm_*/test_sglang_*/test_trtllm_* files.)
"""

from __future__ import annotations

import json
import shlex
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from specbuild.errors import SpecbuildError
from specbuild.spec import PipelineSpec, load_spec

SCHEMA = json.loads(resources.files("specbuild").joinpath("data", "dynamo",
                                                          "dynamographdeployment-v1beta1.schema.json").read_text())


def components(manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A v1beta1 manifest's components by name."""
    return {component["name"]: component for component in manifest["spec"]["components"]}


def main_container(component: dict[str, Any]) -> dict[str, Any]:
    """The component's `main` container, the one the operator injects its defaults into."""
    (main,) = [c for c in component["podTemplate"]["spec"]["containers"] if c["name"] == "main"]
    return main


def _model(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"hidden_size": 8, "vocab_size": 16}), encoding="utf-8")
    return path


def _data(tmp: Path, **dynamo: Any) -> dict[str, Any]:
    return {"name": "dyn_test.1", "output_dir": str(tmp / "out"), "target": {"model": str(_model(tmp / "target"))},
            "draft": {"model": str(_model(tmp / "draft"))},
            "speculative": {"mode": "draft_target", "num_draft_tokens": 3},
            "build": {"flow": "pytorch", "dtype": "float16", "tp_size": 2, "max_batch_size": 4, "max_input_len": 64,
                      "max_output_len": 16},
            "deploy": {"target": "dynamo", "dynamo": dynamo}}


def _spec(tmp: Path, data: dict[str, Any]) -> PipelineSpec:
    path = tmp / "pipeline.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return load_spec(path)


def _deploy(tmp: Path, data: dict[str, Any]) -> tuple[PipelineSpec, dict[str, Any], dict[str, Any]]:
    from specbuild.build.llm_api import build_llm_api
    from specbuild.dynamo.write import LAUNCH_FILE, MANIFEST, deploy_dynamo

    spec = _spec(tmp, data)
    if spec.deploy.dynamo.engine == "trtllm":
        build_llm_api(spec)
    result = deploy_dynamo(spec)
    manifest = yaml.safe_load((result.directory / MANIFEST).read_text())
    plan = json.loads((result.directory / LAUNCH_FILE).read_text())
    return spec, manifest, plan


def _refused(tmp: Path, data: dict[str, Any]) -> str:
    with pytest.raises(SpecbuildError) as caught:
        _spec(tmp, data)
    assert not (tmp / "out").exists()
    return str(caught.value)


def test_aggregated_trtllm_manifest_validates_with_replicas_gpus_and_the_models_volume(tmp_path: Path) -> None:
    spec, manifest, plan = _deploy(tmp_path, _data(tmp_path, workers=3))
    jsonschema.validate(manifest, SCHEMA)
    assert manifest["apiVersion"] == "nvidia.com/v1beta1"
    named = components(manifest)
    assert {name: c["type"] for name, c in named.items()} == {"Frontend": "frontend", "TRTLLMWorker": "worker"}
    worker = named["TRTLLMWorker"]
    assert worker["replicas"] == 3
    main = main_container(worker)
    assert main["resources"]["limits"]["nvidia.com/gpu"] == "2"  # tp 2 x pp 1
    # The models' PVC is a pod volume, mounted where the arguments below point.
    (volume,) = worker["podTemplate"]["spec"]["volumes"]
    assert volume["persistentVolumeClaim"] == {"claimName": "specbuild-models"}
    assert [(m["name"], m["mountPath"]) for m in main["volumeMounts"]] == [(volume["name"], "/models")]
    args = main["args"]
    settings = json.loads(args[args.index("--override-engine-args") + 1])
    # The pod's settings are build's LLM-API settings, with the models moved to the PVC's mount.
    from specbuild.contracts.llm_api import llm_args

    expected = {k: v for k, v in json.loads(json.dumps(llm_args(spec))).items() if k != "model"}
    expected["speculative_config"]["speculative_model"] = "/models/draft"
    assert settings == expected
    assert args[args.index("--model") + 1] == "/models/target"
    # The local launch: the frontend with the router, and each worker reading engine.yaml (the same settings).
    assert plan["frontend"][-2:] == ["--router-mode", "kv"]
    command = plan["workers"][0]["command"]
    assert command[:3] == ["python3", "-m", "dynamo.trtllm"] and plan["workers"][0]["replicas"] == 3
    engine_file = yaml.safe_load((spec.output_dir / "dynamo" / "engine.yaml").read_text())
    assert engine_file == {k: v for k, v in json.loads(json.dumps(llm_args(spec))).items() if k != "model"}
    script = (spec.output_dir / "dynamo" / "launch.sh").read_text()
    assert script.count("python3 -m dynamo.trtllm") == 3
    assert "CUDA_VISIBLE_DEVICES=4,5 " in script  # the third worker's two GPUs


def test_disaggregated_manifests_have_prefill_and_decode_with_the_kv_transfer(tmp_path: Path) -> None:
    _, manifest, _ = _deploy(tmp_path, _data(tmp_path, mode="disaggregated", prefill_workers=2, decode_workers=1,
                                             kv_transfer="nixl", router_mode="round-robin"))
    jsonschema.validate(manifest, SCHEMA)
    named = components(manifest)
    assert {name: (c["type"], c["replicas"]) for name, c in named.items() if name != "Frontend"} \
        == {"prefill": ("prefill", 2), "decode": ("decode", 1)}
    for role in ("prefill", "decode"):
        args = main_container(named[role])["args"]
        assert args[args.index("--disaggregation-mode") + 1] == role
        settings = json.loads(args[args.index("--override-engine-args") + 1])
        assert settings["cache_transceiver_config"] == {"backend": "NIXL"}
        assert "--publish-kv-events" not in args  # round-robin: no KV router to publish to


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_vllm_and_sglang_workers_take_exports_arguments(tmp_path: Path, engine: str) -> None:
    from specbuild.export import build_plan

    data = _data(tmp_path, engine=engine, mode="disaggregated", kv_transfer="nixl")
    spec, manifest, plan = _deploy(tmp_path, data)
    jsonschema.validate(manifest, SCHEMA)
    assert manifest["spec"]["backendFramework"] == engine
    exported = build_plan(spec, engine, tmp_path / "x").argv
    for role in plan["workers"]:
        command = role["command"]
        assert command[:3] == ["python3", "-m", f"dynamo.{engine}"]
        # Every flag export writes reaches the worker with its value (one writer for the engine's settings).
        for index, item in enumerate(exported):
            if item.startswith("--") and index + 1 < len(exported) and not exported[index + 1].startswith("--"):
                assert command[command.index(item) + 1] == exported[index + 1], item
        assert "--disaggregation-mode" in command
        assert command.count("--served-model-name") == 1, command  # once: the name clients ask for
        assert command[command.index("--served-model-name") + 1] == spec.name
    draft = main_container(components(manifest)["decode"])["args"]
    assert not any(str(tmp_path) in arg for arg in draft), "host paths left in a pod's arguments"
    assert shlex.split(" ".join(shlex.quote(a) for a in draft))  # plain strings, as the CRD's args are


def test_a_worker_wider_than_a_node_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    data = _data(tmp_path, gpus_per_node=4)
    data["build"]["pp_size"] = 4  # tp 2 x pp 4 = 8 GPUs per worker
    message = _refused(tmp_path, data)
    assert "build.tp_size" in message and "8 GPUs" in message and "gpus_per_node is 4" in message


def test_disaggregation_without_a_kv_transfer_is_refused(tmp_path: Path) -> None:
    message = _refused(tmp_path, _data(tmp_path, mode="disaggregated"))
    assert "deploy.dynamo.kv_transfer" in message and "required" in message
    message = _refused(tmp_path, _data(tmp_path, engine="vllm", mode="disaggregated", kv_transfer="ucx"))
    assert "'ucx' is not a KV transfer vllm takes" in message


def test_the_trtllm_worker_on_the_engine_flow_and_stray_settings_are_refused(tmp_path: Path) -> None:
    data = _data(tmp_path)
    data["build"]["flow"] = "engine"
    assert "deploy.dynamo.engine" in _refused(tmp_path, data)
    assert "only used with mode: disaggregated" in _refused(tmp_path, _data(tmp_path, kv_transfer="nixl"))
    data = _data(tmp_path, workers=2)  # a setting for Dynamo in a Triton deployment (a defaults-only section is none)
    data["deploy"]["target"] = "triton"
    assert "only used with deploy.target: dynamo" in _refused(tmp_path, data)


def test_serve_here_refuses_what_only_gpu_hosts_run(tmp_path: Path) -> None:
    """`specbuild serve` runs Dynamo here with the reference engine only: a vLLM deployment, or a disaggregated one,
    is refused with where it runs instead (launch.sh), before anything starts."""
    from specbuild.dynamo.launch import DynamoServer

    vllm = tmp_path / "vllm"
    spec, _, _ = _deploy(vllm, _data(vllm, engine="vllm"))
    with pytest.raises(SpecbuildError, match=r"engine 'vllm' is served by its own workers") as caught:
        DynamoServer(spec.output_dir / "dynamo")
    assert "launch.sh" in (caught.value.hint or "")
    disaggregated = tmp_path / "disagg"
    data = _data(disaggregated, mode="disaggregated", kv_transfer="nixl")
    data["build"]["backend"] = "reference"
    data["build"]["tp_size"] = 1
    spec, _, _ = _deploy(disaggregated, data)
    with pytest.raises(SpecbuildError, match=r"mode 'disaggregated'"):
        DynamoServer(spec.output_dir / "dynamo")


def test_a_spec_path_holding_a_newline_stays_in_the_manifests_comment(tmp_path: Path) -> None:
    """The DynamoGraphDeployment's header names the spec; a newline in its path starts another comment line, where it
    used to end the comment and put the rest of the path into the YAML (deploy wrote a manifest kubectl could not
    parse, and said it succeeded)."""
    home = tmp_path / "specs\nkind: Secret"
    home.mkdir()
    spec, manifest, _ = _deploy(home, _data(tmp_path, workers=1))
    text = (spec.output_dir / "dynamo" / "k8s" / "dynamographdeployment.yaml").read_text(encoding="utf-8")
    comments = "\n".join(line[2:] for line in text.splitlines() if line.startswith("# "))
    assert "\n" in str(spec.path) and str(spec.path) in comments, text[:400]
    jsonschema.validate(manifest, SCHEMA)


def test_sglang_eagle3_by_load_writes_the_adaptive_config_its_workers_name(tmp_path: Path) -> None:
    """SGLang's --speculative-adaptive-config names a JSON file (sglang 0.5.23 adaptive_spec_params.py opens it):
    the Dynamo directory holds the same file `specbuild export sglang` writes, where launch.sh's workers look, and a
    pod's arguments name it on the models' mount (no host path), as the manifest's header says."""
    from specbuild.dynamo.write import MANIFEST
    from specbuild.export import build_plan
    from specbuild.export.sglang import ADAPTIVE_FILE
    from tests.test_export import _mode_spec

    data = yaml.safe_load(_mode_spec(tmp_path, "eagle3", draft_len_schedule={1: 3, 4: 1},
                                     max_concurrency=8).path.read_text())
    data.update(output_dir=str(tmp_path / "out"), deploy={"target": "dynamo", "dynamo": {"engine": "sglang"}})
    spec, manifest, plan = _deploy(tmp_path, data)
    jsonschema.validate(manifest, SCHEMA)
    written = spec.output_dir / "dynamo" / ADAPTIVE_FILE
    assert written.read_text() == build_plan(spec, "sglang", tmp_path / "x").files[ADAPTIVE_FILE]
    (role,) = plan["workers"]
    command = role["command"]
    assert command[command.index("--speculative-adaptive-config") + 1] == str(written)
    args = main_container(components(manifest)["decode"])["args"]
    assert args[args.index("--speculative-adaptive-config") + 1] == f"/models/{ADAPTIVE_FILE}"
    assert not any(str(tmp_path) in arg for arg in args), "host paths left in a pod's arguments"
    assert f"/models/{ADAPTIVE_FILE}" in (spec.output_dir / "dynamo" / MANIFEST).read_text().split("apiVersion")[0]
