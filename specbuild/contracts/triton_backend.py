"""The TensorRT-LLM 1.2 Triton backend's wire contract, as data: every input, output and parameter of NVIDIA's
five model templates, when the C++ `tensorrtllm` backend creates each output, and how the ensemble wires them.

specbuild's repositories must drop unchanged into NVIDIA's world (the real C++ backend, NVIDIA's client
scripts), so `deploy` generates the tensor declarations of every config.pbtxt from these tables, and the tests
check the written configs and the reference models' answers against the same tables. A repository is a
superset: every NVIDIA tensor and parameter with NVIDIA's name, type, dims, flags and default, plus a few of
specbuild's own (`Tensor.extra`), which are optional inputs or outputs no NVIDIA client reads.

Sources (NVIDIA/TensorRT-LLM, `triton_backend/`; line numbers are the templates' at these commits):
`all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt` @2a9abd95, `ensemble/config.pbtxt` @2a9abd95,
`preprocessing/config.pbtxt` @808059da, `postprocessing/config.pbtxt` @89fd9b74,
`tensorrt_llm_bls/config.pbtxt` @bff88ea8; the C++ backend's behaviour from
`inflight_batcher_llm/src/model_instance_state.cc` @0c8de69a (`fillTritonResponse`) and `utils.cc` @c8c6df08.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from specbuild.python_models.bls_loop import PLAIN_ROUND_MAX_TOKENS

Presence = Literal["always", "flag", "flag_unchecked", "batched", "multi_sequence", "never"]
"""When the C++ backend puts an output in a response (model_instance_state.cc `fillTritonResponse`):
always; `flag`: the request set `flag` and asked for the output; `flag_unchecked`: the request set `flag`,
whether or not it asked for the output (the ten perf metrics: a config lacking one fails the request);
`batched`: asked for and the Triton request has batch > 1; `multi_sequence`: asked for and
num_return_sequences > 1; `never`: not for the requests specbuild serves (context-only disaggregation)."""

Flavour = Literal["both", "reference"]
"""Where a specbuild extra exists: in every repository, or only where the python reference models serve."""


@dataclass(frozen=True)
class Tensor:
    """One config.pbtxt input or output."""

    name: str
    data_type: str  # TYPE_INT32 ..., or a placeholder such as ${logits_datatype}
    dims: tuple[int, ...]
    optional: bool = False
    reshape: bool = False  # `reshape: { shape: [ ] }` (a [1] tensor read as a scalar)
    ragged: bool = False  # `allow_ragged_batch: true`
    line: int = 0  # where the NVIDIA template declares it (0: a specbuild extra)
    extra: Flavour | None = None  # None: NVIDIA's; else one of specbuild's own and where it exists
    presence: Presence = "always"  # outputs of tensorrt_llm only
    flag: str | None = None  # the request input that `presence` reads

    def pbtxt(self, types: Mapping[str, str]) -> str:
        """The tensor as one config.pbtxt list entry, placeholders in its data type filled from `types`."""
        data_type = types.get(self.data_type, self.data_type)
        dims = ", ".join(str(d) for d in self.dims)
        parts = [f'name: "{self.name}"', f"data_type: {data_type}", f"dims: [ {dims} ]"]
        if self.reshape:
            parts.append("reshape: { shape: [ ] }")
        if self.optional:
            parts.append("optional: true")
        if self.ragged:
            parts.append("allow_ragged_batch: true")
        return "{ " + " ".join(parts) + " }"


@dataclass(frozen=True)
class Parameter:
    """One `parameters` key of a template: NVIDIA's default, and what it means."""

    key: str
    default: str  # what specbuild writes when the spec does not decide it ("" = unset: the backend's default)
    meaning: str
    line: int = 0
    extra: Flavour | None = None


@dataclass(frozen=True)
class ModelContract:
    name: str  # the template / model directory name
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    parameters: tuple[Parameter, ...] = ()

    def input(self, name: str) -> Tensor:
        return _find(self.inputs, name, self.name, "input")

    def output(self, name: str) -> Tensor:
        return _find(self.outputs, name, self.name, "output")

    def nvidia_inputs(self) -> tuple[Tensor, ...]:
        return tuple(t for t in self.inputs if t.extra is None)

    def nvidia_outputs(self) -> tuple[Tensor, ...]:
        return tuple(t for t in self.outputs if t.extra is None)

    def declared(self, tensors: Iterable[Tensor], reference: bool) -> tuple[Tensor, ...]:
        """The tensors a repository of this flavour declares: NVIDIA's and the extras that belong to it."""
        return tuple(t for t in tensors if t.extra is None or t.extra == "both" or reference)

    def io_text(self, types: Mapping[str, str], *, reference: bool) -> tuple[str, str]:
        """The `input [ ... ]` and `output [ ... ]` blocks of the config, in the template's order."""
        return (_block("input", self.declared(self.inputs, reference), types),
                _block("output", self.declared(self.outputs, reference), types))

    def parameter_defaults(self, *, reference: bool) -> dict[str, str]:
        return {p.key: p.default for p in self.parameters if p.extra is None or p.extra == "both" or reference}


