"""Which draft checkpoint an engine loads, and with which `quantization`: one table per engine, read by both exports.

A quantized draft reaches vLLM or SGLang one of two ways, and `ENGINE_QUANTIZATION` says which each engine has:

- quantized ahead: on `build.flow: pytorch`, `convert` writes ModelOpt's Hugging Face export of the draft to
  `<output_dir>/checkpoints/draft-hf` (contracts.llm_api.quantized_draft_dir). Both engines read a ModelOpt
  checkpoint from its config.json `quantization_config` (quant_method "modelopt", quant_algo) and build quantized
  linears for the quant_algos their ModelOpt loader lists (`modelopt_algos`); the draft then points at that
  directory with the engine's name for a ModelOpt checkpoint (`modelopt_name`). Of specbuild's formats only fp8
  (quant_algo FP8) is among them: W8A16, W4A16_AWQ and W4A8_AWQ are TensorRT-LLM's, and both engines refuse them.
- quantized while loading: on `build.flow: engine` convert writes only TensorRT-LLM checkpoints, which neither engine
  reads, so the unquantized Hugging Face draft is passed with the quantization the engine applies to it while
  loading (`load_time`: fp8, dynamic scales, no calibration), as before this table.

Anything else is refused with the engine's own reason, before anything is written.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specbuild.contracts.llm_api import quantized_draft_dir, quantized_draft_problems
from specbuild.contracts.model_fit import draft_findings
from specbuild.contracts.quant_formats import FORMAT_NAMES, HF_QUANT_CONFIG, NONE, kv_cache_quant_algo, quant_algo
from specbuild.export.plan import ExportRefused, refuse
from specbuild.export.sources import (
    SGLANG_MODEL_CONFIG,
    SGLANG_MODELOPT,
    SGLANG_SERVER_ARGS_DOCS,
    VLLM_MODEL_CONFIG,
    VLLM_MODELOPT,
    VLLM_QUANTIZATION,
    Source,
)

if TYPE_CHECKING:
    from specbuild.spec import PipelineSpec

MODELOPT_METHOD = "modelopt"
"""config.json quantization_config.quant_method of ModelOpt's Hugging Face export (NVIDIA/Model-Optimizer 0.47.0
modelopt/torch/export/convert_hf_config.py `convert_hf_quant_config_format`), what both engines detect it by."""


@dataclass(frozen=True)
class EngineQuantization:
    """How one engine loads a quantized draft (sources in the fields' docstrings)."""

    display: str
    modelopt_name: str
    """The draft `quantization` value naming a ModelOpt checkpoint."""
    modelopt_algos: tuple[str, ...]
    """The quant_algos its ModelOpt loader builds linears for."""
    modelopt_sources: tuple[Source, ...]
    min_capability: int
    """ModelOpt FP8's get_min_capability (compute capability 8.9: Ada, Hopper and newer)."""
    load_time: dict[str, str] = field(default_factory=dict)
    """draft.quantization.format -> the quantization it applies to an unquantized checkpoint while loading."""
    load_time_source: Source | None = None


ENGINE_QUANTIZATION: dict[str, EngineQuantization] = {
    # vLLM: SpeculativeConfig.quantization is the draft ModelConfig's `quantization` (vllm/config/speculative.py);
    # ModelConfig._verify_quantization detects "modelopt" from config.json and refuses a value that differs.
    "vllm": EngineQuantization(
        "vLLM", "modelopt",
        ("FP8", "FP8_PER_CHANNEL_PER_TOKEN", "FP8_PB_WO", "NVFP4", "W4A16_NVFP4", "MXFP8", "MIXED_PRECISION"),
        (VLLM_MODELOPT, VLLM_MODEL_CONFIG), 89, {"fp8": "fp8"}, VLLM_QUANTIZATION),
    # SGLang: --speculative-draft-model-quantization (the target's when not given); "modelopt" on an FP8 checkpoint
    # becomes modelopt_fp8 (ModelOptFp8Config.override_quantization_method).
    "sglang": EngineQuantization(
        "SGLang", "modelopt", ("FP8", "NVFP4"), (SGLANG_MODELOPT, SGLANG_MODEL_CONFIG), 89, {"fp8": "fp8"},
        SGLANG_SERVER_ARGS_DOCS),
}


@dataclass(frozen=True)
class DraftLoad:
    """The draft checkpoint the engine loads, its `quantization` (None: as it is), and what to tell the user."""

    model: Path
    quantization: str | None
    sources: tuple[Source, ...] = ()
    notes: tuple[str, ...] = ()


def served_formats(engine: str, *, quantized_ahead: bool) -> list[str]:
    """The draft.quantization.format values `engine` serves on a flow (with or without convert's ModelOpt export),
    in FORMAT_NAMES order, `none` last: what a refusal's hint offers."""
    table = ENGINE_QUANTIZATION[engine]
    if quantized_ahead:
        return [*(name for name in FORMAT_NAMES if quant_algo(name) in table.modelopt_algos), NONE]
    return [*(name for name in FORMAT_NAMES if name in table.load_time), NONE]


def draft_load(spec: PipelineSpec, engine: str) -> DraftLoad:
    """The draft `engine` loads for `spec`, or the refusal (ExportRefused) naming the field and the engine's reason."""
    assert spec.draft is not None
    table = ENGINE_QUANTIZATION[engine]
    if spec.draft.is_self_draft:  # the first check of every drafted export, so both engines refuse it here
        raise refuse(
            spec, table.display, f"draft.source target_layers (layers {spec.draft.layers})",
            f"{table.display} loads the draft from a Hugging Face checkpoint, and specbuild writes the self-draft only "
            "as a TensorRT-LLM checkpoint",
            hint="use build.flow: engine (specbuild build/deploy) for a self-draft, or point draft.model at a "
                 "Hugging Face draft for this export",
        )
    refuse_unfit_draft(spec, engine)
    fmt = spec.draft.quantization.format
    if fmt == NONE:
        return DraftLoad(spec.draft.model, None)
    algo = quant_algo(fmt)
    exported = quantized_draft_dir(spec)
    if exported is None:
        return _load_time(spec, engine, fmt, algo)
    if algo not in table.modelopt_algos:
        raise refuse(
            spec, table.display, f"draft.quantization.format {fmt}",
            f"convert writes it as ModelOpt's Hugging Face export with quant_algo {algo}, and {table.display}'s "
            f"ModelOpt loader reads only {', '.join(table.modelopt_algos)} ({table.modelopt_sources[0]})",
            hint=f"set draft.quantization.format to {' or '.join(served_formats(engine, quantized_ahead=True))} "
                 "for this export",
        )
    problems = quantized_draft_problems(spec)
    if problems:
        loc, message = problems[0]
        raise ExportRefused(f"{spec.where}: {'.'.join(loc)}: {message}")
    _check_export(spec, exported, algo, kv_cache_quant_algo(spec.draft.quantization.kv_cache))
    note = (f"draft.quantization.format {fmt}: {table.display} loads convert's ModelOpt export ({exported}) as "
            f"quantization {table.modelopt_name}, which needs a GPU of compute capability "
            f"{table.min_capability // 10}.{table.min_capability % 10} or newer")
    return DraftLoad(exported, table.modelopt_name, table.modelopt_sources, (note,))


def refuse_unfit_draft(spec: PipelineSpec, engine: str) -> None:
    """Refuse, before anything is written, a draft.model the engine would refuse when it loads it: a directory that
    does not exist or is not the kind the mode needs (an EAGLE-3 draft for eagle3, a Hugging Face model for
    draft_target), or an EAGLE-3 draft made for another target; the same check `specbuild validate` makes
    (contracts.model_fit), each problem at its spec line and field; not the capture layers, which no export writes
    (the engines read the draft's own)."""
    errors = [(loc, message) for severity, loc, message in draft_findings(spec, engine=engine) if severity == "error"]
    if errors:
        located = spec.problems_error(errors)
        display = ENGINE_QUANTIZATION[engine].display
        raise ExportRefused(located.message, hint=f"{display} would refuse this draft when it loads it; fix the spec "
                            "(`specbuild validate SPEC` lists every problem), then export again")


def _load_time(spec: PipelineSpec, engine: str, fmt: str, algo: str | None) -> DraftLoad:
    """build.flow engine: no ModelOpt export exists, so only a quantization the engine applies while loading."""
    assert spec.draft is not None
    table = ENGINE_QUANTIZATION[engine]
    if fmt in table.load_time:
        note = (f"draft.quantization.format {fmt}: {table.display} quantizes the unquantized draft while loading (its "
                "own scales, no calibration); on build.flow: pytorch, convert writes ModelOpt's calibrated export, "
                f"which {table.display} loads instead")
        sources = (table.load_time_source,) if table.load_time_source is not None else ()
        return DraftLoad(spec.draft.model, table.load_time[fmt], sources, (note,))
    if algo in table.modelopt_algos:
        why = (f"it reads {fmt} ({algo}) from ModelOpt's Hugging Face export, which convert writes only on build.flow: "
               "pytorch")
        hint = "set build.flow: pytorch and run `specbuild convert SPEC`, or draft.quantization.format none"
    else:
        loads = ", ".join(table.load_time) or "nothing"
        why = (f"its ModelOpt loader reads only {', '.join(table.modelopt_algos)} ({table.modelopt_sources[0]}), not "
               f"{algo}, and it quantizes an unquantized draft while loading only to {loads} "
               f"({table.load_time_source}); on build.flow: engine specbuild writes the quantized draft only as a "
               "TensorRT-LLM checkpoint")
        hint = (f"set draft.quantization.format to {' or '.join(served_formats(engine, quantized_ahead=False))} "
                "for this export")
    raise refuse(spec, table.display, f"draft.quantization.format {fmt}", why, hint=hint)


def _check_export(spec: PipelineSpec, directory: Path, algo: str | None, kv_algo: str | None) -> None:
    """convert's ModelOpt export is there and holds the spec's quantization: config.json's quantization_config (what
    both engines read) and hf_quant_config.json's KV cache algorithm; else one refusal naming the file and field."""
    fix = "run `specbuild convert SPEC`, then export again"
    config_path, quant_path = directory / "config.json", directory / HF_QUANT_CONFIG
    if not all(path.is_file() for path in (config_path, quant_path, directory / "manifest.json")):
        raise ExportRefused(f"{spec.where}: draft.quantization on build.flow: pytorch: the draft is convert's ModelOpt "
                            f"Hugging Face export in {directory}, which is not written yet", hint=fix)
    config = _read_json(config_path).get("quantization_config") or {}
    kv = (_read_json(quant_path).get("quantization") or {}).get("kv_cache_quant_algo")
    expected: dict[tuple[Path, str], tuple[Any, Any]] = {
        (config_path, "quantization_config.quant_method"): (config.get("quant_method"), MODELOPT_METHOD),
        (config_path, "quantization_config.quant_algo"): (config.get("quant_algo"), algo),
        (quant_path, "quantization.kv_cache_quant_algo"): (kv, kv_algo),
    }
    wrong = [f"{path}: {name} is {found!r}, the spec asks {want!r}"
             for (path, name), (found, want) in expected.items() if found != want]
    if wrong:
        raise ExportRefused(f"{spec.where}: the ModelOpt export in {directory} is not the spec's draft.quantization ("
                            + "; ".join(wrong) + ")", hint=fix)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ExportRefused(f"{path}: not readable JSON ({err})", hint="run `specbuild convert SPEC` again") from None
    return data if isinstance(data, dict) else {}
