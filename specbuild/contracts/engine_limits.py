"""What a spec asks of each engine, and whether a built engine still is that.

`build` plans every engine from these limits (`build.plan.plan_engine` adds only what `trtllm-build` needs besides)
and records them in `engine.json`; `deploy` recomputes them from the spec and refuses engines whose `engine.json`
says otherwise (`stale_engine_problems`), so a setting changed without a rebuild is named rather than served.
One rule for both sides: neither stage imports the other.

Sizes follow TensorRT-LLM 1.2's builder (NVIDIA/TensorRT-LLM `tensorrt_llm/builder.py` `build()` @008b2b8d): with a
speculative mode it adds `max_draft_len` to `--max_seq_len` itself, so the plan passes prompt + output and
records the engine's resulting limit separately.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specbuild.contracts import lookahead as la
from specbuild.contracts.checkpoint_facts import CheckpointFacts
from specbuild.contracts.engine_info import EngineInfo
from specbuild.contracts.quant_formats import kv_cache_quant_algo, quant_algo
from specbuild.dtypes import quantized_export_dtype
from specbuild.spec import PipelineSpec

SPECULATIVE_MODE = {"draft_target": "draft_tokens_external", "medusa": "medusa", "lookahead": la.BUILD_MODE}
"""spec speculative.mode -> trtllm-build --speculative_decoding_mode (lookahead: examples/lookahead/README.md)."""
TOKENS_PER_BLOCK = 32
"""The KV-cache block size every engine is built with (`build.trtllm_flags.EXPLICIT` passes it as
`--tokens_per_block`): the floor TensorRT-LLM 1.2 raises max_num_tokens to."""
DEFAULT_MAX_NUM_TOKENS = 8192
"""`--max_num_tokens` default of trtllm-build 1.2 (NVIDIA/TensorRT-LLM `tensorrt_llm/commands/build.py`);
specbuild's own default stays at or below it where it can."""


def engine_max_seq_len(max_seq_len: int, speculative_decoding_mode: str, max_draft_len: int) -> int:
    """The engine's own limit: 1.2's builder adds max_draft_len to `--max_seq_len` under any speculative mode."""
    return max_seq_len + (max_draft_len if speculative_decoding_mode != "none" else 0)


@dataclass(frozen=True)
class EngineLimits:
    """The limits and speculative settings the spec gives one engine (what its `engine.json` must record)."""

    role: str
    max_batch_size: int
    max_input_len: int
    max_seq_len: int
    """What `--max_seq_len` says: prompt + generated tokens. The engine adds `max_draft_len` to it."""
    max_num_tokens: int
    speculative_decoding_mode: str = "none"
    max_draft_len: int = 0
    gather_generation_logits: bool = False
    gather_context_logits: bool = False
    medusa_choices: list[list[int]] | None = field(default=None, hash=False)
    lookahead_config: list[int] | None = field(default=None, hash=False)
    """[W, N, G] for a lookahead_decoding engine (its max_draft_len is theirs)."""

    @property
    def engine_max_seq_len(self) -> int:
        return engine_max_seq_len(self.max_seq_len, self.speculative_decoding_mode, self.max_draft_len)


def engine_max_draft_len(spec: PipelineSpec) -> int:
    """The draft tokens the engine can verify per step: `speculative.max_draft_len`, else K or the tree size."""
    return spec.speculative.max_draft_len or spec.full_draft_len


def verification_tokens(batch: int, draft_len: int) -> int:
    """Tokens one verification step of a full batch feeds the engine, batch x (draft + 1): TensorRT-LLM 1.2's
    build() raises max_num_tokens to at least this under any speculative mode (NVIDIA/TensorRT-LLM
    tensorrt_llm/builder.py @73c0d691), so `build` refuses a smaller build.max_num_tokens."""
    return batch * (draft_len + 1)


def default_max_num_tokens(batch: int, input_len: int, draft_len: int) -> int:
    """Room for a whole prompt (no chunked context needed) and for batch x (draft + 1) verification tokens,
    capped at trtllm-build's own default of 8192 unless those two need more; never below tokens_per_block,
    which TensorRT-LLM 1.2 raises it to anyway (`check_max_num_tokens`, tensorrt_llm/_common.py @0fccc5b9)."""
    return max(min(batch * input_len, DEFAULT_MAX_NUM_TOKENS), input_len, verification_tokens(batch, draft_len),
               TOKENS_PER_BLOCK)


