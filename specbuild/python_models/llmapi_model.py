"""Triton's llmapi model (TensorRT-LLM's PyTorch backend behind Triton) answered by the reference runtime, without
Triton: plain dicts of numpy arrays in, `Answer`s out.

`triton_models/llmapi/1/model.py` is a thin adapter over this module, as `triton_models/tensorrt_llm/1/model.py` is
over `llm_backend`: what a client can observe - which inputs are read and their defaults, which requests are
refused and with which text, what `text_output` holds (the prompt first unless excluded; when streaming the whole
completion so far in every response), which other outputs a response carries and as what - follows NVIDIA's
model.py and helpers.py and the LLM API under them (the contract: `specbuild.contracts.llm_api`, LLMAPI_CODE_SOURCE,
SAMPLING_PARAMS_SOURCE, RESULT_SOURCE). The decoding is the reference runtime's: `none` through the serving engine
(in-flight batching) for every speculative_config the reference serves: DraftTarget, Eagle (EAGLE-3, chain or
`eagle_choices` tree), NGram and SA (suffix automaton) are the engine's proposers (`specbuild.runtime.proposers`),
so concurrent requests of any method share the target's (and the draft's) forwards instead of queueing; NVIDIA's
llmapi model.yaml says its implementation "does not support batching".

Where the reference departs from NVIDIA's model, on purpose: a request aborted by a stop request still gets a final
(empty) flag so its stream closes (NVIDIA's sends it nothing when not streaming); `sampling_param_stop` strings are
decoded from the BYTES tensor as UTF-8 (NVIDIA's passes the numpy array to SamplingParams as it is); limits
(prompt + max_tokens over max_seq_len) are refused with the serving engine's words.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from specbuild.contracts.llm_api import (
    ERROR_TEXT_OUTPUT,
    LLMAPI_ERRORS,
    OUTPUT_CONFIG_INPUTS,
    SAMPLING_PARAM_INPUTS,
    SAMPLING_PARAMS_DEFAULTS,
    STOP_INPUT,
    STOP_REQUEST_INPUT,
    STREAMING_INPUT,
    TEXT_INPUT,
)
from specbuild.python_models.llm_backend import TOKENS_PER_BLOCK, perf_metrics


class LlmApiError(Exception):
    """A request refused with the llmapi model's (or SamplingParams') text; `wrapped` as model.py wraps it."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True)
class Answer:
    """One response (or, `outputs` and `error` None, only the final flag). `cancelled`: the error is Triton's
    CANCELLED one."""

    outputs: dict[str, np.ndarray] | None
    error: str | None = None
    final: bool = True
    cancelled: bool = False


# -- the request, as helpers.py reads it ---------------------------------------------------------------------------


def scalar(inputs: Mapping[str, np.ndarray], name: str) -> Any:
    """helpers.py get_input_scalar_by_name: None when absent, the one element, else "Expected a scalar tensor"."""
    if name not in inputs:
        return None
    array = np.asarray(inputs[name])
    if array.size != 1:
        raise LlmApiError(LLMAPI_ERRORS["not_scalar"].format(name=name))
    return array.item(0)


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


@dataclass(frozen=True)
class ParsedRequest:
    """What _convert_request makes of a request: the prompt (text_input[0]), the SamplingParams keywords, the
    streaming flag and the output config."""

    prompt: str
    sampling: dict[str, Any]
    streaming: bool
    output_config: dict[str, bool]

    def param(self, key: str) -> Any:
        """A SamplingParams field as the LLM API sees it: the request's, else SamplingParams' default."""
        value = self.sampling.get(key)
        return SAMPLING_PARAMS_DEFAULTS.get(key) if value is None else value


def parse_request(inputs: Mapping[str, np.ndarray]) -> ParsedRequest:
    """model.py _convert_request and helpers.py, in their order; LlmApiError with their texts."""
    if TEXT_INPUT not in inputs:
        raise LlmApiError(LLMAPI_ERRORS["no_text_input"])
    text_input = np.asarray(inputs[TEXT_INPUT])
    if text_input.ndim > 1:
        raise LlmApiError(LLMAPI_ERRORS["not_1d"])
    prompt = _text(text_input.reshape(-1)[0])
    sampling: dict[str, Any] = {}
    for entry in SAMPLING_PARAM_INPUTS:
        value = scalar(inputs, entry.name)
        if value is None and entry.default is not None:
            sampling[entry.key] = entry.default
        elif value is not None:
            sampling[entry.key] = value
    stop = inputs.get(STOP_INPUT)
    sampling["stop"] = None if stop is None else [_text(v) for v in np.asarray(stop).reshape(-1)]
    output_config = {key: bool(scalar(inputs, key) or False) for key in OUTPUT_CONFIG_INPUTS}
    streaming = bool(scalar(inputs, STREAMING_INPUT) or False)
    return ParsedRequest(prompt, sampling, streaming, output_config)


