"""What `specbuild bench` does once the arguments are parsed: choose the tokenizer, run the load, then print a
table or JSON (and plot a PNG)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from specbuild.bench.client import Protocol
from specbuild.bench.load import DEFAULT_PROMPTS, Load, Summary, run_load
from specbuild.bench.report import counted_by, plot, speedup, table, unit
from specbuild.bench.tokenizer_source import choose_tokenizer
from specbuild.errors import SpecbuildError


@dataclass(frozen=True)
class BenchOptions:
    url: str
    model_name: str | None = None
    protocol: Protocol = "grpc"
    concurrency: tuple[int, ...] = (1,)
    prompts_file: Path | None = None
    max_tokens: int = 64
    requests: int | None = None
    stream: bool | None = None
    num_draft_tokens: int | None = None
    tokenizer: Path | None = None
    repository: Path | None = None
    """The deployed model repository: its preprocessing model names the tokenizer to count with."""
    compare: str | None = None
    compare_model_name: str | None = None
    png: Path | None = None
    json_output: bool = False


def read_prompts(path: Path | None) -> tuple[str, ...]:
    """One prompt per non-empty line; the built-in Python-documentation openings when no file is given."""
    if path is None:
        return DEFAULT_PROMPTS
    try:
        prompts = tuple(line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip())
    except OSError as err:
        raise SpecbuildError(f"{path}: cannot read the prompt file ({err.strerror})") from None
    except UnicodeDecodeError as err:
        raise SpecbuildError(f"{path}: the prompt file is not UTF-8 text ({err.reason} at byte {err.start})") from None
    if not prompts:
        raise SpecbuildError(f"{path}: no prompts (one per line expected)")
    return prompts


def run_bench(options: BenchOptions, console: Console, out: Console) -> dict[str, Any]:
    """Every concurrency against the URL (and the comparison URL); returns the JSON report it printed."""
    prompts = read_prompts(options.prompts_file)
    choice = choose_tokenizer(options.url, options.protocol, tokenizer=options.tokenizer,
                              repository=options.repository)
    counter = choice.counter()  # one counter for both endpoints: their figures are in the same unit
    if choice.directory is None:
        console.print(f"counting words, not tokens: {choice.found_by}", highlight=False, soft_wrap=True)
    endpoints = {"endpoint": (options.url, options.model_name)}
    if options.compare:
        endpoints["compare"] = (options.compare, options.compare_model_name or options.model_name)
    runs: dict[str, list[Summary]] = {label: [] for label in endpoints}
    for concurrency in options.concurrency:
        load = Load(prompts=prompts, max_tokens=options.max_tokens, concurrency=concurrency,
                    requests=options.requests, stream=options.stream, num_draft_tokens=options.num_draft_tokens)
        for label, (url, model) in endpoints.items():
            with console.status(f"{label} {url}: concurrency {concurrency}, {load.total_requests} requests…"):
                runs[label].append(run_load(url, load, model=model, protocol=options.protocol, counter=counter))
    report = to_json(runs, baseline="compare" if options.compare else None)
    if options.png is not None:
        first = next(iter(runs.values()))[0]
        plot({f"{label}: {items[0].url} ({items[0].model})": items for label, items in runs.items()}, options.png,
             f"specbuild bench, {options.protocol}, {options.max_tokens} new tokens; {counted_by(first)}")
        report["png"] = str(options.png)
    if options.json_output:
        out.file.write(json.dumps(report, indent=2) + "\n")  # plain: rich would wrap long strings
        return report
    for index, concurrency in enumerate(options.concurrency):
        columns = {label: items[index] for label, items in runs.items()}
        where = ", ".join(f"{label} = {s.url} ({s.model})" for label, s in columns.items())
        out.print(table(columns, baseline="compare" if options.compare else None,
                        title=f"concurrency {concurrency}, {options.protocol}: {where}"))
    if options.png is not None:
        console.print(f"wrote {options.png}", highlight=False)
    return report


def to_json(runs: dict[str, list[Summary]], baseline: str | None) -> dict[str, Any]:
    """{label: [summary per concurrency]}, `unit` (tokens or words: what `output_tokens` counts), plus `ratios`
    (endpoint vs compare, >1 = endpoint better)."""
    report: dict[str, Any] = {label: [s.to_json() for s in items] for label, items in runs.items()}
    report["unit"] = unit(next(iter(runs.values()))[0])
    if baseline is not None:
        report["ratios"] = [
            {
                "concurrency": mine.concurrency,
                "output_tokens_per_s": speedup(mine, base, "output_tokens_per_s"),
                "ttft_mean": speedup(mine, base, "ttft_ms.mean"),
                "itl_mean": speedup(mine, base, "itl_ms.mean"),
                "latency_mean": speedup(mine, base, "latency_ms.mean"),
            }
            for mine, base in zip(runs["endpoint"], runs[baseline], strict=True)
        ]
    return report
