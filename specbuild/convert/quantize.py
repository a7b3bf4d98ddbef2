"""Draft quantization with NVIDIA ModelOpt 0.47: calibrate, export a TensorRT-LLM checkpoint, repair, check.

`mtq.quantize` fake-quantizes a transformers model in place and calibrates its scales on token batches;
`export_tensorrt_llm_checkpoint` then writes the real quantized tensors. Its known gaps are repaired here, each
with a test (tests/test_quantize.py), facts from shared/reference/modelopt-medusa.md §1.2-1.6:

* configs are the ordered list form since 0.44: built from the `mtq.*_CFG` constants (already lists) and only
  ever appended to or edited by entry, never indexed by quantizer name (`_check_list_form`);
* `inference_tensor_parallel=0` (its default) divides by zero on one process: tp and pp are always passed;
* export mutates the model, so it is exported once and then dropped;
* under transformers 5 the export drops `rotary_base` and `rotary_scaling`, and it writes a few fields its own
  way (GPT-2's activation and positions, a vocab padded to 64 for AWQ, a vocab-split embedding): the
  checkpoint's config.json is specbuild's own converter config for the same model, with ModelOpt's
  `quantization` block, after checking that both agree on every shape field (`repair_config`);
* the padded/split `vocab_embedding` and `lm_head` are put back into the unquantized converter's layout
  (`_relayout_vocab`), so draft and target keep the same vocabulary size.

The result passes the same coverage check as an unquantized conversion, extended by the scale tensors the
quant_algo needs, with exact dtypes (`expected_tensors`).

ModelOpt is imported lazily (about 7 s and 240 MB): only a quantized conversion pays for it.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import re
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import xxhash
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from safetensors import safe_open
from safetensors.torch import save

from specbuild.convert.calibration import CalibrationText, CalibSource, calibration_batches, read_calibration
from specbuild.errors import CheckpointError, SpecbuildError

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from specbuild.convert.pipeline import ConversionPlan, ConvertRequest
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
# TensorRT-LLM's group-wise int4 kernels take groups of 128 (ModelOpt's and TensorRT-LLM's default) or 64.
AWQ_GROUP_SIZES = (128, 64)
# ModelOpt's export writes fp16 or bf16 only (float32 becomes fp16 with a warning); TensorRT-LLM's quantized
# GEMMs take half-precision activations.
EXPORT_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}
DECODER_TYPES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen",
    "GPT2LMHeadModel": "gpt",
}
LINEAR = re.compile(r"transformer\.layers\.\d+\.(attention\.(qkv|dense)|mlp\.(fc|gate|proj))\.weight")
# Shape fields on which ModelOpt's config and specbuild's must agree before specbuild's replaces it.
_SHAPE_FIELDS = ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "hidden_size", "head_size",
                 "intermediate_size")
_QUANT_DEFAULTS: dict[str, Any] = {
    "quant_algo": None, "kv_cache_quant_algo": None, "group_size": 128, "smoothquant_val": 0.5, "clamp_val": None,
    "use_meta_recipe": False, "has_zero_point": False, "pre_quant_scale": False, "exclude_modules": None,
}
_EXPORT_DIR = ".modelopt-export"
FP8_MAX = 448.0  # amax / 448 is an FP8 scale


@dataclass(frozen=True)
class QuantizeSettings:
    """What `draft.quantization` asks for, as the converter needs it (hashable: part of ConvertRequest)."""

    format: str = "none"
    kv_cache: str = "none"
    calib_source: CalibSource = "builtin"
    calib_size: int = 64
    calib_seq_len: int = 256

    @property
    def enabled(self) -> bool:
        return self.format != "none" or self.kv_cache != "none"

    @classmethod
    def from_spec(cls, spec: QuantizationSpec) -> QuantizeSettings:
        calib = spec.calib
        return cls(spec.format, spec.kv_cache, calib.source, calib.size, calib.seq_len)


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
        }

    def describe(self) -> str:
        s = self.settings
        group = f", group {self.group_size}" if self.group_size else ""
        return (f"{s.format} ({self.quant_algo}{group}), kv cache {s.kv_cache}; exported as {self.dtype}; "
                f"calibration {self.calibration.description}: {len(self.batches)} x <= {s.calib_seq_len} tokens")


# -- planning -----------------------------------------------------------------------------------------------------
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
    if any((source / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        return None
    return CheckpointError(
        f"{source}: no tokenizer files (tokenizer.json / tokenizer_config.json); calibration tokenizes text "
        "with the draft's own tokenizer",
        hint="copy the tokenizer files (the target's: they must be the same) into the draft directory",
    )


def _tokenizer(source: Path) -> Any:
    from transformers import AutoTokenizer

    problem = tokenizer_files_problem(source)
    if problem is not None:
        raise problem
    return AutoTokenizer.from_pretrained(source)


@dataclass(frozen=True)
class QuantChecks:
    """What `check_quantization` decided: everything but the tokenized calibration batches."""

    format: Format | None
    kv_algo: str | None
    dtype: str
    group_size: int | None
    decoder_type: str
    calibration: CalibrationText


def check_quantization(request: ConvertRequest, plan: ConversionPlan) -> QuantChecks:
    """Every check of a quantized conversion that needs neither ModelOpt nor the tokenizer: formats, the
    architecture, int4 group alignment from the planned shapes, the calibration source's text, the draft's
    tokenizer files. Raises SpecbuildError naming the field or file."""
    settings = request.quantization
    assert settings is not None and settings.enabled
    fmt, kv = check_format(settings)
    if request.medusa_heads is not None:
        raise SpecbuildError(f"{request.source}: quantization applies to the draft, not to a Medusa checkpoint")
    decoder_type = DECODER_TYPES.get(plan.arch.hf_architecture)
    if decoder_type is None:
        raise SpecbuildError(
            f"{request.source}: ModelOpt quantization is not set up for {plan.arch.hf_architecture}",
            hint=f"supported: {', '.join(DECODER_TYPES)}",
        )
    dtype = plan.dtype if plan.dtype in EXPORT_DTYPES else "float16"
    group = awq_group_size(request.source, [rp.shapes for rp in plan.rank_plans]) if fmt and fmt.awq else None
    calibration = read_calibration(settings.calib_source)
    problem = tokenizer_files_problem(request.source)
    if problem is not None:
        raise problem
    return QuantChecks(fmt, kv, dtype, group, decoder_type, calibration)


def plan_quantization(request: ConvertRequest, plan: ConversionPlan) -> QuantPlan:
    """Check everything a quantized conversion needs before anything is loaded or written."""
    checks = check_quantization(request, plan)
    settings = request.quantization
    assert settings is not None
    batches = calibration_batches(checks.calibration, _tokenizer(request.source), settings.calib_size,
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


# -- ModelOpt config ------------------------------------------------------------------------------------------------
def _check_list_form(config: dict[str, Any], where: str) -> None:
    """ModelOpt >= 0.44 configs are an ordered list of entries; the legacy dict form is converted with its
    `default` entry at its dict position, which (last, as older recipes put it) disables every quantizer."""
    entries = config.get("quant_cfg")
    if not isinstance(entries, list) or not all(isinstance(e, dict) and "quantizer_name" in e for e in entries):
        raise TypeError(f"{where}: ModelOpt config is not in the 0.44+ list form: {type(entries).__name__}")


def modelopt_config(mtq: Any, plan: QuantPlan) -> dict[str, Any]:
    """The list-form config: the format's preset (or deny-all for a KV-only run), the AWQ group size set on the
    weight quantizer entries, and the KV preset's entries appended (later entries win)."""
    if plan.format is not None:
        config = copy.deepcopy(getattr(mtq, plan.format.preset))
        _check_list_form(config, plan.format.preset)
    else:
        config = {"quant_cfg": [{"quantizer_name": "*", "enable": False}], "algorithm": "max"}
    if plan.group_size is not None:
        for entry in config["quant_cfg"]:
            cfgs = entry.get("cfg")
            for cfg in cfgs if isinstance(cfgs, list) else [cfgs]:
                if isinstance(cfg, dict) and isinstance(cfg.get("block_sizes"), dict):
                    cfg["block_sizes"][-1] = plan.group_size
    if plan.kv_algo is not None:
        preset = KV_FORMATS[plan.settings.kv_cache][0]
        kv = getattr(mtq, preset)
        _check_list_form(kv, preset)
        config["quant_cfg"] = [*config["quant_cfg"], *copy.deepcopy(kv["quant_cfg"])]
    return config


