"""tensorrt_llm_bls, preprocessing and postprocessing against NVIDIA's contract, through a real tritonserver.

The BLS is in every repository (draft-target, Medusa, plain) and answers as NVIDIA's BLS does
(NVIDIA/TensorRT-LLM `triton_backend/all_models/inflight_batcher_llm/tensorrt_llm_bls/1/model.py` @0ef1f21e,
`lib/decode.py` @4db68284, `lib/triton_decoder.py` @07f3e442): its text is what postprocessing makes of the LLM's
output_ids, so the prompt leads it unless excluded, exactly as the ensemble's text for the same request; every
input of NVIDIA's BLS is accepted. A fact's "§n" / "contract §n" names the upstream file it was read from, as
listed in tests/test_nvidia_clients.py's docstring (§1 the config.pbtxt templates, §2 the C++ backend's
model_instance_state.cc, §3 the Python models, §4 NVIDIA's client scripts). Expected texts come from the
target's own greedy output in this run (`greedy_outputs`), never written down: the demo weights differ per
machine.
"""

from __future__ import annotations

import queue
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import np_to_triton_dtype

from tests.deploy_fixtures import (
    MAX_TOKENS,
    PROMPTS,
    Deployed,
    Greedy,
    http_generate,
    http_generate_stream,
    stop_phrase,
)

pytestmark = [pytest.mark.slow, pytest.mark.tritonserver]

SERVERS = ("dt_server", "medusa_server", "plain_server")


@pytest.fixture(scope="module")
def tokenizer(deployed: Deployed) -> Any:
    from specbuild.tokenizer import load_tokenizer

    return load_tokenizer(deployed.tokenizer_dir)


def with_prompt(tokenizer: Any, prompt: str, greedy: Greedy) -> str:
    """The text of output_ids = prompt ids + generated ids (exclude_input_in_output false), as postprocessing
    decodes it (§3.2: no prompt stripping)."""
    return tokenizer.decode(tokenizer.encode(prompt, add_special_tokens=True) + greedy.ids, skip_special_tokens=True)


# -- clients -----------------------------------------------------------------------------------------------


def _input(name: str, value: np.ndarray) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(value.shape), np_to_triton_dtype(value.dtype))
    tensor.set_data_from_numpy(value)
    return tensor


def stream_call(url: str, model: str, inputs: dict[str, np.ndarray],
                outputs: list[str] | None = None) -> list[dict[str, np.ndarray]]:
    """One request over the gRPC stream RPC (as NVIDIA's end_to_end_grpc_client.py sends every request): the
    outputs of each response that has any. Raises RuntimeError with Triton's message on an error."""
    responses: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        requested = [grpcclient.InferRequestedOutput(name) for name in outputs] if outputs else None
        client.async_stream_infer(model, [_input(k, v) for k, v in inputs.items()], outputs=requested,
                                  enable_empty_final_response=True)
        answers = []
        while True:
            result, error = responses.get(timeout=180)
            if error is not None:
                raise RuntimeError(str(error))
            body = result.get_response(as_json=True)
            names = [o["name"] for o in body.get("outputs", [])]
            if names:
                answers.append({name: result.as_numpy(name) for name in names})
            if body["parameters"]["triton_final_response"]["bool_param"]:
                return answers
    finally:
        client.stop_stream()
        client.close()


def text_request(prompts: list[str], max_tokens: int = MAX_TOKENS, **extra: Any) -> dict[str, np.ndarray]:
    inputs = {"text_input": np.array([[p] for p in prompts], dtype=object),
              "max_tokens": np.full((len(prompts), 1), max_tokens, dtype=np.int32)}
    return {**inputs, **extra}


