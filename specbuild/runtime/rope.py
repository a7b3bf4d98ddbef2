"""Rotary position embeddings, GPT-NeoX style (rotate halves), with the `rotary_scaling` types the converter
passes through from Hugging Face configs.

TensorRT-LLM's LLaMA config carries HF's `rope_scaling` dict unchanged as `rotary_scaling` (`LLaMAConfig`,
NVIDIA/TensorRT-LLM tensorrt_llm/models/llama/config.py, commit 89fd9b74), so
the frequencies follow the HF formulas: "linear" (factor), "llama3" (factor, low/high_freq_factor,
original_max_position_embeddings), "dynamic" (NTK, recomputed when positions pass max_position_embeddings) and
"yarn" (with its cos/sin attention factor) and "longrope" (HF's older name "su": Phi-3's per-frequency short and long
factors, the long ones once a forward's positions pass original_max_position_embeddings, cos/sin scaled by
sqrt(1 + ln(s) / ln(original)) with s = max_position_embeddings / original, as HF's `_compute_longrope_parameters` and
TensorRT-LLM's long_rope (models/phi3/model.py @c4dc529f) compute them). Anything else is refused rather than
silently run unscaled.
"""

from __future__ import annotations

import math
from typing import Any

import torch

SCALING_TYPES = ("default", "linear", "llama3", "dynamic", "yarn", "longrope")
_REQUIRED = {"linear": ("factor",), "llama3": ("factor", "low_freq_factor", "high_freq_factor"),
             "dynamic": ("factor",), "yarn": ("factor",), "longrope": ("short_factor", "long_factor")}


def scaling_type(scaling: dict[str, Any] | None) -> str:
    """HF spells the type `rope_type` (newer) or `type` (older); None and "default" mean no scaling; "su" is
    LongRoPE's first name."""
    if not scaling:
        return "default"
    kind = str(scaling.get("rope_type", scaling.get("type", "default")))
    return "longrope" if kind == "su" else kind


def rope_scaling_problem(scaling: Any) -> str | None:
    """Why this `rotary_scaling` cannot be run (None when it can)."""
    if scaling is None:
        return None
    if not isinstance(scaling, dict):
        return f"expected an object or null, got {scaling!r}"
    kind = scaling_type(scaling)
    if kind not in SCALING_TYPES:
        return f"type {kind!r} is not supported by the reference runtime (supported: {', '.join(SCALING_TYPES)})"
    missing = [key for key in _REQUIRED.get(kind, ()) if scaling.get(key) is None]
    if missing:
        return f"type {kind!r} needs {', '.join(missing)} (TensorRT-LLM's Medusa converter drops them; pass them)"
    return None


def _base_inv_freq(base: float, dim: int) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float32) / dim))


def _llama3(inv_freq: torch.Tensor, scaling: dict[str, Any], max_positions: int) -> torch.Tensor:
    """Llama 3.1: low frequencies divided by `factor`, high ones kept, a smooth ramp between."""
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_context = scaling.get("original_max_position_embeddings") or max_positions
    low_wavelen, high_wavelen = old_context / low, old_context / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def _yarn(base: float, dim: int, scaling: dict[str, Any], max_positions: int) -> tuple[torch.Tensor, float]:
    """YaRN: interpolate low frequencies, extrapolate high ones, scale cos/sin by the attention factor."""
    factor = scaling["factor"]
    original = scaling.get("original_max_position_embeddings") or max_positions
    mscale, mscale_all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")

    def get_mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention = scaling.get("attention_factor")
    if attention is None:
        attention = get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim) if mscale and mscale_all_dim \
            else get_mscale(factor)
    beta_fast, beta_slow = scaling.get("beta_fast") or 32, scaling.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).to(torch.float32) / dim)
    extrapolation = 1 - ramp
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv_freq, float(attention)


