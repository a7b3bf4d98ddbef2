"""The C++ `tensorrtllm` backend's request and response rules for a `tensorrt_llm` model, without Triton.

The reference python model (`triton_models/tensorrt_llm/1/model.py`) is a thin adapter over this module: it turns
Triton tensors into a dict of numpy arrays, hands them to `Backend.receive`, submits the returned `Job` with
`Backend.submit` and sends the `Response`s it is given on its response thread (as MIS's WaitForResponse thread).
Everything a client can observe - which requests are refused and with which text, how a batch splits into rows,
which outputs a response holds and their shapes, the FINAL flags, stop commands, cancellation - follows NVIDIA's
backend, so that a contract break in the BLS, the ensemble or a config fails a CPU test as it would fail on a GPU.

Sources (NVIDIA/TensorRT-LLM, paths under `triton_backend/inflight_batcher_llm/src/` unless noted):
- MIS: `model_instance_state.cc` @0c8de69a - `enqueue`, `handleStopRequest`, `fillTritonResponse`,
  `WaitForResponse` (FINAL flags), `WaitForCancel`.
- UC / UH: `utils.cc` @19290813 (the request logic is @c8c6df08's) / `utils.h` @14c3afec -
  `splitBatchInputsTensors`, `createRequestsFromInputTensors`, `getSamplingConfigFromTensors`, `convertWordList`,
  `extractSingleton` ("Invalid size for tensor ..."), `getResponseBuffer`.
- SC: `cpp/tensorrt_llm/executor/samplingConfig.cpp` @3585984b - the SamplingConfig checks.
- RI: `cpp/tensorrt_llm/executor/requestImpl.h` @04fa274f - `Request::Impl::validate`.
- LR: `cpp/tensorrt_llm/batch_manager/llmRequest.cpp` @119c6e60 - `LlmRequest::validate`, `createResult`.
- EX: `cpp/tensorrt_llm/executor/executorImpl.cpp` (index id 571425092) - `fetchNewRequests`, cancellation.
- TE: `cpp/include/tensorrt_llm/common/tllmException.h` @0c6a62a1 - TLLM_CHECK texts start with
  "[TensorRT-LLM][ERROR] Assertion failed: "; TLLM_THROW texts have no prefix. The C++ texts also end with
  " (file:line)" and a stack trace, which the reference cannot reproduce and leaves out.

Which outputs a response holds and when comes from the contract (`specbuild.contracts.triton_backend`, the
`presence` of each TENSORRT_LLM output); this module applies it.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from specbuild.contracts import lookahead as la
from specbuild.contracts.triton_backend import PERF_METRICS, TENSORRT_LLM
from specbuild.python_models.detokenize import preceding_tokens

ASSERT = "[TensorRT-LLM][ERROR] Assertion failed: "
WARNING = "[TensorRT-LLM][WARNING] "
TOKENS_PER_BLOCK = 32
"""KV-cache block size: TensorRT-LLM's default (`tensorrt_llm/plugin/plugin.py` PluginConfig.tokens_per_block,
"Define how many tokens are contained in each paged kv cache block", default 32). The reference keeps whole
sequences, not blocks; the kv_cache_* perf metrics count what the same sequence would take in such blocks."""
MAX_BEAM_WIDTH = 1024
"""tensorrt_llm::kernels::kMaxBeamWidth, the bound of SC checkBeamWidth."""
DECODING_MODES = ("top_k", "top_p", "top_k_top_p", "beam_search", "medusa", "redrafter", "lookahead", "eagle")
"""What MIS getExecutorConfigFromParams accepts for decoding_mode (anything else: a warning and the default)."""
GUIDE_TYPES = ("json", "json_schema", "regex", "ebnf_grammar")
"""UC getGuidedDecodingParamsFromTensors: other guide types mean no guided decoding."""

IGNORED: dict[str, str] = {
    "lora_task_id": "LoRA adapters are not applied by the reference runtime",
    "lora_weights": "LoRA adapters are not applied by the reference runtime",
    "lora_config": "LoRA adapters are not applied by the reference runtime",
    "prompt_embedding_table": "prompt tables (p-tuning) are not applied by the reference runtime",
    "prompt_vocab_size": "prompt tables (p-tuning) are not applied by the reference runtime",
    "prompt_table_extra_ids": "prompt tables (p-tuning) are not applied by the reference runtime",
    "encoder_input_features": "the reference runtime has no encoder input (multimodal) path",
    "encoder_output_lengths": "the reference runtime has no encoder input (multimodal) path",
    "cross_attention_mask": "the reference runtime has no cross attention",
    "skip_cross_attn_blocks": "the reference runtime has no cross attention",
    "mrope_rotary_cos_sin": "the reference runtime has no multimodal rotary embedding",
    "mrope_position_deltas": "the reference runtime has no multimodal rotary embedding",
    "context_phase_params": "the reference runtime serves no disaggregated (context/generation) requests",
    "retention_token_range_starts": "KV-cache retention priorities do not change outputs; the reference ignores them",
    "retention_token_range_ends": "KV-cache retention priorities do not change outputs; the reference ignores them",
    "retention_token_range_priorities": "KV-cache retention priorities do not change outputs; the reference "
                                        "ignores them",
    "retention_token_range_durations_ms": "KV-cache retention priorities do not change outputs; the reference "
                                          "ignores them",
    "retention_decode_priority": "KV-cache retention priorities do not change outputs; the reference ignores them",
    "retention_decode_duration_ms": "KV-cache retention priorities do not change outputs; the reference ignores them",
    "runtime_top_p_decay": "top-p decay is not applied by the reference runtime",
    "runtime_top_p_reset_ids": "top-p decay is not applied by the reference runtime",
    "draft_acceptance_threshold": "the reference accepts draft tokens by rejection sampling without a threshold",
}
"""Inputs NVIDIA's backend reads for features the reference runtime lacks: accepted (after the checks the C++
backend applies to them) and ignored, with one logged note per model load and input name. Inputs the C++ backend
itself ignores here (decoder_input_ids of a decoder-only engine, len_penalty/early_stopping/
beam_search_diversity_rate at beam width 1, runtime_top_p_min, which UC looks up as "runtime_top_k_min") are
ignored silently, as there."""
MEDUSA_IGNORED: dict[str, str] = {
    name: "decoding_mode medusa: TensorRT-LLM's Medusa decoding applies no temperature, top_p, repetition/"
          "presence/frequency penalty or bad words (DecodingMode::Medusa)"
    for name in ("temperature", "runtime_top_p", "repetition_penalty", "presence_penalty", "frequency_penalty",
                 "bad_words_list")
}


class BackendError(Exception):
    """A request refused with the C++ backend's text."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class EnqueueError(BackendError):
    """Building the executor requests failed (MIS enqueue): one final error response, nothing runs."""


