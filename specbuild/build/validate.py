"""Every check that can be made before an engine build starts, reported together, one message per problem.

Each rule is a mistake TensorRT-LLM users report finding only after a long build or at serving time
(shared/reference/tensorrt-llm.md §2-§5, triton-backend.md §5). Errors stop the build; warnings (memory
estimate, choices that cost speed) are printed and the build goes on.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from specbuild.build.checkpoints import CheckpointFacts
from specbuild.build.gpu import Gpu
from specbuild.build.plan import BuildPlan
from specbuild.errors import SpecbuildError
from specbuild.medusa.choices import medusa_tree_problems
from specbuild.spec import PipelineSpec

MAX_MEDUSA_INDEX = 16
"""Largest top-k index in a Medusa path: TensorRT-LLM's `PREFIX_MAX_VALUE` (speculativeChoicesUtils.cpp)."""
MEMORY_HEADROOM = 0.9
"""Share of GPU memory weights + KV cache may take; activations and the runtime need the rest."""

# quant_algo / kv_cache_quant_algo -> lowest compute capability that runs it, and the generation's name.
# fp8 (and W4A8 AWQ, whose activations are fp8) needs Ada/Hopper (sm_89+), NVFP4 Blackwell (sm_100+).
QUANT_MIN_CC: dict[str, tuple[float, str]] = {
    "FP8": (8.9, "Ada or Hopper"),
    "FP8_PER_CHANNEL_PER_TOKEN": (8.9, "Ada or Hopper"),
    "FP8_BLOCK_SCALES": (9.0, "Hopper"),
    "W4A8_AWQ": (8.9, "Ada or Hopper"),
    "NVFP4": (10.0, "Blackwell"),
}
SPECULATIVE_MIN_CC = 8.0
"""Medusa and draft-target engines need compute capability >= 8.0 (tensorrt-llm.md §2.4, triton-backend.md §2.1)."""

Severity = Literal["error", "warning"]


@dataclass(frozen=True)
class BuildProblem:
    severity: Severity
    message: str


class BuildValidationError(SpecbuildError):
    """One or more build problems; `problems` holds all of them."""

    def __init__(self, spec_file: str, problems: list[BuildProblem]) -> None:
        self.problems = problems
        errors = [p.message for p in problems if p.severity == "error"]
        head = f"{spec_file}: {len(errors)} problem(s) found before building anything"
        super().__init__(head + "\n" + "\n".join(f"  - {m}" for m in errors),
                         hint="fix these in the spec (or re-run `specbuild convert SPEC`), then build again")


def _error(message: str) -> BuildProblem:
    return BuildProblem("error", message)


def _warning(message: str) -> BuildProblem:
    return BuildProblem("warning", message)


def checkpoint_problems(spec: PipelineSpec, facts: dict[str, CheckpointFacts]) -> Iterator[BuildProblem]:
    """The converted checkpoints must be what the spec asks for now (a stale convert is the usual cause)."""
    build = spec.build
    for role, fact in facts.items():
        if (fact.tp_size, fact.pp_size) != (build.tp_size, build.pp_size):
            yield _error(
                f"{role} checkpoint is sharded tp={fact.tp_size} pp={fact.pp_size}, but build.tp_size/pp_size say "
                f"tp={build.tp_size} pp={build.pp_size}; re-run `specbuild convert SPEC`"
            )
        if build.dtype != "auto" and fact.dtype != build.dtype and not _quantized_half(fact, build.dtype):
            yield _error(
                f"{role} checkpoint is {fact.dtype}, but build.dtype is {build.dtype}; re-run `specbuild convert SPEC`"
            )
    for role, fact in facts.items():
        if role == "medusa" and fact.architecture != "MedusaForCausalLM":
            yield _error(
                f"medusa checkpoint is a {fact.architecture}, not a MedusaForCausalLM: it has no heads; re-run "
                "`specbuild convert SPEC` with the spec's medusa section"
            )
    target, draft = facts.get("target"), facts.get("draft")
    if target is not None and draft is not None and target.vocab_size != draft.vocab_size:
        yield _error(
            f"draft vocab_size {draft.vocab_size} differs from the target's {target.vocab_size}: the target "
            "cannot verify the draft's tokens (TensorRT-LLM#2789 'Incompatible buffer sizes'); use a draft with "
            "the target's tokenizer and vocabulary"
        )


