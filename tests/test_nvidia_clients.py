"""NVIDIA's own client scripts of the TensorRT-LLM Triton backend, reproduced on the wire (tests/nvidia_clients.py),
run against a real tritonserver serving specbuild's three demo repositories: draft-target (`dt_server`), Medusa
(`medusa_server`) and plain (`plain_server`), over gRPC and HTTP, streaming and not.

What the served models must answer is derived in the same run from the target's own plain greedy generation
outside Triton (`greedy_outputs`, and `target_greedy` below for other prompts and lengths), never written down.

Greedy: every request here is greedy in TensorRT-LLM. The tensorrt_llm clients send runtime_top_k [[1]]; the
ensemble / BLS clients send temperature [[1.0]] and no top_k / top_p (or nothing at all), and TensorRT-LLM then
decodes greedily: absent top_k / top_p default to 0 / 0.0 (NVIDIA/TensorRT-LLM
cpp/tensorrt_llm/layers/defaultDecodingParams.h@1020a8d7 getTopK/getTopP, used by topKSamplingLayer.cpp@03961722
when the request has none) and top_k 0 with top_p 0 becomes top_k 1 (cpp/tensorrt_llm/kernels/
samplingTopKKernels.cu@03961722 setupTopKRuntimeArgs). So the texts are compared exactly with greedy output.

Which server: unary infer (inflight_batcher_llm_client without --streaming, e2e_grpc_speculative_decoding_client,
end_to_end_test, benchmark_core_model without --decoupled) needs non-decoupled models - the draft-target repository's
tensorrt_llm, tensorrt_llm_draft and ensemble; streaming of the LLM itself needs a decoupled tensorrt_llm - the
plain and Medusa repositories (the draft-target repository streams through its decoupled BLS).

Sources: "Contract §n" in a docstring names the upstream file a fact was read from (paths under NVIDIA/TensorRT-LLM
`triton_backend/` unless noted): §1 the model configs, `all_models/inflight_batcher_llm/<model>/config.pbtxt`
(tensorrt_llm and ensemble @2a9abd95, preprocessing @808059da, postprocessing @89fd9b74, tensorrt_llm_bls
@bff88ea8); §2 the C++ `tensorrtllm` backend, `inflight_batcher_llm/src/model_instance_state.cc` @0c8de69a and
`utils.cc` @c8c6df08 (with `cpp/tensorrt_llm/batch_manager/llmRequest.cpp` @119c6e60 for length limits); §3 the
Python models under `all_models/inflight_batcher_llm/`: §3.1 `preprocessing/1/model.py` @01259b15, §3.2
`postprocessing/1/model.py` @2e2327b9, §3.3 `tensorrt_llm_bls/1/model.py` @0ef1f21e with `lib/decode.py`
@4db68284, §3.4 the ensemble's config; §4 NVIDIA's client scripts, triton-inference-server/tensorrtllm_backend
@c2e65b88 `inflight_batcher_llm/client/` and `tools/inflight_batcher_llm/`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from tests import nvidia_clients as nv
from tests.deploy_fixtures import MAX_TOKENS, PROMPTS, Deployed, Greedy, stop_phrase

pytestmark = [pytest.mark.slow, pytest.mark.tritonserver]

SERVERS = {"draft_target": "dt_server", "medusa": "medusa_server", "plain": "plain_server"}
DECOUPLED_LLM = ("plain", "medusa")
"""The repositories whose tensorrt_llm (and so ensemble) is decoupled: where the LLM itself can stream."""


def server(request: pytest.FixtureRequest, repository: str) -> Any:
    return request.getfixturevalue(SERVERS[repository])


@pytest.fixture(scope="module")
def tokenizer(deployed: Deployed) -> Any:
    from specbuild.tokenizer import load_tokenizer

    return load_tokenizer(deployed.tokenizer_dir)


@pytest.fixture(scope="module")
def target_greedy(deployed: Deployed, greedy_outputs: dict[str, Greedy], tokenizer: Any) -> Callable[..., Greedy]:
    """(prompt, max_new_tokens) -> the target's plain greedy generation outside Triton, as `greedy_outputs`
    computes it (same model, tokenizer and stop rule), for the prompts and lengths NVIDIA's scripts use."""
    import torch

    from specbuild.runtime.generation import StopCriteria, generate
    from specbuild.runtime.model import CausalLM

    model = CausalLM.from_checkpoint(deployed.target_checkpoint())
    cache: dict[tuple[str, int], Greedy] = {(p, MAX_TOKENS): g for p, g in greedy_outputs.items()}

    def run(prompt: str, max_new_tokens: int = MAX_TOKENS) -> Greedy:
        if (prompt, max_new_tokens) not in cache:
            ids = tokenizer.encode(prompt, add_special_tokens=True)
            with torch.inference_mode():
                out = generate(model, [ids], stop=StopCriteria(max_new_tokens, tokenizer.eos_token_id))
            new = list(out.output_ids[0])
            cache[(prompt, max_new_tokens)] = Greedy(new, tokenizer.decode(new, skip_special_tokens=True))
        return cache[(prompt, max_new_tokens)]

    return run