def is_greedy(request: ParsedRequest) -> bool:
    """SamplingParams.params_imply_greedy_decoding (no beam search here)."""
    t, p, k = (request.sampling.get(key) for key in ("temperature", "top_p", "top_k"))
    return (t is None and p is None and k is None) or k == 1 or p == 0.0 or t == 0


def check_sampling(request: ParsedRequest) -> None:
    """SamplingParams._validate's refusals (best_of = best_of or n, n = 1)."""
    top_p, top_k, temperature = (request.sampling.get(key) for key in ("top_p", "top_k", "temperature"))
    if top_p is not None and (top_p < 0 or top_p > 1):
        raise LlmApiError(LLMAPI_ERRORS["top_p"].format(value=top_p))
    if top_k is not None and top_k < 0:
        raise LlmApiError(LLMAPI_ERRORS["top_k"].format(value=top_k))
    if temperature is not None and temperature < 0:
        raise LlmApiError(LLMAPI_ERRORS["temperature"].format(value=temperature))
    best_of = request.sampling.get("best_of") or 1
    if best_of > 1 and is_greedy(request):
        raise LlmApiError(LLMAPI_ERRORS["greedy_best_of"].format(value=best_of))


def decoding(request: ParsedRequest, end_id: int | None) -> Any:
    """The request's token decoding for the runtime: the argmax when SamplingParams implies greedy, else the
    executor's sampling with the LLM API's unset values (temperature 1, top_p 1, top_k 0) and penalties."""
    from specbuild.runtime.trtllm_decoding import TrtllmDecoding

    if is_greedy(request):
        return TrtllmDecoding(top_k=1, end_id=end_id)
    s = request.sampling
    return TrtllmDecoding(top_k=int(s.get("top_k") or 0), top_p=float(1.0 if s.get("top_p") is None else s["top_p"]),
                          temperature=float(1.0 if s.get("temperature") is None else s["temperature"]),
                          request_seed=int(s.get("seed") or 0), presence_penalty=s.get("presence_penalty"),
                          frequency_penalty=s.get("frequency_penalty"), end_id=end_id)


# -- running it ------------------------------------------------------------------------------------------------------


@dataclass
class Progress:
    """What a runner reports after each step of one sequence: every token so far (stop words included), and, once
    `finished`, why (`length`, `end_id`, `stop_word`, `cancelled`, or `error` with `error`)."""

    tokens: list[int]
    finished: bool = False
    reason: str | None = None
    accepted: int = 0
    drafted: int = 0
    reused_tokens: int = 0
    error: str | None = None


@dataclass
class Job:
    """One sequence for a runner."""

    prompt: list[int]
    max_tokens: int
    decoding: Any
    greedy: bool
    end_id: int | None
    stop_words: tuple[tuple[int, ...], ...]
    on_progress: Callable[[Progress], None]
    cancelled: Callable[[], bool]


class Runner(Protocol):
    """Runs jobs (from any thread; progress comes back from the runner's threads)."""

    def check(self, job: Job) -> None: ...

    def start(self, job: Job) -> None: ...

    def stop(self) -> None: ...


@dataclass
class _Request:
    """One llmapi request in flight: its answer is built here from each Progress."""

    parsed: ParsedRequest
    prompt_ids: list[int]
    stop_strings: list[str]
    stop_words: tuple[tuple[int, ...], ...]
    send: Callable[[Answer], None]
    arrival_ns: int
    aborted: bool = False  # by a stop request, or after a response could not be made: the engine stops it
    scheduled_ns: int = 0
    first_token_ns: int = 0
    last_token_ns: int = 0
    sent_final: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


