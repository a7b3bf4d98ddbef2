"""Which models a repository holds for a spec, and every setting of each, before anything is written.

Model names and wiring follow the Triton TensorRT-LLM backend (reference §1): `preprocessing` ->
`tensorrt_llm` -> `postprocessing` as the `ensemble`, plus `tensorrt_llm_draft` and the `tensorrt_llm_bls`
that runs draft-target speculation. Every cross-model value (batch size, decoupled modes, names, end/pad ids)
is decided once here, so the models cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from specbuild.build.engine_info import EngineInfo, engine_dir, engine_roles, read_engine_info
from specbuild.deploy.pbtxt import format_choices
from specbuild.deploy.tokenizer_files import TOKENIZER_DIR
from specbuild.errors import SpecbuildError
from specbuild.spec import PipelineSpec

PREPROCESSING = "preprocessing"
POSTPROCESSING = "postprocessing"
TARGET = "tensorrt_llm"
DRAFT = "tensorrt_llm_draft"
BLS = "tensorrt_llm_bls"
ENSEMBLE = "ensemble"
TORCH_THREADS = 1
"""One torch thread per model process: the server runs several, and the demo-sized models decode fastest so."""


@dataclass
class ModelPlan:
    """One model directory: its template, the template's values and the `parameters` entries."""

    name: str
    template: str  # directory under specbuild/triton_models
    values: dict[str, object]
    parameters: dict[str, object] = field(default_factory=dict)
    python: bool = True  # ships 1/model.py
    engine: Path | None = None


@dataclass
class RepositoryPlan:
    spec: PipelineSpec
    models: list[ModelPlan]
    engines: dict[str, EngineInfo]
    end_id: int
    pad_id: int

    @property
    def entry_points(self) -> list[str]:
        names = [m.name for m in self.models]
        return [name for name in (BLS, ENSEMBLE) if name in names]


def read_engines(spec: PipelineSpec) -> dict[str, EngineInfo]:
    engines = {role: read_engine_info(engine_dir(spec, role)) for role in engine_roles(spec)}
    backends = {info.backend for info in engines.values()}
    if len(backends) > 1:
        raise SpecbuildError(
            f"{spec.output_dir / 'engines'}: engines were built with different backends ({sorted(backends)})",
            hint="rebuild them together with `specbuild build SPEC`",
        )
    for role, info in engines.items():
        if info.role != role:
            raise SpecbuildError(f"{engine_dir(spec, role)}: engine.json says role {info.role!r}, expected {role!r}")
    return engines


def plan_repository(spec: PipelineSpec, engines: dict[str, EngineInfo], end_id: int, pad_id: int) -> RepositoryPlan:
    """Every model of the repository with all its settings."""
    deploy, mode = spec.deploy, spec.speculative.mode
    batch = deploy.triton_max_batch_size
    for role, info in engines.items():
        if batch is not None and batch > info.max_batch_size:
            raise SpecbuildError(
                f"deploy.triton_max_batch_size {batch} is more than the {role} engine's max_batch_size "
                f"{info.max_batch_size}", hint="lower deploy.triton_max_batch_size, or rebuild with a larger batch")
    llm_role = "medusa" if mode == "medusa" else "target"
    llm_info = engines[llm_role]
    reference = llm_info.backend == "reference"
    tokenizer = TOKENIZER_DIR  # each tokenizer model carries its own copy, relative to its directory
    trust = spec.target.trust_remote_code
    common = {"triton_max_batch_size": batch, "max_queue_delay_microseconds": 0}
    models = [
        ModelPlan(PREPROCESSING, "preprocessing", {**common, "model_name": PREPROCESSING,
                                                   "preprocessing_instance_count": 1}, {
            "tokenizer_dir": tokenizer, "add_special_tokens": True, "trust_remote_code": trust,
            "end_id": end_id, "pad_id": pad_id, "max_input_len": spec.build.max_input_len,
            "max_output_len": spec.build.max_output_len, "torch_threads": TORCH_THREADS}),
        ModelPlan(POSTPROCESSING, "postprocessing", {**common, "model_name": POSTPROCESSING,
                                                     "postprocessing_instance_count": 1}, {
            "tokenizer_dir": tokenizer, "skip_special_tokens": True, "trust_remote_code": trust,
            "torch_threads": TORCH_THREADS}),
    ]
    # The BLS can only call non-decoupled LLM models (exec(decoupled=False), reference §2.1); without it the
    # target streams itself through the ensemble.
    llm_decoupled = deploy.decoupled and mode != "draft_target"
    models.append(_llm(TARGET, spec, engines[llm_role], engine_dir(spec, llm_role), llm_decoupled, end_id, pad_id))
    if mode == "draft_target":
        models.append(_llm(DRAFT, spec, engines["draft"], engine_dir(spec, "draft"), False, end_id, pad_id))
        models.append(ModelPlan(BLS, "tensorrt_llm_bls", {
            "model_name": BLS, "triton_max_batch_size": batch, "decoupled_mode": deploy.decoupled,
            "bls_instance_count": batch}, {
            "tensorrt_llm_model_name": TARGET, "tensorrt_llm_draft_model_name": DRAFT,
            "preprocessing_model_name": PREPROCESSING, "postprocessing_model_name": POSTPROCESSING,
            "num_draft_tokens": spec.speculative.num_draft_tokens, "max_draft_len": engines["target"].max_draft_len,
            "use_draft_logits": spec.speculative.use_draft_logits, "torch_threads": TORCH_THREADS}))
    stream_outputs = reference
    models.append(ModelPlan(ENSEMBLE, "ensemble", {
        "model_name": ENSEMBLE, "triton_max_batch_size": batch, "logits_datatype": "TYPE_FP32",
        "preprocessing_model_name": PREPROCESSING, "llm_model_name": TARGET,
        "postprocessing_model_name": POSTPROCESSING,
        "extra_llm_outputs": _ENSEMBLE_LLM_OUTPUTS if stream_outputs else "",
        "extra_post_inputs": _ENSEMBLE_POST_INPUTS if stream_outputs else "",
    }, python=False))
    return RepositoryPlan(spec, models, engines, end_id, pad_id)


