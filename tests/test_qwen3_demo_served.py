"""configs/demo-qwen3.yaml end to end: the demo extra "qwen3" (a Qwen3 target and draft: q/k norm, an explicit
head_dim, tied embeddings) converted, built (the reference build stage), deployed and served by a real
tritonserver, so a family other than Llama goes through every stage on every `make test`.

What a user relies on: speculation changes how many tokens a target forward yields, never which, so the Qwen3
pair's speculative answers through the BLS, streamed and whole, are the plain target's greedy text, served the same
way (the same BLS with num_draft_tokens 0, which drafts nothing); that plain text is transformers' own greedy
generation from the Hugging Face checkpoint (float32), so the served Qwen3 is Qwen3, not some other decoder; and the
draft's tokens are accepted and counted in the perf outputs. Nothing is written down: the demo weights differ per
CPU. One server start; no TensorRT-LLM runs here (the reference backend serves).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from specbuild.demo import qwen3_extra
from tests.deploy_fixtures import MAX_TOKENS, PROMPTS, convert_and_build, write_spec
from tests.test_deploy_serving import PERF, grpc_generate

pytestmark = [pytest.mark.slow, pytest.mark.tritonserver]

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "demo-qwen3.yaml"


@dataclass
class Served:
    server: Any
    greedy: dict[str, str]  # prompt -> transformers' greedy completion of the Hugging Face target


def _transformers_greedy(target: Path) -> dict[str, str]:
    """Each prompt's greedy completion by transformers itself (float32, no cache tricks of ours)."""
    import torch
    from transformers import AutoModelForCausalLM

    from specbuild.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(target)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    assert type(model).__name__ == "Qwen3ForCausalLM"
    out = {}
    with torch.inference_mode():
        for prompt in PROMPTS:
            ids = torch.tensor([tokenizer.encode(prompt, add_special_tokens=True)])
            new = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_TOKENS,
                                 do_sample=False)[0, ids.shape[1]:]
            out[prompt] = tokenizer.decode(new.tolist(), skip_special_tokens=True)
    return out


@pytest.fixture(scope="module", name="served")
def served_fixture(tmp_path_factory: pytest.TempPathFactory, demo_extra: Any) -> Iterator[Served]:
    """The shipped spec, its models pointed at this session's extra, a private output_dir, the reference backend."""
    from specbuild.deploy.repository import deploy_repository
    from specbuild.serve.server import TritonServer

    pair = demo_extra(qwen3_extra.NAME)
    root = tmp_path_factory.mktemp("qwen3-served")
    data = yaml.safe_load(CONFIG.read_text(encoding="utf-8"))
    data["target"]["model"] = str(pair / qwen3_extra.TARGET_DIR)
    data["draft"]["model"] = str(pair / qwen3_extra.DRAFT_DIR)
    data["output_dir"] = str(root / "out")
    data["build"]["backend"] = "reference"
    data["build"]["max_batch_size"] = 4  # as the other served tests: a smaller KV cache to allocate
    spec = write_spec(root / "specs", data)
    convert_and_build(spec)
    deploy_repository(spec)
    repository = spec.deploy.model_repository
    assert repository is not None
    greedy = _transformers_greedy(spec.target.model)
    with TritonServer(repository, log_file=root / "server.log", ready_timeout_s=420) as server:
        yield Served(server, greedy)


def _counts(outputs: list[dict[str, Any]]) -> tuple[int, int]:
    """(drafted, accepted) of a request: the last response's perf outputs."""
    last = outputs[-1]
    return int(last["total_draft_tokens"].reshape(-1)[0]), int(last["total_accepted_draft_tokens"].reshape(-1)[0])


def test_plain_serving_is_transformers_greedy(served: Served) -> None:
    """The BLS asked for no drafts decodes the target alone: its answers are transformers' greedy generation from
    the Hugging Face Qwen3 checkpoint (the prompt, then the completion), and nothing was drafted."""
    for prompt in PROMPTS:
        chunks, outputs = grpc_generate(served.server.grpc_url, "tensorrt_llm_bls", [prompt], stream=False,
                                        num_draft_tokens=np.array([[0]], dtype=np.int32), **PERF)
        assert "".join(chunks[0]) == prompt + served.greedy[prompt], prompt
        assert _counts(outputs)[0] == 0


@pytest.mark.parametrize("stream", [False, True])
def test_speculation_answers_the_plain_greedy_text_and_accepts_drafts(served: Served, stream: bool) -> None:
    """With the spec's K, streamed (one response per speculation round) and whole: the same text as plain
    decoding, and the draft's tokens were proposed and accepted (the pair agrees on the target's own text)."""
    drafted = accepted = 0
    for prompt in PROMPTS:
        chunks, outputs = grpc_generate(served.server.grpc_url, "tensorrt_llm_bls", [prompt], stream=stream, **PERF)
        answer = "".join(chunks[0])
        assert answer == (served.greedy[prompt] if stream else prompt + served.greedy[prompt]), prompt
        drafts, accepts = _counts(outputs)
        assert 0 <= accepts <= drafts
        drafted, accepted = drafted + drafts, accepted + accepts
    assert drafted > 0, "nothing drafted: the server decoded plainly"
    assert accepted > 0, "no draft token accepted: the Qwen3 draft never agreed with its target"