# -- quantize -----------------------------------------------------------------------------------------------------
def default_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def load_model(source: Path, device: torch.device, dtype: str) -> PreTrainedModel:
    """The HF model to calibrate: float32 on CPU (half-precision matmuls are slow and inexact there), the export
    dtype on CUDA."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    torch_dtype = torch.float32 if device.type == "cpu" else EXPORT_DTYPES[dtype]
    bar = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # a second progress bar for a small draft's load is noise
    try:
        model = AutoModelForCausalLM.from_pretrained(source, dtype=torch_dtype)
    finally:
        if bar:
            hf_logging.enable_progress_bar()
    return model.to(device).eval()


def quantize_model(model: PreTrainedModel, plan: QuantPlan, progress: Progress | None = None) -> PreTrainedModel:
    """Fake-quantize `model` in place with ModelOpt, calibrating on the plan's batches (one progress bar row per
    pass: AWQ runs the loop twice, once for statistics and once for its scale search)."""
    import modelopt.torch.quantization as mtq

    config = modelopt_config(mtq, plan)
    device = next(model.parameters()).device
    passes = 0

    def forward_loop(m: torch.nn.Module) -> None:  # ModelOpt >= 0.4x passes the model (reference §1.2)
        nonlocal passes
        passes += 1
        task = progress.add_task(f"calibrating (pass {passes})", total=len(plan.batches)) if progress else None
        with torch.no_grad():
            for batch in plan.batches:
                m(batch.to(device), use_cache=False)
                if progress is not None and task is not None:
                    progress.advance(task)

    # ModelOpt prints and warns per module; the progress bar and the plan say what runs.
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        mtq.quantize(model, config, forward_loop)
    return model


def match_export(model: PreTrainedModel) -> None:
    """Do to the fake-quantized model what the TensorRT-LLM export does to its scales: for linears TensorRT-LLM
    fuses (q/k/v into qkv, gate/up into fc/gate) ModelOpt's own `preprocess_linear_fusion` (one shared
    per-tensor weight and input amax, the max; one averaged AWQ/SmoothQuant pre-quant scale), and FP8 KV-cache
    scales of at least 1.0. Needed before export: ModelOpt 0.47's export alone leaves gate and up with different
    AWQ pre-quant (and W4A8 activation) scales, which one fused gate/up GEMM cannot apply (measured: int4_awq and
    w4a8_awq, tp 1 and 2). It also makes the fake-quantized model compute what the exported checkpoint encodes,
    so it is a fair reference for the runtime."""
    from modelopt.torch.export.quant_utils import preprocess_linear_fusion

    groups = (("self_attn", ("q_proj", "k_proj", "v_proj")), ("mlp", ("gate_proj", "up_proj")))
    for module in model.modules():
        for name in ("k_bmm_quantizer", "v_bmm_quantizer"):
            quantizer = getattr(module, name, None)
            if quantizer is not None and quantizer.is_enabled and quantizer.amax is not None:
                # The TensorRT-LLM export raises FP8 KV-cache scales below 1.0 to 1.0 (clamp_fp8_scales).
                quantizer.amax = torch.clamp(quantizer.amax, min=FP8_MAX)
        for parent, names in groups:
            owner = getattr(module, parent, None)
            linears = [getattr(owner, name, None) for name in names]
            if owner is not None and all(hasattr(lin, "weight_quantizer") for lin in linears):
                preprocess_linear_fusion(linears)


def export_modelopt(model: PreTrainedModel, plan: QuantPlan, tp_size: int, pp_size: int, out: Path) -> Path:
    """ModelOpt's own TensorRT-LLM export, unrepaired (mutates `model`: export a model only once)."""
    from modelopt.torch.export import export_tensorrt_llm_checkpoint

    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        # The default inference_tensor_parallel=0 raises ZeroDivisionError on one process (reference §1.4).
        export_tensorrt_llm_checkpoint(
            model, plan.decoder_type, dtype=EXPORT_DTYPES[plan.dtype], export_dir=out,
            inference_tensor_parallel=tp_size, inference_pipeline_parallel=pp_size,
        )
    return out


