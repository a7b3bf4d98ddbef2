"""Client-side serving benchmark: concurrent clients over a prompt set against a running server.

Each of `concurrency` workers owns one connection (a gRPC stream, or an HTTP session) and sends requests
back to back, so `concurrency` requests are in flight at all times. Per request we time the first response
with text (TTFT) and the last; inter-token latency is (latency − TTFT) / (tokens − 1), the genai-perf
definition, which stays meaningful when a speculative server sends several tokens per response. Output tokens
are counted with the deployment's tokenizer when we have it (re-encoding the answer text), else with the
model's `num_output_tokens` outputs, else as whitespace-separated words; the report says which.
"""

from __future__ import annotations

import contextlib
import itertools
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from specbuild.bench.client import Generation, LLMClient, Protocol
from specbuild.bench.engine_metrics import ENGINE_COUNTERS, EngineBooks, SpecDecodeCounters
from specbuild.bench.openai import OpenAIClient
from specbuild.errors import SpecbuildError
from specbuild.tokenizer import load_tokenizer

T = TypeVar("T")

DEFAULT_PROMPTS = (
    "The for statement",
    "The while statement",
    "The try statement specifies",
    "Class definitions",
    "The import statement",
    "Boolean operations",
    "The with statement",
    "Function definitions",
)
"""Openings from Python's own documentation: the demo models were trained on that text (pydoc_data.topics)."""


STEADY_PER_CLIENT = 4
"""Each client's requests in a run whose figures are about steady load (the serving bench, tune --served). Every run
starts with all clients arriving at once and ends with them finishing one by one; with the default of 2 a client,
one of each client's two requests is in the burst and the other in the tail, so little of a run is the steady load.
(On the 2-core machine where it was set, it did not narrow the spread of a deployment's three serving-bench rounds.)"""


def rotations(items: Sequence[T], passes: int) -> list[list[T]]:
    """`passes` orders of `items` for interleaved runs, pass i starting `len(items) * i // passes` items on, so that
    no item always runs first or last. On the 2-core machine where this was written, the first of eleven servers in
    each serving-bench round was slower than the last one with the same repository in 7 of 9 rounds (medians
    1.03-1.12x apart at 1/8/16 clients): a fixed order turns such a position effect into a difference between
    deployments."""
    ordered = list(items)
    if not ordered:
        return [[] for _ in range(passes)]
    out = []
    for index in range(passes):
        start = len(ordered) * index // passes
        out.append(ordered[start:] + ordered[:start])
    return out


@dataclass(frozen=True)
class Load:
    """What to send: the same Load against two endpoints makes a fair comparison."""

    prompts: Sequence[str] = DEFAULT_PROMPTS
    max_tokens: int = 64
    concurrency: int = 1
    requests: int | None = None
    """Measured requests in all; default: every prompt once, and at least `per_client` per worker."""
    per_client: int = 2
    """Each client's requests at least, where `requests` is not given (STEADY_PER_CLIENT for figures under load)."""
    stream: bool | None = None
    """None: stream when the model is decoupled (see LLMClient.generate)."""
    num_draft_tokens: int | None = None
    warmup: bool = True
    duration_s: float | None = None
    """A time bound: the run stops this many seconds after its start (warm-up excluded), with what completed."""
    halt: Halt | None = field(default=None, compare=False, repr=False)
    """Stops the run from outside (Ctrl-C, SIGTERM) as its time bound would."""
    progress: Callable[[int, int], None] | None = field(default=None, compare=False, repr=False)
    """Told (requests answered, of them failed) after each measured request."""

    @property
    def total_requests(self) -> int:
        return self.requests or max(len(self.prompts), self.per_client * self.concurrency)


POLL_S = 0.05
"""How often a run's wait looks at its Halt (a signal handler cannot wake a thread's wait)."""


class Halt:
    """Ends runs early, from a signal handler or a time bound: a run then stops sending, leaves the requests in
    flight uncounted and reports the ones that completed. A child (`Halt(parent)`) is set when its parent is: one
    run's time bound does not stop the next run, a Ctrl-C stops them all."""

    def __init__(self, parent: Halt | None = None) -> None:
        self.parent = parent
        self._reason: str | None = None

    def __call__(self, reason: str) -> None:
        self._reason = self._reason or reason

    @property
    def reason(self) -> str | None:
        """Why the run stopped early (the first reason given), or None while it has not."""
        return self._reason or (self.parent.reason if self.parent is not None else None)


