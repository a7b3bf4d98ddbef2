"""A `build.flow: pytorch` repository with `build.backend: reference` served by a real tritonserver: Triton's
llmapi interface (tensorrt_llm, model.yaml) answers the same prompts with the same text as the engine-style
repository of the same target and draft (tests/deploy_fixtures.py `deployed`, configs/demo.yaml's pipeline), over
HTTP generate and gRPC streaming, as NVIDIA's docs call the llmapi model."""

from __future__ import annotations

import itertools
import json
import queue
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.deploy_fixtures import PROMPTS, Deployed, deploy_pytorch_flow, http_post, pipeline_data

pytestmark = pytest.mark.tritonserver
MAX_TOKENS = 24


def _llmapi_repository(root: Path, models: dict[str, Path]) -> Path:
    data = pipeline_data("demo-llmapi", models, "draft_target", root / "out")
    data["speculative"]["draft_len_schedule"] = {1: 4, 4: 0}  # speculation off from 4 sequences: both paths served
    return deploy_pytorch_flow(root, data)


def _eagle3_repository(root: Path, models: dict[str, Path], draft: Path) -> Path:
    """The demo EAGLE-3 pipeline (configs/demo-eagle3.yaml's models: the demo target and the demo extra
    eagle3-draft), at K = 4."""
    data = pipeline_data("demo-eagle3", models, "eagle3", root / "out")
    data["draft"] = {"model": str(draft)}
    data["speculative"]["num_draft_tokens"] = 4
    return deploy_pytorch_flow(root, data)


def _served(repository: Path, log: Path) -> Iterator[Any]:
    from specbuild.serve.server import TritonServer

    with TritonServer(repository, log_file=log, ready_timeout_s=420) as server:
        yield server


@pytest.fixture(scope="module", name="llmapi_server")
def llmapi_server_fixture(tmp_path_factory: pytest.TempPathFactory, demo_models: dict[str, Path]) -> Iterator[Any]:
    root = tmp_path_factory.mktemp("llmapi")
    yield from _served(_llmapi_repository(root, demo_models), root / "server.log")


@pytest.fixture(scope="module", name="eagle3_server")
def eagle3_server_fixture(tmp_path_factory: pytest.TempPathFactory, demo_models: dict[str, Path],
                          demo_extra: Any) -> Iterator[Any]:
    root = tmp_path_factory.mktemp("llmapi-eagle3")
    yield from _served(_eagle3_repository(root, demo_models, demo_extra("eagle3-draft")), root / "server.log")


def _generate(url: str, prompt: str, **fields: Any) -> tuple[int, dict[str, Any]]:
    status, body = http_post(url, "/v2/models/tensorrt_llm/generate",
                             {"text_input": prompt, "sampling_param_max_tokens": MAX_TOKENS, **fields})
    return status, json.loads(body)


def _stream(url: str, prompt: str, **inputs: np.ndarray) -> list[Any]:
    """gRPC streaming as NVIDIA's llmapi docs send it: text_input and streaming true; every response's outputs."""
    import tritonclient.grpc as grpcclient

    responses: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    tensors = {"text_input": np.array([prompt.encode()], dtype=object), "streaming": np.array([True]),
               "sampling_param_max_tokens": np.array([MAX_TOKENS], dtype=np.int32), **inputs}
    infer_inputs = []
    for name, array in tensors.items():
        dtype = {np.dtype(object): "BYTES", np.dtype(bool): "BOOL", np.dtype(np.int32): "INT32"}[array.dtype]
        tensor = grpcclient.InferInput(name, list(array.shape), dtype)
        tensor.set_data_from_numpy(array)
        infer_inputs.append(tensor)
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        client.async_stream_infer("tensorrt_llm", infer_inputs, enable_empty_final_response=True)
        got = []
        while True:
            result, error = responses.get(timeout=120)
            assert error is None, error
            final = result.get_response().parameters["triton_final_response"].bool_param
            if result.as_numpy("text_output") is not None:
                got.append(result)
            if final:
                return got
    finally:
        client.stop_stream()
        client.close()


def test_llmapi_answers_as_the_engine_repository(llmapi_server: Any, dt_server: Any, deployed: Deployed,
                                                 greedy_reference: dict[str, str]) -> None:
    """Greedy, not streamed: the llmapi text (prompt first, helpers.py's exclude_input_from_output default false)
    equals the engine-style BLS's (exclude_input_in_output default false); excluded, it is the completion, equal to
    the target's plain greedy one; the finish reason and perf metrics come as NVIDIA's model.py sends them."""
    for prompt in PROMPTS:
        status, engine = http_post(dt_server.http_url, "/v2/models/tensorrt_llm_bls/generate",
                                   {"text_input": prompt, "max_tokens": MAX_TOKENS})
        assert status == 200, engine
        status, llmapi = _generate(llmapi_server.http_url, prompt)
        assert status == 200, llmapi
        assert llmapi["text_output"] == json.loads(engine)["text_output"], prompt
        status, excluded = _generate(llmapi_server.http_url, prompt, sampling_param_exclude_input_from_output=True,
                                     return_finish_reason=True, sampling_param_return_perf_metrics=True)
        assert status == 200, excluded
        assert excluded["text_output"] == greedy_reference[prompt], prompt
        assert excluded["finish_reason"] in ("stop", "length")
        assert int(excluded["total_draft_tokens"]) >= int(excluded["total_accepted_draft_tokens"]) >= 0


