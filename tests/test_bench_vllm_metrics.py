"""`specbuild bench` reads vLLM's per-request acceptance (`--per-request-spec-decode-metrics`) from answers vLLM's
own code writes: the final usage chunk of a stream and the non-streamed answer, each built and serialised by vLLM
0.33.0's protocol classes (vllm/entrypoints/openai/completion/protocol.py CompletionStreamResponse /
CompletionResponse, vllm/entrypoints/serve/engine/protocol.py UsageInfo, vllm/entrypoints/generate/base/protocol.py
PerRequestMetrics and SpeculativeDecodingMetrics, dumped as vllm/entrypoints/openai/completion/serving.py dumps
them) in the installed vLLM virtualenv (`make test-engines`; skipped without it), then folded by specbuild's OpenAI
client.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.test_engines_judge import engine_python

pytestmark = pytest.mark.engines

ACCEPTED, DRAFTED, STEPS = 7, 12, 4
WRITE = f"""
import json
from vllm.entrypoints.generate.base.protocol import PerRequestMetrics, SpeculativeDecodingMetrics
from vllm.entrypoints.openai.completion.protocol import (CompletionResponse, CompletionResponseChoice,
                                                         CompletionStreamResponse)
from vllm.entrypoints.serve.engine.protocol import UsageInfo
spec = SpeculativeDecodingMetrics(mean_acceptance_length=1 + {ACCEPTED} / {STEPS},
                                  draft_acceptance_rate={ACCEPTED} / {DRAFTED}, acceptance_histogram=[1, 1, 1, 1],
                                  num_spec_steps={STEPS}, num_accepted_draft_tokens={ACCEPTED},
                                  num_draft_tokens={DRAFTED}, num_spec_tokens=3)
usage = UsageInfo(prompt_tokens=3, completion_tokens=11, total_tokens=14)
metrics = PerRequestMetrics(speculative_decoding=spec)
stream = CompletionStreamResponse(id="c", created=0, model="m", choices=[], usage=usage, metrics=metrics)
whole = CompletionResponse(id="c", created=0, model="m", usage=usage, metrics=metrics,
                           choices=[CompletionResponseChoice(index=0, text="x", finish_reason="length")])
print(json.dumps([json.loads(stream.model_dump_json(exclude_unset=False, exclude_none=True)),
                  json.loads(whole.model_dump_json(exclude_unset=False, exclude_none=True))]))
"""


def test_vllms_per_request_metrics_are_read_streamed_and_not() -> None:
    from specbuild.bench.client import Generation
    from specbuild.bench.openai import _absorb

    written = subprocess.run([str(engine_python("vllm")), "-c", WRITE], capture_output=True, text=True, timeout=300)
    assert written.returncode == 0, written.stderr[-2000:]
    for answer in json.loads(written.stdout.strip().splitlines()[-1]):
        result = Generation()
        _absorb(result, answer, 0.1, "vllm")
        assert (result.accepted_draft_tokens, result.draft_tokens) == (ACCEPTED, DRAFTED), answer
        assert result.acceptance_rate == pytest.approx(ACCEPTED / DRAFTED)
