"""The reference `tensorrt_llm` / `tensorrt_llm_draft` models through a real tritonserver, asked directly (gRPC,
and HTTP where the client would use it) as NVIDIA's clients ask the C++ `tensorrtllm` backend.

Each test's docstring names the NVIDIA/TensorRT-LLM source of the fact it checks (triton_backend/
inflight_batcher_llm/src/model_instance_state.cc = MIS, utils.cc = UC; cpp/tensorrt_llm/batch_manager/
llmRequest.cpp = LR; executor/executorImpl.cpp = EX; layers/medusaDecodingLayer.cpp). Expected tokens come from
`greedy_outputs` of the same run, never written down.
"""

from __future__ import annotations

import queue
import time
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from specbuild.contracts.engine_info import engine_dir, read_engine_info
from specbuild.contracts.triton_backend import PERF_METRICS, TENSORRT_LLM
from tests.deploy_fixtures import MAX_TOKENS, PROMPTS, Deployed, Greedy

pytestmark = [pytest.mark.slow, pytest.mark.tritonserver]


# -- clients -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer(deployed: Deployed) -> Any:
    from specbuild.tokenizer import load_tokenizer

    return load_tokenizer(deployed.tokenizer_dir)


def prompt_ids(tokenizer: Any, prompt: str) -> list[int]:
    """The prompt as greedy_outputs encoded it."""
    return tokenizer.encode(prompt, add_special_tokens=True)


def tensors(rows: list[list[int]], max_tokens: int, **extra: Any) -> dict[str, np.ndarray]:
    """inflight_batcher_llm_client.py's request: input_ids [B, L] (right-padded), input_lengths, request_output_len
    and the optional inputs given ([B, 1] unless an array)."""
    width = max(len(r) for r in rows)
    ids = np.zeros((len(rows), width), dtype=np.int32)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
    out = {"input_ids": ids, "input_lengths": np.array([[len(r)] for r in rows], dtype=np.int32),
           "request_output_len": np.full((len(rows), 1), max_tokens, dtype=np.int32)}
    for name, value in extra.items():
        dtype = NUMPY[TENSORRT_LLM.input(name).data_type]  # the contract's type for the input
        out[name] = value if isinstance(value, np.ndarray) else np.full((len(rows), 1), value, dtype=dtype)
    return out


NUMPY = {"TYPE_INT32": np.int32, "TYPE_UINT64": np.uint64, "TYPE_FP32": np.float32, "TYPE_BOOL": bool}


def _grpc_inputs(values: dict[str, np.ndarray]) -> list[grpcclient.InferInput]:
    inputs = []
    for name, value in values.items():
        tensor = grpcclient.InferInput(name, list(value.shape), np_to_triton_dtype(value.dtype))
        tensor.set_data_from_numpy(value)
        inputs.append(tensor)
    return inputs


def stream(url: str, model: str, values: dict[str, np.ndarray], outputs: list[str] | None = None, *,
           request_id: str = "", until_final: bool = True, client: Any = None) -> list[tuple[Any, Any, bool]]:
    """One request over the gRPC stream RPC (decoupled models): (result, error, final) per response, up to the
    final one (or the first error)."""
    own = client is None
    client = client or grpcclient.InferenceServerClient(url)
    responses: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        requested = None if outputs is None else [grpcclient.InferRequestedOutput(n) for n in outputs]
        client.async_stream_infer(model, _grpc_inputs(values), outputs=requested, request_id=request_id,
                                  enable_empty_final_response=True)
        got = []
        while True:
            result, error = responses.get(timeout=300)
            final = error is not None or bool(
                result.get_response(as_json=True)["parameters"]["triton_final_response"]["bool_param"])
            got.append((result, error, final))
            if final or not until_final:
                return got
    finally:
        if own:
            client.stop_stream()
            client.close()


def tokens(result: Any) -> list[int]:
    return result.as_numpy("output_ids").reshape(-1).tolist()


def present(result: Any) -> set[str]:
    return {o["name"] for o in result.get_response(as_json=True).get("outputs", [])}


# -- the plain target (decoupled) ------------------------------------------------------------------------------