def _find(tensors: tuple[Tensor, ...], name: str, model: str, kind: str) -> Tensor:
    for tensor in tensors:
        if tensor.name == name:
            return tensor
    raise KeyError(f"{model} has no {kind} {name!r}")


def _block(kind: str, tensors: tuple[Tensor, ...], types: Mapping[str, str]) -> str:
    return f"{kind} [\n" + ",\n".join(f"  {t.pbtxt(types)}" for t in tensors) + "\n]"


def _tensors(table: str, **extra: object) -> tuple[Tensor, ...]:
    """Rows `name type dims flags line`: flags is a comma list of opt (optional), rs (reshape), rg (ragged)
    or `-`; for outputs of tensorrt_llm a sixth column `presence[:flag]`."""
    rows = []
    for raw in table.strip().splitlines():
        cells = raw.split()
        name, data_type, dims, flags, line = cells[:5]
        marks = set() if flags == "-" else set(flags.split(","))
        presence, _, flag = (cells[5] if len(cells) > 5 else "always").partition(":")
        rows.append(Tensor(
            name, data_type if data_type.startswith("${") else f"TYPE_{data_type}",
            tuple(int(d) for d in dims.strip("[]").split(",")), optional="opt" in marks, reshape="rs" in marks,
            ragged="rg" in marks, line=int(line), presence=presence, flag=flag or None,  # type: ignore[arg-type]
            **extra,  # type: ignore[arg-type]
        ))
    return tuple(rows)


def _parameters(table: str, **extra: object) -> tuple[Parameter, ...]:
    """Rows `key | default | meaning | line` (default `""` = unset)."""
    rows = []
    for raw in table.strip().splitlines():
        key, default, meaning, line = (cell.strip() for cell in raw.split("|"))
        rows.append(Parameter(key, "" if default == '""' else default, meaning, int(line or 0),
                              **extra))  # type: ignore[arg-type]
    return tuple(rows)


PLACEHOLDER_TYPES = {
    "${logits_datatype}": "TYPE_FP32",
    "${encoder_input_features_data_type}": "TYPE_FP16",
    "${prompt_embedding_table_data_type}": "TYPE_FP16",
}
"""The structural dtype placeholders of the templates and what specbuild fills: the engines' logits are float32
(`logits_dtype` of every checkpoint it writes); FP16 for the other two, as NVIDIA's examples fill them
(tensorrtllm_backend docs/llama.md)."""

# -- tensorrt_llm ---------------------------------------------------------------------------------------------