def full_text(tokenizer: Any, prompt: str, greedy: Greedy) -> str:
    """What NVIDIA's postprocessing makes of prompt + generated ids: one batch_decode with skip_special_tokens
    (postprocessing/1/model.py), the prompt at the head because output_ids hold it by default."""
    return tokenizer.decode(tokenizer.encode(prompt, add_special_tokens=True) + greedy.ids, skip_special_tokens=True)


def num_draft_tokens(deployed: Deployed) -> int:
    """The draft-target pipeline's K: NVIDIA's scripts default to 5 (--num-draft-tokens), which a target engine
    built with max_draft_len 4 refuses ("Draft tokens length (5) exceeds maximum draft tokens length (4)"), so the
    tests pass the deployed K as NVIDIA's CI passes its engine's."""
    return deployed.specs["draft_target"].speculative.num_draft_tokens


def assert_no_errors(result: nv.EndToEndResult) -> None:
    assert not result.errors, f"the server answered with errors: {result.errors}"


# -- inflight_batcher_llm/client/end_to_end_grpc_client.py -------------------------------------------------------


@pytest.mark.parametrize("repository", ["draft_target", "plain", "medusa"])
def test_end_to_end_grpc_client_ensemble(request: pytest.FixtureRequest, repository: str,
                                         greedy_reference: dict[str, str]) -> None:
    """Reproduces NVIDIA's inflight_batcher_llm/client/end_to_end_grpc_client.py (default --model-name ensemble,
    not streaming) with --check-outputs. Contract §4: it always sends text_input, max_tokens, stream [[False]],
    beam_width [[1]], temperature [[1.0]], exclude_input_in_output [[False]] over a gRPC stream, reads
    `text_output[0].decode("utf-8")` (so text_output must be a 1-D [beams] STRING tensor, §1.2/§3.2) and expects
    prompt + generated text (output_ids include the prompt by default, §2.5; postprocessing does not strip it)."""
    url = server(request, repository).grpc_url
    result = nv.end_to_end_grpc_client(url, list(PROMPTS), MAX_TOKENS, model_name="ensemble")
    assert_no_errors(result)
    expected = result.expected_texts([greedy_reference[p] for p in PROMPTS], streaming=False)
    assert result.output_texts == expected


@pytest.mark.parametrize("repository", DECOUPLED_LLM)
def test_end_to_end_grpc_client_ensemble_streaming(request: pytest.FixtureRequest, repository: str,
                                                   greedy_reference: dict[str, str]) -> None:
    """Reproduces NVIDIA's end_to_end_grpc_client.py --streaming on the ensemble (decoupled tensorrt_llm) with
    --check-outputs: stream [[True]], each response's `text_output[0]` appended; the check expects the generated
    text without the prompt (§4: streamed responses carry only the new tokens, §2.5), in more than one piece."""
    url = server(request, repository).grpc_url
    result = nv.end_to_end_grpc_client(url, list(PROMPTS), MAX_TOKENS, model_name="ensemble", streaming=True)
    assert_no_errors(result)
    assert result.output_texts == result.expected_texts([greedy_reference[p] for p in PROMPTS], streaming=True)
    assert all(len(chunks) > 1 for chunks in result.chunks), result.chunks


@pytest.mark.parametrize("streaming", [False, True], ids=["unary-response", "streaming"])
@pytest.mark.parametrize("repository", ["draft_target", "plain", "medusa"])
def test_end_to_end_grpc_client_bls(request: pytest.FixtureRequest, repository: str, streaming: bool,
                                    greedy_reference: dict[str, str]) -> None:
    """Reproduces NVIDIA's end_to_end_grpc_client.py --model-name tensorrt_llm_bls (L475-481), streaming or not,
    with --check-outputs. Contract §1.5/§4: the BLS takes the same always-sent inputs as the ensemble (beam_width,
    temperature, exclude_input_in_output among them), returns text_output as a 1-D [beams] STRING tensor, and the
    text is prompt + generated (not streaming) or the generated pieces (streaming). Every repository of NVIDIA's
    layout has a tensorrt_llm_bls, also without a draft model (§1.5: tensorrt_llm_draft_model_name is optional)."""
    url = server(request, repository).grpc_url
    result = nv.end_to_end_grpc_client(url, list(PROMPTS), MAX_TOKENS, model_name="tensorrt_llm_bls",
                                       streaming=streaming)
    assert_no_errors(result)
    assert result.output_texts == result.expected_texts([greedy_reference[p] for p in PROMPTS], streaming=streaming)


