"""The `trtllm-build` flags specbuild sets, with TensorRT-LLM 1.2's names, choices and defaults.

Source: NVIDIA/TensorRT-LLM `tensorrt_llm/commands/build.py` @65f1d153 and `tensorrt_llm/plugin/plugin.py`
@c20322ff (1.x line), and `examples/draft_target_model/README.md` @567239fc (draft-target builds). `EXPLICIT`
lists the flags passed even at their 1.2 default, because their default changed between versions (0.11-era:
paged context FMHA and FP8 context FMHA off, 64 tokens per block, `--paged_kv_cache` instead of
`--kv_cache_type`) or because an implicit default would hide a decision (`--gemm_plugin`, off unless given).
Passing them makes a plan mean the same on every 1.2.x release.
"""

from __future__ import annotations

from specbuild.contracts.engine_limits import DEFAULT_MAX_NUM_TOKENS, TOKENS_PER_BLOCK
from specbuild.contracts.images import TRTLLM_BUILD_CONTAINER

TRTLLM_VERSION = "1.2"
"""The TensorRT-LLM release line whose `trtllm-build` the plans are written for (the last one with engines)."""
CONTAINER = TRTLLM_BUILD_CONTAINER
"""NGC release container with TensorRT-LLM 1.2 (build engines here; serve them with
`contracts.images.TRITON_ENGINE_IMAGE`, the Triton image carrying the same release)."""

EXPLICIT: dict[str, str] = {
    "--max_beam_width": "1",
    "--kv_cache_type": "paged",
    "--gpt_attention_plugin": "auto",
    "--gemm_plugin": "auto",
    "--context_fmha": "enable",
    "--remove_input_padding": "enable",
    "--use_paged_context_fmha": "enable",
    "--tokens_per_block": str(TOKENS_PER_BLOCK),
}
"""Flag -> value passed on every engine. Paged context FMHA is required for KV-cache reuse, which draft-target
serving needs on both engines (examples/draft_target_model/README.md @567239fc)."""

FP8_CONTEXT_FMHA = "--use_fp8_context_fmha"
"""enable only where the checkpoint is FP8, W4A8 AWQ or NVFP4 with an FP8 KV cache (plan.FP8_CONTEXT_FMHA_QUANT):
1.2 turns it on there and off elsewhere, whatever the flag says."""

__all__ = ["CONTAINER", "DEFAULT_MAX_NUM_TOKENS", "EXPLICIT", "FP8_CONTEXT_FMHA", "TRTLLM_VERSION"]
"""DEFAULT_MAX_NUM_TOKENS and TOKENS_PER_BLOCK live in the engine-limits contract, which deploy checks too."""