def texts_by_row(answers: list[dict[str, np.ndarray]], rows: int) -> list[str]:
    """Each row's text, chunks joined; a response covering several rows holds their texts in order, one
    covering one row of a batch says which by batch_index."""
    out = [""] * rows
    for answer in answers:
        text = answer.get("text_output")
        if text is None:
            continue
        assert text.ndim == 1, text.shape  # NVIDIA's clients read text_output[0].decode("utf-8") (§4)
        index = answer.get("batch_index")
        targets = [int(index.reshape(-1)[0])] if index is not None and len(text) == 1 and rows > 1 else \
            range(len(text))
        for row, value in zip(targets, text, strict=True):
            out[row] += value.decode("utf-8")
    return out


def generate(url: str, model: str, prompts: list[str], *, stream: bool = False, **extra: Any) -> list[str]:
    inputs = text_request(prompts, stream=np.full((len(prompts), 1), stream), **extra)
    return texts_by_row(stream_call(url, model, inputs), len(prompts))


def http_text(url: str, model: str, prompt: str, **fields: Any) -> str:
    return http_generate(url, model, prompt, **fields)["text_output"]


def http_stream_text(url: str, model: str, prompt: str) -> str:
    return "".join(e.get("text_output", "") for e in http_generate_stream(url, model, prompt))


# -- the BLS's text ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("server_name", SERVERS)
def test_bls_text_leads_with_the_prompt_and_equals_the_ensembles(
        request: pytest.FixtureRequest, server_name: str, tokenizer: Any, greedy_outputs: dict[str, Greedy]) -> None:
    """exclude_input_in_output defaults to false (the backend's default, contract §1.1): output_ids hold the
    prompt, and NVIDIA's BLS returns postprocessing's text of them (triton_decoder.py `_get_response`), as the
    ensemble does; over gRPC and over HTTP /generate (README: the sample text_output starts with the prompt)."""
    server = request.getfixturevalue(server_name)
    for prompt in PROMPTS:
        expected = with_prompt(tokenizer, prompt, greedy_outputs[prompt])
        assert generate(server.grpc_url, "tensorrt_llm_bls", [prompt]) == [expected], prompt
        assert generate(server.grpc_url, "ensemble", [prompt]) == [expected], prompt
    for prompt in PROMPTS[:2]:
        expected = with_prompt(tokenizer, prompt, greedy_outputs[prompt])
        assert http_text(server.http_url, "tensorrt_llm_bls", prompt) == expected
        assert http_text(server.http_url, "ensemble", prompt) == expected


@pytest.mark.parametrize("server_name", SERVERS)
def test_bls_excluding_the_prompt_and_streaming_give_the_completion(
        request: pytest.FixtureRequest, server_name: str, greedy_reference: dict[str, str]) -> None:
    """exclude_input_in_output true: the completion only; streamed: chunks of new tokens only, whatever the
    flag (contract §2.5), joined = the completion, over gRPC and HTTP /generate_stream."""
    server = request.getfixturevalue(server_name)
    for prompt in PROMPTS:
        completion = greedy_reference[prompt]
        assert generate(server.grpc_url, "tensorrt_llm_bls", [prompt],
                        exclude_input_in_output=np.array([[True]])) == [completion], prompt
        assert generate(server.grpc_url, "tensorrt_llm_bls", [prompt], stream=True) == [completion], prompt
    assert http_text(server.http_url, "tensorrt_llm_bls", PROMPTS[0], exclude_input_in_output=True) == \
        greedy_reference[PROMPTS[0]]
    assert http_stream_text(server.http_url, "tensorrt_llm_bls", PROMPTS[1]) == greedy_reference[PROMPTS[1]]
    if server_name != "dt_server":  # the draft-target ensemble cannot stream (its LLM is not decoupled)
        assert generate(server.grpc_url, "ensemble", [PROMPTS[2]], stream=True) == [greedy_reference[PROMPTS[2]]]