def _longrope(base: float, dim: int, scaling: dict[str, Any], max_positions: int
              ) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(short inv_freq, long inv_freq, attention factor): each frequency divided by its factor."""
    short, long = (torch.tensor(scaling[key], dtype=torch.float32) for key in ("short_factor", "long_factor"))
    if short.shape != (dim // 2,) or long.shape != (dim // 2,):
        raise ValueError(f"rotary_scaling: longrope factors must each hold rotary_dim / 2 = {dim // 2} values, not "
                         f"{short.numel()} and {long.numel()}")
    original = scaling.get("original_max_position_embeddings") or max_positions
    factor = max_positions / original
    attention = scaling.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    return 1.0 / (short * base**exponents), 1.0 / (long * base**exponents), float(attention)


class RotaryEmbedding:
    """cos/sin tables for positions, and their application to queries and keys."""

    def __init__(self, rotary_dim: int, base: float, scaling: dict[str, Any] | None, max_positions: int,
                 device: torch.device | str = "cpu") -> None:
        problem = rope_scaling_problem(scaling)
        if problem:
            raise ValueError(f"rotary_scaling: {problem}")
        self.dim, self.base, self.scaling, self.max_positions = rotary_dim, base, scaling or {}, max_positions
        self.kind = scaling_type(scaling)
        self.attention_scaling = 1.0
        inv_freq = _base_inv_freq(base, rotary_dim)
        if self.kind == "linear":
            inv_freq = inv_freq / self.scaling["factor"]
        elif self.kind == "llama3":
            inv_freq = _llama3(inv_freq, self.scaling, max_positions)
        elif self.kind == "yarn":
            inv_freq, self.attention_scaling = _yarn(base, rotary_dim, self.scaling, max_positions)
        self.long_inv_freq: torch.Tensor | None = None
        if self.kind == "longrope":
            inv_freq, self.long_inv_freq, self.attention_scaling = _longrope(base, rotary_dim, self.scaling,
                                                                            max_positions)
            self.long_inv_freq = self.long_inv_freq.to(device)
        self.inv_freq = inv_freq.to(device)

    def to(self, device: torch.device | str) -> RotaryEmbedding:
        self.inv_freq = self.inv_freq.to(device)
        if self.long_inv_freq is not None:
            self.long_inv_freq = self.long_inv_freq.to(device)
        return self

    def _longrope_inv_freq(self, position_ids: torch.Tensor) -> torch.Tensor:
        """The long factors once the longest position of the forward passes the original context."""
        original = self.scaling.get("original_max_position_embeddings") or self.max_positions
        if int(position_ids.max()) + 1 > original:
            return self.long_inv_freq.to(position_ids.device)
        return self.inv_freq

    def _dynamic_inv_freq(self, position_ids: torch.Tensor) -> torch.Tensor:
        """Dynamic NTK: past max_position_embeddings the base grows with the longest position in the batch."""
        seq_len = int(position_ids.max()) + 1
        if seq_len <= self.max_positions:
            return self.inv_freq
        factor = self.scaling["factor"]
        base = self.base * ((factor * seq_len / self.max_positions) - (factor - 1)) ** (self.dim / (self.dim - 2))
        return _base_inv_freq(base, self.dim).to(self.inv_freq.device)

    def cos_sin(self, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of shape [B, 1, T, rotary_dim] (computed in float32, returned in `dtype`)."""
        if self.inv_freq.device != position_ids.device:
            self.inv_freq = self.inv_freq.to(position_ids.device)
        inv_freq = self._dynamic_inv_freq(position_ids) if self.kind == "dynamic" else (
            self._longrope_inv_freq(position_ids) if self.kind == "longrope" else self.inv_freq)
        freqs = position_ids.to(torch.float32)[..., None] * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)[:, None]
        return (emb.cos() * self.attention_scaling).to(dtype), (emb.sin() * self.attention_scaling).to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first rotary_dim channels of x [B, H, T, head_dim] (GPT-NeoX: halves, not interleaved pairs)."""
    dim = cos.shape[-1]
    if dim == x.shape[-1]:
        return x * cos + rotate_half(x) * sin
    rot, rest = x[..., :dim], x[..., dim:]
    return torch.cat((rot * cos + rotate_half(rot) * sin, rest), dim=-1)
