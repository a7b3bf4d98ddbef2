"""`specbuild build` end to end on this machine: reference bundles deploy can load, manifests that skip unchanged
engines, atomic outputs, `--dry-run` scripts for the TensorRT-LLM 1.2 container, and backend selection."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest
import torch
from rich.console import Console
from typer.testing import CliRunner

from specbuild.build import build_pipeline
from specbuild.build.backend import TensorrtStatus, resolve_backend
from specbuild.build.gpu import Gpu, parse_gpu
from specbuild.build.plan import BuildPlan
from specbuild.build.tensorrt import engine_config_problems, gpu_slices
from specbuild.cli import app
from specbuild.contracts.engine_info import engine_dir, read_engine_info, reference_checkpoint
from specbuild.errors import SpecbuildError
from specbuild.runtime.checkpoint import load_checkpoint
from tests.build_pipelines import convert_all, place_all, write_pipeline

QUIET = Console(file=io.StringIO())
HAS_TRTLLM = importlib.util.find_spec("tensorrt_llm") is not None


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return convert_all(tmp_path_factory.mktemp("build-stage"))


def test_reference_bundles_hold_the_checkpoint_and_the_resolved_limits(tmp_path: Path,
                                                                        models: dict[str, Path]) -> None:
    spec = write_pipeline(tmp_path, models, speculative={"num_draft_tokens": 3, "use_draft_logits": True})
    place_all(spec, models)
    results = build_pipeline(spec, backend="reference", console=QUIET)
    assert [(r.role, r.backend, r.status) for r in results] == [("target", "reference", "written"),
                                                                ("draft", "reference", "written")]
    target = read_engine_info(engine_dir(spec, "target"))
    draft = read_engine_info(engine_dir(spec, "draft"))
    assert (target.architecture, target.dtype, target.vocab_size, target.tp_size, target.pp_size) == (
        "LlamaForCausalLM", "float16", 1000, 1, 1)
    assert (target.speculative_decoding_mode, target.max_draft_len, target.gather_generation_logits) == (
        "draft_tokens_external", 3, True)
    assert (draft.speculative_decoding_mode, draft.max_draft_len, draft.gather_generation_logits) == ("none", 0, True)
    assert (target.max_batch_size, target.max_seq_len, draft.max_seq_len) == (2, 32 + 16 + 3, 32 + 16)
    assert target.max_num_tokens >= target.max_batch_size * (3 + 1)
    for role in ("target", "draft"):
        bundle = reference_checkpoint(engine_dir(spec, role))
        source = spec.checkpoint_dir(role)
        assert os.path.samefile(bundle / "rank0.safetensors", source / "rank0.safetensors")  # hard-linked
        loaded, original = load_checkpoint(bundle), load_checkpoint(source)
        assert loaded.tensors.keys() == original.tensors.keys()
        assert all(torch.equal(loaded.tensors[k], original.tensors[k]) for k in loaded.tensors)
        manifest = json.loads((engine_dir(spec, role) / "manifest.json").read_text())
        assert manifest["settings"]["plan"]["role"] == role
        assert {"specbuild", "torch"} <= manifest["tools"].keys()
        assert str(source / "rank0.safetensors") in manifest["inputs"]


def test_medusa_bundle_carries_its_tree(tmp_path: Path, models: dict[str, Path]) -> None:
    choices = [[0], [0, 0], [1], [0, 1]]
    spec = write_pipeline(tmp_path, models, mode="medusa", choices=choices)
    place_all(spec, models)
    [result] = build_pipeline(spec, console=QUIET)
    info = read_engine_info(engine_dir(spec, "medusa"))
    assert (result.backend, info.architecture) == ("reference", "MedusaForCausalLM")
    assert (info.speculative_decoding_mode, info.max_draft_len, info.medusa_choices) == ("medusa", 4, choices)


def test_unchanged_inputs_skip_and_changes_rebuild(tmp_path: Path, models: dict[str, Path]) -> None:
    spec = write_pipeline(tmp_path, models, mode="none")
    place_all(spec, models)
    assert build_pipeline(spec, console=QUIET)[0].status == "written"
    assert build_pipeline(spec, console=QUIET)[0].status == "up to date"
    assert build_pipeline(spec, console=QUIET, force=True)[0].status == "written"
    bigger = write_pipeline(tmp_path, models, mode="none", build={"max_batch_size": 3})  # a new plan
    assert build_pipeline(bigger, console=QUIET)[0].status == "written"
    assert read_engine_info(engine_dir(bigger, "target")).max_batch_size == 3
    rank = bigger.checkpoint_dir("target") / "rank0.safetensors"  # a re-converted checkpoint: new content
    data = rank.read_bytes()
    rank.unlink()
    rank.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    assert build_pipeline(bigger, console=QUIET)[0].status == "written"


def test_a_failed_build_leaves_the_previous_engine_as_it_was(tmp_path: Path, models: dict[str, Path]) -> None:
    spec = write_pipeline(tmp_path, models, mode="none")
    place_all(spec, models)
    build_pipeline(spec, console=QUIET)
    before = (engine_dir(spec, "target") / "engine.json").read_text()
    rank = spec.checkpoint_dir("target") / "rank0.safetensors"
    rank.unlink()
    rank.write_bytes(b"not safetensors")
    with pytest.raises(SpecbuildError, match="target checkpoint: the reference runtime cannot load it"):
        build_pipeline(spec, console=QUIET)
    assert (engine_dir(spec, "target") / "engine.json").read_text() == before
    assert sorted(p.name for p in (spec.output_dir / "engines").iterdir()) == ["target"]  # no temporary left


def test_a_directory_specbuild_did_not_write_is_not_replaced(tmp_path: Path, models: dict[str, Path]) -> None:
    spec = write_pipeline(tmp_path, models, mode="none")
    place_all(spec, models)
    engine_dir(spec, "target").mkdir(parents=True)
    (engine_dir(spec, "target") / "mine.txt").write_text("keep")
    with pytest.raises(SpecbuildError, match="was not written by specbuild"):
        build_pipeline(spec, console=QUIET)
    assert (engine_dir(spec, "target") / "mine.txt").read_text() == "keep"


def _script_commands(text: str) -> list[list[str]]:
    """The trtllm-build invocations of a build.sh, with its variables in place, as argument lists."""
    joined = text.replace("\\\n", " ")
    commands = []
    for line in joined.splitlines():
        if line.startswith("trtllm-build "):
            words = shlex.split(line.split(" > ")[0])
            commands.append(words)
    return commands


def test_dry_run_writes_build_scripts_with_the_plans_arguments(tmp_path: Path, models: dict[str, Path]) -> None:
    spec = write_pipeline(tmp_path, models, speculative={"use_draft_logits": True})
    place_all(spec, models)
    out = io.StringIO()
    results = build_pipeline(spec, backend="tensorrt", dry_run=True, console=Console(file=out, width=300))
    assert not (spec.output_dir / "engines").exists()
    for result in results:
        assert result.status == "planned" and result.script is not None
        text = result.script.read_text()
        subprocess.run(["bash", "-n", str(result.script)], check=True)
        assert os.access(result.script, os.X_OK)
        [command] = _script_commands(text)
        expected = result.plan.command(output_dir=Path("$tmp"))
        expected[expected.index("--checkpoint_dir") + 1] = "$CHECKPOINT_DIR"
        assert command == expected
        assert f"CHECKPOINT_DIR=${{CHECKPOINT_DIR:-{shlex.quote(str(result.plan.checkpoint_dir))}}}" in text
        assert "nvcr.io/nvidia/tensorrt-llm/release:1.2.0" in text and "1.2.*)" in text
        engine_json = text.split("<<'SPECBUILD_ENGINE_JSON'\n")[1].split("\nSPECBUILD_ENGINE_JSON")[0]
        assert json.loads(engine_json) == {**result.info.to_json(), "backend": "tensorrt"}
        assert " ".join(result.plan.command()) in " ".join(out.getvalue().split())


def test_build_script_refuses_to_run_outside_trtllm_1_2(tmp_path: Path, models: dict[str, Path]) -> None:
    spec = write_pipeline(tmp_path, models, mode="none")
    place_all(spec, models)
    [result] = build_pipeline(spec, dry_run=True, console=QUIET)
    assert result.script is not None
    done = subprocess.run(["bash", str(result.script)], capture_output=True, text=True,
                          env={**os.environ, "PATH": "/usr/bin:/bin"})
    assert done.returncode == 1 and "needs TensorRT-LLM 1.2.x" in done.stderr
    assert not engine_dir(spec, "target").exists()


@pytest.mark.skipif(HAS_TRTLLM, reason="this machine has TensorRT-LLM: auto picks tensorrt here")
def test_auto_picks_reference_here_and_tensorrt_fails_with_the_container_to_use(tmp_path: Path,
                                                                                 models: dict[str, Path]) -> None:
    spec = write_pipeline(tmp_path, models, mode="none")
    place_all(spec, models)
    assert resolve_backend("auto")[0] == "reference"
    with pytest.raises(SpecbuildError) as caught:
        build_pipeline(spec, backend="tensorrt", console=QUIET)
    assert "backend 'tensorrt' needs TensorRT-LLM 1.2.x and an NVIDIA GPU" in caught.value.message
    assert caught.value.hint is not None and "nvcr.io/nvidia/tensorrt-llm/release:1.2.0" in caught.value.hint
    result = CliRunner().invoke(app, ["build", str(spec.path), "--backend", "tensorrt"])
    assert result.exit_code == 1 and "nvcr.io/nvidia/tensorrt-llm/release:1.2.0" in " ".join(result.output.split())
    result = CliRunner().invoke(app, ["build", str(spec.path)])
    assert result.exit_code == 0, result.output
    assert "target: reference engine" in " ".join(result.output.split())


def test_auto_picks_tensorrt_where_it_and_a_gpu_are_present() -> None:
    gpu = Gpu("H100", 9.0, 80.0)
    assert resolve_backend("auto", TensorrtStatus("1.2.0", (gpu,), None))[0] == "tensorrt"
    assert resolve_backend("auto", TensorrtStatus("1.2.0", (), "no NVIDIA GPU is visible"))[0] == "reference"


def test_an_unknown_backend_is_refused_before_probing_for_tensorrt_llm(monkeypatch: pytest.MonkeyPatch) -> None:
    def probe() -> TensorrtStatus:
        raise AssertionError("probed for TensorRT-LLM")

    monkeypatch.setattr("specbuild.build.backend.tensorrt_status", probe)
    with pytest.raises(SpecbuildError, match="unknown backend 'trt'") as caught:
        resolve_backend("trt")
    assert caught.value.hint == "use auto, tensorrt or reference"


def _plan(**changes: object) -> BuildPlan:
    base = dict(role="target", checkpoint_dir=Path("/c"), output_dir=Path("/e"), max_batch_size=4, max_input_len=99,
                max_seq_len=100, max_num_tokens=400, speculative_decoding_mode="draft_tokens_external", max_draft_len=4)
    return BuildPlan(**{**base, **changes})  # type: ignore[arg-type]


def test_built_engine_config_is_checked_against_the_plan(tmp_path: Path) -> None:
    """Layout of a 1.x engine config.json: {version, pretrained_config, build_config} (NVIDIA/TensorRT-LLM
    `tensorrt_llm/builder.py` `EngineConfig.to_dict` @008b2b8d)."""
    build_config = {"max_batch_size": 4, "max_input_len": 99, "max_seq_len": 104, "max_num_tokens": 400,
                    "max_draft_len": 4}
    config = {"version": "1.2.0", "pretrained_config": {"mapping": {"tp_size": 1, "pp_size": 1}},
              "build_config": build_config}
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "rank0.engine").write_bytes(b"")
    assert engine_config_problems(_plan(), tmp_path) == []
    build_config["max_draft_len"] = 0  # a target built without its draft length: the tensorrtllm_backend#473 trap
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert engine_config_problems(_plan(), tmp_path) == [
        f"{tmp_path / 'config.json'}: build_config.max_draft_len is 0, the plan says 4"]


def test_parallel_builds_get_their_own_gpus() -> None:
    two = [_plan(), _plan(role="draft")]
    assert gpu_slices(two, gpu_count=2, jobs=2) == (2, [[0], [1]])
    assert gpu_slices(two, gpu_count=2, jobs=1) == (1, [[0]])
    assert gpu_slices([_plan(workers=2), _plan(role="draft", workers=2)], gpu_count=2, jobs=4) == (1, [[0, 1]])


@pytest.mark.parametrize(
    ("text", "name", "capability", "memory"),
    [("NVIDIA H200", "H200", 9.0, 141.0), ("NVIDIA A100-SXM4-80GB", "A100", 8.0, 80.0),
     ("NVIDIA GeForce RTX 4090", "RTX 4090", 8.9, 24.0), ("8.6", "sm_86", 8.6, None)],
)
def test_gpu_names_as_nvidia_smi_prints_them(text: str, name: str, capability: float, memory: float | None) -> None:
    assert parse_gpu(text) == Gpu(name, capability, memory)