def test_bls_streams_draft_target_rounds(dt_server: Any, greedy_reference: dict[str, str]) -> None:
    """specbuild's BLS streams speculation (NVIDIA's refuses: "streaming is not supported with speculative
    decoding", decode.py `Request.validate`): one response per round, each with the BLS's acceptance counts."""
    prompt = max(PROMPTS, key=lambda p: len(greedy_reference[p]))
    answers = stream_call(dt_server.grpc_url, "tensorrt_llm_bls",
                          text_request([prompt], stream=np.array([[True]])))
    assert len([a for a in answers if "text_output" in a]) > 1
    assert texts_by_row(answers, 1) == [greedy_reference[prompt]]
    drafted = [int(a["total_draft_tokens"].reshape(-1)[0]) for a in answers if "total_draft_tokens" in a]
    accepted = [int(a["total_accepted_draft_tokens"].reshape(-1)[0]) for a in answers if "total_draft_tokens" in a]
    assert drafted == sorted(drafted) and drafted[-1] > 0 and 0 <= accepted[-1] <= drafted[-1]


@pytest.mark.parametrize("server_name", SERVERS)
@pytest.mark.parametrize("stream", [False, True])
def test_a_batch_of_two(request: pytest.FixtureRequest, server_name: str, stream: bool, tokenizer: Any,
                        greedy_outputs: dict[str, Greedy]) -> None:
    """Batch 2 through the BLS (row by row in draft-target repositories, which NVIDIA's BLS refuses) and the
    ensemble (not where the LLM is not decoupled: the C++ backend refuses batch > 1 then, §2.1): each row's
    text; every text_output is a 1-D array of strings (postprocessing's OUTPUT, §3.2), one per row of the
    response, so that `text_output[0].decode("utf-8")` works; a response for one row of a batch names it by
    batch_index."""
    server = request.getfixturevalue(server_name)
    prompts = [PROMPTS[0], PROMPTS[2]]
    expected = [greedy_outputs[p].text if stream else with_prompt(tokenizer, p, greedy_outputs[p]) for p in prompts]
    models = ["tensorrt_llm_bls"] if server_name == "dt_server" else ["tensorrt_llm_bls", "ensemble"]
    if server_name == "dt_server" and not stream:  # its LLM models are not decoupled: the ensemble cannot batch
        with pytest.raises(RuntimeError, match="Batch size > 1 requires the tensorrt_llm backend to be using "
                                               "decoupled transaction policy"):
            stream_call(server.grpc_url, "ensemble", text_request(prompts))
    for model in models:
        answers = stream_call(server.grpc_url, model, text_request(prompts, stream=np.full((2, 1), stream)))
        assert texts_by_row(answers, 2) == expected, model
        for answer in answers:
            if "text_output" in answer:
                assert isinstance(answer["text_output"][0].decode("utf-8"), str)
                if len(answer["text_output"]) == 1:
                    assert answer["batch_index"].shape == (1, 1), model


# -- every NVIDIA input ------------------------------------------------------------------------------------


def neutral_inputs(tokenizer: Any) -> dict[str, np.ndarray]:
    """Every optional input of NVIDIA's BLS (contract §1.5) with a value that changes nothing for a greedy
    request, as NVIDIA's clients send them (end_to_end_grpc_client.py: beam_width 1, temperature 1.0,
    exclude_input_in_output False, bad/stop words [[""]], empty embedding-bias tensors); an empty prompt table
    and empty LoRA tensors (lora_task_id is left out: any id names an adapter)."""
    end, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    return {
        "decoder_text_input": np.array([[PROMPTS[0]]], dtype=object),
        "bad_words": np.array([[""]], dtype=object), "stop_words": np.array([[""]], dtype=object),
        "exclude_input_in_output": np.array([[False]]),
        "end_id": np.array([[end]], dtype=np.int32), "pad_id": np.array([[pad]], dtype=np.int32),
        "top_k": np.array([[1]], dtype=np.int32), "top_p": np.array([[0.0]], dtype=np.float32),
        "temperature": np.array([[1.0]], dtype=np.float32), "length_penalty": np.array([[1.0]], dtype=np.float32),
        "repetition_penalty": np.array([[1.0]], dtype=np.float32), "min_tokens": np.array([[1]], dtype=np.int32),
        "presence_penalty": np.array([[0.0]], dtype=np.float32),
        "frequency_penalty": np.array([[0.0]], dtype=np.float32), "seed": np.array([[0]], dtype=np.uint64),
        "return_log_probs": np.array([[False]]), "return_context_logits": np.array([[False]]),
        "return_generation_logits": np.array([[False]]), "num_return_sequences": np.array([[1]], dtype=np.int32),
        "beam_width": np.array([[1]], dtype=np.int32), "stream": np.array([[False]]),
        "prompt_table_extra_id": np.array([[0]], dtype=np.uint64),
        "prompt_embedding_table": np.zeros((1, 0, 0), dtype=np.float16), "prompt_vocab_size": np.array([[0]], np.int32),
        "lora_weights": np.zeros((1, 0, 0), dtype=np.float16), "lora_config": np.zeros((1, 0, 3), dtype=np.int32),
        "embedding_bias_words": np.zeros((1, 0), dtype=object),
        "embedding_bias_weights": np.zeros((1, 0), dtype=np.float32),
        "use_draft_logits": np.array([[False]]), "return_perf_metrics": np.array([[False]]),
        "return_num_input_tokens": np.array([[False]]), "return_num_output_tokens": np.array([[False]]),
        "guided_decoding_guide_type": np.array([[""]], dtype=object),
        "guided_decoding_guide": np.array([[""]], dtype=object),
    }


