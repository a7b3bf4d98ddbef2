"""One LLM request against an OpenAI-compatible server's /v1/completions, timed per streamed chunk: NVIDIA Dynamo's
frontend (the URL `specbuild serve` prints for a Dynamo deployment, `http://HOST:PORT/v1`), trtllm-serve, vLLM and
SGLang all speak it. `OpenAIClient` has LLMClient's face (`model`, `generate`, `close`), so the same load drives it.

Acceptance is read only where the answer carries it: `usage.completion_tokens_details` (`accepted_prediction_tokens`,
`rejected_prediction_tokens`) on the non-streamed answer or, streamed with `stream_options.include_usage`, on the
last chunk — where specbuild's Dynamo workers put it (specbuild.dynamo.worker.acceptance_usage). vLLM reports its
acceptance in a root-level `metrics` object only when started with `--per-request-spec-decode-metrics` (and Dynamo's
frontend strips it), SGLang in its native API's `meta_info`, trtllm-serve behind a request header: there the
acceptance is not reported, and the bench says so rather than guess it.
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


def speaks_openai(url: str) -> bool:
    """Whether `url` answers GET /v1/models as an OpenAI server does (a list under `data`); a Triton port does not."""
    try:
        with _session() as session:
            response = session.get(f"{base_url(url)}{OPENAI_PATH}/models", timeout=PROBE_TIMEOUT_S)
            listed = response.json()
    except Exception:  # refused, not HTTP (a gRPC port), not JSON: not an OpenAI server
        return False
    return response.status_code == 200 and isinstance(listed, dict) and isinstance(listed.get("data"), list)


class OpenAIClient:
    """A kept-alive connection to one served model; not thread-safe: give each concurrent worker its own."""

    def __init__(self, url: str, model: str | None = None, timeout_s: float = 300.0) -> None:
        self.url, self.timeout_s = base_url(url), timeout_s
        self._http: Any = _session()
        try:
            name = model or self._served_model()
        except SpecbuildError:
            self.close()
            raise
        # An OpenAI server streams on request: treated as decoupled, so the bench streams unless told not to.
        self.model = ModelInterface(name, {}, batched=False, decoupled=True)

    def _served_model(self) -> str:
        """The one model /v1/models lists; an error naming them when there are several (or the server is not up)."""
        where = f"{self.url}{OPENAI_PATH}/models"
        try:
            response = self._http.get(where, timeout=PROBE_TIMEOUT_S)
            listed = [entry["id"] for entry in response.json()["data"]]
        except Exception as err:
            raise SpecbuildError(f"cannot list the models at {where}: {err}",
                                 hint="is the server running (`specbuild serve DIR` prints its address), and is "
                                      "this its OpenAI address?") from None
        if len(listed) != 1:
            raise SpecbuildError(f"{where} lists {', '.join(listed) or 'no model'}",
                                 hint="name the model to measure with --model-name")
        return str(listed[0])

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
        where = f"{self.model.name} (OpenAI {self.url}{OPENAI_PATH}/completions)"
        result = Generation(reported_as=USAGE_TOKENS)
        start = time.perf_counter()
        try:
            with self._http.post(f"{self.url}{OPENAI_PATH}/completions", json=body, stream=stream,
                                 timeout=self.timeout_s) as response:
                if response.status_code != 200:
                    raise SpecbuildError(f"{where}: HTTP {response.status_code}: {_http_error(response)}")
                for event in _events(response) if stream else [response.json()]:
                    _absorb(result, event, time.perf_counter() - start, where)
        except SpecbuildError:
            raise
        except Exception as err:  # refused, reset, timed out, not JSON: one line naming the endpoint
            raise SpecbuildError(f"{where}: {type(err).__name__}: {err}") from None
        result.latency_s = time.perf_counter() - start
        return result


def _events(response: Any) -> Any:
    """The JSON payloads of a server-sent-event stream, up to `[DONE]`; an `error` event raises."""
    kind = ""
    for line in response.iter_lines(decode_unicode=True):
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
        raise SpecbuildError(f"{where}: {event['error']}")
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
        drafted = accepted + int(details.get("rejected_prediction_tokens") or 0)
        result.accepted_draft_tokens, result.draft_tokens = accepted, drafted
        result.acceptance_rate = accepted / drafted if drafted else None