class TokenCounter:
    """Counts output tokens the same way for every endpoint, so tokens/s compare."""

    def __init__(self, tokenizer: Path | None = None) -> None:
        self._encode: Callable[[str], int] | None = None
        self.source = "model outputs (num_output_tokens), else words"
        if tokenizer is not None:
            self._encode = _load_tokenizer(tokenizer)
            self.source = f"tokenizer {tokenizer}"

    def count(self, generation: Generation) -> tuple[int, str]:
        if self._encode is not None:
            return self._encode(generation.text), "tokenizer"
        if generation.reported_tokens is not None:
            return generation.reported_tokens, generation.reported_as
        return len(generation.text.split()), "words"


def _load_tokenizer(path: Path) -> Callable[[str], int]:
    if (path / "tokenizer.json").is_file():
        from tokenizers import Tokenizer

        fast = Tokenizer.from_file(str(path / "tokenizer.json"))
        return lambda text: len(fast.encode(text, add_special_tokens=False).ids)
    slow = load_tokenizer(path)  # local files only, as the deployed models load it
    return lambda text: len(slow.encode(text, add_special_tokens=False))


@dataclass
class Summary:
    """The figures for one endpoint at one concurrency."""

    url: str
    model: str
    protocol: str
    concurrency: int
    requests: int
    errors: int
    wall_s: float
    output_tokens: int
    output_tokens_per_s: float
    request_tokens_per_s: float
    ttft_ms: dict[str, float]
    itl_ms: dict[str, float]
    latency_ms: dict[str, float]
    acceptance_rate: float | None
    """Accepted draft tokens / draft tokens over all requests (None when the model reports no drafts, or reports
    no acceptance at all: see `acceptance_reported`)."""
    mean_request_acceptance_rate: float | None
    accepted_draft_tokens: int
    draft_tokens: int
    tokens_counted_by: str
    first_error: str | None = None
    sample_answer: str = ""
    tokens_per_response: float | None = None
    """Output tokens per response that carried text: 1 when every token streams alone, the whole answer when
    nothing streams (so a coarser stream shows, which tokens/s and ITL do not)."""
    longest_gap_ms: dict[str, float] = field(default_factory=dict)
    """Each request's longest wait between two responses that carried text: its stream's coarsest step."""
    extra: dict[str, Any] = field(default_factory=dict)
    acceptance_reported: bool = True
    """Whether any answer carried acceptance figures (an OpenAI server other than specbuild's Dynamo workers may
    not): False, and the figures are not reported rather than zero."""
    cut_short: str | None = None
    """Why the run stopped before its last request (a signal, its time bound): the figures are of what completed."""
    acceptance_from: str = "the answers"
    """Where the acceptance figures come from: the answers (Triton's outputs, usage details) or ENGINE_COUNTERS."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def run_load(
    url: str,
    load: Load,
    *,
    model: str | None = None,
    protocol: Protocol = "grpc",
    counter: TokenCounter | None = None,
    timeout_s: float = 300.0,
) -> Summary:
    """Drive `url` with `load` and summarise; a SpecbuildError when no request succeeds."""
    counter = counter or TokenCounter()
    clients: list[LLMClient | OpenAIClient] = []
    halt = Halt(load.halt)  # this run's own: its time bound ends it alone
    try:
        for _ in range(load.concurrency):  # inside the try: a later one failing to connect closes the rest
            clients.append(OpenAIClient(url, model, timeout_s) if protocol == "openai"
                           else LLMClient(url, model, protocol, timeout_s))
        load = replace(load, halt=halt, stream=clients[0].model.decoupled if load.stream is None else load.stream)
        name = clients[0].model.name
        books = EngineBooks(url, name) if protocol == "openai" else None
        results, wall = closed_loop(load, lambda index, prompt: clients[index].generate(
            prompt, load.max_tokens, stream=load.stream, num_draft_tokens=load.num_draft_tokens), SpecbuildError,
            on_start=books.open if books is not None else None)
        counted = books.close() if books is not None else None
    finally:
        for client in clients:
            client.close(cancel=halt.reason is not None)  # cut short: its requests in flight are not awaited
    summary = summarise(url, name, protocol, load, results, wall, counter, cut_short=halt.reason)
    if counted is not None:
        engine_counted(summary, *counted)
    return summary


def engine_counted(summary: Summary, counted: SpecDecodeCounters, source: str = ENGINE_COUNTERS) -> None:
    """The engine's own count over the run (`engine_metrics.EngineBooks`: vLLM's counters, trtllm-serve's
    records), kept in `extra` beside what the answers said; where no answer carried acceptance it is the
    acceptance, from `source`. A run cut short leaves requests in flight whose drafts the second reading may
    include: it says so in `acceptance_from`."""
    summary.extra["engine_spec_decode"] = {"drafts": counted.drafts, "draft_tokens": counted.draft_tokens,
                                           "accepted_tokens": counted.accepted_tokens,
                                           "accepted_per_position": list(counted.accepted_per_position),
                                           "requests": counted.requests, "source": source}
    if summary.acceptance_reported:
        return
    summary.accepted_draft_tokens, summary.draft_tokens = counted.accepted_tokens, counted.draft_tokens
    summary.acceptance_rate = counted.acceptance_rate
    summary.acceptance_reported = True
    summary.acceptance_from = source + (" (cut short: may include requests left in flight)"
                                        if summary.cut_short else "")


Outcome = tuple[Generation | None, str | None]
"""One request's answer, or why it failed."""