# -- repair and check ---------------------------------------------------------------------------------------------
def repair_config(modelopt_cfg: dict[str, Any], ours: dict[str, Any], where: str) -> dict[str, Any]:
    """specbuild's converter config (rotary fields, architecture, activation and positions as TensorRT-LLM's own
    converter writes them) with ModelOpt's quantization block; refuses if the two disagree on a shape."""
    problems = [f"{key}: ModelOpt {modelopt_cfg.get(key)!r}, specbuild {ours.get(key)!r}"
                for key in _SHAPE_FIELDS if key in ours and modelopt_cfg.get(key) != ours[key]]
    if int(modelopt_cfg.get("vocab_size", 0)) < int(ours["vocab_size"]):
        problems.append(f"vocab_size: ModelOpt {modelopt_cfg.get('vocab_size')}, specbuild {ours['vocab_size']}")
    if problems:
        raise CheckpointError(f"{where}: ModelOpt's export disagrees with the model's config: " + "; ".join(problems))
    config = copy.deepcopy(ours)
    config["quantization"] = {**_QUANT_DEFAULTS, **(modelopt_cfg.get("quantization") or {})}
    return config


def _read(path: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(path), framework="pt") as fh:
        return {name: fh.get_tensor(name) for name in fh.keys()}  # noqa: SIM118 (not a dict)


