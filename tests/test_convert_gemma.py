"""Gemma 2 and Gemma 3 text through `convert`, checked against TensorRT-LLM 1.x's Gemma converter.

TensorRT-LLM cannot run here, so the expected checkpoint is derived in each test from the Hugging Face tensors by the
rules of NVIDIA/TensorRT-LLM's own Gemma converter, not from ours: tensorrt_llm/models/gemma/convert.py @65b31db1
(`HfParser.rename_to_trt_llm`: names; `load_gemma_weights`: every norm stored as 1 + w, the lm_head is the embedding,
the embedding split on dim 0 with use_parallel_embedding), models/gemma/config.py @9df6d722 (`GemmaConfig`: fields,
use_parallel_embedding = tp > 1), models/gemma/model.py @5dedf53b (layer l of Gemma 3 slides iff
(l + 1) % _sliding_window_pattern != 0), and the sharding rules tests/test_convert_sharding.py documents.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer
from tokenizers.models import WordLevel

from specbuild.convert.pipeline import ConvertRequest, convert_checkpoint
from specbuild.errors import SpecbuildError
from tests.test_convert_qwen3_mixtral import validate_spec
from tests.test_convert_sharding import COLUMN_PARALLEL, ROW_PARALLEL, load_rank, merge_qkv, stage_layers
from tests.tiny_models import edit_config, make_checkpoint, make_model, save_model

GEMMAS = ("gemma2", "gemma3")


def convert(src: Path, out: Path, tp: int = 1, pp: int = 1, dtype: str = "float16") -> Path:
    convert_checkpoint(ConvertRequest("m", src, out, dtype=dtype, tp_size=tp, pp_size=pp))
    return out


def hf_tensors(directory: Path) -> dict[str, torch.Tensor]:
    return {k: v for f in sorted(directory.glob("*.safetensors")) for k, v in load_file(f).items()}


def expected_rank0(hf: dict[str, torch.Tensor], layers: int, qk_norm: bool) -> dict[str, torch.Tensor]:
    """The tp=1 checkpoint by TensorRT-LLM's Gemma rules, in float32 (norms: w + 1.0 in float32)."""
    def norm(name: str) -> torch.Tensor:
        return hf[name].float() + 1.0

    out = {"transformer.vocab_embedding.weight": hf["model.embed_tokens.weight"],  # unscaled: the model scales it
           "transformer.ln_f.weight": norm("model.norm.weight"),
           "lm_head.weight": hf["model.embed_tokens.weight"]}  # the embedding, always
    for layer in range(layers):
        src, dst = f"model.layers.{layer}.", f"transformer.layers.{layer}."
        out[dst + "input_layernorm.weight"] = norm(src + "input_layernorm.weight")
        out[dst + "attention.qkv.weight"] = torch.cat([hf[src + f"self_attn.{p}_proj.weight"] for p in "qkv"])
        out[dst + "attention.dense.weight"] = hf[src + "self_attn.o_proj.weight"]
        out[dst + "post_layernorm.weight"] = norm(src + "post_attention_layernorm.weight")
        out[dst + "pre_feedforward_layernorm.weight"] = norm(src + "pre_feedforward_layernorm.weight")
        out[dst + "post_feedforward_layernorm.weight"] = norm(src + "post_feedforward_layernorm.weight")
        out[dst + "mlp.fc.weight"] = hf[src + "mlp.gate_proj.weight"]
        out[dst + "mlp.gate.weight"] = hf[src + "mlp.up_proj.weight"]
        out[dst + "mlp.proj.weight"] = hf[src + "mlp.down_proj.weight"]
        if qk_norm:
            out[dst + "attention.q_layernorm.weight"] = norm(src + "self_attn.q_norm.weight")
            out[dst + "attention.k_layernorm.weight"] = norm(src + "self_attn.k_norm.weight")
    return out


