"""tensorrt_llm / tensorrt_llm_draft for reference builds: the TensorRT-LLM backend's tensors, served by
specbuild's PyTorch runtime (plain decoding, draft_input_ids verification, Medusa when decoding_mode is
medusa), with per-sequence KV caches reused across calls by longest token prefix."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from specbuild.build.engine_info import read_engine_info, reference_checkpoint
from specbuild.deploy import triton_io as io
from specbuild.deploy.detokenize import preceding_tokens
from specbuild.deploy.pbtxt import parse_choices
from specbuild.deploy.reference_llm import LLMRequest, LLMResult, ReferenceLLM, RequestError
from specbuild.runtime.sampling import SamplingParams


class _Request:
    """A request's inputs read once, and the outputs its caller wants."""

    def __init__(self, request: Any) -> None:
        self.tensors = io.inputs(request)
        self.wanted = io.wanted_outputs(request)

    def get(self, name: str) -> np.ndarray | None:
        return self.tensors.get(name)


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        params = io.model_parameters(args)
        io.set_threads(params)
        engine = io.resolve(args, params["gpt_model_path"])
        info = read_engine_info(engine)
        medusa = None
        if params.get("decoding_mode") == "medusa":
            medusa = parse_choices(params["medusa_choices"])
        self.llm = ReferenceLLM(reference_checkpoint(engine), dtype=info.dtype, max_seq_len=info.max_seq_len,
                                cache_slots=int(params.get("kv_cache_slots") or 8),
                                max_draft_len=info.max_draft_len, medusa_choices=medusa)
        self.exclude_input = io.flag(params, "exclude_input_in_output")
        self.pad_id = int(params.get("pad_id") or 0)
        self.decoupled = io.is_decoupled(args)

    def execute(self, requests: list[Any]) -> list[Any] | None:
        if self.decoupled:
            for request in requests:
                self._decoupled(request)
            return None
        responses = []
        for triton_request in requests:
            request = _Request(triton_request)
            try:
                if bool(io.row_scalar(request.get("streaming"), 0, False)):
                    raise RequestError("streaming needs this model deployed decoupled (deploy.decoupled: true)")
                results = [self._run(request, b, None) for b in range(self._batch(request))]
                responses.append(self._response(request, results, range(len(results)), final=True))
            except RequestError as err:
                responses.append(io.error(str(err)))
        return responses

    # -- one request -----------------------------------------------------------------------------------------
    def _decoupled(self, triton_request: Any) -> None:
        sender = triton_request.get_response_sender()
        request = _Request(triton_request)
        try:
            streaming = bool(io.row_scalar(request.get("streaming"), 0, False))
            batch = self._batch(request)
            if not streaming:
                results = [self._run(request, b, None) for b in range(batch)]
                sender.send(self._response(request, results, range(batch), final=True), flags=io.FINAL)
                return
            for b in range(batch):
                generated: list[int] = []
                finished: list[bool] = [False]

                def send(tokens: list[int], done: bool, accepted: int, drafted: int, b: int = b,
                         generated: list[int] = generated, finished: list[bool] = finished) -> None:
                    start = len(generated)
                    generated.extend(tokens)
                    finished[0] = done
                    chunk = LLMResult(tokens, accepted_draft_tokens=accepted, draft_tokens=drafted)
                    response = self._response(request, [chunk], [b], final=done, chunk=True,
                                              preceding=[preceding_tokens(generated, start)])
                    last = done and b == batch - 1
                    sender.send(response, flags=io.FINAL if last else 0)

                result = self._run(request, b, send)
                if not finished[0]:  # one draft_input_ids round ends the call, not the sequence: close the row
                    send([], True, result.accepted_draft_tokens, result.draft_tokens)
        except RequestError as err:
            sender.send(io.error(str(err)), flags=io.FINAL)

    def _batch(self, request: Any) -> int:
        return request.get("input_lengths").shape[0]

    def _run(self, request: Any, b: int, on_tokens: Any) -> LLMResult:
        return self.llm.run(self._llm_request(request, b), on_tokens)

    def _llm_request(self, request: Any, b: int) -> LLMRequest:
        lengths = request.get("input_lengths").reshape(-1)
        ids = request.get("input_ids")
        prompt = ids[b, : int(lengths[b])].astype(np.int64).tolist()
        drafts = request.get("draft_input_ids")
        draft_ids = None
        logits = None
        if drafts is not None and drafts.size:
            draft_ids = [int(t) for t in drafts[b if drafts.shape[0] > b else 0].reshape(-1)]
            draft_logits = request.get("draft_logits")
            if draft_logits is not None and draft_logits.size:
                logits = torch.from_numpy(np.ascontiguousarray(draft_logits[b].reshape(len(draft_ids), -1)))
        temperature = float(io.row_scalar(request.get("temperature"), b, 0.0))
        seed = io.row_scalar(request.get("seed"), b, None)
        beam = int(io.row_scalar(request.get("beam_width"), b, 1))
        if beam != 1:
            raise RequestError(f"beam_width {beam}: the reference backend decodes with beam width 1 only")
        if bool(io.row_scalar(request.get("return_context_logits"), b, False)):
            raise RequestError("return_context_logits is not supported by the reference backend")
        try:
            params = SamplingParams(temperature=temperature,
                                    top_k=int(io.row_scalar(request.get("runtime_top_k"), b, 0)),
                                    top_p=float(io.row_scalar(request.get("runtime_top_p"), b, 1.0)) or 1.0,
                                    seed=None if seed is None else int(seed))
        except ValueError as err:
            raise RequestError(str(err)) from None
        end_id = io.row_scalar(request.get("end_id"), b, None)
        return LLMRequest(
            input_ids=prompt,
            max_new_tokens=int(io.row_scalar(request.get("request_output_len"), b, 0)),
            end_id=None if end_id is None else int(end_id),
            stop_words=io.word_lists(request.get("stop_words_list"), b),
            bad_words=io.word_lists(request.get("bad_words_list"), b),
            draft_ids=draft_ids,
            draft_logits=logits,
            params=params,
            min_tokens=int(io.row_scalar(request.get("min_tokens"), b, 0)),
            return_generation_logits=bool(io.row_scalar(request.get("return_generation_logits"), b, False)),
        )

    # -- responses -------------------------------------------------------------------------------------------
    def _response(self, request: Any, results: list[LLMResult], rows: Any, *, final: bool, chunk: bool = False,
                  preceding: list[list[int]] | None = None) -> Any:
        rows = list(rows)
        exclude = bool(io.row_scalar(request.get("exclude_input_in_output"), 0, self.exclude_input))
        sequences = []
        for b, result in zip(rows, results, strict=True):
            if exclude or chunk:
                sequences.append(result.tokens)
            else:
                lengths = request.get("input_lengths").reshape(-1)
                prompt = request.get("input_ids")[b, : int(lengths[b])].tolist()
                sequences.append(prompt + result.tokens)
        n = len(results)
        output_ids = io.padded(sequences, self.pad_id)[:, None, :]
        vocab = self.llm.vocab_size
        gen_logits = np.zeros((n, 1, 1, 1), dtype=np.float32)
        if any(r.generation_logits is not None for r in results):
            steps = max(len(r.generation_logits) for r in results if r.generation_logits is not None)
            gen_logits = np.zeros((n, 1, steps, vocab), dtype=np.float32)
            for i, r in enumerate(results):
                if r.generation_logits is not None:
                    gen_logits[i, 0, : len(r.generation_logits)] = r.generation_logits.float().numpy()
        drafted = np.array([[r.draft_tokens] for r in results], dtype=np.int32)
        accepted = np.array([[r.accepted_draft_tokens] for r in results], dtype=np.int32)
        rate = np.where(drafted > 0, accepted / np.maximum(drafted, 1), 0.0).astype(np.float32)
        pre = io.padded(preceding or [[] for _ in results], -1)
        outputs = {
            "output_ids": lambda: output_ids,
            "sequence_length": lambda: np.array([[len(s)] for s in sequences], dtype=np.int32),
            "cum_log_probs": lambda: np.zeros((n, 1), dtype=np.float32),
            "output_log_probs": lambda: np.zeros((n, 1, 1), dtype=np.float32),
            "context_logits": lambda: np.zeros((n, 1, 1), dtype=np.float32),
            "generation_logits": lambda: gen_logits,
            "batch_index": lambda: np.array([[b] for b in rows], dtype=np.int32),
            "acceptance_rate": lambda: rate,
            "total_accepted_draft_tokens": lambda: accepted,
            "total_draft_tokens": lambda: drafted,
            "preceding_ids": lambda: pre,
            "is_final": lambda: np.full((n, 1), final, dtype=bool),
        }
        wanted = request.wanted or outputs.keys()
        return io.pb_utils.InferenceResponse(
            output_tensors=[io.output(name, make()) for name, make in outputs.items() if name in wanted])
