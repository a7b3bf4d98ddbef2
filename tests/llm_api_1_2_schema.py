"""TensorRT-LLM 1.2's LLM-API, llmapi-model and trtllm-serve schema, kept here to check what specbuild writes.

TensorRT-LLM does not install on this machine (no GPU, no wheel), so the generated model.yaml, trtllm-serve options
and config.pbtxt are checked field by field against this table, written down from the upstream files, not from
specbuild.contracts.llm_api (a shared mistake would pass both otherwise):
- NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/llm_args.py, 1.2 line (commit 195839a7; tag v1.2.0): DecodingBaseConfig
  and the decoding configs' fields and types, from_dict's
  decoding_type keys, supports_backend; BaseLlmArgs fields.
- NVIDIA/TensorRT-LLM tensorrt_llm/commands/serve.py, 1.2 line (commit 195839a7): trtllm-serve's options.
- NVIDIA/TensorRT-LLM triton_backend/all_models/llmapi/tensorrt_llm/config.pbtxt @0a710573 and 1/model.yaml
  @0ebb1536: the llmapi model's tensors and its model.yaml keys.
"""

from __future__ import annotations

INT, BOOL, STR, FLOAT = int, bool, str, float

LLM_ARGS: dict[str, type | tuple[type, ...]] = {
    "model": STR,
    "backend": STR,  # Optional[str]; TorchLlmArgs runs it as "pytorch"
    "tensor_parallel_size": INT,
    "pipeline_parallel_size": INT,
    "max_batch_size": INT,
    "max_seq_len": INT,
    "max_num_tokens": INT,
    "max_input_len": INT,
    "speculative_config": dict,
    "trust_remote_code": BOOL,
    "dtype": STR,  # default "auto": the checkpoint's dtype
    # BaseLlmArgs fields (status prototype) that trtllm-serve's openai_server.py reads (@00057725: keep each finished
    # request's perf metrics, serve them at GET /perf_metrics). Not read at the v1.2.0 tag itself: read in two
    # llm_args.py versions that still have MedusaDecodingConfig (so before 1.3; search-index ids 1090804222 and
    # 7019226376, which name no commit), and NVIDIA's Dynamo 0.7 docs describe TensorRT-LLM 1.1.0rc5's
    # RequestPerfMetrics.
    "return_perf_metrics": BOOL,
    "perf_metrics_max_requests": INT,
}
"""BaseLlmArgs fields (and the LLM constructor's trust_remote_code) with the YAML type of their values."""

DECODING_BASE: dict[str, type | tuple[type, ...]] = {
    "max_draft_len": INT,
    "max_total_draft_tokens": INT,
    "speculative_model": STR,
    "speculative_model_dir": STR,  # validation alias of speculative_model
    "max_concurrency": INT,
    "draft_len_schedule": dict,
    "load_format": STR,
    "acceptance_window": INT,
    "acceptance_length_threshold": FLOAT,
    "allow_advanced_sampling": BOOL,
}

DECODING_CONFIGS: dict[str, dict[str, type | tuple[type, ...]]] = {
    # decoding_type (DecodingBaseConfig.from_dict's key) -> the config's own fields
    "DraftTarget": {},
    "Eagle": {
        "eagle_choices": list, "greedy_sampling": BOOL, "posterior_threshold": FLOAT, "use_dynamic_tree": BOOL,
        "dynamic_tree_max_topK": INT, "num_eagle_layers": INT, "max_non_leaves_per_layer": INT,
        "eagle3_one_model": BOOL, "eagle3_layers_to_capture": list, "eagle3_model_arch": STR,
    },
    "NGram": {"max_matching_ngram_size": INT, "is_keep_all": BOOL, "is_use_oldest": BOOL, "is_public_pool": BOOL},
    "Medusa": {"medusa_choices": list, "num_medusa_heads": INT},
    "Lookahead": {"max_window_size": INT, "max_ngram_size": INT, "max_verification_set_size": INT},
}

SUPPORTS_PYTORCH = {"DraftTarget": True, "Eagle": True, "NGram": True, "Medusa": False, "Lookahead": False}
"""`supports_backend("pytorch")` of each config: Medusa and Lookahead return `backend not in ("pytorch",
"_autodeploy")`; NGram `backend == "pytorch"`; DraftTarget `backend == "pytorch" or backend == "_autodeploy"`;
EagleDecodingConfig keeps the base class's True."""
REQUIRES_DRAFT_MODEL = {"Eagle"}
"""EagleDecodingConfig validates 'Draft model must be provided for EAGLE' (speculative_model)."""