TENSORRT_LLM = ModelContract(
    "tensorrt_llm",
    inputs=_tensors("""
        input_ids                           INT32   [-1]     opt,rg      43
        encoder_input_features              ${encoder_input_features_data_type} [-1,-1] opt,rg 50
        encoder_output_lengths              INT32   [1]      opt,rs      57
        input_lengths                       INT32   [1]      rs          64
        request_output_len                  INT32   [1]      rs          70
        num_return_sequences                INT32   [1]      opt,rs      76
        draft_input_ids                     INT32   [-1]     opt,rg      83
        decoder_input_ids                   INT32   [-1]     opt,rg      90
        decoder_input_lengths               INT32   [1]      opt,rs      97
        draft_logits                        ${logits_datatype} [-1,-1] opt,rg 104
        draft_acceptance_threshold          FP32    [1]      opt,rs      111
        end_id                              INT32   [1]      opt,rs      118
        pad_id                              INT32   [1]      opt,rs      125
        stop_words_list                     INT32   [2,-1]   opt,rg      132
        bad_words_list                      INT32   [2,-1]   opt,rg      139
        embedding_bias                      FP32    [-1]     opt,rg      146
        beam_width                          INT32   [1]      opt,rs      153
        temperature                         FP32    [1]      opt,rs      160
        runtime_top_k                       INT32   [1]      opt,rs      167
        runtime_top_p                       FP32    [1]      opt,rs      174
        runtime_top_p_min                   FP32    [1]      opt,rs      181
        runtime_top_p_decay                 FP32    [1]      opt,rs      188
        runtime_top_p_reset_ids             INT32   [1]      opt,rs      195
        len_penalty                         FP32    [1]      opt,rs      202
        early_stopping                      BOOL    [1]      opt,rs      209
        repetition_penalty                  FP32    [1]      opt,rs      216
        min_tokens                          INT32   [1]      opt,rs      223
        beam_search_diversity_rate          FP32    [1]      opt,rs      230
        presence_penalty                    FP32    [1]      opt,rs      237
        frequency_penalty                   FP32    [1]      opt,rs      244
        seed                                UINT64  [1]      opt,rs      251
        return_log_probs                    BOOL    [1]      opt,rs      258
        return_context_logits               BOOL    [1]      opt,rs      265
        return_generation_logits            BOOL    [1]      opt,rs      272
        return_perf_metrics                 BOOL    [1]      opt,rs      279
        return_num_input_tokens             BOOL    [1]      opt,rs      286
        return_num_output_tokens            BOOL    [1]      opt,rs      293
        exclude_input_in_output             BOOL    [1]      opt,rs      300
        stop                                BOOL    [1]      opt,rs      307
        streaming                           BOOL    [1]      opt,rs      314
        prompt_embedding_table              ${prompt_embedding_table_data_type} [-1,-1] opt,rg 321
        prompt_table_extra_ids              UINT64  [-1]     opt,rg      328
        prompt_vocab_size                   INT32   [1]      opt,rs      335
        cross_attention_mask                BOOL    [-1,-1]  opt,rg      343
        mrope_rotary_cos_sin                FP32    [-1]     opt         351
        mrope_position_deltas               INT64   [1]      opt         357
        lora_task_id                        UINT64  [1]      opt,rs      367
        lora_weights                        FP16    [-1,-1]  opt,rg      378
        lora_config                         INT32   [-1,3]   opt,rg      398
        context_phase_params                UINT8   [-1]     opt,rg      405
        skip_cross_attn_blocks              BOOL    [1]      opt,rg      413
        retention_token_range_starts        INT32   [-1]     opt,rg      420
        retention_token_range_ends          INT32   [-1]     opt,rg      427
        retention_token_range_priorities    INT32   [-1]     opt,rg      434
        retention_token_range_durations_ms  INT32   [-1]     opt,rg      441
        retention_decode_priority           INT32   [1]      opt,rg      448
        retention_decode_duration_ms        INT32   [1]      opt,rg      455
        guided_decoding_guide_type          STRING  [1]      opt,rg      462
        guided_decoding_guide               STRING  [1]      opt,rg      469
        lookahead_window_size               INT32   [1]      opt,rg      476
        lookahead_ngram_size                INT32   [1]      opt,rg      483
        lookahead_verification_set_size     INT32   [1]      opt,rg      490
    """),
    outputs=_tensors("""
        output_ids                   INT32   [-1,-1]     -   499  always
        sequence_length              INT32   [-1]        -   504  always
        cum_log_probs                FP32    [-1]        -   509  flag:return_log_probs
        output_log_probs             FP32    [-1,-1]     -   514  flag:return_log_probs
        context_logits               ${logits_datatype} [-1,-1] - 519 flag:return_context_logits
        generation_logits            ${logits_datatype} [-1,-1,-1] - 524 flag:return_generation_logits
        batch_index                  INT32   [1]         -   529  batched
        sequence_index               INT32   [1]         -   534  multi_sequence
        context_phase_params         UINT8   [-1]        -   539  never
        kv_cache_alloc_new_blocks    INT32   [1]         -   544  flag_unchecked:return_perf_metrics
        kv_cache_reused_blocks       INT32   [1]         -   549  flag_unchecked:return_perf_metrics
        kv_cache_alloc_total_blocks  INT32   [1]         -   554  flag_unchecked:return_perf_metrics
        arrival_time_ns              INT64   [1]         -   559  flag_unchecked:return_perf_metrics
        first_scheduled_time_ns      INT64   [1]         -   564  flag_unchecked:return_perf_metrics
        first_token_time_ns          INT64   [1]         -   569  flag_unchecked:return_perf_metrics
        last_token_time_ns           INT64   [1]         -   574  flag_unchecked:return_perf_metrics
        acceptance_rate              FP32    [1]         -   579  flag_unchecked:return_perf_metrics
        total_accepted_draft_tokens  INT32   [1]         -   584  flag_unchecked:return_perf_metrics
        total_draft_tokens           INT32   [1]         -   589  flag_unchecked:return_perf_metrics
        num_input_tokens             INT32   [1]         -   594  flag:return_num_input_tokens
        num_output_tokens            INT32   [1]         -   599  flag:return_num_output_tokens
    """) + _tensors("""
        preceding_ids                INT32   [-1]        -   0    always
        is_final                     BOOL    [1]         -   0    always
    """, extra="reference"),
    parameters=_parameters("""
        max_beam_width | 1 | beam width the engine serves | 611
        FORCE_CPU_ONLY_INPUT_TENSORS | no | a literal of the template | 617
        gpt_model_type | inflight_fused_batching | inflight_fused_batching, or V1 (no in-flight batching) | 623
        gpt_model_path | "" | the engine directory | 629
        encoder_model_path | "" | encoder engine (encoder-decoder models only) | 635
        max_tokens_in_paged_kv_cache | "" | KV-cache size in tokens (unset: as memory allows) | 641
        max_attention_window_size | "" | attention window per layer, comma separated (unset: max_seq_len) | 647
        sink_token_length | "" | StreamingLLM sink tokens | 653
        batch_scheduler_policy | guaranteed_no_evict | max_utilization or guaranteed_no_evict | 659
        kv_cache_free_gpu_mem_fraction | 0.9 | share of free GPU memory for the KV cache | 665
        cross_kv_cache_fraction | "" | cross-attention share of the KV cache (encoder-decoder only) | 671
        kv_cache_host_memory_bytes | 0 | host memory for KV-cache offloading | 677
        kv_cache_onboard_blocks | true | move offloaded blocks back before use | 684
        exclude_input_in_output | false | true: output_ids hold the completion only | 697
        cancellation_check_period_ms | 100 | how often client cancellation is polled | 703
        stats_check_period_ms | 100 | how often statistics are polled | 709
        iter_stats_max_iterations | "" | iteration statistics kept | 715
        request_stats_max_iterations | "" | request statistics kept | 721
        enable_kv_cache_reuse | true | reuse the KV cache of a shared prompt prefix | 727
        normalize_log_probs | true | normalise log probabilities | 733
        enable_chunked_context | false | split long prompts over steps | 739
        gpu_device_ids | "" | GPUs of each instance | 745
        participant_ids | "" | MPI ranks (orchestrator mode) | 751
        num_nodes | 1 | nodes the engine spans | 757
        lora_cache_optimal_adapter_size | 8 | LoRA cache | 763
        lora_cache_max_adapter_size | 64 | LoRA cache | 769
        lora_cache_gpu_memory_fraction | 0.05 | LoRA cache | 775
        lora_cache_host_memory_bytes | 1073741824 | LoRA cache (1 GiB) | 781
        lora_prefetch_dir | "" | LoRA adapters loaded at start | 787
        decoding_mode | "" | top_k_top_p (unset at beam 1), beam_search, medusa, lookahead, eagle, ... | 793
        executor_worker_path | /opt/tritonserver/backends/tensorrtllm/trtllmExecutorWorker | orchestrator worker | 799
        lookahead_window_size | "" | lookahead decoding W | 805
        lookahead_ngram_size | "" | lookahead decoding N | 811
        lookahead_verification_set_size | "" | lookahead decoding G | 817
        medusa_choices | "" | the Medusa tree, `{0}, {0, 0}, ...` (unset: mc_sim_7b_63) | 823
        eagle_choices | "" | the EAGLE tree | 829
        gpu_weights_percent | 1.0 | share of weights kept on the GPU | 835
        enable_context_fmha_fp32_acc | false | FP32 accumulation in context FMHA | 841
        multi_block_mode | true | multi-block attention for long sequences | 847
        cuda_graph_mode | false | CUDA graphs for generation steps | 853
        cuda_graph_cache_size | 0 | CUDA graphs kept | 859
        speculative_decoding_fast_logits | false | draft logits passed without a copy (orchestrator mode only) | 865
        tokenizer_dir | "" | tokenizer for guided decoding (the backend needs the key) | 871
        guided_decoding_backend | "" | xgrammar, or unset (the backend needs the key) | 877
        xgrammar_tokenizer_info_path | "" | xgrammar tokenizer info (the backend needs the key) | 883
    """) + _parameters("""
        kv_cache_slots | 8 | sequences whose KV cache the reference model keeps | 0
        end_id | "" | the tokenizer's end id, for requests without end_id | 0
        pad_id | "" | the tokenizer's pad id, for requests without pad_id | 0
        torch_threads | 1 | torch threads of the model's process | 0
        draft_len_schedule | "" | Medusa tree paths (self-draft: K; Lookahead: 0 is off) by active sequences, JSON | 0
        max_concurrency | "" | no Medusa tree (self-draft: no drafts; no Lookahead) above this many active sequences | 0
        self_draft_layers | "" | the self-draft's L: the engine drafts with the target's own first L layers | 0
        self_draft_len | "" | the self-draft's K (speculative.num_draft_tokens) | 0
        self_draft_checkpoint | "" | the self-draft checkpoint whose layer L is the adapter | 0
    """, extra="reference"),
)
"""`enable_trt_overlap` is left out: commented out in the template @2a9abd95 ("deprecated"), active in
@0c8de69a only as an ignored setting."""

