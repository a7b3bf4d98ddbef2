"""Deployed demo pipelines for the deploy and serve tests: the demo draft-target and Medusa pipelines (and the
plain target) converted, built (reference backend) and deployed once per session into a temporary directory,
and tritonservers started on them by the tests that need one.

tests/conftest.py registers this module as a plugin, so every test can ask for `deployed`, `dt_server`, ... by
name; import only the helpers (`Deployed`, `PROMPTS`, `write_spec`, ...).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from specbuild.spec import PipelineSpec, load_spec

PROMPTS = (
    "The for statement",
    "Python's list type",
    "Ünïcödé — naïve café, 日本語",
    "called a “starred",
)
"""Several prompts, non-ASCII ones among them (the answers to them depend on the machine that trained the models)."""
MAX_TOKENS = 24


def pipeline_data(name: str, models: dict[str, Path], mode: str, output_dir: Path) -> dict[str, Any]:
    """The demo configs' settings (configs/demo*.yaml) with absolute paths and a private output_dir."""
    data: dict[str, Any] = {
        "name": name,
        "output_dir": str(output_dir),
        "target": {"model": str(models["target"])},
        "speculative": {"mode": mode},
        "build": {"backend": "reference", "dtype": "float32", "max_batch_size": 4, "max_input_len": 256,
                  "max_output_len": 64},
        "deploy": {"decoupled": True},
    }
    if mode == "draft_target":
        data["draft"] = {"model": str(models["draft"])}
        data["speculative"]["num_draft_tokens"] = 4
    if mode == "medusa":
        data["medusa"] = {"heads": str(models["medusa-heads"]), "choices": "mc_sim_7b_top8"}
    return data


def write_spec(directory: Path, data: dict[str, Any]) -> PipelineSpec:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{data['name']}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return load_spec(path)


def convert_and_build(spec: PipelineSpec) -> None:
    from specbuild.build import build_pipeline
    from specbuild.convert.pipeline import convert_checkpoint, requests_from_spec

    for request in requests_from_spec(spec):
        convert_checkpoint(request)
    build_pipeline(spec, backend="reference")


def deploy_pytorch_flow(root: Path, data: dict[str, Any]) -> Path:
    """convert -> build -> deploy of a PyTorch-flow spec on the reference backend (pipeline_data sets it): the
    llmapi repository."""
    from specbuild.build.llm_api import build_llm_api
    from specbuild.convert.run import convert_spec
    from specbuild.deploy.llmapi import deploy_llm_api

    data["build"]["flow"] = "pytorch"
    spec = write_spec(root, data)
    convert_spec(spec.path)
    build_llm_api(spec)
    return deploy_llm_api(spec).repository


@dataclass
class Deployed:
    """The deployed pipelines of a session, by mode: draft_target, medusa, none, and `unary`: draft-target with
    no model decoupled."""

    specs: dict[str, PipelineSpec]

    def repository(self, mode: str) -> Path:
        repository = self.specs[mode].deploy.model_repository
        assert repository is not None
        return repository

    def target_checkpoint(self) -> Path:
        from specbuild.contracts.engine_info import engine_dir, reference_checkpoint

        return reference_checkpoint(engine_dir(self.specs["draft_target"], "target"))

    @property
    def tokenizer_dir(self) -> Path:
        return self.specs["draft_target"].target.model


@pytest.fixture(scope="session", name="deployed")
def deployed_fixture(tmp_path_factory: pytest.TempPathFactory, demo_models: dict[str, Path]) -> Deployed:
    """Convert, build and deploy the three demo pipelines once (about 30 s on two slow cores)."""
    from specbuild.deploy.repository import deploy_repository

    root = tmp_path_factory.mktemp("deployed")
    specs = {}
    for name, mode in (("demo", "draft_target"), ("demo-medusa", "medusa"), ("demo-plain", "none"),
                       ("demo-unary", "draft_target")):
        data = pipeline_data(name, demo_models, mode, root / name)
        if name == "demo-unary":  # TensorRT-LLM's recipes: nothing decoupled (NVIDIA's end_to_end_test needs it)
            data["deploy"]["decoupled"] = False
        spec = write_spec(root / "specs", data)
        convert_and_build(spec)
        deploy_repository(spec)
        specs["unary" if name == "demo-unary" else mode] = spec
    return Deployed(specs)


@dataclass(frozen=True)
class Greedy:
    """One prompt's plain greedy generation by the target outside Triton: the new ids and their text."""

    ids: list[int]
    text: str


