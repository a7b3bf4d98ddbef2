"""How benchmark summaries are shown: a rich table, one JSON object, and a PNG of the main figures.

Every label says what was counted: tokens (the deployment's tokenizer, or the model's num_output_tokens) or
words (whitespace-separated, when no tokenizer was found), never words called tokens.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from rich.table import Table

from specbuild.bench.load import Summary
from specbuild.errors import SpecbuildError

ROWS: tuple[tuple[str, str, bool], ...] = (
    # (label, field, compared against the baseline)
    # {unit} is "tokens" or "words" (see `unit`)
    ("output {unit}/s", "output_tokens_per_s", True),
    ("{unit}/s per request", "request_tokens_per_s", True),
    ("TTFT mean (ms)", "ttft_ms.mean", True),
    ("TTFT p90 (ms)", "ttft_ms.p90", True),
    ("ITL mean (ms)", "itl_ms.mean", True),
    ("{unit} per response", "tokens_per_response", False),
    ("longest gap p50 (ms)", "longest_gap_ms.p50", True),
    ("latency mean (ms)", "latency_ms.mean", True),
    ("latency p90 (ms)", "latency_ms.p90", True),
    ("acceptance rate", "acceptance_rate", False),
    ("accepted / draft tokens", "accepted_draft_tokens", False),
    ("requests (errors)", "requests", False),
    ("output {unit}", "output_tokens", False),
)
HIGHER_IS_BETTER = {"output_tokens_per_s", "request_tokens_per_s"}


def unit(summary: Summary) -> str:
    """What `output_tokens` counts in `summary`: tokens, words, or (a mix, per request) tokens or words."""
    sources = {source.strip() for source in summary.tokens_counted_by.split(",")}
    words = "words" in sources
    if not words:
        return "tokens"
    return "words" if sources == {"words"} else "tokens or words"


def counted_by(summary: Summary) -> str:
    """The unit and how it was counted, for captions and titles."""
    if summary.tokens_counted_by == "words":
        return "words counted at whitespace (no tokenizer)"
    return f"{unit(summary)} counted by {summary.tokens_counted_by}"


def value(summary: Summary, path: str) -> Any:
    item: Any = summary
    for part in path.split("."):
        item = item[part] if isinstance(item, dict) else getattr(item, part)
    return item


def speedup(summary: Summary, baseline: Summary, path: str) -> float | None:
    """How much better `summary` is than `baseline` on one figure (>1 = better: faster or lower latency)."""
    a, b = value(summary, path), value(baseline, path)
    if not isinstance(a, int | float) or not isinstance(b, int | float) or not a or not b:
        return None
    if math.isnan(a) or math.isnan(b):
        return None
    return a / b if path in HIGHER_IS_BETTER else b / a


def table(columns: dict[str, Summary], baseline: str | None = None, title: str | None = None) -> Table:
    """Figures side by side; with a baseline, a `×` column per other endpoint (>1 = better than the baseline)."""
    grid = Table(title=title, show_lines=False)
    grid.add_column("")
    for label in columns:
        grid.add_column(label, justify="right")
    others = [label for label in columns if baseline is not None and label != baseline]
    for label in others:
        grid.add_column(f"{label} ÷ {baseline}", justify="right", style="bold")
    first = next(iter(columns.values()))
    counted = unit(first)
    for name, path, compared in ROWS:
        cells = [_cell(summary, path) for summary in columns.values()]
        for label in others:
            assert baseline is not None
            ratio = speedup(columns[label], columns[baseline], path) if compared else None
            cells.append(f"{ratio:.2f}×" if ratio is not None else "")
        grid.add_row(name.format(unit=counted), *cells)
    grid.caption = f"{counted_by(first)}; ITL = (latency − TTFT) / ({counted} − 1)"
    engine = sorted({label for label, summary in columns.items() if summary.acceptance_from != "the answers"})
    if engine:  # acceptance not from the answers: say whose counts they are
        grid.caption += f"; acceptance of {', '.join(engine)}: {columns[engine[0]].acceptance_from}"
    return grid


def _cell(summary: Summary, path: str) -> str:
    if path in ("acceptance_rate", "accepted_draft_tokens") and not summary.acceptance_reported:
        return "not reported"  # the server's answers carry none (e.g. an OpenAI server other than Dynamo's workers)
    if path == "accepted_draft_tokens":
        return f"{summary.accepted_draft_tokens} / {summary.draft_tokens}" if summary.draft_tokens else "–"
    if path == "requests":
        return f"{summary.requests} ({summary.errors})"
    item = value(summary, path)
    if item is None or (isinstance(item, float) and math.isnan(item)):
        return "–"
    if isinstance(item, float):
        return f"{item:.3f}" if path == "acceptance_rate" else f"{item:.1f}"
    return str(item)


PANELS = (("output {unit}/s", "output_tokens_per_s"), ("TTFT mean (ms)", "ttft_ms.mean"),
          ("ITL mean (ms)", "itl_ms.mean"), ("acceptance rate", "acceptance_rate"))


def plot(series: dict[str, list[Summary]], path: Path, title: str) -> Path:
    """Bars of output rate, TTFT, ITL and acceptance per endpoint (named by its label: say URL and model there),
    grouped by concurrency; the rate's unit is the summaries' (tokens or words). matplotlib is a dev dependency."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SpecbuildError(
            "the PNG needs matplotlib, which is not installed",
            hint="pip install matplotlib (or install specbuild[dev]); leave out --png to skip the plot",
        ) from None
    concurrencies = sorted({s.concurrency for runs in series.values() for s in runs})
    counted = unit(next(iter(series.values()))[0])
    figure, axes = plt.subplots(1, len(PANELS), figsize=(17, 4.4))
    width = 0.8 / max(1, len(series))
    for panel, (label, key) in zip(axes, PANELS, strict=True):
        for i, (name, runs) in enumerate(series.items()):
            by_c = {s.concurrency: value(s, key) for s in runs}
            xs = [c_index + (i - (len(series) - 1) / 2) * width for c_index in range(len(concurrencies))]
            heights = [by_c.get(c) for c in concurrencies]
            bars = panel.bar(xs, [h if isinstance(h, int | float) and not math.isnan(h) else 0.0 for h in heights],
                             width, label=name)
            if key == "acceptance_rate":  # the figure speculation is about: its value on the bar, "–" when none
                panel.bar_label(bars, [f"{h:.2f}" if isinstance(h, float) else "–" for h in heights], fontsize=8)
        panel.set_xticks(range(len(concurrencies)), [f"concurrency {c}" for c in concurrencies])
        panel.set_title(label.format(unit=counted))
        panel.grid(axis="y", alpha=0.3)
    axes[-1].set_ylim(0, 1.1)
    handles, labels = axes[0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncol=len(series), fontsize=9, frameon=False)
    figure.suptitle(title)
    figure.tight_layout(rect=(0, 0.08, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