@pytest.mark.parametrize(("repository", "model"), [("plain", "ensemble"), ("draft_target", "tensorrt_llm_bls")])
def test_end_to_end_grpc_client_exclude_input_in_output(request: pytest.FixtureRequest, repository: str, model: str,
                                                        greedy_reference: dict[str, str]) -> None:
    """Reproduces NVIDIA's end_to_end_grpc_client.py --exclude-input-in-output (not streaming) with
    --check-outputs: exclude_input_in_output [[True]] is passed through to tensorrt_llm (§3.3/§3.4), whose output
    then holds the generated tokens only (§2.5), so the check expects the text without the prompt."""
    url = server(request, repository).grpc_url
    result = nv.end_to_end_grpc_client(url, list(PROMPTS), MAX_TOKENS, model_name=model,
                                       exclude_input_in_output=True)
    assert_no_errors(result)
    expected = result.expected_texts([greedy_reference[p] for p in PROMPTS], streaming=False,
                                     exclude_input_in_output=True)
    assert result.output_texts == expected


@pytest.mark.parametrize(("repository", "streaming"), [("plain", False), ("plain", True), ("medusa", False)])
def test_end_to_end_grpc_client_batch_inputs(request: pytest.FixtureRequest, repository: str, streaming: bool,
                                             greedy_reference: dict[str, str]) -> None:
    """Reproduces NVIDIA's end_to_end_grpc_client.py --batch-inputs with a JSON list of prompts and
    --check-outputs: one request with every tensor stacked on dim 0 and batch_index requested (L256-262, 287-288).
    Contract §2.5/§2.4: each batch row comes back in its own responses, with batch_index [1, 1] read `[0][0]` and a
    one-row text_output read `[0]` - the client files each text under its row."""
    prompts = [PROMPTS[0], PROMPTS[2], PROMPTS[3]]
    url = server(request, repository).grpc_url
    result = nv.end_to_end_grpc_client(url, prompts, MAX_TOKENS, model_name="ensemble", streaming=streaming,
                                       batch_inputs=True)
    assert_no_errors(result)
    assert result.output_texts == result.expected_texts([greedy_reference[p] for p in prompts], streaming=streaming)


@pytest.mark.parametrize("repository", ["draft_target", "plain", "medusa"])
def test_end_to_end_grpc_client_default_output_len(request: pytest.FixtureRequest, repository: str, tokenizer: Any,
                                                   target_greedy: Callable[..., Greedy]) -> None:
    """Reproduces NVIDIA's end_to_end_grpc_client.py with its default --output-len 100 (L541-546) on the ensemble.
    Contract §2.3: TensorRT-LLM bounds a request by max_seq_len (prompt + output + draft tokens per step), not by
    the build's max_output_len - 100 new tokens after a short prompt fit the demo engines' max_seq_len 320, so the
    answer is the full 100-token greedy text (an over-long request would be shortened, never refused)."""
    url = server(request, repository).grpc_url
    prompt = PROMPTS[0]
    result = nv.end_to_end_grpc_client(url, prompt, model_name="ensemble")
    assert_no_errors(result)
    assert result.output_texts == [full_text(tokenizer, prompt, target_greedy(prompt, 100))]


def test_end_to_end_grpc_client_bls_speculative_with_perf_metrics(
    dt_server: Any, deployed: Deployed, greedy_reference: dict[str, str],
) -> None:
    """Reproduces NVIDIA's end_to_end_grpc_client.py --model-name tensorrt_llm_bls with num_draft_tokens K,
    use_draft_logits False and --return-perf-metrics (as speculative_decoding_test.py --return-perf-metrics calls
    it). Contract §4: the ten perf outputs are requested and each response's are read `[0][0]`; §2.4: INT32 block
    and draft counts, INT64 timestamps (ns since the epoch), FP32 acceptance_rate = accepted / drafted; §3.3: the
    answer of the draft-target loop is the target's greedy text, prompt first."""
    result = nv.end_to_end_grpc_client(dt_server.grpc_url, list(PROMPTS[:2]), MAX_TOKENS,
                                       model_name="tensorrt_llm_bls", num_draft_tokens=num_draft_tokens(deployed),
                                       use_draft_logits=False, return_perf_metrics=True)
    assert_no_errors(result)
    assert result.output_texts == result.expected_texts([greedy_reference[p] for p in PROMPTS[:2]], streaming=False)
    assert len(result.perf_metrics) == 2
    for metrics, response in zip(result.perf_metrics, result.responses, strict=True):
        dtypes = {name: response.as_numpy(name).dtype for name in nv.PERF_METRIC_OUTPUTS}
        assert dtypes == {
            "kv_cache_alloc_new_blocks": np.int32, "kv_cache_reused_blocks": np.int32,
            "kv_cache_alloc_total_blocks": np.int32, "arrival_time_ns": np.int64,
            "first_scheduled_time_ns": np.int64, "first_token_time_ns": np.int64, "last_token_time_ns": np.int64,
            "acceptance_rate": np.float32, "total_accepted_draft_tokens": np.int32, "total_draft_tokens": np.int32,
        }
        drafted, accepted = int(metrics["total_draft_tokens"]), int(metrics["total_accepted_draft_tokens"])
        assert drafted > 0 and 0 <= accepted <= drafted
        assert float(metrics["acceptance_rate"]) == pytest.approx(accepted / drafted, rel=1e-5)
        assert 0 < int(metrics["arrival_time_ns"]) <= int(metrics["last_token_time_ns"])