def test_a_request_gets_the_prompt_and_its_greedy_tokens_and_only_the_always_outputs(
        plain_server: Any, tokenizer: Any, greedy_outputs: dict[str, Greedy]) -> None:
    """MIS fillTritonResponse: output_ids [1, beams, len] and sequence_length [1, beams] always, the other
    outputs only under their rules (none here, all outputs requested by default); the prompt heads output_ids
    (exclude_input_in_output defaults to false, MIS:799-808); what inflight_batcher_llm_client.py reads."""
    for prompt in PROMPTS[:2]:
        ids = prompt_ids(tokenizer, prompt)
        [(result, error, final)] = stream(plain_server.grpc_url, "tensorrt_llm",
                                          tensors([ids], MAX_TOKENS, end_id=tokenizer.eos_token_id))
        assert error is None and final, error and error.message()
        assert present(result) == {"output_ids", "sequence_length", "preceding_ids", "is_final"}
        expected = ids + greedy_outputs[prompt].ids
        assert result.as_numpy("output_ids").shape == (1, 1, len(expected))
        assert tokens(result) == expected
        assert result.as_numpy("sequence_length").tolist() == [[len(expected)]]


def test_streamed_responses_hold_new_tokens_only(plain_server: Any, tokenizer: Any,
                                                 greedy_outputs: dict[str, Greedy]) -> None:
    """LR createResult: a streaming response holds the tokens since the previous one, whatever the exclude flag
    (inflight_batcher_llm_client.py prepends the prompt itself); MIS: COMPLETE_FINAL only on the last."""
    prompt = PROMPTS[0]
    responses = stream(plain_server.grpc_url, "tensorrt_llm",
                       tensors([prompt_ids(tokenizer, prompt)], MAX_TOKENS, end_id=tokenizer.eos_token_id,
                               streaming=True, exclude_input_in_output=False))
    assert all(error is None for _, error, _ in responses)
    got = [tokens(r) for r, _, _ in responses]
    assert [t for chunk in got for t in chunk] == greedy_outputs[prompt].ids
    assert len(got) > 1 and all(len(chunk) <= 1 for chunk in got)
    assert [final for _, _, final in responses] == [False] * (len(responses) - 1) + [True]


def test_perf_metrics_and_num_tokens_when_asked(plain_server: Any, tokenizer: Any) -> None:
    """MIS fillTritonResponse: with return_perf_metrics the ten perf outputs ([1, 1]: INT32 block and draft
    counts, INT64 steady-clock ns, FP32 acceptance_rate); num_input_tokens / num_output_tokens with their flags
    (the output count includes the prompt, non-streaming). The python backend returns only requested outputs,
    so all are requested here."""
    ids = prompt_ids(tokenizer, PROMPTS[1])
    outputs = ["output_ids", "sequence_length", "num_input_tokens", "num_output_tokens", *PERF_METRICS]
    [(result, error, _)] = stream(plain_server.grpc_url, "tensorrt_llm",
                                  tensors([ids], 6, return_perf_metrics=True, return_num_input_tokens=True,
                                          return_num_output_tokens=True), outputs)
    assert error is None and present(result) == set(outputs)
    assert {n: result.as_numpy(n).shape for n in PERF_METRICS} == {n: (1, 1) for n in PERF_METRICS}
    times = [int(result.as_numpy(f"{n}_ns")[0, 0]) for n in ("arrival_time", "first_scheduled_time",
                                                             "first_token_time", "last_token_time")]
    assert 0 < times[0] <= times[1] <= times[2] <= times[3] <= time.monotonic_ns()
    assert result.as_numpy("kv_cache_alloc_total_blocks").dtype == np.int32
    assert result.as_numpy("num_input_tokens").tolist() == [[len(ids)]]
    assert result.as_numpy("num_output_tokens").tolist() == [[len(ids) + 6]]


def test_output_ids_must_be_requested(plain_server: Any, tokenizer: Any) -> None:
    """MIS fillTritonResponse: "output_ids tensor must be present in list of output tensors", as the response's
    error."""
    [(_, error, _)] = stream(plain_server.grpc_url, "tensorrt_llm", tensors([prompt_ids(tokenizer, PROMPTS[0])], 4),
                             ["sequence_length"])
    assert error is not None and "output_ids tensor must be present in list of output tensors" in error.message()


def test_logits_need_an_engine_that_gathers_them(plain_server: Any, tokenizer: Any) -> None:
    """EX fetchNewRequests: return_generation_logits / return_context_logits on an engine built without
    gather_generation_logits / gather_context_logits is refused with the executor's text."""
    ids = prompt_ids(tokenizer, PROMPTS[0])
    for flag, text in (("return_generation_logits", "gather_generation_logits must be enabled in ExecutorConfig"),
                       ("return_context_logits", "Return context logit need to build engine with gather_context")):
        [(_, error, _)] = stream(plain_server.grpc_url, "tensorrt_llm", tensors([ids], 4, **{flag: True}))
        assert error is not None and text in error.message() and "Executor failed process requestId" in error.message()


