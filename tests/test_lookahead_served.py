"""Lookahead decoding served end to end: configs/demo-lookahead.yaml converted, built (reference backend) and
deployed into a temporary directory, one real tritonserver on it, requests through the ensemble and straight to
the tensorrt_llm model.

What users rely on: Lookahead changes how many tokens a target forward yields, never which tokens, so every answer
is the target's plain greedy text (computed here in-process by the reference runtime from the same converted
checkpoint, never written down: the demo weights differ per CPU); draft tokens were accepted by the reference
backend's count (Lookahead ran, not plain decoding); a request's own lookahead_* (w, n, g) inside the server's
answers the same, one beyond it gets TensorRT-LLM's refusal; each response holds exactly the outputs the C++
backend creates for the request's flags, by specbuild.contracts.triton_backend's presence rules (taken from
NVIDIA/TensorRT-LLM triton_backend/inflight_batcher_llm/src/model_instance_state.cc @0c8de69a
fillTritonResponse). No TensorRT-LLM runs here: the reference backend serves. One server start.
"""

from __future__ import annotations

import queue
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import yaml

from specbuild.contracts import lookahead as la
from specbuild.contracts.triton_backend import TENSORRT_LLM
from specbuild.spec import PipelineSpec
from tests.deploy_fixtures import MAX_TOKENS, PROMPTS, convert_and_build, write_spec
from tests.test_deploy_serving import PERF, _input, expected, grpc_generate

pytestmark = [pytest.mark.slow, pytest.mark.tritonserver]

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "demo-lookahead.yaml"
DEFAULT_WINDOW = (4, 3, 4)  # TensorRT-LLM's kDefaultLookaheadDecoding{Window,Ngram,VerificationSet} (executor.h)


@dataclass(frozen=True)
class Plain:
    """The target's plain greedy answer to one prompt: prompt ids, new ids, new text."""

    prompt_ids: list[int]
    ids: list[int]
    text: str


@dataclass
class Served:
    spec: PipelineSpec
    server: Any
    plain: dict[str, Plain]
    end_id: int


def _plain_greedy(spec: PipelineSpec) -> tuple[dict[str, Plain], int]:
    """Plain greedy (no Lookahead) by the reference runtime on the checkpoint the engine serves."""
    import torch

    from specbuild.contracts.engine_info import engine_dir, reference_checkpoint
    from specbuild.runtime.generation import generate
    from specbuild.runtime.model import CausalLM
    from specbuild.runtime.sequence import StopCriteria
    from specbuild.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(spec.target.model)
    model = CausalLM.from_checkpoint(reference_checkpoint(engine_dir(spec, "target")))
    plain = {}
    with torch.inference_mode():
        for prompt in PROMPTS:
            ids = tokenizer.encode(prompt, add_special_tokens=True)
            out = generate(model, [ids], stop=StopCriteria(MAX_TOKENS, tokenizer.eos_token_id)).output_ids[0]
            plain[prompt] = Plain(ids, list(out), tokenizer.decode(out, skip_special_tokens=True))
    return plain, int(tokenizer.eos_token_id)


@pytest.fixture(scope="module", name="served")
def served_fixture(tmp_path_factory: pytest.TempPathFactory, demo_models: dict[str, Path]) -> Iterator[Served]:
    """The shipped demo spec with the session's demo target, a private output_dir and the reference backend."""
    from specbuild.deploy.repository import deploy_repository
    from specbuild.serve.server import TritonServer

    root = tmp_path_factory.mktemp("lookahead")
    data = yaml.safe_load(CONFIG.read_text(encoding="utf-8"))
    data["target"]["model"] = str(demo_models["target"])
    data["output_dir"] = str(root / "out")
    data["build"]["backend"] = "reference"
    # TensorRT-LLM's default window, whose limits (16 tokens per step) the refusal below is NVIDIA's text for;
    # the demo's own tuned (W, N, G) is served by bench/serving_bench.py
    data["speculative"]["lookahead"] = dict(zip(la.LookaheadConfig._fields, DEFAULT_WINDOW, strict=True))
    data["speculative"].pop("draft_len_schedule", None)  # the demo window's schedule: its lengths are not this one's
    spec = write_spec(root / "specs", data)
    convert_and_build(spec)
    deploy_repository(spec)
    plain, end_id = _plain_greedy(spec)
    repository = spec.deploy.model_repository
    assert repository is not None
    with TritonServer(repository, log_file=root / "server.log", ready_timeout_s=420) as server:
        yield Served(spec, server, plain, end_id)