def test_end_to_end_grpc_client_bls_stop_words(dt_server: Any, tokenizer: Any,
                                               greedy_outputs: dict[str, Greedy]) -> None:
    """Reproduces NVIDIA's end_to_end_grpc_client.py --model-name tensorrt_llm_bls --stop-words <phrase> (not
    streaming), the phrase taken from the target's own greedy answer in this run. Contract §3.3 (BLS:106-169): the
    BLS cuts its text after the first stop word found past the prompt - the stop word stays in the text, it is
    not removed."""
    prompt = PROMPTS[0]
    greedy = greedy_outputs[prompt]
    phrase, first = stop_phrase(tokenizer, greedy.ids)
    piece = tokenizer.encode(phrase, add_special_tokens=False)
    engine_text = full_text(tokenizer, prompt, Greedy(greedy.ids[: first + len(piece)], ""))
    cut = engine_text.find(phrase, len(prompt))
    assert cut >= 0, (phrase, engine_text)
    result = nv.end_to_end_grpc_client(dt_server.grpc_url, prompt, MAX_TOKENS, model_name="tensorrt_llm_bls",
                                       stop_words=[phrase])
    assert_no_errors(result)
    assert result.output_texts == [engine_text[: cut + len(phrase)]], phrase


# -- inflight_batcher_llm/client/inflight_batcher_llm_client.py ---------------------------------------------------


IFB_PROMPTS = (*PROMPTS, nv.DEFAULT_IFB_TEXT)


def test_inflight_batcher_llm_client_unary(dt_server: Any, deployed: Deployed,
                                           target_greedy: Callable[..., Greedy]) -> None:
    """Reproduces NVIDIA's inflight_batcher_llm/client/inflight_batcher_llm_client.py without --streaming
    (unary async_infer with request parameter Streaming, non-decoupled tensorrt_llm) with --tokenizer-dir and
    --check-output, for the demo prompts and the script's default --text with its default --request-output-len 16.
    Contract §4: input_ids [1, L] from the tokenizer, input_lengths, request_output_len, beam_width, temperature,
    streaming, end_id/pad_id from the tokenizer, runtime_top_k [[1]], runtime_top_p [[0.0]]; it reads
    output_ids[0][0] cut to sequence_length[0][0] and expects the prompt ids at its head (§2.5: prompt included
    unless excluded)."""
    for prompt in IFB_PROMPTS:
        length = 16 if prompt == nv.DEFAULT_IFB_TEXT else MAX_TOKENS
        result = nv.inflight_batcher_llm_client(dt_server.grpc_url, tokenizer_dir=deployed.tokenizer_dir,
                                                text=prompt, request_output_len=length)
        expected = target_greedy(prompt, length)
        assert result.check_output(expected.ids), (prompt, result.output_ids_w_prompt, result.input_ids)
        assert result.output_text == expected.text


@pytest.mark.parametrize("repository", DECOUPLED_LLM)
def test_inflight_batcher_llm_client_streaming(request: pytest.FixtureRequest, repository: str, deployed: Deployed,
                                               target_greedy: Callable[..., Greedy]) -> None:
    """Reproduces NVIDIA's inflight_batcher_llm_client.py --streaming (gRPC stream, decoupled tensorrt_llm) with
    --check-output. Contract §4/§2.5: the script puts the prompt ids in front itself and appends each response's
    output_ids[0][0] - streamed responses must hold only the tokens produced since the previous one, whatever the
    exclude flag - and it expects prompt + generated ids."""
    url = server(request, repository).grpc_url
    for prompt in IFB_PROMPTS:
        length = 16 if prompt == nv.DEFAULT_IFB_TEXT else MAX_TOKENS
        result = nv.inflight_batcher_llm_client(url, tokenizer_dir=deployed.tokenizer_dir, text=prompt,
                                                request_output_len=length, streaming=True)
        expected = target_greedy(prompt, length)
        assert result.check_output(expected.ids), (prompt, result.output_ids_w_prompt, result.input_ids)
        assert len(result.responses) > 1


