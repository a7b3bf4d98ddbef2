"""`specbuild bench`: client-side figures of a running server, optionally against a second one."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from specbuild.cli.errors import console, handled_errors
from specbuild.cli.options import JsonOutput, MaxTokens, ModelName, NumDraftTokens
from specbuild.errors import SpecbuildError


def bench(
    url: Annotated[
        str, typer.Argument(help="Server address: Triton's gRPC host:port or HTTP http://host:port, or an OpenAI "
                            "endpoint (the http://host:port/v1 `specbuild serve` prints for Dynamo; trtllm-serve, "
                            "vLLM, SGLang).", metavar="URL")
    ],
    model_name: ModelName = None,
    protocol: Annotated[str, typer.Option("--protocol", help="auto (default: OpenAI when the URL ends in /v1 or "
                                          "answers /v1/models, Triton HTTP for http://, else Triton gRPC), grpc "
                                          "(Triton streaming), http (Triton generate) or openai (/v1/completions).")
                        ] = "auto",
    concurrency: Annotated[
        list[int] | None,
        typer.Option("--concurrency", min=1, metavar="N", help="Clients in flight; repeat for several runs."),
    ] = None,
    prompts: Annotated[Path | None, typer.Option("--prompts", metavar="FILE", help="Prompt file, one per line.")] = (
        None),
    max_tokens: MaxTokens = 64,
    requests: Annotated[
        int | None, typer.Option("--requests", min=1, help="Measured requests per run (default: every prompt, at "
                                 "least 2 per client).")
    ] = None,
    stream: Annotated[
        bool | None, typer.Option("--stream/--no-stream", help="Default: stream when the model is decoupled.")
    ] = None,
    num_draft_tokens: NumDraftTokens = None,
    tokenizer: Annotated[
        Path | None,
        typer.Option("--tokenizer", metavar="DIR", help="Count output tokens with this tokenizer directory "
                     "(default: the deployment's own, from --repository or the server's preprocessing model; "
                     "without one, words are counted and labelled words)."),
    ] = None,
    repository: Annotated[
        Path | None,
        typer.Option("--repository", metavar="REPOSITORY", help="The model repository the server runs: its "
                     "preprocessing model's tokenizer_dir counts the output tokens."),
    ] = None,
    compare: Annotated[
        str | None, typer.Option("--compare", metavar="URL", help="A second endpoint under the same load, e.g. the "
                                 "target deployed without speculation; ratios are URL vs this one.")
    ] = None,
    compare_model_name: Annotated[
        str | None, typer.Option("--compare-model-name", metavar="NAME", help="Triton model to call at --compare "
                                 "(default: --model-name, else that server's entry model).")
    ] = None,
    png: Annotated[
        Path | None, typer.Option("--png", metavar="PATH", help="Also plot throughput, TTFT, ITL and acceptance "
                                  "(needs matplotlib).")
    ] = None,
    duration: Annotated[
        float | None, typer.Option("--duration", min=0.1, metavar="SECONDS", help="Stop each run after this long "
                                   "and report the requests that completed (with a large --requests: a timed run).")
    ] = None,
    json_output: JsonOutput = False,
) -> None:
    """Measure a running server from the client side: TTFT, inter-token latency, output tokens/s, acceptance.

    Output tokens are counted with the deployment's tokenizer (--tokenizer, else the one --repository or the
    server's preprocessing model names), the same way for both endpoints; against OpenAI endpoints without one, by
    the servers' usage; else whitespace-separated words are counted and every figure says words. Progress goes to
    stderr; Ctrl-C, SIGTERM or --duration end a run early with the figures of the requests that completed."""
    from specbuild.bench.run import PROTOCOLS, SIGNAL_EXIT, BenchOptions, run_bench

    with handled_errors():
        if protocol not in PROTOCOLS:
            raise SpecbuildError(f"--protocol must be one of {', '.join(PROTOCOLS)}, not {protocol!r}")
        options = BenchOptions(url=url, model_name=model_name, protocol=protocol,  # type: ignore[arg-type]
                               concurrency=tuple(concurrency or (1,)), prompts_file=prompts, max_tokens=max_tokens,
                               requests=requests, stream=stream, num_draft_tokens=num_draft_tokens,
                               tokenizer=tokenizer, repository=repository, compare=compare,
                               compare_model_name=compare_model_name, png=png, json_output=json_output,
                               duration_s=duration)
        report = run_bench(options, console=console, out=Console())
    if report.get("cut_short") in SIGNAL_EXIT:
        raise typer.Exit(SIGNAL_EXIT[report["cut_short"]])
