"""What `specbuild bench` does once the arguments are parsed: tell what each URL speaks, choose the tokenizer, run
the load with its progress on stderr, then print a table or JSON (and plot a PNG) — also of a run cut short by
Ctrl-C, SIGTERM or its --duration bound, whose figures are those of the requests that completed."""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal, get_args

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from specbuild.bench.client import DEPLOY_DRAFT_LENGTH, LLMClient, Protocol
from specbuild.bench.load import DEFAULT_PROMPTS, Halt, Load, Summary, TokenCounter, run_load
from specbuild.bench.openai import OPENAI_PATH, USAGE_TOKENS, speaks_openai
from specbuild.bench.report import counted_by, plot, speedup, table, unit
from specbuild.bench.tokenizer_source import WordCounter, choose_tokenizer
from specbuild.errors import SpecbuildError

Choice = Literal["auto", "grpc", "http", "openai"]
PROTOCOLS: tuple[Choice, ...] = get_args(Choice)
SIGNAL_EXIT = {"SIGINT": 130, "SIGTERM": 143}
"""The exit code of a bench cut short by a signal, after its figures: 128 + the signal's number, as the shell's."""


@dataclass(frozen=True)
class BenchOptions:
    url: str
    model_name: str | None = None
    protocol: Choice = "auto"
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
    duration_s: float | None = None


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


def detect_protocol(url: str, choice: Choice = "auto") -> Protocol:
    """What `url` speaks: `choice` unless auto; else OpenAI when it ends in /v1 (as `specbuild serve` prints a Dynamo
    deployment's) or answers /v1/models, Triton's HTTP when it says http(s)://, else Triton's gRPC."""
    if choice != "auto":
        return choice
    if url.rstrip("/").endswith(OPENAI_PATH) or speaks_openai(url):
        return "openai"
    return "http" if url.startswith(("http://", "https://")) else "grpc"


def _counter(options: BenchOptions, protocols: dict[str, Protocol], console: Console) -> TokenCounter:
    """One counter for every endpoint, so their figures are in one unit: the deployment's tokenizer; without one,
    the servers' own usage counts when every endpoint is an OpenAI server (they all report them), else words."""
    choice = choose_tokenizer(options.url, protocols["endpoint"], tokenizer=options.tokenizer,
                              repository=options.repository)
    if choice.directory is None and set(protocols.values()) == {"openai"}:
        console.print(f"counting tokens by the server's {USAGE_TOKENS} (no --tokenizer)", highlight=False)
        return TokenCounter()
    counter = choice.counter()
    if isinstance(counter, WordCounter):
        console.print(f"counting words, not tokens: {choice.found_by}", highlight=False, soft_wrap=True)
    return counter


