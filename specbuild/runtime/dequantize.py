"""Quantized TensorRT-LLM checkpoints in the reference runtime: weights dequantized at load, activations and the
KV cache quantized-dequantized at run time, so the runtime computes what TensorRT-LLM computes.

Written from the checkpoint format as ModelOpt 0.47.0 writes it (`export_tensorrt_llm_checkpoint`,
NVIDIA/Model-Optimizer, modelopt/torch/export/model_config_export.py; checked on its exports of a 2-layer Llama), not
from specbuild.convert. Per quantized linear `<p>.weight`:

| quant_algo | weight | weights_scaling_factor | other | activations |
|---|---|---|---|---|
| FP8 | float8_e4m3fn | fp32 [1] | activation_scaling_factor [1] | fp8, per tensor |
| W8A8_SQ_PER_CHANNEL | int8 | fp32 [out] | activation_scaling_factor [1], prequant [in] | int8, per tensor |
| W8A16 | int8 | fp32 [out] | | - |
| W4A16_AWQ | int8 [out/2, in]: rows 2j (low nibble) and 2j+1 (high) | fp32 [out, in/group] | prequant [in] | - |
| W4A8_AWQ | as W4A16_AWQ | as W4A16_AWQ | weights_scaling_factor_2 [1], activation [1], prequant [in] | fp8 |

W4A8's int4 values times their group scale are an fp8 grid scaled by `weights_scaling_factor_2` (the kernel
dequantizes int4 to fp8 and runs an fp8 GEMM), so the dequantized weight is fp8(int4 * s / s2) * s2.
A linear's input is multiplied by `prequant_scaling_factor` (SmoothQuant/AWQ smoothing; for a weight-only format
folded into the weight at load instead) and, where the format quantizes activations, rounded to the format's
grid with `activation_scaling_factor`. With an FP8 KV cache the
keys (after RoPE) and values are rounded to fp8 with `kv_cache_scaling_factor` before they enter the cache.
"""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path
from typing import Any

import torch
from torch import nn

from specbuild.errors import SpecbuildError

QUANT_ALGOS = ("FP8", "W8A8_SQ_PER_CHANNEL", "W8A16", "W4A16_AWQ", "W4A8_AWQ")
KV_CACHE_QUANT_ALGOS = ("FP8",)
ACTIVATIONS = {"FP8": "fp8", "W8A8_SQ_PER_CHANNEL": "int8", "W4A8_AWQ": "fp8"}
FP8_MAX = 448.0  # largest float8_e4m3fn value
INT8_MIN, INT8_MAX = -128, 127


class QuantizedCheckpointError(SpecbuildError):
    """A quantized checkpoint the runtime cannot dequantize (unknown algorithm, missing or malformed scale)."""


def quantization_problem(quant: dict[str, Any]) -> str | None:
    """Why the runtime cannot run a checkpoint with this `quantization` block (None: it can)."""
    algo, kv = quant.get("quant_algo"), quant.get("kv_cache_quant_algo")
    if algo is not None and algo not in QUANT_ALGOS:
        return f"quantization.quant_algo {algo!r} is not supported (supported: {', '.join(QUANT_ALGOS)})"
    if kv is not None and kv not in KV_CACHE_QUANT_ALGOS:
        known = ", ".join(KV_CACHE_QUANT_ALGOS)
        return f"quantization.kv_cache_quant_algo {kv!r} is not supported (supported: {known})"
    if algo in ("W4A16_AWQ", "W4A8_AWQ") and quant.get("has_zero_point"):
        return "quantization.has_zero_point = true (asymmetric int4) is not supported"
    return None


