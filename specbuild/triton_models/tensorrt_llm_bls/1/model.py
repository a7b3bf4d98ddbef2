"""tensorrt_llm_bls: draft-target speculative decoding as Business Logic Scripting.

Each round the draft proposes up to K tokens (request_output_len K), the target verifies them as
draft_input_ids (request_output_len K + 1) and returns the accepted ones plus its own next token; both LLM
models keep the sequence's KV cache between rounds. Beyond the TensorRT-LLM backend's BLS: when deployed
decoupled it streams every round's accepted tokens as one response (incrementally detokenised), and batch > 1
requests are served row by row.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from specbuild.deploy import triton_io as io
from specbuild.deploy.check import CALLED_MODEL_PARAMETERS
from specbuild.deploy.detokenize import preceding_tokens

Send = Callable[[Any, bool], None]


class RequestError(ValueError):
    """Goes back to the client as a Triton error."""


@dataclass
class Row:
    """One batch row's prompt, limits and progress."""

    prompt: list[int]
    max_tokens: int
    end_id: int
    pad_id: int
    stop_words: tuple[tuple[int, ...], ...]
    bad_words: np.ndarray
    generated: list[int] = field(default_factory=list)
    accepted: int = 0
    drafted: int = 0


def _stop_word_cut(generated: list[int], words: tuple[tuple[int, ...], ...], since: int) -> int | None:
    """Where the first stop word that ends at or after `since` begins, if any."""
    for end in range(since + 1, len(generated) + 1):
        for word in words:
            if word and end >= len(word) and tuple(generated[end - len(word) : end]) == word:
                return end - len(word)
    return None


def _check_called_models(args: dict[str, str], params: dict[str, str]) -> None:
    """Fail loading (so tritonserver and `specbuild serve` name this model) when a model parameter names no
    model of the repository: otherwise the mistake would only surface as an error on every request."""
    repository = io.model_dir(args).parent
    for key in CALLED_MODEL_PARAMETERS:
        name = params.get(key)
        if name and not (repository / name / "config.pbtxt").is_file():
            raise io.pb_utils.TritonModelException(
                f"parameter {key} = {name!r} names no model in {repository}")


