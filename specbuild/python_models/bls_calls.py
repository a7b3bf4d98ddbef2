"""What `tensorrt_llm_bls` sends to and reads from the other models, free of Triton (numpy arrays by name).

The BLS must work unchanged when `tensorrt_llm` is NVIDIA's C++ `tensorrtllm` backend, so every LLM call is
built here by the rules of NVIDIA's BLS (NVIDIA/TensorRT-LLM `triton_backend/all_models/inflight_batcher_llm/
tensorrt_llm_bls/1/lib/triton_decoder.py` @07f3e442, `_get_llm_tensors*`; `lib/decode.py` @4db68284,
`Request.validate`, `_spec_generate`; `1/model.py` @0ef1f21e, `execute`), and asks only for the outputs the
backend creates for that call (`specbuild.contracts.triton_backend` presence rules, from
`model_instance_state.cc` `fillTritonResponse`): a requested output the backend does not create is simply
missing, and one it creates unasked (the ten perf metrics) fails the call where the config lacks it.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from specbuild.contracts.triton_backend import TENSORRT_LLM
from specbuild.python_models.bls_loop import Proposal, Verdict

Arrays = dict[str, np.ndarray]


class RequestError(ValueError):
    """A request the BLS cannot serve; its message goes back to the client."""


class Cancelled(RequestError):
    """The client cancelled the request: it ends wherever it is (never taken for a refusal of a called model)."""

    def __init__(self) -> None:
        super().__init__("the request was cancelled")


PREPROCESSING_INPUTS = {
    "text_input": "QUERY", "decoder_text_input": "DECODER_QUERY", "max_tokens": "REQUEST_OUTPUT_LEN",
    "bad_words": "BAD_WORDS_DICT", "stop_words": "STOP_WORDS_DICT", "embedding_bias_words": "EMBEDDING_BIAS_WORDS",
    "embedding_bias_weights": "EMBEDDING_BIAS_WEIGHTS", "pad_id": "PAD_ID", "end_id": "END_ID",
    "prompt_table_extra_id": "PROMPT_TABLE_EXTRA_ID",
}
"""BLS input -> preprocessing input (triton_decoder.py `_get_preproc_tensors`; the image/video ones are refused
before, the repository being text-only)."""

PREPROCESSING_OUTPUTS = {
    "INPUT_ID": "input_ids", "DECODER_INPUT_ID": "decoder_input_ids", "REQUEST_INPUT_LEN": "input_lengths",
    "BAD_WORDS_IDS": "bad_words_list", "STOP_WORDS_IDS": "stop_words_list", "EMBEDDING_BIAS": "embedding_bias",
    "OUT_PAD_ID": "pad_id", "OUT_END_ID": "end_id", "OUT_PROMPT_TABLE_EXTRA_IDS": "prompt_table_extra_ids",
}
"""Preprocessing output -> LLM input (`_get_tensors_from_preproc`: REQUEST_DECODER_INPUT_LEN is read but never
sent on, so decoder_input_lengths stays out)."""

REQUEST_TO_LLM = {
    "beam_width": "beam_width", "top_k": "runtime_top_k", "top_p": "runtime_top_p", "temperature": "temperature",
    "length_penalty": "len_penalty", "repetition_penalty": "repetition_penalty", "min_tokens": "min_tokens",
    "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty", "seed": "seed",
    "return_log_probs": "return_log_probs", "stream": "streaming",
    "prompt_embedding_table": "prompt_embedding_table", "prompt_vocab_size": "prompt_vocab_size",
    "lora_task_id": "lora_task_id", "lora_weights": "lora_weights", "lora_config": "lora_config",
    "exclude_input_in_output": "exclude_input_in_output", "return_perf_metrics": "return_perf_metrics",
    "guided_decoding_guide_type": "guided_decoding_guide_type", "guided_decoding_guide": "guided_decoding_guide",
    "return_num_input_tokens": "return_num_input_tokens", "return_num_output_tokens": "return_num_output_tokens",
}
"""BLS input -> LLM input, sent only when the request has it (`_get_llm_tensors_from_request`)."""

WHOLE_REQUEST_LLM_INPUTS = frozenset({"lora_weights", "lora_config", "prompt_embedding_table"})
"""Request tensors that are not one value per batch row (never sliced per row)."""

MULTIMODAL_INPUTS = ("image_input", "image_bytes_input", "image_url_input", "video_bytes_input")
"""What makes NVIDIA's BLS treat a request as multimodal (`1/model.py` `execute`)."""

