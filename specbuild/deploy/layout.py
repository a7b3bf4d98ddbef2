"""Which models a repository holds for a spec, and every setting of each, before anything is written.

Model names, tensors and wiring follow the TensorRT-LLM 1.2 Triton backend (specbuild.contracts.triton_backend):
`preprocessing` -> `tensorrt_llm` -> `postprocessing` as the `ensemble` and as the `tensorrt_llm_bls`, which also
runs draft-target speculation with `tensorrt_llm_draft` where there is a draft. Every cross-model value (batch
size, decoupled modes, names, end/pad ids) is decided once here, so the models cannot disagree.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from specbuild.contracts import lookahead as la
from specbuild.contracts.engine_info import EngineInfo, engine_dir, engine_roles, read_engine_info, reference_checkpoint
from specbuild.contracts.triton_backend import MODELS, PLACEHOLDER_TYPES, ModelContract, ensemble_scheduling
from specbuild.errors import SpecbuildError
from specbuild.medusa.choices import format_choices
from specbuild.python_models.bls_loop import PLAIN_ROUND_MAX_TOKENS, PLAIN_ROUND_PARAMETER
from specbuild.spec import PipelineSpec
from specbuild.tokenizer import TOKENIZER_DIR

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
    """One model directory: its template, the template's header values and the parameters the spec decides
    (every other parameter of the contract keeps NVIDIA's default)."""

    name: str
    template: str  # directory under specbuild/triton_models, and the contract's model name
    values: dict[str, object]
    parameters: dict[str, object] = field(default_factory=dict)
    python: bool = True  # ships 1/model.py
    engine: Path | None = None
    reference: bool = True  # the flavour: reference python models (True) or TensorRT-LLM engines

    @property
    def contract(self) -> ModelContract:
        return MODELS[self.template]

    def all_parameters(self) -> dict[str, object]:
        """The contract's parameters with NVIDIA's defaults, overridden by the spec's; an override the contract
        does not list is a bug here, not a user error."""
        defaults: dict[str, object] = dict(self.contract.parameter_defaults(reference=self.reference))
        unknown = sorted(set(self.parameters) - set(defaults))
        if unknown:
            raise AssertionError(f"{self.name}: parameters {unknown} are not in the {self.template} contract")
        return {**defaults, **self.parameters}

    def template_values(self) -> dict[str, object]:
        """Header values plus the tensor blocks (and the ensemble's steps) generated from the contract."""
        inputs, outputs = self.contract.io_text(PLACEHOLDER_TYPES, reference=self.reference)
        values: dict[str, object] = {**self.values, "inputs": inputs, "outputs": outputs}
        if self.template == ENSEMBLE:
            values["ensemble_scheduling"] = ensemble_scheduling(
                {PREPROCESSING: PREPROCESSING, TARGET: TARGET, POSTPROCESSING: POSTPROCESSING},
                reference=self.reference)
        return values


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
    reference = engines[llm_role].backend == "reference"
    tokenizer = TOKENIZER_DIR  # each tokenizer model carries its own copy, relative to its directory
    trust = spec.target.trust_remote_code
    common = {"triton_max_batch_size": batch, "max_queue_delay_microseconds": 0}
    models = [
        ModelPlan(PREPROCESSING, PREPROCESSING, {**common, "model_name": PREPROCESSING,
                                                 "preprocessing_instance_count": 1}, {
            "tokenizer_dir": tokenizer, "trust_remote_code": trust, "torch_threads": TORCH_THREADS},
            reference=reference),
        ModelPlan(POSTPROCESSING, POSTPROCESSING, {**common, "model_name": POSTPROCESSING,
                                                   "postprocessing_instance_count": 1}, {
            "tokenizer_dir": tokenizer, "trust_remote_code": trust, "torch_threads": TORCH_THREADS},
            reference=reference),
    ]
    # A self-draft on the reference backend is served by the target model alone: its serving engine drafts with
    # the target's own first layers and KV cache (`self_draft` parameters), so there is no draft model to load and
    # the BLS decodes plainly through the target, as for Medusa. The tensorrt backend keeps TensorRT-LLM's two
    # engines (a second copy of the layers), and its repository is the draft-target one.
    # A quantized self-draft's layers are not the target's tensors: it stays a draft model of its own.
    self_draft = (reference and mode == "draft_target" and spec.draft is not None
                  and spec.draft.source == "target_layers" and not spec.draft.quantization.enabled)
    bls_drafts = mode == "draft_target" and not self_draft
    # The BLS calls draft-target's LLM models with exec(decoupled=False), one row at a time (NVIDIA's BLS does
    # the same); elsewhere the target streams itself, through the ensemble or the BLS.
    llm_decoupled = deploy.decoupled and not bls_drafts
    target = _llm(TARGET, spec, engines[llm_role], engine_dir(spec, llm_role), llm_decoupled, end_id, pad_id)
    if self_draft:
        target.parameters.update(_self_draft_parameters(spec))
    models.append(target)
    if bls_drafts:
        models.append(_llm(DRAFT, spec, engines["draft"], engine_dir(spec, "draft"), False, end_id, pad_id))
    models.append(ModelPlan(BLS, BLS, {
        "model_name": BLS, "triton_max_batch_size": batch, "decoupled_mode": deploy.decoupled,
        "bls_instance_count": 1}, {  # one instance serves every request on threads of its own
        "tensorrt_llm_model_name": TARGET, "tensorrt_llm_draft_model_name": DRAFT if bls_drafts else "",
        "preprocessing_model_name": PREPROCESSING, "postprocessing_model_name": POSTPROCESSING,
        "num_draft_tokens": spec.speculative.num_draft_tokens if bls_drafts else 0,
        "max_draft_len": engines["target"].max_draft_len if bls_drafts else 0,
        "use_draft_logits": spec.speculative.use_draft_logits, "torch_threads": TORCH_THREADS,
        **(_schedule(spec) if bls_drafts else {}),
        **({PLAIN_ROUND_PARAMETER: spec.speculative.plain_round_tokens or PLAIN_ROUND_MAX_TOKENS}
           if bls_drafts else {})},
        reference=reference))
    models.append(ModelPlan(ENSEMBLE, ENSEMBLE, {
        "model_name": ENSEMBLE, "triton_max_batch_size": batch, "llm_model_name": TARGET}, python=False,
        reference=reference))
    return RepositoryPlan(spec, models, engines, end_id, pad_id)


def _llm(name: str, spec: PipelineSpec, info: EngineInfo, directory: Path, decoupled: bool, end_id: int,
         pad_id: int) -> ModelPlan:
    reference = info.backend == "reference"
    medusa = info.speculative_decoding_mode == "medusa"
    lookahead = info.speculative_decoding_mode == la.BUILD_MODE
    values = {"model_name": name, "triton_backend": "python" if reference else "tensorrtllm",
              "triton_max_batch_size": spec.deploy.triton_max_batch_size, "decoupled_mode": decoupled,
              "max_queue_delay_microseconds": 0}
    params: dict[str, object] = {
        "gpt_model_path": directory.resolve(),
        "exclude_input_in_output": spec.deploy.exclude_input_in_output,
        "decoding_mode": "medusa" if medusa else la.DECODING_MODE if lookahead else "top_k_top_p",
    }
    if lookahead:
        params.update(_lookahead_parameters(spec, info, directory))
    if info.max_attention_window_size is not None:
        # Mistral's sliding window: TensorRT-LLM applies it only when the runtime is told (trtllm-build has no such
        # flag; NVIDIA/TensorRT-LLM examples/models/core/llama/README.md @076efc2b), one value for every layer;
        # Gemma's per-layer windows comma separated, as the backend parses them (specbuild.contracts.triton_backend).
        window = info.max_attention_window_size
        params["max_attention_window_size"] = ",".join(map(str, window)) if isinstance(window, list) else str(window)
    if medusa:
        if not info.medusa_choices:
            raise SpecbuildError(f"{directory}: a Medusa engine without medusa_choices in engine.json",
                                 hint="rebuild it with `specbuild build SPEC`")
        params["medusa_choices"] = format_choices(info.medusa_choices)
    if reference:
        params.update({"kv_cache_slots": max(8, 2 * (spec.deploy.triton_max_batch_size or 1)),
                       "end_id": end_id, "pad_id": pad_id, "torch_threads": TORCH_THREADS,
                       **(_schedule(spec) if medusa or lookahead else {})})
    elif spec.speculative.mode == "draft_target":
        params["kv_cache_free_gpu_mem_fraction"] = 0.45  # target and draft share the GPU's free memory
    return ModelPlan(name, TARGET, values, params, python=reference, engine=directory.resolve(),
                     reference=reference)


def _self_draft_parameters(spec: PipelineSpec) -> dict[str, object]:
    """What the reference tensorrt_llm model needs to self-draft: L, K, the load schedule, and (with an adapter)
    the draft checkpoint convert wrote, whose layer L is the adapter (its layers below L are only checked against
    the target's, never kept)."""
    assert spec.draft is not None
    params: dict[str, object] = {"self_draft_layers": spec.draft.layers,
                                 "self_draft_len": spec.speculative.num_draft_tokens, **_schedule(spec)}
    if spec.draft.adapter is not None:
        params["self_draft_checkpoint"] = reference_checkpoint(engine_dir(spec, "draft")).resolve()
    return params


def _lookahead_parameters(spec: PipelineSpec, info: EngineInfo, directory: Path) -> dict[str, object]:
    """The executor's (W, N, G) from the spec, as the tensorrt_llm model's lookahead parameters. The C++ backend
    will not load decoding_mode lookahead without all three, and the executor needs them to give exactly the
    engine's max_draft_len (NVIDIA/TensorRT-LLM examples/lookahead/README.md @7ed07f06)."""
    config = spec.speculative.lookahead_config().config
    need = la.max_draft_len(*config)
    if info.lookahead_config != list(config) or info.max_draft_len != need:
        raise SpecbuildError(
            f"{directory}: the engine was built for lookahead {info.lookahead_config} with max_draft_len "
            f"{info.max_draft_len}, but speculative.lookahead (W, N, G) = {tuple(config)} needs max_draft_len {need}",
            hint="rebuild with `specbuild build SPEC`, or set speculative.lookahead back to the engine's")
    return dict(zip(la.PARAMETERS, config, strict=True))


def _schedule(spec: PipelineSpec) -> dict[str, object]:
    """The load-aware speculation settings, for whichever model speculates (the BLS, or a Medusa, Lookahead or
    self-draft reference engine)."""
    schedule, limit = spec.speculative.draft_len_schedule, spec.speculative.max_concurrency
    return {"draft_len_schedule": json.dumps(schedule, sort_keys=True) if schedule else "",
            "max_concurrency": limit or ""}