PERF_METRICS = tuple(t.name for t in TENSORRT_LLM.outputs if t.presence == "flag_unchecked")
"""The ten outputs the backend adds to every response of a request with return_perf_metrics."""

# -- preprocessing / postprocessing ----------------------------------------------------------------------------

PREPROCESSING = ModelContract(
    "preprocessing",
    inputs=_tensors("""
        QUERY                   STRING  [1]            -      39
        DECODER_QUERY           STRING  [1]            opt    44
        IMAGE_BYTES             UINT8   [-1,-1,-1,-1]  opt    50
        IMAGE_URL               STRING  [-1]           opt    56
        IMAGE_SIZES             INT64   [-1,2]         opt    63
        VIDEO_BYTES             UINT8   [-1,-1,-1,-1]  opt    69
        REQUEST_OUTPUT_LEN      INT32   [1]            -      75
        BAD_WORDS_DICT          STRING  [-1]           opt    80
        STOP_WORDS_DICT         STRING  [-1]           opt    86
        EMBEDDING_BIAS_WORDS    STRING  [-1]           opt    92
        EMBEDDING_BIAS_WEIGHTS  FP32    [-1]           opt    98
        END_ID                  INT32   [1]            opt    104
        PAD_ID                  INT32   [1]            opt    110
        PROMPT_TABLE_EXTRA_ID   UINT64  [1]            opt    116
    """),
    outputs=_tensors("""
        INPUT_ID                    INT32   [-1]           -  124
        REQUEST_INPUT_LEN           INT32   [1]            -  129
        DECODER_INPUT_ID            INT32   [-1]           -  134
        REQUEST_DECODER_INPUT_LEN   INT32   [1]            -  139
        BAD_WORDS_IDS               INT32   [2,-1]         -  144
        STOP_WORDS_IDS              INT32   [2,-1]         -  149
        EMBEDDING_BIAS              FP32    [-1]           -  154
        REQUEST_OUTPUT_LEN          INT32   [-1]           -  159
        OUT_END_ID                  INT32   [1]            -  164
        OUT_PAD_ID                  INT32   [1]            -  169
        OUT_PROMPT_TABLE_EXTRA_IDS  UINT64  [-1]           -  174
        PIXEL_VALUES                FP16    [-1,-1,-1,-1]  -  179
        ASPECT_RATIO_IDS            INT64   [-1]           -  184
        ASPECT_RATIO_MASK           INT64   [-1,-1]        -  189
        CROSS_ATTENTION_MASK        INT64   [-1,-1,-1]     -  194
        IMAGE_SIZES                 INT64   [-1,2]         -  200
        IS_VIDEO_INPUT              BOOL    [1]            -  206
        ATTENTION_MASK              INT64   [-1]           -  212
        IMAGE_GRID_THW              INT64   [3]            -  217
        VISION_INPUT_ID             INT32   [-1]           -  222
    """),
    parameters=_parameters("""
        tokenizer_dir | tokenizer | the tokenizer (specbuild: a copy inside the model directory) | 229
        add_special_tokens | true | encode prompts with the tokenizer's special tokens | 236
        multimodal_model_path | "" | multimodal encoder (text-only when unset) | 243
        gpt_model_path | "" | engine, read only by multimodal models | 250
        max_num_images | "" | images per request (multimodal) | 257
    """) + _parameters("""
        trust_remote_code | false | the spec's target.trust_remote_code | 0
        torch_threads | 1 | torch threads of the model's process | 0
    """, extra="both"),
)

