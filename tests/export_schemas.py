"""The names vLLM and SGLang accept, kept here independently of specbuild/export so the tests check the generated
commands against the engines, not against the code that wrote them. Neither engine runs here (no GPU, neither is
installed), so these tables are the contract; each names the upstream file and commit it was read from (2026-12).
When an engine renames a field, this file changes with the release and the export tests say what to fix.
"""

from __future__ import annotations

# -- vLLM ----------------------------------------------------------------------------------------------------------
VLLM_ARG_UTILS = "vllm-project/vllm:vllm/engine/arg_utils.py@99d7eb5d6a512cfcc5a2b104f24ebf2d6cda772b"
VLLM_SPECULATIVE = "vllm-project/vllm:vllm/config/speculative.py@002e77c1f0ef9b19cff8b9e21cfbd6feb3d6b443"
VLLM_QUANTIZATION = ("vllm-project/vllm:vllm/model_executor/layers/quantization/__init__.py"
                     "@05d909563e1d1ada39a13b67e7b9a4cbca1d6a8e")
VLLM_CACHE = "vllm-project/vllm:vllm/config/cache.py@c1d86421174a87056edc90a41dc9942391509e84"

VLLM_MODEL_DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")
"""ModelDType (vllm/config/model.py), the --dtype choices."""

VLLM_SERVE_OPTIONS: dict[str, object] = {
    # EngineArgs fields as `vllm serve` options (VLLM_ARG_UTILS): --kebab-case of the field name.
    "--served-model-name": str,
    "--tensor-parallel-size": int,
    "--pipeline-parallel-size": int,
    "--max-model-len": int,
    "--max-num-seqs": int,
    "--max-num-batched-tokens": int,
    "--dtype": VLLM_MODEL_DTYPES,
    "--trust-remote-code": bool,  # BooleanOptionalAction: a bare switch
    "--speculative-config": "json",  # SpeculativeConfig as JSON
}

VLLM_SPECULATIVE_METHODS = (
    "ngram", "draft_model", "suffix", "custom_class", "eagle", "eagle3",
    "extract_hidden_states", "mtp", "dflash", "ngram_gpu", "dspark",
)
"""SpeculativeMethod (VLLM_SPECULATIVE; 0.33.0 has no medusa, no mlp_speculator), without the per-model MTP
aliases."""

VLLM_QUANTIZATION_METHODS_USED = ("fp8", "modelopt")
"""The members of QuantizationMethods (VLLM_QUANTIZATION) an export may pass: "fp8" (Fp8Config, which quantizes an
unquantized checkpoint while loading) and "modelopt" (ModelOptFp8Config, a ModelOpt checkpoint)."""

VLLM_MODELOPT = ("vllm-project/vllm:vllm/model_executor/layers/quantization/modelopt.py"
                 "@00155cdecca722d98e34234c3d172725b7720b7d")
VLLM_MODEL_CONFIG = "vllm-project/vllm:vllm/config/model.py@0052a5b818980ce8a0477706aaf9f75bd5af72cd"
VLLM_MODELOPT_QUANT_ALGOS = ("FP8", "FP8_PER_CHANNEL_PER_TOKEN", "FP8_PB_WO", "NVFP4", "W4A16_NVFP4", "MXFP8",
                             "MIXED_PRECISION")
"""QUANT_ALGOS (VLLM_MODELOPT): the quant_algos vLLM's ModelOpt loader reads; from_config raises "ModelOpt currently
only supports ..." for any other (W8A16, W4A16_AWQ, W4A8_AWQ, W8A8_SQ_PER_CHANNEL among them)."""
VLLM_MODELOPT_NAME = "modelopt"
"""ModelOptFp8Config.get_name and override_quantization_method's answer for quant_method modelopt + quant_algo FP8
(VLLM_MODELOPT): the draft's `quantization` VLLM_MODEL_CONFIG's _verify_quantization then finds equal to the
checkpoint's (a different value is "Quantization method specified in the model config ... does not match")."""
VLLM_CACHE_DTYPES = ("auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla")
"""CacheDType (VLLM_CACHE)."""

