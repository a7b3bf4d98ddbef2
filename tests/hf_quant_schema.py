"""What ModelOpt 0.47.0's `export_hf_checkpoint` writes for a quantized Llama-family draft, per format TensorRT-LLM
1.2's PyTorch backend loads, and what that backend's loader reads of it: the table tests/test_quantize_hf_export.py
checks every export against, field by field and tensor by tensor.

Sources (read, not copied):
- MO: NVIDIA/Model-Optimizer 0.47.0 (the nvidia-modelopt 0.47.0 wheel), modelopt/torch/export/
  unified_export_hf.py (`export_hf_checkpoint`, `_export_quantized_weight`, `_write_hf_export_config`,
  `requantize_resmooth_fused_llm_layers`), quant_utils.py (`get_quant_config`, `process_layer_quant_config`,
  `to_quantized_weight`, `pack_int4_in_uint8`, `postprocess_state_dict` and its `_KV_CACHE_REPLACEMENTS`),
  convert_hf_config.py (`convert_hf_quant_config_format`), modelopt/torch/quantization/utils/core_utils.py
  (`quantizer_attr_names`: weight_scale, weight_scale_2, input_scale).
- TRTLLM: NVIDIA/TensorRT-LLM, 1.2 line, commit 195839a7 (stored in the fork HuiGao-NV/TensorRT-LLM):
  tensorrt_llm/_torch/model_config.py (`from_pretrained`: hf_quant_config.json first;
  `load_modelopt_quant_config`) and tensorrt_llm/_torch/modules/linear.py (`get_quant_method`,
  FP8QDQLinearMethod, WeightOnlyQuantLinearMethod, W4A16_AWQ_LinearMethod, W4A8_AWQ_LinearMethod).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

FILES = ("config.json", "generation_config.json", "hf_quant_config.json", "model.safetensors")
"""MO `export_hf_checkpoint`: save_pretrained (config.json, generation_config.json, model.safetensors under the
default max_shard_size of 10GB), then `_write_hf_export_config` (hf_quant_config.json, quantization_config)."""

PRODUCER = {"name": "modelopt", "version": "0.47.0"}
"""MO `get_quant_config`: {"producer": {"name": "modelopt", "version": __version__}, "quantization": ...}."""

EXCLUDE_MODULES = ["lm_head", "model.embed_tokens"]
"""MO `process_layer_quant_config`: the modules with a disabled quantizer, summarized by prefix wildcards; on a Llama
draft the lm_head (the presets disable "*lm_head*") and the embedding (a quantized module under transformers 5, with
its quantizers off)."""

AWQ_FIELDS = {"has_zero_point": False, "pre_quant_scale": True}
"""MO `process_layer_quant_config` for int4_awq / w4a8_awq, beside group_size."""

TRTLLM_READS = ("quant_algo", "kv_cache_quant_algo", "group_size", "exclude_modules")
"""TRTLLM `load_modelopt_quant_config`: the `quantization` fields the PyTorch backend reads from hf_quant_config.json
(quant_algo becomes a QuantAlgo; anything else is ignored)."""

TRTLLM_QUANT_ALGOS = ("FP8", "W8A16", "W4A16_AWQ", "W4A8_AWQ")
"""The quant_algos of specbuild's formats that TRTLLM `get_quant_method` gives a linear method (FP8QDQ, weight-only,
W4A16_AWQ, W4A8_AWQ); W8A8_SQ_PER_CHANNEL gets none ('unsupported quant mode')."""


def hf_quant_config(quant_algo: str, kv_cache_quant_algo: str | None, group_size: int | None) -> dict[str, Any]:
    """The whole hf_quant_config.json MO writes for one format (key order aside)."""
    quantization: dict[str, Any] = {"quant_algo": quant_algo, "kv_cache_quant_algo": kv_cache_quant_algo}
    if quant_algo in ("W4A16_AWQ", "W4A8_AWQ"):
        quantization.update(group_size=group_size, **AWQ_FIELDS)
    quantization["exclude_modules"] = EXCLUDE_MODULES
    return {"producer": PRODUCER, "quantization": quantization}


FLOAT8 = {"dynamic": False, "num_bits": 8, "type": "float"}


def quantization_config(quant_algo: str, kv_cache_quant_algo: str | None) -> dict[str, Any]:
    """config.json's `quantization_config`, MO `convert_hf_quant_config_format` of the above: config_groups only for
    FP8 (of these formats), `ignore` = exclude_modules, kv_cache_scheme for an FP8 KV cache, quant_method "modelopt".
    TRTLLM does not read it when hf_quant_config.json is there (model_config.py `from_pretrained`)."""
    config: dict[str, Any] = {}
    if quant_algo == "FP8":
        config["config_groups"] = {"group_0": {"input_activations": FLOAT8, "weights": FLOAT8,
                                               "targets": ["Linear"]}}
    config.update(ignore=EXCLUDE_MODULES, quant_algo=quant_algo)
    if kv_cache_quant_algo == "FP8":
        config["kv_cache_scheme"] = FLOAT8
    config.update(producer=PRODUCER, quant_method="modelopt")
    return config


@dataclass(frozen=True)
class Scale:
    """One tensor beside a quantized linear's weight: its name suffix, dtype, shape (from out, in, group), on which
    linears it is written, and the TRTLLM linear method that reads it (None: written, not read)."""

    suffix: str
    dtype: torch.dtype | str  # "export": the export dtype (float16 for a float32 draft)
    shape: str  # "scalar", "out", "in", "out_in", "packed", "groups"
    on: str = "all"  # "all", or "unfused": o_proj and down_proj (the others' pre_quant_scale is in their norm)
    read_by: str | None = None


QUANTIZED_LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                     "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
UNFUSED = ("self_attn.o_proj", "mlp.down_proj")
"""TRTLLM loads q/k/v as one fused QKV linear and gate/up as one fused linear; o_proj and down_proj alone."""
NORM_BEFORE = {"self_attn.q_proj": "input_layernorm", "self_attn.k_proj": "input_layernorm",
               "self_attn.v_proj": "input_layernorm", "mlp.gate_proj": "post_attention_layernorm",
               "mlp.up_proj": "post_attention_layernorm"}
"""The RMSNorm whose output a fused linear reads: for AWQ, MO `requantize_resmooth_fused_llm_layers` folds the
shared pre_quant_scale into its weight (`fuse_prequant_layernorm`) instead of writing it (TRTLLM
W4A16_AWQ_LinearMethod: "merged with the LayerNorm for QKV and Gate/Up projection layers")."""

TENSORS: dict[str, tuple[Scale, ...]] = {
    # MO: fp8 weight = weight / weight_scale; per-tensor weight_scale = amax / 448; input_scale (squeezed).
    "FP8": (Scale("weight", torch.float8_e4m3fn, "out_in", read_by="FP8QDQLinearMethod"),
            Scale("weight_scale", torch.float32, "scalar", read_by="FP8QDQLinearMethod"),
            Scale("input_scale", torch.float32, "scalar", read_by="FP8QDQLinearMethod")),
    # MO: int8 = round(weight / weight_scale[:, None]); per-channel weight_scale [out].
    "W8A16": (Scale("weight", torch.int8, "out_in", read_by="WeightOnlyQuantLinearMethod"),
              Scale("weight_scale", torch.float32, "out", read_by="WeightOnlyQuantLinearMethod")),
    # MO pack_int4_in_uint8: [out/2, in], rows 2j (low nibble) and 2j+1 (high); weight_scale [out, in/group].
    "W4A16_AWQ": (Scale("weight", torch.uint8, "packed", read_by="W4A16_AWQ_LinearMethod"),
                  Scale("weight_scale", torch.float32, "groups", read_by="W4A16_AWQ_LinearMethod"),
                  Scale("pre_quant_scale", "export", "in", on="unfused", read_by="W4A16_AWQ_LinearMethod")),
    # As W4A16_AWQ, plus the fp8 activation scale and weight_scale_2 (int4 * weight_scale on an fp8 grid).
    "W4A8_AWQ": (Scale("weight", torch.uint8, "packed", read_by="W4A8_AWQ_LinearMethod"),
                 Scale("weight_scale", torch.float32, "groups", read_by="W4A8_AWQ_LinearMethod"),
                 Scale("weight_scale_2", torch.float32, "scalar", read_by="W4A8_AWQ_LinearMethod"),
                 Scale("input_scale", torch.float32, "scalar", read_by="W4A8_AWQ_LinearMethod"),
                 Scale("pre_quant_scale", "export", "in", on="unfused", read_by="W4A8_AWQ_LinearMethod")),
}
"""Per quant_algo, what MO writes beside each quantized linear `<layer>.<linear>` (names from quantizer_attr_names)."""

KV_TENSORS = {"FP8": (("self_attn.k_proj.k_scale", torch.float32), ("self_attn.v_proj.v_scale", torch.float32))}
"""MO `postprocess_state_dict` (_KV_CACHE_REPLACEMENTS): k/v_bmm_quantizer amax / 448 as `k_proj.k_scale`,
`v_proj.v_scale`, scalars; TRTLLM FP8QDQLinearMethod.load_kv_scales reads them (used only with
TRTLLM_LOAD_KV_SCALES=1)."""

UNQUANTIZED = ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight")
"""Written in the export dtype, as every norm weight (MO: dtype "to export the unquantized layers")."""


def shape_of(rule: str, out: int, inp: int, group: int | None) -> tuple[int, ...]:
    return {"scalar": (), "out": (out,), "in": (inp,), "out_in": (out, inp), "packed": (out // 2, inp),
            "groups": (out, inp // (group or 1))}[rule]


def expected_tensors(config: dict[str, Any], quant_algo: str, kv_cache_quant_algo: str | None, group: int | None,
                     export_dtype: torch.dtype) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
    """Every tensor of the export of a Llama-family model with `config` (its config.json): name -> (dtype, shape)."""
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    head = config.get("head_dim") or hidden // config["num_attention_heads"]
    q, kv = config["num_attention_heads"] * head, config["num_key_value_heads"] * head
    dims = {"self_attn.q_proj": (q, hidden), "self_attn.k_proj": (kv, hidden), "self_attn.v_proj": (kv, hidden),
            "self_attn.o_proj": (hidden, q), "mlp.gate_proj": (inter, hidden), "mlp.up_proj": (inter, hidden),
            "mlp.down_proj": (hidden, inter)}
    expected: dict[str, tuple[torch.dtype, tuple[int, ...]]] = {
        "model.embed_tokens.weight": (export_dtype, (config["vocab_size"], hidden)),
        "model.norm.weight": (export_dtype, (hidden,)),
        "lm_head.weight": (export_dtype, (config["vocab_size"], hidden)),
    }
    for layer in range(config["num_hidden_layers"]):
        prefix = f"model.layers.{layer}."
        for norm in ("input_layernorm", "post_attention_layernorm"):
            expected[f"{prefix}{norm}.weight"] = (export_dtype, (hidden,))
        for linear in QUANTIZED_LINEARS:
            out, inp = dims[linear]
            for scale in TENSORS[quant_algo]:
                if scale.on == "unfused" and linear not in UNFUSED:
                    continue
                dtype = export_dtype if scale.dtype == "export" else scale.dtype
                assert isinstance(dtype, torch.dtype)
                expected[f"{prefix}{linear}.{scale.suffix}"] = (dtype, shape_of(scale.shape, out, inp, group))
        for name, dtype in KV_TENSORS.get(kv_cache_quant_algo or "", ()):
            expected[f"{prefix}{name}"] = (dtype, ())
    return expected
