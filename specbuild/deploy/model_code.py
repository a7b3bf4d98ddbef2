"""The python model code deploy copies into a Triton repository, and whether a deployed repository still holds
this specbuild's.

Every `model.py` deploy writes is a thin entry that imports specbuild's python models by name, so a repository
deployed by another specbuild can fail to load after an upgrade (an ImportError inside tritonserver's stub), or
load code that no longer matches what the installed specbuild serves. Deploy records the hash of each packaged
file in the repository's manifest (its freshness check: a redeploy rewrites them); `specbuild serve` compares those
records with the installed package before it starts tritonserver (`deployed_code_differences`), so a user reads
"redeploy" instead of a stub's traceback.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

from specbuild.contracts.llm_api import LLMAPI_MODEL
from specbuild.manifest import bytes_hash

MODEL_VERSION = "1"
"""The one model version deploy writes (`<model>/1/`)."""

LLMAPI_TEMPLATE = "llmapi"
"""The packaged directory of specbuild's reference llmapi model (served as LLMAPI_MODEL)."""


def package_files(template: str) -> dict[str, bytes]:
    """The python model code of a packaged model directory ({"1/model.py": bytes})."""
    root = resources.files("specbuild").joinpath("triton_models", template, MODEL_VERSION)
    if not root.is_dir():
        return {}
    return {f"{MODEL_VERSION}/{entry.name}": entry.read_bytes() for entry in root.iterdir()
            if entry.name.endswith(".py")}


def code_hashes(templates: set[str] | list[str]) -> dict[str, str]:
    """{"<template>/1/model.py": content hash} of the packaged templates: what deploy's manifest records."""
    return {f"{template}/{name}": bytes_hash(data) for template in sorted(set(templates))
            for name, data in package_files(template).items()}


LLMAPI_CODE_FILE = f"{LLMAPI_MODEL}/{MODEL_VERSION}/model.py"
"""Where a `build.flow: pytorch` repository on the reference backend holds specbuild's llmapi model code."""


def llmapi_reference_code() -> bytes:
    """specbuild's llmapi model.py (a thin entry over specbuild.python_models.llmapi_model)."""
    return package_files(LLMAPI_TEMPLATE)[f"{MODEL_VERSION}/model.py"]


def deployed_code_differences(manifest: dict[str, Any] | None) -> list[str]:
    """The packaged files whose hash in a repository's deploy `manifest` differs from the installed specbuild's:
    one line each. [] when they all match, or for no specbuild deploy manifest (nothing to compare: a repository
    written by hand or by NVIDIA's tools)."""
    if not manifest or manifest.get("stage") != "deploy":
        return []
    settings = manifest.get("settings")
    settings = settings if isinstance(settings, dict) else {}
    if isinstance(settings.get("code"), dict):  # the engine flow: {"<template>/1/<file>": hash}
        recorded: dict[str, str] = settings["code"]
        current = code_hashes({key.split("/", 1)[0] for key in recorded})
    else:  # the pytorch flow: {"<repository path>": hash of its text}; only the reference model's code is ours
        files = settings.get("files")
        if not isinstance(files, dict) or LLMAPI_CODE_FILE not in files:
            return []
        recorded = {LLMAPI_CODE_FILE: files[LLMAPI_CODE_FILE]}
        current = {LLMAPI_CODE_FILE: bytes_hash(llmapi_reference_code())}
    return [f"{name}: {'no longer packaged' if name not in current else 'changed'}"
            for name in sorted(recorded) if current.get(name) != recorded[name]]