EMPTY_MULTIMODAL = {
    "image_input": np.zeros((1, 0, 3, 0, 0), dtype=np.float16),
    "image_bytes_input": np.zeros((1, 0, 0, 0, 0), dtype=np.uint8),
    "image_url_input": np.array([[""]], dtype=object),
    "image_sizes_input": np.zeros((1, 0, 2), dtype=np.int64),
    "video_bytes_input": np.zeros((1, 0, 0, 0, 0), dtype=np.uint8),
}
"""The multimodal inputs sent without data: a text-only repository accepts them (NVIDIA's text-only
preprocessing ignores them); NVIDIA's BLS counts a request with any of the first four as multimodal
(1/model.py `execute`), which speculation refuses."""


@pytest.mark.parametrize("server_name", SERVERS)
def test_every_nvidia_bls_input_is_accepted(request: pytest.FixtureRequest, server_name: str, tokenizer: Any,
                                            greedy_outputs: dict[str, Greedy]) -> None:
    server = request.getfixturevalue(server_name)
    prompt = PROMPTS[0]
    expected = [with_prompt(tokenizer, prompt, greedy_outputs[prompt])]
    neutral = neutral_inputs(tokenizer)
    assert generate(server.grpc_url, "tensorrt_llm_bls", [prompt], **neutral) == expected
    plain = {**neutral, **EMPTY_MULTIMODAL, "num_draft_tokens": np.array([[0]], dtype=np.int32)}
    assert generate(server.grpc_url, "tensorrt_llm_bls", [prompt], **plain) == expected
    if server_name == "dt_server":
        speculative = {**neutral, "num_draft_tokens": np.array([[3]], dtype=np.int32)}
        assert generate(server.grpc_url, "tensorrt_llm_bls", [prompt], **speculative) == expected


@pytest.mark.parametrize(("server_name", "extra", "message"), [
    ("plain_server", {"max_tokens": np.array([[0]], dtype=np.int32)}, "max_tokens must be a single value > 0"),
    ("dt_server", {"max_tokens": np.array([[-2]], dtype=np.int32)}, "max_tokens must be a single value > 0"),
    ("plain_server", {"num_draft_tokens": np.array([[2]], dtype=np.int32)},
     "cannot perform speculative decoding without draft model"),
    ("dt_server", {"return_context_logits": np.array([[True]])},
     "context logits are not supported with speculative decoding"),
    ("dt_server", {"image_url_input": np.array([[""]], dtype=object)},
     "Multimodal and speculative decoding is not currently supported"),
    ("medusa_server", {"image_bytes_input": np.ones((1, 1, 2, 2, 3), dtype=np.uint8)}, "text only"),
])
def test_requests_nvidias_bls_refuses_get_its_message(request: pytest.FixtureRequest, server_name: str,
                                                      extra: dict[str, np.ndarray], message: str,
                                                      greedy_reference: dict[str, str]) -> None:
    """decode.py `Request.validate` and 1/model.py `execute` texts (contract §3.3); the server keeps serving."""
    server = request.getfixturevalue(server_name)
    inputs = {**text_request([PROMPTS[1]]), **extra}
    with pytest.raises(RuntimeError, match=message):
        stream_call(server.grpc_url, "tensorrt_llm_bls", inputs)
    assert generate(server.grpc_url, "tensorrt_llm_bls", [PROMPTS[1]], stream=True) == \
        [greedy_reference[PROMPTS[1]]]