@pytest.mark.parametrize(("repository", "streaming"), [("draft_target", False), ("plain", True)])
def test_inflight_batcher_llm_client_exclude_input_in_output(
    request: pytest.FixtureRequest, repository: str, streaming: bool, deployed: Deployed,
    greedy_outputs: dict[str, Greedy],
) -> None:
    """Reproduces NVIDIA's inflight_batcher_llm_client.py --exclude-input-in-output (unary and --streaming) with
    --check-output. Contract §4: the flag is sent as exclude_input_in_output [[True]] only when given; §2.5: the
    output then holds the generated ids only, and the script expects exactly those."""
    url = server(request, repository).grpc_url
    for prompt in PROMPTS:
        result = nv.inflight_batcher_llm_client(url, tokenizer_dir=deployed.tokenizer_dir, text=prompt,
                                                request_output_len=MAX_TOKENS, streaming=streaming,
                                                exclude_input_in_output=True)
        assert result.check_output(greedy_outputs[prompt].ids, exclude_input_in_output=True), (
            prompt, result.output_ids_w_prompt)


@pytest.mark.parametrize(("repository", "streaming"), [("draft_target", False), ("plain", True)])
def test_inflight_batcher_llm_client_stop_request(request: pytest.FixtureRequest, repository: str, streaming: bool,
                                                  deployed: Deployed, tokenizer: Any,
                                                  target_greedy: Callable[..., Greedy]) -> None:
    """Reproduces NVIDIA's inflight_batcher_llm_client.py --stop-after-ms 50 --request-id 1 (the README's early
    stopping), unary and --streaming. Contract §4/§2.6: after the request it sends, under the same request id,
    input_ids [1, 1], input_lengths [[0]], request_output_len [[0]], stop [[True]] (request parameter Streaming);
    the backend cancels the running request, which ends early with the tokens so far, and the stop request gets an
    empty reply. The script requires fewer than --request-output-len new tokens; here they are also a prefix of
    the greedy answer."""
    url = server(request, repository).grpc_url
    prompt = PROMPTS[1]
    length = deployed.specs["none"].build.max_output_len
    result = nv.inflight_batcher_llm_client(url, tokenizer_dir=deployed.tokenizer_dir, text=prompt,
                                            request_output_len=length, streaming=streaming, stop_after_ms=50,
                                            request_id="1")
    greedy = target_greedy(prompt, length)
    assert result.input_ids == tokenizer.encode(prompt)
    assert len(result.output_ids_wo_prompt) < length
    assert result.output_ids_wo_prompt == greedy.ids[: len(result.output_ids_wo_prompt)]


def test_inflight_batcher_llm_client_stop_via_request_cancel(plain_server: Any, deployed: Deployed,
                                                             greedy_outputs: dict[str, Greedy]) -> None:
    """Reproduces NVIDIA's inflight_batcher_llm_client.py --streaming --stop-after-ms 50 --stop-via-request-cancel:
    the stream is closed with cancel_requests (L886-888); a CANCELLED status is not an error for the script
    (L898-904), and the server serves the next request (§2.6: cancellation is polled)."""
    prompt = PROMPTS[0]
    result = nv.inflight_batcher_llm_client(plain_server.grpc_url, tokenizer_dir=deployed.tokenizer_dir, text=prompt,
                                            request_output_len=deployed.specs["none"].build.max_output_len,
                                            streaming=True, stop_after_ms=50, stop_via_request_cancel=True)
    assert result.output_ids_wo_prompt == greedy_outputs[prompt].ids[: len(result.output_ids_wo_prompt)]
    again = nv.inflight_batcher_llm_client(plain_server.grpc_url, tokenizer_dir=deployed.tokenizer_dir, text=prompt,
                                           request_output_len=MAX_TOKENS, streaming=True)
    assert again.check_output(greedy_outputs[prompt].ids)


@pytest.mark.parametrize(("repository", "streaming"), [("draft_target", False), ("plain", True)])
def test_inflight_batcher_llm_client_perf_metrics(request: pytest.FixtureRequest, repository: str, streaming: bool,
                                                  deployed: Deployed, greedy_outputs: dict[str, Greedy]) -> None:
    """Reproduces NVIDIA's inflight_batcher_llm_client.py --return-perf-metrics, unary and --streaming. Contract
    §1.1/§2.4: return_perf_metrics is a BOOL input; with it, every response that has output_ids carries the ten
    perf outputs (no requested-output check), which the script collects and prints `[0][0]` (L929-959, 1171-1173);
    INT32 block / draft counts, INT64 timestamps, FP32 acceptance_rate."""
    url = server(request, repository).grpc_url
    prompt = PROMPTS[3]
    result = nv.inflight_batcher_llm_client(url, tokenizer_dir=deployed.tokenizer_dir, text=prompt,
                                            request_output_len=MAX_TOKENS, streaming=streaming,
                                            return_perf_metrics=True)
    assert {name: result.perf_metrics[name].dtype for name in nv.PERF_METRIC_OUTPUTS} == {
        "kv_cache_alloc_new_blocks": np.int32, "kv_cache_reused_blocks": np.int32,
        "kv_cache_alloc_total_blocks": np.int32, "arrival_time_ns": np.int64, "first_scheduled_time_ns": np.int64,
        "first_token_time_ns": np.int64, "last_token_time_ns": np.int64, "acceptance_rate": np.float32,
        "total_accepted_draft_tokens": np.int32, "total_draft_tokens": np.int32,
    }
    assert result.check_output(greedy_outputs[prompt].ids)


