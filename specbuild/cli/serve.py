"""`specbuild serve`: tritonserver on a model repository, optionally asked a few prompts and stopped."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from specbuild.cli.errors import console, handled_errors
from specbuild.cli.options import MaxTokens, ModelName, NumDraftTokens, Repository


def serve(
    repository: Repository,
    http_port: Annotated[int | None, typer.Option("--http-port", help="HTTP port (default: a free port).")] = None,
    grpc_port: Annotated[int | None, typer.Option("--grpc-port", help="gRPC port (default: a free port).")] = None,
    metrics_port: Annotated[
        int | None, typer.Option("--metrics-port", help="Metrics port (default: a free port).")
    ] = None,
    host: Annotated[str, typer.Option("--host", help="Address to listen on (0.0.0.0 for every interface).")] = (
        "127.0.0.1"),
    log_file: Annotated[
        Path | None,
        typer.Option("--log-file", metavar="PATH", help="Server log (default: tritonserver.log beside REPOSITORY)."),
    ] = None,
    ready_timeout: Annotated[float, typer.Option("--ready-timeout", help="Seconds to wait for every model.")] = 600.0,
    prompt: Annotated[
        list[str] | None,
        typer.Option("--prompt", metavar="TEXT", help="Once ready, ask this over gRPC streaming and HTTP generate, "
                     "print the answers and acceptance statistics, then stop. Repeatable."),
    ] = None,
    max_tokens: MaxTokens = 32,
    num_draft_tokens: NumDraftTokens = None,
    model_name: ModelName = None,
) -> None:
    """Start tritonserver on REPOSITORY, wait until every model is ready, and serve until Ctrl-C.

    Uses `tritonserver` from PATH (NGC containers) or the one bundled in nvidia-pytriton; sharded TensorRT-LLM
    engines (tp×pp > 1) get one MPI rank per GPU. Exits non-zero with the failing model's error."""
    from specbuild.dynamo.launch import is_dynamo_deployment

    if is_dynamo_deployment(repository):  # `deploy.target: dynamo` wrote a Dynamo launch (specbuild.dynamo)
        from specbuild.dynamo.launch import serve as serve_dynamo

        with handled_errors():
            serve_dynamo(repository, http_port=http_port, log_dir=log_file, ready_timeout_s=ready_timeout,
                         prompts=tuple(prompt or ()), max_tokens=max_tokens, console=console, out=Console())
        return
    from specbuild.serve.run import ServeOptions
    from specbuild.serve.run import serve as run_serve

    options = ServeOptions(repository=repository, http_port=http_port, grpc_port=grpc_port,
                           metrics_port=metrics_port, log_file=log_file, ready_timeout_s=ready_timeout, host=host,
                           prompts=tuple(prompt or ()), max_tokens=max_tokens, num_draft_tokens=num_draft_tokens,
                           model=model_name)
    with handled_errors():
        run_serve(options, console=console, out=Console())
