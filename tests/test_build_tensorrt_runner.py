"""The tensorrt backend's orchestration (parallel builds on their own GPUs, one log per engine, the engine's
config.json checked against the plan, atomic swap, engine.json + manifest), driven through a stand-in
`trtllm-build`: TensorRT-LLM cannot be installed here. The stand-in writes what TensorRT-LLM 1.2's builder
writes (NVIDIA/TensorRT-LLM `tensorrt_llm/builder.py` `build()` @008b2b8d, `examples/medusa/README.md`, 1.x):
`config.json` = {version, pretrained_config, build_config} with max_seq_len raised by max_draft_len under a
speculative mode, and `rank{N}.engine`."""

from __future__ import annotations

import io
import json
import os
import stat
import sys
from pathlib import Path

import pytest
from rich.console import Console

from specbuild.build import build_pipeline, stage
from specbuild.build.backend import TensorrtStatus
from specbuild.build.gpu import Gpu
from specbuild.contracts.engine_info import engine_dir, read_engine_info
from specbuild.errors import SpecbuildError
from tests.build_pipelines import convert_all, place_all, write_pipeline

FAKE_BUILDER = r'''#!{python}
import json, os, sys
args = sys.argv[1:]
def value(flag, default=None):
    return args[args.index(flag) + 1] if flag in args else default
print("fake trtllm-build", " ".join(args))
print("CUDA_VISIBLE_DEVICES=" + os.environ.get("CUDA_VISIBLE_DEVICES", ""))
if os.environ.get("FAKE_TRTLLM_FAIL") and os.environ["FAKE_TRTLLM_FAIL"] in value("--checkpoint_dir"):
    print("[TRT-LLM] [E] out of memory"); sys.exit(3)
ckpt = json.load(open(os.path.join(value("--checkpoint_dir"), "config.json")))
draft = int(value("--max_draft_len", "0"))
mode = value("--speculative_decoding_mode")
build = {{"max_batch_size": int(value("--max_batch_size")), "max_input_len": int(value("--max_input_len")),
         "max_seq_len": int(value("--max_seq_len")) + (draft if mode else 0),
         "max_num_tokens": int(value("--max_num_tokens")), "max_draft_len": draft}}
out = value("--output_dir")
config = {{"version": "1.2.0", "pretrained_config": ckpt, "build_config": build}}
json.dump(config, open(os.path.join(out, "config.json"), "w"))
open(os.path.join(out, "rank0.engine"), "wb").write(b"engine")
'''


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return convert_all(tmp_path_factory.mktemp("build-trt"))


@pytest.fixture
def fake_trtllm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    builder = bin_dir / "trtllm-build"
    builder.write_text(FAKE_BUILDER.format(python=sys.executable))
    builder.chmod(builder.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    status = TensorrtStatus("1.2.0", (Gpu("H100", 9.0, 80.0), Gpu("H100", 9.0, 80.0)), None)
    monkeypatch.setattr(stage, "resolve_backend", lambda requested: ("tensorrt", status))


def test_engines_build_in_parallel_on_their_own_gpus_and_are_checked(tmp_path: Path, models: dict[str, Path],
                                                                      fake_trtllm: None) -> None:
    spec = write_pipeline(tmp_path / "p", models)
    place_all(spec, models)
    results = build_pipeline(spec, backend="tensorrt", jobs=2, console=Console(file=io.StringIO()))
    assert [(r.role, r.backend, r.status) for r in results] == [("target", "tensorrt", "written"),
                                                                ("draft", "tensorrt", "written")]
    devices = set()
    for role in ("target", "draft"):
        directory = engine_dir(spec, role)
        log = (directory / "build.log").read_text()
        assert log.startswith("$ trtllm-build --checkpoint_dir")
        devices.add(log.split("CUDA_VISIBLE_DEVICES=")[1].split()[0])
        assert {"config.json", "rank0.engine", "engine.json", "manifest.json"} <= {p.name for p in directory.iterdir()}
        manifest = json.loads((directory / "manifest.json").read_text())
        assert manifest["settings"]["tensorrt_llm"] == "1.2.0" and manifest["tools"]["tensorrt_llm"] == "1.2.0"
    assert devices == {"0", "1"}
    info = read_engine_info(engine_dir(spec, "target"))
    assert (info.backend, info.speculative_decoding_mode) == ("tensorrt", "draft_tokens_external")
    assert info.max_draft_len == 4
    again = build_pipeline(spec, backend="tensorrt", jobs=2, console=Console(file=io.StringIO()))
    assert [r.status for r in again] == ["up to date", "up to date"]


def test_a_failed_trtllm_build_keeps_its_log_and_writes_no_engine(tmp_path: Path, models: dict[str, Path],
                                                                   fake_trtllm: None,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    spec = write_pipeline(tmp_path / "p", models, mode="none")
    place_all(spec, models)
    monkeypatch.setenv("FAKE_TRTLLM_FAIL", "target")
    with pytest.raises(SpecbuildError, match="trtllm-build exited with status 3") as caught:
        build_pipeline(spec, backend="tensorrt", console=Console(file=io.StringIO()))
    assert "out of memory" in caught.value.message
    kept = spec.output_dir / "engines" / "target.failed.log"
    assert "out of memory" in kept.read_text()
    assert not engine_dir(spec, "target").exists()
