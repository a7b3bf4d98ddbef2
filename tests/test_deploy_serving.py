"""Deployed repositories served by a real tritonserver, driven by real tritonclient and HTTP clients.

Draft-target goes through tensorrt_llm_bls, Medusa through the ensemble; greedy text must equal plain greedy
generation of the target outside Triton, streamed or not, over gRPC and HTTP generate/generate_stream. As with the
TensorRT-LLM backend (exclude_input_in_output false by default), a whole answer starts with the prompt, a stream
sends the new text only (`whole`, `streamed`).
"""

from __future__ import annotations

import json
import queue
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import np_to_triton_dtype

from specbuild.errors import SpecbuildError
from tests.deploy_fixtures import (
    MAX_TOKENS,
    PROMPTS,
    Deployed,
    Greedy,
    http_generate,
    http_generate_stream,
    http_post,
    stop_phrase,
)

pytestmark = [pytest.mark.slow, pytest.mark.tritonserver]


# -- clients -------------------------------------------------------------------------------------------------


def _input(name: str, value: np.ndarray) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(value.shape), np_to_triton_dtype(value.dtype))
    tensor.set_data_from_numpy(value)
    return tensor


def grpc_generate(url: str, model: str, prompts: list[str], max_tokens: int = MAX_TOKENS, *, stream: bool,
                  on_response: Callable[[], None] | None = None,
                  **extra: np.ndarray) -> tuple[list[list[str]], list[dict[str, Any]]]:
    """One request (batch = len(prompts)) over the gRPC stream RPC: text chunks per batch row, and the outputs
    of every response (`on_response` is called as each one with text arrives). Raises RuntimeError with Triton's
    message on an error response."""
    inputs = [
        _input("text_input", np.array([[p] for p in prompts], dtype=object)),
        _input("max_tokens", np.full((len(prompts), 1), max_tokens, dtype=np.int32)),
        _input("stream", np.full((len(prompts), 1), stream, dtype=bool)),
        *(_input(name, value) for name, value in extra.items()),
    ]
    responses: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        client.async_stream_infer(model, inputs, enable_empty_final_response=True)
        chunks: list[list[str]] = [[] for _ in prompts]
        outputs = []
        while True:
            result, error = responses.get(timeout=120)
            if error is not None:
                raise RuntimeError(str(error))
            text = result.as_numpy("text_output")
            if text is not None:
                index = result.as_numpy("batch_index")
                rows = index.reshape(-1).tolist() if index is not None and text.shape[0] == 1 else range(len(text))
                for row, value in zip(rows, text.reshape(len(text), -1)[:, 0], strict=True):
                    chunks[row].append(value.decode("utf-8"))
                outputs.append({out.name: result.as_numpy(out.name) for out in result.get_response().outputs})
                if on_response is not None:
                    on_response()
            if result.get_response(as_json=True)["parameters"]["triton_final_response"]["bool_param"]:
                return chunks, outputs
    finally:
        client.stop_stream()
        client.close()




def whole(greedy_reference: dict[str, str], prompt: str) -> str:
    """A non-streamed answer: the prompt, then the target's greedy completion."""
    return prompt + greedy_reference[prompt]


def expected(greedy_reference: dict[str, str], prompt: str, stream: bool) -> str:
    return greedy_reference[prompt] if stream else whole(greedy_reference, prompt)


PERF = {"return_perf_metrics": np.array([[True]])}
"""Ask for the acceptance counts: the backend returns its perf metrics only then."""


# -- draft-target through the BLS ----------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_bls_grpc_equals_plain_greedy(dt_server: Any, greedy_reference: dict[str, str], stream: bool) -> None:
    drafted = 0
    for prompt in PROMPTS:
        chunks, outputs = grpc_generate(dt_server.grpc_url, "tensorrt_llm_bls", [prompt], stream=stream)
        assert "".join(chunks[0]) == expected(greedy_reference, prompt, stream), prompt
        if stream and len(greedy_reference[prompt]) > 10:
            assert len(chunks[0]) > 1  # one response per speculation round, not one at the end
        else:
            assert len(chunks[0]) == 1 or stream
        drafted += int(outputs[-1]["total_draft_tokens"].reshape(-1)[0])
        accepted = int(outputs[-1]["total_accepted_draft_tokens"].reshape(-1)[0])
        assert 0 <= accepted <= int(outputs[-1]["total_draft_tokens"].reshape(-1)[0])
    assert drafted > 0  # the draft really proposed tokens


