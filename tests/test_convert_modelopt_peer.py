"""The converter against a real peer: ModelOpt 0.47's `export_tensorrt_llm_checkpoint`.

ModelOpt writes the same TensorRT-LLM checkpoint format from an in-memory transformers model, so for an
unquantized model at tp=1 both must hold the same tensors, bit for bit. Where ModelOpt deviates from
TensorRT-LLM (it names Qwen2 `QWenForCausalLM`; it drops `rotary_base` and `rotary_scaling` under transformers 5)
specbuild follows TensorRT-LLM, and the tests pin the difference. Sources: NVIDIA/Model-Optimizer 0.47.0,
`modelopt/torch/export/model_config_export.py`; NVIDIA/TensorRT-LLM 1.x, `tensorrt_llm/models/modeling_utils.py`
(`PretrainedConfig`), `tensorrt_llm/models/gpt/convert.py` @f59aed07, `tensorrt_llm/models/qwen/config.py` @373970a8.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from specbuild.convert.pipeline import ConvertRequest, convert_checkpoint
from tests.tiny_models import FAMILIES, make_model, save_model


def modelopt_export(model: torch.nn.Module, decoder_type: str, out: Path) -> Path:
    from modelopt.torch.export import export_tensorrt_llm_checkpoint

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # inference_tensor_parallel=0 (the default) divides by zero on one CPU process (model_config_export.py).
        export_tensorrt_llm_checkpoint(
            model, decoder_type, dtype=torch.float16, export_dir=out, inference_tensor_parallel=1
        )
    return out


def load_all(path: Path) -> dict[str, torch.Tensor]:
    with safe_open(path, "pt") as fh:
        return {k: fh.get_tensor(k) for k in fh.keys()}  # noqa: SIM118 (safe_open is not a dict)


@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral", "gpt2"])
def test_tensors_equal_modelopt_export(tmp_path: Path, family: str) -> None:
    model = make_model(family)
    hf_dir = save_model(model, tmp_path / "hf")
    convert_checkpoint(ConvertRequest(family, hf_dir, tmp_path / "ours", dtype="float16"))
    theirs_dir = modelopt_export(model, FAMILIES[family][3], tmp_path / "modelopt")

    ours, theirs = load_all(tmp_path / "ours/rank0.safetensors"), load_all(theirs_dir / "rank0.safetensors")
    assert sorted(ours) == sorted(theirs)
    for name in ours:
        assert ours[name].dtype == theirs[name].dtype, name
        assert torch.equal(ours[name], theirs[name]), name

    our_cfg = json.loads((tmp_path / "ours/config.json").read_text())
    their_cfg = json.loads((theirs_dir / "config.json").read_text())
    for key in ("dtype", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_size", "intermediate_size", "norm_epsilon", "max_position_embeddings"):
        assert our_cfg[key] == their_cfg[key], key
    if family == "gpt2":
        # TensorRT-LLM's GPT config passes HF's `activation_function` through verbatim and uses learned
        # absolute positions (PretrainedConfig, gpt/convert.py); ModelOpt writes `gelu` and `rope_gpt_neox`.
        assert (our_cfg["hidden_act"], their_cfg["hidden_act"]) == ("gelu_new", "gelu")
        assert our_cfg["position_embedding_type"] == "learned_absolute" != their_cfg["position_embedding_type"]
    else:
        assert our_cfg["hidden_act"] == their_cfg["hidden_act"] == "silu"
        assert our_cfg["position_embedding_type"] == their_cfg["position_embedding_type"] == "rope_gpt_neox"
    assert our_cfg["mapping"] == their_cfg["mapping"] == {"world_size": 1, "tp_size": 1, "pp_size": 1}


def test_qwen2_architecture_name_follows_tensorrt_llm(tmp_path: Path) -> None:
    """TensorRT-LLM's own converter keeps `Qwen2ForCausalLM` with `qwen_type: qwen2` and `attn_bias: true`
    (qwen/config.py). ModelOpt writes `QWenForCausalLM` when the model's config lacks `architectures`
    (an in-memory model; observed here) — specbuild always follows TensorRT-LLM."""
    model = make_model("qwen2")
    hf_dir = save_model(model, tmp_path / "hf")
    convert_checkpoint(ConvertRequest("q", hf_dir, tmp_path / "ours"))
    model.config.architectures = None
    their_cfg = json.loads((modelopt_export(model, "qwen", tmp_path / "mo") / "config.json").read_text())
    our_cfg = json.loads((tmp_path / "ours/config.json").read_text())
    assert their_cfg["architecture"] == "QWenForCausalLM"
    assert our_cfg["architecture"] == "Qwen2ForCausalLM"
    assert our_cfg["qwen_type"] == "qwen2"
    assert our_cfg["attn_bias"] is True and our_cfg["mlp_bias"] is False
    assert our_cfg["rotary_base"] == model.config.rope_parameters["rope_theta"]


def test_rope_settings_survive_where_modelopt_drops_them(tmp_path: Path) -> None:
    """rope_theta 500000 with llama3 scaling (Llama 3.1): ModelOpt under transformers 5 loses both
    (model_config_export.py); specbuild writes `rotary_base` and passes the scaling dict through unchanged."""
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
    model = make_model("llama", rope_parameters={"rope_theta": 500000.0, **scaling})
    hf_dir = save_model(model, tmp_path / "hf")
    convert_checkpoint(ConvertRequest("l", hf_dir, tmp_path / "ours"))
    our_cfg = json.loads((tmp_path / "ours/config.json").read_text())
    their_cfg = json.loads((modelopt_export(model, "llama", tmp_path / "mo") / "config.json").read_text())
    assert our_cfg["rotary_base"] == 500000.0
    assert our_cfg["rotary_scaling"] == scaling
    assert "rotary_base" not in their_cfg and "rotary_scaling" not in their_cfg