@pytest.mark.parametrize(("repository", "streaming"), [("draft_target", False), ("plain", True)])
def test_inflight_batcher_llm_client_token_counts(request: pytest.FixtureRequest, repository: str, streaming: bool,
                                                  deployed: Deployed, greedy_outputs: dict[str, Greedy]) -> None:
    """Reproduces the --return-num-input-tokens --return-num-output-tokens flags of NVIDIA's
    inflight_batcher_llm_client.py (TensorRT-LLM triton_backend copy @000a01de), unary and --streaming. Contract
    §1.0/§1.1/§2.4 (1.2-era additions): BOOL inputs return_num_input_tokens / return_num_output_tokens;
    num_input_tokens [[prompt length]]; num_output_tokens [[tokens in that response]] - unary: prompt + generated,
    as the prompt is not excluded."""
    url = server(request, repository).grpc_url
    prompt = PROMPTS[3]
    result = nv.inflight_batcher_llm_client(url, tokenizer_dir=deployed.tokenizer_dir, text=prompt,
                                            request_output_len=MAX_TOKENS, streaming=streaming,
                                            return_num_input_tokens=True, return_num_output_tokens=True)
    assert nv.at(result.num_input_tokens, "num_input_tokens", 0, 0) == len(result.input_ids)
    assert result.check_output(greedy_outputs[prompt].ids)
    if not streaming:
        assert nv.at(result.num_output_tokens, "num_output_tokens", 0, 0) == len(result.output_ids_w_prompt)


def test_inflight_batcher_llm_client_requested_outputs(dt_server: Any, deployed: Deployed,
                                                       greedy_outputs: dict[str, Greedy]) -> None:
    """Reproduces NVIDIA's inflight_batcher_llm_client.py --requested-outputs output_ids sequence_length: the
    response must carry exactly the requested outputs (check_output_names, L88-94, 792-797)."""
    prompt = PROMPTS[2]
    result = nv.inflight_batcher_llm_client(dt_server.grpc_url, tokenizer_dir=deployed.tokenizer_dir, text=prompt,
                                            request_output_len=MAX_TOKENS,
                                            requested_outputs=["output_ids", "sequence_length"])
    assert result.check_output(greedy_outputs[prompt].ids)


# -- inflight_batcher_llm/client/e2e_grpc_speculative_decoding_client.py -----------------------------------------


def test_e2e_grpc_speculative_decoding_client(dt_server: Any, deployed: Deployed, tokenizer: Any,
                                              greedy_outputs: dict[str, Greedy]) -> None:
    """Reproduces NVIDIA's inflight_batcher_llm/client/e2e_grpc_speculative_decoding_client.py against the
    draft-target repository (--draft-tensorrt-llm-model-name tensorrt_llm_draft, target tensorrt_llm, all unary).
    Contract §4: preprocessing QUERY / REQUEST_OUTPUT_LEN -> INPUT_ID [1, L], BAD/STOP_WORDS_IDS, OUT_END_ID /
    OUT_PAD_ID [1, 1]; drafts = draft_output_ids[len(input_ids):seq_len] and the next sequence = the target's
    output_ids row, so both models' output_ids [1, 1, L] must include the prompt (§2.5); postprocessing
    TOKENS_BATCH [1, 1, L], SEQUENCE_LENGTH [[L]] -> OUTPUT[0].decode(), a 1-D STRING tensor (§3.2). The final
    sequence is prompt + the target's greedy ids, and some round carried drafts."""
    for prompt in PROMPTS:
        result = nv.e2e_grpc_speculative_decoding_client(
            dt_server.grpc_url, prompt, MAX_TOKENS, num_draft_tokens=num_draft_tokens(deployed),
            draft_tensorrt_llm_model_name="tensorrt_llm_draft", target_tensorrt_llm_model_name="tensorrt_llm")
        greedy = greedy_outputs[prompt]
        assert result.prompt_ids == tokenizer.encode(prompt)
        assert result.output_ids == result.prompt_ids + greedy.ids, prompt
        assert result.text == full_text(tokenizer, prompt, greedy)
        assert any(r.draft_tokens for r in result.rounds)