def closed_loop(load: Load, send: Callable[[int, str], Generation],
                failures: type[Exception] | tuple[type[Exception], ...],
                describe: Callable[[Exception], str] = str,
                on_start: Callable[[], object] | None = None) -> tuple[list[Outcome], float]:
    """`load.concurrency` clients in a closed loop: each sends one warm-up request (its failure ignored), all
    start together, and each takes the next of `load.total_requests` prompts as soon as its last answer is in.
    `send(client index, prompt)` makes one request; one raising `failures` is an outcome described by
    `describe`. Returns the outcomes and the seconds from the start to the last answer — or, when `load.halt` is
    set or `load.duration_s` runs out first, the outcomes so far and the seconds to that moment (the requests then
    in flight are left to their threads, which take no more and whose answers are not counted). `on_start` is
    called once after the warm-up, before the clock starts (to read a server's counters)."""
    jobs = iter(range(load.total_requests))
    lock = threading.Lock()
    results: list[Outcome] = []
    halt = load.halt or Halt()
    started: list[float] = []
    ended: list[float] = []
    warm, done = threading.Event(), threading.Event()  # waited on with a timeout: a halt is polled
    def begin() -> None:
        if on_start is not None:
            on_start()
        started.append(time.perf_counter())
        warm.set()

    barrier = threading.Barrier(load.concurrency, action=begin)
    running = [load.concurrency]

    def attempt(index: int, prompt: str) -> Outcome | None:
        """One request's outcome; None when it broke because the run was cut short (its client closed)."""
        try:
            return send(index, prompt), None
        except failures as err:
            return None, describe(err)
        except Exception:
            if halt.reason is not None:
                return None
            raise

    def measured(index: int) -> None:
        """Client `index`'s measured requests, one after another, until none are left or the run is cut short."""
        while halt.reason is None:
            with lock:
                job = next(jobs, None)
            if job is None:
                return
            outcome = attempt(index, load.prompts[job % len(load.prompts)])
            with lock:
                if outcome is None or halt.reason is not None:
                    return
                results.append(outcome)
                if load.progress is not None:
                    load.progress(len(results), sum(error is not None for _, error in results))

    def client(index: int) -> None:
        try:
            try:
                if load.warmup:
                    attempt(index, load.prompts[index % len(load.prompts)])
            finally:
                with contextlib.suppress(threading.BrokenBarrierError):
                    barrier.wait()
            measured(index)
        finally:
            with lock:
                running[0] -= 1
                if not running[0]:
                    ended.append(time.perf_counter())
                    done.set()

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(load.concurrency)]
    for thread in threads:
        thread.start()
    while not warm.wait(POLL_S):  # the warm-up
        if halt.reason is not None:
            barrier.abort()
            return [], 0.0
    deadline = None if load.duration_s is None else started[0] + load.duration_s
    while not done.wait(POLL_S) and halt.reason is None:
        if deadline is not None and time.perf_counter() >= deadline:
            halt(f"the {load.duration_s:g} s time bound")
    with lock:  # a copy: threads still in flight append nothing more, but the list is theirs
        return list(results), (ended[0] if ended else time.perf_counter()) - started[0]


