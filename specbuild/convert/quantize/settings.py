"""The settings the converter receives from the spec's `draft.quantization` (`QuantizeSettings`), checked by name
against the formats table (`specbuild.contracts.quant_formats`, re-exported here) before anything is loaded.

Cheap to import (no torch, no ModelOpt): the convert request and `specbuild validate` both need it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from specbuild.contracts.quant_formats import (
    FORMAT_NAMES,
    FORMATS,
    KV_FORMAT_NAMES,
    KV_FORMATS,
    NONE,
    Format,
    kv_cache_quant_algo,
)
from specbuild.errors import SpecbuildError

__all__ = ["FORMATS", "HF", "KV_FORMATS", "TRTLLM", "Export", "Format", "QuantizeSettings", "check_format"]

Export = Literal["trtllm", "hf"]
TRTLLM: Export = "trtllm"
HF: Export = "hf"

if TYPE_CHECKING:
    from specbuild.convert.calibration import CalibSource
    from specbuild.spec import QuantizationSpec


@dataclass(frozen=True)
class QuantizeSettings:
    """What `draft.quantization` asks for, as the converter needs it (hashable: part of ConvertRequest). No
    defaults of its own: the spec's `QuantizationSpec` holds them (`from_spec`)."""

    format: str
    kv_cache: str
    calib_source: CalibSource
    calib_size: int
    calib_seq_len: int
    export: Export = TRTLLM
    """What the quantized model is written as: a TensorRT-LLM checkpoint (the engine flow, and the reference
    runtime), or ModelOpt's Hugging Face export, what TensorRT-LLM's PyTorch backend loads (`build.flow: pytorch`)."""

    @property
    def enabled(self) -> bool:
        return self.format != NONE or self.kv_cache != NONE

    @classmethod
    def from_spec(cls, spec: QuantizationSpec) -> QuantizeSettings:
        calib = spec.calib
        return cls(spec.format, spec.kv_cache, calib.source, calib.size, calib.seq_len)


def check_format(settings: QuantizeSettings) -> tuple[Format | None, str | None]:
    """The format and KV entries for the settings; a SpecbuildError names the field for unknown names."""
    if settings.format != NONE and settings.format not in FORMATS:
        raise SpecbuildError(
            f"draft.quantization.format: unknown quantization format {settings.format!r}",
            hint=f"use one of: {', '.join(FORMAT_NAMES)}",
        )
    if settings.kv_cache != NONE and settings.kv_cache not in KV_FORMATS:
        raise SpecbuildError(
            f"draft.quantization.kv_cache: unknown KV cache format {settings.kv_cache!r}",
            hint=f"use one of: {', '.join(KV_FORMAT_NAMES)}",
        )
    if settings.calib_size < 1 or settings.calib_seq_len < 1:
        raise SpecbuildError("draft.quantization.calib: size and seq_len must be at least 1")
    fmt = FORMATS.get(settings.format)
    return fmt, kv_cache_quant_algo(settings.kv_cache)
