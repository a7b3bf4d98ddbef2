"""`specbuild serve`: tritonserver on a model repository, optionally asked a few prompts and stopped."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from specbuild.cli.errors import console, handled_errors
from specbuild.cli.options import MaxTokens, ModelName, NumDraftTokens, Repository
from specbuild.errors import SpecbuildError


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
    draft_len_schedule: Annotated[
        str | None,
        typer.Option("--draft-len-schedule", metavar="JSON", help="Serve this load-aware schedule (batch size -> "
                     "draft length, e.g. '{\"1\": 4, \"8\": 1}') instead of the repository's, without redeploying; "
                     "the full length at batch size 1, as every TensorRT-LLM line requires. Written as in the "
                     "spec (each length from its batch size on) whatever line the repository was deployed for. "
                     "Reference backend."),
    ] = None,
) -> None:
    """Start tritonserver on REPOSITORY, wait until every model is ready, and serve until Ctrl-C.

    Uses `tritonserver` from PATH (NGC containers) or the one bundled in nvidia-pytriton; sharded TensorRT-LLM
    engines (tp×pp > 1) get one MPI rank per GPU. Exits non-zero with the failing model's error."""
    from specbuild.dynamo.launch import is_dynamo_deployment

    if is_dynamo_deployment(repository):  # `deploy.target: dynamo` wrote a Dynamo launch (specbuild.dynamo)
        from specbuild.dynamo.launch import serve as serve_dynamo

        with handled_errors():
            if draft_len_schedule is not None:
                raise SpecbuildError("--draft-len-schedule overrides a Triton repository's schedule; a Dynamo "
                                     "deployment's workers read deploy's", hint="redeploy with the schedule in SPEC")
            serve_dynamo(repository, http_port=http_port, log_dir=log_file, ready_timeout_s=ready_timeout,
                         prompts=tuple(prompt or ()), max_tokens=max_tokens, console=console, out=Console())
        return
    from specbuild.serve.run import ServeOptions
    from specbuild.serve.run import serve as run_serve

    with handled_errors():
        options = ServeOptions(repository=repository, http_port=http_port, grpc_port=grpc_port,
                               metrics_port=metrics_port, log_file=log_file, ready_timeout_s=ready_timeout, host=host,
                               prompts=tuple(prompt or ()), max_tokens=max_tokens, num_draft_tokens=num_draft_tokens,
                               model=model_name, draft_len_schedule=_schedule(draft_len_schedule))
        run_serve(options, console=console, out=Console())


def _schedule(text: str | None) -> dict[int, int] | None:
    """--draft-len-schedule parsed and checked as the served models will read it."""
    if text is None:
        return None
    from specbuild.runtime.schedule import parse_steps, schedule_problems

    try:
        steps = parse_steps(text)
    except ValueError:
        raise SpecbuildError(f"--draft-len-schedule {text!r} is not a JSON object of batch sizes to draft lengths",
                             hint="e.g. '{\"1\": 4, \"8\": 1}'") from None
    full = steps.get(1, steps[min(steps)] if steps else 0)
    problems = schedule_problems(steps, full)
    if not steps or problems:
        raise SpecbuildError(f"--draft-len-schedule {text!r}: {'; '.join(problems) or 'empty'}",
                             hint="map batch size 1 to the deployment's full draft length (K, or the tree's nodes)")
    return steps
