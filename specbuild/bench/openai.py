"""One LLM request against an OpenAI-compatible server's /v1/completions, timed per streamed chunk: NVIDIA Dynamo's
frontend (the URL `specbuild serve` prints for a Dynamo deployment, `http://HOST:PORT/v1`), trtllm-serve, vLLM and
SGLang all speak it. `OpenAIClient` has LLMClient's face (`model`, `generate`, `close`), so the same load drives it.

Acceptance is read only where the answer carries it, on the non-streamed answer or, streamed with
`stream_options.include_usage`, on the chunks up to the last:
- `usage.completion_tokens_details` (`accepted_prediction_tokens`, `rejected_prediction_tokens`): where specbuild's
  Dynamo workers put it (specbuild.dynamo.worker.acceptance_usage), the one usage field Dynamo's frontend carries;
- vLLM's per-request `metrics.speculative_decoding` (`num_accepted_draft_tokens`, `num_draft_tokens`; vLLM 0.33.0
  vllm/entrypoints/generate/base/protocol.py SpeculativeDecodingMetrics, on the final usage chunk when streamed,
  vllm/entrypoints/openai/completion/serving.py), which vLLM adds when started with
  `--per-request-spec-decode-metrics`;
- Dynamo's engine data: to a Dynamo frontend (its /v1/models lists the model `owned_by: nvidia`) the client sends
  `nvext: {"extra_fields": ["engine_data"]}`, and the frontend answers with each worker chunk's `engine_data` under
  the response's `nvext.engine_data` (checked against the real ai-dynamo 1.6.1 frontend in
  tests/test_dynamo_engine_data.py; it passes the request's nvext to the worker as `extra_args.nvext`, and strips a
  root-level `metrics`); a `speculative_decoding` object there, in vLLM's shape, is read. Dynamo 1.6.1's own vLLM,
  SGLang and TensorRT-LLM workers put no acceptance in their engine data (the wheel's dynamo/vllm/handlers.py:
  prompt token ids, KV-cache hits, prompt logprobs, routed experts; dynamo/sglang/request_handlers/llm/
  decode_handler.py and dynamo/trtllm/request_handlers/handler_base.py the same kinds), so behind those workers
  acceptance is not reported.
- SGLang's `sglext.spec_tokens_details`: to SGLang (its /v1/models lists the model `owned_by: sglang`, sglang 0.5.23
  sglang/srt/entrypoints/openai/protocol.py ModelCard) the client sends `return_spec_tokens_details: true`
  (CompletionRequest there), and SGLang answers with the request's SpecTokensDetails under the response-level
  `sglext` (sglang 0.5.23 sglang/srt/entrypoints/openai/serving_completions.py: on the answer, or streamed in a chunk
  of no choices before the final usage chunk), built from the finished request's meta_info (sglang 0.5.23
  sglang/srt/managers/tokenizer_manager.py `_calculate_spec_decoding_metrics`): `spec_num_correct_drafts` accepted
  of `spec_num_proposed_drafts` drafted (verify steps x (draft tokens - 1)); none proposed is not reported.
trtllm-serve's answers carry no acceptance (its X-TRTLLM-return-metrics header returns timings only): per request it
is not reported, and the bench says so rather than guess it (the run's totals come from its GET /perf_metrics,
specbuild.bench.engine_metrics).

The one OpenAI client in specbuild: `specbuild bench`, `specbuild serve --prompt` on a Dynamo deployment and its
readiness probe (specbuild.dynamo.launch) and bench/dynamo_bench.py all use it.
"""

from __future__ import annotations

import json
import time
from typing import Any

from specbuild.bench.client import Generation, ModelInterface, _http_error
from specbuild.errors import SpecbuildError

OPENAI_PATH = "/v1"
PROBE_TIMEOUT_S = 5.0
USAGE_TOKENS = "usage.completion_tokens"
"""What the output tokens are counted by when the server's usage counts them (its own tokenizer)."""
DYNAMO_OWNER = "nvidia"
"""`owned_by` of the models Dynamo's frontend lists in /v1/models (ai-dynamo 1.6.1; vLLM says `vllm`, SGLang
`sglang`, trtllm-serve `tensorrt_llm`): the frontend the client asks for engine data."""
ENGINE_DATA = {"extra_fields": ["engine_data"]}
"""The request's `nvext` that asks Dynamo's frontend for the workers' engine data (ai-dynamo/dynamo PR #8099)."""
SPEC_METRICS = "speculative_decoding"
SGLANG_OWNER = "sglang"
"""`owned_by` of the models SGLang lists in /v1/models (sglang 0.5.23 sglang/srt/entrypoints/openai/protocol.py
ModelCard's default, which http_server.py's /v1/models keeps): the server the client asks for spec_tokens_details."""
SPEC_DETAILS = "return_spec_tokens_details"
"""The CompletionRequest field that asks SGLang for the request's `sglext.spec_tokens_details` (sglang 0.5.23)."""