@pytest.mark.parametrize("family", GEMMAS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_tensors_follow_trtllm_gemma_rules(tmp_path: Path, family: str, dtype: torch.dtype) -> None:
    src = save_model(make_model(family, dtype=dtype), tmp_path / "hf")
    name = "float16" if dtype == torch.float16 else "float32"
    got = load_rank(convert(src, tmp_path / "out", dtype=name) / "rank0.safetensors")
    expected = expected_rank0(hf_tensors(src), 4, qk_norm=family == "gemma3")
    assert sorted(got) == sorted(expected)
    for tensor_name, tensor in expected.items():
        assert got[tensor_name].dtype == dtype, tensor_name
        assert torch.equal(got[tensor_name], tensor.to(dtype)), tensor_name
    # The norms really moved: a converter that forgot the +1 would leave them equal to HF's.
    hf = hf_tensors(src)
    assert not torch.equal(got["transformer.ln_f.weight"], hf["model.norm.weight"])


def sliding_layers(pattern: int, layers: int) -> list[bool]:
    """TensorRT-LLM's rule (models/gemma/model.py @5dedf53b): layer l slides iff (l + 1) % pattern != 0."""
    return [bool((layer + 1) % pattern) for layer in range(layers)]


@pytest.mark.parametrize("family", GEMMAS)
@pytest.mark.parametrize("tp", [1, 2])
def test_config_fields_as_trtllm_gemma_config_writes_them(tmp_path: Path, family: str, tp: int) -> None:
    src = make_checkpoint(tmp_path / "hf", family)
    hf = json.loads((src / "config.json").read_text())
    cfg = json.loads((convert(src, tmp_path / "out", tp=tp) / "config.json").read_text())
    assert cfg["architecture"] == hf["architectures"][0]
    assert cfg["head_size"] == cfg["rotary_embedding_dim"] == hf["head_dim"]
    assert hf["head_dim"] != hf["hidden_size"] // hf["num_attention_heads"]  # so hidden/heads would be caught
    for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "intermediate_size", "max_position_embeddings", "query_pre_attn_scalar", "final_logit_softcapping",
                "sliding_window"):
        assert cfg[key] == hf[key], key
    assert cfg["norm_epsilon"] == hf["rms_norm_eps"]
    assert cfg["hidden_act"] == "gelu"  # TensorRT-LLM's gelu is HF's gelu_pytorch_tanh
    assert hf["hidden_activation"] == "gelu_pytorch_tanh"
    flags = (cfg["inter_layernorms"], cfg["attn_bias"], cfg["mlp_bias"], cfg["qk_layernorm"])
    assert flags == (True, False, False, False)
    assert cfg["rotary_scaling"] is None and cfg["position_embedding_type"] == "rope_gpt_neox"
    assert cfg["use_parallel_embedding"] is (tp > 1) and cfg["embedding_sharding_dim"] == 0
    assert "tie_word_embeddings" not in cfg  # GemmaConfig writes none; the lm_head is always written
    # The sliding layers TensorRT-LLM derives from the pattern are the ones transformers' layer_types names (the
    # tiny Gemma 3 has one full layer in three, while transformers still writes a stale _sliding_window_pattern 6).
    assert sliding_layers(cfg["_sliding_window_pattern"], hf["num_hidden_layers"]) == [
        kind == "sliding_attention" for kind in hf["layer_types"]]
    rope = hf["rope_parameters"]
    if family == "gemma2":
        assert cfg["attn_logit_softcapping"] == hf["attn_logit_softcapping"]
        assert cfg["rotary_base"] == rope["rope_theta"] and "rope_local_base_freq" not in cfg
    else:
        assert hf["_sliding_window_pattern"] != cfg["_sliding_window_pattern"]
        assert "attn_logit_softcapping" not in cfg  # not in TensorRT-LLM's Gemma3ConfigGroup
        assert cfg["rotary_base"] == rope["full_attention"]["rope_theta"]
        assert cfg["rope_local_base_freq"] == rope["sliding_attention"]["rope_theta"]


def test_transformers_4_gemma3_config_is_read(tmp_path: Path) -> None:
    """Hub configs written by transformers 4 keep rope_theta, rope_local_base_freq, sliding_window_pattern and
    rope_scaling at the top level and have no layer_types."""
    src = make_checkpoint(tmp_path / "hf", "gemma3")
    cfg = json.loads((src / "config.json").read_text())
    for key in ("rope_parameters", "layer_types", "_sliding_window_pattern"):
        del cfg[key]
    cfg.update(rope_theta=500000.0, rope_local_base_freq=20000.0, rope_scaling=None, sliding_window_pattern=2)
    (src / "config.json").write_text(json.dumps(cfg))
    out = json.loads((convert(src, tmp_path / "out") / "config.json").read_text())
    assert (out["rotary_base"], out["rope_local_base_freq"], out["_sliding_window_pattern"]) == (500000.0, 20000.0, 2)


