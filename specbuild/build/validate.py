"""Every check that can be made before an engine build starts, reported together, one message per problem.

Each rule is a mistake TensorRT-LLM users report finding only after a long build or at serving time (in
NVIDIA/TensorRT-LLM and triton-inference-server/tensorrtllm_backend GitHub issues, e.g. TensorRT-LLM#2789 and
#1845, named at their rules), or a rule of TensorRT-LLM 1.2's own `trtllm-build` that refuses, or silently
changes, a configuration specbuild can plan. Those are read from
NVIDIA/TensorRT-LLM: `tensorrt_llm/builder.py` `build()` (the same lines at commits 73c0d691 and 008b2b8d and in
the 1.x version without auto_parallel that 1.2's `tensorrt_llm/commands/build.py` @65f1d153 imports),
`tensorrt_llm/_common.py` `check_max_num_tokens()` @0fccc5b9 and `tensorrt_llm/quantization/mode.py`
`QuantMode.from_quant_algo()` @89fd9b74. Errors stop the build; warnings (memory estimate, choices that cost
speed, changes trtllm-build makes that the engine survives) are printed and the build goes on.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from specbuild.build.gpu import Gpu, parse_gpu
from specbuild.build.plan import FP8_CONTEXT_FMHA_QUANT, BuildPlan
from specbuild.contracts import lookahead as la
from specbuild.contracts.checkpoint_facts import CheckpointFacts, facts_from_config
from specbuild.contracts.engine_limits import TOKENS_PER_BLOCK, verification_tokens
from specbuild.contracts.model_fit import DRAFT_MODEL, Finding
from specbuild.contracts.quant_formats import format_of, kv_cache_quant_algo, kv_format_of, quant_algo
from specbuild.dtypes import quantized_export_dtype
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
"""Medusa and draft-target engines need compute capability >= 8.0: the support matrices of NVIDIA/TensorRT-LLM
examples/medusa/README.md (1.x) and examples/draft_target_model/README.md @567239fc."""

# TensorRT-LLM 1.2's build() refuses integer quantization when `100 <= get_sm_version() < 120` (B100/B200/GB200,
# B300/GB300; not SM 120-121, the RTX 50xx / RTX PRO Blackwell parts), raising RuntimeError in this order:
#   is_int8_weight_only() or is_int4_weight_only() or has_int8_kv_cache() -> "INT8/INT4 quantization is not ..."
#   has_act_and_weight_quant()                                           -> "SmoothQuant is not supported ..."
#   has_per_channel_scaling() or has_per_token_dynamic_scaling()         -> "Per-channel or per-token scaling ..."
# Source: NVIDIA/TensorRT-LLM tensorrt_llm/builder.py build() @73c0d691 (identical @008b2b8d and in the 1.x
# builder without auto_parallel). Which quant_algo sets which QuantMode flags: tensorrt_llm/quantization/mode.py
# QuantMode.from_quant_algo() @89fd9b74 (W4A8_AWQ is use_weight_only(int4, per_group), hence "int4 weight only";
# W4A8_QSERVE_* set neither PER_CHANNEL nor PER_TOKEN and pass; FP8_PER_CHANNEL_PER_TOKEN sets both).
SM100_REFUSED_RANGE = (100, 120)
_INT_WEIGHTS = "INT8/INT4 quantization is not supported on SM>=100."
_SMOOTHQUANT = "SmoothQuant is not supported on SM>=100."
_SCALING = "Per-channel or per-token scaling is not supported on SM>=100."
SM100_REFUSED: dict[tuple[str, str], str] = {
    **{("quant_algo", algo): _INT_WEIGHTS
       for algo in ("W8A16", "W4A16", "W4A16_AWQ", "W4A8_AWQ", "W8A16_GPTQ", "W4A16_GPTQ")},
    ("kv_cache_quant_algo", "INT8"): _INT_WEIGHTS,
    **{("quant_algo", algo): _SMOOTHQUANT
       for algo in ("W8A8_SQ_PER_CHANNEL", "W8A8_SQ_PER_TENSOR_PLUGIN", "W8A8_SQ_PER_CHANNEL_PER_TOKEN_PLUGIN",
                    "W8A8_SQ_PER_CHANNEL_PER_TENSOR_PLUGIN", "W8A8_SQ_PER_TENSOR_PER_TOKEN_PLUGIN")},
    ("quant_algo", "FP8_PER_CHANNEL_PER_TOKEN"): _SCALING,
}
"""(checkpoint field, value) -> the RuntimeError TensorRT-LLM 1.2's build() raises for it on SM 100-119."""

