"""vLLM's own speculative-decoding counters, read from the Prometheus text its OpenAI server serves at /metrics.

Why: a vLLM server puts no acceptance in an OpenAI answer's usage (only a root-level `metrics` object, and only when
started with `--per-request-spec-decode-metrics`), but it always counts what it drafted and accepted, per engine, in
counters (vllm/v1/spec_decode/metrics.py, vLLM 0.32): `vllm:spec_decode_num_drafts` (verification steps that carried
a draft), `vllm:spec_decode_num_draft_tokens`, `vllm:spec_decode_num_accepted_tokens`, and
`vllm:spec_decode_num_accepted_tokens_per_pos` with one `position` label per draft position, 0 .. K-1 (so the number
of positions is the K the engine drafts). Their difference over a run is that run's acceptance, read from the
engine rather than computed by specbuild; `specbuild bench` uses it for an OpenAI endpoint whose answers carry none,
and tests/test_vllm_served.py checks each export's method and K by it.

trtllm-serve keeps its own books another way (specbuild.contracts.llm_api.SERVE_PERF_METRICS, which its exports
switch on): one record per finished request, answered and emptied by GET /perf_metrics. `EngineBooks` reads
whichever the server keeps, before and after a run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PREFIX = "vllm:spec_decode_"
PERF_METRICS_PATH = "/perf_metrics"
PERF_SPEC = "speculative_decoding"
COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")
PER_POSITION = "num_accepted_tokens_per_pos"
METRICS_PATH = "/metrics"


@dataclass(frozen=True)
class SpecDecodeCounters:
    """The spec-decode counters of one served model (summed over its engines), or their difference over a run."""

    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    accepted_per_position: tuple[int, ...] = field(default_factory=tuple)
    """Accepted tokens at draft position 0, 1, ...: as many entries as the engine's K."""
    requests: int | None = None
    """How many requests' records these figures sum (trtllm-serve's /perf_metrics); None: counters, not records."""

    @property
    def num_speculative_tokens(self) -> int:
        """The K the engine drafts with: its number of draft positions (0: it does not speculate)."""
        return len(self.accepted_per_position)

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else None

    def __sub__(self, before: SpecDecodeCounters) -> SpecDecodeCounters:
        """What was counted between `before` and this reading."""
        before_pos = before.accepted_per_position + (0,) * (len(self.accepted_per_position)
                                                           - len(before.accepted_per_position))
        return SpecDecodeCounters(self.drafts - before.drafts, self.draft_tokens - before.draft_tokens,
                                  self.accepted_tokens - before.accepted_tokens,
                                  tuple(a - b for a, b in zip(self.accepted_per_position, before_pos, strict=False)))


def parse_counters(text: str, model: str | None = None) -> SpecDecodeCounters | None:
    """The spec-decode counters in a /metrics page, of `model` (its `model_name` label) or of every model; None
    when the page has none (not vLLM, or a vLLM that does not speculate)."""
    from prometheus_client.parser import text_string_to_metric_families

    totals = dict.fromkeys(COUNTERS, 0.0)
    per_position: dict[int, float] = {}
    found = False
    for family in text_string_to_metric_families(text):
        if not family.name.startswith(PREFIX):
            continue
        name = family.name[len(PREFIX):]
        for sample in family.samples:
            if not sample.name.endswith("_total") or (model is not None and
                                                      sample.labels.get("model_name", model) != model):
                continue
            if name in totals:
                totals[name] += sample.value
                found = True
            elif name == PER_POSITION:
                position = int(sample.labels["position"])
                per_position[position] = per_position.get(position, 0.0) + sample.value
                found = True
    if not found:
        return None
    positions = tuple(int(per_position.get(index, 0)) for index in range(max(per_position, default=-1) + 1))
    return SpecDecodeCounters(int(totals["num_drafts"]), int(totals["num_draft_tokens"]),
                              int(totals["num_accepted_tokens"]), positions)