def test_speculating_bls_reports_what_the_client_asked_for(dt_server: Any, tokenizer: Any,
                                                           greedy_outputs: dict[str, Greedy]) -> None:
    """Acceptance counts always (the BLS's own, over all rounds); num_input_tokens / num_output_tokens when
    asked (contract §2.4: the prompt counts in num_output_tokens when it is in the output); perf metrics only
    with return_perf_metrics, which the BLS then passes to the target."""
    prompt = PROMPTS[3]
    ids = tokenizer.encode(prompt, add_special_tokens=True)
    answers = stream_call(dt_server.grpc_url, "tensorrt_llm_bls", text_request(
        [prompt], return_num_input_tokens=np.array([[True]]), return_num_output_tokens=np.array([[True]])))
    (answer,) = answers
    assert int(answer["num_input_tokens"].reshape(-1)[0]) == len(ids)
    assert int(answer["num_output_tokens"].reshape(-1)[0]) == len(ids) + len(greedy_outputs[prompt].ids)
    assert "arrival_time_ns" not in answer and "kv_cache_reused_blocks" not in answer
    drafted = int(answer["total_draft_tokens"].reshape(-1)[0])
    accepted = int(answer["total_accepted_draft_tokens"].reshape(-1)[0])
    assert drafted > 0 and 0 <= accepted <= drafted
    assert answer["acceptance_rate"].reshape(-1)[0] == pytest.approx(accepted / drafted)
    answers = stream_call(dt_server.grpc_url, "tensorrt_llm_bls",
                          text_request([prompt], return_perf_metrics=np.array([[True]])))
    assert int(answers[-1]["total_draft_tokens"].reshape(-1)[0]) == drafted


def test_use_draft_logits_keeps_the_text_and_speculates(dt_server: Any, tokenizer: Any,
                                                       greedy_outputs: dict[str, Greedy]) -> None:
    """use_draft_logits sets the draft's return_generation_logits (triton_decoder.py, draft branch); a draft
    engine without gather_generation_logits cannot return them, and the BLS then verifies the drafts without
    them: the greedy text is the target's either way, and the draft still proposes."""
    prompt = PROMPTS[1]
    (answer,) = stream_call(dt_server.grpc_url, "tensorrt_llm_bls",
                            text_request([prompt], use_draft_logits=np.array([[True]])))
    assert answer["text_output"][0].decode("utf-8") == with_prompt(tokenizer, prompt, greedy_outputs[prompt])
    assert int(answer["total_draft_tokens"].reshape(-1)[0]) > 0


@pytest.mark.parametrize("stream", [False, True])
def test_stop_words_give_the_ensembles_text(dt_server: Any, medusa_server: Any, plain_server: Any,
                                            tokenizer: Any, greedy_outputs: dict[str, Greedy], stream: bool) -> None:
    """A stop phrase from the target's own greedy answer: the BLS's text is the ensemble's for the same request
    (the draft-target ensemble runs the plain target: its text is the reference for the speculating BLS, whose
    rounds can split the phrase), streamed or not."""
    prompt = PROMPTS[0]
    phrase, _ = stop_phrase(tokenizer, greedy_outputs[prompt].ids)
    stop = {"stop_words": np.array([[phrase]], dtype=object)}
    reference = generate(dt_server.grpc_url, "ensemble", [prompt], exclude_input_in_output=np.array([[stream]]),
                         **stop)
    assert reference[0] != (greedy_outputs[prompt].text if stream else with_prompt(tokenizer, prompt,
                                                                                   greedy_outputs[prompt]))
    for server in (dt_server, medusa_server, plain_server):
        assert generate(server.grpc_url, "tensorrt_llm_bls", [prompt], stream=stream, **stop) == reference
        if server is not dt_server:
            assert generate(server.grpc_url, "ensemble", [prompt], stream=stream, **stop) == reference