Severity = Literal["error", "warning"]


@dataclass(frozen=True)
class BuildProblem:
    severity: Severity
    message: str
    field: tuple[str, ...] | None = None
    """The spec field the problem is about (`specbuild validate` gives its file:line), where one is to blame."""


class BuildValidationError(SpecbuildError):
    """One or more build problems; `problems` holds all of them."""

    def __init__(self, spec_file: str, problems: list[BuildProblem]) -> None:
        self.problems = problems
        errors = [p.message for p in problems if p.severity == "error"]
        head = f"{spec_file}: {len(errors)} problem(s) found before building anything"
        super().__init__(head + "\n" + "\n".join(f"  - {m}" for m in errors),
                         hint="fix these in the spec (or re-run `specbuild convert SPEC`), then build again")


def _error(message: str, field: tuple[str, ...] | None = None) -> BuildProblem:
    return BuildProblem("error", message, field)


def _warning(message: str, field: tuple[str, ...] | None = None) -> BuildProblem:
    return BuildProblem("warning", message, field)


def _quant_field(fact: CheckpointFacts, field: str) -> tuple[str, ...]:
    """The spec field a checkpoint's quantization comes from: the draft's, else the GPU it cannot run on."""
    if fact.role == "draft":
        return ("draft", "quantization", "format" if field == "quant_algo" else "kv_cache")
    return ("build", "gpu")


def _quantization(fact: CheckpointFacts, field: str) -> str:
    """`quant_algo=W8A8_SQ_PER_CHANNEL (draft.quantization.format int8_sq)`: the field and where it came from."""
    value = getattr(fact, field)
    if value is None:
        return f"{field}=null"
    named = (format_of(value) if field == "quant_algo" else kv_format_of(value)) if fact.role == "draft" else None
    if named is not None:
        key = "format" if field == "quant_algo" else "kv_cache"
        return f"{field}={value} (draft.quantization.{key} {named})"
    return f"{field}={value}"


def checkpoint_problems(spec: PipelineSpec, facts: dict[str, CheckpointFacts]) -> Iterator[BuildProblem]:
    """The converted checkpoints must be what the spec asks for now (a stale convert is the usual cause)."""
    build = spec.build
    for role, fact in facts.items():
        if (fact.tp_size, fact.pp_size) != (build.tp_size, build.pp_size):
            yield _error(
                f"{role} checkpoint is sharded tp={fact.tp_size} pp={fact.pp_size}, but build.tp_size/pp_size say "
                f"tp={build.tp_size} pp={build.pp_size}; re-run `specbuild convert SPEC`", ("build", "tp_size")
            )
        quantized = fact.quant_algo is not None or fact.kv_cache_quant_algo is not None
        if build.dtype != "auto" and fact.dtype != build.dtype and not quantized_export_dtype(
                build.dtype, fact.dtype, quantized=quantized):
            yield _error(
                f"{role} checkpoint is {fact.dtype}, but build.dtype is {build.dtype}; re-run `specbuild convert SPEC`",
                ("build", "dtype"),
            )
    if spec.draft is not None and "draft" in facts:
        fact, quant = facts["draft"], spec.draft.quantization
        want = {"quant_algo": quant_algo(quant.format), "kv_cache_quant_algo": kv_cache_quant_algo(quant.kv_cache)}
        for field, value in want.items():
            if getattr(fact, field) == value:
                continue
            key = "format" if field == "quant_algo" else "kv_cache"
            what = (f"draft checkpoint has {field}={getattr(fact, field)}, but draft.quantization.{key} is "
                    f"{getattr(quant, key)} ({field}={value})")
            where = ("draft", "quantization", key)
            if value is not None:  # the spec asks for a quantization the checkpoint does not have
                yield _error(f"{what}; re-run `specbuild convert SPEC`", where)
            else:  # quantized although the spec says none: stale, or placed there by hand
                yield _warning(f"{what}; re-run `specbuild convert SPEC` unless the checkpoint was placed there "
                               "on purpose", where)
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
            "the target's tokenizer and vocabulary", ("draft", "model")
        )


