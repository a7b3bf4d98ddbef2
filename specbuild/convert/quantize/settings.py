"""The quantization vocabulary: the `draft.quantization` formats specbuild offers, and the settings the
converter receives from the spec (`QuantizeSettings`), checked by name before anything is loaded.

Cheap to import (no torch, no ModelOpt): the convert request and `specbuild validate` both need it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from specbuild.errors import SpecbuildError

if TYPE_CHECKING:
    from specbuild.convert.calibration import CalibSource
    from specbuild.spec import QuantizationSpec


@dataclass(frozen=True)
class Format:
    """One `draft.quantization.format`: its ModelOpt preset and the TensorRT-LLM quant_algo it exports as."""

    preset: str  # attribute of modelopt.torch.quantization
    quant_algo: str
    awq: bool = False  # int4 weights in groups: in_features must be a multiple of the group size


FORMATS: dict[str, Format] = {
    "fp8": Format("FP8_DEFAULT_CFG", "FP8"),
    "int8_sq": Format("INT8_SMOOTHQUANT_CFG", "W8A8_SQ_PER_CHANNEL"),
    "int8_wo": Format("INT8_WEIGHT_ONLY_CFG", "W8A16"),
    "int4_awq": Format("INT4_AWQ_CFG", "W4A16_AWQ", awq=True),
    "w4a8_awq": Format("W4A8_AWQ_BETA_CFG", "W4A8_AWQ", awq=True),
}
KV_FORMATS: dict[str, tuple[str, str]] = {"fp8": ("FP8_KV_CFG", "FP8")}
"""`draft.quantization.kv_cache` -> (ModelOpt KV preset, TensorRT-LLM kv_cache_quant_algo)."""


@dataclass(frozen=True)
class QuantizeSettings:
    """What `draft.quantization` asks for, as the converter needs it (hashable: part of ConvertRequest). No
    defaults of its own: the spec's `QuantizationSpec` holds them (`from_spec`)."""

    format: str
    kv_cache: str
    calib_source: CalibSource
    calib_size: int
    calib_seq_len: int

    @property
    def enabled(self) -> bool:
        return self.format != "none" or self.kv_cache != "none"

    @classmethod
    def from_spec(cls, spec: QuantizationSpec) -> QuantizeSettings:
        calib = spec.calib
        return cls(spec.format, spec.kv_cache, calib.source, calib.size, calib.seq_len)


def check_format(settings: QuantizeSettings) -> tuple[Format | None, str | None]:
    """The format and KV entries for the settings; a SpecbuildError names the field for unknown names."""
    if settings.format != "none" and settings.format not in FORMATS:
        raise SpecbuildError(
            f"draft.quantization.format: unknown quantization format {settings.format!r}",
            hint=f"use one of: none, {', '.join(FORMATS)}",
        )
    if settings.kv_cache != "none" and settings.kv_cache not in KV_FORMATS:
        raise SpecbuildError(
            f"draft.quantization.kv_cache: unknown KV cache format {settings.kv_cache!r}",
            hint=f"use one of: none, {', '.join(KV_FORMATS)}",
        )
    if settings.calib_size < 1 or settings.calib_seq_len < 1:
        raise SpecbuildError("draft.quantization.calib: size and seq_len must be at least 1")
    fmt = FORMATS.get(settings.format)
    kv = KV_FORMATS[settings.kv_cache][1] if settings.kv_cache in KV_FORMATS else None
    return fmt, kv