def _relayout_vocab(stage: list[dict[str, torch.Tensor]], vocab: int, ours: list[dict[str, tuple[int, ...]]]) -> None:
    """ModelOpt pads the vocab to a multiple of 64 for AWQ and splits the embedding over TP ranks; put both
    tensors back as the unquantized converter writes them (full embedding; lm_head zero-padded to tp, split)."""
    tp = len(stage)
    for name in ("transformer.vocab_embedding.weight", "lm_head.weight"):
        if name not in stage[0] or all(tuple(r[name].shape) == s[name] for r, s in zip(stage, ours, strict=True)):
            continue
        pieces = [r[name] for r in stage]
        # A piece holding the whole vocab is a replica; smaller ones are TP splits along the vocab.
        full = (pieces[0] if pieces[0].shape[0] >= vocab else torch.cat(pieces))[:vocab]
        if name == "lm_head.weight":
            rows = -(-vocab // tp) * tp
            padded = torch.zeros(rows, full.shape[1], dtype=full.dtype)
            padded[:vocab] = full
            parts = list(torch.chunk(padded, tp))
        else:
            parts = [full] * tp
        for r, part in zip(stage, parts, strict=True):
            r[name] = part.contiguous()


def expected_tensors(shapes: dict[str, tuple[int, ...]], quant: dict[str, Any], dtype: torch.dtype
                     ) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """The unquantized model definition of one rank, with each quantized linear weight's stored shape/dtype and
    the scale tensors its quant_algo needs (names and layout per shared/reference/modelopt-medusa.md §1.5)."""
    f32 = torch.float32
    algo, kv, group = quant.get("quant_algo"), quant.get("kv_cache_quant_algo"), quant.get("group_size") or 128
    expected: dict[str, tuple[tuple[int, ...], torch.dtype]] = {}
    for name, shape in shapes.items():
        if not (algo and LINEAR.fullmatch(name)):
            expected[name] = (shape, dtype)
            continue
        base, (out, inp) = name[: -len("weight")], shape
        if algo == "FP8":
            expected[name] = (shape, torch.float8_e4m3fn)
            expected[base + "weights_scaling_factor"] = ((1,), f32)
            expected[base + "activation_scaling_factor"] = ((1,), f32)
        elif algo in ("W8A8_SQ_PER_CHANNEL", "W8A16"):
            expected[name] = (shape, torch.int8)
            expected[base + "weights_scaling_factor"] = ((out,), f32)
            if algo == "W8A8_SQ_PER_CHANNEL":
                expected[base + "activation_scaling_factor"] = ((1,), f32)
                expected[base + "prequant_scaling_factor"] = ((inp,), dtype)
        elif algo in ("W4A16_AWQ", "W4A8_AWQ"):
            expected[name] = ((out // 2, inp), torch.int8)  # two int4 rows per byte
            expected[base + "weights_scaling_factor"] = ((out, inp // group), f32)
            expected[base + "prequant_scaling_factor"] = ((inp,), dtype)
            if algo == "W4A8_AWQ":
                expected[base + "weights_scaling_factor_2"] = ((1,), f32)
                expected[base + "activation_scaling_factor"] = ((1,), f32)
        else:
            raise CheckpointError(f"quant_algo {algo!r} is not one specbuild writes")
    if kv:
        for name in shapes:
            if name.endswith(".attention.qkv.weight"):
                base = name[: -len("qkv.weight")]
                for scale in ("k_cache_scaling_factor", "v_cache_scaling_factor", "kv_cache_scaling_factor"):
                    expected[base + scale] = ((1,), f32)
    return expected


def coverage_problems(tensors: dict[str, torch.Tensor], expected: dict[str, tuple[tuple[int, ...], torch.dtype]]
                      ) -> list[str]:
    """Every expected tensor present with its shape and dtype, nothing else."""
    problems = []
    for name, (shape, dtype) in expected.items():
        tensor = tensors.get(name)
        if tensor is None:
            problems.append(f"tensor {name!r} is missing")
        elif tuple(tensor.shape) != shape or tensor.dtype != dtype:
            problems.append(f"tensor {name!r} is {tensor.dtype} {list(tensor.shape)}, expected {dtype} {list(shape)}")
    extra = sorted(set(tensors) - set(expected))
    if extra:
        problems.append(f"unexpected tensors: {', '.join(map(repr, extra[:5]))}" + (" ..." if len(extra) > 5 else ""))
    return problems


def repair_export(export_dir: Path, out: Path, plan: ConversionPlan, qplan: QuantPlan, tp: int, pp: int,
                  where: str) -> dict[str, Any]:
    """Rewrite ModelOpt's export in `export_dir` as the final checkpoint in `out`, checked; returns the config."""
    modelopt_cfg = json.loads((export_dir / "config.json").read_text())
    config = repair_config(modelopt_cfg, plan.arch.trtllm_config(qplan.dtype, tp, pp), where)
    quant = config["quantization"]
    if quant.get("quant_algo") != qplan.quant_algo or quant.get("kv_cache_quant_algo") != qplan.kv_algo:
        raise CheckpointError(
            f"{where}: ModelOpt exported quant_algo {quant.get('quant_algo')!r} / kv "
            f"{quant.get('kv_cache_quant_algo')!r}, expected {qplan.quant_algo!r} / {qplan.kv_algo!r}"
        )
    dtype = EXPORT_DTYPES[qplan.dtype]
    for stage in range(pp):
        rank_plans = plan.rank_plans[stage * tp:(stage + 1) * tp]
        files = [export_dir / rp.filename for rp in rank_plans]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise CheckpointError(f"{where}: ModelOpt's export lacks {', '.join(missing)}")
        ranks = [_read(f) for f in files]
        _relayout_vocab(ranks, int(config["vocab_size"]), [rp.shapes for rp in rank_plans])
        for rp, tensors in zip(rank_plans, ranks, strict=True):
            problems = coverage_problems(tensors, expected_tensors(rp.shapes, quant, dtype))
            if problems:
                raise CheckpointError(
                    f"{where}: quantized {rp.filename} does not pass the coverage check for "
                    f"{quant.get('quant_algo')}:\n  - " + "\n  - ".join(problems)
                )
            # save() + write_bytes, not save_file: the file gets the umask's mode like every other output.
            (out / rp.filename).write_bytes(save(tensors, metadata={"format": "pt"}))
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return config


def write_quantized(request: ConvertRequest, plan: ConversionPlan, qplan: QuantPlan, out: Path,
                    console: Console) -> dict[str, Any]:
    """Calibrate and export into `out` (the atomic temporary directory); returns the written config."""
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as progress:
        model = quantize_model(load_model(request.source, default_device(), qplan.dtype), qplan, progress)
    match_export(model)
    export_dir = out / _EXPORT_DIR
    try:
        export_modelopt(model, qplan, request.tp_size, request.pp_size, export_dir)
        del model
        return repair_export(export_dir, out, plan, qplan, request.tp_size, request.pp_size, str(request.source))
    finally:
        shutil.rmtree(export_dir, ignore_errors=True)
