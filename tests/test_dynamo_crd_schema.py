"""The DynamoGraphDeployment `specbuild deploy` writes, judged as `nvidia.com/v1beta1` against Dynamo's own data.

Two judges, neither of them specbuild's tables:
- the CRD's v1beta1 schema (the parts specbuild writes, from the Go types the CRD is generated from, sources in the
  file's `$comment`: specbuild/data/dynamo/dynamographdeployment-v1beta1.schema.json), which Dynamo's own templates
  must pass too (else the schema is stricter than the CRD), and which can fail (a broken manifest is refused);
- the DGD templates inside the installed ai-dynamo 1.6.1 wheel (dynamo/profiler/templates/dgd/<engine>/), which
  name the components, give their types and say how a container runs the frontend and the workers: specbuild's
  manifest for the same engine and mode must have the same components and commands.
The CRD's CEL rule JSON Schema cannot state (component names unique case-insensitively,
deploy/operator/api/v1beta1/dynamographdeployment_types.go @0fddc01b) is checked here on every manifest.
"""

from __future__ import annotations

import copy
import json
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

SCHEMA = json.loads(resources.files("specbuild").joinpath("data", "dynamo",
                                                          "dynamographdeployment-v1beta1.schema.json").read_text())
CASES = {"trtllm-agg": ("trtllm", {}), "trtllm-disagg": ("trtllm", {"mode": "disaggregated", "kv_transfer": "nixl"}),
         "vllm-agg": ("vllm", {"engine": "vllm"}),
         "vllm-disagg": ("vllm", {"engine": "vllm", "mode": "disaggregated", "kv_transfer": "nixl"}),
         "sglang-agg": ("sglang", {"engine": "sglang"}),
         "sglang-disagg": ("sglang", {"engine": "sglang", "mode": "disaggregated", "kv_transfer": "nixl"})}


def _templates() -> Path:
    """The installed ai-dynamo wheel's DGD templates (skipped where the wheel is not installed)."""
    dynamo = pytest.importorskip("dynamo.profiler")
    return Path(dynamo.__file__).parent / "templates" / "dgd"


def _template(engine: str, mode: str) -> dict[str, Any]:
    return yaml.safe_load((_templates() / engine / f"{'disagg' if mode == 'disaggregated' else 'agg'}.yaml")
                          .read_text(encoding="utf-8"))


def _model(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"hidden_size": 8, "vocab_size": 16}), encoding="utf-8")
    return path


def _written(tmp: Path, dynamo: dict[str, Any]) -> dict[str, Any]:
    """The manifest `specbuild deploy` writes for a small draft-target spec with `dynamo` settings."""
    from specbuild.build.llm_api import build_llm_api
    from specbuild.dynamo.write import MANIFEST, deploy_dynamo
    from specbuild.spec import load_spec

    data = {"name": "crd-test", "output_dir": str(tmp / "out"), "target": {"model": str(_model(tmp / "target"))},
            "draft": {"model": str(_model(tmp / "draft"))},
            "speculative": {"mode": "draft_target", "num_draft_tokens": 3},
            "build": {"flow": "pytorch", "dtype": "float16", "max_batch_size": 4, "max_input_len": 64,
                      "max_output_len": 16},
            "deploy": {"target": "dynamo", "dynamo": dynamo}}
    path = tmp / "pipeline.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    spec = load_spec(path)
    if spec.deploy.dynamo.engine == "trtllm":
        build_llm_api(spec)
    return yaml.safe_load((deploy_dynamo(spec).directory / MANIFEST).read_text(encoding="utf-8"))


def _unique_names(manifest: dict[str, Any]) -> None:
    """The CRD's CEL rule on spec.components: names unique case-insensitively."""
    names = [component["name"].lower() for component in manifest["spec"]["components"]]
    assert len(names) == len(set(names)), names


def _main(component: dict[str, Any]) -> dict[str, Any]:
    (main,) = [c for c in component["podTemplate"]["spec"]["containers"] if c["name"] == "main"]
    return main


def test_dynamos_own_templates_pass_the_schema() -> None:
    """The schema is no stricter than the CRD on what Dynamo itself writes."""
    paths = sorted(_templates().glob("*/*.yaml"))
    assert len(paths) >= 6, paths
    for path in paths:
        template = yaml.safe_load(path.read_text(encoding="utf-8"))
        jsonschema.validate(template, SCHEMA)
        _unique_names(template)


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_every_written_manifest_is_v1beta1_shaped_as_dynamos_template(tmp_path: Path,
                                                                      case: tuple[str, dict[str, Any]]) -> None:
    engine, dynamo = case
    manifest = _written(tmp_path, dynamo)
    jsonschema.validate(manifest, SCHEMA)
    _unique_names(manifest)
    template = _template(engine, dynamo.get("mode", "aggregated"))
    assert manifest["apiVersion"] == template["apiVersion"] == "nvidia.com/v1beta1"
    assert manifest["spec"]["backendFramework"] == engine
    ours = {c["name"]: c for c in manifest["spec"]["components"]}
    theirs = {c["name"]: c for c in template["spec"]["components"]}
    # The components Dynamo 1.6.1 names, with its types (vLLM's workers `worker`/`prefill`/`decode` since 1.6.0).
    assert {n: c["type"] for n, c in ours.items()} == {n: c["type"] for n, c in theirs.items()}
    for name, component in ours.items():
        main, reference = _main(component), _main(theirs[name])
        # The same program: `python3 -m dynamo.<x>`, split between command and args as the template splits it.
        assert main["command"] == reference["command"]
        if component["type"] == "frontend":
            assert main["args"][:len(reference["args"])] == reference["args"]
        else:  # the GPUs as the template asks for them
            assert set(main["resources"]["limits"]) == set(reference["resources"]["limits"]) == {"nvidia.com/gpu"}


def test_the_schema_refuses_what_the_crd_refuses(tmp_path: Path) -> None:
    """The validator can fail: each change below breaks one of the CRD's rules (or strict field validation)."""
    manifest = _written(tmp_path, {})
    breaks = {"a negative replica count": lambda m: m["spec"]["components"][1].update(replicas=-1),
              "an unknown backend": lambda m: m["spec"].update(backendFramework="tensorrt"),
              "an unknown component type": lambda m: m["spec"]["components"][1].update(type="router"),
              "a name with an underscore": lambda m: m["spec"]["components"][1].update(name="trtllm_worker"),
              "v1alpha1's services map": lambda m: m["spec"].update(services={}),
              "v1alpha1's extraPodSpec": lambda m: m["spec"]["components"][1].update(extraPodSpec={}),
              "no main container": lambda m: _main(m["spec"]["components"][1]).update(name="engine"),
              "the old apiVersion": lambda m: m.update(apiVersion="nvidia.com/v1alpha1")}
    for what, change in breaks.items():
        broken = copy.deepcopy(manifest)
        change(broken)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(broken, SCHEMA)
            pytest.fail(f"the schema accepted {what}")
    duplicate = copy.deepcopy(manifest)
    duplicate["spec"]["components"][1]["name"] = "frontend"  # Frontend, case-insensitively
    with pytest.raises(AssertionError):
        _unique_names(duplicate)