VLLM_SPECULATIVE_FIELDS: dict[str, object] = {
    # SpeculativeConfig fields (VLLM_SPECULATIVE) and what each takes.
    "method": VLLM_SPECULATIVE_METHODS,
    "model": str,
    "num_speculative_tokens": int,  # gt=0
    "draft_tensor_parallel_size": int,
    "quantization": VLLM_QUANTIZATION_METHODS_USED,
    "kv_cache_dtype": VLLM_CACHE_DTYPES,
    "max_model_len": int,
    "prompt_lookup_max": int,
    "prompt_lookup_min": int,
    "draft_sample_method": ("greedy", "probabilistic"),
    "rejection_sample_method": ("standard", "synthetic", "block"),
}

# -- SGLang --------------------------------------------------------------------------------------------------------
SGLANG_SPECULATIVE_DOCS = ("sgl-project/sglang:docs/advanced_features/speculative_decoding.md"
                           "@fc6d465375b9e4e49d32cd9ea24024a355125435")
SGLANG_SERVER_ARGS = ("sgl-project/sglang:docs/advanced_features/server_arguments.md"
                      "@b36e8e198b71553316b55bce53de6ecf9b3a9a47")

SGLANG_ALGORITHMS = ("EAGLE", "EAGLE3", "STANDALONE", "NGRAM", "NEXTN")
"""--speculative-algorithm (SGLANG_SPECULATIVE_DOCS, Full Parameter Reference). No MEDUSA."""
SGLANG_DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")
SGLANG_QUANTIZATION = ("awq", "fp8", "gptq", "marlin", "gptq_marlin", "awq_marlin", "bitsandbytes", "gguf", "modelopt",
                       "modelopt_fp4", "petit_nvfp4", "w8a8_int8", "w8a8_fp8", "moe_wna16", "qoq", "w4afp8", "mxfp4")
"""--quantization choices (SGLANG_SERVER_ARGS); --speculative-draft-model-quantization also takes "unquant"."""

SGLANG_MODELOPT = ("sgl-project/sglang:python/sglang/srt/layers/quantization/modelopt_quant.py"
                   "@faeb96856c4417d55695feec2f4d2463c8adb7fd")
SGLANG_MODEL_CONFIG = ("sgl-project/sglang:python/sglang/srt/configs/model_config.py"
                       "@001adf564fd332c285397a46a034ee2f93ba7515")
SGLANG_MODELOPT_QUANT_ALGOS = ("FP8", "NVFP4")
"""SGLANG_MODELOPT: ModelOptFp8Config takes a quant_algo containing FP8, ModelOptFp4Config "only supports: FP8,
NVFP4"; SGLANG_MODEL_CONFIG `_parse_modelopt_quant_config` maps nothing else of ModelOpt's to a method."""
SGLANG_MODELOPT_NAME = "modelopt"
"""The --speculative-draft-model-quantization value for a ModelOpt checkpoint: one of SGLANG_QUANTIZATION, and on an
FP8 checkpoint ModelOptFp8Config.override_quantization_method turns it into modelopt_fp8 (SGLANG_MODELOPT)."""

MODELOPT_QUANT_METHOD = "modelopt"
"""config.json quantization_config.quant_method by which both engines recognise a ModelOpt checkpoint
(VLLM_MODEL_CONFIG `_verify_quantization` with ModelOptFp8Config's override; SGLANG_MODEL_CONFIG
`_parse_quant_hf_config`); tests/hf_quant_schema.py `quantization_config` is what ModelOpt 0.47 writes there."""

SGLANG_OPTIONS: dict[str, object] = {
    # SGLANG_SERVER_ARGS
    "--model-path": str,
    "--served-model-name": str,
    "--tp-size": int,
    "--pp-size": int,
    "--context-length": int,
    "--max-running-requests": int,
    "--dtype": SGLANG_DTYPES,
    "--trust-remote-code": bool,  # store_true
    # SGLANG_SPECULATIVE_DOCS
    "--speculative-algorithm": SGLANG_ALGORITHMS,
    "--speculative-draft-model-path": str,
    "--speculative-num-steps": int,
    "--speculative-eagle-topk": int,
    "--speculative-num-draft-tokens": int,
    "--speculative-draft-model-quantization": (*SGLANG_QUANTIZATION, "unquant"),
    # sgl-project/sglang:python/sglang/srt/arg_groups/fields/spec.py@015c872628e3 (0.5.23's n-gram options)
    "--speculative-ngram-min-bfs-breadth": int,
    "--speculative-ngram-max-bfs-breadth": int,
    "--speculative-ngram-max-trie-depth": int,
}
