"""A Dynamo worker on the real ai-dynamo runtime that reports per-request acceptance as engine data, for
tests/test_dynamo_engine_data.py: what a Dynamo worker forwarding vLLM's per-request speculative-decoding metrics
would send (`speculative_decoding`, in vLLM 0.33.0's SpeculativeDecodingMetrics names), and only when the request
asked for engine data (`extra_args.nvext.extra_fields`, where the frontend puts the request's nvext; Dynamo's vLLM
worker gates its engine data the same way, the 1.6.1 wheel's dynamo/vllm/handlers.py _nvext_extra_field_requested).

It yields one token per step, `max_tokens` of them, and reports `DRAFTS_PER_STEP` drafts and `ACCEPTED_PER_STEP`
accepted per step, so the test derives the counts from its own request. Run: python -m tests.dynamo_engine_data_worker
TOKENIZER_DIR MODEL_NAME, with the file-discovery environment the test sets.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from typing import Any

DRAFTS_PER_STEP = 3
ACCEPTED_PER_STEP = 2


def asked_for_engine_data(request: dict[str, Any]) -> bool:
    extra = request.get("extra_args") or {}
    nvext = (extra.get("nvext") if isinstance(extra, dict) else None) or request.get("nvext") or {}
    return isinstance(nvext, dict) and "engine_data" in (nvext.get("extra_fields") or [])


async def main(tokenizer: str, name: str) -> None:
    from dynamo.llm import ModelInput, ModelType, WorkerType, register_model
    from dynamo.runtime import DistributedRuntime

    loop = asyncio.get_running_loop()
    runtime = DistributedRuntime(loop, "file", "tcp", event_plane="zmq")
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, runtime.shutdown)
    endpoint = runtime.endpoint("dynamo.backend.generate")

    async def generate(request: dict[str, Any], context: Any) -> Any:
        steps = int((request.get("stop_conditions") or {}).get("max_tokens") or 1)
        report = asked_for_engine_data(request)
        for step in range(1, steps + 1):
            chunk: dict[str, Any] = {"token_ids": [100 + step]}
            if report:
                chunk["engine_data"] = {"speculative_decoding": {
                    "num_accepted_draft_tokens": ACCEPTED_PER_STEP * step,
                    "num_draft_tokens": DRAFTS_PER_STEP * step, "num_spec_steps": step}}
            if step == steps:
                chunk["finish_reason"] = "length"
                chunk["completion_usage"] = {"prompt_tokens": len(request.get("token_ids") or []),
                                             "completion_tokens": steps,
                                             "total_tokens": len(request.get("token_ids") or []) + steps}
            yield chunk

    await register_model(ModelInput.Tokens, ModelType.Completions, endpoint, tokenizer, name,
                         worker_type=WorkerType.Aggregated, kv_cache_block_size=16)
    await endpoint.serve_endpoint(generate)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
