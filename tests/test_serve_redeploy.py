"""A repository deployed by another specbuild: `specbuild serve` says so and says how to heal it.

Every model.py deploy writes imports specbuild's python models by name, so a specbuild upgrade without a redeploy
can leave a repository whose model code imports what the installed specbuild no longer has (found in use: a
repository deployed before `parse_choices` moved failed to load with an ImportError in the stub). The repository's
manifest records the hash of each model file deploy wrote; serve compares them with the installed package.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from specbuild.deploy.model_code import deployed_code_differences, package_files
from specbuild.manifest import bytes_hash, read_manifest
from specbuild.serve.run import redeploy_hint
from tests.deploy_fixtures import Deployed, deploy_pytorch_flow, pipeline_data, write_spec

OLD_IMPORT = "from specbuild.python_models.llm_engine import build_engine\n"
GONE_IMPORT = "from specbuild.python_models.llm_engine import build_engine_of_another_release as build_engine\n"


def _differences(repository: Path) -> list[str]:
    return deployed_code_differences(read_manifest(repository))


def _as_another_specbuild_deployed_it(repository: Path) -> None:
    """The repository as a specbuild whose tensorrt_llm model.py imports a name this one lacks would have written
    it: that model.py, and its hash in the manifest (as deploy records what it wrote)."""
    code = package_files("tensorrt_llm")["1/model.py"].decode()
    assert OLD_IMPORT in code
    other = code.replace(OLD_IMPORT, GONE_IMPORT).encode()
    (repository / "tensorrt_llm" / "1" / "model.py").write_bytes(other)
    manifest = json.loads((repository / "manifest.json").read_text())
    manifest["settings"]["code"]["tensorrt_llm/1/model.py"] = bytes_hash(other)
    manifest["outputs"]["tensorrt_llm/1/model.py"] = len(other)
    (repository / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


@pytest.mark.slow
@pytest.mark.tritonserver
def test_serve_names_a_repository_deployed_by_another_specbuild_and_a_redeploy_heals_it(
        deployed: Deployed, tmp_path: Path) -> None:
    repository = tmp_path / "model_repository"
    shutil.copytree(deployed.repository("none"), repository)
    assert _differences(repository) == [] and redeploy_hint(repository) is None

    _as_another_specbuild_deployed_it(repository)
    assert _differences(repository) == ["tensorrt_llm/1/model.py: changed"]
    spec = deployed.specs["none"]
    done = subprocess.run([sys.executable, "-m", "specbuild.cli", "serve", str(repository), "--log-file",
                           str(tmp_path / "server.log"), "--prompt", "The for statement"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr
    said = " ".join(done.stderr.split())
    assert "deployed by another specbuild" in said and "tensorrt_llm/1/model.py: changed" in said, said
    assert "model 'tensorrt_llm' failed to load" in said and "build_engine_of_another_release" in said, said
    # the warning before the start, and again as the failure's hint, both naming the deploy that heals it
    assert said.count(f"specbuild deploy {spec.where}") == 2, said
    assert "Traceback" not in done.stderr

    # the deploy it names rewrites the model code; pointed at this copy, it heals the copy
    from specbuild.deploy.repository import deploy_repository

    data = yaml.safe_load(Path(spec.where).read_text())
    data["name"] = "demo-plain-copy"
    data["deploy"]["model_repository"] = str(repository)
    deploy_repository(write_spec(tmp_path / "specs", data))
    assert _differences(repository) == [] and redeploy_hint(repository) is None
    assert (repository / "tensorrt_llm" / "1" / "model.py").read_bytes() == package_files("tensorrt_llm")["1/model.py"]


def test_an_llmapi_repository_deployed_by_another_specbuild_is_named(tmp_path: Path,
                                                                    demo_models: dict[str, Path]) -> None:
    """The PyTorch flow's repository on the reference backend holds specbuild's llmapi model.py: the same check
    (its manifest records every file's hash; only that model.py is specbuild's code)."""
    repository = deploy_pytorch_flow(tmp_path, pipeline_data("demo-llmapi", demo_models, "draft_target",
                                                             tmp_path / "out"))
    assert _differences(repository) == []
    manifest = json.loads((repository / "manifest.json").read_text())
    manifest["settings"]["files"]["tensorrt_llm/1/model.py"] = bytes_hash(b"# another specbuild's model.py\n")
    (repository / "manifest.json").write_text(json.dumps(manifest))
    assert _differences(repository) == ["tensorrt_llm/1/model.py: changed"]
    assert "redeploy it with `specbuild deploy " in (redeploy_hint(repository) or "")


def test_a_repository_without_a_specbuild_manifest_is_not_judged(tmp_path: Path) -> None:
    """A repository written by hand or by NVIDIA's tools has no deploy manifest: nothing to compare, no warning;
    nor does a manifest of another shape stop serve with a traceback."""
    (tmp_path / "repo" / "tensorrt_llm" / "1").mkdir(parents=True)
    assert _differences(tmp_path / "repo") == [] and redeploy_hint(tmp_path / "repo") is None
    for settings in ({"code": ["tensorrt_llm/1/model.py"]}, {"files": "model.py"}, ["code"], None):
        assert deployed_code_differences({"stage": "deploy", "settings": settings}) == [], settings
