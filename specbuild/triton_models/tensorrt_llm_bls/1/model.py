"""tensorrt_llm_bls: NVIDIA's BLS model (NVIDIA/TensorRT-LLM `triton_backend/all_models/inflight_batcher_llm/
tensorrt_llm_bls/1/model.py` @0ef1f21e, `lib/decode.py` @4db68284, `lib/triton_decoder.py` @07f3e442) in every
repository: the same inputs, the same calls to the LLM model, the same outputs and refusals, so that it works
unchanged when `tensorrt_llm` is the C++ `tensorrtllm` backend.

- Without speculation: preprocessing -> tensorrt_llm -> postprocessing for every LLM response, as NVIDIA's; a
  decoupled LLM gets one `exec(decoupled=True)` call with the whole batch (a stream when the client asked for
  one), a non-decoupled one an `exec()` per row (the C++ backend takes batch > 1 only when decoupled).
- With num_draft_tokens (the repository's default K where it has a draft): draft-target speculation, the loop
  in specbuild.python_models.bls_loop, row by row; unlike NVIDIA's it also streams (each round's decided tokens),
  makes a row's first token with the target alone (NVIDIA's drafts first) and serves batch > 1. Its text is
  detokenised here with postprocessing's own tokenizer and settings (read from its config.pbtxt), which is what
  postprocessing would answer, without a Triton call per round.

Cancellation: a client's cancellation (asked of Triton every cancellation_check_period_ms of the target's config,
`bls_calls.CancelWatch`) ends the request between responses and rounds, and stops the LLM calls it has in flight.
Triton 2.51's python backend (r24.10) cannot cancel a BLS call: `ResponseIterator.cancel()` came with
triton-inference-server/python_backend 7f21b670 (PR #398, r25.05; README.md "Cancelling decoupled BLS requests"
@f9088ff6). So every LLM call carries a request id and is stopped with the backend's stop command under it, as
NVIDIA's BLS stops a call whose rows all hit a stop word; where the iterator has `cancel()`, that instead.

This file only converts tensors and calls the other models; what it sends and reads is
specbuild.python_models.bls_calls.
"""

from __future__ import annotations

import threading
import traceback
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from specbuild.contracts.triton_backend import CALLED_MODEL_PARAMETERS
from specbuild.python_models import triton_io as io
from specbuild.python_models.bls_calls import (
    ACCEPTANCE_OUTPUTS,
    PREPROCESSING_OUTPUTS,
    RESPONSE_OUTPUTS,
    Arrays,
    BlsRequest,
    Cancellation,
    Cancelled,
    CancelWatch,
    Preprocessed,
    RequestError,
    RowCalls,
    acceptance,
    as_rows,
    chain_inputs,
    created_outputs,
    first,
    loop_outputs,
    stack_rows,
    stop_command,
)
from specbuild.python_models.bls_loop import (
    PLAIN_ROUND_PARAMETER,
    Chunk,
    DraftUnavailable,
    Proposal,
    Row,
    Verdict,
    plain_round_most,
    speculate,
)
from specbuild.python_models.detokenize import StreamedText, decode_chunk, preceding_tokens
from specbuild.python_models.preprocess import nvidia_flag
from specbuild.runtime.schedule import bls_schedule, scheduled_draft_len, served_draft_len

_NVIDIA_TRUE = ("true", "yes", "1", "t")


def _param(params: dict[str, str], key: str, default: Any) -> Any:
    """NVIDIA's BLS reads an empty or `${`-prefixed value as unset (1/model.py `get_valid_param_value`)."""
    value = params.get(key, "")
    return default if not value or value.startswith("${") else value


@dataclass(frozen=True)
class _Model:
    """What the BLS needs to know about a model it calls, from the repository's config.pbtxt."""

    name: str
    decoupled: bool
    outputs: frozenset[str]
    exclude_input: bool  # its exclude_input_in_output parameter (triton_decoder.py `_load_each_model_config`)
    parameters: dict[str, str]

    @classmethod
    def read(cls, repository: Path, name: str) -> _Model:
        from specbuild.deploy.pbtxt import parameters, read_config

        config = read_config(repository / name / "config.pbtxt")
        params = parameters(config)
        return cls(name, bool(config.model_transaction_policy.decoupled), frozenset(o.name for o in config.output),
                   params.get("exclude_input_in_output", "").lower() in _NVIDIA_TRUE, params)


