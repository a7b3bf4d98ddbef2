"""Build plans: one typed object per engine that renders to the exact `trtllm-build` argument list.

The plan is computed from the spec and the checkpoint's config only; the same plan drives the tensorrt
backend, `--dry-run`'s build.sh, the reference bundle's `engine.json`, and the manifest that decides whether an
engine is up to date. Sizes follow TensorRT-LLM 1.2's builder (shared/reference/tensorrt-llm.md §2.3): with a
speculative mode it adds `max_draft_len` to `--max_seq_len` itself, so the plan passes prompt + output and
records the engine's resulting limit separately.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from specbuild.build.checkpoints import CheckpointFacts
from specbuild.build.trtllm_flags import DEFAULT_MAX_NUM_TOKENS, EXPLICIT, FP8_CONTEXT_FMHA
from specbuild.contracts.engine_info import EngineInfo, engine_dir, engine_roles
from specbuild.spec import PipelineSpec

SPECULATIVE_MODE = {"draft_target": "draft_tokens_external", "medusa": "medusa"}
TOKENS_PER_BLOCK = int(EXPLICIT["--tokens_per_block"])
FP8_CONTEXT_FMHA_QUANT = ("FP8", "W4A8_AWQ", "NVFP4")
"""quant_algo values whose engines may use FP8 context FMHA. With paged context FMHA on (always, here),
TensorRT-LLM 1.2's `build()` turns `use_fp8_context_fmha` on for these exactly when the KV cache is FP8 ("FP8
Context FMHA is enabled to support FP8 Paged Context FMHA.") and off otherwise, whatever the flag says
(NVIDIA/TensorRT-LLM tensorrt_llm/builder.py `build()` @73c0d691, "Logics to control paged_context_fmha and
fp8_context_fmha"); the plan asks for what the engine will get."""


@dataclass(frozen=True)
class BuildPlan:
    """Everything `trtllm-build` is told for one engine (target, draft or medusa)."""

    role: str
    checkpoint_dir: Path
    output_dir: Path
    max_batch_size: int
    max_input_len: int
    max_seq_len: int
    """What `--max_seq_len` says: prompt + generated tokens. The engine adds `max_draft_len` to it."""
    max_num_tokens: int
    speculative_decoding_mode: str = "none"
    max_draft_len: int = 0
    gather_generation_logits: bool = False
    gather_context_logits: bool = False
    fp8_context_fmha: bool = False
    workers: int = 1
    medusa_choices: list[list[int]] | None = field(default=None, hash=False)
    """Not a build flag: the tree the Medusa engine is served with (deploy writes it into config.pbtxt)."""

    @property
    def engine_max_seq_len(self) -> int:
        """The engine's own limit: 1.2's builder adds max_draft_len under any speculative mode (§2.3)."""
        return self.max_seq_len + (self.max_draft_len if self.speculative_decoding_mode != "none" else 0)

    def args(self, *, output_dir: Path | None = None) -> list[str]:
        """The `trtllm-build` arguments (TensorRT-LLM 1.2 names), in a stable order."""
        args = [
            "--checkpoint_dir", str(self.checkpoint_dir),
            "--output_dir", str(output_dir if output_dir is not None else self.output_dir),
            "--max_batch_size", str(self.max_batch_size),
            "--max_input_len", str(self.max_input_len),
            "--max_seq_len", str(self.max_seq_len),
            "--max_num_tokens", str(self.max_num_tokens),
        ]
        for flag, value in EXPLICIT.items():
            args += [flag, value]
        args += [FP8_CONTEXT_FMHA, "enable" if self.fp8_context_fmha else "disable"]
        if self.speculative_decoding_mode != "none":
            args += ["--speculative_decoding_mode", self.speculative_decoding_mode]
            args += ["--max_draft_len", str(self.max_draft_len)]
        if self.gather_generation_logits:
            args.append("--gather_generation_logits")
        if self.gather_context_logits:
            args.append("--gather_context_logits")
        args += ["--workers", str(self.workers)]
        return args

    def command(self, *, output_dir: Path | None = None) -> list[str]:
        return ["trtllm-build", *self.args(output_dir=output_dir)]

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["checkpoint_dir"], data["output_dir"] = str(self.checkpoint_dir), str(self.output_dir)
        return data

    def engine_info(self, facts: CheckpointFacts, backend: str) -> EngineInfo:
        """What deploy reads back: the plan's limits and the checkpoint's model facts."""
        return EngineInfo(
            role=self.role,  # type: ignore[arg-type]
            backend=backend,  # type: ignore[arg-type]
            architecture=facts.architecture,
            dtype=facts.dtype,
            vocab_size=facts.vocab_size,
            tp_size=facts.tp_size,
            pp_size=facts.pp_size,
            max_batch_size=self.max_batch_size,
            max_input_len=self.max_input_len,
            max_seq_len=self.engine_max_seq_len,
            max_num_tokens=self.max_num_tokens,
            speculative_decoding_mode=self.speculative_decoding_mode,  # type: ignore[arg-type]
            max_draft_len=self.max_draft_len,
            medusa_choices=self.medusa_choices,
            gather_generation_logits=self.gather_generation_logits,
            gather_context_logits=self.gather_context_logits,
            quant_algo=facts.quant_algo,
            kv_cache_quant_algo=facts.kv_cache_quant_algo,
            max_attention_window_size=attention_window(self, facts),
        )


def attention_window(plan: BuildPlan, facts: CheckpointFacts) -> int | None:
    """The window the runtime must apply: the checkpoint's sliding window where it is shorter than the engine's
    sequences. trtllm-build has no window flag; TensorRT-LLM applies it at run time as max_attention_window_size,
    which "regulates both sliding window attention in the context phase and rolling buffer cache in the generation
    phase" (NVIDIA/TensorRT-LLM examples/models/core/llama/README.md, Mistral v0.1, @076efc2b)."""
    window = facts.sliding_window
    return window if window is not None and window < plan.engine_max_seq_len else None


SPEC_FORMAT_ALGOS = {"fp8": "FP8", "int8_sq": "W8A8_SQ_PER_CHANNEL", "int8_wo": "W8A16", "int4_awq": "W4A16_AWQ",
                     "w4a8_awq": "W4A8_AWQ"}
"""draft.quantization.format -> the quant_algo its checkpoint carries (specbuild/convert/quantize.py FORMATS)."""


def stale_engine_problems(spec: PipelineSpec, role: str, info: EngineInfo,
                          facts: CheckpointFacts | None = None) -> list[str]:
    """Where a built engine (its engine.json) is not what the spec asks for now: every setting the engine's build
    depends on that the spec decides, and, given the converted checkpoint's `facts`, the attention window it
    carries. Empty when the engine is current."""
    plan = plan_engine(spec, role, facts)
    build = spec.build
    want: list[tuple[str, object, object]] = [
        ("build.tp_size", info.tp_size, build.tp_size),
        ("build.pp_size", info.pp_size, build.pp_size),
        ("build.max_batch_size", info.max_batch_size, plan.max_batch_size),
        ("max_input_len (build.max_input_len)", info.max_input_len, plan.max_input_len),
        ("max_seq_len (build.max_input_len + max_output_len + draft length)", info.max_seq_len,
         plan.engine_max_seq_len),
        ("build.max_num_tokens", info.max_num_tokens, plan.max_num_tokens),
        ("speculative decoding mode (speculative.mode)", info.speculative_decoding_mode,
         plan.speculative_decoding_mode),
        ("max_draft_len (speculative.max_draft_len / num_draft_tokens / the Medusa tree)", info.max_draft_len,
         plan.max_draft_len),
        ("medusa.choices", info.medusa_choices, plan.medusa_choices),
        ("gather_generation_logits (speculative.use_draft_logits)", info.gather_generation_logits,
         plan.gather_generation_logits),
        ("build.gather_context_logits", info.gather_context_logits, plan.gather_context_logits),
    ]
    # Not the backend: `specbuild build --backend` overrides build.backend, and engines built elsewhere are fine.
    if build.dtype != "auto" and info.dtype != build.dtype:
        quantized_half = (info.quant_algo or info.kv_cache_quant_algo) and build.dtype == "float32" and (
            info.dtype in ("float16", "bfloat16"))  # ModelOpt exports half precision only
        if not quantized_half:
            want.append(("build.dtype", info.dtype, build.dtype))
    if role == "draft" and spec.draft is not None:
        quant = spec.draft.quantization
        want.append(("draft.quantization.format", info.quant_algo, SPEC_FORMAT_ALGOS.get(quant.format)))
        want.append(("draft.quantization.kv_cache", info.kv_cache_quant_algo,
                     "FP8" if quant.kv_cache == "fp8" else None))
    problems = [f"{name}: the engine was built with {_show(old)}, the spec now says {_show(new)}"
                for name, old, new in want if old != new]
    if facts is not None and info.max_attention_window_size != attention_window(plan, facts):
        problems.append(f"max_attention_window_size: the engine says {_show(info.max_attention_window_size)}, the "
                        f"checkpoint's sliding_window makes it {_show(attention_window(plan, facts))}")
    return problems


def _show(value: object) -> str:
    if isinstance(value, list) and len(value) > 6:
        return f"a {len(value)}-node tree"
    return "none" if value is None else str(value)


def engine_max_draft_len(spec: PipelineSpec) -> int:
    """The draft tokens the engine can verify per step: `speculative.max_draft_len`, else K or the tree size."""
    return spec.speculative.max_draft_len or spec.max_draft_len


def default_max_num_tokens(batch: int, input_len: int, draft_len: int) -> int:
    """Room for a whole prompt (no chunked context needed) and for batch x (draft + 1) verification tokens,
    capped at trtllm-build's own default of 8192 unless those two need more; never below tokens_per_block,
    which TensorRT-LLM 1.2 raises it to anyway (`check_max_num_tokens`, tensorrt_llm/_common.py @0fccc5b9)."""
    return max(min(batch * input_len, DEFAULT_MAX_NUM_TOKENS), input_len, batch * (draft_len + 1), TOKENS_PER_BLOCK)


def plan_engine(spec: PipelineSpec, role: str, facts: CheckpointFacts | None) -> BuildPlan:
    """The plan for one engine of `spec`; `facts` (the converted checkpoint) decide the FP8 context FMHA."""
    build, speculative = spec.build, spec.speculative
    draft_len = engine_max_draft_len(spec) if role in ("target", "medusa") and speculative.mode != "none" else 0
    input_len, seq_len = build.max_input_len, build.max_seq_len
    if speculative.mode == "draft_target":
        # Triton's BLS sends the whole sequence so far (prompt + accepted tokens) to both engines every round
        # (triton-backend.md §2.1), so either engine's "prompt" can grow to all but the last token.
        input_len = seq_len - 1
    max_num_tokens = build.max_num_tokens or default_max_num_tokens(build.max_batch_size, input_len, draft_len)
    fp8 = facts is not None and facts.quant_algo in FP8_CONTEXT_FMHA_QUANT and facts.kv_cache_quant_algo == "FP8"
    medusa_choices = spec.medusa.resolved_choices() if role == "medusa" and spec.medusa is not None else None
    return BuildPlan(
        role=role,
        checkpoint_dir=spec.checkpoint_dir(role),
        output_dir=engine_dir(spec, role),
        max_batch_size=build.max_batch_size,
        max_input_len=input_len,
        max_seq_len=seq_len,
        max_num_tokens=max_num_tokens,
        speculative_decoding_mode=SPECULATIVE_MODE[speculative.mode] if draft_len else "none",
        max_draft_len=draft_len,
        gather_generation_logits=speculative.mode == "draft_target" and speculative.use_draft_logits,
        gather_context_logits=build.gather_context_logits,
        fp8_context_fmha=fp8,
        workers=build.world_size,
        medusa_choices=medusa_choices,
    )


def plan_pipeline(spec: PipelineSpec, facts: dict[str, CheckpointFacts | None]) -> list[BuildPlan]:
    """One plan per engine the spec's mode needs (target; target + draft; or the single Medusa engine)."""
    return [plan_engine(spec, role, facts.get(role)) for role in engine_roles(spec)]