class LlmApiModel:
    """The llmapi model's request handling over a `Runner`; `tokenizer` is the model's (HF) tokenizer."""

    def __init__(self, tokenizer: Any, runner: Runner, *, decoupled: bool,
                 clock: Callable[[], int] = time.monotonic_ns) -> None:
        self.tokenizer, self.runner, self.decoupled, self.clock = tokenizer, runner, decoupled, clock
        self._by_id: dict[str, list[_Request]] = {}
        self._lock = threading.Lock()

    def receive(self, inputs: Mapping[str, np.ndarray], send: Callable[[Answer], None], *, request_id: str = "",
                client_cancelled: Callable[[], bool] | None = None) -> None:
        """model.py _execute_single_request: a stop request, or a generation request (refused as one final error
        response with text_output "N/A"); responses go to `send`, possibly from another thread."""
        try:
            stop = scalar(inputs, STOP_REQUEST_INPUT)
        except LlmApiError as err:
            send(_error(err.message))
            return
        if stop:
            self._stop(request_id, send)
            return
        arrival = self.clock()
        try:
            parsed = parse_request(inputs)
            if parsed.streaming and not self.decoupled:
                raise LlmApiError(LLMAPI_ERRORS["streaming_not_decoupled"])
            check_sampling(parsed)
            request = self._prepare(parsed, send, arrival)
            job = self._job(request, client_cancelled)
            self.runner.check(job)
        except LlmApiError as err:
            send(_error(err.message))
            return
        except ValueError as err:  # the runtime's limits (prompt + max_tokens over max_seq_len, ...)
            send(_error(str(err)))
            return
        if request_id:
            with self._lock:
                self._by_id.setdefault(request_id, []).append(request)
        request.scheduled_ns = self.clock()
        self.runner.start(job)

    def _prepare(self, parsed: ParsedRequest, send: Callable[[Answer], None], arrival: int) -> _Request:
        ids = list(self.tokenizer.encode(parsed.prompt, add_special_tokens=parsed.param("add_special_tokens")))
        stop_strings = list(parsed.sampling.get("stop") or [])
        words = tuple(tuple(self.tokenizer.encode(s, add_special_tokens=False)) for s in stop_strings)
        return _Request(parsed, ids, stop_strings, words, send, arrival)

    def _job(self, request: _Request, client_cancelled: Callable[[], bool] | None) -> Job:
        end_id = self.tokenizer.eos_token_id
        parsed = request.parsed

        def cancelled() -> bool:
            return request.aborted or bool(client_cancelled and client_cancelled())

        return Job(request.prompt_ids, int(parsed.param("max_tokens")), decoding(parsed, end_id), is_greedy(parsed),
                   end_id, request.stop_words, lambda progress: self._on_progress(request, progress),
                   cancelled)

    def _stop(self, request_id: str, send: Callable[[Answer], None]) -> None:
        """handle_stop_request: abort every request with this id; the stop request itself gets CANCELLED."""
        if not request_id:
            send(_error(LLMAPI_ERRORS["stop_without_id"], wrapped=False))
            return
        with self._lock:
            for request in self._by_id.pop(request_id, []):
                request.aborted = True
        send(Answer(None, LLMAPI_ERRORS["cancelled"], cancelled=True))

    def _on_progress(self, request: _Request, progress: Progress) -> None:
        with request.lock:
            if request.sent_final:
                return
            try:
                self._respond(request, progress)
            except Exception as err:
                # model.py's except clause around its generation loop: a response that cannot be made (detokenising,
                # building or sending it failed) ends the request with one final error, so the client is not left
                # waiting for a final response, and the engine stops generating for it (cancelled() is now true).
                if request.sent_final:  # the final answer itself failed to go: nothing more can reach the client
                    raise
                request.sent_final = request.aborted = True
                self._forget(request)
                request.send(_error(str(err) or type(err).__name__))

    def _respond(self, request: _Request, progress: Progress) -> None:
        """Answer one Progress (called under the request's lock). The answer is made before the request counts as
        answered for good, so a failure while making the last one still ends it with an error."""
        now = self.clock()
        visible, stop_reason = self._visible(request, progress)
        if visible and not request.first_token_ns:
            request.first_token_ns = now
        if visible:
            request.last_token_ns = now
        answer = self._answer_to(request, progress, visible, stop_reason)
        if progress.finished:
            request.sent_final = True
            self._forget(request)
        if answer is not None:
            request.send(answer)

    def _answer_to(self, request: _Request, progress: Progress, visible: list[int],
                   stop_reason: str | None) -> Answer | None:
        """The response for one Progress; None: nothing to send (a non-streaming request before its last)."""
        if progress.finished and progress.reason == "error":
            return _error(progress.error or "generation failed")
        if progress.finished and progress.reason == "cancelled":
            if request.aborted:  # a stop request: its own answer says CANCELLED; close this one's stream
                return (self._answer(request, visible, progress, "cancelled", None) if request.parsed.streaming
                        else Answer(None))
            return Answer(None, LLMAPI_ERRORS["cancelled"], cancelled=True)  # model.py cancellation_loop
        if not request.parsed.streaming and not progress.finished:
            return None
        reason = None
        if progress.finished:
            reason = "length" if progress.reason == "length" else "stop"
        return self._answer(request, visible, progress, reason, stop_reason)

    def _forget(self, request: _Request) -> None:
        with self._lock:
            for key, requests in list(self._by_id.items()):
                if request in requests:
                    requests.remove(request)
                    if not requests:
                        del self._by_id[key]

    @staticmethod
    def _visible(request: _Request, progress: Progress) -> tuple[list[int], str | None]:
        """The output tokens as the LLM API shows them: a stop word that ended the sequence cut off
        (include_stop_str_in_output false; stop_reason the stop string), and, while running, the tokens that may
        still become one held back."""
        tokens = list(progress.tokens)
        if progress.finished and progress.reason == "stop_word":
            for text, word in zip(request.stop_strings, request.stop_words, strict=True):
                if word and tuple(tokens[-len(word):]) == word:
                    return tokens[: len(tokens) - len(word)], text
            return tokens, None
        if not progress.finished:
            from specbuild.runtime.sequence import StopCriteria

            held = StopCriteria(stop_words=request.stop_words).held_back(tokens)
            return tokens[: len(tokens) - held], None
        return tokens, None

    def _answer(self, request: _Request, tokens: list[int], progress: Progress, finish_reason: str | None,
                stop_reason: str | None) -> Answer:
        """_create_response: text_output, the asked-for reasons, perf metrics when asked; every output an object
        array of str (model.py builds them all with text_output's dtype)."""
        parsed = request.parsed
        skip = parsed.param("skip_special_tokens")
        if parsed.streaming:  # the completion so far (createResult streams only new tokens; `text` accumulates)
            text = self.tokenizer.decode(tokens, skip_special_tokens=skip)
            if not progress.finished:
                text = text.rstrip("\ufffd")
        elif parsed.param("exclude_input_from_output"):
            text = self.tokenizer.decode(tokens, skip_special_tokens=skip)
        else:  # not streaming, input not excluded: the prompt's tokens lead the output's
            text = self.tokenizer.decode(request.prompt_ids + tokens, skip_special_tokens=skip)
        outputs = {"text_output": _strings([text.encode("utf-8")])}
        values = {"finish_reason": finish_reason, "stop_reason": stop_reason, "cumulative_logprob": None}
        for key, name in OUTPUT_CONFIG_INPUTS.items():
            if parsed.output_config[key]:
                outputs[name] = _strings([str(values[name])])
        if parsed.param("return_perf_metrics"):
            outputs.update(self._perf(request, tokens, progress))
        return Answer(outputs, final=progress.finished)

    def _perf(self, request: _Request, tokens: list[int], progress: Progress) -> dict[str, np.ndarray]:
        metrics = perf_metrics(arrival=request.arrival_ns, first_scheduled=request.scheduled_ns,
                               first_token=request.first_token_ns, last_token=request.last_token_ns,
                               prompt=len(request.prompt_ids), generated=len(tokens),
                               reused_tokens=progress.reused_tokens, accepted=progress.accepted,
                               drafted=progress.drafted)
        prompt_blocks = math.ceil(len(request.prompt_ids) / TOKENS_PER_BLOCK)
        reused = metrics["kv_cache_reused_blocks"]
        missed = max(prompt_blocks - reused, 0)
        values = {
            "kv_cache_reused_block": reused,
            "kv_cache_hit_rate": reused / (reused + missed) if reused + missed else 0.0,
            "kv_cache_alloc_new_blocks": metrics["kv_cache_alloc_new_blocks"],
            "kv_cache_alloc_total_blocks": metrics["kv_cache_alloc_total_blocks"],
            "kv_cache_missed_block": missed,
            **{name: metrics[name] for name in ("arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns",
                                                "last_token_time_ns", "acceptance_rate",
                                                "total_accepted_draft_tokens", "total_draft_tokens")},
        }
        return {name: _strings([str(value)]) for name, value in values.items()}