POSTPROCESSING = ModelContract(
    "postprocessing",
    inputs=_tensors("""
        TOKENS_BATCH     INT32  [-1,-1]  -  33
        SEQUENCE_LENGTH  INT32  [-1]     -  38
    """) + _tensors("""
        PRECEDING_IDS    INT32  [-1]     opt  0
        IS_FINAL         BOOL   [1]      opt  0
    """, extra="both"),
    outputs=_tensors("""
        OUTPUT  STRING  [-1]  -  45
    """),
    parameters=_parameters("""
        tokenizer_dir | tokenizer | the tokenizer (specbuild: a copy inside the model directory) | 52
        skip_special_tokens | true | leave special tokens out of the text | 59
    """) + _parameters("""
        trust_remote_code | false | the spec's target.trust_remote_code | 0
        torch_threads | 1 | torch threads of the model's process | 0
    """, extra="both"),
)
"""PRECEDING_IDS/IS_FINAL: the few tokens before a streamed chunk, so that chunks decode incrementally (spaces and
multi-byte characters survive); without them a chunk decodes on its own, as NVIDIA's postprocessing does."""

# -- ensemble and BLS: the client-facing models ----------------------------------------------------------------

ENSEMBLE = ModelContract(
    "ensemble",
    inputs=_tensors("""
        text_input                STRING  [1]      -       32
        decoder_text_input        STRING  [1]      opt     37
        max_tokens                INT32   [1]      -       43
        num_return_sequences      INT32   [1]      opt     48
        bad_words                 STRING  [-1]     opt     54
        stop_words                STRING  [-1]     opt     60
        exclude_input_in_output   BOOL    [1]      opt     66
        end_id                    INT32   [1]      opt     72
        pad_id                    INT32   [1]      opt     78
        top_k                     INT32   [1]      opt     84
        top_p                     FP32    [1]      opt     90
        temperature               FP32    [1]      opt     96
        length_penalty            FP32    [1]      opt     102
        repetition_penalty        FP32    [1]      opt     108
        min_tokens                INT32   [1]      opt     114
        presence_penalty          FP32    [1]      opt     120
        frequency_penalty         FP32    [1]      opt     126
        seed                      UINT64  [1]      opt     132
        return_log_probs          BOOL    [1]      opt     138
        return_context_logits     BOOL    [1]      opt     144
        return_generation_logits  BOOL    [1]      opt     150
        return_perf_metrics       BOOL    [1]      opt     156
        return_num_input_tokens   BOOL    [1]      opt     162
        return_num_output_tokens  BOOL    [1]      opt     168
        beam_width                INT32   [1]      opt     174
        stream                    BOOL    [1]      opt     180
        prompt_embedding_table    FP16    [-1,-1]  opt     186
        prompt_table_extra_id     UINT64  [1]      opt     192
        prompt_vocab_size         INT32   [1]      opt     198
        embedding_bias_words      STRING  [-1]     opt     204
        embedding_bias_weights    FP32    [-1]     opt     210
        lora_task_id              UINT64  [1]      opt     220
        lora_weights              FP16    [-1,-1]  opt,rg  230
        lora_config               INT32   [-1,3]   opt,rg  250
        guided_decoding_guide_type STRING [1]      opt,rg  257
        guided_decoding_guide     STRING  [1]      opt,rg  264
    """),
    outputs=_tensors("""
        text_output                  STRING  [-1]        -  273
        cum_log_probs                FP32    [-1]        -  278
        output_log_probs             FP32    [-1,-1]     -  283
        context_logits               ${logits_datatype} [-1,-1] - 288
        generation_logits            ${logits_datatype} [-1,-1,-1] - 293
        batch_index                  INT32   [1]         -  298
        sequence_index               INT32   [1]         -  303
        kv_cache_alloc_new_blocks    INT32   [1]         -  308
        kv_cache_reused_blocks       INT32   [1]         -  313
        kv_cache_alloc_total_blocks  INT32   [1]         -  318
        arrival_time_ns              INT64   [1]         -  328
        first_scheduled_time_ns      INT64   [1]         -  333
        first_token_time_ns          INT64   [1]         -  338
        last_token_time_ns           INT64   [1]         -  343
        acceptance_rate              FP32    [1]         -  348
        total_accepted_draft_tokens  INT32   [1]         -  353
        total_draft_tokens           INT32   [1]         -  358
        num_input_tokens             INT32   [1]         -  363
        num_output_tokens            INT32   [1]         -  368
    """),
)
"""The template declares kv_cache_alloc_total_blocks twice (lines 318 and 323); once is the same output."""

