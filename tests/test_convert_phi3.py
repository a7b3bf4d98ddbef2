"""Phi-3 (HF `Phi3ForCausalLM`) -> TensorRT-LLM 1.2 `Phi3ForCausalLM` checkpoints, tested against the cited facts.

TensorRT-LLM cannot run here, so the expected tensors and fields are derived in each test from the HF tensors by
the rules of NVIDIA/TensorRT-LLM's own Phi-3 converter (1.x line): tensorrt_llm/models/phi3/convert.py @89fd9b74
(qkv_proj kept whole as attention.qkv; gate_up_proj becomes mlp.fc with its halves swapped; o_proj -> dense,
down_proj -> proj, post_attention_layernorm -> post_layernorm, model.norm -> ln_f; a tied lm_head is the
embedding), models/phi3/config.py @1e6a4f97 (the config fields; long_rope from max_position_embeddings >= 128000)
and models/phi3/model.py @c4dc529f (RmsNorms, no biases, `MLP(hidden_act=swiglu)`), with the engine's swiglu
(tensorrt_llm/layers/mlp.py @04a2cacb: each rank applies `x, gate = chunk(fc_out, 2); silu(gate) * x` to its own
fc output). TP/PP shards are merged back by those rules, written here, and must equal tp=1 bit for bit.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from specbuild.convert.pipeline import ConvertRequest, convert_checkpoint
from specbuild.errors import CheckpointError
from tests.test_convert_sharding import load_rank, merge_qkv, stage_layers
from tests.tiny_models import FAMILIES, make_checkpoint

DEFAULTS = FAMILIES["phi3"][2]
HIDDEN, INTER, HEADS, KV_HEADS = (DEFAULTS[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads",
                                                           "num_key_value_heads"))
HEAD_DIM = HIDDEN // HEADS
#: A 128k-style config (Phi-3-mini-128k, Phi-3.5-mini): longrope factors, one per rotary frequency.
SHORT, LONG = [1.0 + i / 16 for i in range(HEAD_DIM // 2)], [2.0 + i / 4 for i in range(HEAD_DIM // 2)]
LONGROPE = dict(max_position_embeddings=131072, original_max_position_embeddings=256,
                rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": SHORT,
                                 "long_factor": LONG})


def convert(src: Path, out: Path, tp: int = 1, pp: int = 1) -> Path:
    convert_checkpoint(ConvertRequest("phi3", src, out, dtype="float16", tp_size=tp, pp_size=pp))
    return out


def hf_tensors(src: Path) -> dict[str, torch.Tensor]:
    return {k: v for f in sorted(src.glob("*.safetensors")) for k, v in load_file(f).items()}


def trtllm_config(out: Path) -> dict:
    return json.loads((out / "config.json").read_text())


# -- tensors at tp=1 -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("tied", [False, True])
def test_tensors_follow_tensorrt_llm_phi3_converter(tmp_path: Path, tied: bool) -> None:
    src = make_checkpoint(tmp_path / "hf", "phi3", tie_word_embeddings=tied)
    hf = hf_tensors(src)
    ours = load_rank(convert(src, tmp_path / "out") / "rank0.safetensors")
    expected = {"transformer.vocab_embedding.weight": hf["model.embed_tokens.weight"],
                "transformer.ln_f.weight": hf["model.norm.weight"],
                "lm_head.weight": hf["model.embed_tokens.weight" if tied else "lm_head.weight"]}
    for layer in range(DEFAULTS["num_hidden_layers"]):
        s, d = f"model.layers.{layer}.", f"transformer.layers.{layer}."
        gate_up = hf[s + "mlp.gate_up_proj.weight"]
        expected |= {
            d + "input_layernorm.weight": hf[s + "input_layernorm.weight"],
            d + "attention.qkv.weight": hf[s + "self_attn.qkv_proj.weight"],
            d + "attention.dense.weight": hf[s + "self_attn.o_proj.weight"],
            d + "post_layernorm.weight": hf[s + "post_attention_layernorm.weight"],
            # convert.py: "Swap the halves" of gate_up_proj (rows gate, up) -> [up; gate]
            d + "mlp.fc.weight": torch.cat([gate_up[INTER:], gate_up[:INTER]]),
            d + "mlp.proj.weight": hf[s + "mlp.down_proj.weight"],
        }
    assert sorted(ours) == sorted(expected)  # no mlp.gate, no biases
    for name, tensor in expected.items():
        assert ours[name].dtype == torch.float16, name
        assert torch.equal(ours[name], tensor.to(torch.float16)), name
    assert trtllm_config(tmp_path / "out")["tie_word_embeddings"] is tied


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_each_rank_mlp_computes_the_hf_mlp(tmp_path: Path, tp: int) -> None:
    """The engine's MLP on every rank (swiglu over that rank's own fc rows, then its proj part), summed over ranks as
    the all-reduce does, equals HF's Phi3MLP: this is what the per-rank [up_r; gate_r] order is for (a contiguous
    split of [up; gate], as TensorRT-LLM's split_weights_tp cuts it, fails this at tp > 1)."""
    src = make_checkpoint(tmp_path / "hf", "phi3")
    hf = hf_tensors(src)
    out = convert(src, tmp_path / "out", tp=tp)
    x = torch.randn(5, HIDDEN, dtype=torch.float64)
    gate, up = hf["model.layers.0.mlp.gate_up_proj.weight"].double().chunk(2)
    want = (F.silu(x @ gate.T) * (x @ up.T)) @ hf["model.layers.0.mlp.down_proj.weight"].double().T
    got = torch.zeros_like(want)
    for r in range(tp):
        rank = load_rank(out / f"rank{r}.safetensors")
        lin, act = (x @ rank["transformer.layers.0.mlp.fc.weight"].double().T).chunk(2, dim=-1)
        got += (F.silu(act) * lin) @ rank["transformer.layers.0.mlp.proj.weight"].double().T
    torch.testing.assert_close(got, want)