def _strings(values: Sequence[Any]) -> np.ndarray:
    return np.asarray(list(values), dtype=np.object_)


def _error(message: str, *, wrapped: bool = True) -> Answer:
    """model.py's except clause: text_output ["N/A"] and "Error generating request: ..." (a stop request without
    an id is answered with its text alone)."""
    if not wrapped:
        return Answer(None, message)
    return Answer({"text_output": _strings([ERROR_TEXT_OUTPUT.encode()])},
                  LLMAPI_ERRORS["wrapped"].format(error=message))


# -- runners over the reference runtime ------------------------------------------------------------------------------
def _engine_request(job: Job, **fields: Any) -> Any:
    from specbuild.runtime.serving import EngineRequest

    return EngineRequest(prompt=list(job.prompt), max_new_tokens=fields.pop("max_new_tokens", job.max_tokens),
                         decoding=job.decoding, **fields)


class EngineRunner:
    """Every job is one request of the one serving engine, which batches it in flight with the others and, with a
    proposer (DraftTarget's draft model, Eagle's EAGLE-3 draft, NGram, SA), drafts for all of them in the same steps;
    its stop rules are the runtime's (the stop word kept: `_visible` cuts it). `stats` are the engine's counters
    (batched forwards, draft forwards), which the Triton adapter publishes as metrics.

    Progress goes to the jobs from a responder thread of its own, in the order the engine reported it: the
    detokenising and sending of every response (the ensemble's postprocessing, which runs in a process of its own
    there) then overlaps the engine's next forward instead of lengthening every step."""

    def __init__(self, engine: Any) -> None:
        import queue

        self.engine = engine
        self._progress: queue.SimpleQueue[tuple[Job, Progress] | None] = queue.SimpleQueue()
        self._responder = threading.Thread(target=self._respond, name="llmapi-responses", daemon=True)
        self._responder.start()

    def _respond(self) -> None:
        while (item := self._progress.get()) is not None:
            job, progress = item
            try:
                job.on_progress(progress)
            except Exception as err:  # one request's failed response must not stop the others'
                print(f"[trtllm] llmapi response failed: {type(err).__name__}: {err}", flush=True)

    def check(self, job: Job) -> None:
        self.engine.check(_engine_request(job))

    def stop(self) -> None:
        self.engine.stop()
        self._progress.put(None)
        self._responder.join(timeout=10)

    def stats(self) -> dict[str, int]:
        stats = self.engine.stats
        return {f.name: int(getattr(stats, f.name)) for f in dataclasses.fields(stats)
                if isinstance(getattr(stats, f.name), int)}

    def start(self, job: Job) -> None:
        tokens: list[int] = []

        def on_update(update: Any) -> None:
            tokens.extend(update.tokens)
            self._progress.put((job, Progress(list(tokens), update.finished, update.reason,
                                              update.accepted_draft_tokens, update.draft_tokens,
                                              update.reused_tokens, update.error)))

        self.engine.submit(_engine_request(job, end_id=job.end_id, stop_words=job.stop_words, include_stop_words=True,
                                           cancelled=job.cancelled, on_update=on_update))