BLS = ModelContract(
    "tensorrt_llm_bls",
    inputs=_tensors("""
        text_input                STRING  [1]            -       37
        decoder_text_input        STRING  [1]            opt     42
        image_input               FP16    [-1,3,-1,-1]   opt     48
        image_bytes_input         UINT8   [-1,-1,-1,-1]  opt     54
        image_url_input           STRING  [1]            opt     60
        image_sizes_input         INT64   [-1,2]         opt     67
        video_bytes_input         UINT8   [-1,-1,-1,-1]  opt     73
        max_tokens                INT32   [1]            -       79
        bad_words                 STRING  [-1]           opt     84
        stop_words                STRING  [-1]           opt     90
        exclude_input_in_output   BOOL    [1]            opt     96
        end_id                    INT32   [1]            opt     102
        pad_id                    INT32   [1]            opt     108
        top_k                     INT32   [1]            opt     114
        top_p                     FP32    [1]            opt     120
        temperature               FP32    [1]            opt     126
        length_penalty            FP32    [1]            opt     132
        repetition_penalty        FP32    [1]            opt     138
        min_tokens                INT32   [1]            opt     144
        presence_penalty          FP32    [1]            opt     150
        frequency_penalty         FP32    [1]            opt     156
        seed                      UINT64  [1]            opt     162
        return_log_probs          BOOL    [1]            opt,rs  168
        return_context_logits     BOOL    [1]            opt,rs  175
        return_generation_logits  BOOL    [1]            opt,rs  182
        num_return_sequences      INT32   [1]            opt,rs  189
        beam_width                INT32   [1]            opt     196
        stream                    BOOL    [1]            opt     202
        prompt_embedding_table    ${prompt_embedding_table_data_type} [-1,-1] opt 208
        prompt_vocab_size         INT32   [1]            opt     214
        prompt_table_extra_id     UINT64  [1]            opt     220
        embedding_bias_words      STRING  [-1]           opt     226
        embedding_bias_weights    FP32    [-1]           opt     232
        num_draft_tokens          INT32   [1]            opt     238
        use_draft_logits          BOOL    [1]            opt,rs  244
        lora_task_id              UINT64  [1]            opt,rs  255
        lora_weights              FP16    [-1,-1]        opt,rg  266
        lora_config               INT32   [-1,3]         opt,rg  286
        return_perf_metrics       BOOL    [1]            opt,rs  293
        return_num_input_tokens   BOOL    [1]            opt,rs  300
        return_num_output_tokens  BOOL    [1]            opt,rs  307
        guided_decoding_guide_type STRING [1]            opt     314
        guided_decoding_guide     STRING  [1]            opt     320
    """),
    outputs=tuple(Tensor(t.name, t.data_type, t.dims, line=line) for t, line in zip(ENSEMBLE.outputs, (
        328, 333, 338, 343, 348, 353, 358, 363, 368, 373, 378, 383, 388, 393, 398, 403, 408, 413, 418), strict=True)),
    parameters=_parameters("""
        accumulate_tokens | false | streaming: each response re-detokenises all tokens so far | 425
        tensorrt_llm_model_name | tensorrt_llm | the LLM model the BLS calls | 431
        tensorrt_llm_draft_model_name | "" | the draft model (draft-target speculation) | 437
        multimodal_encoders_name | "" | multimodal encoders (unset: text only) | 443
    """) + _parameters(f"""
        preprocessing_model_name | preprocessing | the tokenizer model the BLS calls (fixed in NVIDIA's BLS) | 0
        postprocessing_model_name | postprocessing | the detokenizer model the BLS calls (fixed in NVIDIA's BLS) | 0
        num_draft_tokens | 0 | K for requests that do not send num_draft_tokens | 0
        max_draft_len | 0 | the target engine's max_draft_len | 0
        use_draft_logits | false | rejection sampling on draft logits by default | 0
        torch_threads | 1 | torch threads of the model's process | 0
        draft_len_schedule | "" | K by requests in flight, JSON (speculative.draft_len_schedule) | 0
        max_concurrency | "" | no speculation above this many requests in flight | 0
        plain_round_tokens | {PLAIN_ROUND_MAX_TOKENS} | most tokens of a K 0 round, one response each | 0
    """, extra="both"),
)

