"""Clients that behave on the wire like NVIDIA's own client scripts of the TensorRT-LLM Triton backend.

Each function reproduces one upstream script's requests (tensor names, dtypes, shapes, request ids, requested
outputs, RPC kind) and the way it reads the responses, so that a test running it against a served repository sees
what NVIDIA's script would see. The code is specbuild's own; the scripts it reproduces are named, with file and
line numbers, in each docstring. Unless a docstring says otherwise the citation is

    triton-inference-server/tensorrtllm_backend @ c2e65b88d85255be30cf50440a91662abeb497dd

(the copies under `triton_backend/` of NVIDIA/TensorRT-LLM carry the same request and read logic; differences are
named where they matter, e.g. the `--return-num-*` flags of inflight_batcher_llm_client.py @ 000a01de).

Deviations, all on the client side only: every wait is bounded (stream deadlines, queue timeouts) so that a server
that never answers fails a test instead of hanging it, and where an upstream script would only print an error (or
die on `None[0]`), these clients record or raise it with the shape or name that made the read fail.
"""

from __future__ import annotations

import json
import queue
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

UPSTREAM = "triton-inference-server/tensorrtllm_backend@c2e65b88d85255be30cf50440a91662abeb497dd"
WAIT_S = 180.0
"""The longest any client waits for a server (upstream waits forever)."""

PERF_METRIC_OUTPUTS = (
    "kv_cache_alloc_new_blocks", "kv_cache_reused_blocks", "kv_cache_alloc_total_blocks", "arrival_time_ns",
    "first_scheduled_time_ns", "first_token_time_ns", "last_token_time_ns", "acceptance_rate",
    "total_accepted_draft_tokens", "total_draft_tokens",
)
"""The ten outputs end_to_end_grpc_client.py requests with --return-perf-metrics (L289-304), in its order."""


class UpstreamReadError(AssertionError):
    """The response does not have what NVIDIA's script reads from it (a missing tensor, another shape)."""


# -- the reads the scripts do ----------------------------------------------------------------------------------


def _describe(array: Any) -> str:
    if array is None:
        return "absent"
    return f"{array.dtype} array of shape {list(array.shape)}"


def first_text(array: Any, what: str) -> str:
    """`array[0].decode("utf-8")`, the read of text_output / OUTPUT in every upstream script: it needs a 1-D BYTES
    tensor ([beams] for beam 1 is shape [1]); a [1, 1] tensor makes `array[0]` an ndarray that has no decode."""
    if array is None:
        raise UpstreamReadError(f"{what} is absent from the response; NVIDIA's script reads {what}[0].decode()")
    value = array[0]
    if not isinstance(value, bytes):
        raise UpstreamReadError(
            f"{what} is a {_describe(array)}: {what}[0] is a {type(value).__name__}, not bytes, so NVIDIA's "
            f"`{what}[0].decode('utf-8')` fails (the backend sends a 1-D [beams] STRING tensor)")
    return value.decode("utf-8")


def at(array: Any, what: str, *index: int) -> Any:
    """`array[i][j]...` as the scripts index their outputs (e.g. batch_index[0][0]), with the shape in the error."""
    if array is None:
        raise UpstreamReadError(f"{what} is absent from the response; NVIDIA's script reads {what}"
                                + "".join(f"[{i}]" for i in index))
    value = array
    try:
        for i in index:
            value = value[i]
    except (IndexError, TypeError) as err:
        raise UpstreamReadError(f"{what} is a {_describe(array)}; NVIDIA's script reads {what}"
                                + "".join(f"[{i}]" for i in index) + f" ({err})") from None
    return value


def _grpc_input(name: str, value: np.ndarray) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(value.shape), np_to_triton_dtype(value.dtype))
    tensor.set_data_from_numpy(value)
    return tensor


def _http_input(name: str, value: np.ndarray) -> httpclient.InferInput:
    tensor = httpclient.InferInput(name, list(value.shape), np_to_triton_dtype(value.dtype))
    tensor.set_data_from_numpy(value)
    return tensor


def _input(protocol: str, name: str, value: np.ndarray) -> Any:
    """tools/utils/utils.py:33-38 `prepare_tensor(name, input, protocol)`."""
    return _http_input(name, value) if protocol == "http" else _grpc_input(name, value)