def _quantized_half(fact: CheckpointFacts, dtype: str) -> bool:
    """ModelOpt exports quantized checkpoints in float16 or bfloat16 only (shared/reference/modelopt-medusa.md
    §1.5), so `convert` writes a quantized draft of a float32 pipeline in float16: that is expected, not stale."""
    quantized = fact.quant_algo is not None or fact.kv_cache_quant_algo is not None
    return quantized and dtype == "float32" and fact.dtype in ("float16", "bfloat16")


def tree_problems(plan: BuildPlan, fact: CheckpointFacts | None) -> Iterator[BuildProblem]:
    """The Medusa tree against TensorRT-LLM's C++ rules (speculativeChoicesUtils.cpp) and the engine."""
    tree = plan.medusa_choices or []
    for index, message in medusa_tree_problems(tree):
        yield _error(f"medusa.choices{'' if index is None else f'[{index}]'}: {message}")
    big = sorted({i for path in tree for i in path if i > MAX_MEDUSA_INDEX})
    if big:
        yield _error(f"medusa.choices: top-k index {big[-1]} is more than {MAX_MEDUSA_INDEX}, the most "
                     "TensorRT-LLM's tree packing holds")
    depth = max((len(path) for path in tree), default=0)  # medusa_tree_problems refused paths past 16 levels
    if fact is not None and fact.num_medusa_heads and depth > fact.num_medusa_heads:
        yield _error(
            f"medusa.choices: the tree is {depth} deep, but the checkpoint has {fact.num_medusa_heads} Medusa heads "
            "('Choices require larger maxPathLen than the engine was built with'); use a shallower tree"
        )
    if len(tree) > plan.max_draft_len:
        yield _error(
            f"medusa.choices: {len(tree)} nodes, more than the engine's max_draft_len {plan.max_draft_len} "
            "(speculative.max_draft_len); raise it to at least the node count"
        )


def plan_problems(spec: PipelineSpec, plan: BuildPlan, fact: CheckpointFacts | None) -> Iterator[BuildProblem]:
    """Limits that trtllm-build rejects, silently changes, or that make the engine useless for serving."""
    name = f"{plan.role} engine"
    if spec.speculative.mode == "draft_target" and plan.role == "target":
        k = spec.speculative.num_draft_tokens
        if k > plan.max_draft_len:
            yield _error(f"{name}: speculative.num_draft_tokens {k} is more than max_draft_len {plan.max_draft_len}")
    if plan.role == "medusa":
        yield from tree_problems(plan, fact)
    if plan.max_draft_len:
        need = plan.max_batch_size * (plan.max_draft_len + 1)
        if plan.max_num_tokens < need:
            yield _error(
                f"{name}: build.max_num_tokens {plan.max_num_tokens} is less than max_batch_size x (max_draft_len + 1)"
                f" = {plan.max_batch_size} x {plan.max_draft_len + 1} = {need}, the tokens one verification step "
                "needs; raise it or lower build.max_batch_size"
            )
        if plan.gather_context_logits:
            yield _error(
                f"{name}: build.gather_context_logits cannot be used on an engine with a draft length "
                f"({plan.max_draft_len}); TensorRT-LLM refuses the combination"
            )
    if plan.max_num_tokens < plan.max_input_len:
        yield _warning(
            f"{name}: max_num_tokens {plan.max_num_tokens} < max_input_len {plan.max_input_len}: longer prompts "
            "are served only with chunked context (enable_chunked_context)"
        )
    if fact is not None and 0 < fact.max_position_embeddings < plan.engine_max_seq_len:
        longer = (f"{name}: sequences of up to {plan.engine_max_seq_len} tokens, but the model has "
                  f"{fact.max_position_embeddings} positions (max_position_embeddings)")
        if fact.position_embedding_type == "learned_absolute":
            yield _error(f"{longer}; a learned position table has no entries past it: lower build.max_input_len "
                         "or max_output_len")
        else:
            yield _warning(f"{longer}; quality drops past the trained length")
    if plan.role == "medusa" and fact is not None and fact.quant_algo not in (None, "FP8"):
        yield _warning(
            f"{name}: Medusa engines are supported in FP16/BF16 and with an FP8 base; {fact.quant_algo} is untested "
            "by TensorRT-LLM (weight-only quantization crashed Medusa builds, TensorRT-LLM#1845)"
        )