def plain_text(served: Served) -> dict[str, str]:
    return {prompt: plain.text for prompt, plain in served.plain.items()}


def test_the_spec_deploys_the_window_it_asks_for(served: Served) -> None:
    """The spec asks for (4, 3, 4); the tensorrt_llm model is deployed with exactly that."""
    assert served.spec.speculative.lookahead_config().config == DEFAULT_WINDOW
    repository = served.spec.deploy.model_repository
    assert repository is not None
    config = (repository / "tensorrt_llm" / "config.pbtxt").read_text(encoding="utf-8")
    assert 'key: "decoding_mode" value: { string_value: "lookahead" }' in config
    for name, value in zip(la.PARAMETERS, (4, 3, 4), strict=True):
        assert f'key: "{name}" value: {{ string_value: "{value}" }}' in config


@pytest.mark.parametrize("stream", [False, True])
def test_ensemble_answers_plain_greedy(served: Served, stream: bool) -> None:
    """Each prompt alone, then two at once in one request; Lookahead's guesses were accepted along the way."""
    greedy, accepted = plain_text(served), 0
    for prompt in PROMPTS:
        chunks, outputs = grpc_generate(served.server.grpc_url, "ensemble", [prompt], stream=stream, **PERF)
        assert "".join(chunks[0]) == expected(greedy, prompt, stream), prompt
        accepted += int(outputs[-1]["total_accepted_draft_tokens"].reshape(-1)[0])
    assert accepted > 0, "no draft token accepted: the server decoded plainly"
    prompts = [PROMPTS[1], PROMPTS[2]]
    chunks, _ = grpc_generate(served.server.grpc_url, "ensemble", prompts, stream=stream)
    assert ["".join(c) for c in chunks] == [expected(greedy, p, stream) for p in prompts]


def llm_generate(served: Served, plain: Plain, *, stream: bool, sizes: tuple[int, int, int] | None = None
                 ) -> tuple[list[int], list[dict[str, np.ndarray]]]:
    """One request straight to tensorrt_llm (decoupled: the stream RPC): the new tokens and every response's
    outputs (no output named, so each response holds all the backend creates). Raises RuntimeError with
    Triton's message on an error response."""
    inputs = {
        "input_ids": np.array([plain.prompt_ids], dtype=np.int32),
        "input_lengths": np.array([[len(plain.prompt_ids)]], dtype=np.int32),
        "request_output_len": np.array([[MAX_TOKENS]], dtype=np.int32),
        "end_id": np.array([[served.end_id]], dtype=np.int32),
        "pad_id": np.array([[served.end_id]], dtype=np.int32),
        "streaming": np.array([[stream]]),
        "exclude_input_in_output": np.array([[True]]),
        "return_perf_metrics": np.array([[True]]),
    }
    for name, value in zip(la.PARAMETERS, sizes or (), strict=False):
        inputs[name] = np.array([[value]], dtype=np.int32)
    client = grpcclient.InferenceServerClient(served.server.grpc_url)
    responses: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        client.async_stream_infer("tensorrt_llm", [_input(k, v) for k, v in inputs.items()],
                                  enable_empty_final_response=True)
        tokens: list[int] = []
        outputs: list[dict[str, np.ndarray]] = []
        while True:
            result, error = responses.get(timeout=120)
            if error is not None:
                raise RuntimeError(str(error))
            got = {out.name: result.as_numpy(out.name) for out in result.get_response().outputs}
            if got:
                outputs.append(got)
                length = int(got["sequence_length"].reshape(-1)[0])
                tokens += got["output_ids"].reshape(-1)[:length].tolist()
            if result.get_response(as_json=True)["parameters"]["triton_final_response"]["bool_param"]:
                return tokens, outputs
    finally:
        client.stop_stream()
        client.close()


