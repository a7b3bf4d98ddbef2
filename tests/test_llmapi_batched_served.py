"""PyTorch-flow (llmapi) repositories on the reference backend batch concurrent speculative requests, served by a
real tritonserver: EAGLE-3 (chain, and the `eagle_choices` tree), Draft_Target, NGram and SA each run in the one
serving engine, so requests sent at once share its target forwards.

Batching is read from the engine's own counters, which the llmapi model publishes as Triton metrics
(`specbuild_engine{counter=...}`), not from wall time; each answer is compared with that prompt's plain greedy
completion by the same target checkpoint, derived in the same run. One server holds the four models (each
repository's `tensorrt_llm`, deployed by specbuild, under its own name), so the module starts tritonserver once.
"""

from __future__ import annotations

import json
import re
import shutil
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy_fixtures import PROMPTS, deploy_pytorch_flow, http_post, pipeline_data

pytestmark = pytest.mark.tritonserver
MAX_TOKENS = 24
MODELS = ("eagle3", "eagle3_tree", "draft_target", "ngram", "sa")
TREE = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]


def _repositories(root: Path, models: dict[str, Path], eagle3_draft: Path) -> dict[str, Path]:
    """convert -> build -> deploy of the eagle3, draft_target and ngram PyTorch-flow specs (as configs/demo-*.yaml)."""
    out = {}
    for mode in ("eagle3", "draft_target", "ngram"):
        data = pipeline_data(f"batched-{mode}", models, mode, root / mode)
        data["speculative"]["num_draft_tokens"] = 4
        if mode == "eagle3":
            data["draft"] = {"model": str(eagle3_draft)}
        out[mode] = deploy_pytorch_flow(root / f"spec-{mode}", data)
    return out


def _one_server_repository(root: Path, repositories: dict[str, Path]) -> Path:
    """Each deployed repository's tensorrt_llm as a model of its own name; eagle3_tree is eagle3's with
    speculative_config.eagle_choices set in its model.yaml (TensorRT-LLM's EagleDecodingConfig field); sa is
    ngram's with the speculative_config of TensorRT-LLM's SADecodingConfig (decoding_type SA, no spec mode writes
    it yet)."""
    combined = root / "combined"
    for name in MODELS:
        source = repositories[{"eagle3_tree": "eagle3", "sa": "ngram"}.get(name, name)] / "tensorrt_llm"
        shutil.copytree(source, combined / name, ignore=shutil.ignore_patterns("__pycache__"))
        config = combined / name / "config.pbtxt"
        config.write_text(config.read_text().replace('name: "tensorrt_llm"', f'name: "{name}"'))
        if name == "eagle3_tree":
            settings_path = combined / name / "1" / "model.yaml"
            settings = yaml.safe_load(settings_path.read_text())
            settings["speculative_config"]["eagle_choices"] = TREE
            settings_path.write_text(yaml.safe_dump(settings))
        if name == "sa":
            settings_path = combined / name / "1" / "model.yaml"
            settings = yaml.safe_load(settings_path.read_text())
            settings["speculative_config"] = {"decoding_type": "SA", "max_draft_len": 4, "max_matching_ngram_size": -1}
            settings_path.write_text(yaml.safe_dump(settings))
    return combined


@pytest.fixture(scope="module", name="served")
def served_fixture(tmp_path_factory: pytest.TempPathFactory, demo_models: dict[str, Path],
                   demo_extra: Any) -> Iterator[tuple[Any, dict[str, str]]]:
    from specbuild.serve.server import TritonServer

    root = tmp_path_factory.mktemp("llmapi-batched")
    repositories = _repositories(root, demo_models, demo_extra("eagle3-draft"))
    expected = _plain_greedy(repositories["ngram"])
    with TritonServer(_one_server_repository(root, repositories), log_file=root / "server.log",
                      ready_timeout_s=420) as server:
        yield server, expected


def _plain_greedy(repository: Path) -> dict[str, str]:
    """Each prompt's plain greedy completion by the converted target the repositories serve (reference.json)."""
    import torch

    from specbuild.runtime.generation import generate
    from specbuild.runtime.model import CausalLM
    from specbuild.runtime.sequence import StopCriteria
    from specbuild.tokenizer import load_tokenizer

    reference = json.loads((repository / "tensorrt_llm" / "1" / "reference.json").read_text())
    tokenizer = load_tokenizer(Path(reference["tokenizer"]))
    target = CausalLM.from_checkpoint(Path(reference["checkpoints"]["target"]))
    out = {}
    with torch.inference_mode():
        for prompt in PROMPTS:
            ids = tokenizer.encode(prompt, add_special_tokens=True)
            tokens = generate(target, [ids], stop=StopCriteria(MAX_TOKENS, tokenizer.eos_token_id)).output_ids[0]
            out[prompt] = tokenizer.decode(tokens, skip_special_tokens=True)
    return out


def _engine_counters(server: Any, model: str) -> dict[str, float]:
    with urllib.request.urlopen(f"http://{server.metrics_url}/metrics", timeout=30) as response:
        text = response.read().decode()
    counters = {}
    for line in text.splitlines():
        found = re.match(r'specbuild_engine\{(.*)\} (\S+)$', line)
        if found and f'model="{model}"' in found.group(1):
            counters[re.search(r'counter="(\w+)"', found.group(1)).group(1)] = float(found.group(2))  # type: ignore[union-attr]
    return counters


def _generate(url: str, model: str, prompt: str) -> dict[str, Any]:
    status, body = http_post(url, f"/v2/models/{model}/generate",
                             {"text_input": prompt, "sampling_param_max_tokens": MAX_TOKENS,
                              "sampling_param_exclude_input_from_output": True,
                              "sampling_param_return_perf_metrics": True})
    assert status == 200, body
    return json.loads(body)


@pytest.mark.parametrize("model", MODELS)
def test_concurrent_requests_join_one_batch(served: tuple[Any, dict[str, str]], model: str) -> None:
    """Eight requests sent at once (each prompt twice): the engine ran forwards over several of them together
    (its counters: a forward with more than one request, the most requests in one), drafts were proposed, and
    every answer is that prompt's plain greedy completion."""
    server, expected = served
    before = _engine_counters(server, model)
    jobs = [prompt for prompt in PROMPTS for _ in range(2)]
    answers: list[dict[str, Any] | None] = [None] * len(jobs)
    start = threading.Barrier(len(jobs))

    def send(i: int) -> None:
        start.wait()
        answers[i] = _generate(server.http_url, model, jobs[i])

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(jobs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert all(a is not None for a in answers), "a request was not answered"
    assert [a["text_output"] for a in answers] == [expected[p] for p in jobs]  # type: ignore[index]
    assert sum(int(a["total_draft_tokens"]) for a in answers) > 0  # type: ignore[index]
    after = _engine_counters(server, model)
    assert after["admitted"] - before.get("admitted", 0) == len(jobs)
    assert after["batched_forwards"] > before.get("batched_forwards", 0)
    assert after["max_rows"] >= 2
    if model not in ("ngram", "sa"):
        assert after["draft_rows"] - before.get("draft_rows", 0) > after["draft_forwards"] - before.get(
            "draft_forwards", 0)  # the draft, too, ran for several requests at once