def test_bls_http_generate_and_generate_stream(dt_server: Any, greedy_reference: dict[str, str]) -> None:
    for prompt in PROMPTS[:3]:
        data = http_generate(dt_server.http_url, "tensorrt_llm_bls", prompt)
        assert data["text_output"] == whole(greedy_reference, prompt)
        assert 0.0 <= data["acceptance_rate"] <= 1.0 and data["total_draft_tokens"] > 0
        events = http_generate_stream(dt_server.http_url, "tensorrt_llm_bls", prompt)
        assert "".join(e["text_output"] for e in events) == greedy_reference[prompt]


@pytest.mark.parametrize("stream", [False, True])
def test_bls_batch_of_prompts(dt_server: Any, greedy_reference: dict[str, str], stream: bool) -> None:
    prompts = [PROMPTS[0], PROMPTS[2]]
    chunks, _ = grpc_generate(dt_server.grpc_url, "tensorrt_llm_bls", prompts, stream=stream)
    assert ["".join(c) for c in chunks] == [expected(greedy_reference, p, stream) for p in prompts]


def test_bls_without_speculation_gives_the_same_text(dt_server: Any, greedy_reference: dict[str, str]) -> None:
    prompt = PROMPTS[1]
    chunks, outputs = grpc_generate(dt_server.grpc_url, "tensorrt_llm_bls", [prompt], stream=False,
                                    num_draft_tokens=np.array([[0]], dtype=np.int32))
    assert "".join(chunks[0]) == whole(greedy_reference, prompt)
    assert int(outputs[-1]["total_draft_tokens"].reshape(-1)[0]) == 0


BAD_REQUESTS = [
    ("empty prompt", [""], {}, "empty"),
    ("prompt longer than the engine's max_input_len", ["word " * 300], {}, "Prompt length .* exceeds maximum input"),
    ("max_tokens 0", [PROMPTS[0]], {"max_tokens": 0}, "max_tokens must be a single value > 0"),
    ("max_tokens negative", [PROMPTS[0]], {"max_tokens": -3}, "max_tokens must be a single value > 0"),
    ("num_draft_tokens above max_draft_len", [PROMPTS[0]], {"num_draft_tokens": np.array([[9]], dtype=np.int32)},
     "num_draft_tokens"),
]


@pytest.mark.parametrize(("what", "prompts", "extra", "message"), BAD_REQUESTS, ids=[b[0] for b in BAD_REQUESTS])
def test_bls_bad_request_is_an_error_and_the_server_keeps_serving(
    dt_server: Any, greedy_reference: dict[str, str], what: str, prompts: list[str], extra: dict[str, Any],
    message: str,
) -> None:
    kwargs = dict(extra)
    max_tokens = kwargs.pop("max_tokens", MAX_TOKENS)
    with pytest.raises(RuntimeError, match=message):
        grpc_generate(dt_server.grpc_url, "tensorrt_llm_bls", prompts, max_tokens, stream=True, **kwargs)
    chunks, _ = grpc_generate(dt_server.grpc_url, "tensorrt_llm_bls", [PROMPTS[0]], stream=True)
    assert "".join(chunks[0]) == greedy_reference[PROMPTS[0]]


def test_max_tokens_past_the_engine_is_shortened_not_refused(dt_server: Any, medusa_server: Any,
                                                             greedy_reference: dict[str, str]) -> None:
    """TensorRT-LLM's LlmRequest::validate shortens an over-long request_output_len with a warning (the demo
    engines take 64 new tokens; 500 asks for more than the whole sequence holds)."""
    for server, model in ((dt_server, "tensorrt_llm_bls"), (medusa_server, "ensemble")):
        text = http_generate(server.http_url, model, PROMPTS[0], max_tokens=500)["text_output"]
        assert text.startswith(whole(greedy_reference, PROMPTS[0])), model


