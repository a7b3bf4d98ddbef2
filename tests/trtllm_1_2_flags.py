"""`trtllm-build` flags of TensorRT-LLM 1.2, kept apart from specbuild's code so that tests can check plans
against it.

Source: NVIDIA/TensorRT-LLM `tensorrt_llm/commands/build.py` @65f1d153 and `tensorrt_llm/plugin/plugin.py`
@c20322ff (1.x line), plus `examples/draft_target_model/README.md` @567239fc (draft-target build flags).
Values: a set of allowed words, `int` for integers, `path` for a directory, and `None` for store_true flags that
take no value. Flags that 1.x removed are listed in REMOVED: passing one is an argparse error there.
"""

from __future__ import annotations

ENABLE_DISABLE = frozenset({"enable", "disable"})
PLUGIN_DTYPES = frozenset({"auto", "float16", "float32", "bfloat16", "disable"})

FLAGS: dict[str, frozenset[str] | str | None] = {
    "--checkpoint_dir": "path",
    "--output_dir": "path",
    "--max_batch_size": "int",  # default 2048
    "--max_input_len": "int",  # default 1024
    "--max_seq_len": "int",  # default: deduced from max_position_embeddings
    "--max_beam_width": "int",  # default 1
    "--max_num_tokens": "int",  # default 8192
    "--opt_num_tokens": "int",
    "--kv_cache_type": frozenset({"continuous", "paged", "disabled"}),
    "--workers": "int",  # default 1, capped at the GPU count
    "--log_level": frozenset({"internal_error", "error", "warning", "info", "verbose", "debug", "trace"}),
    "--logits_dtype": frozenset({"float16", "float32"}),
    "--gather_context_logits": None,
    "--gather_generation_logits": None,
    "--gather_all_token_logits": None,
    "--speculative_decoding_mode": frozenset(
        {"draft_tokens_external", "lookahead_decoding", "medusa", "explicit_draft_tokens", "eagle"}
    ),
    "--max_draft_len": "int",  # default 0
    "--bert_attention_plugin": PLUGIN_DTYPES,
    "--gpt_attention_plugin": PLUGIN_DTYPES,  # default auto
    "--gemm_plugin": frozenset({"auto", "float16", "float32", "bfloat16", "int32", "fp8", "nvfp4", "disable"}),
    "--context_fmha": ENABLE_DISABLE,  # default enable
    "--remove_input_padding": ENABLE_DISABLE,  # default enable
    "--tokens_per_block": "int",  # default 32 in 1.x (64 in ~0.11)
    "--use_paged_context_fmha": ENABLE_DISABLE,  # default enable in 1.x (off in ~0.11)
    "--use_fp8_context_fmha": ENABLE_DISABLE,  # default enable, auto-disabled unless FP8/W4A8_AWQ/NVFP4
    "--multiple_profiles": ENABLE_DISABLE,
    "--paged_state": ENABLE_DISABLE,
    "--use_fused_mlp": ENABLE_DISABLE,
    "--reduce_fusion": ENABLE_DISABLE,
}

REMOVED = frozenset({
    "--tp_size", "--pp_size", "--world_size", "--auto_parallel", "--cluster_key", "--gpus_per_node",
    "--use_custom_all_reduce", "--multi_block_mode", "--lookup_plugin", "--paged_kv_cache",
})
"""Not accepted by 1.x trtllm-build (`--paged_kv_cache` is deprecated in favour of `--kv_cache_type`)."""


def flag_problems(args: list[str]) -> list[str]:
    """Every flag or value in `args` that TensorRT-LLM 1.2's trtllm-build would not accept as given."""
    problems = []
    index = 0
    while index < len(args):
        flag = args[index]
        if flag in REMOVED or flag not in FLAGS:
            problems.append(f"{flag}: not a TensorRT-LLM 1.2 trtllm-build flag")
            index += 1
            continue
        kind = FLAGS[flag]
        if kind is None:
            index += 1
            continue
        value = args[index + 1] if index + 1 < len(args) else None
        if value is None or value.startswith("--"):
            problems.append(f"{flag}: needs a value")
        elif kind == "int" and not value.isdigit():
            problems.append(f"{flag} {value}: not an integer")
        elif isinstance(kind, frozenset) and value not in kind:
            problems.append(f"{flag} {value}: not one of {sorted(kind)}")
        index += 2
    return problems
