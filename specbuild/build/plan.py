"""Build plans: one typed object per engine that renders to the exact `trtllm-build` argument list.

The plan is computed from the spec and the checkpoint's config only; the same plan drives the tensorrt
backend, `--dry-run`'s build.sh, the reference bundle's `engine.json`, and the manifest that decides whether an
engine is up to date. Its limits are the spec's (`specbuild.contracts.engine_limits`, which `deploy` checks
engine.json against); the plan adds what only `trtllm-build` needs (paths, FP8 context FMHA, workers).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from specbuild.build.trtllm_flags import EXPLICIT, FP8_CONTEXT_FMHA
from specbuild.contracts.checkpoint_facts import CheckpointFacts
from specbuild.contracts.engine_info import EngineInfo, engine_dir, engine_roles
from specbuild.contracts.engine_limits import EngineLimits, attention_window, engine_limits
from specbuild.spec import PipelineSpec

FP8_CONTEXT_FMHA_QUANT = ("FP8", "W4A8_AWQ", "NVFP4")
"""quant_algo values whose engines may use FP8 context FMHA. With paged context FMHA on (always, here),
TensorRT-LLM 1.2's `build()` turns `use_fp8_context_fmha` on for these exactly when the KV cache is FP8 ("FP8
Context FMHA is enabled to support FP8 Paged Context FMHA.") and off otherwise, whatever the flag says
(NVIDIA/TensorRT-LLM tensorrt_llm/builder.py `build()` @73c0d691, "Logics to control paged_context_fmha and
fp8_context_fmha"); the plan asks for what the engine will get."""


@dataclass(frozen=True, kw_only=True)
class BuildPlan(EngineLimits):
    """Everything `trtllm-build` is told for one engine (target, draft or medusa): the spec's limits for it
    (`EngineLimits`, inherited, so the two cannot drift) plus what only the build needs."""

    checkpoint_dir: Path
    output_dir: Path
    fp8_context_fmha: bool = False
    workers: int = 1

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
        """The plan as the manifest and build.sh record it, in the order they always have: role and paths, the
        limits, the build options, the tree (which is served, not a build flag) last."""
        data = {**asdict(self), "checkpoint_dir": str(self.checkpoint_dir), "output_dir": str(self.output_dir)}
        limits = [f.name for f in fields(EngineLimits) if f.name not in ("role", "medusa_choices")]
        limits.remove("lookahead_config")
        order = ["role", "checkpoint_dir", "output_dir", *limits, "fp8_context_fmha", "workers", "medusa_choices"]
        if self.lookahead_config is not None:  # only lookahead plans have it, so other plans' records are unchanged
            order.append("lookahead_config")
        return {name: data[name] for name in order}

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
            lookahead_config=self.lookahead_config,
            gather_generation_logits=self.gather_generation_logits,
            gather_context_logits=self.gather_context_logits,
            quant_algo=facts.quant_algo,
            kv_cache_quant_algo=facts.kv_cache_quant_algo,
            max_attention_window_size=attention_window(self.engine_max_seq_len, facts),
        )


def plan_engine(spec: PipelineSpec, role: str, facts: CheckpointFacts | None) -> BuildPlan:
    """The plan for one engine of `spec`: the spec's limits (`engine_limits`); `facts` (the converted checkpoint)
    decide the FP8 context FMHA."""
    limits = engine_limits(spec, role)
    fp8 = facts is not None and facts.quant_algo in FP8_CONTEXT_FMHA_QUANT and facts.kv_cache_quant_algo == "FP8"
    return BuildPlan(**{f.name: getattr(limits, f.name) for f in fields(EngineLimits)},
                     checkpoint_dir=spec.checkpoint_dir(role), output_dir=engine_dir(spec, role),
                     fp8_context_fmha=fp8, workers=spec.build.world_size)


def plan_pipeline(spec: PipelineSpec, facts: dict[str, CheckpointFacts | None]) -> list[BuildPlan]:
    """One plan per engine the spec's mode needs (target; target + draft; or the single Medusa engine)."""
    return [plan_engine(spec, role, facts.get(role)) for role in engine_roles(spec)]