@pytest.mark.parametrize("model", ["tensorrt_llm", "tensorrt_llm_draft"])
def test_e2e_grpc_speculative_decoding_client_llm_request(dt_server: Any, model: str, tokenizer: Any,
                                                          target_greedy: Callable[..., Greedy]) -> None:
    """The tensorrt_llm request of NVIDIA's e2e_grpc_speculative_decoding_client.py on its own (get_trtllm_inputs,
    L85-166; unary infer, request id '1'): input_ids [1, L], input_lengths, request_output_len, the empty
    bad_words_list / stop_words_list preprocessing returns ([1, 2, 1] of 0 / -1, §3.1), beam_width [[1]],
    temperature [[1.0]], end_id, pad_id - no runtime_top_k. Contract §2.1 / TensorRT-LLM sampling defaults (module
    docstring): that is greedy; §2.4/§2.5: output_ids [1, 1, prompt + generated], sequence_length [[that]]. The
    target must give its greedy ids; the draft only has to answer that way (its greedy ids are its own)."""
    prompt = PROMPTS[1]
    ids = np.array(tokenizer.encode(prompt), dtype=np.int32)
    empty_words = np.array([[[0], [-1]]], dtype=np.int32)
    client = nv.grpcclient.InferenceServerClient(dt_server.grpc_url)
    try:
        result = client.infer(model, nv.spec_llm_inputs(
            ids, MAX_TOKENS, None, beam_width=1, temperature=1.0, bad_words_ids=empty_words,
            stop_words_ids=empty_words, end_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id,
            repetition_penalty=None, presence_penalty=None, frequency_penalty=None, return_generation_logits=False),
            request_id="1")
    finally:
        client.close()
    output_ids, length = nv.spec_llm_outputs(result, model)
    if model == "tensorrt_llm":
        greedy = target_greedy(prompt)
        assert output_ids.tolist()[-len(greedy.ids):] == greedy.ids, "temperature [[1.0]] alone must be greedy"
        assert output_ids.tolist() == ids.tolist() + greedy.ids, "output_ids must start with the prompt"
    assert output_ids.tolist()[: len(ids)] == ids.tolist(), "output_ids must start with the prompt"
    assert length == len(output_ids) > len(ids)


# -- tools/inflight_batcher_llm/end_to_end_test.py ---------------------------------------------------------------


def test_end_to_end_test_manual_chain_equals_ensemble(dt_server: Any, tokenizer: Any,
                                                      greedy_outputs: dict[str, Greedy]) -> None:
    """Reproduces NVIDIA's tools/inflight_batcher_llm/end_to_end_test.py functionality phase (default HTTP, unary
    infer; the draft-target repository's non-decoupled tensorrt_llm and ensemble). Contract §4/§3.1: preprocessing
    (QUERY, BAD/STOP_WORDS_DICT [[""]], REQUEST_OUTPUT_LEN) must return INPUT_ID, REQUEST_INPUT_LEN,
    REQUEST_OUTPUT_LEN, DECODER_INPUT_ID, OUT_END_ID, OUT_PAD_ID, which go unchanged to tensorrt_llm (input_ids,
    decoder_input_ids, input_lengths, request_output_len, end_id, pad_id), whose output_ids / sequence_length go
    to postprocessing; its OUTPUT must equal the ensemble's text_output (L305). Beyond the script: that text is
    prompt + the target's greedy text."""
    cases = nv.end_to_end_test_functionality(dt_server.http_url, list(PROMPTS), [MAX_TOKENS] * len(PROMPTS))
    for case in cases:
        assert nv.first_text(case.ensemble_output, "text_output") == full_text(tokenizer, case.prompt,
                                                                               greedy_outputs[case.prompt])


def test_end_to_end_test_performance_phase(dt_server: Any, tokenizer: Any,
                                           greedy_outputs: dict[str, Greedy]) -> None:
    """Reproduces NVIDIA's end_to_end_test.py performance phase over HTTP: warm-up infers and async_infer of the
    ensemble with text_input, max_tokens, bad_words [[""]], stop_words [[""]] and only text_output requested
    (tools/utils/utils.py:41-52); get_result() raises on any error. Beyond the script: each text is prompt + greedy
    text (§3.2)."""
    outputs = nv.end_to_end_test_performance(dt_server.http_url, list(PROMPTS), [MAX_TOKENS] * len(PROMPTS))
    assert [nv.first_text(o, "text_output") for o in outputs] == [full_text(tokenizer, p, greedy_outputs[p])
                                                                  for p in PROMPTS]


# -- tools/inflight_batcher_llm/speculative_decoding_test.py -----------------------------------------------------


def test_speculative_decoding_test_bls_matches_control(dt_server: Any, plain_server: Any, deployed: Deployed,
                                                       tokenizer: Any, greedy_outputs: dict[str, Greedy]) -> None:
    """Reproduces NVIDIA's tools/inflight_batcher_llm/speculative_decoding_test.py
    --execute-bls-speculative-decoding, control = the plain repository's ensemble (--url-control), speculative =
    the draft-target repository's tensorrt_llm_bls (--url-target) with num_draft_tokens K and use_draft_logits
    [[False]]. Contract §4: both calls also carry exclude_input_in_output [[False]] and empty [1, 0]
    embedding_bias_words / embedding_bias_weights tensors, which the ensemble and the BLS declare (§1.2/§1.5) and
    preprocessing turns into an empty bias (§3.1); the two texts must match (L359-368) - and be the target's greedy
    text, prompt first."""
    comparisons = nv.speculative_decoding_test(dt_server.grpc_url, list(PROMPTS), [MAX_TOKENS] * len(PROMPTS),
                                               url_control=plain_server.grpc_url,
                                               num_draft_tokens=num_draft_tokens(deployed))
    for c in comparisons:
        assert not c.errors, c.errors
        assert c.speculative == c.control == full_text(tokenizer, c.prompt, greedy_outputs[c.prompt]), c.prompt


