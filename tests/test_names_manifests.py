"""Names Dynamo's operator reads, judged on the DynamoGraphDeployments `specbuild deploy` writes.

The operator runs a DGD as a Grove PodCliqueSet named as the DGD, with a PodClique per service (v1beta1: per
`spec.components` entry) named as it, lower-cased (ai-dynamo/dynamo deploy/operator/internal/dynamo/graph.go
@d4872d7e), and Grove refuses a PodCliqueSet whose name plus a PodClique's exceed 45 characters (ai-dynamo/grove
operator/internal/webhook/admission/pcs/validation/podcliqueset.go @4d416a5c, validatePodNameConstraints). The
sums below are that arithmetic on the written manifest; the component names come from the manifest, not from
specbuild's tables. Tiny model directories (a config.json) are enough, as in tests/test_dynamo_deploy.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from specbuild.cli import app
from specbuild.spec import PipelineSpec, load_spec
from specbuild.spec.kubernetes import dynamo_name_problem

GROVE_LIMIT = 45
CASES = {"trtllm": {}, "vllm-disaggregated": {"engine": "vllm", "mode": "disaggregated", "kv_transfer": "nixl"},
         "sglang": {"engine": "sglang"}}


def _model(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"hidden_size": 8, "vocab_size": 16}), encoding="utf-8")
    return path


def _spec(tmp: Path, name: str, dynamo: dict[str, Any]) -> PipelineSpec:
    data = {"name": name, "output_dir": str(tmp / "out"), "target": {"model": str(_model(tmp / "target"))},
            "build": {"flow": "pytorch", "dtype": "float16", "max_batch_size": 2, "max_input_len": 16,
                      "max_output_len": 8},
            "deploy": {"target": "dynamo", "dynamo": dynamo}}
    path = tmp / "pipeline.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return load_spec(path)


def _manifest(spec: PipelineSpec) -> dict[str, Any]:
    """The DynamoGraphDeployment `specbuild deploy` writes for `spec`."""
    from specbuild.build.llm_api import build_llm_api
    from specbuild.dynamo.write import MANIFEST, deploy_dynamo

    if spec.deploy.dynamo.engine == "trtllm":
        build_llm_api(spec)
    return yaml.safe_load((deploy_dynamo(spec).directory / MANIFEST).read_text(encoding="utf-8"))


def _component_names(manifest: dict[str, Any]) -> list[str]:
    """The v1beta1 manifest's component names (`spec.components[].name`): Grove's PodCliques, lower-cased."""
    return [component["name"] for component in manifest["spec"]["components"]]


def _pod_name_parts(manifest: dict[str, Any]) -> int:
    """Grove's sum for the manifest's longest service: the PodCliqueSet's name plus the PodClique's."""
    return len(manifest["metadata"]["name"]) + max(len(name.lower()) for name in _component_names(manifest))


@pytest.mark.parametrize("dynamo", CASES.values(), ids=CASES.keys())
def test_the_longest_name_accepted_fits_grove_and_one_more_character_is_refused(tmp_path: Path,
                                                                                dynamo: dict[str, Any]) -> None:
    short = _manifest(_spec(tmp_path / "short", "d", dynamo))
    room = GROVE_LIMIT - max(len(name) for name in _component_names(short))
    longest = _spec(tmp_path / "longest", "n" * room, dynamo)
    assert dynamo_name_problem(longest.name, longest.deploy.dynamo) is None
    assert _pod_name_parts(_manifest(longest)) == GROVE_LIMIT

    problem = dynamo_name_problem("n" * (room + 1), longest.deploy.dynamo)
    assert problem is not None and f"at most {GROVE_LIMIT} characters" in problem and f"may have {room}" in problem
    suggested = re.search(r"e\.g\. '([^']+)'", problem)
    assert suggested and dynamo_name_problem(suggested.group(1), longest.deploy.dynamo) is None


def test_a_name_starting_with_a_digit_names_the_deployment_with_a_letter_first(tmp_path: Path) -> None:
    manifest = _manifest(_spec(tmp_path, "7b-dynamo", {"engine": "vllm"}))
    assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", manifest["metadata"]["name"])
    assert manifest["metadata"]["name"].endswith("7b-dynamo")


def _validate(spec: PipelineSpec, name: str) -> str:
    """`specbuild validate` on `spec` renamed `name`: its output, after checking it refused (exit 1, no traceback)."""
    data = yaml.safe_load(spec.path.read_text(encoding="utf-8"))
    data["name"] = name
    spec.path.write_text(yaml.safe_dump(data), encoding="utf-8")
    result = CliRunner().invoke(app, ["validate", str(spec.path)], env={"COLUMNS": "300"})
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    return " ".join(result.output.split())


def test_validate_refuses_a_name_too_long_for_dynamo_naming_name_before_anything_is_written(tmp_path: Path) -> None:
    spec = _spec(tmp_path, "d", {})
    text = _validate(spec, "n" * (GROVE_LIMIT - len("TRTLLMWorker") + 1))
    assert "name" in text and f"at most {GROVE_LIMIT} characters" in text
    assert not (tmp_path / "out").exists()


def test_a_name_ending_in_a_newline_is_refused_naming_name(tmp_path: Path) -> None:
    assert "name: must be 1-64 letters" in _validate(_spec(tmp_path, "d", {}), "demo\n")
