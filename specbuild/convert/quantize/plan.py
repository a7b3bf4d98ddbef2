"""Planning a quantized draft conversion: what is quantized, in which dtype and group size, on which text.

Everything here runs before anything is loaded or written, and without ModelOpt (about 7 s and 240 MB to
import): `specbuild validate` runs the same checks (`specbuild.convert.preflight`), and a wrong setting fails in
a second rather than after calibration.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import xxhash

from specbuild.contracts.family_support import MODELOPT_DECODER_TYPES, family, refusal
from specbuild.convert.calibration import CalibrationText, calibration_batches, read_calibration
from specbuild.convert.quantize.settings import HF, Format, QuantizeSettings, check_format
from specbuild.convert.request import ConversionPlan, ConvertRequest
from specbuild.dtypes import EXPORT_DTYPES
from specbuild.errors import CheckpointError, SpecbuildError
from specbuild.tokenizer import TOKENIZER_MARKERS, has_tokenizer, load_tokenizer

# TensorRT-LLM's group-wise int4 kernels take groups of 128 (ModelOpt's and TensorRT-LLM's default) or 64.
AWQ_GROUP_SIZES = (128, 64)
LINEAR = re.compile(r"transformer\.layers\.\d+\.(attention\.(qkv|dense)|mlp\.(fc|gate|proj))\.weight")
"""The TensorRT-LLM linear weights ModelOpt quantizes (embedding, norms and lm_head stay in the export dtype)."""


@dataclass(frozen=True)
class QuantChecks:
    """What `check_quantization` decided: everything but the tokenized calibration batches."""

    format: Format | None
    kv_algo: str | None
    dtype: str
    group_size: int | None
    decoder_type: str
    calibration: CalibrationText


@dataclass
class QuantPlan:
    """Everything decided and checked before any work: formats, export dtype, group size, calibration."""

    settings: QuantizeSettings
    format: Format | None
    kv_algo: str | None
    dtype: str
    group_size: int | None
    decoder_type: str
    calibration: CalibrationText
    batches: list[torch.Tensor]

    @property
    def quant_algo(self) -> str | None:
        return self.format.quant_algo if self.format else None

    def manifest_settings(self) -> dict[str, Any]:
        s = self.settings
        return {
            "format": s.format, "kv_cache": s.kv_cache, "quant_algo": self.quant_algo,
            "kv_cache_quant_algo": self.kv_algo, "group_size": self.group_size,
            "calib_source": str(Path(s.calib_source).resolve()) if s.calib_source != "builtin" else "builtin",
            "calib_size": s.calib_size, "calib_seq_len": s.calib_seq_len,
            "calib_samples": len(self.batches), "calib_tokens": sum(b.numel() for b in self.batches),
            # The text itself, so that a changed built-in corpus (another Python's pydoc topics) redoes the work.
            "calib_text_xxh3": xxhash.xxh3_128_hexdigest("\0".join(self.calibration.texts).encode()),
            # Only for the Hugging Face export, so that every TensorRT-LLM checkpoint's manifest stays as it was.
            **({"export": s.export} if s.export == HF else {}),
        }

    def describe(self) -> str:
        s = self.settings
        group = f", group {self.group_size}" if self.group_size else ""
        written = "ModelOpt's Hugging Face export" if s.export == HF else "a TensorRT-LLM checkpoint"
        return (f"{s.format} ({self.quant_algo}{group}), kv cache {s.kv_cache}; exported as {self.dtype}, written as "
                f"{written}; calibration {self.calibration.description}: {len(self.batches)} x <= {s.calib_seq_len} "
                "tokens")


def export_dtype(dtype: str) -> str:
    """The dtype a model planned in `dtype` is quantized and exported in: ModelOpt's export writes half dtypes
    only (float32 becomes float16 with a warning), and TensorRT-LLM's quantized GEMMs take half-precision
    activations."""
    return dtype if dtype in EXPORT_DTYPES else "float16"


def awq_group_size(source: Path, rank_shapes: list[dict[str, tuple[int, ...]]]) -> int:
    """The largest group size in AWQ_GROUP_SIZES dividing every quantized layer's per-rank input size (and an
    even per-rank output size, since two int4 rows share a byte)."""
    linears = {name: shape for shapes in rank_shapes for name, shape in shapes.items() if LINEAR.fullmatch(name)}
    for size in AWQ_GROUP_SIZES:
        if all(shape[1] % size == 0 and shape[0] % 2 == 0 for shape in linears.values()):
            return size
    name, shape = next((n, s) for n, s in linears.items() if s[1] % AWQ_GROUP_SIZES[-1] or s[0] % 2)
    raise SpecbuildError(
        f"{source}: int4 AWQ needs every linear layer's input size to be a multiple of the group size "
        f"({' or '.join(map(str, AWQ_GROUP_SIZES))}, what TensorRT-LLM's group-wise int4 kernels take), but "
        f"{name} is {shape[1]} wide per rank (shape {list(shape)})",
        hint="use fp8, int8_sq or int8_wo for this model, or a model whose sizes are multiples of 64",
    )


def tokenizer_files_problem(source: Path) -> CheckpointError | None:
    """The error when the draft has no tokenizer files for calibration (files only, no transformers import)."""
    # Also a sentencepiece-only draft (tokenizer.model, its class from config.json): AutoTokenizer loads it, so
    # `has_tokenizer` alone would refuse a draft that calibrates.
    if has_tokenizer(source) or (source / "tokenizer.model").is_file():
        return None
    return CheckpointError(
        f"{source}: no tokenizer files ({' / '.join(TOKENIZER_MARKERS)}); calibration tokenizes text "
        "with the draft's own tokenizer",
        hint="copy the tokenizer files (the target's: they must be the same) into the draft directory",
    )


def check_quantization(request: ConvertRequest, plan: ConversionPlan) -> QuantChecks:
    """Every check of a quantized conversion that needs neither ModelOpt nor the tokenizer: formats, the
    architecture, int4 group alignment from the planned shapes, the calibration source's text, the draft's
    tokenizer files. Raises SpecbuildError naming the field or file."""
    settings = request.quantization
    assert settings is not None and settings.enabled
    fmt, kv = check_format(settings)
    if request.medusa_heads is not None:
        raise SpecbuildError(f"{request.source}: quantization applies to the draft, not to a Medusa checkpoint")
    architecture = plan.arch.hf_architecture
    decoder_type = MODELOPT_DECODER_TYPES.get(architecture)
    if decoder_type is None:
        raise SpecbuildError(
            f"{request.source}: ModelOpt quantization is not set up for {architecture}",
            hint=f"supported: {', '.join(MODELOPT_DECODER_TYPES)}",
        )
    if settings.export != HF:  # the TensorRT-LLM export; ModelOpt's Hugging Face export is not restricted here
        refused = refusal(architecture, "quantized_draft", "engine")
        if refused is not None:
            raise SpecbuildError(f"{request.source} is a {family(architecture)}: {refused.reason} "
                                 f"({refused.source})", hint=refused.instead)
    group = awq_group_size(request.source, [rp.shapes for rp in plan.rank_plans]) if fmt and fmt.awq else None
    calibration = read_calibration(settings.calib_source)
    problem = tokenizer_files_problem(request.source)
    if problem is not None:
        raise problem
    return QuantChecks(fmt, kv, export_dtype(plan.dtype), group, decoder_type, calibration)


def plan_quantization(request: ConvertRequest, plan: ConversionPlan) -> QuantPlan:
    """Check everything a quantized conversion needs before anything is loaded or written, and tokenize the
    calibration text with the draft's own tokenizer (local files only)."""
    checks = check_quantization(request, plan)
    settings = request.quantization
    assert settings is not None
    batches = calibration_batches(checks.calibration, load_tokenizer(request.source), settings.calib_size,
                                  settings.calib_seq_len)
    return QuantPlan(settings, checks.format, checks.kv_algo, checks.dtype, checks.group_size, checks.decoder_type,
                     checks.calibration, batches)


def quantized_bytes(shapes: dict[str, tuple[int, ...]], fmt: Format | None, itemsize: int) -> int:
    """About what a quantized rank takes: linear weights at the format's width, the rest in the export dtype."""
    bits = 4 if fmt is not None and fmt.awq else 8 if fmt is not None else itemsize * 8
    total = 0
    for name, shape in shapes.items():
        numel = 1
        for dim in shape:
            numel *= dim
        total += numel * bits // 8 if LINEAR.fullmatch(name) else numel * itemsize
    return total