def read_counters(url: str, model: str | None = None, timeout_s: float = 30.0) -> SpecDecodeCounters | None:
    """The spec-decode counters `url` (an OpenAI server's base, with or without /v1) serves at /metrics; None when
    it serves no /metrics or no such counters (another server: Dynamo's frontend, trtllm-serve, SGLang). The
    timeout is generous: on 2 cores loaded 10-fold a /metrics answer took over 5 s, and the bench then reported no
    acceptance for a speculating vLLM."""
    from specbuild.bench.openai import _session, base_url

    try:
        with _session() as session:
            response = session.get(base_url(url) + METRICS_PATH, timeout=timeout_s)
    except Exception:  # no /metrics here means the same as none: no counters to read
        return None
    if response.status_code != 200:
        return None
    try:
        return parse_counters(response.text, model)
    except ValueError:  # not Prometheus text
        return None


def parse_perf_metrics(records: object) -> SpecDecodeCounters | None:
    """The draft and accepted tokens summed over trtllm-serve's /perf_metrics records (a list of {request_id,
    perf_metrics}; `perf_metrics.speculative_decoding` carries total_draft_tokens and total_accepted_draft_tokens
    when the request drafted: specbuild.contracts.llm_api.SERVE_PERF_METRICS_SOURCE); None when no record drafted
    (the list is empty where the server keeps none: return_perf_metrics off or perf_metrics_max_requests 0)."""
    if not isinstance(records, list):
        raise ValueError(f"{PERF_METRICS_PATH} answered {type(records).__name__}, not a list of records")
    drafted = accepted = 0
    found = False
    for record in records:
        spec = (record.get("perf_metrics") or {}).get(PERF_SPEC) if isinstance(record, dict) else None
        if isinstance(spec, dict) and spec.get("total_draft_tokens") is not None:
            drafted += int(spec["total_draft_tokens"])
            accepted += int(spec.get("total_accepted_draft_tokens") or 0)
            found = True
    return SpecDecodeCounters(draft_tokens=drafted, accepted_tokens=accepted, requests=len(records)) if found else None


def take_perf_metrics(url: str, timeout_s: float = 30.0) -> SpecDecodeCounters | None:
    """What trtllm-serve's GET /perf_metrics answers at `url` (emptying its store), summed; None from any other
    server (no such route) or when no record drafted."""
    from specbuild.bench.openai import _session, base_url

    try:
        with _session() as session:
            response = session.get(base_url(url) + PERF_METRICS_PATH, timeout=timeout_s)
        return parse_perf_metrics(response.json()) if response.status_code == 200 else None
    except Exception:  # not trtllm-serve (no route, not JSON): no records to read
        return None


ENGINE_COUNTERS = "the engine's /metrics spec-decode counters over the run"
PERF_RECORDS = "trtllm-serve's /perf_metrics records of the run's requests"


class EngineBooks:
    """The engine's own count of drafted and accepted tokens over one run, read where it keeps one: vLLM's
    counters (read at `open` and `close`: their difference) or trtllm-serve's per-request records (emptied at
    `open`, so what `close` takes are the run's). Another client's requests in the same time are counted too."""

    def __init__(self, url: str, model: str | None) -> None:
        self.url, self.model = url, model
        self._before: SpecDecodeCounters | None = None

    def open(self) -> None:
        self._before = read_counters(self.url, self.model)
        if self._before is None:
            take_perf_metrics(self.url)  # the warm-up's records (or nothing, from a server that keeps none)

    def close(self) -> tuple[SpecDecodeCounters, str] | None:
        """The run's figures and where they come from; None where the server keeps neither."""
        if self._before is not None:
            after = read_counters(self.url, self.model)
            return (after - self._before, ENGINE_COUNTERS) if after is not None else None
        taken = take_perf_metrics(self.url)
        return (taken, PERF_RECORDS) if taken is not None else None