def tree_problems(plan: BuildPlan, fact: CheckpointFacts | None) -> Iterator[BuildProblem]:
    """The Medusa tree against TensorRT-LLM's C++ rules (speculativeChoicesUtils.cpp) and the engine."""
    tree = plan.medusa_choices or []
    for index, message in medusa_tree_problems(tree):
        yield _error(f"medusa.choices{'' if index is None else f'[{index}]'}: {message}", ("medusa", "choices"))
    big = sorted({i for path in tree for i in path if i > MAX_MEDUSA_INDEX})
    if big:
        yield _error(f"medusa.choices: top-k index {big[-1]} is more than {MAX_MEDUSA_INDEX}, the most "
                     "TensorRT-LLM's tree packing holds", ("medusa", "choices"))
    depth = max((len(path) for path in tree), default=0)  # medusa_tree_problems refused paths past 16 levels
    if fact is not None and fact.num_medusa_heads and depth > fact.num_medusa_heads:
        yield _error(
            f"medusa.choices: the tree is {depth} deep, but the checkpoint has {fact.num_medusa_heads} Medusa heads "
            "('Choices require larger maxPathLen than the engine was built with'); use a shallower tree",
            ("medusa", "choices"),
        )
    if len(tree) > plan.max_draft_len:
        yield _error(
            f"medusa.choices: {len(tree)} nodes, more than the engine's max_draft_len {plan.max_draft_len} "
            "(speculative.max_draft_len); raise it to at least the node count", ("speculative", "max_draft_len")
        )


def plan_problems(spec: PipelineSpec, plan: BuildPlan, fact: CheckpointFacts | None) -> Iterator[BuildProblem]:
    """Limits that trtllm-build rejects, silently changes, or that make the engine useless for serving."""
    name = f"{plan.role} engine"
    if spec.speculative.mode == "draft_target" and plan.role == "target":
        k = spec.speculative.num_draft_tokens
        if k > plan.max_draft_len:
            yield _error(f"{name}: speculative.num_draft_tokens {k} is more than max_draft_len {plan.max_draft_len}",
                         ("speculative", "num_draft_tokens"))
    if plan.role == "medusa":
        yield from tree_problems(plan, fact)
    if plan.lookahead_config is not None:
        yield from lookahead_plan_problems(plan)
    if plan.max_draft_len:
        # build() raises max_num_tokens to this under any speculative mode (builder.py @73c0d691), so a smaller
        # build.max_num_tokens is not what the engine gets.
        need = verification_tokens(plan.max_batch_size, plan.max_draft_len)
        if plan.max_num_tokens < need:
            yield _error(
                f"{name}: build.max_num_tokens {plan.max_num_tokens} is less than max_batch_size x (max_draft_len + 1)"
                f" = {plan.max_batch_size} x {plan.max_draft_len + 1} = {need}, the tokens one verification step "
                "needs; raise it or lower build.max_batch_size", ("build", "max_num_tokens")
            )
        # trtllm-build main(): "Gather context logits is not support with draft len > 0." (RuntimeError),
        # NVIDIA/TensorRT-LLM tensorrt_llm/commands/build.py @65f1d153.
        if plan.gather_context_logits:
            yield _error(
                f"{name}: build.gather_context_logits cannot be used on an engine with a draft length "
                f"({plan.max_draft_len}); TensorRT-LLM refuses the combination", ("build", "gather_context_logits")
            )
    yield from max_num_tokens_problems(spec, plan)
    if fact is not None:
        yield from paged_context_fmha_problems(spec, plan, fact)
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
                         "or max_output_len", ("build", "max_input_len"))
        else:
            yield _warning(f"{longer}; quality drops past the trained length", ("build", "max_input_len"))
    if plan.role == "medusa" and fact is not None and fact.quant_algo not in (None, "FP8"):
        yield _warning(
            f"{name}: Medusa engines are supported in FP16/BF16 and with an FP8 base; {fact.quant_algo} is untested "
            "by TensorRT-LLM (weight-only quantization crashed Medusa builds, TensorRT-LLM#1845)"
        )


