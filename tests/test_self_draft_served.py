"""configs/demo-self-draft.yaml's pipeline (the demo target drafting with its own first 2 layers and the trained
adapter) deployed on the reference backend and served by a real tritonserver.

What a user relies on: one model serves it (tensorrt_llm drafts with the target's own layers and KV cache; no
tensorrt_llm_draft is loaded, so no second copy of those layers exists), answers equal the target's plain greedy
completions (derived here from the converted target) for concurrent requests through the BLS and the ensemble,
and drafts are proposed and counted in the perf outputs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.deploy_fixtures import PROMPTS, convert_and_build, http_post, pipeline_data, write_spec

pytestmark = pytest.mark.tritonserver
MAX_TOKENS = 24


@pytest.fixture(scope="module", name="self_draft")
def self_draft_fixture(tmp_path_factory: pytest.TempPathFactory, demo_models: dict[str, Path],
                       demo_extra: Any) -> Iterator[tuple[Any, dict[str, str], Path, int]]:
    from specbuild.deploy.repository import deploy_repository
    from specbuild.serve.server import TritonServer

    root = tmp_path_factory.mktemp("self-draft-served")
    data = pipeline_data("demo-self-draft", demo_models, "draft_target", root / "out")
    data["draft"] = {"source": "target_layers", "layers": 2, "adapter": str(demo_extra("self-draft-adapter"))}
    spec = write_spec(root / "specs", data)
    convert_and_build(spec)
    deploy_repository(spec)
    repository = spec.deploy.model_repository
    assert repository is not None
    log = root / "server.log"
    expected, own = _plain_greedy(spec)
    with TritonServer(repository, log_file=log, ready_timeout_s=420) as server:
        yield server, expected, log, own


def _plain_greedy(spec: Any) -> tuple[dict[str, str], int]:
    """Each prompt's plain greedy completion by the converted target, and the parameters a self-draft sharing
    its weights owns (the adapter's: `shared_memory` over the same checkpoints)."""
    import torch

    from specbuild.contracts.engine_info import engine_dir, reference_checkpoint
    from specbuild.runtime.generation import generate
    from specbuild.runtime.model import CausalLM
    from specbuild.runtime.self_draft import self_draft_proposer, shared_memory
    from specbuild.runtime.sequence import StopCriteria
    from specbuild.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(spec.target.model)
    target = CausalLM.from_checkpoint(reference_checkpoint(engine_dir(spec, "target")))
    draft = self_draft_proposer(target, 2, 4, reference_checkpoint(engine_dir(spec, "draft"))).draft
    own = shared_memory(target, draft)["shared_extra_params"]
    assert own == sum(t.numel() for t in draft.layers[2].buffers())  # the adapter's, nothing of the target's
    out = {}
    with torch.inference_mode():
        for prompt in PROMPTS:
            ids = tokenizer.encode(prompt, add_special_tokens=True)
            tokens = generate(target, [ids], stop=StopCriteria(MAX_TOKENS, tokenizer.eos_token_id)).output_ids[0]
            out[prompt] = tokenizer.decode(tokens, skip_special_tokens=True)
    return out, own


def test_one_model_serves_the_self_draft_with_the_targets_greedy_text(
        self_draft: tuple[Any, dict[str, str], Path, int]) -> None:
    """Every prompt at once through the BLS and the ensemble (HTTP generate): each answer is the target's plain
    greedy completion; only tensorrt_llm holds the layers (no draft model is loaded) and it says it shares the
    target's weights, its own parameters being the adapter's alone."""
    server, expected, log, expected_own = self_draft
    names = {m["name"] for m in server.models() if m.get("state") == "READY"}
    assert "tensorrt_llm" in names and "tensorrt_llm_draft" not in names, names

    def ask(job: tuple[str, str]) -> dict[str, Any]:
        model, prompt = job
        status, body = http_post(server.http_url, f"/v2/models/{model}/generate",
                                 {"text_input": prompt, "max_tokens": MAX_TOKENS, "exclude_input_in_output": True,
                                  "return_perf_metrics": True})
        assert status == 200, body
        return json.loads(body)

    jobs = [(model, prompt) for prompt in PROMPTS for model in ("tensorrt_llm_bls", "ensemble")]
    with ThreadPoolExecutor(len(jobs)) as pool:
        answers = list(pool.map(ask, jobs))
    assert [a["text_output"] for a in answers] == [expected[prompt] for _, prompt in jobs]
    drafted = [int(a["total_draft_tokens"]) for a in answers]
    assert all(d >= int(a["total_accepted_draft_tokens"]) >= 0 for d, a in zip(drafted, answers, strict=True))
    assert sum(drafted) > 0, answers  # the one model drafted
    loaded = re.search(r"self-draft of 2 layers, K 4: shares the target's weights and KV cache \((\d+) parameters "
                       r"of its own", log.read_text(errors="replace"))
    assert loaded, "tensorrt_llm did not load a self-draft"
    assert int(loaded.group(1)) == expected_own, (loaded.group(0), expected_own)