def _sender(sender: Any) -> Send:
    def send(response: Any, final: bool) -> None:
        try:
            sender.send(response, flags=io.FINAL if final else 0)
        except io.pb_utils.TritonModelException as err:  # the client went away: nobody to tell
            io.pb_utils.Logger.log_warn(f"tensorrt_llm_bls: response not sent: {err}")

    return send


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        params = io.model_parameters(args)
        io.set_threads(params, torch_too=False)
        self.decoupled = io.is_decoupled(args)
        self.target = params["tensorrt_llm_model_name"]
        self.draft = params.get("tensorrt_llm_draft_model_name") or None
        self.preprocessing = params["preprocessing_model_name"]
        self.postprocessing = params["postprocessing_model_name"]
        self.default_k = int(params.get("num_draft_tokens") or 0)
        self.max_draft_len = int(params.get("max_draft_len") or 0)
        self.use_draft_logits = io.flag(params, "use_draft_logits")
        _check_called_models(args, params)

    def execute(self, requests: list[Any]) -> list[Any] | None:
        if self.decoupled:
            for request in requests:
                self._serve(request, _sender(request.get_response_sender()))
            return None
        responses = []
        for request in requests:
            sent: list[Any] = []
            self._serve(request, lambda response, final, sent=sent: sent.append(response))
            responses.append(sent[-1])
        return responses

    # -- a request -------------------------------------------------------------------------------------------
    def _serve(self, request: Any, send: Send) -> None:
        try:
            stream = bool(io.row_scalar(io.get(request, "stream"), 0, False))
            if stream and not self.decoupled:
                raise RequestError("streaming needs tensorrt_llm_bls deployed decoupled (deploy.decoupled: true)")
            k = int(io.row_scalar(io.get(request, "num_draft_tokens"), 0, self.default_k))
            if not 0 <= k <= self.max_draft_len:
                raise RequestError(f"num_draft_tokens must be between 0 and the target engine's max_draft_len "
                                   f"{self.max_draft_len} (got {k})")
            if k and self.draft is None:
                raise RequestError("cannot perform speculative decoding without a draft model")
            rows = self._preprocess(request)
            prefix = self._prompt_prefix(request)
            for b, row in enumerate(rows):
                on_round = None
                if stream:
                    def on_round(start: int, done: bool, b: int = b, row: Row = row) -> None:
                        text = self._detokenize([row.generated[start:]], [preceding_tokens(row.generated, start)],
                                                done)[0]
                        text = (prefix[b] if start == 0 else "") + text
                        send(self._response([text], [row], [b]), done and b == len(rows) - 1)
                if not self._generate(request, row, k, on_round):
                    raise RequestError("the request was cancelled")
            if not stream:
                texts = self._detokenize([row.generated for row in rows], [[] for _ in rows], True)
                send(self._response([p + t for p, t in zip(prefix, texts, strict=True)], rows, range(len(rows))),
                     True)
        except RequestError as err:
            send(io.error(str(err)), True)

    def _prompt_prefix(self, request: Any) -> list[str]:
        """The prompt text for rows that asked for it (exclude_input_in_output false), else empty strings."""
        queries = io.get(request, "text_input")
        exclude = io.get(request, "exclude_input_in_output")
        return [io.text(queries[b].reshape(-1)[0]) if not io.row_scalar(exclude, b, True) else ""
                for b in range(queries.shape[0])]

    def _generate(self, request: Any, row: Row, k: int, on_round: Callable[[int, bool], None] | None) -> bool:
        """Speculation rounds until the row is done (True), or until its client cancels (False: nothing final
        was sent; the request is only touched before its final response, after which Triton frees it)."""
        sampling = self._sampling_inputs(request)
        use_logits = bool(io.row_scalar(io.get(request, "use_draft_logits"), 0, self.use_draft_logits))
        while True:
            sequence = row.prompt + row.generated
            remaining = row.max_tokens - len(row.generated)
            drafts: list[int] = []
            logits = None
            speculating = k > 0 and remaining > 1
            if speculating:
                drafts, logits = self._propose(row, sequence, min(k, remaining - 1), use_logits, sampling)
            out_len = len(drafts) + 1 if speculating else remaining
            new, accepted = self._verify(row, sequence, drafts, logits, out_len, sampling)
            row.accepted += accepted
            row.drafted += len(drafts)
            start = len(row.generated)
            expected = accepted + 1 if speculating else out_len
            done = len(new) < expected
            row.generated += new
            cut = _stop_word_cut(row.generated, row.stop_words, start)
            if cut is not None:
                del row.generated[cut:]
                done = True
            if len(row.generated) >= row.max_tokens:
                del row.generated[row.max_tokens :]
                done = True
            if not done and request.is_cancelled():  # a client that went away stops costing rounds
                return False
            if on_round is not None:
                on_round(min(start, len(row.generated)), done)
            if done:
                return True

    # -- calls to the other models ---------------------------------------------------------------------------
    def _call(self, model: str, inputs: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
        request = io.pb_utils.InferenceRequest(
            model_name=model, requested_output_names=outputs,
            inputs=[io.output(name, value) for name, value in inputs.items()],
        )
        response = request.exec()
        if response.has_error():
            raise RequestError(f"{model}: {response.error().message()}")
        return {name: io.pb_utils.get_output_tensor_by_name(response, name).as_numpy() for name in outputs}

    def _preprocess(self, request: Any) -> list[Row]:
        inputs = {"QUERY": io.get(request, "text_input"), "REQUEST_OUTPUT_LEN": io.get(request, "max_tokens")}
        for mine, theirs in (("bad_words", "BAD_WORDS_DICT"), ("stop_words", "STOP_WORDS_DICT"),
                             ("end_id", "END_ID"), ("pad_id", "PAD_ID")):
            value = io.get(request, mine)
            if value is not None:
                inputs[theirs] = value
        names = ["INPUT_ID", "REQUEST_INPUT_LEN", "REQUEST_OUTPUT_LEN", "BAD_WORDS_IDS", "STOP_WORDS_IDS",
                 "OUT_END_ID", "OUT_PAD_ID"]
        out = self._call(self.preprocessing, inputs, names)
        rows = []
        for b in range(out["INPUT_ID"].shape[0]):
            length = int(out["REQUEST_INPUT_LEN"][b].reshape(-1)[0])
            rows.append(Row(
                prompt=out["INPUT_ID"][b, :length].tolist(),
                max_tokens=int(out["REQUEST_OUTPUT_LEN"][b].reshape(-1)[0]),
                end_id=int(out["OUT_END_ID"][b].reshape(-1)[0]),
                pad_id=int(out["OUT_PAD_ID"][b].reshape(-1)[0]),
                stop_words=io.word_lists(out["STOP_WORDS_IDS"], b),
                bad_words=out["BAD_WORDS_IDS"][b : b + 1],
            ))
        return rows

    def _sampling_inputs(self, request: Any) -> dict[str, np.ndarray]:
        inputs = {}
        for mine, theirs, dtype in (("temperature", "temperature", np.float32), ("top_k", "runtime_top_k", np.int32),
                                    ("top_p", "runtime_top_p", np.float32), ("seed", "seed", np.uint64)):
            value = io.get(request, mine)
            if value is not None:
                inputs[theirs] = np.asarray(value, dtype=dtype).reshape(-1)[:1].reshape(1, 1)
        return inputs

    def _common(self, row: Row, sequence: list[int], out_len: int) -> dict[str, np.ndarray]:
        """The inputs every LLM call of a round needs (each tensor costs a trip through shared memory, so
        empty word lists stay out)."""
        inputs = {
            "input_ids": np.array([sequence], dtype=np.int32),
            "input_lengths": np.array([[len(sequence)]], dtype=np.int32),
            "request_output_len": np.array([[out_len]], dtype=np.int32),
            "end_id": np.array([[row.end_id]], dtype=np.int32),
            "pad_id": np.array([[row.pad_id]], dtype=np.int32),
            "exclude_input_in_output": np.array([[True]]),
        }
        if (row.bad_words[:, 1] >= 0).any():
            inputs["bad_words_list"] = row.bad_words
        return inputs

    def _propose(self, row: Row, sequence: list[int], k: int, use_logits: bool,
                 sampling: dict[str, np.ndarray]) -> tuple[list[int], np.ndarray | None]:
        assert self.draft is not None
        inputs = {**self._common(row, sequence, k), **sampling,
                  "return_generation_logits": np.array([[use_logits]])}
        out = self._call(self.draft, inputs, ["output_ids", "sequence_length", "generation_logits"])
        n = int(out["sequence_length"].reshape(-1)[0])
        drafts = out["output_ids"].reshape(-1)[:n].tolist()
        logits = out["generation_logits"][0, 0, :n] if use_logits and n else None
        return drafts, logits

    def _verify(self, row: Row, sequence: list[int], drafts: list[int], logits: np.ndarray | None, out_len: int,
                sampling: dict[str, np.ndarray]) -> tuple[list[int], int]:
        inputs = {**self._common(row, sequence, out_len), **sampling, "return_perf_metrics": np.array([[True]])}
        if drafts:
            inputs["draft_input_ids"] = np.array([drafts], dtype=np.int32)
            if logits is not None:
                inputs["draft_logits"] = np.ascontiguousarray(logits[None], dtype=np.float32)
        out = self._call(self.target, inputs, ["output_ids", "sequence_length", "total_accepted_draft_tokens"])
        n = int(out["sequence_length"].reshape(-1)[0])
        return out["output_ids"].reshape(-1)[:n].tolist(), int(out["total_accepted_draft_tokens"].reshape(-1)[0])

    def _detokenize(self, chunks: list[list[int]], preceding: list[list[int]], final: bool) -> list[str]:
        out = self._call(self.postprocessing, {
            "TOKENS_BATCH": io.padded(chunks, 0)[:, None, :],
            "SEQUENCE_LENGTH": np.array([[len(c)] for c in chunks], dtype=np.int32),
            "PRECEDING_IDS": io.padded(preceding, -1),
            "IS_FINAL": np.full((len(chunks), 1), final),
        }, ["OUTPUT"])
        return [io.text(v) for v in out["OUTPUT"].reshape(-1)]

    def _response(self, texts: list[str], rows: Any, indices: Any) -> Any:
        rows = list(rows)
        drafted = np.array([[r.drafted] for r in rows], dtype=np.int32)
        accepted = np.array([[r.accepted] for r in rows], dtype=np.int32)
        rate = np.where(drafted > 0, accepted / np.maximum(drafted, 1), 0.0).astype(np.float32)
        return io.pb_utils.InferenceResponse(output_tensors=[
            io.output("text_output", np.array([[t.encode("utf-8")] for t in texts], dtype=object)),
            io.output("batch_index", np.array([[i] for i in indices], dtype=np.int32)),
            io.output("acceptance_rate", rate),
            io.output("total_accepted_draft_tokens", accepted),
            io.output("total_draft_tokens", drafted),
        ])