@pytest.fixture(scope="session", name="greedy_outputs")
def greedy_outputs_fixture(deployed: Deployed) -> dict[str, Greedy]:
    """Plain greedy generation of the target outside Triton (the reference runtime), for every prompt. What the
    served repositories must answer is derived from these, never written down: the weights differ per CPU."""
    import torch

    from specbuild.runtime.generation import generate
    from specbuild.runtime.model import CausalLM
    from specbuild.runtime.sequence import StopCriteria
    from specbuild.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(deployed.tokenizer_dir)
    model = CausalLM.from_checkpoint(deployed.target_checkpoint())
    outputs = {}
    with torch.inference_mode():
        for prompt in PROMPTS:
            ids = tokenizer.encode(prompt, add_special_tokens=True)
            out = generate(model, [ids], stop=StopCriteria(MAX_TOKENS, tokenizer.eos_token_id)).output_ids[0]
            outputs[prompt] = Greedy(list(out), tokenizer.decode(out, skip_special_tokens=True))
    return outputs


@pytest.fixture(scope="session", name="greedy_reference")
def greedy_reference_fixture(greedy_outputs: dict[str, Greedy]) -> dict[str, str]:
    """prompt -> the target's plain greedy text (see `greedy_outputs`)."""
    return {prompt: greedy.text for prompt, greedy in greedy_outputs.items()}


def stop_phrase(tokenizer: Any, ids: list[int]) -> tuple[str, int]:
    """A phrase the model really generates in `ids`, after its first two tokens, that the tokenizer encodes back
    to exactly the generated tokens (so a stop word matches there); returns it and where it first occurs."""
    for start in range(2, len(ids)):
        for length in (1, 2):
            piece = ids[start : start + length]
            phrase = tokenizer.decode(piece)
            if len(piece) < length or not phrase.strip() or "\ufffd" in phrase:
                continue
            if tokenizer.encode(phrase, add_special_tokens=False) != piece:
                continue
            first = next(i for i in range(len(ids)) if ids[i : i + length] == piece)
            return phrase, first
    raise AssertionError(f"no usable stop phrase in the greedy output {ids}")


def _server(repository: Path, log: Path) -> Iterator[Any]:
    from specbuild.serve.server import TritonServer

    with TritonServer(repository, log_file=log, ready_timeout_s=420) as server:
        yield server


@pytest.fixture(scope="module", name="dt_server")
def dt_server_fixture(deployed: Deployed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """tritonserver on the draft-target repository (entry points tensorrt_llm_bls and ensemble)."""
    yield from _server(deployed.repository("draft_target"), tmp_path_factory.mktemp("logs") / "dt.log")


@pytest.fixture(scope="module", name="medusa_server")
def medusa_server_fixture(deployed: Deployed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """tritonserver on the Medusa repository (entry point ensemble, decoupled tensorrt_llm)."""
    yield from _server(deployed.repository("medusa"), tmp_path_factory.mktemp("logs") / "medusa.log")


@pytest.fixture(scope="module", name="plain_server")
def plain_server_fixture(deployed: Deployed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """tritonserver on the repository without speculation (entry point ensemble, decoupled tensorrt_llm)."""
    yield from _server(deployed.repository("none"), tmp_path_factory.mktemp("logs") / "plain.log")


@pytest.fixture(scope="module", name="unary_server")
def unary_server_fixture(deployed: Deployed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """tritonserver on the draft-target repository whose models are all non-decoupled (unary infer only)."""
    yield from _server(deployed.repository("unary"), tmp_path_factory.mktemp("logs") / "unary.log")


# -- Triton's HTTP generate extension, as the README's curl calls use it ------------------------------------------
def http_post(url: str, path: str, body: dict[str, Any]) -> tuple[int, bytes]:
    """(status, body) of a JSON POST to a server's HTTP endpoint; an HTTP error is an answer, not an exception."""
    request = urllib.request.Request(f"http://{url}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=180) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def http_generate(url: str, model: str, prompt: str, **fields: Any) -> dict[str, Any]:
    """Triton's generate extension: the one JSON answer (status 200 asserted)."""
    status, body = http_post(url, f"/v2/models/{model}/generate",
                             {"text_input": prompt, "max_tokens": MAX_TOKENS, **fields})
    data = json.loads(body)
    assert status == 200, data
    return data


def http_generate_stream(url: str, model: str, prompt: str) -> list[dict[str, Any]]:
    """Triton's generate_stream: every SSE event's JSON, none an error."""
    status, body = http_post(url, f"/v2/models/{model}/generate_stream",
                             {"text_input": prompt, "max_tokens": MAX_TOKENS, "stream": True})
    assert status == 200, body
    events = [json.loads(line[len(b"data:"):]) for line in body.splitlines() if line.startswith(b"data:")]
    assert events and not any("error" in e for e in events), events
    return events
