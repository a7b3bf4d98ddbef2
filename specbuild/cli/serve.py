"""`specbuild serve`: tritonserver on a model repository, or NVIDIA Dynamo on a Dynamo deployment directory,
optionally asked a few prompts and stopped."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from specbuild.cli.errors import console, handled_errors
from specbuild.cli.options import MaxTokens, NumDraftTokens
from specbuild.errors import SpecbuildError


def serve(
    repository: Annotated[Path, typer.Argument(
        metavar="DIR", help="What `specbuild deploy` wrote: a Triton model repository, or a Dynamo deployment "
        "(<output_dir>/dynamo, deploy.target: dynamo).")],
    http_port: Annotated[int | None, typer.Option("--http-port", help="HTTP port (default: Triton a free port, "
                                                  "Dynamo the spec's deploy.http_port).")] = None,
    grpc_port: Annotated[int | None, typer.Option("--grpc-port", help="Triton's gRPC port (default: a free "
                                                  "port).")] = None,
    metrics_port: Annotated[
        int | None, typer.Option("--metrics-port", help="Triton's metrics port (default: a free port; "
                                 "Dynamo serves /metrics on the HTTP port).")
    ] = None,
    host: Annotated[str, typer.Option("--host", help="Address the HTTP (and Triton's gRPC and metrics) server "
                                      "listens on; 0.0.0.0 for every interface. Dynamo's internal planes stay on "
                                      "127.0.0.1.")] = "127.0.0.1",
    log_file: Annotated[
        Path | None,
        typer.Option("--log-file", metavar="PATH", help="Triton: the server log (default: tritonserver.log beside "
                     "DIR). Dynamo: the directory of the frontend's and workers' logs (default: dynamo-logs beside "
                     "DIR)."),
    ] = None,
    ready_timeout: Annotated[float, typer.Option("--ready-timeout", help="Seconds to wait for every model "
                                                 "(Dynamo: every worker).")] = 600.0,
    prompt: Annotated[
        list[str] | None,
        typer.Option("--prompt", metavar="TEXT", help="Once ready, ask this (Triton: over gRPC streaming and HTTP "
                     "generate; Dynamo: /v1/completions streamed), print the answers and acceptance statistics, "
                     "then stop. Repeatable."),
    ] = None,
    max_tokens: MaxTokens = 32,
    num_draft_tokens: NumDraftTokens = None,
    model_name: Annotated[str | None, typer.Option(
        "--model-name", metavar="NAME", help="Triton: the model --prompt asks (default: the repository's entry "
        "model: tensorrt_llm_bls when a draft is deployed, else ensemble). Dynamo: the name the deployment serves "
        "under (default: the spec's name).")] = None,
    draft_len_schedule: Annotated[
        str | None,
        typer.Option("--draft-len-schedule", metavar="JSON", help="Serve this load-aware schedule (batch size -> "
                     "draft length, e.g. '{\"1\": 4, \"8\": 1}') instead of the repository's, without redeploying; "
                     "the full length at batch size 1, as every TensorRT-LLM line requires. Written as in the "
                     "spec (each length from its batch size on) whatever line the repository was deployed for. "
                     "Reference backend."),
    ] = None,
) -> None:
    """Serve DIR until Ctrl-C: tritonserver on a Triton model repository, or NVIDIA Dynamo (its OpenAI frontend and
    router, and the reference workers) on a Dynamo deployment.

    Triton: `tritonserver` from PATH (NGC containers) or the one bundled in nvidia-pytriton; sharded TensorRT-LLM
    engines (tp×pp > 1) get one MPI rank per GPU. Dynamo: /v1/chat/completions, /v1/completions and /v1/models on
    the HTTP port, one serve per deployment at a time; --grpc-port, --metrics-port, --num-draft-tokens and
    --draft-len-schedule act on tritonserver and are refused there. Exits non-zero with the failing model's or
    process's error."""
    from specbuild.dynamo.launch import is_dynamo_deployment

    if is_dynamo_deployment(repository):  # `deploy.target: dynamo` wrote a Dynamo launch (specbuild.dynamo)
        from specbuild.dynamo.launch import refuse_triton_only
        from specbuild.dynamo.launch import serve as serve_dynamo

        with handled_errors():
            refuse_triton_only({"--grpc-port": grpc_port, "--metrics-port": metrics_port,
                                "--num-draft-tokens": num_draft_tokens, "--draft-len-schedule": draft_len_schedule})
            serve_dynamo(repository, http_port=http_port, host=host, model_name=model_name, log_dir=log_file,
                         ready_timeout_s=ready_timeout, prompts=tuple(prompt or ()), max_tokens=max_tokens,
                         console=console, out=Console())
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
