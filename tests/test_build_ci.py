"""The GPU CI job for users' engine builds (.github/workflows/gpu-engines.yml + ci/gpu/) is wired consistently:
its spec passes every build check here, its scripts are valid bash, and it builds in the TensorRT-LLM 1.2
container on a self-hosted GPU runner and uploads the repository."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from specbuild.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_ci_spec_is_a_float16_tensorrt_pipeline() -> None:
    spec = load_spec(ROOT / "ci" / "gpu" / "demo-gpu.yaml")
    assert (spec.build.backend, spec.build.dtype, spec.speculative.mode) == ("tensorrt", "float16", "draft_target")
    assert spec.target.model == ROOT / "demo" / "models" / "target"


def test_gpu_ci_workflow_builds_in_the_1_2_container_and_uploads_the_repository() -> None:
    for script in ("engines.sh", "build-in-container.sh"):
        subprocess.run(["bash", "-n", str(ROOT / "ci" / "gpu" / script)], check=True)
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "gpu-engines.yml").read_text())
    job = workflow["jobs"]["engines"]
    assert job["runs-on"][0] == "self-hosted" and "gpu" in job["runs-on"]
    assert job["env"]["TRTLLM_IMAGE"].endswith("'nvcr.io/nvidia/tensorrt-llm/release:1.2.0' }}")
    runs = " ".join(step.get("run", "") for step in job["steps"])
    assert "make gpu-engines" in runs
    upload = next(step for step in job["steps"] if step.get("uses", "").startswith("actions/upload-artifact"))
    assert "model_repository" in upload["with"]["path"] and "engines" in upload["with"]["path"]
    engines = (ROOT / "ci" / "gpu" / "engines.sh").read_text()
    for stage in ("specbuild convert", "build-in-container.sh", "specbuild deploy"):
        assert stage in engines
    assert "--backend tensorrt" in (ROOT / "ci" / "gpu" / "build-in-container.sh").read_text()