_NOT_TO_CLIENT = frozenset({"output_ids", "sequence_length", "context_phase_params", "preceding_ids", "is_final"})
RESPONSE_OUTPUTS = tuple(t.name for t in TENSORRT_LLM.nvidia_outputs() if t.name not in _NOT_TO_CLIENT)
"""LLM outputs the BLS hands on to its client by the same name, when the LLM returned them
(triton_decoder.py `_get_response`)."""

ACCEPTANCE_OUTPUTS = ("acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens")


# -- the request ------------------------------------------------------------------------------------------------


def as_rows(array: np.ndarray) -> np.ndarray:
    """A request tensor as [B, ...]: inputs declared with `reshape: { shape: [ ] }` arrive as [B]; the LLM
    wants [B, 1] (NVIDIA undoes the reshape for its whitelist, `__undo_reshape`)."""
    return array.reshape(-1, 1) if array.ndim == 1 else array


def first(array: np.ndarray | None, row: int = 0, default: Any = None) -> Any:
    """Row `row`'s first value of an optional input (a single row broadcasts)."""
    if array is None or array.size == 0:
        return default
    rows = as_rows(array) if array.ndim else array.reshape(1, 1)
    value = rows[row if rows.shape[0] > row else 0].reshape(-1)
    return default if value.size == 0 else value[0].item()


def _has_data(array: np.ndarray | None) -> bool:
    if array is None or array.size == 0:
        return False
    if array.dtype == object:
        return any(len(v) for v in array.reshape(-1))
    return True


@dataclass
class BlsRequest:
    """A BLS request's tensors by name, read once."""

    tensors: Arrays

    def get(self, name: str) -> np.ndarray | None:
        return self.tensors.get(name)

    @property
    def batch(self) -> int:
        return int(self.tensors["text_input"].shape[0])

    def flag(self, name: str, row: int = 0, default: bool = False) -> bool:
        return bool(first(self.get(name), row, default))

    def validate(self, *, draft_model: str | None, default_k: int, max_draft_len: int, decoupled: bool) -> int:
        """NVIDIA's refusals with NVIDIA's texts (decode.py `Request.validate`; 1/model.py `execute`), except
        streaming and batch > 1 with speculation, which specbuild serves; returns K (0: no speculation)."""
        text = self.get("text_input")
        if text is None or text.size == 0:
            raise RequestError("text_input is required")
        max_tokens = self.get("max_tokens")
        if max_tokens is None or max_tokens.size == 0 or int(np.asarray(max_tokens).reshape(-1).min()) <= 0:
            raise RequestError("max_tokens must be a single value > 0")
        k = int(first(self.get("num_draft_tokens"), 0, default_k))
        if k > 0 and self.flag("return_context_logits"):
            raise RequestError("context logits are not supported with speculative decoding")
        if k > 0 and not draft_model:
            raise RequestError("cannot perform speculative decoding without draft model")
        multimodal = [name for name in MULTIMODAL_INPUTS if self.get(name) is not None]
        if k > 0 and multimodal:
            raise RequestError("Multimodal and speculative decoding is not currently supported")
        sent = [name for name in multimodal if _has_data(self.get(name))]
        if sent:
            raise RequestError(f"{', '.join(sent)}: this repository serves text only (tensorrt_llm_bls has no "
                               "multimodal_encoders_name, preprocessing no multimodal_model_path)")
        if self.flag("stream") and not decoupled:
            raise RequestError("streaming needs tensorrt_llm_bls deployed decoupled (deploy.decoupled: true)")
        if k > 0:
            if k > max_draft_len:
                raise RequestError(f"num_draft_tokens must be between 0 and the target engine's max_draft_len "
                                   f"{max_draft_len} (got {k})")
            if int(first(self.get("beam_width"), 0, 1)) != 1:
                raise RequestError("speculative decoding needs beam_width 1")
        return max(k, 0)

    def preprocessing_inputs(self) -> Arrays:
        return {theirs: self.tensors[mine] for mine, theirs in PREPROCESSING_INPUTS.items() if mine in self.tensors}

    def llm_inputs(self, row: int | None = None, *, leave_out: Collection[str] = ()) -> Arrays:
        """The request tensors NVIDIA's BLS sends on, under the LLM's names; for a one-row call, row `row`."""
        out = {}
        for mine, theirs in REQUEST_TO_LLM.items():
            value = self.tensors.get(mine)
            if value is None or theirs in leave_out:
                continue
            if theirs not in WHOLE_REQUEST_LLM_INPUTS:
                value = as_rows(value)
                if row is not None and value.shape[0] > 1:
                    value = value[row : row + 1]
            out[theirs] = value
        return out