def test_llmapi_streams_the_whole_text_so_far(llmapi_server: Any, greedy_reference: dict[str, str]) -> None:
    """gRPC streaming: every response holds the completion so far (CompletionOutput.text, never the prompt), each
    one extending the last; the last is the whole greedy completion."""
    for prompt in PROMPTS[:2]:
        texts = [r.as_numpy("text_output")[0].decode() for r in _stream(llmapi_server.grpc_url, prompt)]
        assert texts and texts[-1] == greedy_reference[prompt], (prompt, texts)
        assert all(later.startswith(earlier) for earlier, later in itertools.pairwise(texts)), texts


def test_llmapi_refusals_over_the_wire(llmapi_server: Any) -> None:
    """Refused as NVIDIA's model.py refuses: SamplingParams' text inside "Error generating request: ...", and the
    server keeps serving."""
    status, body = _generate(llmapi_server.http_url, PROMPTS[0], sampling_param_top_k=-1)
    assert status >= 400 and "Error generating request: require top_k >= 0, got top_k=-1" in body["error"], body
    status, body = _generate(llmapi_server.http_url, PROMPTS[0], sampling_param_max_tokens=2)
    assert status == 200 and body["text_output"].startswith(PROMPTS[0][:3])


def test_eagle3_serves_the_targets_greedy_text(eagle3_server: Any, greedy_reference: dict[str, str]) -> None:
    """speculative_config Eagle (the demo EAGLE-3 draft) over HTTP generate and gRPC streaming: the completion is
    the target's plain greedy one, with drafts proposed and counted in the perf metrics; streamed, every response
    extends the last."""
    for prompt in PROMPTS:
        status, body = _generate(eagle3_server.http_url, prompt, sampling_param_exclude_input_from_output=True,
                                 sampling_param_return_perf_metrics=True, return_finish_reason=True)
        assert status == 200, body
        assert body["text_output"] == greedy_reference[prompt], prompt
        assert body["finish_reason"] in ("stop", "length")
        assert int(body["total_draft_tokens"]) >= int(body["total_accepted_draft_tokens"]) >= 0
        assert int(body["total_draft_tokens"]) > 0, body
    for prompt in PROMPTS[:2]:
        texts = [r.as_numpy("text_output")[0].decode() for r in _stream(eagle3_server.grpc_url, prompt)]
        assert texts and texts[-1] == greedy_reference[prompt], (prompt, texts)
        assert all(later.startswith(earlier) for earlier, later in itertools.pairwise(texts)), texts


def test_eagle3_answers_concurrent_requests(eagle3_server: Any, greedy_reference: dict[str, str]) -> None:
    """Every prompt sent at once (HTTP and gRPC streaming mixed): all answered, each with its own greedy text."""
    from concurrent.futures import ThreadPoolExecutor

    def http(prompt: str) -> str:
        status, body = _generate(eagle3_server.http_url, prompt, sampling_param_exclude_input_from_output=True)
        assert status == 200, body
        return body["text_output"]

    def grpc(prompt: str) -> str:
        return _stream(eagle3_server.grpc_url, prompt)[-1].as_numpy("text_output")[0].decode()

    jobs = [(prompt, how) for prompt in PROMPTS for how in (http, grpc)]
    with ThreadPoolExecutor(len(jobs)) as pool:
        answers = list(pool.map(lambda job: job[1](job[0]), jobs))
    assert answers == [greedy_reference[prompt] for prompt, _ in jobs]


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_bench_load_generator_speaks_llmapi(eagle3_server: Any, greedy_reference: dict[str, str],
                                            protocol: str) -> None:
    """`specbuild bench`'s load generator on the llmapi model: its own input names (sampling_param_max_tokens,
    streaming, sampling_param_exclude_input_from_output), the cumulative streamed text read as one completion, the
    acceptance outputs read from the perf metrics."""
    from specbuild.bench.client import LLMClient
    from specbuild.bench.load import Load, run_load

    url = eagle3_server.grpc_url if protocol == "grpc" else eagle3_server.http_url
    with LLMClient(url, protocol=protocol) as client:
        assert client.model.names.interface == "llmapi"
    summary = run_load(url, Load(prompts=PROMPTS[:2], max_tokens=MAX_TOKENS, concurrency=2, requests=2,
                                 warmup=False), protocol=protocol)
    assert summary.errors == 0 and summary.requests == 2, summary.first_error
    assert summary.sample_answer in {greedy_reference[p] for p in PROMPTS[:2]}, summary.sample_answer
    assert summary.draft_tokens > 0 and summary.acceptance_rate is not None


def test_bench_refuses_a_draft_length_the_llmapi_model_cannot_take(llmapi_server: Any, dt_server: Any) -> None:
    """`bench --num-draft-tokens` on the llmapi model (no num_draft_tokens input: the LLM API drafts its
    speculative_config's length) used to drop the option and measure the deployed K, silently. Measuring it is
    refused naming the option and the model; as the --compare baseline of an endpoint that takes the option it is
    measured as deployed, and bench says so."""
    from typer.testing import CliRunner

    from specbuild.cli import app

    refused = CliRunner().invoke(app, ["bench", llmapi_server.grpc_url, "--num-draft-tokens", "0", "--requests", "1"])
    output = " ".join(refused.output.split())
    assert refused.exit_code == 1 and "Traceback" not in output, output
    assert "--num-draft-tokens 0: model" in output and "has no num_draft_tokens input" in output, output
    compared = CliRunner().invoke(app, ["bench", dt_server.grpc_url, "--num-draft-tokens", "2", "--requests", "1",
                                        "--max-tokens", "4", "--compare", llmapi_server.grpc_url])
    output = " ".join(compared.output.split())
    assert compared.exit_code == 0, output
    assert "note: compare" in output and "has no num_draft_tokens input" in output, output