def test_too_many_tokens_are_shortened_not_refused(plain_server: Any, deployed: Deployed, tokenizer: Any) -> None:
    """LR LlmRequest::validate: prompt + request_output_len + draft tokens per step > max_seq_len shortens
    request_output_len with a logged warning; the request runs (no end_id: it runs to the new length)."""
    info = read_engine_info(engine_dir(deployed.specs["none"], "target"))
    ids = prompt_ids(tokenizer, PROMPTS[2])
    [(result, error, _)] = stream(plain_server.grpc_url, "tensorrt_llm",
                                  tensors([ids], 1000, exclude_input_in_output=True))
    assert error is None
    assert len(tokens(result)) == info.max_seq_len - len(ids) - info.max_draft_len
    log = plain_server.log_file.read_text(errors="replace")
    assert f"Number of requested output tokens is changed to ({info.max_seq_len - len(ids) - info.max_draft_len})" \
        in log


def test_the_stop_command_ends_a_running_request(plain_server: Any, tokenizer: Any) -> None:
    """MIS handleStopRequest: a request with stop=true and the same request id (what the BLS and
    inflight_batcher_llm_client.py --stop-after-ms send: input_ids [1,1], input_lengths [[0]],
    request_output_len [[0]]) cancels the running request and gets an empty final response; EX: the stopped
    request ends with a final response."""
    ids = prompt_ids(tokenizer, PROMPTS[3])
    client = grpcclient.InferenceServerClient(plain_server.grpc_url)
    responses: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        client.async_stream_infer("tensorrt_llm", _grpc_inputs(tensors([ids], 250, streaming=True)),
                                  request_id="stop-me", enable_empty_final_response=True)
        first, error = responses.get(timeout=120)
        assert error is None and len(tokens(first)) == 1
        stop = tensors([[ids[0]]], 0, stop=True)
        stop["input_lengths"][:] = 0
        [(ack, ack_error, ack_final)] = stream(plain_server.grpc_url, "tensorrt_llm", stop, request_id="stop-me")
        assert ack_error is None and ack_final and present(ack) == set()
        count = 1
        while True:
            result, error = responses.get(timeout=120)
            assert error is None
            count += len(tokens(result)) if result.as_numpy("output_ids") is not None else 0
            if result.get_response(as_json=True)["parameters"]["triton_final_response"]["bool_param"]:
                break
        assert count < 250
    finally:
        client.stop_stream()
        client.close()
    [(_, error, _)] = stream(plain_server.grpc_url, "tensorrt_llm", stop)
    assert error is not None and "Trying to stop a request but request ID is not provided" in error.message()


def test_a_cancelled_client_frees_the_engine(plain_server: Any, deployed: Deployed, tokenizer: Any,
                                             greedy_outputs: dict[str, Greedy]) -> None:
    """MIS WaitForCancel: a cancelled client's request is cancelled at the next check
    (cancellation_check_period_ms, 100), so the next request waits far less than the cancelled one would still
    have run (server-side times from the perf metrics)."""
    ids = prompt_ids(tokenizer, PROMPTS[0])
    info = read_engine_info(engine_dir(deployed.specs["none"], "target"))
    allowed = info.max_seq_len - len(ids) - info.max_draft_len
    perf = ["output_ids", "sequence_length", "arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns",
            "last_token_time_ns"]
    [(timed, error, _)] = stream(plain_server.grpc_url, "tensorrt_llm", tensors([ids], 41, return_perf_metrics=True),
                                 perf)
    assert error is None
    first, last = (int(timed.as_numpy(f"{n}_token_time_ns")[0, 0]) for n in ("first", "last"))
    per_token = (last - first) / 40
    client = grpcclient.InferenceServerClient(plain_server.grpc_url)
    responses: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    client.async_stream_infer("tensorrt_llm", _grpc_inputs(tensors([ids], 1000, streaming=True)),
                              enable_empty_final_response=True)
    for _ in range(2):
        responses.get(timeout=120)
    client.stop_stream(cancel_requests=True)
    client.close()
    [(result, error, _)] = stream(plain_server.grpc_url, "tensorrt_llm",
                                  tensors([ids], MAX_TOKENS, end_id=tokenizer.eos_token_id, return_perf_metrics=True),
                                  perf)
    assert error is None and tokens(result) == ids + greedy_outputs[PROMPTS[0]].ids
    waited = int(result.as_numpy("first_scheduled_time_ns")[0, 0]) - int(result.as_numpy("arrival_time_ns")[0, 0])
    assert waited < 0.5 * (allowed - 2) * per_token, (waited, per_token)


