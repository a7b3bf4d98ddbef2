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
        str, typer.Argument(help="Server address: host:port of its gRPC (default) or HTTP endpoint.", metavar="URL")
    ],
    model_name: ModelName = None,
    protocol: Annotated[str, typer.Option("--protocol", help="grpc (streaming) or http (generate).")] = "grpc",
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
    json_output: JsonOutput = False,
) -> None:
    """Measure a running server from the client side: TTFT, inter-token latency, output tokens/s, acceptance.

    Output tokens are counted with the deployment's tokenizer (--tokenizer, else the one --repository or the
    server's preprocessing model names), the same way for both endpoints; without one, whitespace-separated words
    are counted and every figure says words."""
    from specbuild.bench.run import BenchOptions, run_bench

    with handled_errors():
        if protocol not in ("grpc", "http"):
            raise SpecbuildError(f"--protocol must be grpc or http, not {protocol!r}")
        options = BenchOptions(url=url, model_name=model_name, protocol="grpc" if protocol == "grpc" else "http",
                               concurrency=tuple(concurrency or (1,)), prompts_file=prompts, max_tokens=max_tokens,
                               requests=requests, stream=stream, num_draft_tokens=num_draft_tokens,
                               tokenizer=tokenizer, repository=repository, compare=compare,
                               compare_model_name=compare_model_name, png=png, json_output=json_output)
        run_bench(options, console=console, out=Console())