# -- TP / PP shards ---------------------------------------------------------------------------------------------
def merge_phi3(directory: Path) -> dict[str, torch.Tensor]:
    """The tp=1, pp=1 tensors rebuilt from rank files: qkv per q/k/v (KV copies dropped), mlp.fc per rank halves
    [up_r; gate_r], dense/proj on dim 1, lm_head on dim 0 without its zero padding, the rest replicated."""
    cfg = trtllm_config(directory)
    tp, pp = cfg["mapping"]["tp_size"], cfg["mapping"]["pp_size"]
    merged: dict[str, torch.Tensor] = {}
    for stage, layers in enumerate(stage_layers(cfg["num_hidden_layers"], pp)):
        files = [load_rank(directory / f"rank{stage * tp + t}.safetensors") for t in range(tp)]
        assert all(sorted(f) == sorted(files[0]) for f in files)
        for name in files[0]:
            parts = [f[name] for f in files]
            match = re.fullmatch(r"transformer\.layers\.(\d+)\.(.*)", name)
            suffix = match.group(2) if match else name
            if match:
                name = f"transformer.layers.{layers[int(match.group(1))]}.{suffix}"
            if suffix == "attention.qkv.weight":
                merged[name] = merge_qkv(parts, cfg["num_attention_heads"], cfg["num_key_value_heads"],
                                         cfg["head_size"])
            elif suffix == "mlp.fc.weight":
                halves = [p.chunk(2) for p in parts]
                merged[name] = torch.cat([h[0] for h in halves] + [h[1] for h in halves])
            elif suffix in ("attention.dense.weight", "mlp.proj.weight"):
                merged[name] = torch.cat(parts, dim=1)
            elif name == "lm_head.weight":
                full = torch.cat(parts)
                assert not full[cfg["vocab_size"]:].any(), "vocab padding rows must be zero"
                merged[name] = full[:cfg["vocab_size"]]
            else:
                assert all(torch.equal(parts[0], p) for p in parts[1:]), f"{name} differs across tp ranks"
                merged[name] = parts[0]
    return merged