def created_outputs(flags: set[str], batch_size: int) -> set[str]:
    """The outputs the C++ backend puts in a response that names none, by the contract's presence rules; the
    reference flavour's own extras (preceding_ids, is_final) are declared in this repository, so they come too."""
    names = set()
    for tensor in TENSORRT_LLM.outputs:
        rule = tensor.presence
        if rule == "always" or (rule in ("flag", "flag_unchecked") and tensor.flag in flags) or \
                (rule == "batched" and batch_size > 1):
            names.add(tensor.name)
    return names


def without_end(ids: list[int], end_id: int) -> list[int]:
    return ids[:-1] if ids and ids[-1] == end_id else ids


@pytest.mark.parametrize("stream", [False, True])
def test_tensorrt_llm_answers_plain_greedy_with_the_contracts_outputs(served: Served, stream: bool) -> None:
    """The target's greedy ids, with the server's (W, N, G) and with a request's own smaller (2, 2, 1); every
    response holds output_ids, sequence_length and the ten perf metrics (return_perf_metrics), nothing the
    request did not ask for (no log probs, logits, token counts)."""
    want = created_outputs({"return_perf_metrics"}, batch_size=1)
    assert {"output_ids", "sequence_length", "acceptance_rate", "total_accepted_draft_tokens"} <= want
    assert not want & {"cum_log_probs", "generation_logits", "num_output_tokens", "batch_index"}
    accepted = 0
    for sizes in (None, la.SMALLEST_MEANINGFUL):
        for prompt in PROMPTS:
            plain = served.plain[prompt]
            tokens, outputs = llm_generate(served, plain, stream=stream, sizes=sizes)
            assert without_end(tokens, served.end_id) == without_end(plain.ids, served.end_id), (prompt, sizes)
            assert len(outputs) == 1 or stream
            for got in outputs:
                assert set(got) == want, (prompt, sizes)
            last = outputs[-1]
            accepted += int(last["total_accepted_draft_tokens"].reshape(-1)[0])
            assert int(last["total_draft_tokens"].reshape(-1)[0]) >= int(last["total_accepted_draft_tokens"][0, 0])
    assert accepted > 0, "no draft token accepted: the server decoded plainly"


def test_a_request_beyond_the_servers_window_is_refused(served: Served) -> None:
    """(5, 3, 4) needs more tokens per step than an engine for (4, 3, 4) has: TensorRT-LLM's text, then the server
    keeps serving."""
    plain = served.plain[PROMPTS[0]]
    with pytest.raises(RuntimeError, match=r"exceeds maxTokensPerStep\(16\)"):
        llm_generate(served, plain, stream=True, sizes=(5, 3, 4))
    tokens, _ = llm_generate(served, plain, stream=True)
    assert without_end(tokens, served.end_id) == without_end(plain.ids, served.end_id)


def test_tune_served_measures_where_the_windows_pay(served: Served) -> None:
    """`specbuild tune --served` on the Lookahead deployment: one server with the windows off from batch size 2
    and one with them on (each log says the served model read that schedule), tokens/s of both at every batch
    size from 2, and a schedule that keeps the windows on alone and holds nothing but on or off."""
    import json

    from rich.console import Console

    from specbuild.runtime.schedule import SCHEDULE_ENV, fixed_length
    from specbuild.tune.stage import TuneOptions, run_tune

    quiet = Console(quiet=True)
    options = TuneOptions(served=True, repeats=1, prompts=2, new_tokens=8, write=False)
    report = run_tune(served.spec.path, options, console=quiet, out=quiet)
    t, full = report.schedule, served.spec.full_draft_len
    assert t is not None and t.served and t.full_length == full == la.max_draft_len(*DEFAULT_WINDOW)
    assert all(sorted(rates) == [0, full] and min(rates.values()) > 0 for rates in t.tokens_per_second.values())
    assert t.schedule[1] == full and set(t.schedule.values()) <= {0, full}
    logs = served.spec.deploy.model_repository.parent / "tune-served"  # type: ignore[union-attr]
    for length in (0, full):
        log = (logs / f"tritonserver-k{length}.log").read_text(encoding="utf-8", errors="replace")
        steps = fixed_length(full, length, served.spec.build.max_batch_size)
        assert f"draft_len_schedule {json.dumps(steps)} from {SCHEDULE_ENV}" in log.replace('\\"', '"')