def lookahead_plan_problems(plan: BuildPlan) -> Iterator[BuildProblem]:
    """The executor's (W, N, G), which deploy writes from the same spec, must give exactly the engine's
    max_draft_len: the lookahead layer checks its tokens per step equal the engine's (NVIDIA/TensorRT-LLM
    cpp/tensorrt_llm/layers/lookaheadDecodingLayer.cpp @7ed07f06, "%d != %d"; examples/lookahead/README.md)."""
    assert plan.lookahead_config is not None
    need = la.max_draft_len(*plan.lookahead_config)
    if need != plan.max_draft_len:
        yield _error(f"{plan.role} engine: max_draft_len {plan.max_draft_len}, but speculative.lookahead (W, N, G) = "
                     f"{tuple(plan.lookahead_config)} makes the executor expect {need}; leave "
                     "speculative.max_draft_len out", ("speculative", "max_draft_len"))


def trtllm_max_num_tokens(plan: BuildPlan) -> int:
    """The max_num_tokens TensorRT-LLM 1.2 builds the plan's engine with. `check_max_num_tokens()`
    (tensorrt_llm/_common.py @0fccc5b9, called from builder.py `_init_max_seq_len()` before max_draft_len is
    added to max_seq_len) lowers it to max_batch_size x max_seq_len, then raises it to tokens_per_block (context
    FMHA is on); `build()` (builder.py @73c0d691) then raises it to max_batch_size x (max_draft_len + 1) under
    any speculative mode."""
    tokens = max(min(plan.max_num_tokens, plan.max_batch_size * plan.max_seq_len), TOKENS_PER_BLOCK)
    if plan.speculative_decoding_mode != "none":
        tokens = max(tokens, plan.max_batch_size * (plan.max_draft_len + 1))
    return tokens


def max_num_tokens_problems(spec: PipelineSpec, plan: BuildPlan) -> Iterator[BuildProblem]:
    """build.max_num_tokens that trtllm-build silently changes. Lowered: the built engine's
    build_config.max_num_tokens is then below the plan's, which the post-build check (tensorrt.py) refuses
    after the whole build; raised to tokens_per_block: the engine works, longer prompts need chunked context."""
    name, given = f"{plan.role} engine", plan.max_num_tokens
    built = trtllm_max_num_tokens(plan)
    if built < given:
        ceiling = plan.max_batch_size * plan.max_seq_len
        yield _error(
            f"{name}: build.max_num_tokens {given} is more than max_batch_size x (max_input_len + max_output_len)"
            f" = {plan.max_batch_size} x {plan.max_seq_len} = {ceiling}; trtllm-build lowers it to {built} "
            "(\"max_num_tokens shouldn't be greater than max_seq_len * max_batch_size\") and the engine would not "
            f"match its plan: set build.max_num_tokens to at most {built}, or leave it unset",
            ("build", "max_num_tokens"),
        )
    elif given < TOKENS_PER_BLOCK and spec.build.max_num_tokens is not None and built == TOKENS_PER_BLOCK:
        yield _warning(
            f"{name}: build.max_num_tokens {given} is less than tokens_per_block ({TOKENS_PER_BLOCK}); "
            f"trtllm-build raises it to {built}, and prompts longer than that are served only with chunked "
            f"context: set build.max_num_tokens to at least {TOKENS_PER_BLOCK}", ("build", "max_num_tokens")
        )


