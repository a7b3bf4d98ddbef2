"""Every way a conversion can fail: one clear message naming the file, field or tensor, exit code 1, and
the previous output left exactly as it was (no half-written directory, no stray temporary directory).
The CLI is driven in-process, as a user would call it."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from typer.testing import CliRunner

from specbuild.cli import app
from specbuild.convert import safetensors_writer
from tests.tiny_models import edit_config, make_checkpoint, make_model, save_model

runner = CliRunner()


def snapshot(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def run_convert(src: Path, out: Path, *extra: str) -> tuple[int, str]:
    result = runner.invoke(app, ["convert", "--model", str(src), "--output", str(out), *extra])
    return result.exit_code, " ".join(result.output.split())


@pytest.fixture
def previous_output(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A good conversion in tmp/out that every failing run below must leave untouched."""
    good = make_checkpoint(tmp_path / "good", "llama", seed=1)
    out = tmp_path / "out"
    code, text = run_convert(good, out)
    assert code == 0, text
    return out, snapshot(out)


def break_missing_shard(src: Path) -> str:
    shards = sorted(src.glob("model-*.safetensors"))
    assert len(shards) >= 2, "fixture must produce a sharded checkpoint"
    shards[1].unlink()
    return f"{shards[1].name}: shard listed in model.safetensors.index.json is missing"


def break_truncated(src: Path) -> str:
    path = src / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-1000])
    return "model.safetensors: file is truncated: tensor"


def break_corrupt_header(src: Path) -> str:
    path = src / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[8:40] = b"\x00garbage garbage garbage garbage"[:32]
    path.write_bytes(bytes(data))
    return "model.safetensors: corrupt safetensors header"


def break_shape(src: Path) -> str:
    edit_config(src, intermediate_size=96)
    return (
        "tensor 'model.layers.0.mlp.gate_proj.weight' in model.safetensors has shape [128, 64], "
        "but config.json implies [96, 64]"
    )


def break_architecture(src: Path) -> str:
    edit_config(src, architectures=["FalconForCausalLM"])
    return "config.json: architecture 'FalconForCausalLM' is not supported"


def break_config_json(src: Path) -> str:
    (src / "config.json").write_text("{not json")
    return "config.json: model config (config.json) is not valid JSON"


def break_missing_config(src: Path) -> str:
    (src / "config.json").unlink()
    return "config.json: model config (config.json) is missing"


def break_missing_field(src: Path) -> str:
    config = json.loads((src / "config.json").read_text())
    del config["num_attention_heads"]
    (src / "config.json").write_text(json.dumps(config))
    return "config.json: required field 'num_attention_heads' is missing"


def break_extra_tensor(src: Path) -> str:
    edit_config(src, num_hidden_layers=3)
    return "tensors not used by the mapping: 'model.layers.3."


SHARDED = {"max_shard_size": "60KB"}


@pytest.mark.parametrize(
    ("breaker", "save_kwargs"),
    [
        (break_missing_shard, SHARDED),
        (break_truncated, {}),
        (break_corrupt_header, {}),
        (break_shape, {}),
        (break_architecture, {}),
        (break_config_json, {}),
        (break_missing_config, {}),
        (break_missing_field, {}),
        (break_extra_tensor, {}),
    ],
    ids=lambda v: v.__name__ if callable(v) else "",
)
def test_bad_checkpoint_fails_clearly_and_keeps_old_output(
    tmp_path: Path, previous_output: tuple[Path, dict[str, str]], breaker: Callable[[Path], str], save_kwargs: dict
) -> None:
    out, before = previous_output
    src = save_model(make_model("llama"), tmp_path / "bad", **save_kwargs)
    expected = breaker(src)
    code, text = run_convert(src, out)
    assert code == 1
    assert expected in text
    assert "Traceback" not in text
    assert snapshot(out) == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_tp_that_does_not_divide_heads(tmp_path: Path, previous_output: tuple[Path, dict[str, str]]) -> None:
    out, before = previous_output
    src = make_checkpoint(tmp_path / "m", "llama")
    code, text = run_convert(src, out, "--tp-size", "3")
    assert code == 1
    assert "tp_size 3 does not divide num_attention_heads 4" in text
    assert snapshot(out) == before