def engine_limits(spec: PipelineSpec, role: str) -> EngineLimits:
    """The limits of `spec`'s engine for `role` (target, draft or medusa)."""
    build, speculative = spec.build, spec.speculative
    draft_len = engine_max_draft_len(spec) if role in ("target", "medusa") and speculative.mode != "none" else 0
    input_len, seq_len = build.max_input_len, build.max_seq_len
    if speculative.mode == "draft_target":
        # Triton's BLS sends the whole sequence so far (prompt + accepted tokens) to both engines every round
        # (triton-inference-server/tensorrtllm_backend all_models/inflight_batcher_llm/tensorrt_llm_bls/1/lib/
        # decode.py `_spec_generate` @c2e65b8), so either engine's "prompt" can grow to all but the last token.
        input_len = seq_len - 1
    max_num_tokens = build.max_num_tokens or default_max_num_tokens(build.max_batch_size, input_len, draft_len)
    medusa_choices = spec.medusa.resolved_choices() if role == "medusa" and spec.medusa is not None else None
    lookahead = list(speculative.lookahead_config().config) if speculative.mode == "lookahead" else None
    return EngineLimits(
        role=role,
        max_batch_size=build.max_batch_size,
        max_input_len=input_len,
        max_seq_len=seq_len,
        max_num_tokens=max_num_tokens,
        speculative_decoding_mode=SPECULATIVE_MODE[speculative.mode] if draft_len else "none",
        max_draft_len=draft_len,
        gather_generation_logits=speculative.mode == "draft_target" and speculative.use_draft_logits,
        gather_context_logits=build.gather_context_logits,
        medusa_choices=medusa_choices,
        lookahead_config=lookahead,
    )


def attention_window(engine_max_seq_len: int, facts: CheckpointFacts) -> int | list[int] | None:
    """The window the runtime must apply: the checkpoint's sliding window where it is shorter than the engine's
    sequences. trtllm-build has no window flag; TensorRT-LLM applies it at run time as max_attention_window_size,
    which "regulates both sliding window attention in the context phase and rolling buffer cache in the generation
    phase" (NVIDIA/TensorRT-LLM examples/models/core/llama/README.md, Mistral v0.1, @076efc2b). Gemma's alternating
    layers get one period of per-layer windows, which the runtime repeats over the layers: "512 512 512 512 512
    3100" for gemma-3-1b (examples/models/core/gemma/README.md @b35ac1b6)."""
    if facts.local_window is not None:
        window, pattern = facts.local_window
        return [window] * (pattern - 1) + [engine_max_seq_len] if window < engine_max_seq_len else None
    window = facts.sliding_window
    return window if window is not None and window < engine_max_seq_len else None


def stale_engine_problems(spec: PipelineSpec, role: str, info: EngineInfo,
                          facts: CheckpointFacts | None = None) -> list[str]:
    """Where a built engine (its engine.json) is not what the spec asks for now: every setting the engine's build
    depends on that the spec decides, and, given the converted checkpoint's `facts`, the attention window it
    carries. Empty when the engine is current."""
    limits = engine_limits(spec, role)
    build = spec.build
    want: list[tuple[str, object, object]] = [
        ("build.tp_size", info.tp_size, build.tp_size),
        ("build.pp_size", info.pp_size, build.pp_size),
        ("build.max_batch_size", info.max_batch_size, limits.max_batch_size),
        ("max_input_len (build.max_input_len)", info.max_input_len, limits.max_input_len),
        ("max_seq_len (build.max_input_len + max_output_len + draft length)", info.max_seq_len,
         limits.engine_max_seq_len),
        ("build.max_num_tokens", info.max_num_tokens, limits.max_num_tokens),
        ("speculative decoding mode (speculative.mode)", info.speculative_decoding_mode,
         limits.speculative_decoding_mode),
        ("max_draft_len (speculative.max_draft_len / num_draft_tokens / the Medusa tree)", info.max_draft_len,
         limits.max_draft_len),
        ("medusa.choices", info.medusa_choices, limits.medusa_choices),
        ("speculative.lookahead [W, N, G]", info.lookahead_config, limits.lookahead_config),
        ("gather_generation_logits (speculative.use_draft_logits)", info.gather_generation_logits,
         limits.gather_generation_logits),
        ("build.gather_context_logits", info.gather_context_logits, limits.gather_context_logits),
    ]
    # Not the backend: `specbuild build --backend` overrides build.backend, and engines built elsewhere are fine.
    if build.dtype != "auto" and info.dtype != build.dtype:
        quantized = bool(info.quant_algo or info.kv_cache_quant_algo)
        if not quantized_export_dtype(build.dtype, info.dtype, quantized=quantized):
            want.append(("build.dtype", info.dtype, build.dtype))
    if role == "draft" and spec.draft is not None:
        quant = spec.draft.quantization
        want.append(("draft.quantization.format", info.quant_algo, quant_algo(quant.format)))
        want.append(("draft.quantization.kv_cache", info.kv_cache_quant_algo, kv_cache_quant_algo(quant.kv_cache)))
    problems = [f"{name}: the engine was built with {_show(old)}, the spec now says {_show(new)}"
                for name, old, new in want if old != new]
    window = attention_window(limits.engine_max_seq_len, facts) if facts is not None else None
    if facts is not None and info.max_attention_window_size != window:
        problems.append(f"max_attention_window_size: the engine says {_show(info.max_attention_window_size)}, the "
                        f"checkpoint's attention windows make it {_show(window)}")
    return problems


def _show(value: object) -> str:
    """An engine.json fact as the stale-engine messages name it: bare (`float16`, `FP8`, `none` for null) and a
    Medusa tree by its size. Not spec.problems.show, which quotes strings and says `null` because it echoes what
    the user wrote in YAML; both sides here are engine facts (quant_algo, decoding mode), not YAML."""
    if isinstance(value, list) and len(value) > 6:
        return f"a {len(value)}-node tree"
    return "none" if value is None else str(value)