# -- preprocessing's answer ---------------------------------------------------------------------------------


@dataclass
class Preprocessed:
    """Preprocessing's outputs under the LLM's names (INPUT_ID -> input_ids, ...)."""

    tensors: Arrays

    @classmethod
    def from_outputs(cls, outputs: Mapping[str, np.ndarray]) -> Preprocessed:
        return cls({PREPROCESSING_OUTPUTS[name]: value for name, value in outputs.items()
                    if name in PREPROCESSING_OUTPUTS and value is not None})

    @property
    def batch(self) -> int:
        return int(self.tensors["input_ids"].shape[0])

    def length(self, row: int) -> int:
        return int(self.tensors["input_lengths"].reshape(-1)[row])

    def prompt(self, row: int) -> np.ndarray:
        return self.tensors["input_ids"][row, : self.length(row)]

    def end_id(self, row: int) -> int | None:
        return first(self.tensors.get("end_id"), row, None)

    def stop_words(self, row: int) -> tuple[tuple[int, ...], ...]:
        return word_lists(self.tensors.get("stop_words_list"), row)

    def row(self, row: int) -> Arrays:
        """One row's tensors for a one-row call: [row : row + 1], input_ids (and extra ids) cut to its length."""
        length = self.length(row)
        out = {}
        for name, value in self.tensors.items():
            value = value[row : row + 1] if value.shape[0] > 1 else value
            if name in ("input_ids", "prompt_table_extra_ids"):
                value = value[:, :length]
            out[name] = value
        return out


def word_lists(array: np.ndarray | None, row: int) -> tuple[tuple[int, ...], ...]:
    """A [B, 2, L] word list (flat ids; cumulative end offsets padded with -1) -> row `row`'s words."""
    if array is None or array.size == 0:
        return ()
    data = array[row if array.shape[0] > row else 0] if array.ndim == 3 else array
    ids, ends = data[0].tolist(), [int(e) for e in data[1].tolist() if int(e) >= 0]
    words, start = [], 0
    for end in ends:
        if end > start:
            words.append(tuple(int(t) for t in ids[start:end]))
        start = end
    return tuple(words)


# -- LLM calls --------------------------------------------------------------------------------------------------


def _true(array: np.ndarray | None) -> bool:
    return array is not None and array.size > 0 and bool(np.asarray(array).reshape(-1)[0])


def created_outputs(inputs: Mapping[str, np.ndarray], declared: Collection[str] | None = None) -> list[str]:
    """The outputs the C++ backend puts in its responses to a call with `inputs` (the contract's presence
    rules); `declared` (the LLM config's outputs) adds the reference repositories' extras it declares."""
    batch = int(inputs["input_ids"].shape[0]) if "input_ids" in inputs else 1
    sequences = int(first(inputs.get("num_return_sequences"), 0, 1))
    present = {
        "always": lambda flag: True,
        "flag": lambda flag: _true(inputs.get(flag or "")),
        "flag_unchecked": lambda flag: _true(inputs.get(flag or "")),
        "batched": lambda flag: batch > 1,
        "multi_sequence": lambda flag: sequences > 1,
        "never": lambda flag: False,
    }
    names = [t.name for t in TENSORRT_LLM.outputs if t.extra is None and present[t.presence](t.flag)]
    if declared is not None:
        missing = [name for name in names if name not in declared]
        if missing:
            raise RequestError(f"the LLM model does not declare the outputs {missing} that this request makes it "
                               "return (TensorRT-LLM's tensorrt_llm config.pbtxt declares them all)")
    return names


def _bools(value: bool, batch: int) -> np.ndarray:
    return np.full((batch, 1), value, dtype=bool)