def median_round(rounds: list[Summary]) -> Summary:
    """The round with the median tokens/s (the lower middle of an even count), every round's figure kept with
    it, so that one slow or fast round on a shared machine does not decide a comparison."""
    ordered = sorted(rounds, key=lambda s: s.output_tokens_per_s)
    chosen = ordered[(len(ordered) - 1) // 2]
    chosen.extra["rounds_tokens_per_s"] = [round(s.output_tokens_per_s, 2) for s in rounds]
    return chosen


def summarise(
    url: str,
    model: str,
    protocol: str,
    load: Load,
    results: list[tuple[Generation | None, str | None]],
    wall_s: float,
    counter: TokenCounter,
    cut_short: str | None = None,
) -> Summary:
    """The figures of the requests that completed; `cut_short`: why the run stopped before its last one."""
    done = [g for g, _ in results if g is not None]
    errors = [e for _, e in results if e is not None]
    if not done and errors:
        raise SpecbuildError(f"{url} ({model}): every request failed: {errors[0]}")
    if not done:
        raise SpecbuildError(f"{url} ({model}): no request completed before {cut_short or 'the end'}",
                             hint="give the run more time (--duration) or fewer --max-tokens")
    counted = [counter.count(g) for g in done]
    tokens = [n for n, _ in counted]
    sources = sorted({s for _, s in counted})
    itl = [(g.latency_s - g.ttft_s) / (n - 1) for g, n in zip(done, tokens, strict=True) if n > 1]
    accepted = sum(g.accepted_draft_tokens or 0 for g in done)
    drafted = sum(g.draft_tokens or 0 for g in done)
    rates = [g.acceptance_rate for g in done if g.acceptance_rate is not None and g.draft_tokens]
    responses = sum(len(g.response_times) for g in done)
    gaps = [max(b - a for a, b in itertools.pairwise(g.response_times)) * 1e3
            for g in done if len(g.response_times) > 1]
    return Summary(
        url=url, model=model, protocol=protocol, concurrency=load.concurrency, requests=len(done),
        errors=len(errors), wall_s=wall_s, output_tokens=sum(tokens),
        output_tokens_per_s=sum(tokens) / wall_s if wall_s > 0 else 0.0,
        request_tokens_per_s=statistics.fmean(n / g.latency_s for g, n in zip(done, tokens, strict=True)),
        ttft_ms=_stats([g.ttft_s * 1e3 for g in done]),
        itl_ms=_stats([x * 1e3 for x in itl]),
        latency_ms=_stats([g.latency_s * 1e3 for g in done]),
        acceptance_rate=accepted / drafted if drafted else None,
        mean_request_acceptance_rate=statistics.fmean(rates) if rates else None,
        accepted_draft_tokens=accepted, draft_tokens=drafted,
        tokens_counted_by=counter.source if counter.source.startswith("tokenizer") else ", ".join(sources),
        first_error=errors[0] if errors else None, sample_answer=done[0].text,
        tokens_per_response=sum(tokens) / responses if responses else None,
        longest_gap_ms=_stats(gaps),
        extra={"stream": load.stream, "max_tokens": load.max_tokens, "num_draft_tokens": load.num_draft_tokens},
        acceptance_reported=any(g.draft_tokens is not None for g in done), cut_short=cut_short,
    )


def _stats(values: list[float]) -> dict[str, float]:
    if not values:
        return {"mean": float("nan"), "p50": float("nan"), "p90": float("nan"), "p99": float("nan")}
    ordered = sorted(values)
    return {
        "mean": statistics.fmean(ordered),
        "p50": statistics.median(ordered),
        "p90": _percentile(ordered, 0.9),
        "p99": _percentile(ordered, 0.99),
    }


def _percentile(ordered: list[float], q: float) -> float:
    """The nearest-rank percentile of sorted values."""
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]
