"""A small OpenAI /v1/completions client for a Dynamo frontend: text, timing and the speculation's acceptance.

Acceptance comes back in `usage.completion_tokens_details` (`accepted_prediction_tokens`,
`rejected_prediction_tokens`; the worker's `specbuild.dynamo.worker.acceptance_usage`), on the non-streamed
response and, streamed with `stream_options.include_usage`, on the last chunk.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Completion:
    text: str
    finish_reason: str | None
    usage: dict[str, Any] | None
    ttft_s: float
    latency_s: float
    chunk_times: list[float] = field(default_factory=list)

    @property
    def completion_tokens(self) -> int:
        return int((self.usage or {}).get("completion_tokens") or 0)

    @property
    def accepted(self) -> int | None:
        details = (self.usage or {}).get("completion_tokens_details") or {}
        value = details.get("accepted_prediction_tokens")
        return None if value is None else int(value)

    @property
    def drafted(self) -> int | None:
        details = (self.usage or {}).get("completion_tokens_details") or {}
        if details.get("accepted_prediction_tokens") is None:
            return None
        return int(details["accepted_prediction_tokens"]) + int(details.get("rejected_prediction_tokens") or 0)

    def acceptance_line(self) -> str:
        if not self.drafted:
            return "no draft tokens reported"
        return f"accepted {self.accepted} of {self.drafted} draft tokens ({self.accepted / self.drafted:.3f})"


def complete(url: str, model: str, prompt: str, max_tokens: int, *, stream: bool = False,
             timeout_s: float = 120.0, client: Any = None, **extra: Any) -> Completion:
    """One greedy completion (temperature 0 unless `extra` says otherwise). Raises httpx.HTTPStatusError with the
    server's text on a refusal, httpx.HTTPError on an error event in a stream. `client`: an httpx.Client to reuse
    (its kept-alive connection); without one a client is made for this request, which costs tens of milliseconds
    (httpx builds its SSL context each time), so a benchmark passes one per concurrent caller."""
    import httpx

    if client is None:
        with httpx.Client(timeout=timeout_s) as own:
            return complete(url, model, prompt, max_tokens, stream=stream, timeout_s=timeout_s, client=own, **extra)

    body: dict[str, Any] = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
                            "stream": stream, **extra}
    if stream:
        body["stream_options"] = {"include_usage": True}
    start = time.perf_counter()
    if not stream:
        response = client.post(f"{url}/v1/completions", json=body, timeout=timeout_s)
        response.raise_for_status()
        data = response.json()
        latency = time.perf_counter() - start
        choice = data["choices"][0]
        return Completion(choice["text"], choice.get("finish_reason"), data.get("usage"), latency, latency)
    parts: list[str] = []
    times: list[float] = []
    usage, reason = None, None
    with client.stream("POST", f"{url}/v1/completions", json=body, timeout=timeout_s) as response:
        if response.status_code >= 400:
            response.read()
            response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data:"):
                continue
            payload = line[5:].strip()
            if payload == "[DONE]":
                break
            chunk = json.loads(payload)
            if chunk.get("error"):  # a refusal after the stream began (200): Dynamo's `data: {"error": {...}}`
                raise httpx.HTTPError(f"the stream ended in an error: {chunk['error'].get('message', chunk['error'])}")
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk.get("choices") or []:
                if choice.get("text"):
                    parts.append(choice["text"])
                    times.append(time.perf_counter() - start)
                reason = choice.get("finish_reason") or reason
    latency = time.perf_counter() - start
    return Completion("".join(parts), reason, usage, times[0] if times else latency, latency, times)


def ask(url: str, model: str, prompt: str, max_tokens: int) -> Completion:
    """`complete`, streamed, for `specbuild serve --prompt`: a refusal or a lost connection is a SpecbuildError
    with the server's own words (e.g. which of the deployment's limits the prompt breaks), not a traceback."""
    import httpx

    from specbuild.errors import SpecbuildError

    try:
        return complete(url, model, prompt, max_tokens, stream=True)
    except httpx.HTTPStatusError as err:
        raise SpecbuildError(f"--prompt {prompt!r}: {url} answered {err.response.status_code}: "
                             f"{err.response.text.strip()}", hint="the frontend's and workers' logs say more") from None
    except httpx.HTTPError as err:
        raise SpecbuildError(f"--prompt {prompt!r}: {url}: {err}",
                             hint="the frontend's and workers' logs say more") from None