def test_wrong_data_types_are_refused_by_triton(dt_server: Any, greedy_reference: dict[str, str]) -> None:
    client = grpcclient.InferenceServerClient(dt_server.grpc_url)
    responses: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    client.async_stream_infer("tensorrt_llm_bls", [_input("text_input", np.array([["hi"]], dtype=object)),
                                                   _input("max_tokens", np.array([[8.0]], dtype=np.float32))])
    _, error = responses.get(timeout=60)
    client.stop_stream()
    assert error is not None and "data-type" in str(error).lower().replace("datatype", "data-type")
    status, body = http_post(dt_server.http_url, "/v2/models/tensorrt_llm_bls/generate",
                             {"text_input": "hi", "max_tokens": "eight"})
    assert status >= 400 and "error" in json.loads(body)
    assert http_generate(dt_server.http_url, "tensorrt_llm_bls", PROMPTS[0])["text_output"] == \
        whole(greedy_reference, PROMPTS[0])


def test_sixteen_concurrent_streaming_clients(dt_server: Any, greedy_reference: dict[str, str]) -> None:
    results: dict[int, str] = {}
    errors: list[BaseException] = []

    def client(i: int) -> None:
        try:
            chunks, _ = grpc_generate(dt_server.grpc_url, "tensorrt_llm_bls", [PROMPTS[i % len(PROMPTS)]],
                                      stream=True)
            results[i] = "".join(chunks[0])
        except BaseException as err:  # reported below
            errors.append(err)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not errors, errors
    assert {i: results.get(i) for i in range(16)} == {i: greedy_reference[PROMPTS[i % len(PROMPTS)]]
                                                       for i in range(16)}


def test_models_that_fail_to_load_are_named(deployed: Deployed, tmp_path: Path) -> None:
    """A misspelt draft model name in the BLS parameters, and a draft engine that is not there: the server does
    not start, and the error names each failing model and what is wrong with it."""
    from specbuild.serve.server import TritonServer

    broken = tmp_path / "repo"
    shutil.copytree(deployed.repository("draft_target"), broken)
    bls = broken / "tensorrt_llm_bls" / "config.pbtxt"
    bls.write_text(bls.read_text().replace('"tensorrt_llm_draft"', '"tensorrt_llm_drfat"'))
    draft = broken / "tensorrt_llm_draft" / "config.pbtxt"
    engine = str((deployed.specs["draft_target"].output_dir / "engines" / "draft").resolve())
    draft.write_text(draft.read_text().replace(engine, str(tmp_path / "no-such-engine")))
    with pytest.raises(SpecbuildError) as failure, TritonServer(broken, log_file=tmp_path / "log", ready_timeout_s=300):
        pass
    message = str(failure.value)
    assert "tensorrt_llm_bls" in message and "tensorrt_llm_draft_model_name" in message, message
    assert "tensorrt_llm_draft" in message and "no-such-engine" in message, message


# -- Medusa through the ensemble -----------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_medusa_ensemble_grpc_equals_plain_greedy(medusa_server: Any, greedy_reference: dict[str, str],
                                                  stream: bool) -> None:
    accepted = 0
    for prompt in PROMPTS:
        chunks, outputs = grpc_generate(medusa_server.grpc_url, "ensemble", [prompt], stream=stream, **PERF)
        assert "".join(chunks[0]) == expected(greedy_reference, prompt, stream), prompt
        assert len(chunks[0]) == 1 or (stream and len(chunks[0]) > 1)
        accepted += int(outputs[-1]["total_accepted_draft_tokens"].reshape(-1)[0])
    assert accepted > 0  # the heads' guesses were accepted: Medusa really ran


def test_medusa_ensemble_http_generate_and_generate_stream(medusa_server: Any,
                                                           greedy_reference: dict[str, str]) -> None:
    for prompt in PROMPTS[:3]:
        assert http_generate(medusa_server.http_url, "ensemble", prompt)["text_output"] == whole(greedy_reference,
                                                                                                 prompt)
        events = http_generate_stream(medusa_server.http_url, "ensemble", prompt)
        assert len(events) > 1
        assert "".join(e["text_output"] for e in events) == greedy_reference[prompt]


def test_medusa_bad_requests_then_a_good_one(medusa_server: Any, greedy_reference: dict[str, str]) -> None:
    for prompt, max_tokens in (("", MAX_TOKENS), ("word " * 300, MAX_TOKENS), (PROMPTS[0], 0)):
        status, body = http_post(medusa_server.http_url, "/v2/models/ensemble/generate",
                                 {"text_input": prompt, "max_tokens": max_tokens})
        assert status >= 400 and "error" in json.loads(body), body
    assert http_generate(medusa_server.http_url, "ensemble", PROMPTS[0])["text_output"] == whole(greedy_reference,
                                                                                               PROMPTS[0])