def test_pp_larger_than_layers(tmp_path: Path) -> None:
    src = make_checkpoint(tmp_path / "m", "gpt2")
    code, text = run_convert(src, tmp_path / "out", "--pp-size", "3")
    assert code == 1 and "pp_size 3 exceeds num_hidden_layers 2" in text
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kind", ["missing", "file"])
def test_unreadable_model_directory(tmp_path: Path, previous_output: tuple[Path, dict[str, str]], kind: str) -> None:
    out, before = previous_output
    src = tmp_path / "nothing-here"
    if kind == "file":
        src.write_text("not a directory")
    code, text = run_convert(src, out)
    assert code == 1
    assert ("does not exist" if kind == "missing" else "is not a directory") in text
    assert str(src) in text
    assert snapshot(out) == before


def test_failure_while_writing_keeps_old_output(
    tmp_path: Path, previous_output: tuple[Path, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unexpected error half-way through a rank file (an I/O error, Ctrl-C) must not leave a half-written
    checkpoint; it keeps its traceback (a full disk is one message instead: tests/test_faults_build.py)."""
    out, before = previous_output
    src = make_checkpoint(tmp_path / "m", "llama", seed=2)
    writer = safetensors_writer.StreamingSafetensorsWriter
    real_check = writer._check_next  # runs before every tensor, copied or written
    calls = {"n": 0}

    def failing_check(self, *args):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 5:
            raise OSError(5, "Input/output error")
        real_check(self, *args)

    monkeypatch.setattr(writer, "_check_next", failing_check)
    with pytest.raises(OSError, match="Input/output error"):
        runner.invoke(app, ["convert", "--model", str(src), "--output", str(out)], catch_exceptions=False)
    assert calls["n"] == 5
    assert snapshot(out) == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_refuses_to_replace_a_directory_it_did_not_write(tmp_path: Path) -> None:
    src = make_checkpoint(tmp_path / "m", "llama")
    foreign = tmp_path / "home"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("precious")
    code, text = run_convert(src, foreign)
    assert code == 1 and "was not written by specbuild" in text
    assert (foreign / "notes.txt").read_text() == "precious"


def write_pickle_checkpoint(directory: Path, sharded: bool) -> Path:
    model = make_model("llama")
    save_model(model, directory)
    (directory / "model.safetensors").unlink()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    if not sharded:
        torch.save(state, directory / "pytorch_model.bin")
        return directory
    names = sorted(state)
    halves = {"pytorch_model-00001-of-00002.bin": names[::2], "pytorch_model-00002-of-00002.bin": names[1::2]}
    weight_map = {}
    for file, keys in halves.items():
        torch.save({k: state[k] for k in keys}, directory / file)
        weight_map.update(dict.fromkeys(keys, file))
    (directory / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return directory


@pytest.mark.parametrize("sharded", [False, True])
def test_pickle_weights_need_opt_in(tmp_path: Path, sharded: bool) -> None:
    src = write_pickle_checkpoint(tmp_path / "pickle", sharded)
    code, text = run_convert(src, tmp_path / "out")
    assert code == 1
    assert "weights are pickle files" in text and "--allow-pickle" in text
    assert not (tmp_path / "out").exists()

    code, text = run_convert(src, tmp_path / "out", "--allow-pickle")
    assert code == 0, text
    safe_src = save_model(make_model("llama"), tmp_path / "safe")
    assert run_convert(safe_src, tmp_path / "safe-out")[0] == 0
    with safe_open(tmp_path / "out/rank0.safetensors", "pt") as a, safe_open(
        tmp_path / "safe-out/rank0.safetensors", "pt"
    ) as b:
        assert sorted(a.keys()) == sorted(b.keys())
        assert all(torch.equal(a.get_tensor(k), b.get_tensor(k)) for k in a.keys())  # noqa: SIM118


def test_pickle_loading_refuses_code_objects(tmp_path: Path) -> None:
    """Even with --allow-pickle, weights_only=True refuses a pickle that carries arbitrary objects."""
    src = write_pickle_checkpoint(tmp_path / "pickle", sharded=False)
    torch.save({"model.embed_tokens.weight": torch.zeros(2), "payload": Path("/etc/passwd")},
               src / "pytorch_model.bin")
    code, text = run_convert(src, tmp_path / "out", "--allow-pickle")
    assert code == 1 and "pytorch_model.bin: cannot load pickle weights" in text


def test_error_text_follows_added_context() -> None:
    """The CLI prefixes a spec's failing model to `message`; anything printing `str(err)` must see it too."""
    from specbuild.errors import SpecbuildError

    err = SpecbuildError("tensor 'x' is missing", hint="re-download the checkpoint")
    err.message = f"pipeline.yaml: converting the draft model: {err.message}"
    expected = "pipeline.yaml: converting the draft model: tensor 'x' is missing\n  hint: re-download the checkpoint"
    assert str(err) == expected
