"""vLLM's own speculative-decoding counters, read from the Prometheus text its OpenAI server serves at /metrics.

Why: a vLLM server puts no acceptance in an OpenAI answer's usage (only a root-level `metrics` object, and only when
started with `--per-request-spec-decode-metrics`), but it always counts what it drafted and accepted, per engine, in
counters (vllm/v1/spec_decode/metrics.py, vLLM 0.32): `vllm:spec_decode_num_drafts` (verification steps that carried
a draft), `vllm:spec_decode_num_draft_tokens`, `vllm:spec_decode_num_accepted_tokens`, and
`vllm:spec_decode_num_accepted_tokens_per_pos` with one `position` label per draft position, 0 .. K-1 (so the number
of positions is the K the engine drafts). Their difference over a run is that run's acceptance, read from the
engine rather than computed by specbuild; `specbuild bench` uses it for an OpenAI endpoint whose answers carry none,
and tests/test_vllm_served.py checks each export's method and K by it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PREFIX = "vllm:spec_decode_"
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
