"""Medusa heads (FasterDecoding format) converted into a TensorRT-LLM MedusaForCausalLM checkpoint.

Names, split dims and config fields follow NVIDIA/TensorRT-LLM `examples/medusa/convert_checkpoint.py` @b93e14ca
and `tensorrt_llm/models/medusa/` (`config.py` @084a8843, `weight.py`), 1.x line; head counts come from the
file's keys, because published configs disagree with their files (FasterDecoding/Medusa @e2a5d20c
`medusa/model/medusa_model.py` overrides `medusa_num_heads` with "TODO: fix the uploaded config", and
TensorRT-LLM's `examples/medusa/README.md` says medusa-vicuna-7b-v1.3's config claims 2 heads where the file has 4)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from specbuild.cli import app
from tests.tiny_models import make_checkpoint

runner = CliRunner()
HIDDEN, VOCAB = 64, 1000


def write_heads(directory: Path, heads: int = 3, layers: int = 1, hidden: int = HIDDEN, claimed: int | None = None,
                seed: int = 0) -> dict[str, torch.Tensor]:
    """A FasterDecoding head directory: medusa_lm_head.safetensors + config.json."""
    gen = torch.Generator().manual_seed(seed)
    state: dict[str, torch.Tensor] = {}
    for h in range(heads):
        for layer in range(layers):
            state[f"{h}.{layer}.linear.weight"] = torch.randn(hidden, hidden, generator=gen).half()
            state[f"{h}.{layer}.linear.bias"] = torch.randn(hidden, generator=gen).half()
        state[f"{h}.{layers}.weight"] = torch.randn(VOCAB, hidden, generator=gen).half()
    directory.mkdir(parents=True)
    save_file(state, directory / "medusa_lm_head.safetensors")
    config = {"medusa_num_heads": claimed or heads, "medusa_num_layers": layers}
    (directory / "config.json").write_text(json.dumps(config))
    return state


def convert(base: Path, heads: Path, out: Path, *extra: str) -> tuple[int, str]:
    result = runner.invoke(
        app, ["convert", "--model", str(base), "--medusa-heads", str(heads), "--output", str(out), *extra]
    )
    return result.exit_code, " ".join(result.output.split())


def test_heads_are_added_with_trtllm_names_and_config(tmp_path: Path) -> None:
    base = make_checkpoint(tmp_path / "base", "llama")
    state = write_heads(tmp_path / "heads", heads=3, layers=2, claimed=5)  # config claims 5; the file holds 3
    code, text = convert(base, tmp_path / "heads", tmp_path / "out", "--max-draft-len", "24")
    assert code == 0, text
    cfg = json.loads((tmp_path / "out/config.json").read_text())
    assert (cfg["architecture"], cfg["num_medusa_heads"], cfg["num_medusa_layers"], cfg["max_draft_len"]) == (
        "MedusaForCausalLM", 3, 2, 24)
    assert cfg["rotary_base"] == 10000.0 and cfg["num_key_value_heads"] == 2
    tensors = load_file(tmp_path / "out/rank0.safetensors")
    for h in range(3):
        for layer in range(2):
            for kind in ("weight", "bias"):
                name = f"medusa_heads.{h}.medusa_layers.{layer}.linear.{kind}"
                assert torch.equal(tensors[name], state[f"{h}.{layer}.linear.{kind}"]), name
        assert torch.equal(tensors[f"medusa_heads.{h}.lm_head.weight"], state[f"{h}.2.weight"])
    assert "transformer.layers.3.attention.qkv.weight" in tensors and "lm_head.weight" in tensors


def test_heads_split_on_dim0_under_tp(tmp_path: Path) -> None:
    base = make_checkpoint(tmp_path / "base", "llama")
    state = write_heads(tmp_path / "heads", heads=2)
    assert convert(base, tmp_path / "heads", tmp_path / "out", "--tp-size", "2")[0] == 0
    ranks = [load_file(tmp_path / f"out/rank{r}.safetensors") for r in range(2)]
    for src, dst in (("1.0.linear.weight", "medusa_heads.1.medusa_layers.0.linear.weight"),
                     ("1.0.linear.bias", "medusa_heads.1.medusa_layers.0.linear.bias"),
                     ("1.1.weight", "medusa_heads.1.lm_head.weight")):
        assert torch.equal(torch.cat([r[dst] for r in ranks], 0), state[src]), dst
        assert ranks[0][dst].shape[0] == state[src].shape[0] // 2


def test_head_with_wrong_hidden_size_is_refused(tmp_path: Path) -> None:
    base = make_checkpoint(tmp_path / "base", "llama")
    write_heads(tmp_path / "heads", hidden=32)
    code, text = convert(base, tmp_path / "heads", tmp_path / "out")
    assert code == 1
    assert "medusa_lm_head.safetensors: tensor '0.0.linear.bias' has shape [32], the target" in text
    assert not (tmp_path / "out").exists()


def test_malformed_head_files_are_refused(tmp_path: Path) -> None:
    base = make_checkpoint(tmp_path / "base", "llama")
    state = write_heads(tmp_path / "heads", heads=2)
    del state["1.0.linear.bias"]
    save_file(state, tmp_path / "heads/medusa_lm_head.safetensors")
    code, text = convert(base, tmp_path / "heads", tmp_path / "out")
    assert code == 1 and "missing '1.0.linear.bias'" in text


def test_pickle_heads_need_opt_in(tmp_path: Path) -> None:
    base = make_checkpoint(tmp_path / "base", "llama")
    state = write_heads(tmp_path / "heads", heads=2)
    (tmp_path / "heads/medusa_lm_head.safetensors").unlink()
    torch.save(state, tmp_path / "heads/medusa_lm_head.pt")
    code, text = convert(base, tmp_path / "heads", tmp_path / "out")
    assert code == 1 and "weights are pickle files (medusa_lm_head.pt)" in text and "--allow-pickle" in text
    code, text = convert(base, tmp_path / "heads", tmp_path / "out", "--allow-pickle")
    assert code == 0, text
    converted = load_file(tmp_path / "out/rank0.safetensors")
    assert torch.equal(converted["medusa_heads.1.lm_head.weight"], state["1.1.weight"])


@pytest.mark.parametrize("family", ["gpt2", "gemma2", "qwen3"])
def test_medusa_needs_a_base_tensorrt_llm_medusa_takes(tmp_path: Path, family: str) -> None:
    """TensorRT-LLM 1.2's Medusa converter asserts --model_type llama, mixtral or qwen2 (cited in
    specbuild.contracts.family_support): any other base is refused with that reason, before anything is written."""
    base = make_checkpoint(tmp_path / "base", family)
    write_heads(tmp_path / "heads")
    code, text = convert(base, tmp_path / "heads", tmp_path / "out")
    text = " ".join(text.split())
    assert code == 1 and "cannot run Medusa heads on it" in text and "--model_type llama, mixtral or qwen2" in text
    assert not (tmp_path / "out").exists()


def test_module_prefixed_keys_convert_like_plain_ones(tmp_path: Path) -> None:
    """Some exports keep `medusa_head.` in front of every key; the converter reads them the same."""
    base = make_checkpoint(tmp_path / "base", "llama")
    state = write_heads(tmp_path / "heads", heads=2)
    save_file({f"medusa_head.{k}": v for k, v in state.items()}, tmp_path / "heads/medusa_lm_head.safetensors")
    code, text = convert(base, tmp_path / "heads", tmp_path / "out")
    assert code == 0, text
    converted = load_file(tmp_path / "out/rank0.safetensors")
    assert torch.equal(converted["medusa_heads.1.medusa_layers.0.linear.weight"], state["1.0.linear.weight"])
