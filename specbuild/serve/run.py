"""What `specbuild serve` does once the arguments are parsed: start, report, serve or ask, stop.

SIGTERM and SIGINT are both turned into KeyboardInterrupt, so `kill`, a CI timeout or a terminal Ctrl-C all stop
tritonserver and its python stubs through `TritonServer.stop()`, while loading or serving; a requested stop exits
0. SIGINT is installed explicitly because Python leaves it ignored when it started ignored (a process launched in
the background by a non-interactive shell, as CI runners and `nohup` do), and `kill -INT` must still stop the
server then. Once stopping, a second signal SIGKILLs the server's family at once instead of interrupting the stop
(`specbuild.serve.lifetime`, shared with the Dynamo deployments).

While serving, `TritonServer.check()` runs twice a second: a dead server, a dead python stub or a model that is no
longer READY stops everything and raises SpecbuildError (the CLI prints it and exits 1), so nothing keeps answering
"ready" while its requests fail.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from specbuild.bench.client import DEPLOY_DRAFT_LENGTH, LLMClient, ModelInterface, entry_model
from specbuild.errors import SpecbuildError
from specbuild.serve.lifetime import serve_until_stopped, stopped_on_signal
from specbuild.serve.server import TritonServer


@dataclass(frozen=True)
class ServeOptions:
    repository: Path
    http_port: int | None = None
    grpc_port: int | None = None
    metrics_port: int | None = None
    log_file: Path | None = None
    ready_timeout_s: float = 600.0
    host: str = "127.0.0.1"
    prompts: tuple[str, ...] = ()
    max_tokens: int = 32
    num_draft_tokens: int | None = None
    model: str | None = None
    draft_len_schedule: dict[int, int] | None = None  # served instead of the repository's (SCHEDULE_ENV)


def serve(options: ServeOptions, console: Console, out: Console) -> None:
    """Serve until Ctrl-C (or, with prompts, answer them and stop). Raises SpecbuildError on failure."""
    refuse_unsent_draft_length(options)
    server = TritonServer(
        options.repository, http_port=options.http_port, grpc_port=options.grpc_port,
        metrics_port=options.metrics_port, log_file=options.log_file, ready_timeout_s=options.ready_timeout_s,
        host=options.host, env=_schedule_env(options.draft_len_schedule),
    )
    redeploy = redeploy_hint(options.repository)
    if redeploy:
        console.print(f"[yellow]warning:[/] {escape(redeploy)}", highlight=False)
    console.print(f"starting tritonserver on {escape(str(server.repository))} (log: {escape(str(server.log_file))})",
                  highlight=False)
    with stopped_on_signal("tritonserver", server.stop, console, kill=server.kill):
        with console.status("waiting until every model is ready…"):
            try:
                server.start()
            except SpecbuildError as err:
                if redeploy:  # the likeliest cause: code the installed specbuild no longer has
                    err.hint = f"{err.hint}; {redeploy}" if err.hint else redeploy
                raise
        names = sorted(m["name"] for m in server.models())
        out.print(f"ready: {', '.join(names)}", highlight=False)
        out.print(f"  HTTP    http://{server.http_url}\n  gRPC    {server.grpc_url}\n"
                  f"  metrics http://{server.metrics_url}/metrics", highlight=False)
        if options.prompts:
            ask(server, options, names, out)
            return

        def check() -> None:
            try:
                server.check()
            except SpecbuildError:
                console.print("[bold red]tritonserver is not healthy:[/] stopping it", highlight=False)
                raise

        serve_until_stopped(check, console)


def redeploy_hint(repository: Path) -> str | None:
    """What to say when `repository`'s python model code is not the installed specbuild's (None: it is, or the
    repository is not one specbuild deployed): the files that differ and the deploy that heals them."""
    from specbuild.deploy.model_code import deployed_code_differences
    from specbuild.manifest import read_manifest

    manifest = read_manifest(repository)
    differences = deployed_code_differences(manifest)
    if not differences:
        return None
    spec = (manifest or {}).get("spec") or "<your spec>"
    return (f"{repository} was deployed by another specbuild: its model code differs from this one's "
            f"({'; '.join(differences)}), and tritonserver may fail to load it; redeploy it with "
            f"`specbuild deploy {spec}` (engines are not rebuilt)")


def _schedule_env(steps: dict[int, int] | None) -> dict[str, str]:
    """The server environment that makes its python models run `steps` (specbuild.runtime.schedule.SCHEDULE_ENV)."""
    from specbuild.runtime.schedule import SCHEDULE_ENV

    return {SCHEDULE_ENV: json.dumps(steps)} if steps else {}


def ask(server: TritonServer, options: ServeOptions, names: list[str], out: Console) -> None:
    """Each prompt over gRPC streaming and over HTTP generate, with the answers and acceptance statistics."""
    model = options.model or entry_model(names)
    with LLMClient(server.grpc_url, model, "grpc") as grpc, LLMClient(server.http_url, model, "http") as http:
        out.print(f"asking {model} ({'decoupled, streaming' if grpc.model.decoupled else 'one response'})",
                  highlight=False)
        for prompt in options.prompts:
            out.rule(escape(prompt))
            streamed = grpc.generate(prompt, options.max_tokens, num_draft_tokens=options.num_draft_tokens)
            out.print(f"[bold]gRPC stream[/] ({len(streamed.response_times)} responses): "
                      f"{escape(streamed.text)}", highlight=False, soft_wrap=True)
            whole = http.generate(prompt, options.max_tokens, stream=False, num_draft_tokens=options.num_draft_tokens)
            out.print(f"[bold]HTTP generate[/]: {escape(whole.text)}", highlight=False, soft_wrap=True)
            out.print(f"  {streamed.acceptance_line()}; {streamed.latency_s * 1e3:.0f} ms "
                      f"(first text after {streamed.ttft_s * 1e3:.0f} ms)", highlight=False, soft_wrap=True)


def refuse_unsent_draft_length(options: ServeOptions) -> None:
    """--num-draft-tokens is sent with --prompt's requests as the asked model's `num_draft_tokens` input (the
    TensorRT-LLM backend's and its BLS's). Without --prompt, or to a model without that input (Triton's llmapi
    model: the LLM API drafts its speculative_config's length for every request; an ensemble), the requests
    would draft as deployed while the option said otherwise, so it is refused before anything starts."""
    if options.num_draft_tokens is None:
        return
    keep = "leave out --num-draft-tokens to draft as deployed"
    if not options.prompts:
        raise SpecbuildError("--num-draft-tokens is the draft length of --prompt's requests, and no --prompt is "
                             "given", hint=f"add --prompt TEXT, or {keep}; a client sets it per request")
    from specbuild.deploy.pbtxt import read_model

    names = sorted(p.parent.name for p in options.repository.glob("*/config.pbtxt"))
    if not names or (options.model and options.model not in names):
        return  # no repository, no model or an unknown --model-name: the server's start or the asking says so
    model = options.model or entry_model(names)
    interface = ModelInterface.from_config({"name": model, **read_model(options.repository / model)[1]})
    problem = interface.draft_length_problem(options.num_draft_tokens)
    if problem is not None:
        raise SpecbuildError(problem, hint=f"{keep}, or {DEPLOY_DRAFT_LENGTH}")

