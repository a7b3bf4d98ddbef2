"""SGLang's own OpenAI /v1/completions and /v1/models, served on loopback with only the GPU part stood in, for
tests/test_sglang_acceptance.py.

Run with the SGLang virtualenv's python (sglang==0.5.23), never the project's:
`python sglang_spec_server.py PLAN.json PORT RECORD.jsonl`.

SGLang's own code: the argument parser and resolution of a speculative deployment (`prepare_server_args`,
`publish`, which fix the serving options and the draft length the code below reads), the two endpoint functions of
sglang/srt/entrypoints/http_server.py (`openai_v1_completions`, whose `CompletionRequest` FastAPI validates the
body with, and `available_models`, SGLang's ModelCard/ModelList), `OpenAIServingCompletion.handle_request` (the
request conversion, the streamed chunks with the `sglext` chunk, the non-streamed answer), and the tokenizer
manager's `_calculate_spec_decoding_metrics`, which turns the finished request's counts into meta_info's spec fields.

Stood in, because SGLang does not serve on CPU (its scheduler and model runner need CUDA): the GPU queries as in
sglang_check.py (`stand_in_gpu`), and the tokenizer manager, whose `generate_request` yields what the scheduler and
detokenizer would have produced for PLAN's verify steps: the cumulative text, and meta_info (id, prompt_tokens,
completion_tokens, finish_reason, then on the finished output the spec fields) as tokenizer_manager.py builds it.

PLAN.json: {"model_path", "served_model_name", "num_draft_tokens", "prompt_tokens", "steps": [{"text", "accepted"}]}:
one entry per verify step, which emits its accepted drafts and the target's own (bonus) token as `text`.
RECORD.jsonl: per request, the body as received, SGLang's validated `return_spec_tokens_details`, and the final
meta_info the stand-in yielded.
"""

import json
import sys
import types
import uuid
from collections.abc import AsyncIterator
from typing import Any

from sglang_check import stand_in_gpu


class StandInTokenizerManager:
    """What OpenAIServingCompletion and /v1/models read of SGLang's TokenizerManager, and a `generate_request` that
    answers PLAN's steps in place of the scheduler (the module docstring)."""

    def __init__(self, server_args: Any, model_config: Any, plan: dict[str, Any], record: str) -> None:
        self.server_args, self.model_config, self.plan, self.record = server_args, model_config, plan, record
        self.served_model_name = server_args.served_model_name
        self.tokenizer = None  # read only for logprobs and echo of token ids, which the test does not ask
        self.request_logger = types.SimpleNamespace(log_requests=False, log_requests_level=0)
        self.received: list[dict[str, Any]] = []

    def create_abort_task(self, obj: Any) -> Any:
        from fastapi import BackgroundTasks

        return BackgroundTasks()  # nothing runs here to abort

    def _output(self, rid: str, steps: list[dict[str, Any]], finished: bool) -> dict[str, Any]:
        """The output dict after `steps`, as tokenizer_manager.py builds it (spec fields on the finished one)."""
        from sglang.srt.managers.tokenizer_manager import TokenizerManager
        from sglang.srt.runtime_context import get_context

        tokens = sum(step["accepted"] + 1 for step in steps)
        meta_info: dict[str, Any] = {
            "id": rid, "finish_reason": {"type": "length", "length": tokens} if finished else None,
            "prompt_tokens": self.plan["prompt_tokens"], "weight_version": get_context().config_leaf("weight_version"),
            "num_retractions": 0, "completion_tokens": tokens, "cached_tokens": 0}
        if finished:
            counts = types.SimpleNamespace(spec_verify_ct=[len(steps)], completion_tokens=[tokens],
                                           spec_num_correct_drafts=[sum(step["accepted"] for step in steps)],
                                           spec_correct_drafts_histogram=None)
            TokenizerManager._calculate_spec_decoding_metrics(self, meta_info, counts, 0)
        return {"text": "".join(step["text"] for step in steps), "output_ids": list(range(tokens)),
                "meta_info": meta_info}

    async def generate_request(self, obj: Any, request: Any = None) -> AsyncIterator[dict[str, Any]]:
        rid, steps = f"standin-{uuid.uuid4().hex}", self.plan["steps"]
        for done in range(1, len(steps) + 1) if obj.stream else [len(steps)]:
            output = self._output(rid, steps[:done], done == len(steps))
            if done == len(steps):  # recorded before it is yielded: a non-streamed answer reads one output only
                with open(self.record, "a", encoding="utf-8") as handle:
                    handle.write(json.dumps({"meta_info": output["meta_info"]}) + "\n")
            yield output


def build_app(plan: dict[str, Any], record: str) -> Any:
    from fastapi import Depends, FastAPI, Request
    from fastapi.responses import ORJSONResponse
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.entrypoints import http_server
    from sglang.srt.entrypoints.openai.protocol import CompletionRequest
    from sglang.srt.entrypoints.openai.serving_completions import OpenAIServingCompletion
    from sglang.srt.parser.template_manager import TemplateManager
    from sglang.srt.runtime_context import publish
    from sglang.srt.server_args import prepare_server_args

    server_args = prepare_server_args([
        "--model-path", plan["model_path"], "--served-model-name", plan["served_model_name"],
        "--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", str(plan["num_draft_tokens"])])
    publish(server_args, role="tokenizer")
    manager = StandInTokenizerManager(server_args, ModelConfig.from_server_args(server_args), plan, record)
    templates = TemplateManager()
    http_server.set_global_state(http_server._GlobalState(tokenizer_manager=manager, template_manager=templates,
                                                           scheduler_info={}))
    app = FastAPI()
    app.state.openai_serving_completion = OpenAIServingCompletion(manager, templates)

    @app.post("/v1/completions", dependencies=[Depends(http_server.validate_json_request)])
    async def completions(request: CompletionRequest, raw_request: Request) -> Any:
        with open(record, "a", encoding="utf-8") as handle:
            handle.write(json.dumps({"body": await raw_request.json(),
                                     "return_spec_tokens_details": request.return_spec_tokens_details}) + "\n")
        return await http_server.openai_v1_completions(request, raw_request)

    app.get("/v1/models", response_class=ORJSONResponse)(http_server.available_models)
    return app


def main() -> None:
    plan_path, port, record = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    with open(plan_path, encoding="utf-8") as handle:
        plan = json.load(handle)
    stand_in_gpu()
    import uvicorn

    uvicorn.run(build_app(plan, record), host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main()