# -- preprocessing and postprocessing called directly -------------------------------------------------------


def infer(url: str, model: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    client = grpcclient.InferenceServerClient(url)
    try:
        result = client.infer(model, [_input(k, v) for k, v in inputs.items()])
        return {o["name"]: result.as_numpy(o["name"]) for o in result.get_response(as_json=True)["outputs"]}
    finally:
        client.close()


def test_preprocessing_outputs_as_nvidias(plain_server: Any, tokenizer: Any) -> None:
    """Contract §3.1 (preprocessing/1/model.py @01259b15): INPUT_ID right-padded with the pad id, DECODER_INPUT_ID
    [[pad_id]] / REQUEST_DECODER_INPUT_LEN 1 without DECODER_QUERY, word lists [B, 2, 0] when absent and
    [B, 2, L >= 1] when sent, EMBEDDING_BIAS [B, 0] without words/weights, end/pad ids = the first id of the
    eos/pad token, REQUEST_OUTPUT_LEN passed through unclamped, no prompt-length check, and
    OUT_PROMPT_TABLE_EXTRA_IDS only when PROMPT_TABLE_EXTRA_ID is sent."""
    prompts = [PROMPTS[0], "word " * 300]
    eos = tokenizer.encode(tokenizer.eos_token, add_special_tokens=False)[0]
    pad = tokenizer.encode(tokenizer.pad_token or tokenizer.eos_token, add_special_tokens=False)[0]
    base = {"QUERY": np.array([[p] for p in prompts], dtype=object),
            "REQUEST_OUTPUT_LEN": np.array([[5], [1000]], dtype=np.int32)}
    out = infer(plain_server.grpc_url, "preprocessing", base)
    assert "OUT_PROMPT_TABLE_EXTRA_IDS" not in out
    ids = [tokenizer.encode(p, add_special_tokens=True) for p in prompts]
    assert len(ids[1]) > 256  # more than the engines' max_input_len: preprocessing does not judge
    assert out["INPUT_ID"].shape == (2, len(ids[1])) and out["INPUT_ID"][0, : len(ids[0])].tolist() == ids[0]
    assert set(out["INPUT_ID"][0, len(ids[0]):].tolist()) <= {pad}
    assert out["REQUEST_INPUT_LEN"].tolist() == [[len(ids[0])], [len(ids[1])]]
    assert out["DECODER_INPUT_ID"].tolist() == [[pad], [pad]] and out["REQUEST_DECODER_INPUT_LEN"].tolist() == [[1]] * 2
    assert out["BAD_WORDS_IDS"].shape == (2, 2, 0) and out["STOP_WORDS_IDS"].shape == (2, 2, 0)
    assert out["EMBEDDING_BIAS"].shape == (2, 0) and out["EMBEDDING_BIAS"].dtype == np.float32
    assert out["REQUEST_OUTPUT_LEN"].tolist() == [[5], [1000]]
    assert out["OUT_END_ID"].tolist() == [[eos]] * 2 and out["OUT_PAD_ID"].tolist() == [[pad]] * 2

    words = np.array([["", PROMPTS[1]], ["", ""]], dtype=object)
    out = infer(plain_server.grpc_url, "preprocessing", {
        **base, "STOP_WORDS_DICT": words, "BAD_WORDS_DICT": np.array([[""], [""]], dtype=object),
        "PROMPT_TABLE_EXTRA_ID": np.array([[7], [8]], dtype=np.uint64), "END_ID": np.array([[5], [6]], np.int32),
        "EMBEDDING_BIAS_WORDS": np.array([[PROMPTS[0]], [""]], dtype=object),
        "EMBEDDING_BIAS_WEIGHTS": np.array([[2.0], [1.0]], dtype=np.float32),
        "IMAGE_URL": np.array([[""], [""]], dtype=object)})
    phrase = tokenizer.encode(PROMPTS[1], add_special_tokens=False)
    assert out["STOP_WORDS_IDS"].shape == (2, 2, len(phrase))
    assert out["STOP_WORDS_IDS"][0, 0].tolist() == phrase and out["STOP_WORDS_IDS"][0, 1, 0] == len(phrase)
    assert out["STOP_WORDS_IDS"][1].tolist() == [[0] * len(phrase), [-1] * len(phrase)]
    assert out["BAD_WORDS_IDS"].tolist() == [[[0], [-1]], [[0], [-1]]]  # L >= 1 once sent
    assert out["OUT_PROMPT_TABLE_EXTRA_IDS"].shape == out["INPUT_ID"].shape
    assert not out["OUT_PROMPT_TABLE_EXTRA_IDS"].any()  # no prompt-table ids in a text prompt
    assert out["OUT_END_ID"].tolist() == [[5], [6]]
    assert out["EMBEDDING_BIAS"].shape == (2, len(tokenizer.vocab))
    biased = set(tokenizer.encode(PROMPTS[0]))
    assert set(np.flatnonzero(out["EMBEDDING_BIAS"][0]).tolist()) == biased and not out["EMBEDDING_BIAS"][1].any()

    with pytest.raises(Exception, match="IMAGE_BYTES"):
        infer(plain_server.grpc_url, "preprocessing", {**base, "IMAGE_BYTES": np.ones((2, 1, 2, 2, 3), np.uint8)})


def test_postprocessing_output_as_nvidias(plain_server: Any, tokenizer: Any, greedy_outputs: dict[str, Greedy]) -> None:
    """Contract §3.2 (postprocessing/1/model.py @2e2327b9): OUTPUT is a 1-D array with one UTF-8 string per
    (row, beam), tokens cut to SEQUENCE_LENGTH and decoded with skip_special_tokens; NVIDIA's speculative
    client sends TOKENS_BATCH [1, 1, L] and reads OUTPUT[0].decode("utf8")."""
    a, b = greedy_outputs[PROMPTS[0]].ids, greedy_outputs[PROMPTS[2]].ids
    eos = tokenizer.eos_token_id
    tokens = np.full((2, 1, max(len(a), len(b)) + 1), 0, dtype=np.int32)
    tokens[0, 0, : len(a) + 1] = [*a, eos]
    tokens[1, 0, : len(b)] = b
    out = infer(plain_server.grpc_url, "postprocessing", {
        "TOKENS_BATCH": tokens, "SEQUENCE_LENGTH": np.array([[len(a) + 1], [len(b) - 2]], dtype=np.int32)})
    assert out["OUTPUT"].shape == (2,)
    assert [v.decode("utf-8") for v in out["OUTPUT"]] == [
        tokenizer.decode(a, skip_special_tokens=True), tokenizer.decode(b[:-2], skip_special_tokens=True)]
    beams = np.stack([tokens[0, 0], tokens[1, 0]])[None]
    out = infer(plain_server.grpc_url, "postprocessing", {
        "TOKENS_BATCH": beams, "SEQUENCE_LENGTH": np.array([[len(a), len(b)]], dtype=np.int32)})
    assert out["OUTPUT"].shape == (2,)  # one row, two beams
    assert out["OUTPUT"][1].decode("utf8") == tokenizer.decode(b, skip_special_tokens=True)
    single = infer(plain_server.grpc_url, "postprocessing", {
        "TOKENS_BATCH": np.array([[a]], dtype=np.int32), "SEQUENCE_LENGTH": np.array([[len(a)]], dtype=np.int32)})
    assert single["OUTPUT"][0].decode("utf8") == greedy_outputs[PROMPTS[0]].text
