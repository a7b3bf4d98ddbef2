"""The pipeline spec's schema: one YAML file that says which checkpoints become which service.

Why so strict: every later stage (convert, build, deploy) trusts these values, and a mistake caught here costs
a second, where the same mistake caught by trtllm-build or tritonserver costs GPU minutes and an opaque log.
So unknown keys are errors, relative paths are resolved once against the spec file's directory (`fields`), and
validators report every problem at once with its field path (`problems`); `load` adds the file and line.

Model paths are *not* checked for existence here: `specbuild validate` (specbuild.convert.preflight) checks the
models, tokenizer, calibration text, Medusa heads and GPU against the spec without loading weights, and reports
those problems located in this file too (`PipelineSpec.problems_error`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    Strict,
    ValidationInfo,
    field_validator,
    model_validator,
)

from specbuild.contracts import lookahead as la
from specbuild.contracts.quant_formats import FORMAT_NAMES, KV_FORMAT_NAMES
from specbuild.dtypes import DTYPES
from specbuild.medusa.choices import medusa_tree_problems
from specbuild.runtime.schedule import schedule_problems
from specbuild.spec.dynamo import KV_TRANSFERS, DynamoSpec
from specbuild.spec.fields import Count, ModelPath, Port, SpecPath, base_dir, resolve, snapshot_commit, spec_path_from
from specbuild.spec.kubernetes import KubernetesSpec, dynamo_name_problem
from specbuild.spec.presets import DEFAULT_MEDUSA_CHOICES, as_paths, load_preset
from specbuild.spec.problems import (
    Issue,
    Loc,
    SpecProblem,
    SpecValidationError,
    custom_error,
    raise_issues,
    show,
    sorted_problems,
)

MAX_DRAFT_TOKENS = 64
"""Upper bound for `speculative.num_draft_tokens` (K); TensorRT-LLM examples use 4-10."""
ROLES = ("target", "draft", "medusa")

SpeculativeMode = Literal["none", "draft_target", "medusa", "ngram", "sa", "eagle3", "mtp", "lookahead"]
"""`ngram` (prompt lookup, no draft model), `sa` (suffix-automaton drafting, no draft model; TensorRT-LLM 1.3 on),
`eagle3` (an EAGLE-3 draft checkpoint in `draft.model`) and `mtp` (the multi-token-prediction layers the target
checkpoint itself ships, as DeepSeek-V3/R1, GLM-4.5, MiMo and Qwen3-Next do; no draft model) run only on
`build.flow: pytorch`; `specbuild validate`/`build` refuse them on the engine flow with TensorRT-LLM's reason.
`lookahead` (Lookahead decoding, no draft model; `speculative.lookahead`) runs only on the engine flow."""
K_MODES = ("draft_target", "ngram", "sa", "eagle3", "mtp")
"""Modes whose draft length is `speculative.num_draft_tokens` (K)."""
DRAFT_MODES = ("draft_target", "eagle3")
"""Modes that read a `draft:` checkpoint (a draft model, or an EAGLE-3 draft head)."""
Flow = Literal["engine", "pytorch"]
"""Which TensorRT-LLM 1.2 workflow the spec targets: `engine` (convert_checkpoint -> trtllm-build engines -> the
C++ tensorrtllm Triton backend; the default) or `pytorch` (the LLM API's PyTorch backend: HF checkpoints, no engine
step, served by trtllm-serve or Triton's llmapi model)."""
TrtllmLine = Literal["1.2", "1.3"]
"""The TensorRT-LLM release lines specbuild writes LLM-API settings for (`build.trtllm`; the tables are
specbuild.contracts.llm_api LINES). 1.2 is the last line with the engine flow."""
ENGINE_TRTLLM_LINE = "1.2"
NEWEST_TRTLLM_LINE = "1.3"
"""`build.trtllm`'s default on `build.flow: pytorch`: the newest line whose llm_args.py was read."""
BuildDType = Literal[("auto", *sorted(DTYPES, key=lambda name: DTYPES[name].itemsize))]
"""`auto` or a name from specbuild.dtypes, smallest first: 'auto', 'float16', 'bfloat16', 'float32'."""
Backend = Literal["auto", "tensorrt", "reference"]
QuantFormat = Literal[FORMAT_NAMES]
"""`none` or a format of specbuild.contracts.quant_formats, in its order (the order messages list them)."""
KvCacheFormat = Literal[KV_FORMAT_NAMES]

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class _Section(BaseModel):
    """Every spec section rejects unknown keys: a misspelt key must not silently fall back to a default."""

    model_config = ConfigDict(extra="forbid")


class ModelSource(_Section):
    """A Hugging Face checkpoint: a directory, or a Hub id (`owner/name`) resolved to its snapshot in the cache."""

    revision: Annotated[str, Strict(), Field(min_length=1)] | None = None
    """With a Hub id in `model`: the branch, tag or commit to use (default `main`); before `model`, which reads it."""
    model: ModelPath
    trust_remote_code: Annotated[bool, Strict()] = False
    """Off by default: it runs Python code shipped with the checkpoint. Turn on only for sources you trust."""

    @model_validator(mode="after")
    def _no_remote_code_from_hub(self) -> ModelSource:
        """A Hub snapshot holds no code (only config, tokenizer and safetensors are fetched): refuse, not fail later."""
        if self.trust_remote_code and self.model is not None and snapshot_commit(self.model) is not None:
            raise_issues([(("trust_remote_code",), "not with a Hugging Face Hub id in model: specbuild never fetches "
                           "code from the Hub; download the model yourself and name its directory", None)])
        return self


class TargetSpec(ModelSource):
    """The model whose output the service returns; the draft or Medusa heads only speed it up."""


class CalibSpec(_Section):
    """Calibration data for post-training quantization (ModelOpt needs activations to pick scales)."""

    source: Literal["builtin"] | Path = "builtin"
    """`builtin` (text shipped with Python), a UTF-8 text file, or a directory whose `*.txt` files are read in
    name order. Existence and content are checked by `convert`, which reads it."""
    size: Count = 64
    """Number of calibration samples."""
    seq_len: Count = 256
    """Tokens per sample."""

    @field_validator("source", mode="plain")
    @classmethod
    def _check_source(cls, value: object, info: ValidationInfo) -> Literal["builtin"] | Path:
        if value == "builtin":
            return "builtin"
        if isinstance(value, os.PathLike) or (isinstance(value, str) and value.strip()):
            return resolve(Path(value), base_dir(info.context))
        raise custom_error(
            "calib_source", f"must be 'builtin', a text file or a directory of .txt files (got {show(value)})"
        )


class QuantizationSpec(_Section):
    """How the draft is quantized with ModelOpt before conversion; `none` keeps it in `build.dtype`."""

    format: QuantFormat = "none"
    kv_cache: KvCacheFormat = "none"
    calib: CalibSpec = Field(default_factory=CalibSpec)

    @property
    def enabled(self) -> bool:
        return self.format != "none" or self.kv_cache != "none"


DraftSource = Literal["model", "target_layers"]
"""Where the draft comes from: `model`, a smaller HF checkpoint (`draft.model`); `target_layers`, the target's own
first `draft.layers` decoder layers with its final norm and LM head (a self-draft: nothing to train or ship)."""


class DraftSpec(ModelSource):
    """The model that proposes tokens in `draft_target` mode: a smaller checkpoint sharing the target's tokenizer
    (`model`), or the target's first L layers (`source: target_layers` with `layers: L`).

    A self-draft is written by `convert` as an ordinary draft checkpoint (a copy of those layers, no new weights),
    so build, deploy and the BLS take it as any draft. On the TensorRT path it is a second engine that holds its
    own copy of the L layers' weights and its own KV cache, because TensorRT-LLM's draft-target mode runs two
    separate engines (NVIDIA/TensorRT-LLM examples/draft_target_model/README.md @567239fc: two checkpoints, two
    trtllm-build runs, two tensorrt_llm models each with its own engine_dir and KV-cache fraction); count both in
    GPU memory. Only a runtime that runs draft and target in one process can share them: specbuild's reference
    runtime does (`specbuild.runtime.self_draft.generate_self_draft`: the target's own weight tensors, and the KV
    cache of the first L layers, which the target's verify forward computes anyway)."""

    source: DraftSource = "model"
    model: ModelPath | None = None  # type: ignore[assignment]  # required unless source is target_layers
    layers: Count | None = None
    """`source: target_layers`: how many of the target's decoder layers the draft keeps, 1 <= L < the target's
    num_hidden_layers (`specbuild validate` checks it against the target's config.json). Fewer layers draft
    faster; more agree with the target more often."""
    adapter: SpecPath | None = None
    """`source: target_layers`: an adapter directory from `specbuild draft train` (one decoder layer after the first
    L, distilled from the target's logits to raise acceptance); the draft checkpoint then has L + 1 layers."""
    quantization: QuantizationSpec = Field(default_factory=QuantizationSpec)

    @model_validator(mode="after")
    def _check_source(self) -> DraftSpec:
        issues: list[Issue] = []
        given = self.model_fields_set
        if self.source == "model":
            if self.model is None:
                issues.append((("model",), "required (or set source: target_layers with layers: L for a draft "
                               "made of the target's first L layers)", None))
            if "layers" in given:
                issues.append((("layers",), "only used with source: target_layers (remove it, or set source: "
                               "target_layers and remove model)", None))
            if "adapter" in given:
                issues.append((("adapter",), "only used with source: target_layers (an adapter extends the "
                               "target's own first layers)", None))
        else:
            if self.layers is None:
                issues.append((("layers",), "required when source is 'target_layers': how many of the target's "
                               "first layers the draft keeps", ("source",)))
            for name in ("model", "revision", "trust_remote_code"):
                if name in given:
                    issues.append(((name,), f"given, but source is 'target_layers', which reads the target's "
                                   f"checkpoint (target.{name}); remove it", None))
            if self.adapter is not None and self.quantization.enabled:
                issues.append((("adapter",), "cannot be combined with draft.quantization yet: ModelOpt calibrates "
                               "the target cut to draft.layers layers, without the adapter; remove one of them",
                               None))
        if issues:
            raise_issues(issues)
        return self

    @property
    def is_self_draft(self) -> bool:
        """True when the draft is the target's first `layers` layers (`source: target_layers`)."""
        return self.source == "target_layers"


class MedusaSpec(_Section):
    """Medusa heads (FasterDecoding format) trained on top of the target, and the token tree they fill."""

    revision: Annotated[str, Strict(), Field(min_length=1)] | None = None
    """With a Hub id in `heads`: the branch, tag or commit to use (default `main`)."""
    heads: ModelPath
    """Directory with `medusa_lm_head.safetensors` (or `.pt`) and its config.json, or a Hub id (`owner/name`) whose
    snapshot holds them (only safetensors and JSON are fetched: heads published as `.pt` need a local copy)."""
    choices: str | list[list[int]] = DEFAULT_MEDUSA_CHOICES
    """A preset name (built in: `specbuild/data/medusa_choices/<name>.json`, or `medusa_choices/` next to the
    spec), a path to a .json file, or an explicit list of top-k index paths."""

    _resolved: list[list[int]] = PrivateAttr(default_factory=list)
    _choices_file: Path | None = PrivateAttr(default=None)

    @field_validator("choices", mode="plain")
    @classmethod
    def _check_choices(cls, value: object, info: ValidationInfo) -> str | list[list[int]]:
        if isinstance(value, str):
            load_preset(value, base_dir(info.context))
            return value
        paths, issues = as_paths(value)
        if not issues:  # the tree checks are only meaningful once every entry is a list of integers
            issues = [((), message, None) if index is None else ((index,), message, None)
                      for index, message in medusa_tree_problems(paths)]
        if issues:
            raise_issues(issues)
        return paths

    @model_validator(mode="after")
    def _resolve_choices(self, info: ValidationInfo) -> MedusaSpec:
        if isinstance(self.choices, str):
            self._resolved, self._choices_file = load_preset(self.choices, base_dir(info.context))
        else:
            self._resolved, self._choices_file = [list(path) for path in self.choices], None
        return self

    def resolved_choices(self) -> list[list[int]]:
        """The tree as explicit paths (a fresh copy), whichever way `choices` named it."""
        return [list(path) for path in self._resolved]

    @property
    def choices_file(self) -> Path | None:
        """The preset file the tree came from, or None for an inline list."""
        return self._choices_file

    @property
    def depth(self) -> int:
        """Longest path: the engine needs at least this many Medusa heads."""
        return max((len(path) for path in self._resolved), default=0)


class NGramSpec(_Section):
    """Prompt-lookup drafting (`speculative.mode: ngram`), named as TensorRT-LLM 1.2's `NGramDecodingConfig`
    (tensorrt_llm/llmapi/llm_args.py); the draft length is `speculative.num_draft_tokens` (its max_draft_len)."""

    max_matching_ngram_size: Count = 2
    """Longest suffix of the sequence looked up in the pool. Always written: the 1.2 line's default is 0, later
    releases' 2 (a PositiveInt), which specbuild takes."""
    is_keep_all: Annotated[bool, Strict()] = True
    """Keep every candidate continuation of a pattern, else only one."""
    is_use_oldest: Annotated[bool, Strict()] = True
    """Propose the oldest match of a pattern, else the newest."""
    is_public_pool: Annotated[bool, Strict()] = True
    """One pool shared by all requests, else one per request."""


class SASpec(_Section):
    """Suffix-automaton drafting (`speculative.mode: sa`), named as TensorRT-LLM's `SADecodingConfig`
    (NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/llm_args.py, 1.3 line); the draft length is
    `speculative.num_draft_tokens` (its max_draft_len). The reference runtime's proposer is
    specbuild.runtime.suffix_automaton."""

    max_matching_ngram_size: Annotated[int, Strict()] = -1
    """-1: propose after the longest suffix match; n > 0: try suffixes of n tokens down to 1 (0 is refused)."""
    enable_global_pool: Annotated[bool, Strict()] = False
    """Also match against the other requests' automata (active and recently completed ones)."""
    global_pool_size: Annotated[int, Strict(), Field(ge=1)] | None = None
    """Completed requests kept in the global pool (needs enable_global_pool). Default: max(64, max_batch_size)."""

    @model_validator(mode="after")
    def _check(self) -> SASpec:
        issues: list[Issue] = []
        n = self.max_matching_ngram_size
        if n == 0 or n < -1:
            issues.append((("max_matching_ngram_size",), f"must be > 0 (a fixed n-gram) or -1 (the longest match); "
                           f"got {n}", None))
        elif self.enable_global_pool and n > 64:
            issues.append((("max_matching_ngram_size",), "must be -1 or in [1, 64] with enable_global_pool "
                           f"(got {n})", None))
        if self.global_pool_size is not None and not self.enable_global_pool:
            issues.append((("global_pool_size",), "only used with enable_global_pool: true", None))
        if issues:
            raise_issues(issues)
        return self


class Eagle3Spec(_Section):
    """EAGLE-3 drafting (`speculative.mode: eagle3`), named as TensorRT-LLM 1.2's `EagleDecodingConfig` with an
    EAGLE-3 draft (llm_args.py); `draft.model` is the EAGLE-3 HF draft checkpoint and `speculative.num_draft_tokens`
    its max_draft_len."""

    eagle3_one_model: Annotated[bool, Strict()] = True
    """true (TensorRT-LLM's default): target and draft run as one model in one engine loop; false: two models."""
    eagle3_layers_to_capture: list[Annotated[int, Strict()]] | None = None
    """Target layers whose hidden states feed the draft (-1: the last). Default: the draft checkpoint's own
    choice (the EAGLE-3 low/mid/high layers)."""


class LookaheadSpec(_Section):
    """Lookahead decoding (`speculative.mode: lookahead`): the server's (W, N, G), TensorRT-LLM 1.2's
    `LookaheadDecodingConfig` (executor; llm_args.py's max_window_size / max_ngram_size / max_verification_set_size)
    and the tensorrt_llm model's lookahead_window_size / lookahead_ngram_size / lookahead_verification_set_size.
    The engine's max_draft_len follows from them (`specbuild.contracts.lookahead.max_draft_len`); requests may ask
    for any (w, n, g) up to these. Defaults: TensorRT-LLM's (4, 3, 4)."""

    window_size: Annotated[int, Strict()] = la.DEFAULT_WINDOW_SIZE
    """W: n-grams the lookahead branch grows per step (the Jacobi window)."""
    ngram_size: Annotated[int, Strict()] = la.DEFAULT_NGRAM_SIZE
    """N: tokens per n-gram, the most draft tokens one step can accept plus one."""
    verification_set_size: Annotated[int, Strict()] = la.DEFAULT_VERIFICATION_SET_SIZE
    """G: candidate n-grams from the pool verified per step."""

    @model_validator(mode="after")
    def _check_sizes(self) -> LookaheadSpec:
        problems = la.server_problems(self.window_size, self.ngram_size, self.verification_set_size)
        if problems:
            raise_issues([((name,), message, None) for name, message in problems])
        return self

    @property
    def config(self) -> la.LookaheadConfig:
        return la.LookaheadConfig(self.window_size, self.ngram_size, self.verification_set_size)

    @property
    def max_draft_len(self) -> int:
        """The engine's draft-token capacity for (W, N, G), as TensorRT-LLM computes it."""
        return la.max_draft_len(*self.config)


class SpeculativeSpec(_Section):
    """Which speculative-decoding algorithm the service runs."""

    mode: SpeculativeMode = "none"
    num_draft_tokens: Annotated[int, Strict(), Field(ge=1, le=MAX_DRAFT_TOKENS)] = 4
    """K, the tokens the draft proposes per step (draft_target, ngram, sa, eagle3, mtp; the target engine's
    max_draft_len, or the LLM API's `max_draft_len` on the PyTorch flow; for mtp the MTP steps per round)."""
    ngram: NGramSpec | None = None
    """Settings of `mode: ngram`; default NGramDecodingConfig's defaults."""
    sa: SASpec | None = None
    """Settings of `mode: sa`; default SADecodingConfig's defaults (longest match, no global pool)."""
    eagle3: Eagle3Spec | None = None
    """Settings of `mode: eagle3`; default EagleDecodingConfig's defaults."""
    lookahead: LookaheadSpec | None = None
    """Settings of `mode: lookahead`; default LookaheadDecodingConfig's (4, 3, 4)."""
    max_draft_len: Annotated[int, Strict(), Field(ge=1, le=MAX_DRAFT_TOKENS)] | None = None
    """Draft tokens the engine can verify per step (trtllm-build --max_draft_len). Default: K (draft_target)
    or the tree's node count (medusa). More than that lets the service raise K later without a rebuild, at
    the cost of a bigger engine and KV cache; less is a build error."""
    use_draft_logits: Annotated[bool, Strict()] = False
    """draft_target: accept draft tokens by rejection sampling on the draft's and the target's logits instead
    of by token match; both engines are then built with --gather_generation_logits (TensorRT-LLM#2798)."""
    draft_len_schedule: dict[int, int] | None = None
    """Load-aware speculation, as TensorRT-LLM's `draft_len_schedule`: active sequences -> draft length, each
    entry from that many on ({1: 4, 4: 2, 8: 0}: K=4 alone, 2 from 4 sequences, none from 8). Must map 1 to the
    full length (num_draft_tokens; the tree's node count for medusa, whose tree then shrinks to its first K
    paths; for lookahead the draft length (W, N, G) gives, and 0 turns the windows off: reference backend only).
    `specbuild tune` measures and writes it. Default: the full length at any load."""
    max_concurrency: Annotated[int, Strict(), Field(ge=1)] | None = None
    """Speculation off above this many active sequences (TensorRT-LLM's `max_concurrency`). Default: never off."""
    plain_round_tokens: Annotated[int, Strict(), Field(ge=1)] | None = None
    """draft_target on the engine flow (the BLS): the most tokens of a round without speculation, when the schedule
    or max_concurrency turns K to 0. Each such round is one call to the target and one streamed response; they start
    at 4 tokens (or this, if less) and double up to this. 1 streams every token, at the cost of a call per token;
    more loses less of plain decoding's rate under load and streams in coarser chunks. Default: 8."""

    @model_validator(mode="after")
    def _check_draft_settings(self) -> SpeculativeSpec:
        issues: list[Issue] = []
        given = self.model_fields_set
        if self.use_draft_logits and self.mode != "draft_target":
            issues.append((("use_draft_logits",), f"only used in draft_target mode (mode is {self.mode!r})", None))
        if self.max_draft_len is not None and self.mode == "none":
            issues.append((("max_draft_len",), "only used with speculative decoding (mode is 'none')", None))
        elif self.max_draft_len is not None and self.mode == "draft_target" and (
            self.num_draft_tokens > self.max_draft_len
        ):
            line = ("num_draft_tokens",) if "num_draft_tokens" in given else ("max_draft_len",)
            issues.append((
                ("max_draft_len",),
                f"{self.max_draft_len} is less than num_draft_tokens ({self.num_draft_tokens}); the target engine "
                "would refuse every draft ('Number of draft tokens is larger than maximum number of draft tokens')",
                line,
            ))
        if self.plain_round_tokens is not None and self.mode != "draft_target":
            issues.append((("plain_round_tokens",), f"only used in draft_target mode, by the BLS's rounds (mode is "
                           f"{self.mode!r})", None))
        if self.draft_len_schedule is not None and self.mode == "none":
            issues.append((("draft_len_schedule",), "only used with speculative decoding (mode is 'none')", None))
        elif self.draft_len_schedule is not None and self.mode in K_MODES:
            issues += [(("draft_len_schedule",), problem, None)
                       for problem in schedule_problems(self.draft_len_schedule, self.num_draft_tokens)]
        if self.mode == "lookahead":
            issues += _lookahead_issues(self)
        for section in ("ngram", "sa", "eagle3", "lookahead"):
            if section in given and getattr(self, section) is not None and self.mode != section:
                issues.append(((section,), f"given, but mode is {self.mode!r}, which does not use it (remove it, "
                               f"or set mode: {section})", None))
        if issues:
            raise_issues(issues)
        return self

    def lookahead_config(self) -> LookaheadSpec:
        """`speculative.lookahead`, or TensorRT-LLM's defaults when the section is left out."""
        return self.lookahead if self.lookahead is not None else LookaheadSpec()


class BuildSpec(_Section):
    """Engine limits. They fix memory use, so the three max_* have no default (trtllm-build's batch 2048 is
    a trap)."""

    flow: Flow = "engine"
    """`engine`: TensorRT-LLM checkpoints -> engines (built where `backend` says) -> the tensorrtllm Triton backend.
    `pytorch`: TensorRT-LLM's LLM API on its PyTorch backend (HF checkpoints, no engine step; `build` validates
    the LLM-API settings, `deploy` writes Triton's llmapi model and a trtllm-serve command)."""
    trtllm: TrtllmLine | None = None
    """The TensorRT-LLM release line served ("1.2", "1.3"): its LLM-API field names are what build checks and
    deploy writes. Default: "1.2" on `flow: engine` (the only line with engines), the newest line on `pytorch`."""
    backend: Backend = "auto"
    """`tensorrt` runs trtllm-build (NVIDIA GPU + TensorRT-LLM); `reference` packages checkpoints for
    specbuild's PyTorch runtime; `auto` picks tensorrt where TensorRT-LLM is importable (engine flow only)."""
    dtype: BuildDType = "auto"
    tp_size: Count = 1
    pp_size: Count = 1
    max_batch_size: Count
    max_input_len: Count
    max_output_len: Count
    max_num_tokens: Count | None = None
    """Tokens one engine step processes across the batch (trtllm-build --max_num_tokens). Default: enough for a
    whole prompt and for batch x (draft length + 1) verification tokens, at most 8192 unless those need more."""
    gather_context_logits: Annotated[bool, Strict()] = False
    """Return prompt logits too (trtllm-build --gather_context_logits); TensorRT-LLM refuses it on an engine with
    a draft length, so only the plain target or a draft may use it."""
    gpu: Annotated[str, Strict(), Field(min_length=1)] | None = None
    """The GPU the engines are built for, e.g. H100, L40S, A100, or a compute capability such as '8.9'; checks
    that it runs the checkpoints' quantization (fp8 needs Ada/Hopper or newer). Default: the GPU nvidia-smi
    shows, when there is one."""
    gpu_memory_gb: Annotated[float, Field(gt=0)] | None = None
    """Memory of that GPU in GiB, the unit of NVIDIA's product names and nvidia-smi (80 for an "H100 80GB");
    `build` warns when weights + KV cache for the limits above would not fit.
    Default: the named GPU's memory, or what nvidia-smi shows."""

    @field_validator("trtllm", mode="before")
    @classmethod
    def _quoted_line(cls, value: object) -> object:
        """YAML reads an unquoted 1.3 as a number, and 1.10 as 1.1: a release line given as a number is refused as
        such, with the quotes that fix it, not compared with the lines as the number it became."""
        if isinstance(value, int | float) and not isinstance(value, bool):
            lines = get_args(TrtllmLine)
            fix = f"trtllm: '{value}'" if str(value) in lines else f"one of {' or '.join(map(repr, lines))}"
            raise_issues([((), f"YAML read the unquoted {show(value)} as a number, not a release line (1.10 would "
                           f"even read as 1.1); quote it: {fix}", None)])
        return value

    @model_validator(mode="after")
    def _check_line(self) -> BuildSpec:
        if self.flow == "engine" and self.trtllm not in (None, ENGINE_TRTLLM_LINE):
            raise_issues([(("trtllm",), f"TensorRT-LLM {self.trtllm} has no engine flow (trtllm-build and the "
                           f"C++ Triton backend end with {ENGINE_TRTLLM_LINE}): set build.flow: pytorch, or "
                           f"build.trtllm: '{ENGINE_TRTLLM_LINE}' (`specbuild migrate` moves a spec over)", None)])
        return self

    @property
    def line(self) -> str:
        """`trtllm`, or its default for the flow."""
        if self.trtllm is not None:
            return self.trtllm
        return ENGINE_TRTLLM_LINE if self.flow == "engine" else NEWEST_TRTLLM_LINE

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size

    @property
    def max_seq_len(self) -> int:
        return self.max_input_len + self.max_output_len


class DeploySpec(_Section):
    """The Triton model repository and the server that serves it."""

    model_repository: SpecPath | None = None
    """Default `<output_dir>/model_repository`; always set after loading."""
    triton_max_batch_size: Count | None = None
    """Triton-side batch limit (`max_batch_size` in every config.pbtxt). Default `build.max_batch_size`."""
    decoupled: Annotated[bool, Strict()] = False
    """true: responses stream token by token (gRPC stream, /generate_stream); plain HTTP /infer and unary
    gRPC then refuse the model. TensorRT-LLM's own recipes keep draft-target models non-decoupled."""
    exclude_input_in_output: Annotated[bool, Strict()] = False
    """The LLM models' `exclude_input_in_output` parameter: false (the TensorRT-LLM backend's default) puts the
    prompt at the head of output_ids and of the ensemble's text_output; true returns the completion only. A
    request's own exclude_input_in_output input overrides it."""
    http_port: Port = 8000
    grpc_port: Port = 8001
    metrics_port: Port = 8002
    target: Literal["triton", "dynamo"] = "triton"
    """`triton`: the Triton model repository; `dynamo`: NVIDIA Dynamo's frontend, router and workers
    (`deploy.dynamo`; specbuild.dynamo), served on http_port."""
    dynamo: DynamoSpec = Field(default_factory=DynamoSpec)
    kubernetes: KubernetesSpec = Field(default_factory=KubernetesSpec)
    """The tritonserver Deployment and Service `deploy` writes beside a repository of TensorRT-LLM engines."""

    @model_validator(mode="after")
    def _distinct_ports(self) -> DeploySpec:
        ports = {"http_port": self.http_port, "grpc_port": self.grpc_port, "metrics_port": self.metrics_port}
        names = list(ports)
        issues: list[Issue] = []
        for index, name in enumerate(names):
            for other in names[:index]:
                if ports[name] != ports[other]:
                    continue
                # Blame the port the user wrote, not the default it collides with.
                blamed, partner = (other, name) if name not in self.model_fields_set else (name, other)
                message = f"port {ports[name]} is also {partner}; tritonserver needs three distinct ports"
                issues.append(((blamed,), message, None))
        if issues:
            raise_issues(issues)
        return self


class PipelineSpec(_Section):
    """A whole pipeline: sources, algorithm, engine limits and deployment, from one YAML file."""

    name: Annotated[str, Strict()]
    """Names the pipeline's directories; letters, digits, `.`, `_`, `-`."""
    output_dir: SpecPath = Path("build")
    """Where the stages write; default `build/<name>` next to the spec."""
    target: TargetSpec
    draft: DraftSpec | None = None
    medusa: MedusaSpec | None = None
    speculative: SpeculativeSpec = Field(default_factory=SpeculativeSpec)
    build: BuildSpec
    deploy: DeploySpec = Field(default_factory=DeploySpec)

    _path: Path | None = PrivateAttr(default=None)
    _lines: Any = PrivateAttr(default=None)  # the YAML's field -> line map (`line_of`)

    @model_validator(mode="before")
    @classmethod
    def _default_output_dir(cls, data: Any) -> Any:
        if isinstance(data, dict) and "output_dir" not in data and isinstance(data.get("name"), str):
            return {**data, "output_dir": str(Path("build") / data["name"])}
        return data

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if not _NAME_RE.fullmatch(value):  # not match: its `$` lets a trailing newline through
            raise custom_error(
                "name_pattern",
                f"must be 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit "
                f"(got {show(value)})",
            )
        return value

    @model_validator(mode="after")
    def _check_pipeline(self, info: ValidationInfo) -> PipelineSpec:
        self._path = spec_path_from(info.context)
        issues = _spec_mode_issues(self)
        if issues:
            raise_issues(issues)
        if self.deploy.model_repository is None:
            self.deploy.model_repository = self.output_dir / "model_repository"
        if self.deploy.triton_max_batch_size is None:
            self.deploy.triton_max_batch_size = self.build.max_batch_size
        return self

    @property
    def path(self) -> Path:
        """The spec file this was loaded from (absolute)."""
        if self._path is None:
            # Not AttributeError: pydantic's __getattr__ would replace this message with a generic one.
            raise RuntimeError("this PipelineSpec was not loaded from a file; use load_spec or parse_spec")
        return self._path

    @property
    def where(self) -> str:
        """What a message names as the spec: its file, or its name when it was made in memory (no file)."""
        return str(self._path) if self._path is not None else self.name

    def line_of(self, loc: Loc) -> int | None:
        """The spec file's line for a field path (its nearest written parent when the key is not written)."""
        return self._lines.line_of(loc) if self._lines is not None else None

    def problems_error(self, problems: Sequence[tuple[Loc, str]], *, hint: str | None = None) -> SpecValidationError:
        """Problems found beyond the schema (by `specbuild validate`), located and rendered as the schema's are."""
        located = [SpecProblem(loc, message, self.line_of(loc)) for loc, message in problems]
        return SpecValidationError(sorted_problems(located), self.where, hint=hint)

    def checkpoint_dir(self, role: str) -> Path:
        """Where `convert` writes the TensorRT-LLM checkpoint for `role` (target, draft or medusa)."""
        if role not in ROLES:
            raise ValueError(f"unknown checkpoint role {role!r}; expected one of {', '.join(ROLES)}")
        return self.output_dir / "checkpoints" / role

    @property
    def full_draft_len(self) -> int:
        """Draft tokens a step proposes at full length: K for draft_target, tree size for medusa, 0 without
        speculation. Not `speculative.max_draft_len`, the engine's capacity (trtllm-build --max_draft_len), which
        defaults to this and may be larger (`contracts.engine_limits.engine_max_draft_len`)."""
        if self.speculative.mode in K_MODES:
            return self.speculative.num_draft_tokens
        if self.speculative.mode == "medusa" and self.medusa is not None:
            return len(self.medusa.resolved_choices())
        if self.speculative.mode == "lookahead":
            return self.speculative.lookahead_config().max_draft_len
        return 0


def _lookahead_issues(speculative: SpeculativeSpec) -> list[Issue]:
    """Lookahead fixes its own draft length from (W, N, G). Its load schedule only turns it on or off: a length
    is that draft length (on) or 0 (off), and, as Medusa's tree schedule, only specbuild's reference models read it
    (NVIDIA's C++ backend has no such parameter)."""
    issues: list[Issue] = []
    need = speculative.lookahead_config().max_draft_len
    if speculative.max_draft_len is not None and speculative.max_draft_len != need:
        issues.append((("max_draft_len",), f"{speculative.max_draft_len}, but lookahead (W, N, G) needs exactly "
                       f"{need}: TensorRT-LLM's executor requires the engine's max_draft_len to equal the one (W, N, "
                       "G) gives (examples/lookahead/README.md); leave it out", None))
    schedule = speculative.draft_len_schedule
    if schedule is not None:
        issues += [(("draft_len_schedule",), f"{problem} (the draft length lookahead (W, N, G) gives)", None)
                   for problem in schedule_problems(schedule, need)]
        partial = sorted(length for length in set(schedule.values()) - {0, need} if isinstance(length, int))
        if partial:
            issues.append((("draft_len_schedule",), f"lengths {partial}: a Lookahead schedule turns the windows "
                           f"on ({need}, the draft length (W, N, G) gives) or off (0), nothing between", None))
    return issues


def _mode_issues(mode: str, present: dict[str, bool], k_given: bool) -> Iterator[Issue]:
    """Sections must match the mode: a missing one cannot work; an unused one would be silently ignored."""
    owner = {"draft": "draft_target", "medusa": "medusa"}
    users = {"draft": DRAFT_MODES, "medusa": ("medusa",)}
    for section, needed_by in owner.items():
        if mode in users[section] and not present[section]:
            yield (section,), f"required when speculative.mode is {mode!r}", ("speculative", "mode")
        elif present[section] and mode not in users[section]:
            yield (
                (section,),
                f"given, but speculative.mode is {mode!r}, which does not use it "
                f"(remove it, or set speculative.mode: {needed_by})",
                None,
            )
    if mode not in K_MODES and k_given:
        yield (
            ("speculative", "num_draft_tokens"),
            f"only used in draft_target mode (mode is {mode!r}; a Medusa tree sets its own length)",
            None,
        )


def _spec_mode_issues(spec: PipelineSpec) -> list[Issue]:
    present = {"draft": spec.draft is not None, "medusa": spec.medusa is not None}
    k_given = "num_draft_tokens" in spec.speculative.model_fields_set
    issues = list(_mode_issues(spec.speculative.mode, present, k_given))
    issues += dynamo_issues(spec)
    if spec.draft is not None and spec.draft.is_self_draft:
        if spec.speculative.mode != "draft_target":
            issues.append((("draft", "source"), f"target_layers makes a draft-target draft; speculative.mode "
                           f"{spec.speculative.mode!r} needs its own draft checkpoint in draft.model", None))
        elif spec.build.flow == "pytorch":
            issues.append((("draft", "source"), "target_layers needs build.flow: engine: `convert` writes the "
                           "self-draft as a TensorRT-LLM checkpoint, and the PyTorch flow's LLM API loads the draft "
                           "from a Hugging Face checkpoint (draft.model)", None))
    if spec.speculative.plain_round_tokens is not None and spec.build.flow == "pytorch":
        issues.append((("speculative", "plain_round_tokens"), "only used on build.flow: engine, by the BLS's rounds: "
                       "the PyTorch flow's Draft_Target decodes a step without speculation in its running batch, "
                       "streaming every token (remove it)", None))
    schedule = spec.speculative.draft_len_schedule
    if schedule is not None and spec.speculative.mode == "medusa" and spec.medusa is not None:
        choices = spec.medusa.resolved_choices()
        issues += [(("speculative", "draft_len_schedule"), f"{problem} (the Medusa tree's node count)", None)
                   for problem in schedule_problems(schedule, len(choices))]
        for length in sorted(set(schedule.values()) - {0}):
            if medusa_tree_problems(choices[:length]):
                issues.append((("speculative", "draft_len_schedule"),
                               f"the tree's first {length} paths are not a tree (a path before its prefix): order "
                               "medusa.choices so every leading slice is a tree, as the presets and tuned trees "
                               "are", None))
    return issues


def raw_mode_issues(data: dict[str, Any]) -> list[Issue]:
    """The mode checks on unvalidated data, so they are reported along with type errors elsewhere."""
    speculative = data.get("speculative")
    speculative = speculative if isinstance(speculative, dict) else {}
    mode = speculative.get("mode", "none")
    if mode not in get_args(SpeculativeMode):
        return []
    present = {section: data.get(section) is not None for section in ("draft", "medusa")}
    return list(_mode_issues(mode, present, "num_draft_tokens" in speculative))


def dynamo_issues(spec: PipelineSpec) -> list[Issue]:
    """Why this spec's Dynamo deployment cannot run (empty when it can, or when the target is not Dynamo)."""
    deploy = spec.deploy
    if deploy.target != "dynamo":
        # A section with only defaults is no request (a dumped spec re-validated holds one)
        if "dynamo" in deploy.model_fields_set and deploy.dynamo != DynamoSpec():
            return [(("deploy", "dynamo"), "only used with deploy.target: dynamo (set it, or remove the section)",
                     None)]
        return []
    dynamo, issues = deploy.dynamo, []
    if (problem := dynamo_name_problem(spec.name, dynamo)) is not None:
        issues.append((("name",), problem, None))
    here = ("deploy", "dynamo")
    given = dynamo.model_fields_set
    if dynamo.engine == "trtllm" and spec.build.flow != "pytorch":
        issues.append(((*here, "engine"), "Dynamo's TensorRT-LLM worker (python -m dynamo.trtllm) runs the LLM API's "
                       "PyTorch backend, and build.flow is 'engine' (set build.flow: pytorch, or engine: vllm or "
                       "sglang)", None))
    gpus = spec.build.world_size
    if gpus > dynamo.gpus_per_node:
        issues.append((("build", "tp_size"), f"a Dynamo worker needs tp_size x pp_size = {gpus} GPUs on one node, and "
                       f"deploy.dynamo.gpus_per_node is {dynamo.gpus_per_node} (specbuild writes no multinode "
                       "workers: lower tp_size/pp_size, or raise gpus_per_node to your nodes' count)", None))
    if dynamo.mode == "disaggregated":
        if dynamo.kv_transfer is None:
            issues.append(((*here, "kv_transfer"), "required with mode: disaggregated (how the KV cache moves from "
                           f"prefill to decode workers; {dynamo.engine}: "
                           f"{', '.join(KV_TRANSFERS[dynamo.engine])})", None))
        elif dynamo.kv_transfer not in KV_TRANSFERS[dynamo.engine]:
            issues.append(((*here, "kv_transfer"), f"{dynamo.kv_transfer!r} is not a KV transfer {dynamo.engine} "
                           f"takes (one of {', '.join(KV_TRANSFERS[dynamo.engine])})", None))
        if "workers" in given:
            issues.append(((*here, "workers"), "only used with mode: aggregated (set prefill_workers and "
                           "decode_workers)", None))
    else:
        for name in ("prefill_workers", "decode_workers", "kv_transfer"):
            if name in given:
                issues.append(((*here, name), "only used with mode: disaggregated", None))
    return issues