@pytest.mark.parametrize(
    ("overrides", "tp", "pp"),
    [
        ({}, 2, 1),  # GQA, kv == tp
        ({"num_key_value_heads": 1}, 2, 1),  # kv < tp: each rank gets a copy of the KV head
        ({"num_hidden_layers": 3}, 1, 2),  # uneven stages: 2 + 1 layers
        ({"num_hidden_layers": 3, "num_key_value_heads": 4}, 2, 2),  # MHA (Phi-3-mini), tp x pp
        ({"tie_word_embeddings": True, "vocab_size": 1001}, 2, 1),  # Phi-4-mini style tied head, padded vocab
    ],
)
def test_rank_files_merge_back_to_tp1(tmp_path: Path, overrides: dict, tp: int, pp: int) -> None:
    src = make_checkpoint(tmp_path / "hf", "phi3", **overrides)
    single = load_rank(convert(src, tmp_path / "tp1") / "rank0.safetensors")
    sharded = convert(src, tmp_path / "sharded", tp, pp)
    assert sorted(p.name for p in sharded.glob("rank*.safetensors")) == [f"rank{r}.safetensors" for r in range(tp * pp)]
    merged = merge_phi3(sharded)
    assert sorted(merged) == sorted(single)
    for name, tensor in single.items():
        assert torch.equal(merged[name], tensor), name
    cfg = trtllm_config(sharded)
    assert cfg["mapping"] == {"world_size": tp * pp, "tp_size": tp, "pp_size": pp}
    qkv = load_rank(sharded / "rank0.safetensors")["transformer.layers.0.attention.qkv.weight"]
    kv = cfg["num_key_value_heads"]
    assert qkv.shape == ((HEADS + 2 * max(kv, tp)) * HEAD_DIM // tp, HIDDEN)


# -- config.json ------------------------------------------------------------------------------------------------
def test_config_fields_as_phi3config_writes_them(tmp_path: Path) -> None:
    src = make_checkpoint(tmp_path / "hf", "phi3")
    hf = json.loads((src / "config.json").read_text())
    cfg = trtllm_config(convert(src, tmp_path / "out"))
    assert cfg["architecture"] == "Phi3ForCausalLM"
    assert cfg["hidden_act"] == "swiglu"  # Phi3Config: silu -> swiglu
    assert cfg["position_embedding_type"] == "rope_gpt_neox"  # max_position_embeddings < 128000
    assert cfg["rotary_base"] == hf["rope_parameters"]["rope_theta"]
    assert cfg["rotary_scaling"] is None  # Phi3Config never sets it
    assert (cfg["rotary_pct"], cfg["rotary_embedding_dim"]) == (1.0, HEAD_DIM)
    assert cfg["head_size"] == hf["hidden_size"] // hf["num_attention_heads"]
    assert cfg["norm_epsilon"] == hf["rms_norm_eps"]
    assert cfg["intermediate_size"] == hf["intermediate_size"]  # fc holds twice as many rows
    for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "max_position_embeddings", "tie_word_embeddings"):
        assert cfg[key] == hf[key], key
    assert not {"original_max_position_embeddings", "longrope_scaling_short_factors", "sliding_window",
                "mlp_bias", "attn_bias"} & set(cfg)


def test_sliding_window_is_carried(tmp_path: Path) -> None:
    """Phi-3-mini-4k attends to the last 2047 tokens (HF applies sliding_window); TensorRT-LLM's Phi-3 model has no
    window field, so the value travels as specbuild's `sliding_window`, as for Mistral."""
    src = make_checkpoint(tmp_path / "hf", "phi3", sliding_window=48)
    assert trtllm_config(convert(src, tmp_path / "out"))["sliding_window"] == 48


def test_longrope_fields_transformers5_config(tmp_path: Path) -> None:
    src = make_checkpoint(tmp_path / "hf", "phi3", **LONGROPE)
    cfg = trtllm_config(convert(src, tmp_path / "out"))
    assert cfg["position_embedding_type"] == "long_rope"
    assert cfg["original_max_position_embeddings"] == 256
    assert cfg["longrope_scaling_short_factors"] == SHORT
    assert cfg["longrope_scaling_long_factors"] == LONG
    assert cfg["max_position_embeddings"] == 131072
    assert cfg["rotary_scaling"] is None and cfg["rotary_base"] == 10000.0