def paged_context_fmha_lost(fact: CheckpointFacts) -> str | None:
    """Why TensorRT-LLM 1.2's `build()` turns `--use_paged_context_fmha enable` off for this checkpoint (its
    warning), or None where it keeps it. builder.py @73c0d691, "Logics to control paged_context_fmha and
    fp8_context_fmha": a quant_algo other than FP8/W4A8_AWQ/NVFP4 cannot use FP8 context FMHA, and an FP8 KV
    cache then loses paged context FMHA too; an INT8 KV cache always does. (FP8/W4A8_AWQ/NVFP4 on SM < 89 lose it
    too, but gpu_problems refuses those formats there already.)"""
    if fact.kv_cache_quant_algo == "FP8" and fact.quant_algo not in FP8_CONTEXT_FMHA_QUANT:
        return "FP8 Paged Context FMHA is disabled because FP8 context FMHA is disabled."
    if fact.kv_cache_quant_algo == "INT8":
        return "Paged Context FMHA is disabled because it doesn't work with int8 kv cache currently."
    return None


def paged_context_fmha_problems(spec: PipelineSpec, plan: BuildPlan, fact: CheckpointFacts) -> Iterator[BuildProblem]:
    """Every plan passes `--use_paged_context_fmha enable` (trtllm_flags.EXPLICIT): KV-cache reuse, which
    draft-target serving needs on both engines (NVIDIA/TensorRT-LLM examples/draft_target_model/README.md
    @567239fc) and deploy enables on every engine, and chunked context need it. trtllm-build only warns when it
    drops it."""
    reason = paged_context_fmha_lost(fact)
    if reason is None:
        return
    what = (f"{plan.role} engine: checkpoint {_quantization(fact, 'quant_algo')} with "
            f"{_quantization(fact, 'kv_cache_quant_algo')} is built by TensorRT-LLM 1.2 without paged context "
            f"FMHA (\"{reason}\")")
    if fact.role == "draft" and fact.kv_cache_quant_algo == "FP8":
        fix = ("set draft.quantization.kv_cache to none, or draft.quantization.format to fp8 or w4a8_awq (which "
               "keep paged context FMHA with an fp8 KV cache), then re-run `specbuild convert SPEC`")
    elif fact.role == "draft":
        fix = "set draft.quantization.kv_cache to fp8 or none, then re-run `specbuild convert SPEC`"
    elif fact.kv_cache_quant_algo == "FP8":
        fix = f"re-export the {fact.role} checkpoint without the FP8 KV cache, or with fp8 weights (quant_algo FP8)"
    else:
        fix = f"re-export the {fact.role} checkpoint with an FP8 KV cache or none"
    field = ("draft", "quantization", "kv_cache") if fact.role == "draft" else None
    if spec.speculative.mode == "draft_target":
        yield _error(f"{what}, which draft-target serving needs on both engines for KV-cache reuse; {fix}", field)
    else:
        yield _warning(f"{what}: KV-cache reuse (deploy enables it) and chunked context are lost; {fix}", field)


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
                    f"(compute capability >= {floor:g}); {where} cannot run it: choose another format for this GPU",
                    _quant_field(fact, field),
                )
        if SM100_REFUSED_RANGE[0] <= gpu.sm < SM100_REFUSED_RANGE[1]:
            for field in ("quant_algo", "kv_cache_quant_algo"):
                refusal = SM100_REFUSED.get((field, getattr(fact, field)))
                if refusal is None:
                    continue
                if fact.role == "draft":
                    key = "format" if field == "quant_algo" else "kv_cache"
                    fix = (f"set draft.quantization.{key} to fp8 (or none) and re-run `specbuild convert SPEC`, "
                           "or build for an Ada/Hopper GPU")
                else:
                    fix = f"convert the {fact.role} checkpoint to fp8 or unquantized, or build for an Ada/Hopper GPU"
                yield _error(
                    f"{plan.role} engine: checkpoint {_quantization(fact, field)} cannot be built for {where}: "
                    f"TensorRT-LLM 1.2 refuses it on SM 100-119 (\"{refusal}\"); {fix}", _quant_field(fact, field)
                )
        if fact.dtype == "bfloat16" and gpu.compute_capability < 8.0:
            yield _error(f"{plan.role} checkpoint is bfloat16, which {where} lacks; use float16", ("build", "dtype"))
        if plan.max_draft_len and gpu.compute_capability < SPECULATIVE_MIN_CC:
            yield _error(
                f"{plan.role} engine: speculative decoding needs compute capability >= {SPECULATIVE_MIN_CC:g}; "
                f"{where} has none", ("build", "gpu")
            )