def chain_inputs(request: BlsRequest, pre: Preprocessed, *, row: int | None = None, streaming: bool = True) -> Arrays:
    """One call of NVIDIA's non-speculative flow (triton_decoder.py `_get_llm_tensors`): preprocessing's
    tensors, the request's (only those sent), request_output_len <- max_tokens, explicit return_*_logits.
    `row`: a one-row call (a non-decoupled LLM takes one row at a time); streaming=False: the LLM cannot stream
    (non-decoupled), so it answers the whole completion at once, the prompt left out as a stream would."""
    batch = 1 if row is not None else request.batch
    inputs = {**(pre.row(row) if row is not None else pre.tensors), **request.llm_inputs(row)}
    max_tokens = as_rows(request.tensors["max_tokens"])
    inputs["request_output_len"] = (max_tokens[row : row + 1] if row is not None and max_tokens.shape[0] > 1
                                    else max_tokens).astype(np.int32)
    if not streaming and request.flag("stream"):
        inputs.pop("streaming", None)
        inputs["exclude_input_in_output"] = _bools(True, batch)
    inputs["return_context_logits"] = _bools(request.flag("return_context_logits"), batch)
    inputs["return_generation_logits"] = _bools(request.flag("return_generation_logits"), batch)
    return inputs


_EMPTY_IS_NOTHING = frozenset({"bad_words_list", "stop_words_list", "embedding_bias"})


@dataclass
class RowCalls:
    """The draft and target calls of one speculating row: everything but the sequence is built once."""

    draft: Arrays
    target: Arrays
    draft_outputs: list[str]
    target_outputs: list[str]
    use_draft_logits: bool
    perf_metrics: bool
    log_probs: bool
    target_answers: list[Arrays] = field(default_factory=list)  # every verification's outputs, for the response

    @classmethod
    def build(cls, request: BlsRequest, pre: Preprocessed, row: int, *, use_draft_logits: bool,
              declared: Collection[str] | None = None, draft_declared: Collection[str] | None = None) -> RowCalls:
        """What decode.py `_spec_generate` sends, with these differences: exclude_input_in_output true (the loop
        needs the completion only; the C++ backend honours the request input), never `streaming` (each call
        answers once), the draft without output-only flags (its answer is only its tokens), and embedding_bias
        in every round (NVIDIA's PreprocResponse.with_new_inputs drops it after the first)."""
        base = {name: value for name, value in pre.row(row).items() if name not in ("input_ids", "input_lengths")}
        sampling = request.llm_inputs(row, leave_out={"streaming", "exclude_input_in_output", "min_tokens"})
        output_flags = {"return_log_probs", "return_perf_metrics", "return_num_input_tokens",
                        "return_num_output_tokens"}
        draft = {**base, **{k: v for k, v in sampling.items() if k not in output_flags},
                 "exclude_input_in_output": _bools(True, 1), "return_context_logits": _bools(False, 1),
                 "return_generation_logits": _bools(use_draft_logits, 1)}
        target = {**base, **{k: v for k, v in sampling.items()
                             if k not in ("return_num_input_tokens", "return_num_output_tokens")},
                  "exclude_input_in_output": _bools(True, 1), "return_context_logits": _bools(False, 1),
                  "return_generation_logits": _bools(False, 1)}
        # Empty word lists and an empty bias change nothing (the backend ignores zero-length ones, utils.cc), so
        # the rounds do not carry them through shared memory.
        draft = {name: value for name, value in draft.items() if value.size or name not in _EMPTY_IS_NOTHING}
        target = {name: value for name, value in target.items() if value.size or name not in _EMPTY_IS_NOTHING}
        probe = {"input_ids": np.zeros((1, 1), dtype=np.int32)}
        return cls(draft, target, created_outputs({**draft, **probe}, draft_declared),
                   created_outputs({**target, **probe}, declared), use_draft_logits,
                   perf_metrics=_true(target.get("return_perf_metrics")),
                   log_probs=_true(target.get("return_log_probs")))

    def drop_draft_logits(self) -> None:
        """Propose without logits from now on (the drafts are then verified as point masses)."""
        self.use_draft_logits = False
        self.draft = {**self.draft, "return_generation_logits": _bools(False, 1)}
        self.draft_outputs = [name for name in self.draft_outputs if name != "generation_logits"]

    def draft_call(self, sequence: np.ndarray, n: int) -> Arrays:
        """request_output_len n and min_tokens n (decode.py: the client's min_tokens is overwritten for the
        draft, so it proposes all n tokens)."""
        n_array = np.array([[n]], dtype=np.int32)
        return {**self.draft, **_sequence(self.draft, sequence), "request_output_len": n_array, "min_tokens": n_array}

    def target_call(self, sequence: np.ndarray, drafts: Sequence[int], logits: Any, out_len: int) -> Arrays:
        inputs = {**self.target, **_sequence(self.target, sequence),
                  "request_output_len": np.array([[out_len]], dtype=np.int32)}
        if drafts:
            inputs["draft_input_ids"] = np.array([drafts], dtype=np.int32)
            if self.use_draft_logits and logits is not None:
                inputs["draft_logits"] = np.ascontiguousarray(np.asarray(logits)[None])
        return inputs

    def proposal(self, outputs: Mapping[str, np.ndarray], n: int) -> Proposal:
        """The draft's tokens (it excludes the input); its logits only when they were asked for."""
        tokens = beam_tokens(outputs)[:n]
        logits = None
        if self.use_draft_logits:
            generation = outputs.get("generation_logits")
            if generation is not None and generation.ndim == 4 and generation.shape[2] >= len(tokens):
                logits = generation[0, 0, generation.shape[2] - len(tokens) :]
        return Proposal(tokens, logits)

    def verdict(self, outputs: Mapping[str, np.ndarray]) -> Verdict:
        accepted = outputs.get("total_accepted_draft_tokens") if self.perf_metrics else None
        self.target_answers.append({name: value for name, value in outputs.items() if name in RESPONSE_OUTPUTS})
        return Verdict(beam_tokens(outputs), None if accepted is None else int(accepted.reshape(-1)[0]))