MODELS: dict[str, ModelContract] = {m.name: m for m in (TENSORRT_LLM, PREPROCESSING, POSTPROCESSING, ENSEMBLE, BLS)}

CALLED_MODEL_PARAMETERS = ("preprocessing_model_name", "tensorrt_llm_model_name", "tensorrt_llm_draft_model_name",
                           "postprocessing_model_name")
"""The BLS parameters that name models it calls, in the order it calls them: the BLS model checks them when it
loads and `deploy --check` checks them against the repository."""


# -- the ensemble's wiring ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """One ensemble step: the called model's tensors <- / -> ensemble tensors."""

    template: str  # which model contract the step calls
    input_map: dict[str, str] = field(default_factory=dict)
    output_map: dict[str, str] = field(default_factory=dict)
    reference_inputs: dict[str, str] = field(default_factory=dict)  # extras, reference repositories only
    reference_outputs: dict[str, str] = field(default_factory=dict)


def _pairs(text: str) -> dict[str, str]:
    """`key<-value` items separated by whitespace (`name` alone maps a tensor to the same name)."""
    out = {}
    for item in text.split():
        key, _, value = item.partition("<-")
        out[key] = value or key
    return out


_PRE_IN = _pairs("""QUERY<-text_input DECODER_QUERY<-decoder_text_input REQUEST_OUTPUT_LEN<-max_tokens
    BAD_WORDS_DICT<-bad_words STOP_WORDS_DICT<-stop_words EMBEDDING_BIAS_WORDS<-embedding_bias_words
    EMBEDDING_BIAS_WEIGHTS<-embedding_bias_weights END_ID<-end_id PAD_ID<-pad_id
    PROMPT_TABLE_EXTRA_ID<-prompt_table_extra_id""")