def memory_estimate_gib(plan: BuildPlan, fact: CheckpointFacts) -> tuple[float, float]:
    """(weights, KV cache) in GiB on each GPU of one engine: weights spread over tp x pp, KV cache for every
    sequence of the batch at the engine's full length."""
    weights = fact.weight_bytes / fact.world_size
    # With an attention window the KV cache holds the last `window` tokens of a sequence (a rolling buffer).
    tokens = min(plan.engine_max_seq_len, fact.sliding_window or plan.engine_max_seq_len)
    kv = plan.max_batch_size * tokens * fact.kv_bytes_per_token() / fact.world_size
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
        tokens = min(plan.engine_max_seq_len, fact.sliding_window or plan.engine_max_seq_len)
        parts.append(f"{plan.role}: weights {weights:.2f} + KV cache {kv:.2f} for {plan.max_batch_size} x "
                     f"{tokens} tokens")
    if parts and total > MEMORY_HEADROOM * memory_gib:
        yield _warning(
            f"estimated {total:.2f} GiB per GPU ({'; '.join(parts)}) is more than {MEMORY_HEADROOM:.0%} of the GPU's "
            f"{memory_gib:g} GiB: lower build.max_batch_size or the lengths, quantize, or add GPUs (tp_size)",
            ("build", "max_batch_size"),
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


def planned_problems(spec: PipelineSpec, configs: dict[str, tuple[dict[str, Any], int]]) -> list[BuildProblem]:
    """Every build check on the checkpoints `convert` would write ({role: (config, rank files' bytes)}, from
    specbuild.convert.preflight), for `specbuild validate`: nothing needs to be converted yet."""
    from specbuild.build.plan import plan_pipeline
    from specbuild.contracts.engine_info import engine_roles

    problems: list[BuildProblem] = []
    facts: dict[str, CheckpointFacts] = {}
    for role, (config, weight_bytes) in configs.items():
        try:
            facts[role] = facts_from_config(role, spec.checkpoint_dir(role), config, weight_bytes)
        except (KeyError, ValueError) as err:  # a converter bug, but say so rather than crash
            problems.append(_error(f"{role}: the planned checkpoint config is unusable ({err})"))
    gpu = None
    if spec.build.gpu is not None:
        gpu = parse_gpu(spec.build.gpu, spec.build.gpu_memory_gb)
        if gpu is None:
            problems.append(_error(f"unknown GPU {spec.build.gpu!r}; give its compute capability instead, e.g. '8.9'",
                                   ("build", "gpu")))
    roles = engine_roles(spec)
    built = {role: fact for role, fact in facts.items() if role in roles}
    plans = plan_pipeline(spec, {role: built.get(role) for role in roles})
    memory = spec.build.gpu_memory_gb or (gpu.memory_gib if gpu is not None else None)
    return problems + build_problems(spec, plans, built, gpu, memory)


def with_fit_findings(spec: PipelineSpec, models: list[Finding], fits: list[Finding]) -> list[Finding]:
    """`specbuild validate`'s model findings: what convert's planning found (`models`, convert.preflight) with the
    draft's fit to its mode and target (`fits`, contracts.model_fit). A draft that is not the kind the mode needs
    is said once, at draft.model, instead of as the conversion problems that follow from it; a self-draft adapter's
    problems (convert plans the self-draft as a whole, at draft.layers) are said at draft.adapter."""
    if any(severity == "error" and loc == DRAFT_MODEL for severity, loc, _ in fits):
        models = [finding for finding in models if finding[1] != DRAFT_MODEL]
    adapter = spec.draft.adapter if spec.draft is not None else None
    if adapter is not None:
        inside = str(adapter)
        models = [(severity, ("draft", "adapter") if loc == ("draft", "layers") and message.startswith(inside)
                   else loc, message) for severity, loc, message in models]
    return [*fits, *models]