def test_batch_rows_answer_separately_with_one_final_flag(plain_server: Any, tokenizer: Any,
                                                          greedy_outputs: dict[str, Greedy]) -> None:
    """UC splitBatchInputsTensors: each row its own request (input_ids cut to input_lengths); MIS: batch_index
    for batch > 1, COMPLETE_FINAL only on the last row's final response."""
    prompts = [PROMPTS[1], PROMPTS[3]]
    rows = [prompt_ids(tokenizer, p) for p in prompts]
    responses = stream(plain_server.grpc_url, "tensorrt_llm",
                       tensors(rows, MAX_TOKENS, end_id=tokenizer.eos_token_id, exclude_input_in_output=True))
    assert [final for _, _, final in responses] == [False, True]
    by_row = {int(r.as_numpy("batch_index")[0, 0]): tokens(r) for r, _, _ in responses}
    assert by_row == {0: greedy_outputs[prompts[0]].ids, 1: greedy_outputs[prompts[1]].ids}


# -- Medusa (decoupled) ----------------------------------------------------------------------------------------


def test_medusa_speculates_at_nvidias_default_temperature(medusa_server: Any, tokenizer: Any,
                                                          greedy_outputs: dict[str, Greedy]) -> None:
    """medusaDecodingLayer.cpp: Medusa draws each node's token by top-K with the request's runtime_top_k (1 when
    unset) and DecodingMode::Medusa applies no temperature, so end_to_end_grpc_client.py's temperature [[1.0]]
    without top_k still speculates and gives the greedy tokens; a top_k > 1 samples and speculates too.
    total_draft_tokens > 0 is TensorRT-LLM's own sign of speculation (llmRequest.h)."""
    outputs = ["output_ids", "sequence_length", "total_draft_tokens", "total_accepted_draft_tokens"]
    accepted = 0
    for prompt in PROMPTS[:2]:
        ids = prompt_ids(tokenizer, prompt)
        [(result, error, _)] = stream(medusa_server.grpc_url, "tensorrt_llm",
                                      tensors([ids], MAX_TOKENS, end_id=tokenizer.eos_token_id,
                                              temperature=np.array([[1.0]], dtype=np.float32),
                                              return_perf_metrics=True), outputs)
        assert error is None
        assert tokens(result) == ids + greedy_outputs[prompt].ids
        assert result.as_numpy("total_draft_tokens")[0, 0] > 0
        accepted += int(result.as_numpy("total_accepted_draft_tokens")[0, 0])
    assert accepted > 0  # the trained heads' guesses were taken
    ids = prompt_ids(tokenizer, PROMPTS[0])
    [(result, error, _)] = stream(medusa_server.grpc_url, "tensorrt_llm",
                                  tensors([ids], 16, temperature=np.array([[1.0]], dtype=np.float32),
                                          runtime_top_k=np.array([[5]], dtype=np.int32), return_perf_metrics=True),
                                  outputs)
    assert error is None and len(tokens(result)) == len(ids) + 16
    assert result.as_numpy("total_draft_tokens")[0, 0] > 0


# -- draft-target (non-decoupled LLM models) ---------------------------------------------------------------------


def test_a_non_decoupled_model_refuses_batches_and_streaming(dt_server: Any, tokenizer: Any) -> None:
    """UC createRequestsFromInputTensors: "Batch size > 1 requires the tensorrt_llm backend to be using
    decoupled transaction policy" and "Streaming is only supported if model is deployed using decoupled
    mode."."""
    client = grpcclient.InferenceServerClient(dt_server.grpc_url)
    ids = prompt_ids(tokenizer, PROMPTS[0])
    with pytest.raises(InferenceServerException, match="Batch size > 1 requires the tensorrt_llm backend"):
        client.infer("tensorrt_llm", _grpc_inputs(tensors([ids, ids], 4)))
    with pytest.raises(InferenceServerException, match="Streaming is only supported if model is deployed using"):
        client.infer("tensorrt_llm", _grpc_inputs(tensors([ids], 4, streaming=True)))
    client.close()


