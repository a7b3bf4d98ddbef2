"""specbuild.python_models.llm_backend without a server: the C++ `tensorrtllm` backend's request, response and error
rules applied to a tiny hand-made checkpoint (and, for timing, a scripted engine).

Each test's docstring names the NVIDIA/TensorRT-LLM source it checks (triton_backend/inflight_batcher_llm/src/
model_instance_state.cc = MIS, utils.cc = UC; cpp/tensorrt_llm/batch_manager/llmRequest.cpp = LR,
executor/requestImpl.h = RI, executor/samplingConfig.cpp = SC, executor/executorImpl.cpp = EX).
"""

from __future__ import annotations

import io
import json
import math
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from rich.console import Console
from safetensors import safe_open
from safetensors.torch import save_file

from specbuild.contracts.triton_backend import PERF_METRICS, TENSORRT_LLM
from specbuild.python_models.llm_backend import (
    Backend,
    BackendConfig,
    ModelLoadError,
    Response,
    convert_word_list,
    perf_metrics,
)
from specbuild.runtime.model import CausalLM
from specbuild.runtime.serving import EngineRequest, ServingEngine, Update
from specbuild.runtime.trtllm_decoding import TrtllmDecoding
from tests.tiny_models import make_model, save_model

VOCAB = 1000
MAX_INPUT, MAX_SEQ, MAX_DRAFT = 32, 64, 4
PROMPT = list(range(5, 15))
TREE = [[0], [0, 0], [1], [0, 1]]


# -- fixtures -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random LLaMA converted to a TensorRT-LLM checkpoint (what a reference bundle holds)."""
    from specbuild.convert.pipeline import ConvertRequest, convert_checkpoint

    root = tmp_path_factory.mktemp("tiny")
    save_model(make_model("llama", dtype=torch.float32), root / "hf")
    convert_checkpoint(ConvertRequest("m", root / "hf", root / "trt", dtype="float32"),
                       console=Console(file=io.StringIO()))
    return root / "trt"


