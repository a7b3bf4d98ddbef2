"""What a spec asks of TensorRT-LLM's LLM API (the PyTorch backend), one table per release line, and which flow runs
which mode.

`build.flow: pytorch` has no engine: the LLM API takes the HF checkpoints and a handful of `LlmArgs` settings, one
of them a `speculative_config`. `build` checks those settings against the spec's line (`build.trtllm`) and records
them; `deploy` writes them into Triton's llmapi `model.yaml` and a `trtllm-serve` options file, in that line's
spelling. Each line is DATA (`Line`): its decoding types (the `decoding_type` string a YAML `speculative_config`
names its class by, each config's own fields, `supports_backend`), the `DecodingBaseConfig` fields, and which
decoding type each spec mode becomes. Where they were read (NVIDIA/TensorRT-LLM `tensorrt_llm/llmapi/llm_args.py`):
- line 1.2 (the last with engines): the 1.2-line llm_args.py at commit 195839a7 (release tag v1.2.0 of
  NVIDIA/TensorRT-LLM is the one to compare against): `DecodingBaseConfig.from_dict` keys DraftTarget, Eagle,
  NGram, Medusa, Lookahead, MTP, AUTO; `supports_backend`: Medusa and Lookahead False for "pytorch", NGram, MTP and
  AUTO "pytorch" only, DraftTarget "pytorch" or "_autodeploy", Eagle the base class's True; acceptance switch-off
  fields `acceptance_window` / `acceptance_length_threshold`. EAGLE-3 is `EagleDecodingConfig` with an EAGLE-3
  draft (torch spec_dec_mode EAGLE3 / EAGLE3_ONE_MODEL).
- line 1.3 (PyTorch backend only): llm_args.py @0004396720054fd8e205cbf616f21f0b57c6b412 of NVIDIA/TensorRT-LLM,
  a 1.3-line commit (no MedusaDecodingConfig or LookaheadDecodingConfig any more; EagleDecodingConfig's
  eagle_choices validator warns it "will be removed in release 1.4"): decoding types Eagle, Eagle3
  (`Eagle3DecodingConfig(EagleDecodingConfig)`, adds `sa_config`), SaveState, User_Provided, NGram, SA,
  Draft_Target, MTP, PARD, DFlash, DSpark, AUTO; `DecodingBaseConfig` renames the switch-off fields to
  `acceptance_rate_window_size` / `acceptance_rate_threshold` (a rate in [0, 1]), adds use_rejection_sampling,
  advanced_sampling_mode, enable_penalty; its validators: `max_concurrency` and `draft_len_schedule` are mutually
  exclusive, and the schedule's smallest batch-size key must map to max_draft_len, no entry above it. Also checked
  (`Line.rules`, `Line.field_aliases`): AutoDecodingConfig.supports_backend is pytorch only; `speculative_model_dir`
  is a validation alias of `speculative_model`; SA's explicit global_pool_size must be >= max_batch_size;
  MTPDecodingConfig's `num_nextn_predict_layers` is deprecated and remapped into `max_draft_len`; an explicit
  `use_rejection_sampling: true` raises for NGram and SA (TorchLlmArgs.validate_speculative_config).
The 1.4 release candidates were not reachable in the source index, so no 1.4 table is written (a line is added
here only from its own llm_args.py).
`BaseLlmArgs` fields specbuild sets (both lines): model, tensor_parallel_size, pipeline_parallel_size,
max_batch_size, max_seq_len, max_num_tokens (default 8192), speculative_config, backend, dtype (default "auto").
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from specbuild.contracts.engine_limits import default_max_num_tokens
from specbuild.contracts.family_support import family_problems
from specbuild.contracts.quant_formats import FORMATS, PYTORCH_LINEAR_SOURCE
from specbuild.errors import SpecbuildError
from specbuild.spec import PipelineSpec
from specbuild.spec.problems import Loc
from specbuild.spec.schema import NEWEST_TRTLLM_LINE, Eagle3Spec, NGramSpec, SASpec, TrtllmLine

LLMAPI_MODEL_SOURCE = ("NVIDIA/TensorRT-LLM triton_backend/all_models/llmapi/tensorrt_llm/ (config.pbtxt @0a710573, "
                       "1/model.yaml @0ebb1536, 1/model.py @044a90d2)")
SERVE_SOURCE = ("NVIDIA/TensorRT-LLM tensorrt_llm/commands/serve.py (click options --backend, --tp_size, --pp_size, "
                "--max_batch_size, --max_num_tokens, --max_seq_len, --trust_remote_code, --extra_llm_api_options; "
                "the same on both lines: NVIDIA's own launchers of the 1.3 line still pass them, e.g. "
                "`--backend pytorch --tp_size N --extra_llm_api_options FILE`)")
PYTORCH = "pytorch"
"""`LlmArgs.backend` of the PyTorch flow (and trtllm-serve's default `--backend`)."""


@dataclass(frozen=True)
class DecodingType:
    """One LLM-API decoding config: its class, the `decoding_type` string `from_dict` dispatches on, its own fields,
    and the backends its `supports_backend` accepts (None: every backend, the base class's answer)."""

    config_class: str
    decoding_type: str
    fields: frozenset[str]
    backends: frozenset[str] | None

    def supports(self, backend: str) -> bool:
        return self.backends is None or backend in self.backends


def _types(*types: DecodingType) -> dict[str, DecodingType]:
    return {t.decoding_type: t for t in types}


_PYTORCH_ONLY = frozenset({"pytorch"})
_TORCH_OR_AUTODEPLOY = frozenset({"pytorch", "_autodeploy"})
_ENGINE_ONLY = frozenset({"tensorrt"})  # supports_backend: backend not in ("pytorch", "_autodeploy")
_EAGLE_FIELDS = frozenset({
    "eagle_choices", "greedy_sampling", "posterior_threshold", "use_dynamic_tree", "dynamic_tree_max_topK",
    "num_eagle_layers", "max_non_leaves_per_layer", "eagle3_one_model", "eagle3_layers_to_capture",
    "eagle3_model_arch"})
_NGRAM_FIELDS = frozenset({"max_matching_ngram_size", "is_keep_all", "is_use_oldest", "is_public_pool"})


Settings = Mapping[str, Any]


@dataclass(frozen=True)
class Rule:
    """One validator of a line's llm_args.py (`Line.source`) on the speculative settings, as data: `check(args,
    config)` says why the line's LLM(...) would raise for these settings (None: it would not); `validator` names the
    llm_args.py validator that raises, `field` the spec field a spec's problem is reported at."""

    validator: str
    field: Loc
    check: Callable[[Settings, Settings], str | None]


@dataclass(frozen=True)
class Line:
    """One TensorRT-LLM release line's LLM API as data: what `build`/`deploy` write and check for a spec naming it.

    `mode_types` maps a spec `speculative.mode` to the line's decoding_type (a mode missing here is one the line
    lacks: `missing_modes` says what to use instead); `acceptance_fields` are the (window, threshold) names of the
    acceptance switch-off; `engine_flow` whether the line still builds engines; `exclusive_schedule` whether
    max_concurrency and draft_len_schedule are mutually exclusive and the schedule's smallest key must hold
    max_draft_len (validators of the line's DecodingBaseConfig)."""

    name: str
    source: str
    base_fields: frozenset[str]
    decoding_types: dict[str, DecodingType]
    mode_types: dict[str, str]
    acceptance_fields: tuple[str, str]
    engine_flow: bool
    writes_eagle3_one_model: bool
    exclusive_schedule: bool
    missing_modes: dict[str, str] = field(default_factory=dict)
    field_aliases: dict[str, tuple[str, frozenset[str] | None]] = field(default_factory=dict)
    """speculative_config key -> (the field it sets, the decoding types it applies to; None: every type): a pydantic
    validation alias, or a deprecated key the line remaps. A reader of model.yaml takes either spelling; both given
    with different values is a problem (the line reads the field and drops the alias)."""
    rules: tuple[Rule, ...] = ()
    """The line's LlmArgs validators on speculative settings beyond field names and backends (`Rule`)."""

    @property
    def label(self) -> str:
        """How a user is told the line: a version, never a commit."""
        return f"TensorRT-LLM {self.name}"

    def fields_of(self, decoding: DecodingType) -> frozenset[str]:
        return self.base_fields | decoding.fields


LINE_1_2 = Line(
    name="1.2",
    source="NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/llm_args.py, 1.2 line (commit 195839a7; tag v1.2.0)",
    base_fields=frozenset({
        "max_draft_len", "max_total_draft_tokens", "speculative_model", "max_concurrency", "draft_len_schedule",
        "load_format", "acceptance_window", "acceptance_length_threshold", "allow_advanced_sampling"}),
    decoding_types=_types(
        DecodingType("DraftTargetDecodingConfig", "DraftTarget", frozenset(), _TORCH_OR_AUTODEPLOY),
        DecodingType("EagleDecodingConfig", "Eagle", _EAGLE_FIELDS, None),
        DecodingType("NGramDecodingConfig", "NGram", _NGRAM_FIELDS, _PYTORCH_ONLY),
        DecodingType("MedusaDecodingConfig", "Medusa", frozenset({"medusa_choices", "num_medusa_heads"}),
                     _ENGINE_ONLY),
        DecodingType("LookaheadDecodingConfig", "Lookahead", frozenset({
            "max_window_size", "max_ngram_size", "max_verification_set_size"}), _ENGINE_ONLY),
        DecodingType("MTPDecodingConfig", "MTP", frozenset({
            "num_nextn_predict_layers", "use_relaxed_acceptance_for_thinking", "relaxed_topk", "relaxed_delta",
            "use_mtp_vanilla", "mtp_eagle_one_model"}), _PYTORCH_ONLY),
        DecodingType("AutoDecodingConfig", "AUTO", frozenset(), _PYTORCH_ONLY),
    ),
    mode_types={"draft_target": "DraftTarget", "eagle3": "Eagle", "ngram": "NGram", "medusa": "Medusa",
                "lookahead": "Lookahead"},
    missing_modes={"sa": "TensorRT-LLM 1.2 has no SA (no SADecodingConfig in its llm_args.py): set build.trtllm: "
                         "'1.3', or use speculative.mode: ngram",
                   "mtp": "specbuild writes MTP in TensorRT-LLM 1.3's spelling only (MTPDecodingConfig with "
                          "max_draft_len; 1.2's K field, num_nextn_predict_layers, is deprecated there): set "
                          "build.trtllm: '1.3'"},
    acceptance_fields=("acceptance_window", "acceptance_length_threshold"),
    field_aliases={"speculative_model_dir": ("speculative_model", None)},  # its DecodingBaseConfig's alias too
    engine_flow=True,
    writes_eagle3_one_model=True,
    exclusive_schedule=False,
)

_REJECTION_SAMPLING_TYPES = frozenset({"Eagle", "Eagle3", "MTP", "PARD", "DFlash", "DSpark", "Draft_Target"})
"""1.3's TorchLlmArgs.validate_speculative_config: the decoding types with a rejection-sampling path (Eagle3
one-model, vanilla MTP and MTP-Eagle one-model, PARD, DFlash, DSpark, DraftTarget one-model; Eagle is turned into
Eagle3 there first). Every other type (NGram, SA, SaveState, User_Provided, AUTO) drafts token ids with no proposal
distribution q to form min(1, p/q) from, and an explicit `use_rejection_sampling: true` raises for it."""


def _sa_pool_problem(args: Settings, config: Settings) -> str | None:
    pool, batch = config.get("global_pool_size"), args.get("max_batch_size")
    if config.get("decoding_type") == "SA" and pool is not None and batch is not None and int(pool) < int(batch):
        return (f"global_pool_size ({pool}) must be >= max_batch_size ({batch}): every active request keeps its SA "
                "state in the pool; raise speculative.sa.global_pool_size or leave it unset (max(64, "
                "max_batch_size))")
    return None


def _rejection_problem(args: Settings, config: Settings) -> str | None:
    if config.get("use_rejection_sampling") is not True:
        return None
    kind = str(config.get("decoding_type"))
    if kind not in _REJECTION_SAMPLING_TYPES:
        return (f"use_rejection_sampling: true is refused for {kind}: its drafts carry no proposal distribution to "
                f"accept by p/q (rejection sampling runs with {', '.join(sorted(_REJECTION_SAMPLING_TYPES))})")
    if config.get("sa_config") is not None:
        return "use_rejection_sampling: true is refused with sa_config (SA drafts carry no proposal distribution)"
    return None


_RULES_1_3 = (
    Rule("TorchLlmArgs.validate_speculative_config (SADecodingConfig)",
         ("speculative", "sa", "global_pool_size"), _sa_pool_problem),
    Rule("TorchLlmArgs.validate_speculative_config (use_rejection_sampling)",
         ("speculative", "mode"), _rejection_problem),
)
"""1.3's validators beyond field names and backends (AutoDecodingConfig.supports_backend, pytorch only, is its
table entry; the speculative_model_dir alias and MTP's deprecated num_nextn_predict_layers are its field_aliases)."""

_SA_ENHANCED = frozenset({"sa_config"})
LINE_1_3 = Line(
    name="1.3",
    source="NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/llm_args.py @0004396720054fd8e205cbf616f21f0b57c6b412 (1.3 line)",
    # every 1.3 fact below (tables, field_aliases, rules) is read at this commit
    base_fields=frozenset({
        "max_draft_len", "max_total_draft_tokens", "speculative_model", "max_concurrency", "draft_len_schedule",
        "load_format", "acceptance_rate_window_size", "acceptance_rate_threshold", "use_rejection_sampling",
        "allow_advanced_sampling", "advanced_sampling_mode", "enable_penalty"}),
    decoding_types=_types(
        DecodingType("EagleDecodingConfig", "Eagle", _EAGLE_FIELDS, None),
        DecodingType("Eagle3DecodingConfig", "Eagle3", _EAGLE_FIELDS | _SA_ENHANCED, None),
        DecodingType("SaveHiddenStatesDecodingConfig", "SaveState", frozenset({
            "output_directory", "write_interval", "file_prefix", "eagle3_layers_to_capture"}), None),
        DecodingType("UserProvidedDecodingConfig", "User_Provided", frozenset({"drafter", "resource_manager"}), None),
        DecodingType("NGramDecodingConfig", "NGram", _NGRAM_FIELDS, _PYTORCH_ONLY),
        DecodingType("SADecodingConfig", "SA", frozenset({
            "max_matching_ngram_size", "enable_global_pool", "global_pool_size"}), _PYTORCH_ONLY),
        DecodingType("DraftTargetDecodingConfig", "Draft_Target", frozenset(), _TORCH_OR_AUTODEPLOY),
        DecodingType("MTPDecodingConfig", "MTP", frozenset({
            "use_relaxed_acceptance_for_thinking", "relaxed_topk", "relaxed_delta", "use_mtp_vanilla",
            "mtp_eagle_one_model", "use_dynamic_tree", "dynamic_tree_max_topK", "sa_config",
            "begin_thinking_phase_token", "end_thinking_phase_token"}),
            _TORCH_OR_AUTODEPLOY),
        DecodingType("PARDDecodingConfig", "PARD", frozenset({"mask_token_id"}) | _SA_ENHANCED, _PYTORCH_ONLY),
        DecodingType("DFlashDecodingConfig", "DFlash", frozenset({
            "mask_token_id", "target_layer_ids", "attention_backend"}), _PYTORCH_ONLY),
        DecodingType("DSparkDecodingConfig", "DSpark", frozenset({
            "mask_token_id", "target_layer_ids", "block_size", "markov_rank", "markov_head_type",
            "attention_backend"}), _PYTORCH_ONLY),
        DecodingType("AutoDecodingConfig", "AUTO", frozenset(), _PYTORCH_ONLY),  # supports_backend: pytorch
    ),
    mode_types={"draft_target": "Draft_Target", "eagle3": "Eagle3", "ngram": "NGram", "sa": "SA", "mtp": "MTP"},
    acceptance_fields=("acceptance_rate_window_size", "acceptance_rate_threshold"),
    engine_flow=False,
    writes_eagle3_one_model=False,  # deprecated there: False "is ignored and falls back to True"
    exclusive_schedule=True,
    field_aliases={
        # DecodingBaseConfig.speculative_model: validation_alias AliasChoices("speculative_model",
        # "speculative_model_dir")
        "speculative_model_dir": ("speculative_model", None),
        # MTPDecodingConfig._remap_deprecated_num_nextn_predict_layers: moved into max_draft_len when that is
        # absent, dropped (with a deprecation warning) when it is given
        "num_nextn_predict_layers": ("max_draft_len", frozenset({"MTP"})),
    },
    rules=_RULES_1_3,
    missing_modes={
        "medusa": "TensorRT-LLM 1.3 has no Medusa (no MedusaDecodingConfig in its llm_args.py): train an EAGLE-3 "
                  "draft with `specbuild eagle train` and use speculative.mode: eagle3 (`specbuild migrate SPEC "
                  "OUT.yaml` writes that spec), or keep Medusa on build.flow: engine with build.trtllm: '1.2'",
        "lookahead": "TensorRT-LLM 1.3 has no Lookahead (no LookaheadDecodingConfig in its llm_args.py): use "
                     "speculative.mode: ngram, its training-free successor (`specbuild migrate SPEC OUT.yaml`), "
                     "or keep Lookahead on build.flow: engine with build.trtllm: '1.2'",
    },
)

LINES: dict[str, Line] = {line.name: line for line in (LINE_1_2, LINE_1_3)}
"""Every line specbuild writes for, oldest first; `build.trtllm` names one (schema.TrtllmLine)."""
NEWEST_LINE = LINES[NEWEST_TRTLLM_LINE]
if set(LINES) != set(get_args(TrtllmLine)):  # the schema's Literal and these tables name the same lines
    raise RuntimeError(f"build.trtllm lines {get_args(TrtllmLine)} != contracts.llm_api LINES {sorted(LINES)}")

DECODING_ALIASES: dict[str, str] = {"DraftTarget": "Draft_Target", "Draft_Target": "DraftTarget",
                                    "Eagle": "Eagle3", "Eagle3": "Eagle"}
"""decoding_type spellings that name the same method on the other line (1.2's DraftTarget is 1.3's Draft_Target;
1.2's Eagle with an EAGLE-3 draft is 1.3's Eagle3): what a reader of either line's model.yaml accepts."""


def line_of(spec: PipelineSpec) -> Line:
    """The spec's TensorRT-LLM line (`build.trtllm`, default by flow: 1.2 for engines, the newest for pytorch)."""
    return LINES[spec.build.line]


SERVE_PERF_METRICS_SOURCE = (
    "NVIDIA/TensorRT-LLM tensorrt_llm/serve/openai_server.py @00057725d9a6591f033e44f31c219e2426827bb7 "
    "(OpenAIServer._init_llm, _extract_metrics, get_perf_metrics; route GET /perf_metrics) and llm_args.py "
    "BaseLlmArgs.return_perf_metrics / perf_metrics_max_requests (status prototype)")
PERF_METRICS_MAX_REQUESTS = 4096
"""How many finished requests' metrics trtllm-serve keeps until GET /perf_metrics takes them (its deque's maxlen;
older ones are dropped): more than one `specbuild bench` run sends by default, a few MB of records at most."""
SERVE_PERF_METRICS: dict[str, Any] = {"return_perf_metrics": True,
                                      "perf_metrics_max_requests": PERF_METRICS_MAX_REQUESTS}
"""What trtllm-serve's options switch on for per-request acceptance (SERVE_PERF_METRICS_SOURCE): with
return_perf_metrics every finished request's RequestPerfMetrics is kept (only when perf_metrics_max_requests > 0),
and GET /perf_metrics answers them and empties the store: one record per request, its `perf_metrics.
speculative_decoding` = {acceptance_rate, total_accepted_draft_tokens, total_draft_tokens} when it drafted.
`specbuild bench` reads it (specbuild.bench.engine_metrics). The `X-TRTLLM-return-metrics: 1` request header of
later lines adds timing headers only (Server-Timing, X-TRTLLM-Start-End-Time), no acceptance, so it is not sent.
Written into trtllm-serve's options only: Triton's llmapi model asks per request (sampling_param_return_perf_metrics)
and answers in its outputs."""

LLM_ARGS_FIELDS = frozenset({
    "model", "backend", "tensor_parallel_size", "pipeline_parallel_size", "max_batch_size", "max_seq_len",
    "max_num_tokens", "speculative_config", "trust_remote_code", "dtype", *SERVE_PERF_METRICS,
})
"""The `BaseLlmArgs`/`TorchLlmArgs` fields specbuild writes (llm_args.py of both lines; trust_remote_code is the LLM
constructor's)."""

PYTORCH_ONLY_REASON = {
    "eagle3": "eagle3 runs only on the PyTorch backend (TensorRT-LLM 1.2 llm_args.py: EAGLE-3 is "
              "EagleDecodingConfig's torch spec_dec_mode EAGLE3/EAGLE3_ONE_MODEL; the engine flow's "
              "--speculative_decoding_mode eagle builds EAGLE-1/2 heads)",
    "ngram": "ngram runs only on the PyTorch backend (TensorRT-LLM 1.2 llm_args.py NGramDecodingConfig."
             "supports_backend: backend == 'pytorch')",
    "sa": "sa runs only on the PyTorch backend (SADecodingConfig.supports_backend: backend == 'pytorch'; TensorRT-LLM "
          "1.3 and later)",
    "mtp": "mtp runs only on the PyTorch backend: TensorRT-LLM 1.2's engine flow builds no MTP layers "
           "(MTPDecodingConfig.supports_backend: 'pytorch' only in 1.2's llm_args.py; 1.3, which has no engine "
           "flow, adds '_autodeploy')",
}
"""Why a mode is refused on the engine flow."""


def _mode_problem(line: Line, mode: str) -> str | None:
    """Why `line`'s PyTorch backend cannot run `mode` (None: it can, or the mode needs no speculative_config)."""
    if mode == "none":
        return None
    if mode in line.missing_modes:
        return line.missing_modes[mode]
    decoding_type = line.mode_types.get(mode)
    if decoding_type is None:
        return f"{line.label} has no decoding config for speculative.mode {mode}"
    decoding = line.decoding_types[decoding_type]
    if not decoding.supports(PYTORCH):
        return (f"{decoding_type} runs only on the engine flow: {line.label}'s {decoding.config_class}."
                "supports_backend is False for 'pytorch' (tensorrt_llm/llmapi/llm_args.py), so "
                f"LLM(backend='pytorch') refuses it with 'Speculation type {decoding_type} does not support "
                "backend pytorch'; set build.flow: engine, or use draft_target, eagle3 or ngram")
    return None


def flow_problems(spec: PipelineSpec) -> list[tuple[Loc, str]]:
    """The spec's speculative mode where its `build.flow` (and line) cannot run it, with TensorRT-LLM's reason and
    the fix, then the model families its engines cannot run the mode on (`contracts.family_support`): every stage
    checks this first, so an engine-flow stage never meets a mode it has no engine for."""
    mode = spec.speculative.mode
    if spec.build.flow == "engine" and mode in PYTORCH_ONLY_REASON:
        return [(("speculative", "mode"), f"{PYTORCH_ONLY_REASON[mode]}; set build.flow: pytorch")]
    if spec.build.flow == PYTORCH:
        problem = _mode_problem(line_of(spec), mode)
        if problem is not None:
            return [(("speculative", "mode"), problem)]
    return family_problems(spec)  # the mode runs on this flow: does it run on the spec's model families?


def refuse_other_flow(spec: PipelineSpec, stage: str) -> None:
    """Raise one located error when `flow_problems` finds any (convert, build and deploy call this first)."""
    problems = flow_problems(spec)
    if problems:
        raise spec.problems_error(problems, hint=f"`specbuild {stage}` stops here; `specbuild validate SPEC` "
                                  "lists every problem")


def speculative_config(spec: PipelineSpec) -> dict[str, Any] | None:
    """The `speculative_config` mapping (YAML form, `decoding_type` first) the spec asks its line's LLM API for, or
    None. K (`speculative.num_draft_tokens`) is `max_draft_len`; `speculative_model` is the draft checkpoint (a
    draft model for draft_target, an EAGLE-3 draft for eagle3); the NGram and Eagle settings keep llm_args.py's
    names. On a line whose max_concurrency and draft_len_schedule are exclusive, a schedule carries the
    concurrency cut-off itself (its last entry at 0), so only one is written."""
    line = line_of(spec)
    speculative = spec.speculative
    decoding_type = line.mode_types.get(speculative.mode)
    if decoding_type is None:
        return None
    config: dict[str, Any] = {"decoding_type": decoding_type, "max_draft_len": speculative.num_draft_tokens}
    if spec.draft is not None and speculative.mode in ("draft_target", "eagle3"):
        config["speculative_model"] = str(draft_model_dir(spec))  # a quantized draft: ModelOpt's HF export
    if speculative.mode == "ngram":
        ngram = speculative.ngram or NGramSpec()
        config.update(ngram.model_dump())
    if speculative.mode == "sa":
        config.update((speculative.sa or SASpec()).model_dump(exclude_none=True))
    if speculative.mode == "eagle3":
        eagle3 = speculative.eagle3 or Eagle3Spec()
        if line.writes_eagle3_one_model:
            config["eagle3_one_model"] = eagle3.eagle3_one_model
        if eagle3.eagle3_layers_to_capture is not None:
            config["eagle3_layers_to_capture"] = list(eagle3.eagle3_layers_to_capture)
    schedule = speculative.draft_len_schedule
    if schedule is not None and line.exclusive_schedule:
        config["draft_len_schedule"] = up_to_schedule(schedule, spec.build.max_batch_size, speculative.max_concurrency)
    elif schedule is not None:
        config["draft_len_schedule"] = {int(k): int(v) for k, v in sorted(schedule.items())}
    if speculative.max_concurrency is not None and not (line.exclusive_schedule and schedule is not None):
        config["max_concurrency"] = speculative.max_concurrency
    return config


def up_to_schedule(schedule: Mapping[int, int], max_batch_size: int, max_concurrency: int | None) -> dict[int, int]:
    """A spec's draft_len_schedule (specbuild's meaning, the 1.2 line's: each key the batch size its length applies
    FROM) as the 1.3 line spells it: each key the largest batch size its length applies UP TO, 0 above the largest
    key (llm_args.py @0004396 DecodingBaseConfig.draft_len_schedule: "{4:4, 8:2, 32:1} - Batch sizes 1-4: use
    draft_len=4 ... 33+: draft_len=0"); max_concurrency, exclusive with a schedule there, becomes its last bound.
    {1: 4, 4: 2, 8: 0} -> {3: 4, 7: 2}; the smallest key still maps to max_draft_len, as 1.3 requires."""
    limit = min(max_batch_size, max_concurrency or max_batch_size)
    starts = sorted(int(k) for k in schedule)
    ranges = []
    for index, start in enumerate(starts):
        end = min(starts[index + 1] - 1 if index + 1 < len(starts) else limit, limit)
        if start <= end:
            ranges.append((end, int(schedule[start])))
    while ranges and ranges[-1][1] == 0:  # trailing zeros are the implicit 0 above the largest key
        ranges.pop()
    return dict(ranges)


def llm_args(spec: PipelineSpec) -> dict[str, Any]:
    """The LLM-API settings (LlmArgs field -> value) of a `build.flow: pytorch` spec: what model.yaml and the
    trtllm-serve options carry. max_num_tokens defaults by the engine flow's rule (engine_limits), so both flows
    size a step alike."""
    build = spec.build
    args: dict[str, Any] = {
        "model": str(spec.target.model),
        "backend": PYTORCH,
        "tensor_parallel_size": build.tp_size,
        "pipeline_parallel_size": build.pp_size,
        "max_batch_size": build.max_batch_size,
        "max_seq_len": build.max_seq_len,
        "max_num_tokens": build.max_num_tokens or default_max_num_tokens(
            build.max_batch_size, build.max_input_len, spec.full_draft_len),
    }
    if build.dtype != "auto":  # BaseLlmArgs.dtype, default "auto" (the checkpoint's): the spec's choice is kept
        args["dtype"] = build.dtype
    if spec.target.trust_remote_code:
        args["trust_remote_code"] = True
    config = speculative_config(spec)
    if config is not None:
        args["speculative_config"] = config
    return args


def _schedule_problems(config: Mapping[str, Any]) -> Iterator[str]:
    """The 1.3 line's DecodingBaseConfig validators on the load-aware fields (validate_draft_len_schedule_and_sort,
    validate_max_concurrency_and_draft_len_schedule_mutually_exclusive)."""
    schedule = config.get("draft_len_schedule")
    if schedule is None:
        return
    if config.get("max_concurrency") is not None:
        yield "max_concurrency and draft_len_schedule are mutually exclusive"
    k = config.get("max_draft_len")
    steps = {int(size): int(length) for size, length in schedule.items()}
    if steps and k is not None:
        smallest = min(steps)
        if steps[smallest] != k:
            yield (f"draft_len_schedule[{smallest}] must equal max_draft_len because it is the smallest "
                   f"batch-size key (got {steps[smallest]}, max_draft_len {k})")
        if any(length > k for length in steps.values()):
            yield "draft_len_schedule: all draft lengths must be <= max_draft_len"


def settings_problems(args: Mapping[str, Any], line: Line | None = None) -> Iterator[tuple[Loc, str]]:
    """Check LLM-API settings against a line's tables: every key an LlmArgs field, the decoding_type one the line's
    `from_dict` knows, every speculative_config key a field of that config, the config supported on the backend,
    and the line's load-aware rules. `line` None (a model.yaml read back without its spec): the settings pass if
    some line accepts them, else the newest line's problems are reported."""
    if line is None:
        found = {name: list(settings_problems(args, each)) for name, each in LINES.items()}
        if not any(not problems for problems in found.values()):
            yield from found[NEWEST_LINE.name]
        return
    for key in sorted(set(args) - LLM_ARGS_FIELDS):
        yield ("build",), f"LLM-API setting {key!r} is not an LlmArgs field of {line.label}"
    config = args.get("speculative_config")
    if config is None:
        return
    decoding = line.decoding_types.get(str(config.get("decoding_type")))
    if decoding is None:
        yield ("speculative", "mode"), (f"decoding_type {config.get('decoding_type')!r} is not one of {line.label}'s "
                                        f"{', '.join(sorted(line.decoding_types))}")
        return
    config, alias_problems = _resolve_aliases(line, decoding, config)
    for problem in alias_problems:
        yield ("speculative",), problem
    for key in sorted(set(config) - {"decoding_type"} - line.fields_of(decoding)):
        yield ("speculative",), f"{key!r} is not a field of {line.label}'s {decoding.config_class}"
    backend = str(args.get("backend", PYTORCH))
    if not decoding.supports(backend):
        yield ("speculative", "mode"), (f"Speculation type {decoding.decoding_type} does not support backend "
                                        f"{backend} ({line.label}'s {decoding.config_class}.supports_backend)")
    if line.exclusive_schedule:
        for problem in _schedule_problems(config):
            yield ("speculative", "draft_len_schedule"), f"{problem} ({line.label}'s DecodingBaseConfig)"
    for rule in line.rules:
        problem = rule.check(args, config)
        if problem is not None:
            yield rule.field, f"{problem} ({line.label}'s {rule.validator})"


def _resolve_aliases(line: Line, decoding: DecodingType, config: Settings) -> tuple[dict[str, Any], list[str]]:
    """`config` with the line's aliases turned into the fields they set (as its LLM API reads them), and a problem
    for each alias given beside its field with another value (the line keeps the field and drops the alias)."""
    resolved, problems = dict(config), []
    for alias, (name, types) in line.field_aliases.items():
        if alias not in resolved or (types is not None and decoding.decoding_type not in types):
            continue
        value = resolved.pop(alias)
        if name not in resolved:
            resolved[name] = value
        elif resolved[name] != value:
            problems.append(f"{alias!r} ({value}) and {name!r} ({resolved[name]}) both given: {line.label}'s "
                            f"{decoding.config_class} reads {name!r} and drops {alias!r} (give {name!r} only)")
    return resolved, problems


QUANTIZED_DRAFT_DIR = "draft-hf"
"""`<output_dir>/checkpoints/draft-hf`: a `build.flow: pytorch` draft with `draft.quantization`, as ModelOpt's Hugging
Face export (specbuild.convert.quantize.hf_export), the directory the LLM API's speculative_model then names."""


def quantized_draft_dir(spec: PipelineSpec) -> Path | None:
    """Where `convert` writes the quantized Hugging Face draft of a PyTorch-flow spec (None: no quantized draft)."""
    if spec.build.flow != PYTORCH or spec.draft is None or not spec.draft.quantization.enabled:
        return None
    return spec.output_dir / "checkpoints" / QUANTIZED_DRAFT_DIR


def draft_model_dir(spec: PipelineSpec) -> Path | None:
    """The Hugging Face directory the LLM API loads as the draft (`speculative_model`): the quantized export, else
    `draft.model` as it is."""
    if spec.draft is None:
        return None
    return quantized_draft_dir(spec) or spec.draft.model


def quantized_draft_problems(spec: PipelineSpec) -> list[tuple[Loc, str]]:
    """A `draft.quantization` the PyTorch flow cannot serve: a format TensorRT-LLM 1.2's PyTorch backend has no linear
    method for (contracts.quant_formats `Format.pytorch_linear`), or a draft that is not a draft-target draft."""
    if spec.draft is None or not spec.draft.quantization.enabled:
        return []
    if spec.speculative.mode != "draft_target":
        return [(("draft", "quantization"), f"quantization applies to a draft_target draft; speculative.mode "
                 f"{spec.speculative.mode}'s draft is loaded as it is (remove draft.quantization)")]
    fmt = FORMATS.get(spec.draft.quantization.format)
    if fmt is not None and fmt.pytorch_linear is None:
        usable = ", ".join(name for name, f in FORMATS.items() if f.pytorch_linear)
        return [(("draft", "quantization", "format"),
                 f"{spec.draft.quantization.format} ({fmt.quant_algo}) has no linear method on TensorRT-LLM 1.2's "
                 f"PyTorch backend: get_quant_method raises 'unsupported quant mode' for it ({PYTORCH_LINEAR_SOURCE}); "
                 f"use {usable} on build.flow: pytorch, or build.flow: engine for {spec.draft.quantization.format}")]
    return []


def pytorch_flow_problems(spec: PipelineSpec) -> list[tuple[Loc, str]]:
    """Every problem of a `build.flow: pytorch` spec beyond the schema: the mode (`flow_problems`), the LLM-API
    settings against llm_args.py's tables, and engine-flow settings that this flow would silently ignore."""
    if spec.build.flow != PYTORCH:
        return []
    problems = flow_problems(spec)
    if problems:
        return problems
    problems += list(settings_problems(llm_args(spec), line_of(spec)))
    unused = "is an engine-flow setting; build.flow: pytorch builds no engine"
    if spec.build.gather_context_logits:
        problems.append((("build", "gather_context_logits"), f"{unused} (remove it)"))
    if spec.speculative.max_draft_len is not None:
        problems.append((("speculative", "max_draft_len"), f"{unused}: the LLM API's max_draft_len is "
                         "speculative.num_draft_tokens (remove it)"))
    if spec.speculative.use_draft_logits:
        problems.append((("speculative", "use_draft_logits"), f"{unused} (remove it)"))
    if spec.deploy.exclude_input_in_output:
        problems.append((("deploy", "exclude_input_in_output"), "the llmapi model has no such parameter; a request "
                         "sets sampling_param_exclude_input_from_output instead (remove it)"))
    problems += quantized_draft_problems(spec)
    if spec.speculative.mode == "mtp" and llmapi_backend(spec) == "reference":
        problems.append((("build", "backend"), "the reference llmapi model runs no MTP layers (specbuild's runtime "
                         "has no MTP drafter): set build.backend: tensorrt to write the spec for TensorRT-LLM's own "
                         "llmapi model"))
    return problems


def refuse_pytorch_flow_problems(spec: PipelineSpec, stage: str) -> None:
    """Raise one located error listing `pytorch_flow_problems`, if any."""
    problems = pytorch_flow_problems(spec)
    if problems:
        raise spec.problems_error(problems, hint=f"`specbuild {stage}` stops here; fix these, then run it again")


# -- Triton's llmapi model and trtllm-serve ---------------------------------------------------------------------
LLM_API_DIR = "llm_api"
LLM_API_PLAN = "llm_api.json"
"""What `build` leaves for a `build.flow: pytorch` spec: `<output_dir>/llm_api/llm_api.json` (the LLM-API
settings checked against the tables above) and its manifest.json; deploy writes exactly these settings."""


def llm_api_dir(spec: PipelineSpec) -> Path:
    return spec.output_dir / LLM_API_DIR


LLMAPI_MODEL = "tensorrt_llm"
"""The model directory name of triton_backend/all_models/llmapi (its config.pbtxt names it so)."""
LLMAPI_CODE = ("1/model.py", "1/helpers.py")
"""The python files of NVIDIA's llmapi model, which deploy does not copy: they come with TensorRT-LLM (the
container's triton_backend/all_models/llmapi/tensorrt_llm/)."""
LLMAPI_MODEL_YAML = f"{LLMAPI_MODEL}/1/model.yaml"
"""What marks a repository as the PyTorch flow's (deploy writes it; the engine flow's tensorrt_llm has no 1/ file)."""
CODE_NOTE = (f"{LLMAPI_MODEL}/{' and '.join(LLMAPI_CODE)} are NVIDIA's, not written here: copy them from the "
             "TensorRT-LLM container's triton_backend/all_models/llmapi/tensorrt_llm/1/ (the spec's build.trtllm "
             "line)")


def missing_llmapi_code(repository: Path) -> list[str]:
    """NVIDIA's llmapi files a PyTorch-flow repository (one with tensorrt_llm/1/model.yaml) still lacks, relative to
    the repository; [] for an engine-flow repository, one whose code was copied in, or a reference one (specbuild's
    own model.py stands in for NVIDIA's there: `is_reference_llmapi`)."""
    if not (repository / LLMAPI_MODEL_YAML).is_file() or is_reference_llmapi(repository):
        return []
    return [f"{LLMAPI_MODEL}/{name}" for name in LLMAPI_CODE if not (repository / LLMAPI_MODEL / name).is_file()]


def refuse_incomplete_llmapi(repository: Path, command: str) -> None:
    """One error naming what to copy, where serve would fail as a generic model load failure and `deploy --check`
    would judge the llmapi model against the ensemble's contract."""
    missing = missing_llmapi_code(repository)
    if missing:
        raise SpecbuildError(f"{repository}: Triton's llmapi model (a build.flow: pytorch repository) without "
                             f"NVIDIA's code: {', '.join(missing)} missing", hint=f"{CODE_NOTE}, then run "
                             f"`specbuild {command}` again")


@dataclass(frozen=True)
class Tensor:
    name: str
    data_type: str
    dims: tuple[int, ...]
    optional: bool = False


_STRING, _BOOL, _I32, _F32 = "TYPE_STRING", "TYPE_BOOL", "TYPE_INT32", "TYPE_FP32"
LLMAPI_INPUTS: tuple[Tensor, ...] = (
    Tensor("text_input", _STRING, (-1,)),
    Tensor("streaming", _BOOL, (1,), True),
    Tensor("sampling_param_best_of", _I32, (1,), True),
    Tensor("sampling_param_temperature", _F32, (1,), True),
    Tensor("sampling_param_top_k", _I32, (1,), True),
    Tensor("sampling_param_top_p", _F32, (1,), True),
    Tensor("sampling_param_frequency_penalty", _F32, (1,), True),
    Tensor("sampling_param_presence_penalty", _F32, (1,), True),
    Tensor("sampling_param_max_tokens", _I32, (1,), True),
    Tensor("sampling_param_stop", _STRING, (-1,), True),
    Tensor("sampling_param_seed", "TYPE_UINT64", (1,), True),
    Tensor("sampling_param_exclude_input_from_output", _BOOL, (1,), True),
    Tensor("sampling_param_return_perf_metrics", _BOOL, (1,), True),
    Tensor("return_finish_reason", _BOOL, (1,), True),
    Tensor("return_stop_reason", _BOOL, (1,), True),
    Tensor("return_cumulative_logprob", _BOOL, (1,), True),
    Tensor("stop", _BOOL, (1,), True),
)
"""The llmapi config.pbtxt's inputs (LLMAPI_MODEL_SOURCE), without `image_url` and `lora_*`: multimodal and LoRA
serving, which no spec asks for (optional inputs: the model reads them only when sent)."""
LLMAPI_OUTPUTS: tuple[Tensor, ...] = (
    Tensor("text_output", _STRING, (-1,)),
    Tensor("finish_reason", _STRING, (-1,)),
    Tensor("stop_reason", _STRING, (-1,)),
    Tensor("cumulative_logprob", _F32, (-1,)),
    Tensor("kv_cache_reused_block", _I32, (-1,)),
    Tensor("kv_cache_missed_block", _I32, (-1,)),
    Tensor("kv_cache_alloc_new_blocks", _I32, (-1,)),
    Tensor("kv_cache_alloc_total_blocks", _I32, (-1,)),
    Tensor("kv_cache_hit_rate", _F32, (-1,)),
    Tensor("arrival_time_ns", "TYPE_INT64", (1,)),
    Tensor("first_scheduled_time_ns", "TYPE_INT64", (1,)),
    Tensor("first_token_time_ns", "TYPE_INT64", (1,)),
    Tensor("last_token_time_ns", "TYPE_INT64", (1,)),
    Tensor("acceptance_rate", _F32, (1,)),
    Tensor("total_accepted_draft_tokens", _I32, (1,)),
    Tensor("total_draft_tokens", _I32, (1,)),
)
"""The llmapi config.pbtxt's outputs (LLMAPI_MODEL_SOURCE)."""
LLMAPI_TRITON_MAX_BATCH_SIZE = 0
"""model.yaml `triton_config.max_batch_size`: NVIDIA's model.yaml sets 0 ("the current implementation does not
support batching"); the LLM API batches in flight up to LlmArgs.max_batch_size itself."""


def model_yaml(spec: PipelineSpec, args: dict[str, Any]) -> dict[str, Any]:
    """The llmapi `1/model.yaml` mapping: the LLM-API settings (model.py passes every key but triton_config to
    `LLM(**args)` through update_llm_args_with_extra_dict) and `triton_config` (read by auto_complete_config)."""
    return {**args, "triton_config": {"max_batch_size": LLMAPI_TRITON_MAX_BATCH_SIZE,
                                      "decoupled": spec.deploy.decoupled}}


SERVE_OPTIONS = "trtllm-serve.yaml"
SERVE_SCRIPT = "trtllm-serve.sh"
SERVE_FLAGS: dict[str, str] = {
    "backend": "--backend", "tensor_parallel_size": "--tp_size", "pipeline_parallel_size": "--pp_size",
    "max_batch_size": "--max_batch_size", "max_num_tokens": "--max_num_tokens", "max_seq_len": "--max_seq_len",
}
"""LlmArgs setting -> the trtllm-serve option that sets it (SERVE_SOURCE); the rest go into the options YAML that
`--extra_llm_api_options` (alias `--config`) names, which overrides the flags key by key."""


def serve_command(spec: PipelineSpec, args: dict[str, Any], options_path: str) -> tuple[list[str], dict[str, Any]]:
    """`trtllm-serve MODEL --flag value ... --extra_llm_api_options OPTIONS` and the options mapping."""
    command = ["trtllm-serve", str(args["model"]), "--host", "0.0.0.0", "--port", str(spec.deploy.http_port)]
    for key, flag in SERVE_FLAGS.items():
        command += [flag, str(args[key])]
    if args.get("trust_remote_code"):
        command.append("--trust_remote_code")
    command += ["--extra_llm_api_options", options_path]
    options = {key: value for key, value in args.items()
               if key not in SERVE_FLAGS and key not in ("model", "trust_remote_code")}
    return command, {**options, **SERVE_PERF_METRICS}


# -- what the llmapi model does with a request (its model.py and helpers.py) -------------------------------------
LLMAPI_CODE_SOURCE = ("NVIDIA/TensorRT-LLM triton_backend/all_models/llmapi/tensorrt_llm/1/model.py @044a90d2 "
                      "(_execute_single_request, _convert_request, _create_response, handle_stop_request) and "
                      "1/helpers.py @fab2f90b (get_sampling_params_from_request, get_output_config_from_request, "
                      "get_streaming_from_request, get_input_scalar_by_name)")
SAMPLING_PARAMS_SOURCE = "NVIDIA/TensorRT-LLM tensorrt_llm/sampling_params.py, 1.2 line (commit 195839a7)"
RESULT_SOURCE = ("NVIDIA/TensorRT-LLM tensorrt_llm/executor/result.py (CompletionOutput: `text` is the whole text so "
                 "far, `text_diff` the new part) and cpp/tensorrt_llm/batch_manager/llmRequest.cpp @119c6e60 "
                 "createResult (not streaming: the prompt tokens lead the output unless exclude_input_from_output; "
                 "streaming: only tokens not sent yet)")


@dataclass(frozen=True)
class RequestInput:
    """One optional llmapi input that helpers.py reads as a scalar into a SamplingParams keyword (or an output-config
    flag), and what it fills in when the request does not send it: None means nothing (SamplingParams' own default,
    SAMPLING_PARAMS_DEFAULTS, applies)."""

    name: str
    key: str
    default: Any = None


SAMPLING_PARAM_INPUTS: tuple[RequestInput, ...] = (
    RequestInput("sampling_param_best_of", "best_of", 1),
    RequestInput("sampling_param_temperature", "temperature"),
    RequestInput("sampling_param_top_k", "top_k"),
    RequestInput("sampling_param_top_p", "top_p"),
    RequestInput("sampling_param_frequency_penalty", "frequency_penalty"),
    RequestInput("sampling_param_presence_penalty", "presence_penalty"),
    RequestInput("sampling_param_max_tokens", "max_tokens"),
    RequestInput("sampling_param_seed", "seed"),
    RequestInput("sampling_param_exclude_input_from_output", "exclude_input_from_output", False),
    RequestInput("sampling_param_return_perf_metrics", "return_perf_metrics", False),
)
"""helpers.py get_sampling_params_from_request: `sampling_param_<field>` -> SamplingParams(<field>), the defaults its
default_values dict fills in (note exclude_input_from_output False, where SamplingParams' own default is True: a
non-streamed llmapi answer leads with the prompt unless the request says otherwise)."""
STOP_INPUT = "sampling_param_stop"
"""Read as a whole tensor (not a scalar) into SamplingParams(stop=...): a list of stop strings."""
SAMPLING_PARAMS_DEFAULTS: dict[str, Any] = {
    "max_tokens": 32, "temperature": None, "top_k": None, "top_p": None, "seed": None,
    "frequency_penalty": None, "presence_penalty": None, "stop": None, "include_stop_str_in_output": False,
    "add_special_tokens": True, "skip_special_tokens": True,
}
"""SamplingParams defaults (SAMPLING_PARAMS_SOURCE) for what a request leaves out. Greedy when temperature, top_p and
top_k are all None, or top_k == 1, top_p == 0 or temperature == 0 (`params_imply_greedy_decoding`); otherwise
temperature None means 1, top_p None means 1, top_k None means 0 (no top-k)."""
OUTPUT_CONFIG_INPUTS: dict[str, str] = {
    "return_finish_reason": "finish_reason", "return_stop_reason": "stop_reason",
    "return_cumulative_logprob": "cumulative_logprob",
}
"""helpers.py get_output_config_from_request (each default False) -> the output model.py adds when true, as the str()
of the CompletionOutput field (finish_reason 'stop'/'length'/'cancelled', stop_reason the stop string or None,
cumulative_logprob None: model.py asks for no logprobs)."""
PERF_METRIC_OUTPUTS = (
    "kv_cache_reused_block", "kv_cache_hit_rate", "kv_cache_alloc_new_blocks", "kv_cache_alloc_total_blocks",
    "kv_cache_missed_block", "arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns",
    "last_token_time_ns", "acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens",
)
"""The outputs _create_response adds when the result has request_perf_metrics (sampling_param_return_perf_metrics
true), in its order. model.py builds every output with text_output's numpy dtype (object): on the wire each is a
BYTES tensor of str(value), whatever config.pbtxt declares for it."""
STREAMING_INPUT, STOP_REQUEST_INPUT, TEXT_INPUT = "streaming", "stop", "text_input"
LLMAPI_ERRORS: dict[str, str] = {
    "no_text_input": "text_input is missing from the request",
    "not_1d": "The current implementation only supports text_input being a 1D tensor.",
    "not_scalar": "Expected a scalar tensor for tensor {name}",
    "streaming_not_decoupled": "Streaming is only supported in decoupled mode.",
    "wrapped": "Error generating request: {error}",
    "stop_without_id": "A request id must be provided for request cancellation",
    "cancelled": "Request cancelled by client",
    "top_p": "require 0 <= top_p <= 1, got top_p={value}",
    "top_k": "require top_k >= 0, got top_k={value}",
    "temperature": "require temperature >= 0, got temperature={value}",
    "greedy_best_of": ("Greedy decoding in the LLM API does not allow multiple returns. Please set to best_of=1, got "
                       "best_of={value}. Please set to best_of=1 or set an environment variable "
                       "TLLM_ALLOW_N_GREEDY_DECODING=1 to allow best_of > 1 under the greedy decoding."),
}
"""The texts model.py and SamplingParams._validate answer with (LLMAPI_CODE_SOURCE, SAMPLING_PARAMS_SOURCE). Every
error of a generation request is one final response: text_output ["N/A"] and the error "Error generating request:
..." (`wrapped`); a stop request (input `stop` true) aborts the requests with its request id and is itself answered
with the CANCELLED error `cancelled` (or `stop_without_id`). Only text_input[0] is generated (one prompt per
request)."""
ERROR_TEXT_OUTPUT = "N/A"


# -- the reference backend's llmapi model (build.flow: pytorch, build.backend: reference) ------------------------
REFERENCE_FILE = f"{LLMAPI_MODEL}/1/reference.json"
"""What marks a reference llmapi repository: deploy writes specbuild's tensorrt_llm/1/model.py (the reference that
serves the llmapi model's interface on CPU) and this side file naming the converted checkpoints it loads; model.yaml
stays exactly what NVIDIA's model.py reads, and the reference reads its settings from there too."""
REFERENCE_ROLES: dict[str, tuple[str, ...]] = {"none": ("target",), "draft_target": ("target", "draft"),
                                               "eagle3": ("target",), "ngram": ("target",)}
"""Which models `convert` writes as TensorRT-LLM checkpoints for the reference runtime, by speculative.mode (an
EAGLE-3 draft is loaded from its Hugging Face directory as it is; NGram needs no draft)."""


def llmapi_backend(spec: PipelineSpec) -> Literal["tensorrt", "reference"]:
    """Who serves a PyTorch-flow repository: `reference` only when the spec says so (specbuild's model.py on CPU);
    `auto` and `tensorrt` mean NVIDIA's llmapi model. Not chosen by what this machine has installed, as the engine
    flow's auto is: nothing here needs TensorRT-LLM to be written, and such a repository is usually written on one
    machine and served on a GPU host."""
    return "reference" if spec.build.backend == "reference" else "tensorrt"


def is_reference_llmapi(repository: Path) -> bool:
    return (repository / REFERENCE_FILE).is_file()


def reference_roles(spec: PipelineSpec) -> tuple[str, ...]:
    """The checkpoints `convert` writes for a reference PyTorch-flow spec (() on the tensorrt backend)."""
    if spec.build.flow != PYTORCH or llmapi_backend(spec) != "reference":
        return ()
    return REFERENCE_ROLES.get(spec.speculative.mode, ("target",))


def reference_settings(spec: PipelineSpec) -> dict[str, Any]:
    """The side file's content: where the reference's checkpoints, tokenizer and EAGLE-3 draft are (absolute:
    the checkpoints are not copied into the repository)."""
    settings: dict[str, Any] = {
        "checkpoints": {role: str(spec.checkpoint_dir(role).resolve()) for role in reference_roles(spec)},
        "tokenizer": str(Path(spec.target.model).resolve()),
        "trust_remote_code": spec.target.trust_remote_code,
        "trtllm_line": line_of(spec).name,  # how the reference reads draft_len_schedule (runtime.schedule)
    }
    if spec.speculative.mode == "eagle3" and spec.draft is not None and spec.draft.model is not None:
        settings["eagle3_draft"] = str(Path(spec.draft.model).resolve())
    return settings