def gpu_problems(plans: list[BuildPlan], facts: dict[str, CheckpointFacts], gpu: Gpu) -> Iterator[BuildProblem]:
    """Formats the GPU's generation cannot run: an engine is built for one compute capability."""
    where = f"{gpu.name} (compute capability {gpu.compute_capability:g}, {gpu.generation})"
    for plan in plans:
        fact = facts.get(plan.role)
        if fact is None:
            continue
        for field, algo in (("quant_algo", fact.quant_algo), ("kv_cache_quant_algo", fact.kv_cache_quant_algo)):
            if algo in QUANT_MIN_CC and gpu.compute_capability < QUANT_MIN_CC[algo][0]:
                floor, generation = QUANT_MIN_CC[algo]
                yield _error(
                    f"{plan.role} checkpoint is quantized {field}={algo}, which needs {generation} "
                    f"(compute capability >= {floor:g}); {where} cannot run it: choose another format for this GPU"
                )
        if fact.dtype == "bfloat16" and gpu.compute_capability < 8.0:
            yield _error(f"{plan.role} checkpoint is bfloat16, which {where} lacks; use float16")
        if plan.max_draft_len and gpu.compute_capability < SPECULATIVE_MIN_CC:
            yield _error(
                f"{plan.role} engine: speculative decoding needs compute capability >= {SPECULATIVE_MIN_CC:g}; "
                f"{where} has none"
            )


def memory_estimate_gib(plan: BuildPlan, fact: CheckpointFacts) -> tuple[float, float]:
    """(weights, KV cache) in GiB on each GPU of one engine: weights spread over tp x pp, KV cache for every
    sequence of the batch at the engine's full length."""
    weights = fact.weight_bytes / fact.world_size
    kv = plan.max_batch_size * plan.engine_max_seq_len * fact.kv_bytes_per_token() / fact.world_size
    return weights / 2**30, kv / 2**30


def memory_problems(
    plans: list[BuildPlan], facts: dict[str, CheckpointFacts], memory_gib: float
) -> Iterator[BuildProblem]:
    """Weights + KV cache of all engines (draft and target share a GPU in TensorRT-LLM's recipes)."""
    parts, total = [], 0.0
    for plan in plans:
        fact = facts.get(plan.role)
        if fact is None:
            continue
        weights, kv = memory_estimate_gib(plan, fact)
        total += weights + kv
        parts.append(f"{plan.role}: weights {weights:.2f} + KV cache {kv:.2f} for {plan.max_batch_size} x "
                     f"{plan.engine_max_seq_len} tokens")
    if parts and total > MEMORY_HEADROOM * memory_gib:
        yield _warning(
            f"estimated {total:.2f} GiB per GPU ({'; '.join(parts)}) is more than {MEMORY_HEADROOM:.0%} of the GPU's "
            f"{memory_gib:g} GiB: lower build.max_batch_size or the lengths, quantize, or add GPUs (tp_size)"
        )


def build_problems(
    spec: PipelineSpec,
    plans: list[BuildPlan],
    facts: dict[str, CheckpointFacts],
    gpu: Gpu | None,
    memory_gib: float | None,
) -> list[BuildProblem]:
    """All problems of a build, errors and warnings, in a stable order."""
    problems = list(checkpoint_problems(spec, facts))
    for plan in plans:
        problems += plan_problems(spec, plan, facts.get(plan.role))
    if gpu is not None:
        problems += gpu_problems(plans, facts, gpu)
    if memory_gib is not None:
        problems += memory_problems(plans, facts, memory_gib)
    return problems