@pytest.fixture(scope="module")
def medusa_checkpoint(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same checkpoint with two random Medusa heads (MedusaForCausalLM)."""
    target = tmp_path_factory.mktemp("medusa")
    for path in checkpoint.iterdir():
        (target / path.name).write_bytes(path.read_bytes())
    config = json.loads((target / "config.json").read_text())
    hidden = config["hidden_size"]
    gen = torch.Generator().manual_seed(0)
    with safe_open(target / "rank0.safetensors", "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - safe_open has no iteration
    for h in range(2):
        tensors[f"medusa_heads.{h}.medusa_layers.0.linear.weight"] = torch.randn(hidden, hidden, generator=gen) * 0.1
        tensors[f"medusa_heads.{h}.medusa_layers.0.linear.bias"] = torch.randn(hidden, generator=gen) * 0.1
        tensors[f"medusa_heads.{h}.lm_head.weight"] = tensors["lm_head.weight"].clone()
    save_file(tensors, target / "rank0.safetensors")
    config.update(architecture="MedusaForCausalLM", num_medusa_heads=2, num_medusa_layers=1,
                  max_draft_len=len(TREE))
    (target / "config.json").write_text(json.dumps(config))
    return target


@pytest.fixture(scope="module")
def llm(checkpoint: Path) -> Iterator[ServingEngine]:
    """The serving engine the reference model runs, on its own thread as in the server."""
    engine = ServingEngine(CausalLM.from_checkpoint(checkpoint), max_batch=4, max_seq_len=MAX_SEQ,
                           max_draft_len=MAX_DRAFT)
    engine.start()
    yield engine
    engine.stop()


@pytest.fixture(scope="module")
def medusa_llm(medusa_checkpoint: Path) -> Iterator[ServingEngine]:
    engine = ServingEngine(CausalLM.from_checkpoint(medusa_checkpoint), max_batch=4, max_seq_len=MAX_SEQ,
                           max_draft_len=len(TREE), medusa_choices=TREE)
    engine.start()
    yield engine
    engine.stop()


def run(engine: ServingEngine, request: EngineRequest) -> list[int]:
    """One request alone, as TensorRT-LLM's executor decodes it (the stop word kept)."""
    request.include_stop_words = True
    return engine.submit(request).wait(60).tokens


@pytest.fixture(scope="module")
def greedy(llm: ServingEngine) -> list[int]:
    """The tiny model's own greedy continuation of PROMPT (32 tokens), the expected values below."""
    return run(llm, EngineRequest(list(PROMPT), 32))


def config(**changes: Any) -> BackendConfig:
    base = dict(decoupled=True, max_input_len=MAX_INPUT, max_seq_len=MAX_SEQ, max_draft_len=MAX_DRAFT,
                vocab_size=VOCAB)
    return BackendConfig(**{**base, **changes})


def request(prompt: list[int] | list[list[int]] = PROMPT, max_tokens: int = 8, **extra: Any) -> dict[str, np.ndarray]:
    """Wire tensors as a client sends them: [B, ...] with B rows (scalars as [B, 1])."""
    rows = prompt if prompt and isinstance(prompt[0], list) else [prompt]
    width = max(len(r) for r in rows)
    ids = np.zeros((len(rows), width), dtype=np.int32)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
    tensors = {"input_ids": ids, "input_lengths": np.array([[len(r)] for r in rows], dtype=np.int32),
               "request_output_len": np.full((len(rows), 1), max_tokens, dtype=np.int32)}
    for name, value in extra.items():
        tensors[name] = value if isinstance(value, np.ndarray) else np.full((len(rows), 1), value)
    return tensors


class Log:
    def __init__(self) -> None:
        self.info: list[str] = []
        self.warn: list[str] = []


def serve(backend: Backend, inputs: dict[str, np.ndarray], requested: set[str] | None = None, *,
          request_id: str = "", cancelled: Callable[[], bool] | None = None) -> list[Response]:
    sent: list[Response] = []
    job = backend.receive(inputs, requested, sent.append, request_id=request_id, client_cancelled=cancelled)
    if job is not None:
        backend.run(job)
    return sent


def backend(engine: Any, log: Log | None = None, **changes: Any) -> Backend:
    log = log or Log()
    return Backend(config(**changes), engine, log_info=log.info.append, log_warn=log.warn.append)


def ids(response: Response) -> list[int]:
    assert response.outputs is not None, response.error
    return response.outputs["output_ids"].reshape(-1).tolist()


# -- presence and shapes --------------------------------------------------------------------------------------


def test_a_plain_request_gets_output_ids_and_sequence_length_and_nothing_else(llm: ServingEngine,
                                                                             greedy: list[int]) -> None:
    """MIS fillTritonResponse: output_ids [1, beams, len] and sequence_length [1, beams] always; every other
    output only under its rule (no return_* flag, batch 1, one sequence: none). The prompt is included by
    default (exclude_input_in_output parameter default false, MIS:799-808)."""
    requested = {t.name for t in TENSORRT_LLM.outputs if t.extra is None}
    [response] = serve(backend(llm), request(), requested)
    assert response.final and response.error is None
    assert set(response.outputs) == {"output_ids", "sequence_length"}
    assert response.outputs["output_ids"].shape == (1, 1, len(PROMPT) + 8)
    assert response.outputs["output_ids"].dtype == np.int32
    assert ids(response) == PROMPT + greedy[:8]
    assert response.outputs["sequence_length"].tolist() == [[len(PROMPT) + 8]]


def test_output_ids_must_be_requested(llm: ServingEngine) -> None:
    """MIS fillTritonResponse: TLLM_THROW("%s tensor must be present in list of output tensors") when the
    request does not ask for output_ids (then for sequence_length), wrapped as "Error encountered while
    populating response: ..."; the failed response is the row's final one."""
    [response] = serve(backend(llm), request(), {"sequence_length"})
    assert response.final and response.outputs is None
    assert response.error == ("Error encountered while populating response: output_ids tensor must be present in "
                              "list of output tensors")
    [response] = serve(backend(llm), request(), {"output_ids"})
    assert "sequence_length tensor must be present in list of output tensors" in str(response.error)


def test_generation_logits_only_with_the_flag_and_an_engine_that_gathers_them(llm: ServingEngine) -> None:
    """MIS: generation_logits only when requested and return_generation_logits is set; EX fetchNewRequests:
    "To return generation logits, gather_generation_logits must be enabled in ExecutorConfig" for an engine
    built without it; LR allocates [beams, max_new_tokens, V], so the non-streaming shape is
    [1, 1, request_output_len, V]."""
    wanted = {"output_ids", "sequence_length", "generation_logits"}
    [plain] = serve(backend(llm, gather_generation_logits=True), request(), wanted)
    assert "generation_logits" not in plain.outputs
    [refused] = serve(backend(llm), request(return_generation_logits=True), wanted)
    assert refused.final and refused.error == (
        "Executor failed process requestId 1 due to the following error: Encountered an error when fetching new "
        "request: [TensorRT-LLM][ERROR] Assertion failed: To return generation logits, gather_generation_logits "
        "must be enabled in ExecutorConfig")
    [response] = serve(backend(llm, gather_generation_logits=True), request(max_tokens=6,
                                                                         return_generation_logits=True), wanted)
    logits = response.outputs["generation_logits"]
    assert logits.shape == (1, 1, 6, VOCAB) and logits.dtype == np.float32
    out = llm.model(torch.tensor([PROMPT]), llm.model.new_cache(1, 32)).logits[0, -1]
    assert np.allclose(logits[0, 0, 0], out.numpy(), atol=1e-4)  # the raw engine logits of the first step


def test_streamed_generation_logits_hold_the_current_step_only(llm: ServingEngine) -> None:
    """LR createResult: streaming without draft tokens slices the generation logits to the tokens of this
    response ([1, 1, new tokens, V])."""
    responses = serve(backend(llm, gather_generation_logits=True),
                      request(max_tokens=3, streaming=True, return_generation_logits=True))
    assert [r.outputs["generation_logits"].shape for r in responses] == [(1, 1, 1, VOCAB)] * 3


def test_context_logits_need_gather_context_logits(llm: ServingEngine) -> None:
    """EX fetchNewRequests: "Return context logit need to build engine with gather_context_logits"; with it,
    MIS sends [1, prompt length, V] (the logits of every prompt position)."""
    wanted = {"output_ids", "sequence_length", "context_logits"}
    [refused] = serve(backend(llm), request(return_context_logits=True), wanted)
    assert "Return context logit need to build engine with gather_context_logits" in refused.error
    serve(backend(llm), request())  # the prompt is cached now: context logits must not be cut by reuse
    [response] = serve(backend(llm, gather_context_logits=True), request(return_context_logits=True), wanted)
    logits = response.outputs["context_logits"]
    assert logits.shape == (1, len(PROMPT), VOCAB)
    full = llm.model(torch.tensor([PROMPT]), llm.model.new_cache(1, 32)).logits[0]
    assert np.allclose(logits[0], full.numpy(), atol=1e-4)


def test_return_perf_metrics_adds_all_ten_whether_requested_or_not(llm: ServingEngine) -> None:
    """MIS fillTritonResponse: with return_perf_metrics all ten perf outputs ([1, 1]; INT32 blocks and draft
    counts, INT64 steady-clock nanoseconds, FP32 acceptance_rate) are added without a requested-check."""
    [response] = serve(backend(llm), request(return_perf_metrics=True), {"output_ids", "sequence_length"})
    assert set(PERF_METRICS) <= set(response.outputs)
    for name in PERF_METRICS:
        tensor = TENSORRT_LLM.output(name)
        assert response.outputs[name].shape == (1, 1), name
        assert response.outputs[name].dtype == {"TYPE_INT32": np.int32, "TYPE_INT64": np.int64,
                                                "TYPE_FP32": np.float32}[tensor.data_type]
    times = [int(response.outputs[f"{n}_ns"][0, 0]) for n in ("arrival_time", "first_scheduled_time",
                                                              "first_token_time", "last_token_time")]
    assert 0 < times[0] <= times[1] <= times[2] <= times[3] <= time.monotonic_ns()
    assert response.outputs["kv_cache_alloc_total_blocks"][0, 0] == math.ceil((len(PROMPT) + 8) / 32)


def test_a_config_without_a_perf_output_fails_like_the_cpp_backend(llm: ServingEngine) -> None:
    """UH getResponseBuffer: "Could not get response output for output tensor <name>: <Triton's error>", and
    Triton core refuses a name the config lacks ("unexpected inference output ..."): a repository whose
    tensorrt_llm config lacks one of the ten fails every return_perf_metrics request."""
    declared = frozenset(t.name for t in TENSORRT_LLM.outputs if t.name != "acceptance_rate")
    [response] = serve(backend(llm, declared_outputs=declared), request(return_perf_metrics=True))
    assert response.final and response.error == (
        "Error encountered while populating response: Could not get response output for output tensor "
        "acceptance_rate: unexpected inference output 'acceptance_rate' for model 'tensorrt_llm'")
    [fine] = serve(backend(llm, declared_outputs=declared), request())
    assert fine.error is None


def test_a_logits_dtype_other_than_the_engines_fails(llm: ServingEngine) -> None:
    """MIS fillTritonResponse: TLLM_CHECK(generationLogitsType == model_state_->getLogitsDataType()) - the
    config's logits dtype must be the engine's (float32 for specbuild's checkpoints)."""
    [response] = serve(backend(llm, gather_generation_logits=True, logits_datatype="TYPE_FP16"),
                       request(return_generation_logits=True))
    assert "Assertion failed: generationLogitsType == model_state_->getLogitsDataType()" in response.error


def test_batch_rows_are_separate_requests_with_one_final_flag(llm: ServingEngine, greedy: list[int]) -> None:
    """UC splitBatchInputsTensors: every row becomes one executor request, input_ids cut to its input_lengths;
    MIS WaitForResponse: COMPLETE_FINAL only on the final response of the last unfinished row; batch_index only
    when requested and batch > 1. The rows run side by side, so they may finish in either order."""
    short = PROMPT[:6]
    responses = serve(backend(llm), request([list(PROMPT), short], max_tokens=4, exclude_input_in_output=True))
    assert [r.final for r in responses] == [False, True]
    by_row = {int(r.outputs["batch_index"].reshape(-1)[0]): r for r in responses}
    assert sorted(by_row) == [0, 1] and all(r.outputs["batch_index"].shape == (1, 1) for r in responses)
    assert ids(by_row[0]) == greedy[:4]
    assert ids(by_row[1]) == run(llm, EngineRequest(short, 4))  # the padding was stripped
    [single] = serve(backend(llm), request())
    assert "batch_index" not in single.outputs


def test_batch_and_streaming_need_a_decoupled_model(llm: ServingEngine) -> None:
    """UC createRequestsFromInputTensors: the two refusals of a non-decoupled model, as the one final error
    response of the request (MIS enqueue -> sendEnqueueResponse)."""
    b = backend(llm, decoupled=False)
    [batch] = serve(b, request([PROMPT, PROMPT]))
    assert batch.final and batch.error == ("Batch size > 1 requires the tensorrt_llm backend to be using decoupled "
                                           "transaction policy")
    [stream] = serve(b, request(streaming=True))
    assert stream.error == "Streaming is only supported if model is deployed using decoupled mode."


def test_num_return_sequences_give_sequence_index(llm: ServingEngine) -> None:
    """MIS fillTritonResponse: sequence_index only with num_return_sequences > 1; LR createResult: each
    sequence sends its own responses and the result is final only when all are; LR createChildRequest: child i
    samples with seed + i."""
    responses = serve(backend(llm), request(max_tokens=5, num_return_sequences=np.array([[3]], dtype=np.int32),
                                            runtime_top_k=np.array([[50]], dtype=np.int32)))
    assert [r.outputs["sequence_index"].tolist() for r in responses] == [[[0]], [[1]], [[2]]]
    assert [r.final for r in responses] == [False, False, True]
    assert len({tuple(ids(r)) for r in responses}) > 1  # different seeds, different samples
    [one] = serve(backend(llm), request())
    assert "sequence_index" not in one.outputs


def test_num_input_and_output_tokens_follow_their_flags(llm: ServingEngine) -> None:
    """MIS fillTritonResponse: num_input_tokens = the row's input tokens, num_output_tokens = the tokens of all
    beams in this response (the prompt counts when it is included, non-streaming)."""
    [response] = serve(backend(llm), request(max_tokens=4, return_num_input_tokens=True,
                                             return_num_output_tokens=True))
    assert response.outputs["num_input_tokens"].tolist() == [[len(PROMPT)]]
    assert response.outputs["num_output_tokens"].tolist() == [[len(PROMPT) + 4]]
    [plain] = serve(backend(llm), request(max_tokens=4))
    assert "num_input_tokens" not in plain.outputs and "num_output_tokens" not in plain.outputs


def test_exclude_input_in_output_and_streaming(llm: ServingEngine, greedy: list[int]) -> None:
    """UC:915-927: the request's exclude_input_in_output overrides the parameter; LR createResult: non-streaming
    responses hold prompt + generated (or generated only), streaming responses only the tokens since the
    previous response whatever the flag; sequence_length counts what output_ids holds."""
    [excluded] = serve(backend(llm, exclude_input_in_output=True), request(max_tokens=5))
    assert ids(excluded) == greedy[:5] and excluded.outputs["sequence_length"].tolist() == [[5]]
    [overridden] = serve(backend(llm, exclude_input_in_output=True), request(max_tokens=5,
                                                                           exclude_input_in_output=False))
    assert ids(overridden) == PROMPT + greedy[:5]
    for exclude in (False, True):
        chunks = serve(backend(llm), request(max_tokens=5, streaming=True, exclude_input_in_output=exclude))
        assert [ids(c) for c in chunks] == [[t] for t in greedy[:5]]
        assert [c.final for c in chunks] == [False] * 4 + [True]
        assert all(c.outputs["sequence_length"].tolist() == [[1]] for c in chunks)


def test_a_stream_ended_by_the_end_id_closes_with_an_empty_response(llm: ServingEngine, greedy: list[int]) -> None:
    """LR createResult: a finished request always sends a (final) response, here with no new tokens; the end id
    itself is never output (the sampling kernels do not grow the sequence length for it)."""
    chunks = serve(backend(llm), request(max_tokens=8, streaming=True, end_id=greedy[2]))
    assert [ids(c) for c in chunks] == [[greedy[0]], [greedy[1]], []]
    assert chunks[-1].final and chunks[-1].outputs["output_ids"].shape == (1, 1, 0)


# -- request intake ------------------------------------------------------------------------------------------


def test_required_inputs_and_the_request_constructor_checks(llm: ServingEngine) -> None:
    """UC splitBatchInputsTensors / createRequestsFromInputTensors and RI Request::Impl::validate
    (TLLM_CHECK(mMaxNewTokens > 0), TLLM_CHECK(!mInputTokenIds.empty())): one final error response each."""
    b = backend(llm)
    no_ids = {k: v for k, v in request().items() if k != "input_ids"}
    assert serve(b, no_ids)[0].error == "inputTokens or encoderInputFeatures tensor not provided"
    no_len = {k: v for k, v in request().items() if k != "request_output_len"}
    assert serve(b, no_len)[0].error == "request_output_len is not present in the request"
    for max_tokens in (0, -3):
        [response] = serve(b, request(max_tokens=max_tokens))
        assert response.final and response.error == "[TensorRT-LLM][ERROR] Assertion failed: mMaxNewTokens > 0"
    assert serve(b, request(prompt=[]))[0].error == "[TensorRT-LLM][ERROR] Assertion failed: !mInputTokenIds.empty()"
    [wide] = serve(b, request(end_id=np.array([[2, 3]], dtype=np.int32)))
    assert wide.error == "[TensorRT-LLM][ERROR] Assertion failed: Invalid size for tensor end_id"


def test_word_lists_are_checked_like_convert_word_list() -> None:
    """UC convertWordList: ids then cumulative end offsets padded with -1, with its four error texts."""
    assert convert_word_list([5, 6, 7, 2, 3, -1]) == ((5, 6), (7,))
    cases = {"odd length": [1, 2, 3], "additional -1s": [5, 6, -1, 2], "out-of-bound offsets": [5, 6, 3, -1],
             "non-increasing offsets": [5, 6, 1, 1]}
    for what, flat in cases.items():
        with pytest.raises(Exception, match=f"Sparse list must not have {what}: "):
            convert_word_list(flat)


def test_sampling_config_checks_and_top_p_zero_is_dropped(llm: ServingEngine, greedy: list[int]) -> None:
    """SC SamplingConfig checks (TLLM_CHECK texts), UC getSamplingConfigFromTensors drops runtime_top_p <= 0
    (then both top_k and top_p are unset: greedy, samplingTopKKernels.cu setupTopKRuntimeArgs)."""
    b = backend(llm)
    assert serve(b, request(runtime_top_k=np.array([[-1]], dtype=np.int32)))[0].error == \
        "[TensorRT-LLM][ERROR] Assertion failed: topK.value() >= 0"
    assert serve(b, request(temperature=np.array([[-0.5]], dtype=np.float32)))[0].error == \
        "[TensorRT-LLM][ERROR] Assertion failed: temperature.value() >= 0.f"
    assert serve(b, request(repetition_penalty=np.array([[0.0]], dtype=np.float32)))[0].error == \
        "[TensorRT-LLM][ERROR] Assertion failed: repetitionpenalty.value() > 0.f"
    [response] = serve(b, request(max_tokens=6, runtime_top_p=np.array([[0.0]], dtype=np.float32),
                                  temperature=np.array([[1.0]], dtype=np.float32), exclude_input_in_output=True))
    assert ids(response) == greedy[:6]


def test_beam_search_is_refused_by_the_reference(llm: ServingEngine) -> None:
    """The one place the reference is less capable than the C++ backend (beam_width default 1, UC): it says so."""
    [response] = serve(backend(llm), request(beam_width=np.array([[2]], dtype=np.int32)))
    assert response.final and "beam width 1 only" in response.error
    assert serve(backend(llm), request(beam_width=np.array([[0]], dtype=np.int32)))[0].error.startswith(
        "[TensorRT-LLM][ERROR] Assertion failed: beamWidth > 0")


def test_lookahead_inputs_need_a_lookahead_model(llm: ServingEngine) -> None:
    """UC getLookaheadDecodingFromTensors: per-request lookahead_* without the instance's lookahead parameters
    is refused; MIS: decoding_mode lookahead without them does not load."""
    one = np.array([[2]], dtype=np.int32)
    [response] = serve(backend(llm), request(lookahead_window_size=one, lookahead_ngram_size=one,
                                             lookahead_verification_set_size=one))
    assert response.error == ("[TensorRT-LLM][ERROR] Assertion failed: Cannot set the request lookahead decoding "
                              "configuration when model instance lookahead parameters are not set.")
    engine = type("E", (), dict(max_input_len=8, max_seq_len=16, max_draft_len=0, vocab_size=10,
                                gather_context_logits=False, gather_generation_logits=False))()
    with pytest.raises(ModelLoadError, match="Decoding mode is set to lookahead but lookahead parameters are not"):
        BackendConfig.from_model({"decoding_mode": "lookahead"}, {}, engine)
    parsed, warnings = BackendConfig.from_model({"decoding_mode": "", "exclude_input_in_output": "${x}"}, {}, engine)
    assert parsed.decoding_mode == "top_k_top_p" and not parsed.exclude_input_in_output
    assert warnings and "decoding_mode parameter is invalid or not specified" in warnings[0]


def test_guided_decoding_without_a_guided_decoder_is_refused(llm: ServingEngine) -> None:
    """EX fetchNewRequests: a request with a valid guide type on an executor without a GuidedDecodingConfig
    (guided_decoding_backend unset) is refused; UC: unknown guide types mean no guided decoding."""
    guide = np.array([[b"json"]], dtype=object)
    [response] = serve(backend(llm), request(guided_decoding_guide_type=guide))
    assert "Request is specified with GuidedDecodingParams, but GuidedDecoder is not setup" in response.error
    [ignored] = serve(backend(llm), request(guided_decoding_guide_type=np.array([[b"nope"]], dtype=object)))
    assert ignored.error is None


def test_ignored_inputs_are_noted_once_per_load(llm: ServingEngine) -> None:
    """Inputs NVIDIA's backend reads for features the reference lacks (LoRA here) are accepted and ignored with
    one note per model load and input name; UC's own shape checks still apply to them."""
    log = Log()
    b = backend(llm, log)
    task = np.array([[7]], dtype=np.uint64)
    for _ in range(3):
        assert serve(b, request(max_tokens=2, lora_task_id=task))[0].error is None
    assert sum("lora_task_id" in line for line in log.info) == 1
    ends = np.array([[1, 2]], dtype=np.int32)
    [bad] = serve(b, request(retention_token_range_starts=np.array([[0]], dtype=np.int32),
                             retention_token_range_ends=ends))
    assert bad.error.startswith("retention_token_range_ends must be provided, and have the same length")


# -- executor admission (LlmRequest::validate) ------------------------------------------------------------------


def test_a_prompt_above_max_input_len_is_refused_with_the_executors_text(llm: ServingEngine) -> None:
    """LR validate + EX fetchNewRequests + MIS fillTritonResponse: the three texts wrapped in one another."""
    [response] = serve(backend(llm), request(prompt=list(range(5, 5 + MAX_INPUT + 1))))
    assert response.final and response.error == (
        "Executor failed process requestId 1 due to the following error: Encountered an error when fetching new "
        f"request: Prompt length ({MAX_INPUT + 1}) exceeds maximum input length ({MAX_INPUT}). Set log level to info "
        "and check TRTGptModel logs for how maximum input length is set")


def test_too_many_output_tokens_are_shortened_with_the_warning(llm: ServingEngine, greedy: list[int]) -> None:
    """LR validate: prompt + max_new_tokens + draft tokens per step (the engine's max_draft_len even without
    drafts) > max_seq_len shortens max_new_tokens, with TLLM_LOG_WARNING's text; no error."""
    log = Log()
    [response] = serve(backend(llm, log, exclude_input_in_output=True), request(max_tokens=100))
    allowed = MAX_SEQ - len(PROMPT) - MAX_DRAFT
    assert response.error is None and len(ids(response)) == allowed
    assert log.warn == [
        f"[TensorRT-LLM][WARNING] Prompt length + number of requested output tokens + draft tokens per step "
        f"({len(PROMPT)} + 100 + {MAX_DRAFT}) exceeds maximum sequence length ({MAX_SEQ}). Number of requested "
        f"output tokens is changed to ({allowed})."]


def test_draft_token_limits(llm: ServingEngine) -> None:
    """LR validate: more drafts than max_draft_len is an error; prompt + drafts > max_input_len truncates the
    drafts with a warning."""
    [refused] = serve(backend(llm), request(draft_input_ids=np.array([[1] * (MAX_DRAFT + 1)], dtype=np.int32)))
    assert refused.error.endswith(f"Draft tokens length ({MAX_DRAFT + 1}) exceeds maximum draft tokens length "
                                  f"({MAX_DRAFT}).")
    log = Log()
    long_prompt = list(range(5, 5 + MAX_INPUT - 1))
    [response] = serve(backend(llm, log, max_seq_len=100), request(long_prompt, max_tokens=3, return_perf_metrics=True,
                                                                  draft_input_ids=np.array([[1, 2, 3]], np.int32)))
    assert response.error is None and response.outputs["total_draft_tokens"].tolist() == [[1]]
    assert log.warn[0] == (f"[TensorRT-LLM][WARNING] Prompt length + number of draft tokens ({MAX_INPUT - 1} + 3) "
                           f"exceeds maximum input length ({MAX_INPUT}).Number of draft tokens is changed to (1)")


def test_end_id_must_be_in_range(llm: ServingEngine) -> None:
    """LR validate: TLLM_CHECK_WITH_INFO "EndId (%d) is not within acceptable range [-1, %d)."."""
    [response] = serve(backend(llm), request(end_id=np.array([[VOCAB]], dtype=np.int32)))
    assert response.error.endswith(f"Assertion failed: EndId ({VOCAB}) is not within acceptable range "
                                   f"[-1, {VOCAB}).")


def test_an_admission_error_in_one_row_leaves_the_others(llm: ServingEngine) -> None:
    """EX: each row is its own executor request, so one row's error is that row's (non-final) error response and
    the other rows still run; the FINAL flag stays on the last row."""
    responses = serve(backend(llm), request([list(range(5, 5 + MAX_INPUT + 1)), list(PROMPT)], max_tokens=2))
    assert responses[0].error and not responses[0].final
    assert responses[1].error is None and responses[1].final


# -- stop and cancellation -------------------------------------------------------------------------------------


class ScriptedEngine:
    """Emits one token per step after waiting for `gate` (so a test can stop it midway), on its own thread as the
    serving engine runs; asks the request's `cancelled` between steps as the engine does."""

    def __init__(self, pause_s: float = 0.0) -> None:
        self.gate = threading.Event()
        self.steps = 0
        self.pause_s = pause_s

    def submit(self, req: EngineRequest) -> None:
        threading.Thread(target=self._run, args=(req,), daemon=True).start()

    def _run(self, req: EngineRequest) -> None:
        assert req.on_update is not None and req.cancelled is not None
        tokens: list[int] = []
        while True:
            self.gate.wait(5)
            time.sleep(self.pause_s)
            self.steps += 1
            tokens.append(7)
            done = len(tokens) >= req.max_new_tokens
            req.on_update(Update([7], finished=done, reason="length" if done else None))
            if done:
                return
            if req.cancelled():
                req.on_update(Update([], finished=True, reason="cancelled"))
                return


def test_stop_command_cancels_every_row_of_that_request_id() -> None:
    """MIS handleStopRequest: `stop` true is a command - the requests registered under the same Triton request
    id are cancelled and the stop request gets an empty final response; an unknown id is no error, no id is.
    EX terminateCancelledRequests: a cancelled request ends with a final response of what it produced."""
    engine = ScriptedEngine(pause_s=0.01)
    b = backend(engine, max_seq_len=10_000)
    sent: list[Response] = []
    job = b.receive(request(max_tokens=1000, streaming=True), None, sent.append, request_id="abc")
    worker = threading.Thread(target=b.run, args=(job,))
    worker.start()
    engine.gate.set()
    while engine.steps < 3:
        time.sleep(0.01)
    acks: list[Response] = []
    stop = request([0], max_tokens=0, stop=True)
    stop["input_lengths"][:] = 0
    assert b.receive(stop, None, acks.append, request_id="abc") is None
    worker.join(5)
    assert acks == [Response(final=True)]
    assert sent[-1].final and sent[-1].outputs["output_ids"].shape == (1, 1, 0)
    assert len(sent) < 1000
    assert b.receive(stop, None, acks.append, request_id="gone") is None and acks[-1] == Response(final=True)
    b.receive(stop, None, acks.append)
    assert acks[-1] == Response(error="Trying to stop a request but request ID is not provided", final=True)


def test_client_cancellation_is_polled_at_the_check_period() -> None:
    """MIS WaitForCancel: every cancellation_check_period_ms the backend asks whether the client cancelled and
    cancels the executor request."""
    engine = ScriptedEngine()
    engine.gate.set()
    polls: list[int] = []

    def cancelled() -> bool:
        polls.append(1)
        return True

    sent = serve(backend(engine, cancellation_check_period_ms=0), request(max_tokens=1000, streaming=True),
                 cancelled=cancelled)
    assert sent[-1].final and len(sent) == 2 and polls == [1]
    slow = ScriptedEngine()
    slow.gate.set()
    polls.clear()
    serve(backend(slow, cancellation_check_period_ms=60_000), request(max_tokens=20), cancelled=cancelled)
    assert polls == [] and slow.steps == 20


# -- the engine's decoding semantics ---------------------------------------------------------------------------


def test_log_probs_follow_normalize_log_probs(llm: ServingEngine, greedy: list[int]) -> None:
    """samplingTopKKernels.cu topKStage2Sampling: output_log_probs = log P(token) renormalised over the top-k
    candidates when normalize_log_probs (default true) - 0 for greedy (top-k 1) - else the plain log softmax;
    cum_log_probs sums the unnormalised ones. Shapes [1, beams, tokens] and [1, beams] (MIS)."""
    wanted = {"output_ids", "sequence_length", "output_log_probs", "cum_log_probs"}
    [normalized] = serve(backend(llm), request(max_tokens=4, return_log_probs=True), wanted)
    [plain] = serve(backend(llm, normalize_log_probs=False), request(max_tokens=4, return_log_probs=True), wanted)
    assert normalized.outputs["output_log_probs"].shape == (1, 1, 4)
    assert np.allclose(normalized.outputs["output_log_probs"], 0.0)
    logits = llm.model(torch.tensor([PROMPT + greedy[:3]]), llm.model.new_cache(1, 32)).logits[0, len(PROMPT) - 1:]
    expected = [float(torch.log_softmax(logits[i], -1)[greedy[i]]) for i in range(4)]
    assert np.allclose(plain.outputs["output_log_probs"].reshape(-1), expected, atol=1e-4)
    for response in (normalized, plain):
        assert np.allclose(response.outputs["cum_log_probs"], [[sum(expected)]], atol=1e-3)


def test_stop_words_are_output_and_min_tokens_hold_back_the_end_id(llm: ServingEngine, greedy: list[int]) -> None:
    """stopCriteriaKernels.cu: the sequence ends with the stop word included; penaltyKernels.cu: the end id is
    masked while fewer than min_tokens tokens are generated."""
    words = np.array([[[greedy[3], greedy[4]], [2, -1]]], dtype=np.int32)
    [stopped] = serve(backend(llm, exclude_input_in_output=True), request(max_tokens=16, stop_words_list=words))
    assert ids(stopped) == greedy[:5]
    [held] = serve(backend(llm, exclude_input_in_output=True),
                   request(max_tokens=6, end_id=np.array([[greedy[0]]], dtype=np.int32),
                           min_tokens=np.array([[3]], dtype=np.int32)))
    assert len(ids(held)) >= 3 and greedy[0] not in ids(held)[:3]


def test_penalties_and_embedding_bias_as_the_penalty_kernel(llm: ServingEngine) -> None:
    """penaltyKernels.cu batchApplyPenalty: bias added, logits / (temperature + 1e-6), then for tokens in the
    sequence repetition (negative * p, positive / p), presence (- p) and frequency (- p * count); min length
    masks the end id with -FLT_MAX."""
    logits = torch.tensor([[2.0, -2.0, 1.0, 0.5]])
    decoding = TrtllmDecoding(temperature=0.5, repetition_penalty=2.0, presence_penalty=0.1, frequency_penalty=0.2,
                              end_id=3, min_tokens=1, embedding_bias=torch.tensor([0.5, 0.0, 0.0, 0.0]))
    out = decoding.process(logits, [0, 1, 1], 0)[0]
    inv = 1.0 / (0.5 + 1e-6)
    assert out[0] == pytest.approx((2.5 * inv) / 2.0 - 0.1 - 0.2 * 1)
    assert out[1] == pytest.approx((-2.0 * inv) * 2.0 - 0.1 - 0.2 * 2)
    assert out[2] == pytest.approx(1.0 * inv)
    assert out[3] == pytest.approx(float(torch.finfo(torch.float32).min))


def test_external_drafts_verify_then_decode_to_max_new_tokens(llm: ServingEngine, greedy: list[int]) -> None:
    """LR/EX: draft_input_ids only add draft tokens to the first generation step; the request still runs to its
    request_output_len. Perf metrics: total_draft_tokens += drafts, accepted += new tokens - 1
    (llmRequest.h updateNumTokensPerIteration)."""
    drafts = np.array([[greedy[0], greedy[1], (greedy[2] + 1) % VOCAB]], dtype=np.int32)
    [response] = serve(backend(llm, exclude_input_in_output=True),
                       request(max_tokens=8, draft_input_ids=drafts, return_perf_metrics=True))
    assert ids(response) == greedy[:8]
    assert response.outputs["total_draft_tokens"].tolist() == [[3]]
    assert response.outputs["total_accepted_draft_tokens"].tolist() == [[2]]
    assert response.outputs["acceptance_rate"][0, 0] == pytest.approx(2 / 3)


def test_medusa_speculates_at_nvidias_default_temperature(medusa_llm: ServingEngine, llm: ServingEngine,
                                                           greedy: list[int]) -> None:
    """medusaDecodingLayer.cpp: Medusa draws the model's token at each node by top-K with the request's
    runtime_top_k (1 when unset) and applies no temperature (DecodingMode::Medusa has no penalties), so NVIDIA's
    end_to_end_grpc_client defaults (temperature [[1.0]], no top_k) still decode greedily with the tree; a
    top_k > 1 samples the tokens and still speculates."""
    log = Log()
    b = backend(medusa_llm, log, decoding_mode="medusa", max_draft_len=len(TREE), exclude_input_in_output=True)
    [response] = serve(b, request(max_tokens=12, temperature=np.array([[1.0]], dtype=np.float32),
                                  return_perf_metrics=True))
    assert ids(response) == greedy[:12]
    assert response.outputs["total_draft_tokens"][0, 0] > 0
    assert any("temperature" in line for line in log.info)
    [sampled] = serve(b, request(max_tokens=12, runtime_top_k=np.array([[20]], dtype=np.int32),
                                 return_perf_metrics=True))
    assert len(ids(sampled)) == 12 and sampled.outputs["total_draft_tokens"][0, 0] > 0


def test_perf_block_counts_are_derived_from_the_sequence() -> None:
    """KV blocks of TensorRT-LLM's default 32 tokens (tensorrt_llm/plugin/plugin.py tokens_per_block): total =
    the sequence's blocks, reused = whole blocks of the reused prefix; acceptance_rate = accepted / drafted
    (LR createResult)."""
    metrics = perf_metrics(arrival=1, first_scheduled=2, first_token=3, last_token=4, prompt=70, generated=10,
                           reused_tokens=69, accepted=3, drafted=4)
    assert metrics["kv_cache_alloc_total_blocks"] == 3 and metrics["kv_cache_reused_blocks"] == 2
    assert metrics["kv_cache_alloc_new_blocks"] == 1 and metrics["acceptance_rate"] == 0.75