# -- rounding to a grid ---------------------------------------------------------------------------------------------
def fp8_qdq(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Round x / scale to float8_e4m3fn (saturating) and scale back."""
    y = (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return (y.float() * scale).to(x.dtype)


def int8_qdq(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Round x / scale to int8 (round half to even, clamp to [-128, 127]) and scale back."""
    return ((x.float() / scale).round().clamp(INT8_MIN, INT8_MAX) * scale).to(x.dtype)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """[out/2, in] bytes -> [out, in] int4 values in int8: row 2j is the low nibble, row 2j+1 the high one."""
    u = packed.view(torch.uint8).to(torch.int16)
    low, high = u & 0x0F, u >> 4
    low, high = torch.where(low >= 8, low - 16, low), torch.where(high >= 8, high - 16, high)
    return torch.stack([low, high], dim=1).reshape(2 * packed.shape[0], packed.shape[1]).to(torch.int8)


# -- weights ------------------------------------------------------------------------------------------------------
def _scale(tensors: dict[str, torch.Tensor], name: str, shape: tuple[int, ...], path: Path) -> torch.Tensor:
    tensor = tensors.get(name)
    if tensor is None:
        raise QuantizedCheckpointError(f"{path}: tensor {name!r} is missing (the quantized weight needs it)")
    if tuple(tensor.shape) != shape:
        raise QuantizedCheckpointError(
            f"{path}: tensor {name!r} has shape {list(tensor.shape)}, expected {list(shape)}"
        )
    return tensor.float()


def dequantize_weight(tensors: dict[str, torch.Tensor], base: str, quant: dict[str, Any], path: Path
                      ) -> torch.Tensor:
    """The float32 weight of the linear `base` (its name without `weight`)."""
    algo, weight = quant["quant_algo"], tensors[base + "weight"]
    wsf = base + "weights_scaling_factor"
    expected_dtype = {"FP8": torch.float8_e4m3fn}.get(algo, torch.int8)
    if weight.dtype != expected_dtype:
        raise QuantizedCheckpointError(
            f"{path}: tensor {base + 'weight'!r} is {weight.dtype}, but {algo} stores {expected_dtype}"
        )
    if algo == "FP8":
        return weight.float() * _scale(tensors, wsf, (1,), path)
    if algo in ("W8A8_SQ_PER_CHANNEL", "W8A16"):
        return weight.float() * _scale(tensors, wsf, (weight.shape[0],), path)[:, None]
    out, inp = 2 * weight.shape[0], weight.shape[1]
    group = int(quant.get("group_size") or 128)
    if inp % group:
        raise QuantizedCheckpointError(f"{path}: {base + 'weight'!r} input size {inp} is not a multiple of group_size "
                                       f"{group}")
    scales = _scale(tensors, wsf, (out, inp // group), path).repeat_interleave(group, dim=1)
    values = unpack_int4(weight).float() * scales
    if algo == "W4A8_AWQ":
        scale_2 = _scale(tensors, base + "weights_scaling_factor_2", (1,), path)
        values = fp8_qdq(values, scale_2)
    return values


_LINEAR = re.compile(r"transformer\.layers\.\d+\.(attention\.(qkv|dense)|mlp\.(fc|gate|proj))\.weight")


def _excluded(name: str, quant: dict[str, Any]) -> bool:
    """Is the module of weight `name` left unquantized by `quantization.exclude_modules` (glob patterns)?"""
    module = name[: -len(".weight")]
    return any(fnmatch.fnmatchcase(module, pattern) or fnmatch.fnmatchcase(module.split(".")[-1], pattern)
               for pattern in quant.get("exclude_modules") or ())


def dequantize_rank(tensors: dict[str, torch.Tensor], path: Path, quant: dict[str, Any]) -> dict[str, torch.Tensor]:
    """One rank file's tensors with every quantized weight dequantized to float32 and its weight scales dropped
    (a weight-only format's pre-quant scale is folded into its weight); activation, remaining pre-quant and
    KV-cache scales stay (float32) for the model to apply at run time."""
    algo = quant.get("quant_algo")
    result: dict[str, torch.Tensor] = {}
    folded: list[str] = []
    for name, tensor in tensors.items():
        if name.endswith(("weights_scaling_factor", "weights_scaling_factor_2")):
            continue
        base = name[: -len("weight")] if name.endswith(".weight") else None
        if base is not None and base + "weights_scaling_factor" in tensors:
            if algo is None:
                raise QuantizedCheckpointError(
                    f"{path}: {name!r} has a weights_scaling_factor but config.json's quantization.quant_algo is null"
                )
            weight = dequantize_weight(tensors, base, quant, path)
            prequant = base + "prequant_scaling_factor"
            if algo not in ACTIVATIONS and prequant in tensors:
                # Weight-only: linear(x * s, W) = linear(x, W * s), so no multiply per forward.
                weight = weight * _scale(tensors, prequant, (weight.shape[1],), path)
                folded.append(prequant)
            result[name] = weight
        elif algo is not None and _LINEAR.fullmatch(name) and not _excluded(name, quant):
            raise QuantizedCheckpointError(
                f"{path}: tensor {name!r} is {tensor.dtype} without a weights_scaling_factor, but "
                f"quantization.quant_algo is {algo!r}: its layers' weights should be quantized"
            )
        elif not tensor.dtype.is_floating_point or tensor.dtype == torch.float8_e4m3fn:
            raise QuantizedCheckpointError(
                f"{path}: tensor {name!r} is {tensor.dtype} but has no weights_scaling_factor"
            )
        elif name.endswith(("activation_scaling_factor", "prequant_scaling_factor", "cache_scaling_factor")):
            result[name] = tensor.float()
        else:
            result[name] = tensor
    for name in folded:
        del result[name]
    return result


# -- run time -----------------------------------------------------------------------------------------------------
class InputQuantizer(nn.Module):
    """What happens to a quantized linear's input before the GEMM: x * prequant, then rounding to the format's
    activation grid with the calibrated per-tensor scale."""

    def __init__(self, kind: str | None, scale: torch.Tensor | None, prequant: torch.Tensor | None) -> None:
        super().__init__()
        self.kind = kind
        self.register_buffer("scale", scale)
        self.register_buffer("prequant", prequant)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.prequant is not None:
            x = x * self.prequant
        if self.kind == "fp8":
            return fp8_qdq(x, self.scale)
        if self.kind == "int8":
            return int8_qdq(x, self.scale)
        return x


def same_input(a: InputQuantizer | None, b: InputQuantizer | None) -> bool:
    """Do two linears reading the same input treat it alike (so they may share one quantized input and one fused
    GEMM)?"""
    def same(x: torch.Tensor | None, y: torch.Tensor | None) -> bool:
        return x is y or (x is not None and y is not None and torch.equal(x, y))

    if a is None or b is None:
        return a is b
    return a.kind == b.kind and same(a.scale, b.scale) and same(a.prequant, b.prequant)


def input_quantizer(quant_algo: str | None, tensors: dict[str, torch.Tensor], prefix: str) -> InputQuantizer | None:
    """The input quantizer of linear `prefix` (e.g. `transformer.layers.0.attention.qkv.`), None when the input
    is used as it is."""
    kind = ACTIVATIONS.get(quant_algo or "")
    scale = tensors.get(prefix + "activation_scaling_factor")
    prequant = tensors.get(prefix + "prequant_scaling_factor")
    if kind is not None and scale is None:
        raise QuantizedCheckpointError(
            f"tensor {prefix + 'activation_scaling_factor'!r} is missing ({quant_algo} quantizes activations)"
        )
    if kind is None and prequant is None:
        return None
    return InputQuantizer(kind, scale, prequant)


def kv_cache_scale(kv_algo: str | None, tensors: dict[str, torch.Tensor], prefix: str) -> torch.Tensor | None:
    """The FP8 KV cache's scale for attention `prefix` (TensorRT-LLM >= 0.17 reads the one `kv_cache_scaling_factor`,
    the max of the K and V scales)."""
    if kv_algo is None:
        return None
    scale = tensors.get(prefix + "kv_cache_scaling_factor")
    if scale is None:
        k, v = tensors.get(prefix + "k_cache_scaling_factor"), tensors.get(prefix + "v_cache_scaling_factor")
        if k is None or v is None:
            raise QuantizedCheckpointError(f"tensor {prefix + 'kv_cache_scaling_factor'!r} is missing "
                                           f"(kv_cache_quant_algo {kv_algo})")
        scale = torch.maximum(k, v)
    return scale.float()