_PRE_OUT = {name: f"_{name}" for name in ("INPUT_ID", "DECODER_INPUT_ID", "REQUEST_INPUT_LEN",
                                          "REQUEST_DECODER_INPUT_LEN", "BAD_WORDS_IDS", "STOP_WORDS_IDS",
                                          "REQUEST_OUTPUT_LEN", "EMBEDDING_BIAS", "OUT_PROMPT_TABLE_EXTRA_IDS")}
_PRE_OUT |= {"OUT_END_ID": "_PREPROCESSOR_END_ID", "OUT_PAD_ID": "_PREPROCESSOR_PAD_ID"}
_LLM_FROM_PRE = _pairs("""input_ids<-_INPUT_ID decoder_input_ids<-_DECODER_INPUT_ID input_lengths<-_REQUEST_INPUT_LEN
    decoder_input_lengths<-_REQUEST_DECODER_INPUT_LEN request_output_len<-_REQUEST_OUTPUT_LEN
    end_id<-_PREPROCESSOR_END_ID pad_id<-_PREPROCESSOR_PAD_ID embedding_bias<-_EMBEDDING_BIAS
    stop_words_list<-_STOP_WORDS_IDS bad_words_list<-_BAD_WORDS_IDS prompt_table_extra_ids<-_OUT_PROMPT_TABLE_EXTRA_IDS
    runtime_top_k<-top_k runtime_top_p<-top_p len_penalty<-length_penalty streaming<-stream""")
_LLM_SAME_NAMED = tuple(t.name for t in ENSEMBLE.inputs if t.name not in set(_PRE_IN.values()) | {
    "top_k", "top_p", "length_penalty", "stream"})
"""The 22 ensemble inputs that map to tensorrt_llm inputs of the same name (ensemble/config.pbtxt L466-613)."""

ENSEMBLE_STEPS = (
    Step("preprocessing", _PRE_IN, _PRE_OUT),
    Step("tensorrt_llm", {**_LLM_FROM_PRE, **{name: name for name in _LLM_SAME_NAMED}},
         {"output_ids": "_TOKENS_BATCH", "sequence_length": "_SEQUENCE_LENGTH",
          **{t.name: t.name for t in ENSEMBLE.outputs if t.name != "text_output"}},
         reference_outputs={"preceding_ids": "_PRECEDING_IDS", "is_final": "_IS_FINAL"}),
    Step("postprocessing", {"TOKENS_BATCH": "_TOKENS_BATCH", "SEQUENCE_LENGTH": "_SEQUENCE_LENGTH"},
         {"OUTPUT": "text_output"},
         reference_inputs={"PRECEDING_IDS": "_PRECEDING_IDS", "IS_FINAL": "_IS_FINAL"}),
)
"""ensemble/config.pbtxt @2a9abd95 L373-711; the reference extras carry incremental-detokenisation context."""


def ensemble_scheduling(model_names: Mapping[str, str], *, reference: bool) -> str:
    """The `ensemble_scheduling { step [...] }` block, each step calling `model_names[step.template]`."""
    steps = []
    for step in ENSEMBLE_STEPS:
        inputs = {**step.input_map, **(step.reference_inputs if reference else {})}
        outputs = {**step.output_map, **(step.reference_outputs if reference else {})}
        lines = [f'      model_name: "{model_names[step.template]}"', "      model_version: -1"]
        lines += [f'      input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items()]
        lines += [f'      output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items()]
        steps.append("    {\n" + "\n".join(lines) + "\n    }")
    return "ensemble_scheduling {\n  step [\n" + ",\n".join(steps) + "\n  ]\n}"