class AdmissionError(BackendError):
    """The executor refused one row when fetching it (EX fetchNewRequests): that row's error response."""


class PopulateError(BackendError):
    """fillTritonResponse failed (MIS: "Error encountered while populating response: ...")."""


class ModelLoadError(BackendError):
    """The instance cannot start with these parameters (MIS getExecutorConfigFromParams)."""


# -- parameters ----------------------------------------------------------------------------------------------


def parse_bool(value: str | None, default: bool) -> bool:
    """ModelState::GetParameter<bool>: True/true/TRUE/1 and False/false/FALSE/0, anything else (an unfilled
    `${...}`, "") throws and the caller keeps its default."""
    if value in ("True", "true", "TRUE", "1"):
        return True
    if value in ("False", "false", "FALSE", "0"):
        return False
    return default


def parse_int(value: str | None, default: int) -> int:
    try:
        return int(str(value).strip())
    except ValueError:
        return default


@dataclass(frozen=True)
class BackendConfig:
    """One model instance's settings: its config.pbtxt parameters (NVIDIA's defaults where unset) and the
    engine's limits (engine.json)."""

    model_name: str = "tensorrt_llm"
    decoupled: bool = False
    exclude_input_in_output: bool = False
    normalize_log_probs: bool = True
    cancellation_check_period_ms: int = 100
    decoding_mode: str = "top_k_top_p"
    max_beam_width: int = 1
    lookahead: bool = False  # decoding_mode lookahead with its three parameters
    lookahead_config: la.LookaheadConfig | None = None  # the instance's (W, N, G) when `lookahead`
    guided_decoding: bool = False  # a guided decoding backend is configured
    max_input_len: int = 1 << 30
    max_seq_len: int = 1 << 30
    max_draft_len: int = 0
    vocab_size: int = 32000
    gather_context_logits: bool = False
    gather_generation_logits: bool = False
    declared_outputs: frozenset[str] | None = None  # None: every output of the contract
    logits_datatype: str = "TYPE_FP32"  # the config's (first of generation_logits/context_logits, MS:77-93)
    engine_logits_datatype: str = "TYPE_FP32"  # specbuild's checkpoints all have float32 logits
    tokens_per_block: int = TOKENS_PER_BLOCK

    @property
    def medusa(self) -> bool:
        return self.decoding_mode == "medusa"

    @classmethod
    def from_model(cls, parameters: Mapping[str, str], model_config: Mapping[str, Any], engine: Any,
                   ) -> tuple[BackendConfig, list[str]]:
        """The instance's settings from its parameters (`string_value`s), its model config (JSON) and the
        engine's EngineInfo; also the warnings the C++ backend logs for unset parameters that matter here."""
        warnings: list[str] = []
        get = parameters.get
        beam = parse_int(get("max_beam_width"), 1)
        mode = (get("decoding_mode") or "").strip()
        if mode not in DECODING_MODES:
            warnings.append("decoding_mode parameter is invalid or not specified(must be one of the {top_k, top_p, "
                            "top_k_top_p, beam_search, medusa, redrafter, lookahead, eagle}).Using default: "
                            "top_k_top_p if max_beam_width == 1, beam_search otherwise")
            mode = "top_k_top_p" if beam == 1 else "beam_search"
        lookahead = False
        lookahead_config = None
        if mode == "lookahead":
            sizes = [parse_int(get(k), -1) for k in ("lookahead_window_size", "lookahead_ngram_size",
                                                     "lookahead_verification_set_size")]
            if min(sizes) < 0:
                raise ModelLoadError(
                    "Decoding mode is set to lookahead but lookahead parameters are not specified. Please set "
                    "parameters lookahead_window_size, lookahead_ngram_size, and lookahead_verification_set_size.")
            legal = la.legal_problems(*sizes)
            if legal:  # the executor's LookaheadDecodingConfig is constructed from them (decodingConfig.cpp)
                raise ModelLoadError(la.ASSERT + legal[0])
            lookahead = True
            lookahead_config = la.LookaheadConfig(*sizes)
        backend = (get("guided_decoding_backend") or "").strip()
        info_path = (get("xgrammar_tokenizer_info_path") or "").strip()
        guided = bool(backend) and not backend.startswith("${") and bool(info_path) and not info_path.startswith("${")
        if guided and backend != "xgrammar":
            raise ModelLoadError("Guided decoding is currently supported with 'xgrammar' backend. Invalid "
                                 "guided_decoding_backend parameter provided.")
        outputs = model_config.get("output", [])
        logits_type = next((o.get("data_type", "TYPE_FP32") for o in outputs
                            if o.get("name") in ("generation_logits", "context_logits")), "TYPE_FP32")
        policy = model_config.get("model_transaction_policy", {})
        config = cls(
            model_name=str(model_config.get("name", "tensorrt_llm")),
            decoupled=bool(policy.get("decoupled", False)),
            exclude_input_in_output=parse_bool(get("exclude_input_in_output"), False),
            normalize_log_probs=parse_bool(get("normalize_log_probs"), True),
            cancellation_check_period_ms=parse_int(get("cancellation_check_period_ms"), 100),
            decoding_mode=mode,
            max_beam_width=beam,
            lookahead=lookahead,
            lookahead_config=lookahead_config,
            guided_decoding=guided,
            max_input_len=engine.max_input_len,
            max_seq_len=engine.max_seq_len,
            max_draft_len=engine.max_draft_len,
            vocab_size=engine.vocab_size,
            gather_context_logits=engine.gather_context_logits,
            gather_generation_logits=engine.gather_generation_logits,
            declared_outputs=frozenset(o["name"] for o in outputs) if outputs else None,
            logits_datatype=logits_type,
        )
        return config, warnings


# -- requests ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sampling:
    """The executor's SamplingConfig of one row (None: not set)."""

    beam_width: int = 1
    top_k: int | None = None
    top_p: float | None = None
    top_p_decay: float | None = None
    top_p_reset_ids: int | None = None
    seed: int | None = None
    temperature: float | None = None
    min_tokens: int | None = None
    beam_search_diversity_rate: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    length_penalty: float | None = None
    early_stopping: int | None = None
    num_return_sequences: int | None = None