def _engine(repository: Path, model: _Model) -> Any:
    """The EngineInfo of the model's engine (its engine.json), or None when it cannot be read."""
    from specbuild.contracts.engine_info import read_engine_info
    from specbuild.errors import SpecbuildError

    path = model.parameters.get("gpt_model_path", "")
    if not path or path.startswith("${"):
        return None
    try:
        return read_engine_info(io.resolve({"model_repository": str(repository / model.name)}, path))
    except (SpecbuildError, OSError, ValueError):
        return None


def _check_called_models(args: dict[str, str], params: dict[str, str]) -> None:
    """Fail loading (so tritonserver and `specbuild serve` name this model) when a model parameter names no
    model of the repository: otherwise the mistake would only surface as an error on every request."""
    repository = io.model_dir(args).parent
    for key in CALLED_MODEL_PARAMETERS:
        name = params.get(key)
        if name and not name.startswith("${") and not (repository / name / "config.pbtxt").is_file():
            raise io.pb_utils.TritonModelException(f"parameter {key} = {name!r} names no model in {repository}")


# -- replies -------------------------------------------------------------------------------------------------


def _response(part: Arrays) -> Any:
    return io.pb_utils.InferenceResponse(output_tensors=[io.output(name, value) for name, value in part.items()])


class _Reply:
    """What both replies share: the response sender, and whether the client cancelled, asked of the sender only
    while the request is unanswered. The python backend asks Triton through the sender's response factory, which
    the final response frees, or through the request, which a decoupled model's `execute` has released by then
    (python_backend src/python_be.cc `ProcessIsRequestCancelled` @a2564ea, r24.10); so the final response and the
    question never overlap."""

    def __init__(self, sender: Any) -> None:
        self.sender = sender
        self.closed = False
        self._lock = threading.Lock()
        self._ask = io.cancelled_check(sender)

    def client_cancelled(self) -> bool:
        with self._lock:
            return not self.closed and self._ask is not None and bool(self._ask())

    @property
    def can_ask(self) -> bool:
        return self._ask is not None


class _Decoupled(_Reply):
    """Responses of a decoupled BLS: streamed parts go out at once (the stream ends with an empty final flag
    when the last part could not say it was the last); a non-streaming request's parts are held one behind so
    that the last carries the final flag (HTTP /generate then sees one response)."""

    def __init__(self, sender: Any, *, hold: bool) -> None:
        super().__init__(sender)
        self.hold = hold
        self.held: Arrays | None = None

    def _send(self, response: Any = None, final: bool = False) -> None:
        flags = io.FINAL if final else 0
        with self._lock:
            try:
                if response is None:
                    self.sender.send(flags=flags)
                else:
                    self.sender.send(response, flags=flags)
            except io.pb_utils.TritonModelException as err:  # the client went away: nobody to tell
                io.pb_utils.Logger.log_warn(f"tensorrt_llm_bls: response not sent: {err}")
            self.closed = self.closed or final

    def send(self, part: Arrays, final: bool = False) -> None:
        if self.held is not None:
            self._send(_response(self.held))
            self.held = None
        if self.hold and not final:
            self.held = part
        else:
            self._send(_response(part), final)

    def finish(self) -> None:
        if self.closed:
            return
        if self.held is not None:
            self._send(_response(self.held), True)
            self.held = None
        else:
            self._send(None, True)

    def error(self, message: str) -> None:
        if self.closed:
            return
        if self.held is not None:
            self._send(_response(self.held))
            self.held = None
        self._send(io.error(message), True)