def _sequence(static: Arrays, sequence: np.ndarray) -> Arrays:
    """The tensors that follow the sequence: input_ids, input_lengths and, when the client sent a prompt-table
    extra id, prompt_table_extra_ids grown with zeros (generated tokens are vocabulary ids, which preprocessing
    marks 0), since the backend uses them only when they are as long as the input (utils.cc)."""
    out = {"input_ids": sequence[None], "input_lengths": np.array([[len(sequence)]], np.int32)}
    extra = static.get("prompt_table_extra_ids")
    if extra is not None and extra.shape[-1] != len(sequence):
        grown = np.zeros((1, len(sequence)), dtype=extra.dtype)
        grown[:, : min(extra.shape[-1], len(sequence))] = extra[:, : len(sequence)]
        out["prompt_table_extra_ids"] = grown
    return out


def beam_tokens(outputs: Mapping[str, np.ndarray], beam: int = 0) -> list[int]:
    """output_ids [1, beams, T] cut to sequence_length [1, beams] (one row's answer)."""
    ids, lengths = outputs["output_ids"], outputs["sequence_length"]
    n = int(lengths.reshape(lengths.shape[0], -1)[0, beam])
    return ids.reshape(ids.shape[0], -1, ids.shape[-1])[0, beam, :n].tolist()


# -- what the client gets ------------------------------------------------------------------------------------


def acceptance(accepted: int, drafted: int) -> Arrays:
    """The BLS's own acceptance outputs for a draft-target row ([1, 1] each, as the backend's)."""
    return {
        "acceptance_rate": np.array([[accepted / drafted if drafted else 0.0]], dtype=np.float32),
        "total_accepted_draft_tokens": np.array([[accepted]], dtype=np.int32),
        "total_draft_tokens": np.array([[drafted]], dtype=np.int32),
    }


_FROM_FIRST_CALL = ("arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns")


def loop_outputs(calls: RowCalls, *, kept: int, counted: int, prompt_len: int, include_prompt: bool,
                 request: BlsRequest, row: int) -> Arrays:
    """The outputs of a speculating row's response besides text and acceptance: what the client asked for,
    gathered over the rounds. `kept`: generated tokens in the text, `counted`: generated tokens this response
    covers (a streamed chunk: its own)."""
    out: Arrays = {}
    answers = calls.target_answers
    if calls.log_probs and answers:
        probs = [a["output_log_probs"].reshape(-1) for a in answers if "output_log_probs" in a]
        flat = np.concatenate(probs)[:kept] if probs else np.zeros(0, dtype=np.float32)
        out["output_log_probs"] = flat[kept - counted :].astype(np.float32).reshape(1, 1, -1)
        out["cum_log_probs"] = np.array([[flat.sum()]], dtype=np.float32)
    if calls.perf_metrics and answers:
        for name in RESPONSE_OUTPUTS:
            source = answers[0] if name in _FROM_FIRST_CALL else answers[-1]
            if name in source and name not in ACCEPTANCE_OUTPUTS:
                out[name] = source[name]
    if request.flag("return_num_input_tokens", row):
        out["num_input_tokens"] = np.array([[prompt_len]], dtype=np.int32)
    if request.flag("return_num_output_tokens", row):
        out["num_output_tokens"] = np.array([[counted + (prompt_len if include_prompt else 0)]], dtype=np.int32)
    return out


