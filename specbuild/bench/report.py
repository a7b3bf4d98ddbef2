"""How benchmark summaries are shown: a rich table, one JSON object, and a PNG of the main figures."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from rich.table import Table

from specbuild.bench.load import Summary
from specbuild.errors import SpecbuildError

ROWS: tuple[tuple[str, str, bool], ...] = (
    # (label, field, compared against the baseline)
    ("output tokens/s", "output_tokens_per_s", True),
    ("tokens/s per request", "request_tokens_per_s", True),
    ("TTFT mean (ms)", "ttft_ms.mean", True),
    ("TTFT p90 (ms)", "ttft_ms.p90", True),
    ("ITL mean (ms)", "itl_ms.mean", True),
    ("latency mean (ms)", "latency_ms.mean", True),
    ("latency p90 (ms)", "latency_ms.p90", True),
    ("acceptance rate", "acceptance_rate", False),
    ("accepted / draft tokens", "accepted_draft_tokens", False),
    ("requests (errors)", "requests", False),
    ("output tokens", "output_tokens", False),
)
HIGHER_IS_BETTER = {"output_tokens_per_s", "request_tokens_per_s"}


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
    for name, path, compared in ROWS:
        cells = [_cell(summary, path) for summary in columns.values()]
        for label in others:
            assert baseline is not None
            ratio = speedup(columns[label], columns[baseline], path) if compared else None
            cells.append(f"{ratio:.2f}×" if ratio is not None else "")
        grid.add_row(name, *cells)
    first = next(iter(columns.values()))
    grid.caption = f"tokens counted by {first.tokens_counted_by}; ITL = (latency − TTFT) / (tokens − 1)"
    return grid


def _cell(summary: Summary, path: str) -> str:
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


def plot(series: dict[str, list[Summary]], path: Path, title: str) -> Path:
    """Bars of tokens/s, TTFT and ITL per endpoint, grouped by concurrency. matplotlib is a dev dependency."""
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
    figure, axes = plt.subplots(1, 3, figsize=(13, 4))
    width = 0.8 / max(1, len(series))
    for panel, (label, key) in zip(axes, (("output tokens/s", "output_tokens_per_s"), ("TTFT mean (ms)",
                                   "ttft_ms.mean"), ("ITL mean (ms)", "itl_ms.mean")), strict=True):
        for i, (name, runs) in enumerate(series.items()):
            by_c = {s.concurrency: value(s, key) for s in runs}
            xs = [c_index + (i - (len(series) - 1) / 2) * width for c_index in range(len(concurrencies))]
            panel.bar(xs, [by_c.get(c, 0.0) for c in concurrencies], width, label=name)
        panel.set_xticks(range(len(concurrencies)), [f"concurrency {c}" for c in concurrencies])
        panel.set_title(label)
        panel.grid(axis="y", alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncol=len(series), fontsize=9, frameon=False)
    figure.suptitle(title)
    figure.tight_layout(rect=(0, 0.07, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