def base_url(url: str) -> str:
    """`scheme://host:port` without the `/v1` `specbuild serve` prints; `host:port` is taken as http."""
    url = url.strip().rstrip("/")
    if "://" not in url:
        url = f"http://{url}"
    return url[: -len(OPENAI_PATH)] if url.endswith(OPENAI_PATH) else url


def _session() -> Any:
    import requests

    session = requests.Session()
    session.trust_env = False  # as LLMClient: talk to the server directly, not via http_proxy
    return session


class ServerRefused(SpecbuildError):
    """The server answered a request with an error: its HTTP status (None: an error event in a 200 stream, which
    carries none) and its own message, so a caller can tell a refusal (400: which limit) from a busy server (503)."""

    def __init__(self, message: str, *, status: int | None, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.status = status


def _listing(http: Any, url: str, timeout_s: float) -> list[dict[str, Any]]:
    """The entries GET /v1/models lists; raises (anything) when the answer is no OpenAI model list."""
    response = http.get(f"{url}{OPENAI_PATH}/models", timeout=timeout_s)
    response.raise_for_status()
    entries = response.json()["data"]
    return [{"id": str(entry["id"]), "owned_by": entry.get("owned_by")} for entry in entries]


def _listed(http: Any, url: str, timeout_s: float) -> list[str]:
    """The model ids GET /v1/models lists; raises (anything) when the answer is no OpenAI model list."""
    return [entry["id"] for entry in _listing(http, url, timeout_s)]


def listed_models(url: str, timeout_s: float = PROBE_TIMEOUT_S) -> list[str] | None:
    """The models `url` serves by GET /v1/models; None when it does not answer as an OpenAI server does (refused,
    not HTTP, a Triton port, not JSON)."""
    try:
        with _session() as session:
            return _listed(session, base_url(url), timeout_s)
    except Exception:  # any failure means the same here: no OpenAI server (yet)
        return None


def speaks_openai(url: str) -> bool:
    """Whether `url` answers GET /v1/models as an OpenAI server does (a list under `data`); a Triton port does not."""
    return listed_models(url) is not None


class OpenAIClient:
    """A kept-alive connection to one served model; not thread-safe: give each concurrent worker its own."""

    def __init__(self, url: str, model: str | None = None, timeout_s: float = 300.0) -> None:
        self.url, self.timeout_s = base_url(url), timeout_s
        self._http: Any = _session()
        listing: list[dict[str, Any]] | None = None
        try:
            listing = _listing(self._http, self.url, PROBE_TIMEOUT_S)
        except Exception as err:  # a named model is asked for as is; an unnamed one needs the listing
            if model is None:
                self.close()
                raise SpecbuildError(f"cannot list the models at {self.url}{OPENAI_PATH}/models: {err}",
                                     hint="is the server running (`specbuild serve DIR` prints its address), and is "
                                          "this its OpenAI address?") from None
        try:
            name = model or self._served_model([entry["id"] for entry in listing or ()])
        except SpecbuildError:
            self.close()
            raise
        owner = next((entry["owned_by"] for entry in listing or () if entry["id"] == name), None)
        self.engine_data = owner == DYNAMO_OWNER
        """Whether requests ask for Dynamo's engine data (the server is Dynamo's frontend; module docstring)."""
        self.spec_details = owner == SGLANG_OWNER
        """Whether requests ask for SGLang's spec_tokens_details (the server is SGLang; module docstring)."""
        # An OpenAI server streams on request: treated as decoupled, so the bench streams unless told not to.
        self.model = ModelInterface(name, {}, batched=False, decoupled=True)

    def _served_model(self, listed: list[str]) -> str:
        """The one model /v1/models lists (`listed`); an error naming them when there are several or none."""
        if len(listed) != 1:
            raise SpecbuildError(f"{self.url}{OPENAI_PATH}/models lists {', '.join(listed) or 'no model'}",
                                 hint="name the model to measure with --model-name")
        return listed[0]

    def close(self, cancel: bool = False) -> None:
        """Close the connection (a request in flight on it then fails: `cancel` is LLMClient's, for the same call)."""
        if self._http is not None:
            self._http.close()
            self._http = None

    def __enter__(self) -> OpenAIClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def generate(self, prompt: str, max_tokens: int, *, stream: bool | None = None,
                 num_draft_tokens: int | None = None) -> Generation:
        """One greedy completion, streamed unless `stream` is False; raises SpecbuildError with the server's
        message. `num_draft_tokens` must be None: an OpenAI request carries no draft length (the deployment's K)."""
        if num_draft_tokens is not None:
            raise SpecbuildError(f"{self.url}: an OpenAI request carries no draft length (the deployment sets K)")
        stream = stream is not False
        body: dict[str, Any] = {"model": self.model.name, "prompt": prompt, "max_tokens": max_tokens,
                                "temperature": 0.0, "stream": stream}
        if stream:
            body["stream_options"] = {"include_usage": True}
        if self.engine_data:
            body["nvext"] = ENGINE_DATA
        if self.spec_details:
            body[SPEC_DETAILS] = True
        where = f"{self.model.name} (OpenAI {self.url}{OPENAI_PATH}/completions)"
        result = Generation(reported_as=USAGE_TOKENS)
        start = time.perf_counter()
        try:
            with self._http.post(f"{self.url}{OPENAI_PATH}/completions", json=body, stream=stream,
                                 timeout=self.timeout_s) as response:
                if response.status_code != 200:
                    raise ServerRefused(f"{where}: HTTP {response.status_code}: {_http_error(response)}",
                                        status=response.status_code)
                for event in _events(response) if stream else [response.json()]:
                    _absorb(result, event, time.perf_counter() - start, where)
        except SpecbuildError:
            raise
        except Exception as err:  # refused, reset, timed out, not JSON: one line naming the endpoint
            raise SpecbuildError(f"{where}: {type(err).__name__}: {err}") from None
        result.latency_s = time.perf_counter() - start
        return result


def _events(response: Any) -> Any:
    """The JSON payloads of a server-sent-event stream, up to `[DONE]`; an `error` event raises. Lines are UTF-8,
    as the event-stream format fixes (requests would decode a text/event-stream without a charset as Latin-1)."""
    kind = ""
    for line in (raw.decode("utf-8") for raw in response.iter_lines()):
        if line.startswith("event:"):
            kind = line[6:].strip()
        elif line.startswith("data:"):
            payload = line[5:].strip()
            if payload == "[DONE]":
                return
            event = json.loads(payload)
            yield {"error": event} if kind == "error" and "error" not in event else event
        elif not line:
            kind = ""


def _absorb(result: Generation, event: dict[str, Any], when: float, where: str) -> None:
    """Fold one answer (or streamed chunk) into the result: its text, and the usage's token count and acceptance."""
    if not isinstance(event, dict):
        raise SpecbuildError(f"{where}: not an OpenAI completion: {str(event)[:200]}")
    if "error" in event:  # a stream's status is fixed by its first chunk; later ones carry errors
        error = event["error"]
        message = error.get("message", error) if isinstance(error, dict) else error
        raise ServerRefused(f"{where}: the stream ended in an error: {message}", status=None)
    for choice in event.get("choices") or []:
        if choice.get("text"):
            result.text += choice["text"]
            result.response_times.append(when)
    usage = event.get("usage") or {}
    if usage.get("completion_tokens") is not None:
        result.reported_tokens = int(usage["completion_tokens"])
    details = usage.get("completion_tokens_details") or {}
    if details.get("accepted_prediction_tokens") is not None:
        accepted = int(details["accepted_prediction_tokens"])
        _accepted(result, accepted, accepted + int(details.get("rejected_prediction_tokens") or 0))
        return
    nvext = event.get("nvext")
    for source in (event.get("metrics"), nvext.get("engine_data") if isinstance(nvext, dict) else None):
        spec = source.get(SPEC_METRICS) if isinstance(source, dict) else None
        if isinstance(spec, dict) and spec.get("num_draft_tokens") is not None:
            _accepted(result, int(spec.get("num_accepted_draft_tokens") or 0), int(spec["num_draft_tokens"]))
    sglext = event.get("sglext")
    if isinstance(sglext, dict):
        _absorb_spec_details(result, sglext.get("spec_tokens_details"))


def _absorb_spec_details(result: Generation, details: Any) -> None:
    """SGLang's `sglext.spec_tokens_details`: one SpecTokensDetails, or one per choice when the request asked n > 1
    (the bench asks one), summed then: the request's drafts over all its choices, as the other sources count them.
    Reported only where drafts were proposed (SGLang leaves the counts 0 when it has none to report)."""
    listed = details if isinstance(details, list) else [details]
    choices = [choice for choice in listed if isinstance(choice, dict)]
    drafted = sum(int(choice.get("spec_num_proposed_drafts") or 0) for choice in choices)
    if drafted > 0:
        _accepted(result, sum(int(choice.get("spec_num_correct_drafts") or 0) for choice in choices), drafted)


def _accepted(result: Generation, accepted: int, drafted: int) -> None:
    """The request's acceptance, as totals over the whole answer (a later report replaces an earlier one)."""
    result.accepted_draft_tokens, result.draft_tokens = accepted, drafted
    result.acceptance_rate = accepted / drafted if drafted else None

