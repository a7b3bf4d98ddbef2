"""What `convert SPEC` would find, found without loading a weight or writing a byte (`specbuild validate`).

For every model of the spec: the directory, `config.json`, the weight files' headers and every tensor's shape
against the config, the mapping's coverage, the tp/pp grid; the draft/target pair (vocabulary, tokenizer); the
target's tokenizer files (deploy copies them); the Medusa heads; the draft's quantization format, int4 group
alignment from the planned shapes, and its calibration text. Each finding names the spec field it is about, so
`validate` reports it at that field's file:line. The TensorRT-LLM configs `convert` would write are returned too,
for the build checks (`specbuild.build.validate.planned_problems`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from specbuild.convert.calibration import CalibrationError, read_calibration
from specbuild.convert.compatibility import tokenizer_problem
from specbuild.convert.hf_checkpoint import HFCheckpoint
from specbuild.convert.mapping import EngineLayoutError
from specbuild.convert.pipeline import plan_conversion, spec_requests
from specbuild.convert.quantize.plan import awq_group_size, export_dtype, quantized_bytes, tokenizer_files_problem
from specbuild.convert.quantize.settings import Format, check_format
from specbuild.convert.request import ConversionPlan, ConvertRequest
from specbuild.dtypes import DTYPES
from specbuild.errors import SpecbuildError

if TYPE_CHECKING:
    from specbuild.spec import PipelineSpec

Loc = tuple[str | int, ...]
Finding = tuple[str, Loc, str]
"""(severity "error" or "warning", spec field, message)."""


def _model_field(request: ConvertRequest) -> Loc:
    """The spec field a model's problems are reported at: a self-draft's own problem (its layer count) is
    draft.layers, its checkpoint being the target's."""
    if request.self_draft_layers is not None:
        return ("draft", "layers")
    return ("target", "model") if request.name in ("target", "medusa") else ("draft", "model")


def _source_field(request: ConvertRequest) -> Loc:
    """The spec field that names the HF directory a model is read from (a self-draft's is target.model)."""
    return ("target", "model") if request.self_draft_layers is not None else _model_field(request)


def _planned_bytes(plan: ConversionPlan, quant_format: Format | None) -> int:
    if quant_format is not None:
        export_itemsize = DTYPES[export_dtype(plan.dtype)].itemsize
        return sum(quantized_bytes(rp.shapes, quant_format, export_itemsize) for rp in plan.rank_plans)
    return sum(rp.nbytes(DTYPES[plan.dtype]) for rp in plan.rank_plans)


def _check_quantization(request: ConvertRequest, plan: ConversionPlan, findings: list[Finding]
                        ) -> tuple[Format | None, dict[str, Any]] | None:
    """The draft's quantization checks, each located at its field; the format and the config's `quantization`
    fields convert would set over the converter's defaults, or None when the format itself is unusable."""
    settings = request.quantization
    assert settings is not None
    try:
        fmt, kv = check_format(settings)
    except SpecbuildError as err:
        findings.append(("error", ("draft", "quantization", "format"), err.message))
        return None
    group = None
    if fmt is not None and fmt.awq:
        try:
            group = awq_group_size(request.source, [rp.shapes for rp in plan.rank_plans])
        except SpecbuildError as err:  # reported; the other checks (calibration, GPU) still run
            findings.append(("error", ("draft", "quantization", "format"), err.message))
    try:
        read_calibration(settings.calib_source)
    except CalibrationError as err:
        findings.append(("error", ("draft", "quantization", "calib", "source"), err.message))
    problem = tokenizer_files_problem(request.source)
    if problem is not None:
        findings.append(("error", _source_field(request), problem.message))
    fields: dict[str, Any] = {"quant_algo": fmt.quant_algo if fmt else None, "kv_cache_quant_algo": kv}
    if group is not None:
        fields["group_size"] = group
    return fmt, fields


def _both_exist(*directories: Path) -> bool:
    return all(Path(directory).is_dir() for directory in directories)


def converted_roles(spec: PipelineSpec) -> tuple[str, ...]:
    """The models `convert` writes for this spec: all of them on the engine flow; on the PyTorch flow only what the
    reference backend runs and a quantized draft (TensorRT-LLM's backend loads the Hugging Face directories)."""
    from specbuild.contracts.llm_api import quantized_draft_dir, reference_roles

    if spec.build.flow != "pytorch":
        return ("target", "draft", "medusa")
    return reference_roles(spec) + (("draft",) if quantized_draft_dir(spec) is not None else ())


def check_models(spec: PipelineSpec) -> tuple[list[Finding], dict[str, tuple[dict[str, Any], int]]]:
    """Every model problem of the spec, and {role: (the config convert would write, its rank files' bytes)}."""
    findings: list[Finding] = []
    configs: dict[str, tuple[dict[str, Any], int]] = {}
    requests, pair = spec_requests(spec)
    if spec.draft is not None and spec.draft.model is not None and _both_exist(spec.target.model, spec.draft.model):
        # a missing directory is its own field's problem (reported below), not the pair's under draft.model
        findings += [("error", ("draft", "model"), message) for message, _ in pair]
    failed_sources: set[Path] = set()
    converted = converted_roles(spec)
    for request in requests:
        field = _model_field(request)
        if request.source in failed_sources:
            continue  # the Medusa checkpoint's or the self-draft's source is the target, already reported
        try:
            checkpoint = HFCheckpoint(request.source, allow_pickle=request.allow_pickle)
        except SpecbuildError as err:
            findings.append(("error", _source_field(request), err.message))
            failed_sources.add(request.source)
            continue
        plan: ConversionPlan | None = None
        try:
            plan = plan_conversion(request, checkpoint, read_values=False)  # headers and config only
        except SpecbuildError as err:
            if not isinstance(err, EngineLayoutError) or request.name in converted:
                heads = spec.medusa.heads if spec.medusa is not None else None
                if request.medusa_heads is not None and heads is not None and str(heads) in err.message:
                    findings.append(("error", ("medusa", "heads"), err.message))
                else:  # a Medusa checkpoint's own problem (e.g. its tp/vocab split) too; the target's said once
                    findings.append(("error", field, err.message))
                    failed_sources.add(request.source)
                continue
            # else: not converted, served from its Hugging Face directory as it is; the checks below still apply
        finally:
            checkpoint.close()
        if request.needs_tokenizer and request.name == "target":
            problem = tokenizer_problem(request.source)
            if problem is not None:
                findings.append(("error", field, f"{problem[0]} ({problem[1]})"))
        if plan is None:
            continue
        config = dict(plan.config)
        quant_format = None
        if request.quantization is not None and request.quantization.enabled:
            checked = _check_quantization(request, plan, findings)
            if checked is None:
                continue
            quant_format, fields = checked
            config["quantization"] = {**config["quantization"], **fields}
            config["dtype"] = export_dtype(plan.dtype)
        configs[request.name] = (config, _planned_bytes(plan, quant_format))
    return findings, configs