def proposer(config: Mapping[str, Any], load_draft: Callable[[], Any], load_eagle3: Callable[[], Any],
             max_batch: int = 1) -> Any:
    """The serving engine's proposer for a model.yaml speculative_config (llm_args.py's field names): DraftTarget
    the draft checkpoint, Eagle the EAGLE-3 draft (a chain, or the static tree `eagle_choices`), NGram prompt
    lookup with NGramDecodingConfig's settings, SA the suffix automaton with SADecodingConfig's; other decoding
    types are refused by name."""
    from specbuild.runtime.proposers import (
        Eagle3Proposer,
        ModelProposer,
        NGramConfig,
        NGramProposer,
        SAConfig,
        SAProposer,
    )

    kind = config.get("decoding_type")
    k = int(config.get("max_draft_len") or 0)
    if kind in ("DraftTarget", "Draft_Target"):  # the 1.2 and 1.3 lines' spellings (contracts.llm_api LINES)
        return ModelProposer(load_draft(), k)
    if kind in ("Eagle", "Eagle3"):
        choices = config.get("eagle_choices")
        if isinstance(choices, str):  # TensorRT-LLM's string form "[[0], [0, 0], ...]"
            import json

            choices = json.loads(choices)
        return Eagle3Proposer(load_eagle3(), k, choices or None)
    if kind == "NGram":
        fields = ("max_matching_ngram_size", "is_keep_all", "is_use_oldest", "is_public_pool")
        return NGramProposer(NGramConfig(k, **{f: config[f] for f in fields if config.get(f) is not None}))
    if kind == "SA":
        fields = ("max_matching_ngram_size", "enable_global_pool", "global_pool_size")
        return SAProposer(SAConfig(k, **{f: config[f] for f in fields if config.get(f) is not None}), max_batch)
    raise RuntimeError(f"speculative_config decoding_type {kind!r}: the reference llmapi model serves no "
                       "speculative_config, DraftTarget, Eagle, NGram or SA (set build.backend: tensorrt for "
                       "NVIDIA's)")