@contextmanager
def halted_by_signals(halt: Halt) -> Iterator[None]:
    """SIGINT (Ctrl-C) and SIGTERM end the bench through `halt`, so the figures so far are printed; a second
    one acts as it would without the bench (the previous handler is back)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}

    def handler(number: int, _frame: object) -> None:
        halt(signal.Signals(number).name)
        signal.signal(number, previous[number])

    for number in previous:
        signal.signal(number, handler)
    try:
        yield
    finally:
        for number, action in previous.items():
            signal.signal(number, action)


@contextmanager
def progress_shown(console: Console, what: str, total: int) -> Iterator[Callable[[int, int], None]]:
    """Requests answered so far, on stderr (stdout keeps the table or JSON): a bar on a terminal, else a line at
    each tenth of the requests (each request, up to ten), so a log shows the run moving without growing long."""
    if console.is_terminal:
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("requests {task.fields[failed]}"), TimeElapsedColumn())
        with Progress(*columns, console=console, transient=True) as bar:
            task = bar.add_task(what, total=total, failed="")
            yield lambda done, failed: bar.update(task, completed=done, failed=f"({failed} failed)" if failed else "")
        return
    shown = [0]

    def line(done: int, failed: int) -> None:
        if done * 10 // total > shown[0] or done == total or total <= 10:
            shown[0] = done * 10 // total
            console.print(f"{what}: {done}/{total} requests" + (f" ({failed} failed)" if failed else ""),
                          highlight=False, soft_wrap=True)

    yield line


def _check_draft_length(options: BenchOptions, endpoints: dict[str, tuple[str, str | None]],
                        protocols: dict[str, Protocol], console: Console) -> None:
    """--num-draft-tokens is refused where the measured endpoint's model has no num_draft_tokens input (it would
    draft as deployed); a --compare model without it (a plain baseline, say) is told, not refused."""
    for label, (url, model) in endpoints.items():
        if protocols[label] == "openai":
            continue
        with LLMClient(url, model, protocols[label]) as client:
            problem = client.model.draft_length_problem(options.num_draft_tokens)
        if problem is not None and label == "endpoint":
            raise SpecbuildError(problem, hint=f"leave out --num-draft-tokens to measure it as deployed, or "
                                               f"{DEPLOY_DRAFT_LENGTH}")
        if problem is not None:
            console.print(f"note: {label} {url}: {problem}", highlight=False, soft_wrap=True)


def run_bench(options: BenchOptions, console: Console, out: Console) -> dict[str, Any]:
    """Every concurrency against the URL (and the comparison URL); returns the JSON report it printed, with
    `cut_short` (why, e.g. SIGINT) when it stopped early."""
    prompts = read_prompts(options.prompts_file)
    endpoints = {"endpoint": (options.url, options.model_name)}
    if options.compare:
        endpoints["compare"] = (options.compare, options.compare_model_name or options.model_name)
    protocols = {label: detect_protocol(url, options.protocol) for label, (url, _) in endpoints.items()}
    for label, protocol in protocols.items():
        if protocol == "openai" and options.num_draft_tokens is not None:
            raise SpecbuildError(f"--num-draft-tokens: {endpoints[label][0]} is an OpenAI endpoint, whose requests "
                                 "carry no draft length (its K is the deployment's speculative.num_draft_tokens)",
                                 hint="leave --num-draft-tokens out, or measure a Triton endpoint")
    if options.num_draft_tokens is not None:
        _check_draft_length(options, endpoints, protocols, console)
    counter = _counter(options, protocols, console)
    runs: dict[str, list[Summary]] = {label: [] for label in endpoints}
    halt = Halt()
    with halted_by_signals(halt):
        for concurrency in options.concurrency:
            load = Load(prompts=prompts, max_tokens=options.max_tokens, concurrency=concurrency,
                        requests=options.requests, stream=options.stream, num_draft_tokens=options.num_draft_tokens,
                        duration_s=options.duration_s, halt=halt)
            for label, (url, model) in endpoints.items():
                if halt.reason is not None:
                    break
                what = f"{label} {url} ({protocols[label]}), concurrency {concurrency}"
                with progress_shown(console, what, load.total_requests) as shown:
                    try:
                        summary = run_load(url, replace(load, progress=shown), model=model,
                                           protocol=protocols[label], counter=counter)
                    except SpecbuildError:
                        if halt.reason is None:
                            raise
                        break  # Ctrl-C before this run's first answer: report the runs before it
                runs[label].append(summary)
                if summary.cut_short:
                    console.print(f"{what}: cut short by {summary.cut_short}; the figures are of the "
                                  f"{summary.requests + summary.errors} of {load.total_requests} requests that "
                                  "completed", highlight=False, soft_wrap=True)
    if not runs["endpoint"]:  # only a signal ends the bench before its first run's first answer
        console.print(f"cut short by {halt.reason} before any request completed: nothing to report", highlight=False)
        return {"cut_short": halt.reason}
    return _report(options, runs, halt.reason, out, console)


def _report(options: BenchOptions, runs: dict[str, list[Summary]], cut_short: str | None, out: Console,
            console: Console) -> dict[str, Any]:
    """Print (and plot) the runs that ran; returns the JSON report."""
    report = to_json(runs, baseline="compare" if options.compare else None)
    if cut_short is not None:
        report["cut_short"] = cut_short
    if options.png is not None:
        first = runs["endpoint"][0]
        plot({f"{label}: {items[0].url} ({items[0].model})": items for label, items in runs.items() if items},
             options.png, f"specbuild bench, {first.protocol}, {options.max_tokens} new tokens; {counted_by(first)}")
        report["png"] = str(options.png)
    if options.json_output:
        out.file.write(json.dumps(report, indent=2) + "\n")  # plain: rich would wrap long strings
        return report
    for index, first in enumerate(runs["endpoint"]):
        columns = {label: items[index] for label, items in runs.items() if index < len(items)}
        where = ", ".join(f"{label} = {s.url} ({s.model}, {s.protocol})" for label, s in columns.items())
        cut = next((f" — cut short by {s.cut_short}" for s in columns.values() if s.cut_short), "")
        out.print(table(columns, baseline="compare" if "compare" in columns else None,
                        title=f"concurrency {first.concurrency}: {where}{cut}"))
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
            for mine, base in zip(runs["endpoint"], runs[baseline], strict=False)  # cut short: the pairs that ran
        ]
    return report