@dataclass(frozen=True)
class RowRequest:
    """One executor request: a batch row of the Triton request, as UC createRequestsFromInputTensors makes it."""

    batch_index: int
    input_ids: list[int]
    max_new_tokens: int
    streaming: bool
    exclude_input: bool
    sampling: Sampling = field(default_factory=Sampling)
    end_id: int | None = None
    pad_id: int | None = None
    return_log_probs: bool = False
    return_context_logits: bool = False
    return_generation_logits: bool = False
    return_perf_metrics: bool = False
    bad_words: tuple[tuple[int, ...], ...] | None = None
    stop_words: tuple[tuple[int, ...], ...] | None = None
    embedding_bias: np.ndarray | None = None
    draft_ids: list[int] | None = None
    draft_logits: np.ndarray | None = None
    prompt_table: bool = False
    prompt_extra_ids: bool = False  # prompt_table_extra_ids given with the input's length (UC only uses those)
    guided: bool = False  # a guide type the backend maps to guided decoding
    lookahead: la.LookaheadConfig | None = None  # the request's own (w, n, g) (lookahead_* inputs)

    @property
    def num_sequences(self) -> int:
        return self.sampling.num_return_sequences or 1


@dataclass(frozen=True)
class TritonRequest:
    """A Triton request accepted by the backend: its rows and the request-level flags (MIS enqueue reads
    return_perf_metrics and return_num_* with getRequestBooleanInputTensor, the first value of the tensor)."""

    rows: tuple[RowRequest, ...]
    requested: frozenset[str] | None  # requested output names (None: all)
    streaming: bool = False
    return_perf_metrics: bool = False
    return_num_input_tokens: bool = False
    return_num_output_tokens: bool = False
    request_id: str = ""

    @property
    def batch_size(self) -> int:
        return len(self.rows)


def first_bool(array: np.ndarray | None) -> bool:
    """getRequestBooleanInputTensor: the first bool of the input's buffer, False when the input is absent."""
    return bool(array is not None and array.size and bool(array.reshape(-1)[0]))


def _singleton(tensors: Mapping[str, np.ndarray], name: str) -> Any | None:
    """UH extractSingleton: absent -> None; a tensor of more than one value is an error."""
    array = tensors.get(name)
    if array is None:
        return None
    if array.size != 1:
        raise EnqueueError(f"{ASSERT}Invalid size for tensor {name}")
    return array.reshape(-1)[0].item()


def _vector(tensors: Mapping[str, np.ndarray], name: str) -> list[Any] | None:
    """UH extractVector: every value of the (row's) tensor, flattened."""
    array = tensors.get(name)
    return None if array is None else array.reshape(-1).tolist()


def convert_word_list(flat: list[int]) -> tuple[tuple[int, ...], ...]:
    """UC convertWordList: a [2, L] word list flattened (ids, then cumulative end offsets padded with -1)."""

    def listed() -> str:
        return "".join(f"{v} " for v in flat)

    n = len(flat)
    if n % 2:
        raise EnqueueError(f"{ASSERT}Sparse list must not have odd length: {listed()}")
    num_tokens = n // 2
    words: list[tuple[int, ...]] = []
    current = 0
    for i in range(num_tokens, n):
        if flat[i] == -1:
            if any(flat[j] != -1 for j in range(i + 1, n)):
                raise EnqueueError(f"{ASSERT}Sparse list must not have additional -1s: {listed()}")
            break
        if flat[i] > num_tokens:
            raise EnqueueError(f"{ASSERT}Sparse list must not have out-of-bound offsets: {listed()}")
        if i != num_tokens and flat[i] <= flat[i - 1]:
            raise EnqueueError(f"{ASSERT}Sparse list must not have non-increasing offsets: {listed()}")
        words.append(tuple(int(t) for t in flat[current:flat[i]]))
        current = max(current, flat[i])
    return tuple(words)


def _sampling(row: Mapping[str, np.ndarray]) -> Sampling:
    """UC getSamplingConfigFromTensors, then the SC constructor's checks in its member order."""
    beam = _singleton(row, "beam_width")
    top_p = _singleton(row, "runtime_top_p")
    early = _singleton(row, "early_stopping")  # extracted as int32 from a BOOL tensor: its first byte
    sampling = Sampling(
        beam_width=1 if beam is None else int(beam),
        top_k=_opt(_singleton(row, "runtime_top_k"), int),
        top_p=None if top_p is None or float(top_p) <= 0.0 else float(top_p),  # UC: top_p <= 0 is dropped
        top_p_decay=_opt(_singleton(row, "runtime_top_p_decay"), float),
        top_p_reset_ids=_opt(_singleton(row, "runtime_top_p_reset_ids"), int),
        seed=_opt(_singleton(row, "seed"), int),
        temperature=_opt(_singleton(row, "temperature"), float),
        length_penalty=_opt(_singleton(row, "len_penalty"), float),
        early_stopping=None if early is None else int(bool(early)),
        repetition_penalty=_opt(_singleton(row, "repetition_penalty"), float),
        min_tokens=_opt(_singleton(row, "min_tokens"), int),
        beam_search_diversity_rate=_opt(_singleton(row, "beam_search_diversity_rate"), float),
        presence_penalty=_opt(_singleton(row, "presence_penalty"), float),
        frequency_penalty=_opt(_singleton(row, "frequency_penalty"), float),
        num_return_sequences=_opt(_singleton(row, "num_return_sequences"), int),
    )
    s = sampling
    checks = [
        (0 < s.beam_width <= MAX_BEAM_WIDTH,
         "beamWidth > 0 && beamWidth <= static_cast<SizeType32 const>(tensorrt_llm::kernels::kMaxBeamWidth)"),
        (s.top_k is None or s.top_k >= 0, "topK.value() >= 0"),
        (s.top_p is None or s.top_p <= 1.0, "topP.value() <= 1.f"),
        (s.top_p_reset_ids is None or s.top_p_reset_ids >= 0, "topPResetIds.value() >= 0"),
        (s.top_p_decay is None or s.top_p_decay > 0.0, "topPDecay.value() > 0.f"),
        (s.top_p_decay is None or s.top_p_decay <= 1.0, "topPDecay.value() <= 1.f"),
        (s.temperature is None or s.temperature >= 0.0, "temperature.value() >= 0.f"),
        (s.min_tokens is None or s.min_tokens >= 0, "minTokens.value() >= 0"),
        (s.beam_search_diversity_rate is None or s.beam_search_diversity_rate >= 0.0,
         "beamSearchDiversityRate.value() >= 0.f"),
        (s.repetition_penalty is None or s.repetition_penalty > 0.0, "repetitionpenalty.value() > 0.f"),
        (s.length_penalty is None or s.length_penalty >= 0.0, "lengthPenalty.value() >= 0.f"),
        (s.early_stopping is None or s.early_stopping >= 0, "earlyStopping.value() >= 0"),
        (s.num_return_sequences is None or s.num_return_sequences > 0, "numReturnSequences.value() > 0"),
        (s.num_return_sequences is None or s.beam_width == 1 or s.num_return_sequences <= s.beam_width,
         "beamWidth == 1 || numReturnSequences.value() <= beamWidth"),
    ]
    for ok, text in checks:
        if not ok:
            raise EnqueueError(ASSERT + text)
    if s.beam_width != 1:
        raise EnqueueError(f"beam_width {s.beam_width}: the reference backend decodes with beam width 1 only "
                           "(beam search is not implemented by specbuild's reference runtime)")
    return sampling