def _llm(name: str, spec: PipelineSpec, info: EngineInfo, directory: Path, decoupled: bool, end_id: int,
         pad_id: int) -> ModelPlan:
    reference = info.backend == "reference"
    medusa = info.speculative_decoding_mode == "medusa"
    values = {"model_name": name, "triton_backend": "python" if reference else "tensorrtllm",
              "triton_max_batch_size": spec.deploy.triton_max_batch_size, "decoupled_mode": decoupled,
              "max_queue_delay_microseconds": 0, "logits_datatype": "TYPE_FP32",
              "extra_outputs": _REFERENCE_OUTPUTS if reference else ""}
    params: dict[str, object] = {
        "gpt_model_path": directory.resolve(),
        "gpt_model_type": "inflight_fused_batching",
        "max_beam_width": 1,
        "exclude_input_in_output": True,
        "enable_kv_cache_reuse": True,
        "decoding_mode": "medusa" if medusa else "top_k_top_p",
    }
    if medusa:
        if not info.medusa_choices:
            raise SpecbuildError(f"{directory}: a Medusa engine without medusa_choices in engine.json",
                                 hint="rebuild it with `specbuild build SPEC`")
        params["medusa_choices"] = format_choices(info.medusa_choices)
    if reference:
        params.update({"kv_cache_slots": max(8, 2 * (spec.deploy.triton_max_batch_size or 1)),
                       "end_id": end_id, "pad_id": pad_id, "torch_threads": TORCH_THREADS})
    else:
        # Target and draft share the GPU in draft-target mode: each takes part of the free memory.
        share = 0.45 if spec.speculative.mode == "draft_target" else 0.9
        params.update({"batch_scheduler_policy": "guaranteed_no_evict", "kv_cache_free_gpu_mem_fraction": share,
                       "FORCE_CPU_ONLY_INPUT_TENSORS": "no"})
    return ModelPlan(name, "tensorrt_llm", values, params, python=reference, engine=directory.resolve())


_REFERENCE_OUTPUTS = """,
  { name: "preceding_ids" data_type: TYPE_INT32 dims: [ -1 ] },
  { name: "is_final" data_type: TYPE_BOOL dims: [ 1 ] }"""
"""Reference LLM outputs beyond the TensorRT-LLM backend's: context for incremental detokenisation."""

_ENSEMBLE_LLM_OUTPUTS = """
      output_map { key: "preceding_ids" value: "_PRECEDING_IDS" }
      output_map { key: "is_final" value: "_IS_FINAL" }"""
_ENSEMBLE_POST_INPUTS = """
      input_map { key: "PRECEDING_IDS" value: "_PRECEDING_IDS" }
      input_map { key: "IS_FINAL" value: "_IS_FINAL" }"""