@pytest.mark.parametrize("kind", ["longrope", "su"])
def test_longrope_fields_transformers4_config(tmp_path: Path, kind: str) -> None:
    """Hub configs written by transformers 4 (Phi-3-mini-128k: type su; Phi-3.5/Phi-4-mini: longrope, with a
    top-level partial_rotary_factor): rope_theta, rope_scaling and partial_rotary_factor at the top level."""
    src = make_checkpoint(tmp_path / "hf", "phi3", **LONGROPE)
    hf = json.loads((src / "config.json").read_text())
    del hf["rope_parameters"]
    short, long = SHORT[: HEAD_DIM // 4], LONG[: HEAD_DIM // 4]  # partial rotary 0.5: half the frequencies
    hf.update(rope_theta=250000.0, partial_rotary_factor=0.5,
              rope_scaling={"type": kind, "short_factor": short, "long_factor": long})
    (src / "config.json").write_text(json.dumps(hf))
    cfg = trtllm_config(convert(src, tmp_path / "out"))
    assert cfg["position_embedding_type"] == "long_rope"
    assert (cfg["rotary_base"], cfg["rotary_pct"], cfg["rotary_embedding_dim"]) == (250000.0, 0.5, HEAD_DIM // 2)
    assert (cfg["longrope_scaling_short_factors"], cfg["longrope_scaling_long_factors"]) == (short, long)
    assert cfg["original_max_position_embeddings"] == 256


def test_redundant_longrope_scales_are_accepted(tmp_path: Path) -> None:
    """An explicit factor / attention_factor equal to what TensorRT-LLM derives (max / original positions, and
    sqrt(1 + ln(s) / ln(original))) changes nothing and is accepted."""
    ratio = 131072 / 256
    params = {**LONGROPE["rope_parameters"], "factor": ratio,
              "attention_factor": math.sqrt(1 + math.log(ratio) / math.log(256))}
    src = make_checkpoint(tmp_path / "hf", "phi3", **{**LONGROPE, "rope_parameters": params})
    assert trtllm_config(convert(src, tmp_path / "out"))["position_embedding_type"] == "long_rope"


# -- refusals ---------------------------------------------------------------------------------------------------
def hf_config_edits(src: Path, **changes: object) -> None:
    hf = json.loads((src / "config.json").read_text())
    hf.update(changes)
    (src / "config.json").write_text(json.dumps(hf))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        # TensorRT-LLM 1.2 applies longrope only from max_position_embeddings >= 128000 (would drop the factors)
        ({"rope_parameters": {**LONGROPE["rope_parameters"]}}, r"max_position_embeddings is 256.*128000"),
        # ... and reads short/long factors unconditionally from there on
        ({"max_position_embeddings": 131072}, r"no longrope rope_scaling"),
        ({**LONGROPE, "rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}},
         r"rope scaling type 'dynamic'"),
        ({**LONGROPE, "rope_parameters": {**LONGROPE["rope_parameters"], "short_factor": SHORT[:-1]}},
         r"short_factor must be a list of 8 numbers"),
        ({**LONGROPE, "rope_parameters": {**LONGROPE["rope_parameters"], "attention_factor": 1.0}},
         r"attention_factor is 1.0.*always uses"),
        ({"hidden_act": "gelu"}, r"'hidden_act' is 'gelu'"),
        ({"head_dim": 32}, r"'head_dim' is 32"),
        ({"architectures": ["Phi3SmallForCausalLM"]},
         r"'Phi3SmallForCausalLM' is not supported: Phi-3-small's block-sparse attention"),
        ({"architectures": ["PhiMoEForCausalLM"]}, r"'PhiMoEForCausalLM' is not supported: Phi-3.5-MoE's sparse-mixer"),
    ],
)
def test_what_tensorrt_llm_cannot_express_is_refused(tmp_path: Path, changes: dict, message: str) -> None:
    src = make_checkpoint(tmp_path / "hf", "phi3")
    hf_config_edits(src, **changes)
    with pytest.raises(CheckpointError, match=message) as err:
        convert(src, tmp_path / "out")
    assert err.value.hint
    assert str(src / "config.json") in err.value.message
    assert not (tmp_path / "out").exists()


def test_renamed_tensor_is_named(tmp_path: Path) -> None:
    """A checkpoint whose MLP was saved unfused (gate_proj / up_proj, not Phi-3's layout) is refused naming the
    missing fused tensor, before anything is written."""
    src = make_checkpoint(tmp_path / "hf", "phi3")
    weights = hf_tensors(src)
    gate, up = weights.pop("model.layers.0.mlp.gate_up_proj.weight").chunk(2)
    weights |= {"model.layers.0.mlp.gate_proj.weight": gate.contiguous(), "model.layers.0.mlp.up_proj.weight": up}
    for f in src.glob("*.safetensors"):
        f.unlink()
    save_file(weights, src / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"model\.layers\.0\.mlp\.gate_up_proj\.weight' is missing"):
        convert(src, tmp_path / "out")
    assert not (tmp_path / "out").exists()