def test_a_stop_command_reaches_a_running_request_of_a_non_decoupled_model(dt_server: Any, deployed: Deployed,
                                                                           tokenizer: Any) -> None:
    """MIS enqueue: the C++ backend's execute only enqueues, decoupled or not, so a unary stop request under the
    same request id (inflight_batcher_llm_client.py --stop-after-ms, unary) cancels a running unary request,
    which answers with the tokens so far; the stop request's response is empty (MIS handleStopRequest)."""
    ids = prompt_ids(tokenizer, PROMPTS[2])
    info = read_engine_info(engine_dir(deployed.specs["draft_target"], "target"))
    allowed = info.max_seq_len - len(ids) - info.max_draft_len  # what request_output_len 1000 is shortened to
    client = grpcclient.InferenceServerClient(dt_server.grpc_url)
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.async_infer("tensorrt_llm", _grpc_inputs(tensors([ids], 1000, exclude_input_in_output=True)),
                       callback=lambda result, error: results.put((result, error)), request_id="unary-stop")
    time.sleep(0.05)
    stop = tensors([[ids[0]]], 0, stop=True)
    stop["input_lengths"][:] = 0
    ack = client.infer("tensorrt_llm", _grpc_inputs(stop), request_id="unary-stop")
    assert ack.get_response(as_json=True).get("outputs", []) == []
    result, error = results.get(timeout=120)
    client.close()
    assert error is None and 0 < len(tokens(result)) < allowed


def _http_infer(url: str, model: str, values: dict[str, np.ndarray], outputs: list[str]) -> Any:
    client = httpclient.InferenceServerClient(url)
    inputs = []
    for name, value in values.items():
        tensor = httpclient.InferInput(name, list(value.shape), np_to_triton_dtype(value.dtype))
        tensor.set_data_from_numpy(value)
        inputs.append(tensor)
    try:
        return client.infer(model, inputs, outputs=[httpclient.InferRequestedOutput(n) for n in outputs])
    finally:
        client.close()


def test_the_target_verifies_drafts_then_decodes_to_request_output_len(
        dt_server: Any, tokenizer: Any, greedy_outputs: dict[str, Greedy]) -> None:
    """UC getExternalDraftTokensConfigFromTensors: draft_input_ids [1, n] add draft tokens to the request's first
    step, which still runs to request_output_len; llmRequest.h updateNumTokensPerIteration: total_draft_tokens
    += n, total_accepted_draft_tokens += new tokens - 1 (over HTTP, as e2e_grpc_speculative_decoding_client.py's
    unary calls)."""
    prompt = PROMPTS[1]
    ids, expected = prompt_ids(tokenizer, prompt), greedy_outputs[prompt].ids
    drafts = np.array([[expected[0], expected[1], (expected[2] + 1) % 2048]], dtype=np.int32)
    result = _http_infer(dt_server.http_url, "tensorrt_llm",
                         tensors([ids], 6, draft_input_ids=drafts, return_perf_metrics=True,
                                 end_id=tokenizer.eos_token_id),
                         ["output_ids", "sequence_length", "total_draft_tokens", "total_accepted_draft_tokens"])
    assert result.as_numpy("output_ids").reshape(-1).tolist() == ids + expected[:6]
    assert result.as_numpy("total_draft_tokens").tolist() == [[3]]
    assert result.as_numpy("total_accepted_draft_tokens").tolist() == [[2]]


def test_limits_and_logits_of_the_draft_target_models(dt_server: Any, deployed: Deployed, tokenizer: Any) -> None:
    """LR LlmRequest::validate: "Prompt length (%d) exceeds maximum input length (%d). ..." wrapped by EX
    ("Encountered an error when fetching new request: ") and MIS ("Executor failed process requestId ...");
    EX: the draft engine (built without gather_generation_logits) refuses return_generation_logits."""
    info = read_engine_info(engine_dir(deployed.specs["draft_target"], "target"))
    long = [ids % 2000 + 3 for ids in range(info.max_input_len + 1)]
    with pytest.raises(InferenceServerException) as failure:
        _http_infer(dt_server.http_url, "tensorrt_llm", tensors([long], 4), ["output_ids", "sequence_length"])
    message = str(failure.value)
    assert "Executor failed process requestId" in message and "Encountered an error when fetching new request: " \
        f"Prompt length ({info.max_input_len + 1}) exceeds maximum input length ({info.max_input_len})" in message
    ids = prompt_ids(tokenizer, PROMPTS[0])
    with pytest.raises(InferenceServerException, match="gather_generation_logits must be enabled"):
        _http_infer(dt_server.http_url, "tensorrt_llm_draft", tensors([ids], 4, return_generation_logits=True),
                    ["output_ids", "sequence_length", "generation_logits"])