def draft_schedule(config: Mapping[str, Any], max_draft_len: int, line: str | None = None,
                   log: Callable[[str], None] | None = None) -> Any:
    """The engine's load rules from a speculative_config: draft_len_schedule looked up as the TensorRT-LLM `line`
    does (`specbuild.runtime.schedule.lookup_for_line`; SCHEDULE_ENV's in the spec's form, `served_lookup`),
    max_concurrency, and the acceptance switch-off (acceptance_window / acceptance_length_threshold; the 1.4 line's
    acceptance_rate_window_size / acceptance_rate_threshold read alike)."""
    from specbuild.runtime.schedule import DraftSchedule, lookup_for_line, served_lookup, served_steps

    try:
        steps = served_steps(config.get("draft_len_schedule"), log)
    except ValueError as err:
        raise RuntimeError(f"model.yaml speculative_config: {err}") from None
    window = config.get("acceptance_window", config.get("acceptance_rate_window_size"))
    threshold = config.get("acceptance_length_threshold", config.get("acceptance_rate_threshold"))
    try:
        return DraftSchedule(steps, max_draft_len, config.get("max_concurrency"), served_lookup(lookup_for_line(line)),
                             None if window is None else int(window),
                             None if threshold is None else float(threshold))
    except ValueError as err:
        raise RuntimeError(f"model.yaml speculative_config: {err}") from None


def load_runner(settings: Mapping[str, Any], reference: Mapping[str, Any], *,
                log_info: Callable[[str], None] = print) -> Runner:
    """The one serving engine model.yaml's settings ask for, over the checkpoints reference.json names: plain
    (no speculative_config), or drafting with the speculative_config's proposer, K per step from its
    draft_len_schedule / max_concurrency."""
    import json
    from pathlib import Path

    from specbuild.dtypes import torch_dtype
    from specbuild.runtime.model import CausalLM
    from specbuild.runtime.serving import ServingEngine

    checkpoints = reference["checkpoints"]

    def load(role: str) -> Any:
        directory = Path(checkpoints[role])
        name = settings.get("dtype") or json.loads((directory / "config.json").read_text())["dtype"]
        return CausalLM.from_checkpoint(directory, dtype=torch_dtype(str(name), where=f"{directory}: dtype"))

    config = settings.get("speculative_config") or {}
    batch, seq = int(settings["max_batch_size"]), int(settings["max_seq_len"])
    target = load("target")
    if not config:
        engine = ServingEngine(target, max_batch=batch, max_seq_len=seq)
    else:
        def eagle3() -> Any:
            from specbuild.runtime.eagle3 import Eagle3Draft

            return Eagle3Draft.from_directory(Path(reference["eagle3_draft"]), target, dtype=target.dtype)

        drafting = proposer(config, lambda: load("draft"), eagle3, batch)
        schedule = draft_schedule(config, drafting.max_draft_len, reference.get("trtllm_line"), log_info)
        engine = ServingEngine(target, max_batch=batch, max_seq_len=seq, proposer=drafting, schedule=schedule)
        log_info(f"[trtllm] reference llmapi model: {config['decoding_type']} drafts in the serving engine "
                 f"(max_draft_len {drafting.max_draft_len}, in-flight batching of up to {batch} requests)")
    engine.start()
    return EngineRunner(engine)
