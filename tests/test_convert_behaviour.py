"""What users rely on besides the tensors: re-runs are no-ops, dry runs write nothing, sharded inputs and
every supported family convert, config.json carries the fields TensorRT-LLM reads, and the streaming
writer produces files the safetensors library reads back unchanged."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from typer.testing import CliRunner

from specbuild.cli import app
from specbuild.convert.safetensors_writer import StreamingSafetensorsWriter
from tests.tiny_models import FAMILIES, make_checkpoint, make_model, save_model

runner = CliRunner()


def convert(src: Path, out: Path, *extra: str) -> str:
    result = runner.invoke(app, ["convert", "--model", str(src), "--output", str(out), *extra])
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split())


def test_rerun_with_unchanged_inputs_is_a_noop(tmp_path: Path) -> None:
    src = make_checkpoint(tmp_path / "m", "llama")
    out = tmp_path / "out"
    assert "wrote" in convert(src, out)
    stamp = (out / "rank0.safetensors").stat().st_mtime_ns
    assert "is up to date" in convert(src, out)
    os.utime(src / "model.safetensors")  # touched, same content: still a no-op (hash compared)
    assert "is up to date" in convert(src, out)
    assert (out / "rank0.safetensors").stat().st_mtime_ns == stamp
    assert "wrote" in convert(src, out, "--force")


def test_changed_input_or_setting_converts_again(tmp_path: Path) -> None:
    src = make_checkpoint(tmp_path / "m", "llama")
    out = tmp_path / "out"
    convert(src, out)
    assert "wrote" in convert(src, out, "--dtype", "bfloat16")
    assert load_file(out / "rank0.safetensors")["lm_head.weight"].dtype == torch.bfloat16
    save_model(make_model("llama", seed=7), src)  # new weights, same names and shapes
    assert "wrote" in convert(src, out, "--dtype", "bfloat16")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["settings"]["dtype"] == "bfloat16"
    assert set(manifest["inputs"]) == {str(src / "config.json"), str(src / "model.safetensors")}


def test_damaged_output_is_rebuilt(tmp_path: Path) -> None:
    src = make_checkpoint(tmp_path / "m", "llama")
    out = tmp_path / "out"
    convert(src, out)
    (out / "rank0.safetensors").write_bytes(b"")
    assert "wrote" in convert(src, out)
    assert load_file(out / "rank0.safetensors")


def test_dry_run_writes_nothing(tmp_path: Path) -> None:
    src = make_checkpoint(tmp_path / "m", "llama")
    text = convert(src, tmp_path / "out", "--dry-run", "--tp-size", "2")
    assert "dry run" in text and "rank1.safetensors" in text
    assert not (tmp_path / "out").exists()


def test_sharded_input_equals_single_file_input(tmp_path: Path) -> None:
    model = make_model("llama")
    single = save_model(model, tmp_path / "single")
    sharded = save_model(model, tmp_path / "sharded", max_shard_size="60KB")
    assert (sharded / "model.safetensors.index.json").is_file()
    convert(single, tmp_path / "a")
    convert(sharded, tmp_path / "b")
    a, b = load_file(tmp_path / "a/rank0.safetensors"), load_file(tmp_path / "b/rank0.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_config_json_fields(tmp_path: Path, family: str) -> None:
    """The fields TensorRT-LLM 1.2's PretrainedConfig requires, plus the family's own (NVIDIA/TensorRT-LLM 1.x,
    tensorrt_llm/models/modeling_utils.py and models/<family>/config.py)."""
    src = make_checkpoint(tmp_path / "m", family)
    convert(src, tmp_path / "out", "--tp-size", "2")
    cfg = json.loads((tmp_path / "out/config.json").read_text())
    hf = json.loads((src / "config.json").read_text())
    for key in ("architecture", "dtype", "hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size",
                "hidden_act", "norm_epsilon", "position_embedding_type", "max_position_embeddings", "mapping",
                "quantization", "head_size", "num_key_value_heads", "intermediate_size", "logits_dtype"):
        assert key in cfg, key
    assert cfg["architecture"] == hf["architectures"][0]
    assert cfg["mapping"] == {"world_size": 2, "tp_size": 2, "pp_size": 1}
    assert cfg["quantization"]["quant_algo"] is None
    assert cfg["dtype"] == "float16"
    if family == "gpt2":
        assert cfg["position_embedding_type"] == "learned_absolute"
        assert cfg["gpt_variant"] == "gpt2" and cfg["bias"] is True
    else:
        assert cfg["position_embedding_type"] == "rope_gpt_neox"
        rope = hf["rope_parameters"]  # Gemma 3: one per layer type; rotary_base is the global layers' base
        assert cfg["rotary_base"] == rope.get("full_attention", rope)["rope_theta"]
        assert cfg["rotary_scaling"] is None
        assert cfg["num_key_value_heads"] == hf["num_key_value_heads"]


def test_legacy_rope_keys_are_read(tmp_path: Path) -> None:
    """Configs written by transformers 4 (as on the Hub) keep rope_theta/rope_scaling at the top level."""
    src = make_checkpoint(tmp_path / "m", "llama")
    cfg = json.loads((src / "config.json").read_text())
    del cfg["rope_parameters"]
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
    cfg.update(rope_theta=500000.0, rope_scaling=scaling, torch_dtype="bfloat16")
    cfg.pop("dtype", None)
    (src / "config.json").write_text(json.dumps(cfg))
    convert(src, tmp_path / "out")
    out = json.loads((tmp_path / "out/config.json").read_text())
    assert (out["rotary_base"], out["rotary_scaling"], out["dtype"]) == (500000.0, scaling, "bfloat16")


def test_auto_dtype_turns_float32_into_float16(tmp_path: Path) -> None:
    src = save_model(make_model("llama", dtype=torch.float32), tmp_path / "m")
    convert(src, tmp_path / "out")
    assert json.loads((tmp_path / "out/config.json").read_text())["dtype"] == "float16"
    assert load_file(tmp_path / "out/rank0.safetensors")["lm_head.weight"].dtype == torch.float16
    convert(src, tmp_path / "out32", "--dtype", "float32")
    reference = make_model("llama", dtype=torch.float32).state_dict()["lm_head.weight"]
    assert torch.equal(load_file(tmp_path / "out32/rank0.safetensors")["lm_head.weight"], reference)


def test_streaming_writer_round_trips(tmp_path: Path) -> None:
    tensors = {
        "a": torch.randn(3, 5, dtype=torch.float16),
        "b": torch.randn(7, dtype=torch.bfloat16),
        "c": torch.arange(6, dtype=torch.int32).reshape(2, 3),
        "empty": torch.zeros(0, 4),
    }
    path = tmp_path / "x.safetensors"
    layout = [(k, v.dtype, tuple(v.shape)) for k, v in tensors.items()]
    with StreamingSafetensorsWriter(path, layout, metadata={"format": "pt"}) as writer:
        for name, tensor in tensors.items():
            writer.write(name, tensor)
    loaded = load_file(path)
    assert loaded.keys() == tensors.keys() and all(torch.equal(loaded[k], tensors[k]) for k in tensors)
    with safe_open(path, "pt") as fh:
        assert fh.metadata() == {"format": "pt"}


def test_streaming_writer_rejects_out_of_layout_tensors(tmp_path: Path) -> None:
    layout = [("a", torch.float16, (2, 2)), ("b", torch.float16, (3,))]
    with StreamingSafetensorsWriter(tmp_path / "x.safetensors", layout) as writer:
        with pytest.raises(ValueError, match="expected tensor 'a' next"):
            writer.write("b", torch.zeros(3, dtype=torch.float16))
        with pytest.raises(ValueError, match=r"layout says torch.float16 \[2, 2\]"):
            writer.write("a", torch.zeros(2, 3, dtype=torch.float16))
        writer.write("a", torch.zeros(2, 2, dtype=torch.float16))
        writer.write("b", torch.zeros(3, dtype=torch.float16))
    with pytest.raises(ValueError, match="2 tensors of the layout were not written"):
        StreamingSafetensorsWriter(tmp_path / "y.safetensors", layout).close()


def test_convert_from_spec_writes_target_and_draft(tmp_path: Path, demo_models: dict[str, Path]) -> None:
    for role, seed, layers in (("target", 0, 4), ("draft", 3, 1)):
        model = make_checkpoint(tmp_path / f"models/{role}", "llama", seed=seed, num_hidden_layers=layers)
        for name in ("tokenizer.json", "tokenizer_config.json"):  # the pair check compares tokenizers
            (model / name).write_bytes((demo_models["tokenizer"] / name).read_bytes())
    spec = tmp_path / "pipeline.yaml"
    spec.write_text(
        "name: t\noutput_dir: out\ntarget: {model: models/target}\ndraft: {model: models/draft}\n"
        "speculative: {mode: draft_target, num_draft_tokens: 3}\n"
        "build: {dtype: bfloat16, tp_size: 2, max_batch_size: 2, max_input_len: 32, max_output_len: 16}\n"
    )
    result = runner.invoke(app, ["convert", str(spec)])
    assert result.exit_code == 0, result.output
    for role, layers in (("target", 4), ("draft", 1)):
        cfg = json.loads((tmp_path / f"out/checkpoints/{role}/config.json").read_text())
        assert (cfg["num_hidden_layers"], cfg["dtype"], cfg["mapping"]["tp_size"]) == (layers, "bfloat16", 2)
        assert (tmp_path / f"out/checkpoints/{role}/rank1.safetensors").is_file()
    again = runner.invoke(app, ["convert", str(spec)])
    assert again.output.count("is up to date") == 2


def test_convert_needs_spec_or_model(tmp_path: Path) -> None:
    result = runner.invoke(app, ["convert"])
    assert result.exit_code == 1 and "give either a pipeline spec or --model" in result.output
    result = runner.invoke(app, ["convert", "--model", str(tmp_path)])
    assert result.exit_code == 1 and "--model needs --output" in result.output


def test_kernel_copy_and_its_fallback_give_the_same_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Pass-through tensors are copied with copy_file_range; where the filesystem refuses (EXDEV, e.g.
    across mounts on old kernels) the writer falls back to a plain write with the same bytes."""
    import errno

    src = make_checkpoint(tmp_path / "m", "llama")
    convert(src, tmp_path / "fast")
    calls = {"n": 0}

    def refuse(*args: object, **kwargs: object) -> int:
        calls["n"] += 1
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "copy_file_range", refuse)
    convert(src, tmp_path / "slow")
    assert calls["n"] > 0
    assert (tmp_path / "fast/rank0.safetensors").read_bytes() == (tmp_path / "slow/rank0.safetensors").read_bytes()


def test_output_directory_has_ordinary_permissions(tmp_path: Path) -> None:
    """The temporary directory behind the atomic swap is made 0700; the finished checkpoint must not be, or a
    server running as another user cannot read it."""
    src = make_checkpoint(tmp_path / "m", "llama")
    convert(src, tmp_path / "out")
    mask = os.umask(0)
    os.umask(mask)
    assert (tmp_path / "out").stat().st_mode & 0o777 == 0o777 & ~mask


def test_changed_inputs_are_hashed_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The up-to-date check hashes a changed file; the conversion that follows must reuse that hash."""
    from specbuild import manifest

    src = make_checkpoint(tmp_path / "m", "llama")
    convert(src, tmp_path / "out")
    save_model(make_model("llama", seed=9), src)
    hashed: list[str] = []
    real = manifest.content_hash
    monkeypatch.setattr(manifest, "content_hash", lambda path: hashed.append(path.name) or real(path))
    assert "wrote" in convert(src, tmp_path / "out")
    assert sorted(hashed) == ["config.json", "model.safetensors"]