def test_transformers_4_gemma2_config_alternates_from_layer_0(tmp_path: Path) -> None:
    """Without layer_types, HF Gemma 2 slides its even layers (layer 0 first): pattern 2 in TensorRT-LLM's rule."""
    src = make_checkpoint(tmp_path / "hf", "gemma2")
    cfg = json.loads((src / "config.json").read_text())
    del cfg["layer_types"], cfg["rope_parameters"]
    cfg.update(rope_theta=10000.0)
    (src / "config.json").write_text(json.dumps(cfg))
    out = json.loads((convert(src, tmp_path / "out") / "config.json").read_text())
    assert sliding_layers(out["_sliding_window_pattern"], 4) == [True, False, True, False]


def merge_gemma(directory: Path) -> dict[str, torch.Tensor]:
    """The tp=1, pp=1 tensors rebuilt from a sharded Gemma checkpoint: as tests/test_convert_sharding.py merges
    LLaMA, except that the embedding is split on dim 0 when use_parallel_embedding (GemmaConfig: tp > 1)."""
    cfg = json.loads((directory / "config.json").read_text())
    tp, pp = cfg["mapping"]["tp_size"], cfg["mapping"]["pp_size"]
    assert cfg["use_parallel_embedding"] is (tp > 1)
    layers = stage_layers(cfg["num_hidden_layers"], pp)
    merged: dict[str, torch.Tensor] = {}
    for stage in range(pp):
        files = [load_rank(directory / f"rank{stage * tp + t}.safetensors") for t in range(tp)]
        for name in files[0]:
            parts = [f[name] for f in files]
            rest = name.removeprefix("transformer.layers.") if name.startswith("transformer.layers.") else ""
            suffix = rest.split(".", 1)[1] if rest else name
            if rest:
                name = f"transformer.layers.{layers[stage][int(rest.split('.')[0])]}.{suffix}"
            if suffix.startswith("attention.qkv"):
                merged[name] = merge_qkv(parts, cfg["num_attention_heads"], cfg["num_key_value_heads"],
                                         cfg["head_size"])
            elif suffix in ROW_PARALLEL:
                merged[name] = torch.cat(parts, dim=1)
            elif suffix in COLUMN_PARALLEL or name in ("transformer.vocab_embedding.weight", "lm_head.weight"):
                merged[name] = torch.cat(parts, dim=0)
            else:  # norms, q/k norms: replicated
                assert all(torch.equal(parts[0], p) for p in parts[1:]), f"{name} differs across tp ranks"
                merged[name] = parts[0]
    return merged


@pytest.mark.parametrize(
    ("family", "overrides", "tp", "pp"),
    [
        ("gemma2", {}, 2, 1),
        ("gemma3", {}, 2, 1),
        ("gemma3", {}, 4, 1),  # kv (2) < tp: KV heads repeated
        ("gemma2", {"num_key_value_heads": 1}, 2, 1),  # MQA, as gemma-3-1b
        ("gemma3", {}, 1, 2),
        ("gemma2", {"num_hidden_layers": 3, "layer_types": None}, 2, 2),  # uneven stages: 2 + 1 layers
    ],
)
def test_rank_files_merge_back_to_tp1(tmp_path: Path, family: str, overrides: dict, tp: int, pp: int) -> None:
    src = make_checkpoint(tmp_path / "hf", family, **overrides)
    single = load_rank(convert(src, tmp_path / "tp1") / "rank0.safetensors")
    sharded = convert(src, tmp_path / "sharded", tp, pp)
    merged = merge_gemma(sharded)
    assert sorted(merged) == sorted(single)
    for name, tensor in single.items():
        assert torch.equal(merged[name], tensor), name
    if pp > 1:  # the embedding on the first stage, ln_f and the head on the last
        first, last = load_rank(sharded / "rank0.safetensors"), load_rank(sharded / f"rank{(pp - 1) * tp}.safetensors")
        assert "transformer.vocab_embedding.weight" in first and "lm_head.weight" not in first
        assert "lm_head.weight" in last and "transformer.ln_f.weight" in last
        assert "transformer.vocab_embedding.weight" not in last


def refusal(src: Path, out: Path, tp: int = 1) -> str:
    with pytest.raises(SpecbuildError) as info:
        convert(src, out, tp=tp)
    assert not out.exists(), "a refused conversion must write nothing"
    return " ".join(str(info.value).split())


def rope_scaled(directory: Path) -> Path:
    cfg = json.loads((directory / "config.json").read_text())
    cfg["rope_parameters"]["full_attention"].update(rope_type="linear", factor=8.0)
    (directory / "config.json").write_text(json.dumps(cfg))
    return directory