def stack_rows(arrays: Sequence[np.ndarray]) -> np.ndarray:
    """One-row outputs [1, ...] as one [B, ...] output (trailing dims padded with zeros where they differ)."""
    if len(arrays) == 1:
        return arrays[0]
    shape = tuple(max(a.shape[d] for a in arrays) for d in range(1, arrays[0].ndim))
    if all(a.shape[1:] == shape for a in arrays):
        return np.concatenate(arrays, axis=0)
    out = np.zeros((sum(a.shape[0] for a in arrays), *shape), dtype=arrays[0].dtype)
    start = 0
    for a in arrays:
        out[(slice(start, start + a.shape[0]), *(slice(0, d) for d in a.shape[1:]))] = a
        start += a.shape[0]
    return out


# -- cancellation ---------------------------------------------------------------------------------------------


def stop_command() -> Arrays:
    """The LLM request that stops the call sent under the same request id: NVIDIA's stop signal (their BLS sends
    it when every row hit a stop word, triton_decoder.py; their inflight_batcher_llm_client.py
    `prepare_stop_signals`), which the C++ backend's `handleStopRequest` answers by cancelling the executor
    requests registered under that id (reference/triton-backend-1.2-contract.md §2.6, §3.3)."""
    zero = np.zeros((1, 1), dtype=np.int32)
    return {"input_ids": zero, "input_lengths": zero, "request_output_len": zero,
            "stop": np.ones((1, 1), dtype=bool)}


class Cancellation:
    """One BLS request's cancellation. Set once (the client went away), it runs the canceller of every call then
    in flight and, at once, of any call started later, so that no called model works on for nobody."""

    def __init__(self, warn: Callable[[str], None] = print) -> None:
        self._warn = warn
        self._lock = threading.Lock()
        self._set = False
        self._calls: dict[int, Callable[[], None]] = {}
        self._keys = itertools.count()

    @property
    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        with self._lock:
            if self._set:
                return
            self._set = True
            cancellers = list(self._calls.values())
        for cancel in cancellers:
            self._run(cancel)

    @contextlib.contextmanager
    def call(self, cancel: Callable[[], None]) -> Iterator[None]:
        """While the block runs, a cancellation runs `cancel` (at once when the request is cancelled already)."""
        with self._lock:
            key = next(self._keys)
            self._calls[key] = cancel
            already = self._set
        if already:
            self._run(cancel)
        try:
            yield
        finally:
            with self._lock:
                self._calls.pop(key, None)

    def _run(self, cancel: Callable[[], None]) -> None:
        try:
            cancel()
        except Exception as err:  # a canceller that fails must not stop the others (or the watching thread)
            self._warn(f"cancelling a call failed: {err}")


class CancelWatch:
    """One thread that asks, every `period_s`, whether each request being served was cancelled, and sets its
    Cancellation. Asking is an IPC round trip to the server in Triton's python backend, so it is paced here
    rather than done on every response, and it also reaches requests whose call answers only at its end."""

    def __init__(self, period_s: float, warn: Callable[[str], None] = print) -> None:
        self.period_s = period_s
        self._warn = warn
        self._cond = threading.Condition()
        self._watched: dict[int, tuple[Callable[[], bool], Cancellation]] = {}
        self._keys = itertools.count()
        self._thread: threading.Thread | None = None
        self._closed = False

    @contextlib.contextmanager
    def watching(self, client_cancelled: Callable[[], bool] | None) -> Iterator[Cancellation]:
        """The request's Cancellation, watched while the block runs (never set when there is nothing to ask)."""
        cancellation = Cancellation(self._warn)
        if client_cancelled is None:
            yield cancellation
            return
        with self._cond:
            key = next(self._keys)
            self._watched[key] = (client_cancelled, cancellation)
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._run, name="bls-cancel-watch", daemon=True)
                self._thread.start()
            self._cond.notify()
        try:
            yield cancellation
        finally:
            with self._cond:
                del self._watched[key]

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._watched and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                watched = list(self._watched.values())
            for client_cancelled, cancellation in watched:
                if cancellation.is_set:
                    continue
                try:
                    cancelled = client_cancelled()
                except Exception:  # e.g. the request completed meanwhile
                    cancelled = False
                if cancelled:
                    cancellation.set()
            time.sleep(self.period_s)