MODEL_YAML_TRITON_CONFIG = {"max_batch_size": INT, "decoupled": BOOL}
"""model.yaml `triton_config`: model.py reads `decoupled` and `max_batch_size` (auto_complete_config) and an
optional `cancellation_check_period_ms`; every other top-level key is passed to `LLM(**args)`."""
MODEL_YAML_TRITON_MAX_BATCH_SIZE = 0

SERVE_OPTIONS: dict[str, type | None] = {
    "--host": STR, "--port": INT, "--backend": STR, "--tp_size": INT, "--tensor_parallel_size": INT,
    "--pp_size": INT, "--pipeline_parallel_size": INT, "--max_batch_size": INT, "--max_num_tokens": INT,
    "--max_seq_len": INT, "--trust_remote_code": None, "--extra_llm_api_options": STR, "--config": STR,
    "--tokenizer": STR, "--log_level": STR, "--max_beam_width": INT, "--kv_cache_free_gpu_memory_fraction": FLOAT,
}
"""trtllm-serve options (None: a flag without a value)."""
SERVE_BACKENDS = ("pytorch", "tensorrt", "_autodeploy")

LLMAPI_INPUTS: dict[str, tuple[str, tuple[int, ...], bool]] = {
    "text_input": ("TYPE_STRING", (-1,), False),
    "image_url": ("TYPE_STRING", (-1,), True),
    "streaming": ("TYPE_BOOL", (1,), True),
    "sampling_param_best_of": ("TYPE_INT32", (1,), True),
    "sampling_param_temperature": ("TYPE_FP32", (1,), True),
    "sampling_param_top_k": ("TYPE_INT32", (1,), True),
    "sampling_param_top_p": ("TYPE_FP32", (1,), True),
    "sampling_param_frequency_penalty": ("TYPE_FP32", (1,), True),
    "sampling_param_presence_penalty": ("TYPE_FP32", (1,), True),
    "sampling_param_max_tokens": ("TYPE_INT32", (1,), True),
    "sampling_param_stop": ("TYPE_STRING", (-1,), True),
    "sampling_param_seed": ("TYPE_UINT64", (1,), True),
    "sampling_param_exclude_input_from_output": ("TYPE_BOOL", (1,), True),
    "sampling_param_return_perf_metrics": ("TYPE_BOOL", (1,), True),
    "return_finish_reason": ("TYPE_BOOL", (1,), True),
    "return_stop_reason": ("TYPE_BOOL", (1,), True),
    "return_cumulative_logprob": ("TYPE_BOOL", (1,), True),
    "stop": ("TYPE_BOOL", (1,), True),
    "lora_id": ("TYPE_UINT64", (1,), True),
    "lora_name": ("TYPE_STRING", (1,), True),
    "lora_path": ("TYPE_STRING", (1,), True),
    "lora_ckpt_source": ("TYPE_STRING", (1,), True),
}
LLMAPI_OUTPUTS: dict[str, tuple[str, tuple[int, ...]]] = {
    "text_output": ("TYPE_STRING", (-1,)),
    "finish_reason": ("TYPE_STRING", (-1,)),
    "stop_reason": ("TYPE_STRING", (-1,)),
    "cumulative_logprob": ("TYPE_FP32", (-1,)),
    "kv_cache_reused_block": ("TYPE_INT32", (-1,)),
    "kv_cache_missed_block": ("TYPE_INT32", (-1,)),
    "kv_cache_alloc_new_blocks": ("TYPE_INT32", (-1,)),
    "kv_cache_alloc_total_blocks": ("TYPE_INT32", (-1,)),
    "kv_cache_hit_rate": ("TYPE_FP32", (-1,)),
    "arrival_time_ns": ("TYPE_INT64", (1,)),
    "first_scheduled_time_ns": ("TYPE_INT64", (1,)),
    "first_token_time_ns": ("TYPE_INT64", (1,)),
    "last_token_time_ns": ("TYPE_INT64", (1,)),
    "acceptance_rate": ("TYPE_FP32", (1,)),
    "total_accepted_draft_tokens": ("TYPE_INT32", (1,)),
    "total_draft_tokens": ("TYPE_INT32", (1,)),
}
LLMAPI_CONFIG = {"name": "tensorrt_llm", "backend": "python", "instance_kind": "KIND_CPU"}
"""config.pbtxt header; max_batch_size and model_transaction_policy are left to model.yaml ('Please don't add it
in config.pbtxt')."""