def _opt(value: Any | None, cast: Callable[[Any], Any]) -> Any | None:
    return None if value is None else cast(value)


def split_rows(inputs: Mapping[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    """UC splitBatchInputsTensors: one tensor map per batch row; with batch > 1 every tensor is sliced to its row
    and input_ids cut to the row's input_lengths (batch 1 keeps input_ids whole, padding included)."""
    ids = inputs.get("input_ids")
    features = inputs.get("encoder_input_features")
    if ids is not None:
        if ids.ndim != 2:
            raise EnqueueError(f"{ASSERT}Expected inputTokens tensors to have 2 dimensions")
        batch = ids.shape[0]
    elif features is not None:
        batch = features.shape[0]
    else:
        raise EnqueueError("inputTokens or encoderInputFeatures tensor not provided")
    if batch <= 1:
        return [dict(inputs)]
    lengths = inputs.get("input_lengths")
    if lengths is None:
        raise EnqueueError(f"{ASSERT}input lengths tensor not provided")
    lengths = lengths.reshape(lengths.shape[0], -1)[:, 0]
    rows = []
    for b in range(batch):
        row = {name: array[b : b + 1] for name, array in inputs.items()}
        for name in ("input_ids", "encoder_input_features"):
            if name in row:
                row[name] = row[name][:, : int(lengths[b])]
        rows.append(row)
    return rows


def parse_request(inputs: Mapping[str, np.ndarray], requested: Iterable[str] | None, config: BackendConfig, *,
                  request_id: str = "", note: Callable[[str, str], None] | None = None) -> TritonRequest:
    """MIS createExecutorRequests + UC createRequestsFromInputTensors: the rows of a (non-stop) request, or an
    EnqueueError with the backend's text. `note(input, why)` is told of inputs the reference accepts and ignores."""
    streaming = first_bool(inputs.get("streaming"))
    rows_inputs = split_rows(inputs)
    if not config.decoupled and len(rows_inputs) > 1:
        raise EnqueueError("Batch size > 1 requires the tensorrt_llm backend to be using decoupled transaction policy")
    if streaming and not config.decoupled:
        raise EnqueueError("Streaming is only supported if model is deployed using decoupled mode.")
    rows = tuple(_row(b, row, streaming, config, note) for b, row in enumerate(rows_inputs))
    return TritonRequest(rows, None if requested is None else frozenset(requested), streaming,
                         first_bool(inputs.get("return_perf_metrics")),
                         first_bool(inputs.get("return_num_input_tokens")),
                         first_bool(inputs.get("return_num_output_tokens")), request_id)


def _row(b: int, row: Mapping[str, np.ndarray], streaming: bool, config: BackendConfig,
         note: Callable[[str, str], None] | None) -> RowRequest:
    """One row, in UC's order (the first failing check is the one reported)."""
    flags = {name: bool(_singleton(row, name) or False) for name in (
        "return_log_probs", "return_generation_logits", "return_context_logits", "return_perf_metrics")}
    exclude = _singleton(row, "exclude_input_in_output")
    tokens = _vector(row, "input_ids")
    if tokens is None and "encoder_input_features" not in row:
        raise EnqueueError("input_ids or encoder_input_features is not present in the request.")
    max_new = _singleton(row, "request_output_len")
    if max_new is None:
        raise EnqueueError("request_output_len is not present in the request")
    end_id, pad_id = _singleton(row, "end_id"), _singleton(row, "pad_id")
    sampling = _sampling(row)
    bad = _vector(row, "bad_words_list")
    stop = _vector(row, "stop_words_list")
    bad_words = None if bad is None else convert_word_list([int(v) for v in bad])
    stop_words = None if stop is None else convert_word_list([int(v) for v in stop])
    bias = row.get("embedding_bias")
    embedding_bias = None if bias is None or bias.size == 0 else bias.reshape(-1).astype(np.float32)
    prompt_length = len(tokens or ())
    extra_ids = _vector(row, "prompt_table_extra_ids")
    _check_lora_and_retention(row)
    drafts = _vector(row, "draft_input_ids")
    draft_logits = row.get("draft_logits")
    _singleton(row, "draft_acceptance_threshold")
    lookahead = None
    if "lookahead_window_size" in row:
        sizes = []
        for name in la.PARAMETERS:
            if name not in row:
                raise EnqueueError(f"Failed to extract {name}")
            sizes.append(int(_singleton(row, name) or 0))
        # UC getLookaheadDecodingFromTensors constructs the request's LookaheadDecodingConfig (its checks) before
        # it looks for the instance's (utils.cc @c8c6df08)
        legal = la.legal_problems(*sizes)
        if legal:
            raise EnqueueError(la.ASSERT + legal[0])
        lookahead = la.LookaheadConfig(*sizes)
        if not config.lookahead:
            raise EnqueueError(f"{ASSERT}Cannot set the request lookahead decoding configuration when model "
                               "instance lookahead parameters are not set.")
    # executor::Request's constructor (RI validate)
    if not tokens:
        raise EnqueueError(f"{ASSERT}!mInputTokenIds.empty()")
    if int(max_new) <= 0:
        raise EnqueueError(f"{ASSERT}mMaxNewTokens > 0")
    guide_type = row.get("guided_decoding_guide_type")
    guided = guide_type is not None and guide_type.size > 0 and _text(guide_type.reshape(-1)[0]) in GUIDE_TYPES
    if note is not None:
        for name in row:
            if name in IGNORED and not (name == "draft_acceptance_threshold" and not drafts):
                note(name, IGNORED[name])
            if config.medusa and name in MEDUSA_IGNORED:
                note(name, MEDUSA_IGNORED[name])
    return RowRequest(
        batch_index=b,
        input_ids=[int(t) for t in tokens],
        max_new_tokens=int(max_new),
        streaming=streaming,
        exclude_input=config.exclude_input_in_output if exclude is None else bool(exclude),
        sampling=sampling,
        end_id=None if end_id is None else int(end_id),
        pad_id=None if pad_id is None else int(pad_id),
        bad_words=bad_words,
        stop_words=stop_words,
        embedding_bias=embedding_bias,
        draft_ids=None if drafts is None else [int(t) for t in drafts],
        draft_logits=None if draft_logits is None or draft_logits.size == 0 else
        draft_logits.reshape(-1, draft_logits.shape[-1]).astype(np.float32),
        prompt_table="prompt_embedding_table" in row,
        prompt_extra_ids=extra_ids is not None and len(extra_ids) == prompt_length,
        guided=guided,
        lookahead=lookahead,
        **flags,
    )


def _check_lora_and_retention(row: Mapping[str, np.ndarray]) -> None:
    """UC getLoraConfigFromTensors / getKvCacheRetentionConfigFromTensors: their shape checks (the features
    themselves the reference ignores)."""
    _singleton(row, "lora_task_id")
    starts = _vector(row, "retention_token_range_starts")
    if starts is None:
        return
    ends = _vector(row, "retention_token_range_ends")
    if ends is None or len(ends) != len(starts):
        raise EnqueueError("retention_token_range_ends must be provided, and have the same length as "
                           "retention_token_range_starts")
    priorities = _vector(row, "retention_token_range_priorities")
    if priorities is None or len(priorities) != len(starts):
        raise EnqueueError("retention_token_range_priorities must be provided, and have the same length as "
                           "retention_token_range_starts")
    durations = _vector(row, "retention_token_range_durations_ms")
    if durations is not None and len(durations) != len(starts):
        raise EnqueueError("retention_token_range_durations_ms must have the same length as "
                           "retention_token_range_starts")
    _singleton(row, "retention_decode_priority")
    _singleton(row, "retention_decode_duration_ms")


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def admit(row: RowRequest, config: BackendConfig) -> tuple[RowRequest, list[str]]:
    """What the executor checks when it fetches a request (EX fetchNewRequests: LR LlmRequest::validate, then
    the logits and guided-decoding checks): the row to run (max_new_tokens shortened, drafts truncated) and the
    warnings logged, or an AdmissionError with the text the executor wraps."""
    warnings: list[str] = []
    prompt = len(row.input_ids)
    if row.end_id is not None and not -1 <= row.end_id < config.vocab_size:
        raise AdmissionError(f"{ASSERT}EndId ({row.end_id}) is not within acceptable range "
                             f"[-1, {config.vocab_size}).")
    if prompt > config.max_input_len:
        raise AdmissionError(f"Prompt length ({prompt}) exceeds maximum input length ({config.max_input_len}). Set "
                             "log level to info and check TRTGptModel logs for how maximum input length is set")
    draft_per_step = config.max_draft_len  # reserved even for a request without drafts (LR:268-270)
    drafts = row.draft_ids
    if drafts:
        if len(drafts) > config.max_draft_len:
            raise AdmissionError(f"Draft tokens length ({len(drafts)}) exceeds maximum draft tokens length "
                                 f"({config.max_draft_len}).")
        draft_per_step = len(drafts)
        if prompt + draft_per_step > config.max_input_len:
            shorter = config.max_input_len - prompt
            warnings.append(f"Prompt length + number of draft tokens ({prompt} + {draft_per_step}) exceeds maximum "
                            f"input length ({config.max_input_len}).Number of draft tokens is changed to ({shorter})")
            draft_per_step = shorter
            drafts = drafts[:shorter]
    max_new = row.max_new_tokens
    if prompt + max_new + draft_per_step > config.max_seq_len:
        shorter = config.max_seq_len - prompt - draft_per_step
        warnings.append(f"Prompt length + number of requested output tokens + draft tokens per step ({prompt} + "
                        f"{max_new} + {draft_per_step}) exceeds maximum sequence length ({config.max_seq_len}). "
                        f"Number of requested output tokens is changed to ({shorter}).")
        max_new = shorter
    if row.prompt_table and not row.prompt_extra_ids:
        # enable_kv_cache_reuse defaults to true (MIS) and a prompt table always sets the prompt vocab size
        # (llmRequest.h: mPromptVocabSize = the table's rows), so LlmRequest::validate wants the extra ids
        raise AdmissionError(f"{ASSERT}Input token extra ids must be provided when enabling kv cache reuse with "
                             "prompt table")
    if row.return_context_logits and not config.gather_context_logits:
        raise AdmissionError(f"{ASSERT}Return context logit need to build engine with gather_context_logits")
    if row.return_generation_logits and not config.gather_generation_logits:
        raise AdmissionError(f"{ASSERT}To return generation logits, gather_generation_logits must be enabled in "
                             "ExecutorConfig")
    if row.lookahead is not None and config.lookahead_config is not None:
        # the lookahead layer's and algorithm's setup (lookaheadDecodingLayer.cpp @7ed07f06, lookaheadAlgorithm.cpp
        # @2a9abd95): the request's (w, n, g) must fit the instance's (W, N, G)
        problem = la.request_problem(row.lookahead, config.lookahead_config)
        if problem is not None:
            raise AdmissionError(problem)
    if row.guided:
        if not config.guided_decoding:
            raise AdmissionError(f"{ASSERT}Request is specified with GuidedDecodingParams, but GuidedDecoder is not "
                                 "setup. Please provide a valid GuidedDecodingConfig to setup GuidedDecoder.")
        raise AdmissionError("guided decoding: the reference backend has no guided decoder (xgrammar); deploy "
                             "the TensorRT-LLM engine for guided decoding")
    return replace(row, max_new_tokens=max_new, draft_ids=drafts,
                   draft_logits=None if row.draft_logits is None or drafts is None else
                   row.draft_logits[: len(drafts)]), warnings


# -- responses -----------------------------------------------------------------------------------------------


@dataclass
class Response:
    """One Triton response: outputs (None = an empty response), or an error; `final` is the COMPLETE_FINAL flag."""

    outputs: dict[str, np.ndarray] | None = None
    error: str | None = None
    final: bool = False


@dataclass
class SequenceView:
    """What one response reports of a sequence (a row's n-th returned sequence)."""

    tokens: list[int]  # output_ids of this response (with the prompt when it is included)
    log_probs: list[float]  # every generated token so far (createResult returns all of getLogProbs())
    cum_log_prob: float
    generation_logits: np.ndarray | None  # [rows, V] for this response
    context_logits: np.ndarray | None
    perf: dict[str, Any] | None
    preceding: list[int]  # reference extra: generated tokens just before a streamed chunk
    final: bool  # this sequence's last response


def response_outputs(view: SequenceView, row: RowRequest, request: TritonRequest, config: BackendConfig, *,
                     sequence_index: int = 0) -> dict[str, np.ndarray]:
    """MIS fillTritonResponse for one row's result: the outputs the backend creates, by the contract's presence
    rules, in the backend's shapes; a PopulateError (with its text) where the backend's would fail."""
    wanted = request.requested

    def asked(name: str) -> bool:
        return wanted is None or name in wanted

    values: dict[str, Callable[[], np.ndarray]] = {
        "output_ids": lambda: np.asarray(view.tokens, dtype=np.int32).reshape(1, 1, -1),
        "sequence_length": lambda: np.array([[len(view.tokens)]], dtype=np.int32),
        "cum_log_probs": lambda: np.array([[view.cum_log_prob]], dtype=np.float32),
        "output_log_probs": lambda: np.asarray(view.log_probs, dtype=np.float32).reshape(1, 1, -1),
        "context_logits": lambda: np.asarray(view.context_logits, dtype=np.float32)[None],
        "generation_logits": lambda: np.asarray(view.generation_logits, dtype=np.float32)[None, None],
        "batch_index": lambda: np.array([[row.batch_index]], dtype=np.int32),
        "sequence_index": lambda: np.array([[sequence_index]], dtype=np.int32),
        "num_input_tokens": lambda: np.array([[len(row.input_ids)]], dtype=np.int32),
        "num_output_tokens": lambda: np.array([[len(view.tokens)]], dtype=np.int32),  # every beam's tokens
        "preceding_ids": lambda: _padded(view.preceding),
        "is_final": lambda: np.array([[view.final]], dtype=bool),
    }
    for name, value in (view.perf or {}).items():
        values[name] = (lambda v=value, n=name: np.array([[v]], dtype=_PERF_DTYPES[n]))
    flags = {"return_log_probs": row.return_log_probs, "return_context_logits": row.return_context_logits,
             "return_generation_logits": row.return_generation_logits,
             "return_num_input_tokens": request.return_num_input_tokens,
             "return_num_output_tokens": request.return_num_output_tokens,
             "return_perf_metrics": request.return_perf_metrics and view.perf is not None}
    outputs: dict[str, np.ndarray] = {}
    # MIS checks output_ids and sequence_length before anything else
    for tensor in sorted(TENSORRT_LLM.outputs, key=lambda t: t.presence != "always"):
        name, presence = tensor.name, tensor.presence
        if presence == "always":
            if not asked(name):
                if tensor.extra is not None:
                    continue  # specbuild's own extras: only when asked for
                raise PopulateError(f"{name} tensor must be present in list of output tensors")
        elif presence == "flag":
            if not (flags[tensor.flag] and asked(name)):  # type: ignore[index]
                continue
            if name == "context_logits" and view.context_logits is None:
                continue
            if name == "generation_logits" and view.generation_logits is None:
                continue
        elif presence == "flag_unchecked":
            if not flags[tensor.flag]:  # type: ignore[index]
                continue
        elif presence == "batched":
            if not (asked(name) and request.batch_size > 1):
                continue
        elif presence == "multi_sequence":
            if not (asked(name) and row.num_sequences > 1):
                continue
        else:  # "never": context-only requests, which the reference does not serve
            continue
        if config.declared_outputs is not None and name not in config.declared_outputs:
            raise PopulateError(f"Could not get response output for output tensor {name}: unexpected inference "
                                f"output '{name}' for model '{config.model_name}'")
        if name in ("context_logits", "generation_logits") and config.engine_logits_datatype != config.logits_datatype:
            kind = "contextLogitsType" if name == "context_logits" else "generationLogitsType"
            raise PopulateError(f"{ASSERT}{kind} == model_state_->getLogitsDataType()")
        outputs[name] = values[name]()
    return outputs


_PERF_DTYPES = {t.name: {"TYPE_INT32": np.int32, "TYPE_INT64": np.int64, "TYPE_FP32": np.float32}[t.data_type]
                for t in TENSORRT_LLM.outputs if t.name in PERF_METRICS}


def _padded(tokens: list[int]) -> np.ndarray:
    out = np.full((1, max(1, len(tokens))), -1, dtype=np.int32)
    out[0, : len(tokens)] = tokens
    return out


def perf_metrics(*, arrival: int, first_scheduled: int, first_token: int, last_token: int, prompt: int,
                 generated: int, reused_tokens: int, accepted: int, drafted: int,
                 tokens_per_block: int = TOKENS_PER_BLOCK) -> dict[str, Any]:
    """The ten perf outputs (LR createResult: acceptance_rate = accepted / drafted when drafted > 0).

    Times are std::chrono::steady_clock nanoseconds, as the executor's RequestPerfMetrics::TimePoint is a
    steady_clock time point (MIS sends time_since_epoch() of it): time.monotonic_ns() is that clock on Linux.
    KV blocks: the sequence (prompt + generated) in blocks of `tokens_per_block` is the total; the reused ones are
    the whole blocks of the prompt prefix whose cache was reused; the rest are new."""
    total = math.ceil((prompt + generated) / tokens_per_block)
    reused = min(reused_tokens // tokens_per_block, total)
    return {
        "kv_cache_alloc_new_blocks": total - reused,
        "kv_cache_reused_blocks": reused,
        "kv_cache_alloc_total_blocks": total,
        "arrival_time_ns": arrival,
        "first_scheduled_time_ns": first_scheduled,
        "first_token_time_ns": first_token,
        "last_token_time_ns": last_token,
        "acceptance_rate": accepted / drafted if drafted else 0.0,
        "total_accepted_draft_tokens": accepted,
        "total_draft_tokens": drafted,
    }


# -- serving -------------------------------------------------------------------------------------------------


class Job:
    """A Triton request the backend accepted: its rows run on the engine side by side (each row is an executor
    request of its own, MIS), stop commands and client cancellation end them, and the FINAL flag goes on the
    last response of the last row to finish."""

    def __init__(self, request: TritonRequest, send: Callable[[Response], None],
                 client_cancelled: Callable[[], bool] | None, arrival_ns: int, check_period_ms: int,
                 clock: Callable[[], int]) -> None:
        self.request, self._send = request, send
        self.arrival_ns = arrival_ns
        self._client_cancelled = client_cancelled
        self._period_ns = max(0, check_period_ms) * 1_000_000
        self._clock = clock
        self._last_poll = arrival_ns
        self._stopped = threading.Event()
        self.stopped_by = ""  # what ended it early: "a stop request" or "its client's cancellation"
        self._lock = threading.Lock()
        self._outstanding = sum(row.num_sequences for row in request.rows)
        self.done = threading.Event()
        self.on_done: Callable[[], None] | None = None

    def stop(self) -> None:
        """A stop command for this request's id (the executor cancels every row)."""
        self.stopped_by = self.stopped_by or "a stop request"
        self._stopped.set()

    def should_stop(self) -> bool:
        """Stopped, or cancelled by the client (polled every cancellation_check_period_ms, MIS WaitForCancel)."""
        if self._stopped.is_set():
            return True
        if self._client_cancelled is None:
            return False
        now = self._clock()
        if now - self._last_poll < self._period_ns:
            return False
        self._last_poll = now
        if self._client_cancelled():
            self.stopped_by = self.stopped_by or "its client's cancellation"
            self._stopped.set()
            return True
        return False

    def send(self, response: Response, *, ends: int = 0) -> None:
        """Send one response; `ends` sequences finish with it: the one that leaves none outstanding carries the
        FINAL flag (MIS WaitForResponse)."""
        with self._lock:
            self._outstanding -= ends
            last = ends > 0 and self._outstanding <= 0
            self._send(Response(response.outputs, response.error, final=last))
        if last:
            self.done.set()
            if self.on_done is not None:
                self.on_done()


class Backend:
    """The backend of one model instance over a serving engine (`specbuild.runtime.serving.ServingEngine`, or
    anything with its `submit`)."""

    def __init__(self, config: BackendConfig, engine: Any, *, log_info: Callable[[str], None] = print,
                 log_warn: Callable[[str], None] = print, clock: Callable[[], int] = time.monotonic_ns) -> None:
        self.config, self.engine = config, engine
        self.log_info, self.log_warn, self.clock = log_info, log_warn, clock
        self._noted: set[str] = set()
        self._lock = threading.Lock()
        self._by_triton_id: dict[str, Job] = {}
        self._next_id = 1

    def note(self, name: str, why: str) -> None:
        """One log line per model load and input name for inputs the reference accepts and ignores."""
        with self._lock:
            if name in self._noted:
                return
            self._noted.add(name)
        self.log_info(f"{self.config.model_name}: input {name} is accepted and ignored: {why}")

    def receive(self, inputs: Mapping[str, np.ndarray], requested: Iterable[str] | None,
                send: Callable[[Response], None], *, request_id: str = "",
                client_cancelled: Callable[[], bool] | None = None) -> Job | None:
        """MIS enqueue for one Triton request: a stop command is answered here (an empty final response, or the
        error for a request without an id), a request that cannot be built gets its one final error response;
        anything else becomes a Job to `submit`."""
        arrival = self.clock()
        if first_bool(inputs.get("stop")):
            if not request_id:
                send(Response(error="Trying to stop a request but request ID is not provided", final=True))
                return None
            with self._lock:
                job = self._by_triton_id.get(request_id)
            if job is not None:  # an unknown id is no error: the request may be done already
                job.stop()
            send(Response(final=True))
            return None
        try:
            request = parse_request(inputs, requested, self.config, request_id=request_id, note=self.note)
        except EnqueueError as err:
            send(Response(error=err.message, final=True))
            return None
        job = Job(request, send, client_cancelled, arrival, self.config.cancellation_check_period_ms, self.clock)
        if request_id:
            with self._lock:
                self._by_triton_id[request_id] = job  # MIS: the latest request under an id replaces the former
        return job

    def submit(self, job: Job) -> None:
        """Every row of the job to the engine, without waiting: the engine's thread makes the responses and hands
        each to the job's `send` (the Triton model's response thread sends it on)."""
        job.on_done = lambda: self._forget(job)
        for row in job.request.rows:
            self._submit_row(job, row)

    def run(self, job: Job, timeout: float | None = None) -> None:
        """`submit`, then wait until the job's last response is out."""
        self.submit(job)
        if not job.done.wait(timeout):
            raise TimeoutError("the request did not finish in time")

    def _forget(self, job: Job) -> None:
        rid = job.request.request_id
        if rid:
            with self._lock:
                if self._by_triton_id.get(rid) is job:
                    del self._by_triton_id[rid]

    def _executor_id(self) -> int:
        with self._lock:
            rid, self._next_id = self._next_id, self._next_id + 1
        return rid

    def _submit_row(self, job: Job, row: RowRequest) -> None:
        executor_id = self._executor_id()
        try:
            admitted, warnings = admit(row, self.config)
        except AdmissionError as err:
            self._fail(job, executor_id, err.message, ends=row.num_sequences)
            return
        for warning in warnings:
            self.log_warn(WARNING + warning)
        for index in range(admitted.num_sequences):
            tracker = _Tracker(self, job, admitted, index)
            try:
                self.engine.submit(engine_request(admitted, index, self.config, tracker.on_update,
                                                  lambda tracker=tracker: tracker.failed or job.should_stop()))
            except ValueError as err:  # the engine's refusal goes back as that sequence's error
                self._fail(job, executor_id, str(err), ends=1)

    def _fail(self, job: Job, executor_id: int, message: str, *, ends: int) -> None:
        """An executor error response for one row (EX fetchNewRequests wraps the text, MIS fillTritonResponse
        adds the request id)."""
        job.send(Response(error=f"Executor failed process requestId {executor_id} due to the following error: "
                                f"Encountered an error when fetching new request: {message}"), ends=ends)


def engine_request(row: RowRequest, index: int, config: BackendConfig, on_update: Callable[[Any], None],
                   cancelled: Callable[[], bool]) -> Any:
    """The serving engine's request for one returned sequence of a row, decoded as TensorRT-LLM's executor
    decodes it; child sequences draw with seed + index (LR createChildRequest; an unseeded parent counts as seed
    0)."""
    import torch

    from specbuild.runtime.serving import EngineRequest
    from specbuild.runtime.trtllm_decoding import TrtllmDecoding

    s = row.sampling
    end_id = None if row.end_id is None or row.end_id < 0 else row.end_id  # -1: no end id
    decoding = TrtllmDecoding(
        top_k=s.top_k or 0, top_p=s.top_p or 0.0, temperature=1.0 if s.temperature is None else s.temperature,
        request_seed=(s.seed or 0) + index, repetition_penalty=s.repetition_penalty,
        presence_penalty=s.presence_penalty, frequency_penalty=s.frequency_penalty, min_tokens=s.min_tokens or 0,
        end_id=end_id, bad_words=row.bad_words or (),
        embedding_bias=None if row.embedding_bias is None else torch.from_numpy(row.embedding_bias),
        normalize_log_probs=config.normalize_log_probs, medusa=config.medusa)
    return EngineRequest(
        prompt=list(row.input_ids), max_new_tokens=row.max_new_tokens, end_id=end_id,
        stop_words=row.stop_words or (), include_stop_words=True, decoding=decoding,
        draft_tokens=row.draft_ids or None,
        draft_logits=None if row.draft_logits is None else torch.from_numpy(np.ascontiguousarray(row.draft_logits)),
        return_logits=row.return_generation_logits, return_log_probs=row.return_log_probs,
        return_context_logits=row.return_context_logits, cancelled=cancelled, on_update=on_update,
        # decoding_mode lookahead: the request's own (w, n, g), else the instance's (the engine's Lookahead steps;
        # greedy requests only, others decode plainly, the same tokens)
        lookahead=row.lookahead if config.lookahead else None)


class _Tracker:
    """Turns one sequence's engine updates into responses (LR createResult: what each response holds)."""

    def __init__(self, backend: Backend, job: Job, row: RowRequest, index: int) -> None:
        self.backend, self.job, self.row, self.index = backend, job, row, index
        self.scheduled = backend.clock()
        self.first_token = self.last_token = 0
        self.tokens: list[int] = []
        self.log_probs: list[float] = []
        self.cum = 0.0
        self.rows: list[np.ndarray] = []
        self.context: np.ndarray | None = None
        self.failed = False
        self.counts = (0, 0, 0)  # accepted, drafted, reused

    def on_update(self, update: Any) -> None:
        """One engine step of this sequence (called on the engine's thread)."""
        if self.failed:
            return
        if update.error is not None:
            self.failed = True
            self.job.send(Response(error=f"tensorrt_llm reference backend failure: {update.error}"), ends=1)
            return
        now = self.backend.clock()
        if update.tokens:
            self.first_token = self.first_token or now
            self.last_token = now
        start = len(self.tokens)
        self.tokens += [int(t) for t in update.tokens]
        self.log_probs += [float(v) for v in update.log_probs]
        self.cum = float(update.cum_log_prob)
        if update.logits is not None:
            self.rows += [np.asarray(r, dtype=np.float32) for r in update.logits]
        if update.context_logits is not None:
            self.context = np.asarray(update.context_logits, dtype=np.float32)
        self.counts = (update.accepted_draft_tokens, update.draft_tokens, update.reused_tokens)
        if update.finished and update.reason == "cancelled":
            # One line per cancelled sequence: that a cancellation reached the engine, and how far it had got.
            request = self.job.request.request_id
            self.backend.log_info(f"{self.backend.config.model_name}: request {request!r} stopped by "
                                  f"{self.job.stopped_by or 'a cancellation'} after {len(self.tokens)} generated "
                                  f"tokens")
        if self.row.streaming:
            self._send(start, final=update.finished)
        elif update.finished:
            self._send(0, final=True)

    def _send(self, start: int, *, final: bool) -> None:
        row, request, config = self.row, self.job.request, self.backend.config
        new = self.tokens[start:]
        logits = None
        if row.streaming:  # only the tokens since the previous response, whatever the exclude flag
            tokens = new
            if row.return_generation_logits:  # the current step's rows only (LR createResult)
                logits = _rows(self.rows[start : start + len(new)], config.vocab_size)
            preceding = preceding_tokens(self.tokens, start)
        else:
            tokens = new if row.exclude_input else [*row.input_ids, *new]
            if row.return_generation_logits:
                logits = self._full_generation_logits()
            preceding = []
        accepted, drafted, reused = self.counts
        perf = None
        if request.return_perf_metrics and row.return_perf_metrics:  # MIS flag + result.requestPerfMetrics
            perf = perf_metrics(arrival=self.job.arrival_ns, first_scheduled=self.scheduled,
                                first_token=self.first_token, last_token=self.last_token,
                                prompt=len(row.input_ids), generated=len(self.tokens), reused_tokens=reused,
                                accepted=accepted, drafted=drafted, tokens_per_block=config.tokens_per_block)
        view = SequenceView(tokens, self.log_probs, self.cum, logits, self.context, perf, preceding, final)
        try:
            outputs = response_outputs(view, row, request, config, sequence_index=self.index)
        except PopulateError as err:  # the sequence ends with the error (MIS: isFinal on error)
            self.failed = True
            self.job.send(Response(error=f"Error encountered while populating response: {err.message}"), ends=1)
            return
        self.job.send(Response(outputs), ends=1 if final else 0)

    def _full_generation_logits(self) -> np.ndarray:
        """Non-streaming: LR allocates [beams, max_new_tokens, V] (with external drafts [1, drafts + 1, V]) and
        fills the rows of the steps that ran; the rest stay unwritten (zeros here)."""
        steps = len(self.row.draft_ids) + 1 if self.row.draft_ids else self.row.max_new_tokens
        out = _rows(self.rows[:steps], self.backend.config.vocab_size)
        if out.shape[0] < steps:
            out = np.concatenate([out, np.zeros((steps - out.shape[0], out.shape[1]), dtype=np.float32)])
        return out


def _rows(rows: list[np.ndarray], vocab: int) -> np.ndarray:
    return np.stack(rows) if rows else np.zeros((0, vocab), dtype=np.float32)