def test_medusa_sixteen_concurrent_streaming_clients(medusa_server: Any, greedy_reference: dict[str, str]) -> None:
    results: dict[int, str] = {}

    def client(i: int) -> None:
        chunks, _ = grpc_generate(medusa_server.grpc_url, "ensemble", [PROMPTS[i % len(PROMPTS)]], stream=True)
        results[i] = "".join(chunks[0])

    threads = [threading.Thread(target=client, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert results == {i: greedy_reference[PROMPTS[i % len(PROMPTS)]] for i in range(16)}


def test_stop_words_end_the_text(dt_server: Any, medusa_server: Any, deployed: Deployed,
                                 greedy_outputs: dict[str, Greedy]) -> None:
    """The stop phrase is taken from the target's own greedy answer in this run: the text ends with the phrase's
    first occurrence, which stays in the output as TensorRT-LLM's stop criterion keeps it (stopCriteriaKernels:
    the sequence length is updated "up to stopped word (including)"), for the BLS and the Medusa ensemble."""
    from specbuild.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(deployed.tokenizer_dir)
    prompt = PROMPTS[0]
    greedy = greedy_outputs[prompt]
    phrase, first = stop_phrase(tokenizer, greedy.ids)
    length = len(tokenizer.encode(phrase, add_special_tokens=False))
    expected_text = prompt + tokenizer.decode(greedy.ids[: first + length], skip_special_tokens=True)
    for server, model in ((dt_server, "tensorrt_llm_bls"), (medusa_server, "ensemble")):
        text = http_generate(server.http_url, model, prompt, stop_words=[phrase])["text_output"]
        assert text == expected_text, (model, phrase, text)


def test_sampling_with_draft_logits_returns_text(dt_server: Any) -> None:
    # top_k makes it sample: TensorRT-LLM decodes greedily when neither top_k nor top_p is set
    data = http_generate(dt_server.http_url, "tensorrt_llm_bls", PROMPTS[1], temperature=0.8, top_k=20, seed=7,
                         use_draft_logits=True)
    assert data["text_output"] and data["total_draft_tokens"] > 0
    again = http_generate(dt_server.http_url, "tensorrt_llm_bls", PROMPTS[1], temperature=0.8, top_k=20, seed=7,
                          use_draft_logits=True)
    assert again["text_output"] == data["text_output"]  # a seeded request is reproducible


@pytest.mark.parametrize("stream", [False, True])
def test_medusa_batch_of_prompts(medusa_server: Any, greedy_reference: dict[str, str], stream: bool) -> None:
    prompts = [PROMPTS[1], PROMPTS[3]]
    chunks, _ = grpc_generate(medusa_server.grpc_url, "ensemble", prompts, stream=stream)
    assert ["".join(c) for c in chunks] == [expected(greedy_reference, p, stream) for p in prompts]


def test_a_streamed_draft_round_to_the_decoupled_target_ends_with_a_final_response(medusa_server: Any) -> None:
    """draft_input_ids sent to the streaming target itself: the drafts speed up its first step and it decodes on
    to request_output_len (TensorRT-LLM's external draft tokens), then the stream's final response comes."""
    client = grpcclient.InferenceServerClient(medusa_server.grpc_url)
    responses: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        client.async_stream_infer("tensorrt_llm", [
            _input("input_ids", np.array([[5, 6, 7]], dtype=np.int32)),
            _input("input_lengths", np.array([[3]], dtype=np.int32)),
            _input("request_output_len", np.array([[16]], dtype=np.int32)),
            _input("draft_input_ids", np.array([[8, 9]], dtype=np.int32)),
            _input("streaming", np.array([[True]]))], enable_empty_final_response=True)
        tokens: list[int] = []
        while True:
            result, error = responses.get(timeout=60)
            assert error is None, error
            ids = result.as_numpy("output_ids")
            if ids is not None:
                tokens += ids.reshape(-1)[: int(result.as_numpy("sequence_length").reshape(-1)[0])].tolist()
            if result.get_response(as_json=True)["parameters"]["triton_final_response"]["bool_param"]:
                break
        assert 1 <= len(tokens) <= 16
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()


def test_a_cancelled_stream_leaves_the_server_serving(dt_server: Any, greedy_reference: dict[str, str]) -> None:
    client = grpcclient.InferenceServerClient(dt_server.grpc_url)
    responses: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    client.async_stream_infer("tensorrt_llm_bls", [
        _input("text_input", np.array([[PROMPTS[0]]], dtype=object)),
        _input("max_tokens", np.array([[64]], dtype=np.int32)),
        _input("stream", np.array([[True]]))])
    result, error = responses.get(timeout=60)
    assert error is None and result.as_numpy("text_output") is not None
    client.stop_stream(cancel_requests=True)
    client.close()
    chunks, _ = grpc_generate(dt_server.grpc_url, "tensorrt_llm_bls", [PROMPTS[1]], stream=True)
    assert "".join(chunks[0]) == greedy_reference[PROMPTS[1]]


def test_draft_target_repository_ensemble_serves_the_plain_target(dt_server: Any,
                                                                  greedy_reference: dict[str, str]) -> None:
    """Its ensemble runs the target without speculation (the LLM models stay non-decoupled for the BLS), so it
    answers /generate but refuses to stream, with a message that says why."""
    prompt = PROMPTS[3]
    assert http_generate(dt_server.http_url, "ensemble", prompt)["text_output"] == whole(greedy_reference, prompt)
    _, body = http_post(dt_server.http_url, "/v2/models/ensemble/generate_stream",
                        {"text_input": prompt, "max_tokens": 8, "stream": True})
    assert "decoupled" in body.decode()


def test_concurrent_requests_share_the_engines_steps(plain_server: Any, greedy_reference: dict[str, str]) -> None:
    """In-flight batching, seen from outside: four streams at once are all generating at the same time (each
    one's first token comes before any one's last, by the backend's own perf timestamps), not one after another,
    and each still gets the target's greedy text."""
    results: dict[int, tuple[str, dict[str, Any]]] = {}

    def client(i: int) -> None:
        chunks, outputs = grpc_generate(plain_server.grpc_url, "ensemble", [PROMPTS[i]], stream=True, **PERF)
        results[i] = ("".join(chunks[0]), outputs[-1])

    threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert {i: text for i, (text, _) in results.items()} == {i: greedy_reference[PROMPTS[i]] for i in range(4)}
    first = [int(out["first_token_time_ns"].reshape(-1)[0]) for _, out in results.values()]
    last = [int(out["last_token_time_ns"].reshape(-1)[0]) for _, out in results.values()]
    assert max(first) < min(last), "a request finished before another had its first token: served one by one"


# -- nothing decoupled (TensorRT-LLM's own recipes) ---------------------------------------------------------


def test_a_non_decoupled_bls_serves_concurrent_unary_requests(unary_server: Any,
                                                              greedy_reference: dict[str, str]) -> None:
    """HTTP /generate to a non-decoupled BLS, eight at once: one instance serves them side by side (each on a
    thread of its own, answering through its response sender), every answer the prompt plus the greedy text."""
    answers: dict[int, str] = {}

    def ask(i: int) -> None:
        answers[i] = http_generate(unary_server.http_url, "tensorrt_llm_bls", PROMPTS[i % len(PROMPTS)])["text_output"]

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert answers == {i: whole(greedy_reference, PROMPTS[i % len(PROMPTS)]) for i in range(8)}


def test_nvidias_end_to_end_test_with_the_bls(unary_server: Any) -> None:
    """tools/inflight_batcher_llm/end_to_end_test.py --test-bls (tensorrtllm_backend @c2e65b88): the manual
    preprocessing -> tensorrt_llm -> postprocessing chain, the ensemble and the BLS give the same text over
    unary HTTP infer, which needs a repository without decoupled models."""
    from tests.nvidia_clients import end_to_end_test_functionality

    cases = end_to_end_test_functionality(unary_server.http_url, list(PROMPTS[:2]), [MAX_TOKENS, MAX_TOKENS],
                                          test_bls=True)
    assert len(cases) == 2  # the script's own comparisons raise on a mismatch; here they are checked again
    for case in cases:
        assert case.bls_output is not None and case.chain_output.tolist() == case.ensemble_output.tolist() \
            == case.bls_output.tolist()
        assert case.chain_output[0].decode("utf-8").startswith(case.prompt)
