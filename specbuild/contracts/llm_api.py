"""What a spec asks of TensorRT-LLM 1.2's LLM API (the PyTorch backend), as data, and which flow runs which mode.

`build.flow: pytorch` has no engine: the LLM API takes the HF checkpoints and a handful of `LlmArgs` settings, one
of them a `speculative_config`. `build` checks those settings against the tables here and records them; `deploy`
writes them into Triton's llmapi `model.yaml` and a `trtllm-serve` options file. The tables are read from
NVIDIA/TensorRT-LLM `tensorrt_llm/llmapi/llm_args.py` of the 1.2 line (the version at commit 195839a7, read
through its copy in the fork HuiGao-NV/TensorRT-LLM: the engine flow's `BuildConfig`/`TrtLlmArgs` still in it,
`DecodingBaseConfig.from_dict` naming the decoding types below):
- `DecodingBaseConfig` fields (every decoding config has them), and each config's own fields;
- `DecodingBaseConfig.from_dict`: the `decoding_type` string a YAML `speculative_config` names its class by;
- `supports_backend(backend)`: Medusa and Lookahead return False for "pytorch"; NGram, MTP and AUTO are
  "pytorch" only; DraftTarget "pytorch" or "_autodeploy"; Eagle inherits True; `TrtLlmArgs`/`TorchLlmArgs`
  refuse a config whose `supports_backend` is False with "Speculation type {decoding_type} does not support
  backend {backend}".
- `BaseLlmArgs` fields specbuild sets: model, tensor_parallel_size, pipeline_parallel_size, max_batch_size,
  max_seq_len, max_num_tokens (default 8192), speculative_config, backend, dtype (default "auto").
EAGLE-3 in 1.2 is `EagleDecodingConfig` (decoding_type "Eagle") with an EAGLE-3 draft: its torch
`spec_dec_mode` is EAGLE3 or EAGLE3_ONE_MODEL (`eagle3_one_model`); the engine flow's EAGLE (trtllm-build
`--speculative_decoding_mode eagle`) builds EAGLE-1/2 heads, not EAGLE-3 drafts.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from specbuild.contracts.engine_limits import default_max_num_tokens
from specbuild.contracts.quant_formats import FORMATS, PYTORCH_LINEAR_SOURCE
from specbuild.errors import SpecbuildError
from specbuild.spec import PipelineSpec
from specbuild.spec.problems import Loc
from specbuild.spec.schema import Eagle3Spec, NGramSpec

LLM_ARGS_SOURCE = ("NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/llm_args.py, 1.2 line, commit 195839a7 "
                   "(as stored in the fork HuiGao-NV/TensorRT-LLM)")
LLMAPI_MODEL_SOURCE = ("NVIDIA/TensorRT-LLM triton_backend/all_models/llmapi/tensorrt_llm/ (config.pbtxt @0a710573, "
                       "1/model.yaml @0ebb1536, 1/model.py @044a90d2)")
SERVE_SOURCE = "NVIDIA/TensorRT-LLM tensorrt_llm/commands/serve.py @195839a7 (HuiGao-NV/TensorRT-LLM)"
PYTORCH = "pytorch"
"""`LlmArgs.backend` of the PyTorch flow (and trtllm-serve's default `--backend`)."""

DECODING_BASE_FIELDS = frozenset({
    "max_draft_len", "max_total_draft_tokens", "speculative_model", "max_concurrency", "draft_len_schedule",
    "load_format", "acceptance_window", "acceptance_length_threshold", "allow_advanced_sampling",
})
"""`DecodingBaseConfig` fields (llm_args.py 1.2): every decoding config accepts them (`speculative_model_dir` is
an alias of `speculative_model`)."""


@dataclass(frozen=True)
class DecodingType:
    """One LLM-API decoding config: its class, the `decoding_type` string `from_dict` dispatches on, its own fields,
    and the backends its `supports_backend` accepts (None: every backend, the base class's answer)."""

    config_class: str
    decoding_type: str
    fields: frozenset[str]
    backends: frozenset[str] | None

    @property
    def all_fields(self) -> frozenset[str]:
        return DECODING_BASE_FIELDS | self.fields

    def supports(self, backend: str) -> bool:
        return self.backends is None or backend in self.backends


DECODING_TYPES: dict[str, DecodingType] = {
    "DraftTarget": DecodingType("DraftTargetDecodingConfig", "DraftTarget", frozenset(),
                                frozenset({"pytorch", "_autodeploy"})),
    "Eagle": DecodingType("EagleDecodingConfig", "Eagle", frozenset({
        "eagle_choices", "greedy_sampling", "posterior_threshold", "use_dynamic_tree", "dynamic_tree_max_topK",
        "num_eagle_layers", "max_non_leaves_per_layer", "eagle3_one_model", "eagle3_layers_to_capture",
        "eagle3_model_arch"}), None),
    "NGram": DecodingType("NGramDecodingConfig", "NGram", frozenset({
        "max_matching_ngram_size", "is_keep_all", "is_use_oldest", "is_public_pool"}), frozenset({"pytorch"})),
    "Medusa": DecodingType("MedusaDecodingConfig", "Medusa", frozenset({"medusa_choices", "num_medusa_heads"}),
                           frozenset({"tensorrt"})),  # supports_backend: backend not in ("pytorch", "_autodeploy")
    "Lookahead": DecodingType("LookaheadDecodingConfig", "Lookahead", frozenset({
        "max_window_size", "max_ngram_size", "max_verification_set_size"}), frozenset({"tensorrt"})),  # likewise
    "MTP": DecodingType("MTPDecodingConfig", "MTP", frozenset({
        "num_nextn_predict_layers", "use_relaxed_acceptance_for_thinking", "relaxed_topk", "relaxed_delta",
        "use_mtp_vanilla", "mtp_eagle_one_model"}), frozenset({"pytorch"})),
    "AUTO": DecodingType("AutoDecodingConfig", "AUTO", frozenset(), frozenset({"pytorch"})),
}
"""The decoding configs of llm_args.py 1.2 that matter to specbuild's modes (plus MTP and AUTO, which no spec mode
selects), by `decoding_type`."""

MODE_DECODING_TYPE: dict[str, str] = {
    "draft_target": "DraftTarget", "eagle3": "Eagle", "ngram": "NGram", "medusa": "Medusa",
}
"""spec `speculative.mode` -> the LLM API's decoding_type (mode `none` sets no speculative_config)."""

LLM_ARGS_FIELDS = frozenset({
    "model", "backend", "tensor_parallel_size", "pipeline_parallel_size", "max_batch_size", "max_seq_len",
    "max_num_tokens", "speculative_config", "trust_remote_code", "dtype",
})
"""The `BaseLlmArgs`/`TorchLlmArgs` fields specbuild writes (llm_args.py 1.2; trust_remote_code is the LLM
constructor's)."""

ENGINE_FLOW_ONLY_REASON = {
    "medusa": "Medusa runs only on the engine flow: TensorRT-LLM 1.2's MedusaDecodingConfig.supports_backend is "
              "False for 'pytorch' (tensorrt_llm/llmapi/llm_args.py), so LLM(backend='pytorch') refuses it with "
              "'Speculation type Medusa does not support backend pytorch'",
    "lookahead": "Lookahead runs only on the engine flow: TensorRT-LLM 1.2's LookaheadDecodingConfig."
                 "supports_backend is False for 'pytorch' (tensorrt_llm/llmapi/llm_args.py)",
}
"""Why a mode is refused on `build.flow: pytorch` (`lookahead` for the day a spec mode selects it)."""

PYTORCH_ONLY_REASON = {
    "eagle3": "eagle3 runs only on the PyTorch backend (TensorRT-LLM 1.2 llm_args.py: EAGLE-3 is "
              "EagleDecodingConfig's torch spec_dec_mode EAGLE3/EAGLE3_ONE_MODEL; the engine flow's "
              "--speculative_decoding_mode eagle builds EAGLE-1/2 heads)",
    "ngram": "ngram runs only on the PyTorch backend (TensorRT-LLM 1.2 llm_args.py NGramDecodingConfig."
             "supports_backend: backend == 'pytorch')",
}
"""Why a mode is refused on the engine flow."""


def flow_problems(spec: PipelineSpec) -> list[tuple[Loc, str]]:
    """The spec's speculative mode where its `build.flow` cannot run it, with TensorRT-LLM's reason and the fix:
    every stage checks this first, so an engine-flow stage never meets a mode it has no engine for."""
    mode = spec.speculative.mode
    if spec.build.flow == "engine" and mode in PYTORCH_ONLY_REASON:
        return [(("speculative", "mode"), f"{PYTORCH_ONLY_REASON[mode]}; set build.flow: pytorch")]
    if spec.build.flow == PYTORCH and mode in ENGINE_FLOW_ONLY_REASON:
        return [(("speculative", "mode"), f"{ENGINE_FLOW_ONLY_REASON[mode]}; set build.flow: engine, or use "
                 "draft_target, eagle3 or ngram")]
    return []


def refuse_other_flow(spec: PipelineSpec, stage: str) -> None:
    """Raise one located error when `flow_problems` finds any (convert, build and deploy call this first)."""
    problems = flow_problems(spec)
    if problems:
        raise spec.problems_error(problems, hint=f"`specbuild {stage}` stops here; `specbuild validate SPEC` "
                                  "lists every problem")


def speculative_config(spec: PipelineSpec) -> dict[str, Any] | None:
    """The `speculative_config` mapping (YAML form, `decoding_type` first) the spec asks the LLM API for, or None.

    K (`speculative.num_draft_tokens`) is `max_draft_len`; `speculative_model` is the draft checkpoint (a draft
    model for DraftTarget, an EAGLE-3 draft for Eagle); the NGram and Eagle settings keep llm_args.py's names."""
    speculative = spec.speculative
    decoding_type = MODE_DECODING_TYPE.get(speculative.mode)
    if decoding_type is None:
        return None
    config: dict[str, Any] = {"decoding_type": decoding_type, "max_draft_len": speculative.num_draft_tokens}
    if spec.draft is not None and speculative.mode in ("draft_target", "eagle3"):
        config["speculative_model"] = str(draft_model_dir(spec))  # a quantized draft: ModelOpt's HF export
    if speculative.mode == "ngram":
        ngram = speculative.ngram or NGramSpec()
        config.update(ngram.model_dump())
    if speculative.mode == "eagle3":
        eagle3 = speculative.eagle3 or Eagle3Spec()
        config["eagle3_one_model"] = eagle3.eagle3_one_model
        if eagle3.eagle3_layers_to_capture is not None:
            config["eagle3_layers_to_capture"] = list(eagle3.eagle3_layers_to_capture)
    if speculative.draft_len_schedule is not None:
        config["draft_len_schedule"] = {int(k): int(v) for k, v in sorted(speculative.draft_len_schedule.items())}
    if speculative.max_concurrency is not None:
        config["max_concurrency"] = speculative.max_concurrency
    return config


def llm_args(spec: PipelineSpec) -> dict[str, Any]:
    """The LLM-API settings (LlmArgs field -> value) of a `build.flow: pytorch` spec: what model.yaml and the
    trtllm-serve options carry. max_num_tokens defaults by the engine flow's rule (engine_limits), so both flows
    size a step alike."""
    build = spec.build
    args: dict[str, Any] = {
        "model": str(spec.target.model),
        "backend": PYTORCH,
        "tensor_parallel_size": build.tp_size,
        "pipeline_parallel_size": build.pp_size,
        "max_batch_size": build.max_batch_size,
        "max_seq_len": build.max_seq_len,
        "max_num_tokens": build.max_num_tokens or default_max_num_tokens(
            build.max_batch_size, build.max_input_len, spec.full_draft_len),
    }
    if build.dtype != "auto":  # BaseLlmArgs.dtype, default "auto" (the checkpoint's): the spec's choice is kept
        args["dtype"] = build.dtype
    if spec.target.trust_remote_code:
        args["trust_remote_code"] = True
    config = speculative_config(spec)
    if config is not None:
        args["speculative_config"] = config
    return args


def settings_problems(args: dict[str, Any]) -> Iterator[tuple[Loc, str]]:
    """Check LLM-API settings against the tables: every key an LlmArgs field, the decoding_type one `from_dict`
    knows, every speculative_config key a field of that config, and the config supported on the backend."""
    for key in sorted(set(args) - LLM_ARGS_FIELDS):
        yield ("build",), f"LLM-API setting {key!r} is not an LlmArgs field ({LLM_ARGS_SOURCE})"
    config = args.get("speculative_config")
    if config is None:
        return
    decoding = DECODING_TYPES.get(str(config.get("decoding_type")))
    if decoding is None:
        yield ("speculative", "mode"), (f"decoding_type {config.get('decoding_type')!r} is not one of "
                                        f"{', '.join(sorted(DECODING_TYPES))} ({LLM_ARGS_SOURCE})")
        return
    for key in sorted(set(config) - {"decoding_type"} - decoding.all_fields):
        yield ("speculative",), f"{key!r} is not a field of {decoding.config_class} ({LLM_ARGS_SOURCE})"
    backend = str(args.get("backend", PYTORCH))
    if not decoding.supports(backend):
        yield ("speculative", "mode"), (f"Speculation type {decoding.decoding_type} does not support backend "
                                        f"{backend} ({decoding.config_class}.supports_backend, {LLM_ARGS_SOURCE})")


QUANTIZED_DRAFT_DIR = "draft-hf"
"""`<output_dir>/checkpoints/draft-hf`: a `build.flow: pytorch` draft with `draft.quantization`, as ModelOpt's Hugging
Face export (specbuild.convert.quantize.hf_export), the directory the LLM API's speculative_model then names."""


def quantized_draft_dir(spec: PipelineSpec) -> Path | None:
    """Where `convert` writes the quantized Hugging Face draft of a PyTorch-flow spec (None: no quantized draft)."""
    if spec.build.flow != PYTORCH or spec.draft is None or not spec.draft.quantization.enabled:
        return None
    return spec.output_dir / "checkpoints" / QUANTIZED_DRAFT_DIR


def draft_model_dir(spec: PipelineSpec) -> Path | None:
    """The Hugging Face directory the LLM API loads as the draft (`speculative_model`): the quantized export, else
    `draft.model` as it is."""
    if spec.draft is None:
        return None
    return quantized_draft_dir(spec) or spec.draft.model


def quantized_draft_problems(spec: PipelineSpec) -> list[tuple[Loc, str]]:
    """A `draft.quantization` the PyTorch flow cannot serve: a format TensorRT-LLM 1.2's PyTorch backend has no linear
    method for (contracts.quant_formats `Format.pytorch_linear`), or a draft that is not a draft-target draft."""
    if spec.draft is None or not spec.draft.quantization.enabled:
        return []
    if spec.speculative.mode != "draft_target":
        return [(("draft", "quantization"), f"quantization applies to a draft_target draft; speculative.mode "
                 f"{spec.speculative.mode}'s draft is loaded as it is (remove draft.quantization)")]
    fmt = FORMATS.get(spec.draft.quantization.format)
    if fmt is not None and fmt.pytorch_linear is None:
        usable = ", ".join(name for name, f in FORMATS.items() if f.pytorch_linear)
        return [(("draft", "quantization", "format"),
                 f"{spec.draft.quantization.format} ({fmt.quant_algo}) has no linear method on TensorRT-LLM 1.2's "
                 f"PyTorch backend: get_quant_method raises 'unsupported quant mode' for it ({PYTORCH_LINEAR_SOURCE}); "
                 f"use {usable} on build.flow: pytorch, or build.flow: engine for {spec.draft.quantization.format}")]
    return []


def pytorch_flow_problems(spec: PipelineSpec) -> list[tuple[Loc, str]]:
    """Every problem of a `build.flow: pytorch` spec beyond the schema: the mode (`flow_problems`), the LLM-API
    settings against llm_args.py's tables, and engine-flow settings that this flow would silently ignore."""
    if spec.build.flow != PYTORCH:
        return []
    problems = flow_problems(spec)
    if problems:
        return problems
    problems += list(settings_problems(llm_args(spec)))
    unused = "is an engine-flow setting; build.flow: pytorch builds no engine"
    if spec.build.gather_context_logits:
        problems.append((("build", "gather_context_logits"), f"{unused} (remove it)"))
    if spec.speculative.max_draft_len is not None:
        problems.append((("speculative", "max_draft_len"), f"{unused}: the LLM API's max_draft_len is "
                         "speculative.num_draft_tokens (remove it)"))
    if spec.speculative.use_draft_logits:
        problems.append((("speculative", "use_draft_logits"), f"{unused} (remove it)"))
    if spec.deploy.exclude_input_in_output:
        problems.append((("deploy", "exclude_input_in_output"), "the llmapi model has no such parameter; a request "
                         "sets sampling_param_exclude_input_from_output instead (remove it)"))
    problems += quantized_draft_problems(spec)
    return problems


def refuse_pytorch_flow_problems(spec: PipelineSpec, stage: str) -> None:
    """Raise one located error listing `pytorch_flow_problems`, if any."""
    problems = pytorch_flow_problems(spec)
    if problems:
        raise spec.problems_error(problems, hint=f"`specbuild {stage}` stops here; fix these, then run it again")


# -- Triton's llmapi model and trtllm-serve ---------------------------------------------------------------------
LLM_API_DIR = "llm_api"
LLM_API_PLAN = "llm_api.json"
"""What `build` leaves for a `build.flow: pytorch` spec: `<output_dir>/llm_api/llm_api.json` (the LLM-API
settings checked against the tables above) and its manifest.json; deploy writes exactly these settings."""


def llm_api_dir(spec: PipelineSpec) -> Path:
    return spec.output_dir / LLM_API_DIR


LLMAPI_MODEL = "tensorrt_llm"
"""The model directory name of triton_backend/all_models/llmapi (its config.pbtxt names it so)."""
LLMAPI_CODE = ("1/model.py", "1/helpers.py")
"""The python files of NVIDIA's llmapi model, which deploy does not copy: they come with TensorRT-LLM (the
container's triton_backend/all_models/llmapi/tensorrt_llm/)."""
LLMAPI_MODEL_YAML = f"{LLMAPI_MODEL}/1/model.yaml"
"""What marks a repository as the PyTorch flow's (deploy writes it; the engine flow's tensorrt_llm has no 1/ file)."""
CODE_NOTE = (f"{LLMAPI_MODEL}/{' and '.join(LLMAPI_CODE)} are NVIDIA's, not written here: copy them from the "
             "TensorRT-LLM 1.2 container's triton_backend/all_models/llmapi/tensorrt_llm/1/")


def missing_llmapi_code(repository: Path) -> list[str]:
    """NVIDIA's llmapi files a PyTorch-flow repository (one with tensorrt_llm/1/model.yaml) still lacks, relative to
    the repository; [] for an engine-flow repository, one whose code was copied in, or a reference one (specbuild's
    own model.py stands in for NVIDIA's there: `is_reference_llmapi`)."""
    if not (repository / LLMAPI_MODEL_YAML).is_file() or is_reference_llmapi(repository):
        return []
    return [f"{LLMAPI_MODEL}/{name}" for name in LLMAPI_CODE if not (repository / LLMAPI_MODEL / name).is_file()]


def refuse_incomplete_llmapi(repository: Path, command: str) -> None:
    """One error naming what to copy, where serve would fail as a generic model load failure and `deploy --check`
    would judge the llmapi model against the ensemble's contract."""
    missing = missing_llmapi_code(repository)
    if missing:
        raise SpecbuildError(f"{repository}: Triton's llmapi model (a build.flow: pytorch repository) without "
                             f"NVIDIA's code: {', '.join(missing)} missing", hint=f"{CODE_NOTE}, then run "
                             f"`specbuild {command}` again")


@dataclass(frozen=True)
class Tensor:
    name: str
    data_type: str
    dims: tuple[int, ...]
    optional: bool = False


_STRING, _BOOL, _I32, _F32 = "TYPE_STRING", "TYPE_BOOL", "TYPE_INT32", "TYPE_FP32"
LLMAPI_INPUTS: tuple[Tensor, ...] = (
    Tensor("text_input", _STRING, (-1,)),
    Tensor("streaming", _BOOL, (1,), True),
    Tensor("sampling_param_best_of", _I32, (1,), True),
    Tensor("sampling_param_temperature", _F32, (1,), True),
    Tensor("sampling_param_top_k", _I32, (1,), True),
    Tensor("sampling_param_top_p", _F32, (1,), True),
    Tensor("sampling_param_frequency_penalty", _F32, (1,), True),
    Tensor("sampling_param_presence_penalty", _F32, (1,), True),
    Tensor("sampling_param_max_tokens", _I32, (1,), True),
    Tensor("sampling_param_stop", _STRING, (-1,), True),
    Tensor("sampling_param_seed", "TYPE_UINT64", (1,), True),
    Tensor("sampling_param_exclude_input_from_output", _BOOL, (1,), True),
    Tensor("sampling_param_return_perf_metrics", _BOOL, (1,), True),
    Tensor("return_finish_reason", _BOOL, (1,), True),
    Tensor("return_stop_reason", _BOOL, (1,), True),
    Tensor("return_cumulative_logprob", _BOOL, (1,), True),
    Tensor("stop", _BOOL, (1,), True),
)
"""The llmapi config.pbtxt's inputs (LLMAPI_MODEL_SOURCE), without `image_url` and `lora_*`: multimodal and LoRA
serving, which no spec asks for (optional inputs: the model reads them only when sent)."""
LLMAPI_OUTPUTS: tuple[Tensor, ...] = (
    Tensor("text_output", _STRING, (-1,)),
    Tensor("finish_reason", _STRING, (-1,)),
    Tensor("stop_reason", _STRING, (-1,)),
    Tensor("cumulative_logprob", _F32, (-1,)),
    Tensor("kv_cache_reused_block", _I32, (-1,)),
    Tensor("kv_cache_missed_block", _I32, (-1,)),
    Tensor("kv_cache_alloc_new_blocks", _I32, (-1,)),
    Tensor("kv_cache_alloc_total_blocks", _I32, (-1,)),
    Tensor("kv_cache_hit_rate", _F32, (-1,)),
    Tensor("arrival_time_ns", "TYPE_INT64", (1,)),
    Tensor("first_scheduled_time_ns", "TYPE_INT64", (1,)),
    Tensor("first_token_time_ns", "TYPE_INT64", (1,)),
    Tensor("last_token_time_ns", "TYPE_INT64", (1,)),
    Tensor("acceptance_rate", _F32, (1,)),
    Tensor("total_accepted_draft_tokens", _I32, (1,)),
    Tensor("total_draft_tokens", _I32, (1,)),
)
"""The llmapi config.pbtxt's outputs (LLMAPI_MODEL_SOURCE)."""
LLMAPI_TRITON_MAX_BATCH_SIZE = 0
"""model.yaml `triton_config.max_batch_size`: NVIDIA's model.yaml sets 0 ("the current implementation does not
support batching"); the LLM API batches in flight up to LlmArgs.max_batch_size itself."""


def model_yaml(spec: PipelineSpec, args: dict[str, Any]) -> dict[str, Any]:
    """The llmapi `1/model.yaml` mapping: the LLM-API settings (model.py passes every key but triton_config to
    `LLM(**args)` through update_llm_args_with_extra_dict) and `triton_config` (read by auto_complete_config)."""
    return {**args, "triton_config": {"max_batch_size": LLMAPI_TRITON_MAX_BATCH_SIZE,
                                      "decoupled": spec.deploy.decoupled}}


SERVE_OPTIONS = "trtllm-serve.yaml"
SERVE_SCRIPT = "trtllm-serve.sh"
SERVE_FLAGS: dict[str, str] = {
    "backend": "--backend", "tensor_parallel_size": "--tp_size", "pipeline_parallel_size": "--pp_size",
    "max_batch_size": "--max_batch_size", "max_num_tokens": "--max_num_tokens", "max_seq_len": "--max_seq_len",
}
"""LlmArgs setting -> the trtllm-serve option that sets it (SERVE_SOURCE); the rest go into the options YAML that
`--extra_llm_api_options` (alias `--config`) names, which overrides the flags key by key."""


def serve_command(spec: PipelineSpec, args: dict[str, Any], options_path: str) -> tuple[list[str], dict[str, Any]]:
    """`trtllm-serve MODEL --flag value ... --extra_llm_api_options OPTIONS` and the options mapping."""
    command = ["trtllm-serve", str(args["model"]), "--host", "0.0.0.0", "--port", str(spec.deploy.http_port)]
    for key, flag in SERVE_FLAGS.items():
        command += [flag, str(args[key])]
    if args.get("trust_remote_code"):
        command.append("--trust_remote_code")
    command += ["--extra_llm_api_options", options_path]
    options = {key: value for key, value in args.items()
               if key not in SERVE_FLAGS and key not in ("model", "trust_remote_code")}
    return command, options


# -- what the llmapi model does with a request (its model.py and helpers.py) -------------------------------------
LLMAPI_CODE_SOURCE = ("NVIDIA/TensorRT-LLM triton_backend/all_models/llmapi/tensorrt_llm/1/model.py @044a90d2 "
                      "(_execute_single_request, _convert_request, _create_response, handle_stop_request) and "
                      "1/helpers.py @fab2f90b (get_sampling_params_from_request, get_output_config_from_request, "
                      "get_streaming_from_request, get_input_scalar_by_name)")
SAMPLING_PARAMS_SOURCE = "NVIDIA/TensorRT-LLM tensorrt_llm/sampling_params.py @195839a7 (HuiGao-NV/TensorRT-LLM)"
RESULT_SOURCE = ("NVIDIA/TensorRT-LLM tensorrt_llm/executor/result.py (CompletionOutput: `text` is the whole text so "
                 "far, `text_diff` the new part) and cpp/tensorrt_llm/batch_manager/llmRequest.cpp @119c6e60 "
                 "createResult (not streaming: the prompt tokens lead the output unless exclude_input_from_output; "
                 "streaming: only tokens not sent yet)")


@dataclass(frozen=True)
class RequestInput:
    """One optional llmapi input that helpers.py reads as a scalar into a SamplingParams keyword (or an output-config
    flag), and what it fills in when the request does not send it: None means nothing (SamplingParams' own default,
    SAMPLING_PARAMS_DEFAULTS, applies)."""

    name: str
    key: str
    default: Any = None


SAMPLING_PARAM_INPUTS: tuple[RequestInput, ...] = (
    RequestInput("sampling_param_best_of", "best_of", 1),
    RequestInput("sampling_param_temperature", "temperature"),
    RequestInput("sampling_param_top_k", "top_k"),
    RequestInput("sampling_param_top_p", "top_p"),
    RequestInput("sampling_param_frequency_penalty", "frequency_penalty"),
    RequestInput("sampling_param_presence_penalty", "presence_penalty"),
    RequestInput("sampling_param_max_tokens", "max_tokens"),
    RequestInput("sampling_param_seed", "seed"),
    RequestInput("sampling_param_exclude_input_from_output", "exclude_input_from_output", False),
    RequestInput("sampling_param_return_perf_metrics", "return_perf_metrics", False),
)
"""helpers.py get_sampling_params_from_request: `sampling_param_<field>` -> SamplingParams(<field>), the defaults its
default_values dict fills in (note exclude_input_from_output False, where SamplingParams' own default is True: a
non-streamed llmapi answer leads with the prompt unless the request says otherwise)."""
STOP_INPUT = "sampling_param_stop"
"""Read as a whole tensor (not a scalar) into SamplingParams(stop=...): a list of stop strings."""
SAMPLING_PARAMS_DEFAULTS: dict[str, Any] = {
    "max_tokens": 32, "temperature": None, "top_k": None, "top_p": None, "seed": None,
    "frequency_penalty": None, "presence_penalty": None, "stop": None, "include_stop_str_in_output": False,
    "add_special_tokens": True, "skip_special_tokens": True,
}
"""SamplingParams defaults (SAMPLING_PARAMS_SOURCE) for what a request leaves out. Greedy when temperature, top_p and
top_k are all None, or top_k == 1, top_p == 0 or temperature == 0 (`params_imply_greedy_decoding`); otherwise
temperature None means 1, top_p None means 1, top_k None means 0 (no top-k)."""
OUTPUT_CONFIG_INPUTS: dict[str, str] = {
    "return_finish_reason": "finish_reason", "return_stop_reason": "stop_reason",
    "return_cumulative_logprob": "cumulative_logprob",
}
"""helpers.py get_output_config_from_request (each default False) -> the output model.py adds when true, as the str()
of the CompletionOutput field (finish_reason 'stop'/'length'/'cancelled', stop_reason the stop string or None,
cumulative_logprob None: model.py asks for no logprobs)."""
PERF_METRIC_OUTPUTS = (
    "kv_cache_reused_block", "kv_cache_hit_rate", "kv_cache_alloc_new_blocks", "kv_cache_alloc_total_blocks",
    "kv_cache_missed_block", "arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns",
    "last_token_time_ns", "acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens",
)
"""The outputs _create_response adds when the result has request_perf_metrics (sampling_param_return_perf_metrics
true), in its order. model.py builds every output with text_output's numpy dtype (object): on the wire each is a
BYTES tensor of str(value), whatever config.pbtxt declares for it."""
STREAMING_INPUT, STOP_REQUEST_INPUT, TEXT_INPUT = "streaming", "stop", "text_input"
LLMAPI_ERRORS: dict[str, str] = {
    "no_text_input": "text_input is missing from the request",
    "not_1d": "The current implementation only supports text_input being a 1D tensor.",
    "not_scalar": "Expected a scalar tensor for tensor {name}",
    "streaming_not_decoupled": "Streaming is only supported in decoupled mode.",
    "wrapped": "Error generating request: {error}",
    "stop_without_id": "A request id must be provided for request cancellation",
    "cancelled": "Request cancelled by client",
    "top_p": "require 0 <= top_p <= 1, got top_p={value}",
    "top_k": "require top_k >= 0, got top_k={value}",
    "temperature": "require temperature >= 0, got temperature={value}",
    "greedy_best_of": ("Greedy decoding in the LLM API does not allow multiple returns. Please set to best_of=1, got "
                       "best_of={value}. Please set to best_of=1 or set an environment variable "
                       "TLLM_ALLOW_N_GREEDY_DECODING=1 to allow best_of > 1 under the greedy decoding."),
}
"""The texts model.py and SamplingParams._validate answer with (LLMAPI_CODE_SOURCE, SAMPLING_PARAMS_SOURCE). Every
error of a generation request is one final response: text_output ["N/A"] and the error "Error generating request:
..." (`wrapped`); a stop request (input `stop` true) aborts the requests with its request id and is itself answered
with the CANCELLED error `cancelled` (or `stop_without_id`). Only text_input[0] is generated (one prompt per
request)."""
ERROR_TEXT_OUTPUT = "N/A"


# -- the reference backend's llmapi model (build.flow: pytorch, build.backend: reference) ------------------------
REFERENCE_FILE = f"{LLMAPI_MODEL}/1/reference.json"
"""What marks a reference llmapi repository: deploy writes specbuild's tensorrt_llm/1/model.py (the reference that
serves the llmapi model's interface on CPU) and this side file naming the converted checkpoints it loads; model.yaml
stays exactly what NVIDIA's model.py reads, and the reference reads its settings from there too."""
REFERENCE_ROLES: dict[str, tuple[str, ...]] = {"none": ("target",), "draft_target": ("target", "draft"),
                                               "eagle3": ("target",), "ngram": ("target",)}
"""Which models `convert` writes as TensorRT-LLM checkpoints for the reference runtime, by speculative.mode (an
EAGLE-3 draft is loaded from its Hugging Face directory as it is; NGram needs no draft)."""


def llmapi_backend(spec: PipelineSpec) -> Literal["tensorrt", "reference"]:
    """Who serves a PyTorch-flow repository: `reference` only when the spec says so (specbuild's model.py on CPU);
    `auto` and `tensorrt` mean NVIDIA's llmapi model. Not chosen by what this machine has installed, as the engine
    flow's auto is: nothing here needs TensorRT-LLM to be written, and such a repository is usually written on one
    machine and served on a GPU host."""
    return "reference" if spec.build.backend == "reference" else "tensorrt"


def is_reference_llmapi(repository: Path) -> bool:
    return (repository / REFERENCE_FILE).is_file()


def reference_roles(spec: PipelineSpec) -> tuple[str, ...]:
    """The checkpoints `convert` writes for a reference PyTorch-flow spec (() on the tensorrt backend)."""
    if spec.build.flow != PYTORCH or llmapi_backend(spec) != "reference":
        return ()
    return REFERENCE_ROLES.get(spec.speculative.mode, ("target",))


def reference_settings(spec: PipelineSpec) -> dict[str, Any]:
    """The side file's content: where the reference's checkpoints, tokenizer and EAGLE-3 draft are (absolute:
    the checkpoints are not copied into the repository)."""
    settings: dict[str, Any] = {
        "checkpoints": {role: str(spec.checkpoint_dir(role).resolve()) for role in reference_roles(spec)},
        "tokenizer": str(Path(spec.target.model).resolve()),
        "trust_remote_code": spec.target.trust_remote_code,
    }
    if spec.speculative.mode == "eagle3" and spec.draft is not None and spec.draft.model is not None:
        settings["eagle3_draft"] = str(Path(spec.draft.model).resolve())
    return settings