class _Collected(_Reply):
    """The one response of a non-decoupled BLS: every row's part joined (text_output as one 1-D array), sent
    with the final flag when the request is done (a non-decoupled python model may answer through its response
    sender, so requests are served on threads side by side)."""

    def __init__(self, sender: Any) -> None:
        super().__init__(sender)
        self.parts: list[Arrays] = []
        self.message: str | None = None

    def send(self, part: Arrays, final: bool = False) -> None:
        self.parts.append(part)

    def finish(self) -> None:
        with self._lock:
            if not self.closed:
                self.closed = True
                self.sender.send(self.response(), flags=io.FINAL)

    def error(self, message: str) -> None:
        self.message = message
        self.finish()

    def response(self) -> Any:
        if self.message is not None or not self.parts:
            return io.error(self.message or "tensorrt_llm_bls: the LLM model sent no response")
        joined: Arrays = {"text_output": np.concatenate([p["text_output"] for p in self.parts])}
        for name in self.parts[0]:
            if name != "text_output" and all(name in p for p in self.parts):
                joined[name] = stack_rows([p[name] for p in self.parts])
        return _response(joined)


def _texts(values: list[str]) -> np.ndarray:
    return np.array([v.encode("utf-8") for v in values], dtype=object)


# -- the model -----------------------------------------------------------------------------------------------


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        params = io.model_parameters(args)
        io.set_threads(params, torch_too=False)
        _check_called_models(args, params)
        self.decoupled = io.is_decoupled(args)
        self.accumulate = _param(params, "accumulate_tokens", "").lower() in _NVIDIA_TRUE
        repository = io.model_dir(args).parent
        self.preprocessing = _param(params, "preprocessing_model_name", "preprocessing")
        self.postprocessing = _param(params, "postprocessing_model_name", "postprocessing")
        self.target = _Model.read(repository, _param(params, "tensorrt_llm_model_name", "tensorrt_llm"))
        engine = _engine(repository, self.target)
        self.target_limits = None if engine is None else (engine.max_seq_len, engine.max_draft_len)
        draft = _param(params, "tensorrt_llm_draft_model_name", None)
        self.draft = _Model.read(repository, draft) if draft else None
        period_ms = int(_param(self.target.parameters, "cancellation_check_period_ms", "100"))
        self.cancel_watch = CancelWatch(max(period_ms, 1) / 1000, warn=io.pb_utils.Logger.log_warn)
        draft_engine = _engine(repository, self.draft) if self.draft else None
        # A draft engine built without gather_generation_logits refuses return_generation_logits (executor:
        # "To return generation logits, gather_generation_logits must be enabled"): propose without logits then.
        self.draft_logits_possible = draft_engine is None or bool(draft_engine.gather_generation_logits)
        self.max_draft_len = int(_param(params, "max_draft_len", "0"))
        self.default_k = 0
        if self.draft:
            self.default_k = served_draft_len(int(_param(params, "num_draft_tokens", "0")), self.max_draft_len,
                                              io.log_info)
        self.use_draft_logits = _param(params, "use_draft_logits", "").lower() in io.TRUE
        self._lock = threading.Lock()
        self.in_flight = 0
        self.schedule = bls_schedule(params, self.default_k, io.log_info) if self.draft is not None else None
        try:  # a bad value fails loading (tritonserver and `specbuild serve` name it), not every request
            self.plain_round_max = plain_round_most(_param(params, PLAIN_ROUND_PARAMETER, None))
        except ValueError as err:
            raise io.pb_utils.TritonModelException(str(err)) from None
        self.tokenizer = None
        if self.draft is not None:  # the speculation loop detokenises here, as postprocessing would
            from specbuild.tokenizer import load_tokenizer

            post = _Model.read(repository, self.postprocessing)
            self.tokenizer = load_tokenizer(io.resolve({"model_repository": str(repository / self.postprocessing)},
                                                       post.parameters.get("tokenizer_dir", "tokenizer")),
                                            trust_remote_code=io.flag(post.parameters, "trust_remote_code"))
            self.skip_special_tokens = nvidia_flag(post.parameters.get("skip_special_tokens"))

    def execute(self, requests: list[Any]) -> None:
        """Each request on a thread of its own, so that one instance serves many at once: their calls to the LLM
        models arrive together and join the models' running batches, and the load-aware draft length sees every
        request in flight."""
        for request in requests:
            sender = request.get_response_sender()
            reply = _Decoupled(sender, hold=not self._streams(request)) if self.decoupled else _Collected(sender)
            threading.Thread(target=self._serve_counted, args=(request, reply), name="tensorrt_llm_bls",
                             daemon=True).start()

    def finalize(self) -> None:
        self.cancel_watch.close()

    def _serve_counted(self, request: Any, reply: Any) -> None:
        with self._lock:
            self.in_flight += 1
        try:
            with self.cancel_watch.watching(reply.client_cancelled if reply.can_ask else None) as cancellation:
                self._serve(request, reply, cancellation)
        finally:
            with self._lock:
                self.in_flight -= 1

    def draft_len(self, k: int) -> int:
        """This round's K: the request's, cut by the load-aware schedule for the requests now in flight. (A row's
        first round is the target alone at every load, bls_loop.speculate: K is not asked for it.)"""
        return scheduled_draft_len(k, self.schedule, self.in_flight)

    @staticmethod
    def _streams(request: Any) -> bool:
        stream = io.get(request, "stream")
        return bool(first(stream, 0, False))

    # -- a request -------------------------------------------------------------------------------------------
    def _serve(self, triton_request: Any, reply: Any, cancellation: Cancellation) -> None:
        try:
            request = BlsRequest(io.inputs(triton_request))
            k = request.validate(draft_model=self.draft and self.draft.name, default_k=self.default_k,
                                 max_draft_len=self.max_draft_len, decoupled=self.decoupled)
            pre = Preprocessed.from_outputs(self._call(self.preprocessing, request.preprocessing_inputs(),
                                                       list(PREPROCESSING_OUTPUTS)))
            if k > 0:
                self._speculate(cancellation, request, pre, k, reply)
            else:
                self._chain(cancellation, request, pre, reply)
            reply.finish()
        except RequestError as err:
            reply.error(str(err))
        except Exception:  # a bug here: the client gets the traceback, as from NVIDIA's BLS
            message = traceback.format_exc()
            io.pb_utils.Logger.log_error(f"tensorrt_llm_bls: {message}")
            reply.error(message)

    # -- calls to the other models ---------------------------------------------------------------------------
    def _request(self, model: str, inputs: Arrays, outputs: list[str], request_id: str = "") -> Any:
        return io.pb_utils.InferenceRequest(model_name=model, requested_output_names=outputs, request_id=request_id,
                                            inputs=[io.output(name, value) for name, value in inputs.items()])

    @staticmethod
    def _outputs(response: Any, model: str) -> Arrays:
        if response.has_error():
            raise RequestError(f"{model}: {response.error().message()}")
        return {tensor.name(): tensor.as_numpy() for tensor in response.output_tensors()}

    def _call(self, model: str, inputs: Arrays, outputs: list[str]) -> Arrays:
        """One exec(decoupled=False): the outputs the model returned, by name."""
        return self._outputs(self._request(model, inputs, outputs).exec(), model)

    def _stream(self, model: _Model, inputs: Arrays, outputs: list[str],
                cancellation: Cancellation) -> Iterator[Arrays]:
        """exec(decoupled=True) on an LLM model: every response that has outputs (the last may be an empty final
        flag), until the request is cancelled, which stops the call."""
        if cancellation.is_set:
            raise Cancelled
        request_id = uuid.uuid4().hex
        started: dict[str, Any] = {}  # the response iterator, once exec() has returned it
        # Stoppable before exec() returns: Triton 2.51's returns only with the first response (its ResponseIterator
        # is built from it, python_backend src/pb_response_iterator.cc @c5f304d), for a call that does not stream
        # the only one.
        with cancellation.call(lambda: self._stop_call(model, request_id, started.get("responses"))):
            started["responses"] = responses = self._request(model.name, inputs, outputs,
                                                             request_id).exec(decoupled=True)
            for response in responses:
                if cancellation.is_set:
                    raise Cancelled
                answer = self._outputs(response, model.name)
                if answer:
                    yield answer

    def _exec(self, model: _Model, inputs: Arrays, outputs: list[str], cancellation: Cancellation) -> Arrays:
        """exec() on a non-decoupled LLM model: its one answer; a cancellation meanwhile stops the call."""
        if cancellation.is_set:
            raise Cancelled
        request_id = uuid.uuid4().hex
        with cancellation.call(lambda: self._stop_call(model, request_id, None)):
            answer = self._outputs(self._request(model.name, inputs, outputs, request_id).exec(), model.name)
        if cancellation.is_set:  # the answer of a stopped call: cut short
            raise Cancelled
        return answer

    def _stop_call(self, model: _Model, request_id: str, responses: Any) -> None:
        """Stop an LLM call of a cancelled request: the response iterator's `cancel()` where this Triton has it,
        else the backend's stop command under the call's request id (see the module docstring)."""
        cancel = getattr(responses, "cancel", None)
        if callable(cancel):
            cancel()
            return
        stop = self._request(model.name, stop_command(), [], request_id)
        answers = list(stop.exec(decoupled=True)) if model.decoupled else [stop.exec()]
        for answer in answers:
            if answer.has_error():
                io.pb_utils.Logger.log_warn(f"tensorrt_llm_bls: stopping a cancelled request's call to "
                                            f"{model.name} failed: {answer.error().message()}")

    def _llm(self, model: _Model, inputs: Arrays, outputs: list[str], cancellation: Cancellation) -> Arrays:
        """One non-streaming LLM answer, however the LLM model is deployed."""
        if not model.decoupled:
            return self._exec(model, inputs, outputs, cancellation)
        answers = list(self._stream(model, inputs, outputs, cancellation))
        if not answers:
            raise RequestError(f"{model.name}: no response")
        return answers[-1]

    # -- without speculation: NVIDIA's flow ------------------------------------------------------------------
    def _chain(self, cancellation: Cancellation, request: BlsRequest, pre: Preprocessed, reply: Any) -> None:
        stream = request.flag("stream")
        llm = self.target
        if llm.decoupled:
            inputs = chain_inputs(request, pre)
            answers: Iterator[tuple[int | None, Arrays]] = (
                (None, answer) for answer in
                self._stream(llm, inputs, self._wanted(inputs, stream), cancellation))
        else:
            answers = self._rows(cancellation, request, pre)
        streamed: dict[tuple[int, int], list[int]] = {}
        finals: set[tuple[int, int]] = set()
        for row, answer in answers:
            batch_row = row if row is not None else int(first(answer.get("batch_index"), 0, 0))
            part = {name: answer[name] for name in RESPONSE_OUTPUTS if name in answer}
            if row is not None and request.batch > 1:
                part["batch_index"] = np.array([[row]], dtype=np.int32)
            if self.draft is not None and "total_draft_tokens" not in part:
                part.update(acceptance(0, 0))  # a draft-target BLS always reports acceptance
            if stream and llm.decoupled:
                final = bool(first(answer.get("is_final"), 0, False))
                texts = self._postprocess_chunk(answer, batch_row, streamed, final)
                if final:
                    finals.update(key for key in streamed if key[0] == batch_row)
            else:
                texts = self._postprocess(answer["output_ids"], answer["sequence_length"])
            reply.send({"text_output": texts, **part})
        if stream and llm.decoupled and not self.accumulate:
            self._flush(request, streamed, finals, reply)

    def _rows(self, cancellation: Cancellation, request: BlsRequest,
              pre: Preprocessed) -> Iterator[tuple[int, Arrays]]:
        """A non-decoupled LLM: one exec() per row, not streaming (the backend cannot stream then)."""
        for b in range(pre.batch):
            inputs = chain_inputs(request, pre, row=b, streaming=False)
            yield b, self._exec(self.target, inputs, self._wanted(inputs, False), cancellation)

    def _wanted(self, inputs: Arrays, stream: bool) -> list[str]:
        """The outputs the LLM creates for these inputs; in reference repositories also is_final for streams."""
        wanted = created_outputs(inputs, self.target.outputs)
        if stream and "is_final" in self.target.outputs:
            wanted.append("is_final")
        return wanted

    def _postprocess(self, tokens: np.ndarray, lengths: np.ndarray, preceding: np.ndarray | None = None,
                     final: bool | None = None) -> np.ndarray:
        inputs = {"TOKENS_BATCH": tokens, "SEQUENCE_LENGTH": lengths}
        if preceding is not None:
            inputs["PRECEDING_IDS"] = preceding
            inputs["IS_FINAL"] = np.full((tokens.shape[0], 1), bool(final))
        return self._call(self.postprocessing, inputs, ["OUTPUT"])["OUTPUT"].reshape(-1)

    def _postprocess_chunk(self, answer: Arrays, row: int, streamed: dict[tuple[int, int], list[int]],
                           final: bool) -> np.ndarray:
        """A streamed LLM response (one row's new tokens) through postprocessing: after the tokens streamed
        before it (PRECEDING_IDS), or, with accumulate_tokens, all tokens so far re-decoded (beam width 1 only,
        decode.py `Decoder.postprocess`)."""
        ids, lengths = answer["output_ids"], answer["sequence_length"]
        if ids.shape[0] != 1:
            raise RequestError(f"{self.target.name}: a streamed response holds {ids.shape[0]} rows, expected 1")
        lengths = lengths.reshape(1, -1)
        if self.accumulate:
            if ids.shape[1] != 1:
                raise RequestError("Accumulation of tokens is only implemented for beam width = 1")
            tokens = streamed.setdefault((row, 0), [])
            tokens += ids[0, 0, : int(lengths[0, 0])].tolist()
            return self._postprocess(np.array([[tokens]], dtype=np.int32), np.array([[len(tokens)]], np.int32))
        preceding = []
        for beam in range(ids.shape[1]):
            tokens = streamed.setdefault((row, beam), [])
            start = len(tokens)
            tokens += ids[0, beam, : int(lengths[0, beam])].tolist()
            preceding.append(preceding_tokens(tokens, start))
        # PRECEDING_IDS has one row per request row: the beams of a row share beam 0's (streamed beams are rare)
        return self._postprocess(ids, lengths, io.padded(preceding[:1], -1), final)

    def _flush(self, request: BlsRequest, streamed: dict[tuple[int, int], list[int]],
               finals: set[tuple[int, int]], reply: Any) -> None:
        """A backend that does not say which response is a row's last (the C++ one): once the stream is over,
        the text held back at a chunk's end (an unfinished character) goes out as a last chunk."""
        for (row, beam), tokens in sorted(streamed.items()):
            if (row, beam) in finals or beam:
                continue
            text = self._postprocess(np.zeros((1, 1, 1), dtype=np.int32), np.zeros((1, 1), dtype=np.int32),
                                     io.padded([preceding_tokens(tokens, len(tokens))], -1), True)
            if any(len(t) for t in text):
                part = {"text_output": text}
                if request.batch > 1:
                    part["batch_index"] = np.array([[row]], dtype=np.int32)
                reply.send(part)

    # -- draft-target speculation ----------------------------------------------------------------------------
    def _speculate(self, cancellation: Cancellation, request: BlsRequest, pre: Preprocessed, k: int,
                   reply: Any) -> None:
        assert self.draft is not None and self.tokenizer is not None
        stream = request.flag("stream")
        use_logits = request.flag("use_draft_logits", 0, self.use_draft_logits)
        if use_logits and not self.draft_logits_possible:
            io.pb_utils.Logger.log_info("tensorrt_llm_bls: use_draft_logits: the draft engine was built without "
                                        "gather_generation_logits; verifying the draft tokens without logits")
            use_logits = False
        max_tokens = as_rows(request.tensors["max_tokens"])
        last = pre.batch - 1
        for b in range(pre.batch):
            calls = RowCalls.build(request, pre, b, use_draft_logits=use_logits, declared=self.target.outputs,
                                   draft_declared=self.draft.outputs)
            prompt = pre.prompt(b).tolist()
            row = Row(prompt, self._budget(len(prompt), int(first(max_tokens, b))), pre.end_id(b), pre.stop_words(b))
            include_prompt = not request.flag("exclude_input_in_output", b, self.target.exclude_input)

            def propose(sequence: np.ndarray, n: int, calls: RowCalls = calls) -> Proposal:
                assert self.draft is not None
                try:
                    answer = self._llm(self.draft, calls.draft_call(sequence, n), calls.draft_outputs,
                                       cancellation)
                except Cancelled:
                    raise
                except RequestError as err:
                    if not calls.use_draft_logits:
                        io.pb_utils.Logger.log_warn(f"tensorrt_llm_bls: the draft refused, the target goes on "
                                                    f"alone: {err}")
                        raise DraftUnavailable(str(err)) from None
                    io.pb_utils.Logger.log_warn(f"tensorrt_llm_bls: the draft refused, proposing without draft "
                                                f"logits: {err}")
                    calls.drop_draft_logits()
                    return propose(sequence, n, calls)
                return calls.proposal(answer, n)

            def verify(sequence: np.ndarray, drafts: list[int], logits: Any, out_len: int,
                       calls: RowCalls = calls) -> Verdict:
                answer = self._llm(self.target, calls.target_call(sequence, drafts, logits, out_len),
                                   calls.target_outputs, cancellation)
                return calls.verdict(answer)

            on_chunk = None
            if stream:
                text = StreamedText(self.tokenizer, self.skip_special_tokens, self.accumulate)

                def on_chunk(chunk: Chunk, b: int = b, row: Row = row, calls: RowCalls = calls,
                             text: StreamedText = text) -> None:
                    kept = chunk.start + len(chunk.tokens)
                    part = self._loop_part(request, b, row, calls, text.add(chunk.tokens, chunk.final), kept=kept,
                                           counted=len(chunk.tokens), include_prompt=False)
                    reply.send(part, chunk.final and b == last)

            if not speculate(row, lambda k=k: self.draft_len(k), propose, verify,
                             on_chunk=on_chunk,
                             cancelled=lambda: cancellation.is_set, plain_round_max=self.plain_round_max):
                raise Cancelled
            if not stream:
                tokens = [*row.prompt, *row.generated] if include_prompt else row.generated
                text_value = decode_chunk(self.tokenizer, tokens, [], True, self.skip_special_tokens)
                reply.send(self._loop_part(request, b, row, calls, text_value, kept=len(row.generated),
                                           counted=len(row.generated), include_prompt=include_prompt), b == last)

    def _budget(self, prompt_len: int, max_tokens: int) -> int:
        """max_tokens shortened as the C++ backend shortens a plain request's (prompt + output + the engine's
        draft tokens per step must fit max_seq_len; llmRequest.cpp `validate`), so the speculating BLS ends where
        the target alone would; a prompt too long for the engine is left for the target to refuse."""
        if self.target_limits is None:
            return max_tokens
        max_seq_len, max_draft_len = self.target_limits
        room = max_seq_len - prompt_len - max_draft_len
        if 1 <= room < max_tokens:
            io.pb_utils.Logger.log_warn(f"tensorrt_llm_bls: prompt length {prompt_len} + max_tokens {max_tokens} + "
                                        f"draft tokens per step {max_draft_len} exceeds max_seq_len {max_seq_len}; "
                                        f"max_tokens is changed to {room}")
            return room
        return max_tokens

    def _loop_part(self, request: BlsRequest, b: int, row: Row, calls: RowCalls, text: str, *, kept: int,
                   counted: int, include_prompt: bool) -> Arrays:
        part: Arrays = {"text_output": _texts([text])}
        part.update(loop_outputs(calls, kept=kept, counted=counted, prompt_len=len(row.prompt),
                                 include_prompt=include_prompt, request=request, row=b))
        part.update(acceptance(row.accepted, row.drafted))
        if request.batch > 1:
            part["batch_index"] = np.array([[b]], dtype=np.int32)
        assert all(name in part for name in ACCEPTANCE_OUTPUTS)
        return part