def load_upstream_tokenizer(tokenizer_dir: Any, *, trust_remote_code: bool = True) -> Any:
    """The tokenizer as inflight_batcher_llm_client.py loads it (L639-644): AutoTokenizer with legacy=False,
    padding_side='left', trust_remote_code=True; no pad token -> the eos token."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir), legacy=False, padding_side="left",
                                              trust_remote_code=trust_remote_code)
    if not tokenizer.pad_token:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def upstream_special_ids(tokenizer: Any) -> tuple[int, int]:
    """(end_id, pad_id) as inflight_batcher_llm_client.py:646-649 and benchmark_core_model.py:438-441 derive them:
    the first id of the eos / pad token encoded without special tokens."""
    end_id = tokenizer.encode(tokenizer.eos_token, add_special_tokens=False)[0]
    pad_id = tokenizer.encode(tokenizer.pad_token, add_special_tokens=False)[0]
    return int(end_id), int(pad_id)


# -- inflight_batcher_llm/client/end_to_end_grpc_client.py -------------------------------------------------------


@dataclass
class EndToEndResult:
    """What end_to_end_grpc_client.run_inference leaves: the prompts, one text per (prompt, generation), the
    errors the server sent (upstream prints them and goes on, L336-338), and every response."""

    prompts: list[str]
    output_texts: list[str]
    errors: list[str] = field(default_factory=list)
    responses: list[Any] = field(default_factory=list)
    chunks: list[list[str]] = field(default_factory=list)
    perf_metrics: list[dict[str, Any]] = field(default_factory=list)

    def expected_texts(self, expected_outputs: Sequence[str], *, streaming: bool,
                       exclude_input_in_output: bool = False, n: int = 1) -> list[str]:
        """--check-outputs (L729-741): each expected output, with the prompt in front unless streaming or
        --exclude-input-in-output; `n` generations per prompt."""
        assert len(expected_outputs) * n == len(self.output_texts), (expected_outputs, self.output_texts)
        return [expected if streaming or exclude_input_in_output else prompt + expected
                for prompt, expected in zip(self.prompts, expected_outputs, strict=True) for _ in range(n)]


def e2e_prepare_inputs(
    prompt: str, output_len: int, *, streaming: bool, beam_width: int = 1, temperature: float = 1.0,
    stop_words: Sequence[str] = (), bad_words: Sequence[str] = (),
    embedding_bias_words: Sequence[str] | None = None, embedding_bias_weights: Sequence[float] | None = None,
    repetition_penalty: float | None = None, presence_penalty: float | None = None,
    frequency_penalty: float | None = None, return_log_probs: bool = False, return_context_logits: bool = False,
    return_generation_logits: bool = False, return_perf_metrics: bool = False, end_id: int | None = None,
    pad_id: int | None = None, num_draft_tokens: int = 0, use_draft_logits: bool | None = None,
    num_return_sequences: int | None = None, exclude_input_in_output: bool | None = False,
) -> dict[str, np.ndarray]:
    """The tensors of one prompt, in upstream order: `prepare_inputs` of end_to_end_grpc_client.py (L64-201).

    Always: text_input BYTES [[prompt]], max_tokens INT32 [[output_len]], stream BOOL [[streaming]], beam_width
    INT32 [[beam_width]], temperature FP32 [[temperature]] (L91-104). Then, only when given: num_return_sequences,
    num_draft_tokens (> 0), use_draft_logits, bad_words / stop_words BYTES [1, N] (non-empty lists), penalties, the
    return_* flags BOOL [[True]], embedding_bias_words BYTES [1, N] with embedding_bias_weights FP32 [1, N] (both or
    neither; speculative_decoding_test passes two empty lists, which gives two [1, 0] tensors), end_id, pad_id and
    exclude_input_in_output BOOL [[flag]], which main() always sends (False unless flagged, L172-175, 723).
    """
    inputs: dict[str, np.ndarray] = {
        "text_input": np.array([[prompt]]).astype(object),
        "max_tokens": np.ones((1, 1), dtype=np.int32) * output_len,
        "stream": np.array([[streaming]], dtype=bool),
        "beam_width": np.array([[beam_width]], dtype=np.int32),
        "temperature": np.array([[temperature]], dtype=np.float32),
    }
    if num_return_sequences is not None:
        inputs["num_return_sequences"] = np.array([[num_return_sequences]], dtype=np.int32)
    if num_draft_tokens > 0:
        inputs["num_draft_tokens"] = np.array([[num_draft_tokens]], dtype=np.int32)
    if use_draft_logits is not None:
        inputs["use_draft_logits"] = np.array([[use_draft_logits]], dtype=bool)
    if bad_words:
        inputs["bad_words"] = np.array([list(bad_words)], dtype=object)
    if stop_words:
        inputs["stop_words"] = np.array([list(stop_words)], dtype=object)
    for name, value in (("repetition_penalty", repetition_penalty), ("presence_penalty", presence_penalty),
                        ("frequency_penalty", frequency_penalty)):
        if value is not None:
            inputs[name] = np.array([[value]], dtype=np.float32)
    for name, flag in (("return_log_probs", return_log_probs), ("return_context_logits", return_context_logits),
                       ("return_generation_logits", return_generation_logits)):
        if flag:
            inputs[name] = np.array([[True]], dtype=bool)
    if (embedding_bias_words is None) != (embedding_bias_weights is None):
        raise ValueError("Both embedding bias words and weights must be specified")
    if embedding_bias_words is not None and embedding_bias_weights is not None:
        if len(embedding_bias_words) != len(embedding_bias_weights):
            raise ValueError("Embedding bias weights and words must have same length")
        inputs["embedding_bias_words"] = np.array([list(embedding_bias_words)], dtype=object)
        inputs["embedding_bias_weights"] = np.array([list(embedding_bias_weights)], dtype=np.float32)
    if end_id is not None:
        inputs["end_id"] = np.array([[end_id]], dtype=np.int32)
    if pad_id is not None:
        inputs["pad_id"] = np.array([[pad_id]], dtype=np.int32)
    if exclude_input_in_output is not None:
        inputs["exclude_input_in_output"] = np.array([[exclude_input_in_output]], dtype=bool)
    if return_perf_metrics:
        inputs["return_perf_metrics"] = np.array([[True]], dtype=bool)
    return inputs


def end_to_end_grpc_client(
    url: str, prompt: str | Sequence[str], output_len: int = 100, *, model_name: str = "ensemble",
    streaming: bool = False, beam_width: int = 1, request_id: str = "", batch_inputs: bool = False,
    overwrite_output_text: bool = False, num_return_sequences: int | None = None, **options: Any,
) -> EndToEndResult:
    """inflight_batcher_llm/client/end_to_end_grpc_client.py `run_inference` (L204-432), as main() calls it.

    Model `ensemble` (default) or `tensorrt_llm_bls` (L475-481); `prompt` is one prompt or a list (upstream: a
    JSON list, L237-240). For every prompt - or once for all with `batch_inputs`, the per-prompt tensors
    concatenated on dim 0 (L256-262) - it opens a gRPC stream, sends one async_stream_infer with
    `request_id` (default '') and the requested outputs text_output (+ cum_log_probs/output_log_probs,
    context_logits, generation_logits, sequence_index if n > 1, batch_index if batched, the ten perf outputs, each
    only with its flag, L275-304), then closes the stream and waits for the server to end it (L309-320).

    Reading (L322-430): text_output `[0].decode("utf-8")`; batch_index / sequence_index `[0][0]` (absent -> 0);
    streaming with beam 1 appends each response's text (or overwrites it), otherwise a response sets its
    (batch, sequence) text; with --return-perf-metrics each response's ten perf outputs are read `[0][0]`. Error
    responses are printed upstream and leave '' - here they are collected in `errors`.

    `options` are e2e_prepare_inputs' keyword arguments (temperature defaults to 1.0 as upstream's --temperature;
    exclude_input_in_output to False, always sent).
    """
    prompts = [prompt] if isinstance(prompt, str) else list(prompt)
    per_prompt = [e2e_prepare_inputs(p, output_len, streaming=streaming, beam_width=beam_width,
                                     num_return_sequences=num_return_sequences, **options) for p in prompts]
    if batch_inputs:
        requests = [[_grpc_input(key, np.concatenate([inputs[key] for inputs in per_prompt], axis=0))
                     for key in per_prompt[0]]]
    else:
        requests = [[_grpc_input(key, value) for key, value in inputs.items()] for inputs in per_prompt]

    outputs = [grpcclient.InferRequestedOutput("text_output")]
    if options.get("return_log_probs"):
        outputs += [grpcclient.InferRequestedOutput("cum_log_probs"),
                    grpcclient.InferRequestedOutput("output_log_probs")]
    if options.get("return_context_logits"):
        outputs.append(grpcclient.InferRequestedOutput("context_logits"))
    if options.get("return_generation_logits"):
        outputs.append(grpcclient.InferRequestedOutput("generation_logits"))
    if num_return_sequences is not None and num_return_sequences > 1:
        outputs.append(grpcclient.InferRequestedOutput("sequence_index"))
    if batch_inputs:
        outputs.append(grpcclient.InferRequestedOutput("batch_index"))
    if options.get("return_perf_metrics"):
        outputs += [grpcclient.InferRequestedOutput(name) for name in PERF_METRIC_OUTPUTS]

    generations = beam_width if num_return_sequences is None else num_return_sequences
    result = EndToEndResult(prompts=prompts, output_texts=[])
    client = grpcclient.InferenceServerClient(url)
    try:
        for inputs in requests:
            completed: queue.Queue[Any] = queue.Queue()
            client.start_stream(callback=lambda result, error, sink=completed: sink.put(error or result),
                                stream_timeout=WAIT_S)
            batch_size = inputs[0].shape()[0]
            client.async_stream_infer(model_name, inputs, outputs=outputs, request_id=request_id)
            client.stop_stream()  # upstream: "Wait for server to close the stream"
            texts = [[""] * generations for _ in range(batch_size)]
            chunks: list[list[str]] = [[] for _ in range(batch_size)]
            while not completed.empty():
                response = completed.get()
                if isinstance(response, InferenceServerException):
                    result.errors.append(str(response))
                    continue
                result.responses.append(response)
                text = response.as_numpy("text_output")
                index = response.as_numpy("batch_index")
                row = 0 if index is None else int(at(index, "batch_index", 0, 0))
                seq = response.as_numpy("sequence_index")
                seq_index = 0 if seq is None else int(at(seq, "sequence_index", 0, 0))
                piece = first_text(text, "text_output")
                chunks[row].append(piece)
                if streaming and beam_width == 1 and not overwrite_output_text:
                    texts[row][seq_index] += piece
                else:
                    texts[row][seq_index] = piece
                if options.get("return_perf_metrics"):
                    result.perf_metrics.append({name: at(response.as_numpy(name), name, 0, 0)
                                                for name in PERF_METRIC_OUTPUTS})
            result.chunks.extend(chunks)
            for row_texts in texts:
                result.output_texts.extend(row_texts)
    finally:
        client.close()
    return result


# -- inflight_batcher_llm/client/inflight_batcher_llm_client.py ---------------------------------------------------


DEFAULT_IFB_TEXT = "Born in north-east France, Soyer trained as a"
"""inflight_batcher_llm_client.py --text default (L294-299)."""


@dataclass
class InflightBatcherResult:
    """What inflight_batcher_llm_client.py ends with (L1095-1125): the prompt ids, the output ids with and without
    the prompt (as the script derives them), the decoded text, the last sequence_length it read, the responses
    without output_ids (stop/cancel acknowledgements, L975 / L1087) and the perf / token-count outputs."""

    input_ids: list[int]
    output_ids_w_prompt: list[int]
    output_ids_wo_prompt: list[int]
    output_text: str | None
    sequence_length: int | None
    responses: list[Any]
    acks: int
    cancelled: bool
    perf_metrics: dict[str, Any]
    num_input_tokens: Any = None
    num_output_tokens: Any = None

    def check_output(self, expected_output_ids: Sequence[int], *, exclude_input_in_output: bool = False) -> bool:
        """--check-output (L1127-1130, threshold 1.0): output ids with prompt == (prompt unless excluded) +
        expected ids (upstream's default expectation is 16 hard-coded GPT-2 ids, L814-818)."""
        expected = ([] if exclude_input_in_output else list(self.input_ids)) + list(expected_output_ids)
        return [int(t) for t in self.output_ids_w_prompt] == expected


def ifb_stop_inputs() -> list[grpcclient.InferInput]:
    """`prepare_stop_signals` (L220-234): input_ids INT32 [1, 1] (uninitialised memory upstream; 0 here),
    input_lengths [[0]], request_output_len [[0]], stop BOOL [[True]]."""
    return [
        _grpc_input("input_ids", np.zeros((1, 1), dtype=np.int32)),
        _grpc_input("input_lengths", np.zeros((1, 1), dtype=np.int32)),
        _grpc_input("request_output_len", np.array([[0]], dtype=np.int32)),
        _grpc_input("stop", np.array([[True]], dtype=bool)),
    ]


def inflight_batcher_llm_client(
    url: str, *, tokenizer_dir: Any = None, text: str = DEFAULT_IFB_TEXT, input_ids: Sequence[int] | None = None,
    draft_ids: Sequence[int] | None = None, end_id: int = -1, pad_id: int = 50256, request_output_len: int = 16,
    beam_width: int = 1, temperature: float = 1.0, top_k: int = 1, top_p: float = 0.0, streaming: bool = False,
    num_return_sequences: int | None = None, exclude_input_in_output: bool = False,
    repetition_penalty: float | None = None, presence_penalty: float | None = None,
    frequency_penalty: float | None = None, return_log_probs: bool = False, return_context_logits: bool = False,
    return_generation_logits: bool = False, return_perf_metrics: bool = False,
    return_num_input_tokens: bool = False, return_num_output_tokens: bool = False,
    requested_outputs: Sequence[str] = (), model_name: str = "tensorrt_llm", request_id: str = "",
    stop_after_ms: int = 0, stop_via_request_cancel: bool = False, stream_timeout: float | None = WAIT_S,
) -> InflightBatcherResult:
    """inflight_batcher_llm/client/inflight_batcher_llm_client.py, main (L607-1175), against `tensorrt_llm`.

    Tokenizer mode (`tokenizer_dir`): input_ids = `tokenizer.encode(text)` with special tokens, end_id/pad_id from
    the tokenizer (L631-654); CSV mode (`input_ids` given): the ids as they are and --end-id -1 / --pad-id 50256
    defaults (L612-629). Sent, in this order (L129-140): input_ids INT32 [1, L], input_lengths [[L]],
    request_output_len [[16]], beam_width [[1]], temperature [[1.0]], streaming [[flag]], end_id, pad_id,
    runtime_top_k [[1]], runtime_top_p [[0.0]]; then only if given: return_num_input_tokens /
    return_num_output_tokens (TensorRT-LLM triton_backend copy @000a01de), num_return_sequences, penalties,
    draft_input_ids [1, n], return_log_probs / return_context_logits / return_generation_logits,
    exclude_input_in_output [[True]] (only when flagged, L753-756), return_perf_metrics (L141-217).
    requested_outputs must include output_ids (L792-797), and every response must carry exactly those (L88-94).

    Streaming or -n: one gRPC stream (L861-888); a stop request (`stop_after_ms`, L876-884) goes on the same stream
    under the same request id with request parameter Streaming; `stop_via_request_cancel` cancels instead. The
    script prepends the prompt itself (unless excluded) and appends every response's `output_ids[0][0]` whose
    sequence_length `[0][0]` is > 0 - so streamed responses must hold only the new tokens (L826-829, 961-969).
    Otherwise: unary async_infer with request parameter Streaming (L978-984), a stop request as a second
    async_infer (L996-1003); the response's `output_ids[0][0]` is cut to `sequence_length[0][0]` and the prompt is
    expected at its head unless excluded (L1070-1085, 1101-1109). Server errors raise (except CANCELLED).
    With stop_after_ms, fewer than request_output_len new tokens are required (L1118-1124).
    """
    tokenizer = None
    if input_ids is None:
        tokenizer = load_upstream_tokenizer(tokenizer_dir)
        end_id, pad_id = upstream_special_ids(tokenizer)
        ids = [tokenizer.encode(text)]
    else:
        ids = [list(input_ids)]
    input_ids_data = np.array(ids, dtype=np.int32)
    inputs = [
        _grpc_input("input_ids", input_ids_data),
        _grpc_input("input_lengths", np.array([[len(row)] for row in ids], dtype=np.int32)),
        _grpc_input("request_output_len", np.array([[request_output_len]], dtype=np.int32)),
        _grpc_input("beam_width", np.array([[beam_width]], dtype=np.int32)),
        _grpc_input("temperature", np.array([[temperature]], dtype=np.float32)),
        _grpc_input("streaming", np.array([[streaming]], dtype=bool)),
        _grpc_input("end_id", np.array([[end_id]], dtype=np.int32)),
        _grpc_input("pad_id", np.array([[pad_id]], dtype=np.int32)),
        _grpc_input("runtime_top_k", np.array([[top_k]], dtype=np.int32)),
        _grpc_input("runtime_top_p", np.array([[top_p]], dtype=np.float32)),
    ]
    optional: list[tuple[str, np.ndarray | None]] = [
        ("return_num_input_tokens", np.array([[True]], dtype=bool) if return_num_input_tokens else None),
        ("return_num_output_tokens", np.array([[True]], dtype=bool) if return_num_output_tokens else None),
        ("num_return_sequences",
         np.array([[num_return_sequences]], dtype=np.int32) if num_return_sequences else None),
        ("repetition_penalty",
         np.array([[repetition_penalty]], dtype=np.float32) if repetition_penalty is not None else None),
        ("presence_penalty",
         np.array([[presence_penalty]], dtype=np.float32) if presence_penalty is not None else None),
        ("frequency_penalty",
         np.array([[frequency_penalty]], dtype=np.float32) if frequency_penalty is not None else None),
        ("draft_input_ids", np.array([list(draft_ids)], dtype=np.int32) if draft_ids is not None else None),
        ("return_log_probs", np.array([[True]], dtype=bool) if return_log_probs else None),
        ("return_context_logits", np.array([[True]], dtype=bool) if return_context_logits else None),
        ("return_generation_logits", np.array([[True]], dtype=bool) if return_generation_logits else None),
        ("exclude_input_in_output", np.array([[True]], dtype=bool) if exclude_input_in_output else None),
        ("return_perf_metrics", np.array([[True]], dtype=bool) if return_perf_metrics else None),
    ]
    inputs += [_grpc_input(name, value) for name, value in optional if value is not None]
    if requested_outputs and "output_ids" not in requested_outputs:
        raise ValueError('requested outputs must at least have "output_ids"')
    outputs = [grpcclient.InferRequestedOutput(name) for name in requested_outputs] or None

    generations = beam_width if num_return_sequences is None else num_return_sequences
    actual: list[list[int]] = [[] if exclude_input_in_output or not streaming else list(ids[0])
                               for _ in range(generations)]
    lengths: list[Any] = [None] * generations
    perf: dict[str, Any] = {}
    counts: dict[str, Any] = {}
    responses: list[Any] = []
    acks = 0
    cancelled = False
    completed: queue.Queue[Any] = queue.Queue()

    def read(result: Any, stream_mode: bool) -> None:
        nonlocal acks
        if requested_outputs:
            names = {o.name for o in result.get_response().outputs}
            if set(requested_outputs) != names:
                raise UpstreamReadError(f"expected outputs do not match actual outputs {set(requested_outputs)} "
                                        f"!= {names}")
        responses.append(result)
        output_ids = result.as_numpy("output_ids")
        seq = result.as_numpy("sequence_index")
        seq_idx = 0 if seq is None else int(at(seq, "sequence_index", 0, 0))
        if output_ids is None and stream_mode:
            acks += 1
            return
        if return_num_input_tokens:
            counts["num_input_tokens"] = result.as_numpy("num_input_tokens")
        if return_num_output_tokens:
            counts["num_output_tokens"] = result.as_numpy("num_output_tokens")
        if return_perf_metrics:
            perf.update({name: result.as_numpy(name) for name in PERF_METRIC_OUTPUTS})
        if output_ids is None:
            acks += 1
            return
        lengths[seq_idx] = int(at(result.as_numpy("sequence_length"), "sequence_length", 0, 0))
        if stream_mode and streaming:
            if lengths[seq_idx] is None or lengths[seq_idx] > 0:
                actual[seq_idx] += [int(t) for t in at(output_ids, "output_ids", 0, 0)]
        else:
            actual[seq_idx].extend(int(t) for t in at(output_ids, "output_ids", 0, 0))

    def failed(error: InferenceServerException) -> bool:
        nonlocal cancelled
        if error.status() == "StatusCode.CANCELLED":
            cancelled = True
            return False
        return True

    client = grpcclient.InferenceServerClient(url)
    try:
        if streaming or num_return_sequences is not None:
            client.start_stream(callback=partial(_put, completed), stream_timeout=stream_timeout)
            client.async_stream_infer(model_name, inputs, outputs=outputs, request_id=request_id)
            if stop_after_ms > 0:
                time.sleep(stop_after_ms / 1000.0)
                if not stop_via_request_cancel:
                    client.async_stream_infer(model_name, ifb_stop_inputs(), request_id=request_id,
                                              parameters={"Streaming": streaming})
            client.stop_stream(cancel_requests=stop_after_ms > 0 and stop_via_request_cancel)
            while not completed.empty():
                item = completed.get()
                if isinstance(item, InferenceServerException):
                    if failed(item):
                        raise item
                    continue
                read(item, stream_mode=True)
        else:
            future = client.async_infer(model_name, inputs, callback=partial(_put, completed), outputs=outputs,
                                        request_id=request_id, parameters={"Streaming": streaming},
                                        client_timeout=stream_timeout)
            expected = 1 if num_return_sequences is None else num_return_sequences
            if stop_after_ms > 0:
                time.sleep(stop_after_ms / 1000.0)
                if stop_via_request_cancel:
                    future.cancel()
                else:
                    client.async_infer(model_name, ifb_stop_inputs(), callback=partial(_put, completed),
                                       request_id=request_id, parameters={"Streaming": streaming},
                                       client_timeout=stream_timeout)
                    expected += 1
            for _ in range(expected):
                try:
                    item = completed.get(timeout=WAIT_S)
                except queue.Empty:
                    raise TimeoutError(f"no response from {model_name} in {WAIT_S} s") from None
                if isinstance(item, InferenceServerException):
                    if failed(item):
                        raise item
                    continue
                read(item, stream_mode=False)
    finally:
        client.close()

    seq_len = lengths[0] if not streaming and lengths else len(actual[0])
    with_prompt = actual[0][:seq_len] if seq_len is not None else actual[0]
    without_prompt = with_prompt if exclude_input_in_output else with_prompt[input_ids_data.shape[1]:]
    if stop_after_ms > 0 and len(without_prompt) >= request_output_len:
        raise AssertionError(f"expect less than {request_output_len} output tokens, got {len(without_prompt)}")
    if return_perf_metrics:  # the final print reads value[0][0] of each (L1171-1173)
        for name in PERF_METRIC_OUTPUTS:
            at(perf.get(name), name, 0, 0)
    return InflightBatcherResult(
        input_ids=list(ids[0]), output_ids_w_prompt=with_prompt, output_ids_wo_prompt=without_prompt,
        output_text=tokenizer.decode(without_prompt) if tokenizer is not None else None, sequence_length=seq_len,
        responses=responses, acks=acks, cancelled=cancelled, perf_metrics=perf,
        num_input_tokens=counts.get("num_input_tokens"), num_output_tokens=counts.get("num_output_tokens"))


def _put(sink: queue.Queue[Any], result: Any, error: Any) -> None:
    sink.put(error if error else result)


# -- inflight_batcher_llm/client/e2e_grpc_speculative_decoding_client.py -----------------------------------------


@dataclass
class SpeculativeRound:
    """One loop iteration of run_speculative_inference: the sequence sent, the drafts proposed, the target's ids."""

    input_ids: list[int]
    draft_tokens: list[int] | None
    target_output_ids: list[int]


@dataclass
class SpeculativeResult:
    text: str
    prompt_ids: list[int]
    output_ids: list[int]
    rounds: list[SpeculativeRound]


def spec_llm_inputs(
    input_ids: np.ndarray, request_output_len: int, draft_tokens: np.ndarray | None, *, beam_width: int,
    temperature: float, bad_words_ids: np.ndarray, stop_words_ids: np.ndarray, end_id: Any, pad_id: Any,
    repetition_penalty: float | None, presence_penalty: float | None, frequency_penalty: float | None,
    return_generation_logits: bool,
) -> list[grpcclient.InferInput]:
    """`get_trtllm_inputs` (L85-166): input_ids [1, L], input_lengths [[L]], request_output_len [[n]],
    bad_words_list / stop_words_list as preprocessing returned them, beam_width, temperature; then draft_input_ids
    [1, n] (target only), penalties, end_id [[id]], pad_id [[id]], return_generation_logits [[True]] if asked."""
    inputs = [
        _grpc_input("input_ids", np.expand_dims(input_ids, axis=0)),
        _grpc_input("input_lengths", np.array([[len(input_ids)]], dtype=np.int32)),
        _grpc_input("request_output_len", np.array([[request_output_len]], dtype=np.int32)),
        _grpc_input("bad_words_list", bad_words_ids),
        _grpc_input("stop_words_list", stop_words_ids),
        _grpc_input("beam_width", np.array([[beam_width]], dtype=np.int32)),
        _grpc_input("temperature", np.array([[temperature]], dtype=np.float32)),
    ]
    if draft_tokens is not None:
        inputs.append(_grpc_input("draft_input_ids", np.array([draft_tokens], dtype=np.int32)))
    for name, value in (("repetition_penalty", repetition_penalty), ("presence_penalty", presence_penalty),
                        ("frequency_penalty", frequency_penalty)):
        if value is not None:
            inputs.append(_grpc_input(name, np.array([[value]], dtype=np.float32)))
    if end_id is not None:
        inputs.append(_grpc_input("end_id", np.array([[end_id]], dtype=np.int32)))
    if pad_id is not None:
        inputs.append(_grpc_input("pad_id", np.array([[pad_id]], dtype=np.int32)))
    if return_generation_logits:
        inputs.append(_grpc_input("return_generation_logits", np.array([[True]], dtype=bool)))
    return inputs


def spec_llm_outputs(result: Any, model: str) -> tuple[np.ndarray, int]:
    """`extract_trtllm_outputs` (L176-196): output_ids squeezed on axes (0, 1) - it must be [1, 1, L] - and
    sequence_length, which must be [1, 1]."""
    output_ids = result.as_numpy("output_ids")
    if output_ids is None or output_ids.ndim != 3 or output_ids.shape[:2] != (1, 1):
        raise UpstreamReadError(f"{model} output_ids is a {_describe(output_ids)}; NVIDIA's client squeezes axes "
                                "(0, 1) and needs [1, 1, L]")
    lengths = result.as_numpy("sequence_length")
    if lengths is None or lengths.ndim < 2 or lengths.shape[0] != 1 or lengths.shape[1] != 1:
        raise UpstreamReadError(f"{model} sequence_length is a {_describe(lengths)}; NVIDIA's client asserts "
                                "shape[0] == 1 and shape[1] == 1")
    return np.squeeze(output_ids.astype(np.int32), axis=(0, 1)), int(lengths.astype(np.int32)[0, 0])


def e2e_grpc_speculative_decoding_client(
    url_target: str, prompt: str, output_len: int = 100, *, url_draft: str | None = None,
    num_draft_tokens: int = 5, request_id: str = "1", beam_width: int = 1, temperature: float = 1.0,
    stop_words: Sequence[str] = (), bad_words: Sequence[str] = (), end_id: int | None = None,
    pad_id: int | None = None, repetition_penalty: float | None = None, presence_penalty: float | None = None,
    frequency_penalty: float | None = None, preprocessor_model_name: str = "preprocessing",
    draft_tensorrt_llm_model_name: str = "tensorrt_llm", target_tensorrt_llm_model_name: str = "tensorrt_llm",
    postprocessor_model_name: str = "postprocessing", return_draft_model_draft_logits: bool = False,
    return_target_model_accepted_token_logits: bool = False,
) -> SpeculativeResult:
    """inflight_batcher_llm/client/e2e_grpc_speculative_decoding_client.py `run_speculative_inference`
    (L218-376) with main()'s defaults (L379-568): client-side draft-target decoding, all unary gRPC infer (so the
    LLM models must not be decoupled), every call under `request_id` ('1').

    1. preprocessing (draft URL): QUERY [[prompt]], REQUEST_OUTPUT_LEN [[output_len]], + BAD_WORDS_DICT /
       STOP_WORDS_DICT [1, N] if given, END_ID / PAD_ID if truthy (L39-70); reads INPUT_ID squeezed on axis 0,
       BAD_WORDS_IDS, STOP_WORDS_IDS as they are, OUT_END_ID / OUT_PAD_ID `[0][0]` (L73-82).
    2. Loop (L242-364): k = min(num_draft_tokens, prompt + output_len - current - 1); if k > 0 the draft model gets
       the current sequence with request_output_len k, and the drafts are `draft_output_ids[len(input):seq_len]`
       - the draft's output_ids must start with the sequence sent; the target gets the sequence, draft_input_ids
       [1, n] and request_output_len n + 1 (1 without drafts), and its whole output_ids row becomes the next
       sequence - it must hold the prompt too. Stop when the sequence reaches prompt + output_len, the draft
       output equals the target output, the sequence did not change, or it ends in a stop word's ids.
    3. postprocessing (target URL): TOKENS_BATCH [1, 1, L], SEQUENCE_LENGTH [[L]] -> `OUTPUT[0].decode("utf8")`
       (L199-209, 366-376): the text of prompt + generated tokens.
    """
    if beam_width > 1:
        raise ValueError("Beam width > 1 is not yet supported with speculative decoding")
    if return_draft_model_draft_logits and return_target_model_accepted_token_logits:
        raise ValueError("only one of the two logits flags at a time (L101-104)")
    client_target = grpcclient.InferenceServerClient(url_target)
    url_draft = url_draft or url_target
    client_draft = grpcclient.InferenceServerClient(url_draft) if url_draft != url_target else client_target
    try:
        pre_inputs = [_grpc_input("QUERY", np.array([[prompt]]).astype(object)),
                      _grpc_input("REQUEST_OUTPUT_LEN", np.ones((1, 1), dtype=np.int32) * output_len)]
        if bad_words:
            pre_inputs.append(_grpc_input("BAD_WORDS_DICT", np.array([list(bad_words)], dtype=object)))
        if stop_words:
            pre_inputs.append(_grpc_input("STOP_WORDS_DICT", np.array([list(stop_words)], dtype=object)))
        if end_id:
            pre_inputs.append(_grpc_input("END_ID", np.array([[end_id]], dtype=np.int32)))
        if pad_id:
            pre_inputs.append(_grpc_input("PAD_ID", np.array([[pad_id]], dtype=np.int32)))
        pre = client_draft.infer(preprocessor_model_name, pre_inputs, request_id=request_id,
                                 client_timeout=WAIT_S)
        input_id = pre.as_numpy("INPUT_ID")
        if input_id is None or input_id.ndim != 2 or input_id.shape[0] != 1:
            raise UpstreamReadError(f"preprocessing INPUT_ID is a {_describe(input_id)}; NVIDIA's client squeezes "
                                    "axis 0 and needs [1, L]")
        prompt_ids = np.squeeze(input_id.astype(np.int32), axis=0)
        bad_ids = pre.as_numpy("BAD_WORDS_IDS")
        stop_ids = pre.as_numpy("STOP_WORDS_IDS")
        for name, value in (("BAD_WORDS_IDS", bad_ids), ("STOP_WORDS_IDS", stop_ids)):
            if value is None:
                raise UpstreamReadError(f"preprocessing returned no {name}; NVIDIA's client forwards it")
        bad_ids = bad_ids.astype(np.int32)
        stop_ids = stop_ids.astype(np.int32)
        end = at(pre.as_numpy("OUT_END_ID"), "OUT_END_ID", 0, 0)
        pad = at(pre.as_numpy("OUT_PAD_ID"), "OUT_PAD_ID", 0, 0)
        llm_options = dict(beam_width=beam_width, temperature=temperature, bad_words_ids=bad_ids,
                           stop_words_ids=stop_ids, end_id=end, pad_id=pad, repetition_penalty=repetition_penalty,
                           presence_penalty=presence_penalty, frequency_penalty=frequency_penalty)

        sequence = prompt_ids
        draft_output_ids: np.ndarray | None = None
        draft_tokens: np.ndarray | None = None
        rounds: list[SpeculativeRound] = []
        while True:
            k = min(num_draft_tokens, len(prompt_ids) + output_len - len(sequence) - 1)
            if k > 0:
                draft = client_draft.infer(
                    draft_tensorrt_llm_model_name,
                    spec_llm_inputs(sequence, k, None, return_generation_logits=return_draft_model_draft_logits,
                                     **llm_options),
                    request_id=request_id, client_timeout=WAIT_S)
                draft_output_ids, draft_len = spec_llm_outputs(draft, draft_tensorrt_llm_model_name)
                draft_tokens = draft_output_ids[len(sequence):draft_len]
            target = client_target.infer(
                target_tensorrt_llm_model_name,
                spec_llm_inputs(sequence, len(draft_tokens) + 1 if k > 0 and draft_tokens is not None else 1,
                                 draft_tokens if k > 0 else None,
                                 return_generation_logits=return_target_model_accepted_token_logits,
                                 **llm_options),
                request_id=request_id, client_timeout=WAIT_S)
            target_output_ids, _ = spec_llm_outputs(target, target_tensorrt_llm_model_name)
            rounds.append(SpeculativeRound([int(t) for t in sequence],
                                           [int(t) for t in draft_tokens] if k > 0 and draft_tokens is not None
                                           else None, [int(t) for t in target_output_ids]))
            previous, sequence = sequence, target_output_ids
            length_stop = len(sequence) >= len(prompt_ids) + output_len
            draft_equal = draft_output_ids is not None and np.array_equal(draft_output_ids, target_output_ids)
            unchanged = np.array_equal(previous, sequence)
            stopped = any(np.array_equal(sequence[-len(word):], word) for word in stop_ids[0])
            if length_stop or draft_equal or unchanged or stopped:
                break

        post = client_target.infer(postprocessor_model_name, [
            _grpc_input("TOKENS_BATCH", np.expand_dims(sequence, axis=(0, 1))),
            _grpc_input("SEQUENCE_LENGTH", np.array([[len(sequence)]], dtype=np.int32)),
        ], request_id=request_id, client_timeout=WAIT_S)
        text = first_text(post.as_numpy("OUTPUT"), "OUTPUT")
    finally:
        client_target.close()
        if client_draft is not client_target:
            client_draft.close()
    return SpeculativeResult(text=text, prompt_ids=[int(t) for t in prompt_ids],
                             output_ids=[int(t) for t in sequence], rounds=rounds)


# -- tools/inflight_batcher_llm/end_to_end_test.py ---------------------------------------------------------------


@dataclass
class EndToEndTestCase:
    """One prompt of end_to_end_test.test_functionality_ifb: the preprocessing outputs, the manual chain's
    postprocessing OUTPUT, the ensemble's (and BLS's) text_output, as the raw arrays the script compares."""

    prompt: str
    input_id: np.ndarray
    chain_output: np.ndarray
    ensemble_output: np.ndarray
    bls_output: np.ndarray | None


def _upstream_equal(a: np.ndarray, b: np.ndarray, what: str) -> None:
    """`assert output0 == ensemble_output` (end_to_end_test.py:305, 382): numpy equality, then its truth value."""
    if not bool(a == b):
        raise AssertionError(f"{what}: {a!r} != {b!r}")


def _require(result: Any, name: str, model: str) -> np.ndarray:
    value = result.as_numpy(name)
    if value is None:
        raise UpstreamReadError(f"{model} returned no {name}; NVIDIA's end_to_end_test forwards it")
    return value


def end_to_end_test_functionality(
    url: str, prompts: Sequence[str], output_lens: Sequence[int], *, protocol: str = "http", test_bls: bool = False,
) -> list[EndToEndTestCase]:
    """tools/inflight_batcher_llm/end_to_end_test.py `test_functionality_ifb` (L155-425), default HTTP (L539-546,
    603-604), all unary infer with request_id str(i) - the models must not be decoupled.

    Per prompt: (1) preprocessing with QUERY [[prompt]], BAD_WORDS_DICT [[""]], STOP_WORDS_DICT [[""]],
    REQUEST_OUTPUT_LEN [[n]] -> reads INPUT_ID, REQUEST_INPUT_LEN, REQUEST_OUTPUT_LEN, DECODER_INPUT_ID, OUT_END_ID,
    OUT_PAD_ID; tensorrt_llm with input_ids, decoder_input_ids, input_lengths, request_output_len, end_id, pad_id
    (exactly those arrays) -> output_ids, sequence_length; postprocessing with TOKENS_BATCH, SEQUENCE_LENGTH ->
    OUTPUT. (2) ensemble with text_input, max_tokens, bad_words [[""]], stop_words [[""]], requested output
    text_output -> asserts OUTPUT == text_output (L305). (3) with `test_bls`, the same request to tensorrt_llm_bls
    -> asserts OUTPUT == its text_output (L382). (The return_* logits variants are left out: the demo engines do
    not gather logits.)
    """
    client: Any = (httpclient.InferenceServerClient(url, network_timeout=WAIT_S) if protocol == "http"
                   else grpcclient.InferenceServerClient(url))
    cases = []
    try:
        for i, prompt in enumerate(prompts):
            text = np.array([[prompt]]).astype(object)
            length = np.ones_like([[prompt]]).astype(np.int32) * output_lens[i]
            empty = np.array([[""]], dtype=object)
            pre = client.infer("preprocessing", [
                _input(protocol, "QUERY", text), _input(protocol, "BAD_WORDS_DICT", empty),
                _input(protocol, "STOP_WORDS_DICT", empty), _input(protocol, "REQUEST_OUTPUT_LEN", length),
            ], request_id=str(i))
            input_id = _require(pre, "INPUT_ID", "preprocessing")
            llm = client.infer("tensorrt_llm", [
                _input(protocol, "input_ids", input_id),
                _input(protocol, "decoder_input_ids", _require(pre, "DECODER_INPUT_ID", "preprocessing")),
                _input(protocol, "input_lengths", _require(pre, "REQUEST_INPUT_LEN", "preprocessing")),
                _input(protocol, "request_output_len", _require(pre, "REQUEST_OUTPUT_LEN", "preprocessing")),
                _input(protocol, "end_id", _require(pre, "OUT_END_ID", "preprocessing")),
                _input(protocol, "pad_id", _require(pre, "OUT_PAD_ID", "preprocessing")),
            ], request_id=str(i))
            tokens = _require(llm, "output_ids", "tensorrt_llm").astype(np.int32)
            post = client.infer("postprocessing", [
                _input(protocol, "TOKENS_BATCH", tokens),
                _input(protocol, "SEQUENCE_LENGTH", _require(llm, "sequence_length", "tensorrt_llm")),
            ], request_id=str(i))
            chain = _require(post, "OUTPUT", "postprocessing")
            entry_inputs = [
                _input(protocol, "text_input", text), _input(protocol, "max_tokens", length),
                _input(protocol, "bad_words", empty), _input(protocol, "stop_words", empty),
            ]
            requested = [(httpclient if protocol == "http" else grpcclient).InferRequestedOutput("text_output")]
            ensemble = client.infer("ensemble", entry_inputs, outputs=requested, request_id=str(i))
            ensemble_output = _require(ensemble, "text_output", "ensemble")
            _upstream_equal(chain, ensemble_output, f"manual chain vs ensemble for {prompt!r}")
            bls_output = None
            if test_bls:
                bls = client.infer("tensorrt_llm_bls", entry_inputs, outputs=requested, request_id=str(i))
                bls_output = _require(bls, "text_output", "tensorrt_llm_bls")
                _upstream_equal(chain, bls_output, f"manual chain vs tensorrt_llm_bls for {prompt!r}")
            cases.append(EndToEndTestCase(prompt, input_id, chain, ensemble_output, bls_output))
    finally:
        client.close()
    return cases


def end_to_end_test_performance(url: str, prompts: Sequence[str], output_lens: Sequence[int], *,
                                model_name: str = "ensemble") -> list[np.ndarray]:
    """end_to_end_test.py `test_performance` over HTTP (L459-523; create_inputs L428-456): up to ten warm-up
    infers of prompt 0, then one async_infer per prompt (text_input, max_tokens, bad_words [[""]], stop_words
    [[""]], requested output text_output only, tools/utils/utils.py:41-52), collected with get_result(), which
    raises on an error response (utils.py:174-178). Returns each response's text_output array (the script does
    not read it)."""
    client = httpclient.InferenceServerClient(url, concurrency=8, network_timeout=WAIT_S)

    def inputs(prompt: str, output_len: int) -> list[httpclient.InferInput]:
        return [
            _http_input("text_input", np.array([[prompt]]).astype(object)),
            _http_input("max_tokens", np.ones_like([[prompt]]).astype(np.int32) * output_len),
            _http_input("bad_words", np.array([[""]], dtype=object)),
            _http_input("stop_words", np.array([[""]], dtype=object)),
        ]

    try:
        for i in range(min(10, len(prompts))):
            client.infer(model_name, inputs(prompts[0], output_lens[0]),
                         outputs=[httpclient.InferRequestedOutput("text_output")], request_id=str(i))
        pending = [client.async_infer(model_name, inputs(prompt, output_lens[i]),
                                      outputs=[httpclient.InferRequestedOutput("text_output")], request_id=str(i))
                   for i, prompt in enumerate(prompts)]
        return [p.get_result().as_numpy("text_output") for p in pending]
    finally:
        client.close()


# -- tools/inflight_batcher_llm/speculative_decoding_test.py -----------------------------------------------------


@dataclass
class SpeculativeComparison:
    prompt: str
    control: str
    speculative: str
    errors: list[str]


def speculative_decoding_test(
    url_target: str, prompts: Sequence[str], output_lens: Sequence[int], *, url_control: str | None = None,
    url_draft: str | None = None, execute_bls_speculative_decoding: bool = True, num_draft_tokens: int = 5,
    use_draft_logits: bool = False, return_perf_metrics: bool = False, end_id: int | None = None,
    pad_id: int | None = None, draft_tensorrt_llm_model_name: str = "tensorrt_llm",
    target_tensorrt_llm_model_name: str = "tensorrt_llm",
) -> list[SpeculativeComparison]:
    """tools/inflight_batcher_llm/speculative_decoding_test.py (L247-378), request ids 1, 2, ...

    Control: end_to_end_grpc_client.run_inference on `ensemble` at url_control, non-streaming, beam 1, with
    embedding_bias_words = embedding_bias_weights = [] (two [1, 0] tensors), temperature 1.0 and
    exclude_input_in_output False (L294-300). Speculative: with --execute-bls-speculative-decoding the same call
    on `tensorrt_llm_bls` at url_target plus num_draft_tokens [[5]] and use_draft_logits [[False]] (L322-330);
    otherwise e2e_grpc_speculative_decoding_client (L340-353). The script counts a mismatch of the two texts as a
    failure (L359-368); each comparison here carries both texts and the server errors of the two calls.
    """
    url_control = url_control or url_target
    comparisons = []
    for i, prompt in enumerate(prompts):
        request_id = str(i + 1)
        control = end_to_end_grpc_client(
            url_control, prompt, output_lens[i], model_name="ensemble", streaming=False, beam_width=1,
            request_id=request_id, temperature=1.0, embedding_bias_words=[], embedding_bias_weights=[],
            end_id=end_id, pad_id=pad_id)
        assert len(control.output_texts) == 1, control.output_texts
        errors = [f"control: {e}" for e in control.errors]
        if execute_bls_speculative_decoding:
            spec = end_to_end_grpc_client(
                url_target, prompt, output_lens[i], model_name="tensorrt_llm_bls", streaming=False, beam_width=1,
                request_id=request_id, temperature=1.0, embedding_bias_words=[], embedding_bias_weights=[],
                end_id=end_id, pad_id=pad_id, num_draft_tokens=num_draft_tokens, use_draft_logits=use_draft_logits,
                return_perf_metrics=return_perf_metrics)
            assert len(spec.output_texts) == 1, spec.output_texts
            errors += [f"tensorrt_llm_bls: {e}" for e in spec.errors]
            speculative = spec.output_texts[0]
        else:
            speculative = e2e_grpc_speculative_decoding_client(
                url_target, prompt, output_lens[i], url_draft=url_draft, num_draft_tokens=num_draft_tokens,
                request_id=request_id, end_id=end_id, pad_id=pad_id,
                draft_tensorrt_llm_model_name=draft_tensorrt_llm_model_name,
                target_tensorrt_llm_model_name=target_tensorrt_llm_model_name).text
        comparisons.append(SpeculativeComparison(prompt, control.output_texts[0], speculative, errors))
    return comparisons


# -- tools/inflight_batcher_llm/benchmark_core_model.py ----------------------------------------------------------


@dataclass
class BenchmarkResult:
    responses: list[Any]
    output_token_lens: list[int] | None
    """gRPC only: per request (by id), `outputs[0].shape[2]` of its response JSON minus the input length unless
    --exclude-input-in-output (tools/utils/utils.py:343-361); None for HTTP, which the script does not measure."""


def benchmark_core_model(
    url: str, input_ids: Sequence[Sequence[int]], output_lens: Sequence[int], *, protocol: str = "http",
    decoupled: bool = False, model_names: Sequence[str] = ("tensorrt_llm",), pad_id: int | None = None,
    end_id: int | None = None, exclude_input_in_output: bool = False, warm_up: bool = True,
) -> BenchmarkResult:
    """tools/inflight_batcher_llm/benchmark_core_model.py `test_performance` (L60-173), dataset workload
    (L431-471: ids from the tokenizer, pad/end id from it; absent ids default to pad 0 / end 1, L42-57).

    Requests: input_ids INT32 [1, L], input_lengths [[L]], request_output_len [[n]], pad_id, end_id - nothing
    else, no requested outputs (all outputs come back), request ids str(i), the model names taken in turn.
    Warm-up: ten requests with prompt 0 and request_output_len 100 (L74-94); with `decoupled` over one gRPC stream
    whose responses are dropped, otherwise blocking infer (errors raise). Then HTTP async_infer + get_result(), or
    gRPC async_infer with callbacks, or (`decoupled`) async_stream_infer on a stream (L102-145); gRPC collects one
    response per request and raises on an error (utils.py:181-190).
    """
    client: Any = (httpclient.InferenceServerClient(url, concurrency=8, network_timeout=WAIT_S)
                   if protocol == "http" else grpcclient.InferenceServerClient(url))
    if decoupled and protocol != "grpc":
        raise ValueError("Protocol must be set to 'grpc' when using '--decoupled'.")
    ids = [np.array([list(row)], np.int32) for row in input_ids]
    lens = [np.array([[len(row)]], np.int32) for row in input_ids]

    def request(i: int, row: int, output_len: int) -> list[Any]:
        return [
            _input(protocol, "input_ids", ids[row]),
            _input(protocol, "input_lengths", lens[row]),
            _input(protocol, "request_output_len", np.ones_like([[1]]).astype(np.int32) * output_len),
            _input(protocol, "pad_id", np.array([[pad_id if pad_id is not None else 0]], dtype=np.int32)),
            _input(protocol, "end_id", np.array([[end_id if end_id is not None else 1]], dtype=np.int32)),
        ]

    completed: queue.Queue[tuple[Any, Any]] = queue.Queue()
    try:
        if warm_up:
            if decoupled:
                client.start_stream(callback=lambda result, error: None, stream_timeout=WAIT_S)
            for i in range(10):
                name = model_names[i % len(model_names)]
                if decoupled:
                    client.async_stream_infer(name, request(i, 0, 100), request_id=str(i))
                else:
                    client.infer(name, request(i, 0, 100), request_id=str(i))
            if decoupled:
                client.stop_stream()
        pending = []
        if decoupled:
            client.start_stream(callback=lambda result, error: completed.put((result, error)),
                                stream_timeout=WAIT_S)
        for i in range(len(ids)):
            name = model_names[i % len(model_names)]
            inputs = request(i, i, output_lens[i])
            if protocol == "http":
                pending.append(client.async_infer(name, inputs, request_id=str(i)))
            elif decoupled:
                client.async_stream_infer(name, inputs, request_id=str(i))
            else:
                client.async_infer(name, inputs, callback=lambda result, error: completed.put((result, error)),
                                   request_id=str(i), client_timeout=WAIT_S)
        if decoupled:
            client.stop_stream()
        if protocol == "http":
            return BenchmarkResult([p.get_result() for p in pending], None)
        responses = []
        for _ in range(len(ids)):
            result, error = completed.get(timeout=WAIT_S)
            if error is not None:
                raise RuntimeError(error)
            responses.append(result)
    finally:
        client.close()
    by_id: dict[str, int] = {}
    for response in responses:
        message = response.get_response(as_json=True)
        first = message["outputs"][0]
        if len(first["shape"]) < 3:
            raise UpstreamReadError(f"the response's first output is {first['name']} of shape {first['shape']}; "
                                    "NVIDIA's stats read outputs[0]['shape'][2] (output_ids [1, beams, len])")
        by_id[message["id"]] = int(first["shape"][2])
    output_lens_seen = [value for _, value in sorted(by_id.items())]
    if not exclude_input_in_output:
        output_lens_seen = [n - len(row) for n, row in zip(output_lens_seen, input_ids, strict=True)]
    return BenchmarkResult(responses, output_lens_seen)


# -- README.md "Send an Inference Request" -----------------------------------------------------------------------

README_PROMPT = "What is machine learning?"

_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def readme_generate(http_url: str, model: str = "ensemble", text_input: str = README_PROMPT,
                    max_tokens: int = 20) -> tuple[int, Any]:
    """The README's curl calls (README.md:270, 276 @ c2e65b88):
    `curl -X POST localhost:8000/v2/models/ensemble/generate -d '{"text_input": "What is machine learning?",
    "max_tokens": 20, "bad_words": "", "stop_words": ""}'` (and the same for tensorrt_llm_bls). Sends that body
    with curl's headers for -d (Content-Type application/x-www-form-urlencoded, Accept */*), no proxy; returns
    the HTTP status and the decoded JSON (or the raw body when it is not JSON). The README's sample answer is a
    JSON object whose text_output starts with the prompt (README.md:279-288)."""
    body = json.dumps({"text_input": text_input, "max_tokens": max_tokens, "bad_words": "", "stop_words": ""})
    request = urllib.request.Request(f"http://{http_url}/v2/models/{model}/generate", data=body.encode(),
                                     method="POST", headers={"Content-Type": "application/x-www-form-urlencoded",
                                                             "Accept": "*/*"})
    try:
        with _DIRECT.open(request, timeout=WAIT_S) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as err:
        status, raw = err.code, err.read()
    try:
        return status, json.loads(raw)
    except json.JSONDecodeError:
        return status, raw