@pytest.mark.parametrize(
    ("case", "make", "words"),
    [
        ("rope scaling", lambda d: rope_scaled(make_checkpoint(d, "gemma3")),
         ("full_attention", "'linear' rope scaling", "rotary_scaling null", "hint:")),
        ("transformers 4 rope scaling", lambda d: _legacy_scaled(make_checkpoint(d, "gemma3")),
         ("'linear' rope scaling", "hint:")),
        ("layer pattern", lambda d: _edit(make_checkpoint(d, "gemma3"), layer_types=[
            "sliding_attention", "full_attention", "sliding_attention", "sliding_attention"]),
         ("layer_types marks layer 3", "_sliding_window_pattern", "model.py @5dedf53b", "pattern 2")),
        ("multimodal", lambda d: _edit(make_checkpoint(d, "gemma3"), architectures=["Gemma3ForConditionalGeneration"]),
         ("Gemma3ForConditionalGeneration", "text", "Gemma3ForCausalLM")),
        ("own head", lambda d: make_checkpoint(d, "gemma2", tie_word_embeddings=False),
         ("lm_head.weight", "embedding", "hint:")),
        ("attention bias", lambda d: make_checkpoint(d, "gemma2", attention_bias=True), ("attention_bias is true",)),
        ("gemma3 attention softcap", lambda d: _edit(make_checkpoint(d, "gemma3"), attn_logit_softcapping=50.0),
         ("attn_logit_softcapping", "Gemma3ConfigGroup")),
        ("exact gelu", lambda d: _edit(make_checkpoint(d, "gemma2"), hidden_activation="gelu"),
         ("hidden_activation 'gelu'", "tanh GELU")),
        ("bidirectional", lambda d: _edit(make_checkpoint(d, "gemma3"), use_bidirectional_attention=True),
         ("use_bidirectional_attention",)),
    ],
)
def test_what_trtllm_gemma_cannot_express_is_refused(tmp_path: Path, case: str, make, words: tuple[str, ...]) -> None:
    message = refusal(make(tmp_path / "hf"), tmp_path / "out")
    for word in words:
        assert word in message, (case, message)


def test_vocab_not_divisible_by_tp_is_refused(tmp_path: Path) -> None:
    """TensorRT-LLM splits Gemma's embedding by vocabulary rows for tp > 1 and asserts vocab % tp == 0."""
    src = make_checkpoint(tmp_path / "hf", "gemma3", vocab_size=1001)
    message = refusal(src, tmp_path / "out", tp=2)
    assert "does not divide vocab_size 1001" in message
    convert(src, tmp_path / "tp1")  # tp=1 keeps the whole embedding


def test_tp_that_cannot_split_heads_is_refused(tmp_path: Path) -> None:
    message = refusal(make_checkpoint(tmp_path / "hf", "gemma2"), tmp_path / "out", tp=3)
    assert "does not divide num_attention_heads 4" in message and "num_key_value_heads 2" in message


def _edit(directory: Path, **changes: object) -> Path:
    edit_config(directory, **changes)
    return directory


def _legacy_scaled(directory: Path) -> Path:
    cfg = json.loads((directory / "config.json").read_text())
    for key in ("rope_parameters", "layer_types"):
        del cfg[key]
    cfg.update(rope_theta=1000000.0, rope_local_base_freq=10000.0, rope_scaling={"rope_type": "linear", "factor": 8.0})
    (directory / "config.json").write_text(json.dumps(cfg))
    return directory


def test_rope_scaled_gemma3_is_refused_only_where_specbuild_converts(tmp_path: Path) -> None:
    """Gemma 3 4B and larger scale their global rope, which TensorRT-LLM 1.2's Gemma checkpoint cannot carry: `validate`
    refuses such a target on the engine flow and on the PyTorch flow's reference backend (both run specbuild's
    conversion), but not on the PyTorch flow with TensorRT-LLM's backend, which loads the Hugging Face directory as
    it is, the way the refusal's hint sends users."""
    target = rope_scaled(make_checkpoint(tmp_path / "hf", "gemma3"))
    Tokenizer(WordLevel({"[UNK]": 0}, unk_token="[UNK]")).save(str(target / "tokenizer.json"))
    code, text = validate_spec(tmp_path / "engine", target)
    assert code == 1 and "target.model" in text and "'linear' rope scaling" in text and "build.flow: pytorch" in text
    code, text = validate_spec(tmp_path / "pytorch", target, flow="pytorch")
    assert code == 0 and "rope scaling" not in text, text
    code, text = validate_spec(tmp_path / "reference", target, flow="pytorch", backend="reference")
    assert code == 1 and "'linear' rope scaling" in text, text