def test_speculative_decoding_test_client_side_matches_control(dt_server: Any, plain_server: Any, deployed: Deployed,
                                                               tokenizer: Any,
                                                               greedy_outputs: dict[str, Greedy]) -> None:
    """Reproduces NVIDIA's speculative_decoding_test.py without --execute-bls-speculative-decoding: the control
    ensemble (plain repository) against e2e_grpc_speculative_decoding_client on the draft-target repository
    (draft tensorrt_llm_draft, target tensorrt_llm); the texts must match (L340-368) and be the greedy text."""
    comparisons = nv.speculative_decoding_test(
        dt_server.grpc_url, list(PROMPTS), [MAX_TOKENS] * len(PROMPTS), url_control=plain_server.grpc_url,
        execute_bls_speculative_decoding=False, num_draft_tokens=num_draft_tokens(deployed),
        draft_tensorrt_llm_model_name="tensorrt_llm_draft", target_tensorrt_llm_model_name="tensorrt_llm")
    for c in comparisons:
        assert not c.errors, c.errors
        assert c.speculative == c.control == full_text(tokenizer, c.prompt, greedy_outputs[c.prompt]), c.prompt


# -- tools/inflight_batcher_llm/benchmark_core_model.py ----------------------------------------------------------


@pytest.mark.parametrize(("repository", "decoupled"), [("draft_target", False), ("plain", True), ("medusa", True)])
def test_benchmark_core_model_grpc_output_lengths(request: pytest.FixtureRequest, repository: str, decoupled: bool,
                                                  deployed: Deployed, greedy_outputs: dict[str, Greedy]) -> None:
    """Reproduces NVIDIA's tools/inflight_batcher_llm/benchmark_core_model.py -i grpc dataset (with --decoupled on
    the decoupled repositories): ten warm-up requests of 100 tokens, then input_ids, input_lengths,
    request_output_len, pad_id, end_id per prompt, no requested outputs. Contract §4 (tools/utils/utils.py:349-361):
    the statistics take `outputs[0].shape[2]` of each response minus the input length - so the first output of a
    response must be output_ids [1, beams, prompt + generated] - and that must be the number of greedy tokens."""
    tok = nv.load_upstream_tokenizer(deployed.tokenizer_dir)
    end_id, pad_id = nv.upstream_special_ids(tok)
    ids = [tok.encode(p) for p in PROMPTS]
    url = server(request, repository).grpc_url
    result = nv.benchmark_core_model(url, ids, [MAX_TOKENS] * len(ids), protocol="grpc", decoupled=decoupled,
                                     pad_id=pad_id, end_id=end_id)
    assert result.output_token_lens == [len(greedy_outputs[p].ids) for p in PROMPTS]


def test_benchmark_core_model_http(dt_server: Any, deployed: Deployed) -> None:
    """Reproduces NVIDIA's benchmark_core_model.py with its default protocol HTTP (L268-276) against the
    non-decoupled tensorrt_llm: blocking warm-up infers (request_output_len 100) and async_infer + get_result(),
    which raise on any error response; the script measures nothing else over HTTP."""
    tok = nv.load_upstream_tokenizer(deployed.tokenizer_dir)
    end_id, pad_id = nv.upstream_special_ids(tok)
    ids = [tok.encode(p) for p in PROMPTS]
    result = nv.benchmark_core_model(dt_server.http_url, ids, [MAX_TOKENS] * len(ids), protocol="http",
                                     pad_id=pad_id, end_id=end_id)
    assert len(result.responses) == len(ids)


# -- README.md "Send an Inference Request" -----------------------------------------------------------------------


@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
@pytest.mark.parametrize("repository", ["draft_target", "plain", "medusa"])
def test_readme_curl_generate(request: pytest.FixtureRequest, repository: str, model: str, tokenizer: Any,
                              target_greedy: Callable[..., Greedy]) -> None:
    """Reproduces the README's curl calls (tensorrtllm_backend README.md:270, 276): POST
    /v2/models/{ensemble,tensorrt_llm_bls}/generate with text_input "What is machine learning?", max_tokens 20,
    bad_words "", stop_words "". Contract §4: both entry points exist in every repository, the empty word lists
    are accepted (§3.1: empty encodings are skipped), and text_output is one string that starts with the prompt
    (README.md:279-288) - here the prompt + the target's 20-token greedy text."""
    status, data = nv.readme_generate(server(request, repository).http_url, model)
    assert status == 200, data
    prompt = nv.README_PROMPT
    assert data["text_output"] == full_text(tokenizer, prompt, target_greedy(prompt, 20))
