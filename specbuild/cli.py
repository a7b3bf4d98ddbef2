"""The `specbuild` command line.

Commands are thin: they parse arguments, call one stage function, and print what it did. Heavy imports
(torch, transformers, ModelOpt) happen inside the commands so that `specbuild --help` and `specbuild init`
answer at once.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from specbuild.errors import SpecbuildError

app = typer.Typer(
    name="specbuild",
    help=(
        "Hugging Face checkpoints to a speculative-decoding service on Triton Inference Server.\n\n"
        "Typical flow: `specbuild init pipeline.yaml` writes a commented spec; edit it; `specbuild validate` it; "
        "then `convert` (TensorRT-LLM checkpoints: target, ModelOpt-quantized draft, Medusa heads), `build` "
        "(engines, or reference bundles without a GPU), optionally `tune` (K or the Medusa tree), `deploy` "
        "(the Triton model repository), `serve` (tritonserver) and `bench` (client-side figures). Each stage "
        "checks everything first, writes atomically, and skips itself when its inputs are unchanged."
    ),
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
console = Console(stderr=True)


def _fail(err: SpecbuildError) -> typer.Exit:
    console.print(f"[bold red]error:[/] {escape(err.message)}", highlight=False, soft_wrap=True)
    if err.hint:
        console.print(f"[yellow]hint:[/] {escape(err.hint)}", highlight=False, soft_wrap=True)
    return typer.Exit(code=1)


@contextmanager
def _errors() -> Iterator[None]:
    """The one error formatter of the writing commands: a SpecbuildError is one message and exit code 1; so is a
    full filesystem wherever it surfaces (the stages' own writes already turn it into a SpecbuildError naming the
    output directory; this catches the rest, e.g. a build script or a spec rewritten in place)."""
    from specbuild.atomic import is_no_space, no_space_error

    try:
        yield
    except SpecbuildError as err:
        raise _fail(err) from None
    except Exception as err:
        if not is_no_space(err):
            raise
        filename = getattr(err, "filename", None)
        directory = Path(filename).parent if filename else Path.cwd()
        raise _fail(no_space_error(directory)) from None


@app.command()
def init(
    path: Annotated[Path, typer.Argument(help="Where to write the starter spec, e.g. pipeline.yaml.")] = Path(
        "pipeline.yaml"
    ),
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing file.")] = False,
) -> None:
    """Write a commented starter pipeline spec that you then edit."""
    from specbuild.spec import write_starter_spec

    try:
        write_starter_spec(path, force=force)
    except SpecbuildError as err:
        raise _fail(err) from None
    console.print(f"wrote {path}; edit it, then run `specbuild validate {path}`")


@app.command()
def validate(
    spec_path: Annotated[Path, typer.Argument(help="The pipeline spec (YAML) to check.", metavar="SPEC")],
) -> None:
    """Check a pipeline spec and everything it names, without loading weights or writing anything: the schema;
    every model's directory, config.json, weight headers and shapes, tp/pp, the draft/target pair, the target's
    tokenizer files, the Medusa heads and tree, the draft's quantization (format vs build.gpu, int4 alignment,
    calibration text); then every build check on the checkpoints convert would write. All problems are reported
    together, each at its spec file:line; then what the spec resolves to is printed."""
    from specbuild.build.validate import planned_problems
    from specbuild.convert.preflight import check_models
    from specbuild.spec import load_spec, summarize_spec

    with _errors():
        spec = load_spec(spec_path)
        findings, configs = check_models(spec)
        for problem in planned_problems(spec, configs):
            findings.append((problem.severity, problem.field or ("build",), problem.message))
        unique = list(dict.fromkeys(findings))  # a Medusa checkpoint's base is the target: said once
        warnings = [(loc, message) for severity, loc, message in unique if severity == "warning"]
        errors = [(loc, message) for severity, loc, message in unique if severity == "error"]
        if warnings:
            located = spec.problems_error(warnings)
            for problem in located.problems:
                console.print(f"[yellow]warning:[/] {escape(problem.render(located.file))}", highlight=False,
                              soft_wrap=True)
        if errors:
            raise spec.problems_error(errors, hint="fix these, then validate again; `convert` and `build` would "
                                      "stop on each of them")
    Console().print(summarize_spec(spec))


@app.command("demo-models")
def demo_models(
    out_dir: Annotated[Path, typer.Argument(help="Directory for the demo models (created).", metavar="DIR")],
    force: Annotated[bool, typer.Option("--force", help="Rebuild even if a complete copy is cached.")] = False,
) -> None:
    """Create small demo models offline: a tokenizer, a trained Llama target and draft, and untrained Qwen2,
    Mistral and GPT-2 checkpoints. A complete earlier build in DIR is reused."""
    from specbuild.demo.models import build_demo_models

    try:
        built = build_demo_models(out_dir, force=force)
    except SpecbuildError as err:
        raise _fail(err) from None
    for name, path in built.items():
        console.print(f"{name:13s} {path}", highlight=False, soft_wrap=True)


@app.command()
def convert(
    spec_path: Annotated[
        Path | None,
        typer.Argument(help="Pipeline spec: converts its target and draft.", metavar="[SPEC]"),
    ] = None,
    model: Annotated[
        Path | None, typer.Option("--model", help="Convert one HF checkpoint directory, without a spec.")
    ] = None,
    output: Annotated[Path | None, typer.Option("--output", help="Output directory (with --model).")] = None,
    dtype: Annotated[
        str,
        typer.Option(
            "--dtype",
            help="auto|float16|bfloat16|float32. auto keeps the checkpoint's dtype, float32 becoming float16 "
            "(as TensorRT-LLM's converters do). With a spec, build.dtype is used instead.",
        ),
    ] = "auto",
    tp_size: Annotated[int, typer.Option("--tp-size", min=1, help="Tensor-parallel ranks (with --model).")] = 1,
    pp_size: Annotated[int, typer.Option("--pp-size", min=1, help="Pipeline-parallel ranks (with --model).")] = 1,
    allow_pickle: Annotated[
        bool,
        typer.Option(
            "--allow-pickle",
            help="Accept pytorch_model*.bin (pickle) weights, loaded with weights_only=True. Off by default: "
            "pickle files can run code.",
        ),
    ] = False,
    medusa_heads: Annotated[
        Path | None,
        typer.Option(
            "--medusa-heads",
            help="With --model: a FasterDecoding Medusa head directory (medusa_lm_head.safetensors); writes one "
            "MedusaForCausalLM checkpoint of the base model plus its heads.",
        ),
    ] = None,
    max_draft_len: Annotated[
        int, typer.Option("--max-draft-len", min=1, help="Medusa: the tree's node count (config max_draft_len).")
    ] = 63,
    force: Annotated[bool, typer.Option("--force", help="Convert even if the manifest says up to date.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Check and print the plan; write nothing.")] = False,
) -> None:
    """Convert Hugging Face checkpoints to TensorRT-LLM checkpoints (config.json + rank{N}.safetensors).

    Either `specbuild convert SPEC` (target and draft of a pipeline spec) or
    `specbuild convert --model HF_DIR --output OUT_DIR [--dtype ...] [--tp-size N] [--pp-size N]`.
    """
    from specbuild.convert.pipeline import ConvertRequest, ConvertResult, convert_requests, spec_requests

    def report(result: ConvertResult) -> None:
        console.print(result.summary(), highlight=False, soft_wrap=True)

    with _errors():
        if (spec_path is None) == (model is None):
            raise SpecbuildError(
                "give either a pipeline spec or --model (not both, not neither)",
                hint="`specbuild convert pipeline.yaml` or `specbuild convert --model HF_DIR --output OUT_DIR`",
            )
        if model is not None:
            if output is None:
                raise SpecbuildError("--model needs --output: the directory to write the checkpoint to")
            request = ConvertRequest(
                name=model.name, source=model, output=output, dtype=dtype, tp_size=tp_size, pp_size=pp_size,
                allow_pickle=allow_pickle, medusa_heads=medusa_heads, max_draft_len=max_draft_len,
            )
            convert_requests([request], force=force, dry_run=dry_run, console=console, on_result=report)
            return
        from specbuild.spec import load_spec

        assert spec_path is not None
        # Every model of the spec (and the draft/target pair) is checked before any is written.
        requests, pair = spec_requests(load_spec(spec_path), allow_pickle=allow_pickle)
        convert_requests(requests, where=str(spec_path), pair_problems=pair, force=force, dry_run=dry_run,
                         console=console, on_result=report)


@app.command()
def build(
    spec_path: Annotated[Path, typer.Argument(help="The pipeline spec (YAML).", metavar="SPEC")],
    backend: Annotated[
        str | None,
        typer.Option(
            "--backend",
            help="auto|tensorrt|reference (default: the spec's build.backend). auto = tensorrt where tensorrt_llm "
            "imports and a GPU is visible, else reference.",
        ),
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="Check everything, print the trtllm-build plans and write a build.sh per "
                     "engine (runs unchanged in the TensorRT-LLM 1.2 container); build nothing."),
    ] = False,
    jobs: Annotated[int, typer.Option("--jobs", min=1, help="Engines built at once (tensorrt; GPUs permitting).")] = 1,
    force: Annotated[bool, typer.Option("--force", help="Rebuild even if the manifest says up to date.")] = False,
) -> None:
    """Build the engines a spec needs from its converted checkpoints: TensorRT-LLM engines (trtllm-build) on a
    GPU machine with TensorRT-LLM 1.2, reference bundles for specbuild's PyTorch runtime elsewhere.

    Every check (checkpoint vs spec, Medusa tree, limits, GPU generation vs quantization, memory) runs first,
    and all problems are reported together before any build starts.
    """
    from specbuild.build import build_pipeline
    from specbuild.spec import load_spec

    if backend is not None and backend not in ("auto", "tensorrt", "reference"):
        raise _fail(SpecbuildError(f"--backend {backend}: expected auto, tensorrt or reference"))
    with _errors():
        results = build_pipeline(
            load_spec(spec_path), backend=backend, dry_run=dry_run, jobs=jobs, force=force, console=console
        )
    for result in results:
        console.print(result.summary(), highlight=False, soft_wrap=True)


@app.command()
def tune(
    spec_path: Annotated[Path, typer.Argument(help="The pipeline spec (YAML); convert must have run.", metavar="SPEC")],
    calib: Annotated[
        Path | None,
        typer.Option("--calib", help="UTF-8 calibration text file (default: held-out pydoc topics shipped with "
                     "Python)."),
    ] = None,
    output: Annotated[
        Path | None, typer.Option("--output", help="Write a new spec here instead of editing SPEC.")
    ] = None,
    prompts: Annotated[int, typer.Option("--prompts", min=1, help="Calibration prompts.")] = 8,
    prompt_tokens: Annotated[int, typer.Option("--prompt-tokens", min=1, help="Tokens per prompt.")] = 32,
    new_tokens: Annotated[int, typer.Option("--new-tokens", min=1, help="Tokens generated per prompt.")] = 64,
    max_k: Annotated[int, typer.Option("--max-k", min=1, help="draft_target: largest K tried.")] = 8,
    repeats: Annotated[
        int, typer.Option("--repeats", min=1, help="draft_target: timed passes of the K sweep (fastest kept).")
    ] = 2,
    nodes: Annotated[
        int | None, typer.Option("--nodes", min=1, help="medusa: tree node budget (default: the spec's tree size).")
    ] = None,
    top_k: Annotated[int, typer.Option("--top-k", min=1, max=16, help="medusa: ranks measured per head.")] = 10,
    inline: Annotated[
        bool, typer.Option("--inline", help="medusa: write the tree into the spec, not medusa_choices/NAME-tuned.json.")
    ] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Measure and print; write nothing.")] = False,
    threads: Annotated[int, typer.Option("--threads", min=1, help="torch CPU threads while measuring.")] = 1,
    schedule: Annotated[
        bool, typer.Option("--schedule/--no-schedule", help="Also measure and write speculative.draft_len_schedule: "
                           "which length pays at which number of active sequences.")
    ] = True,
) -> None:
    """Measure speculation on calibration text with the reference runtime and write the best settings into the
    spec: K for draft_target (Leviathan et al.'s expected speedup from the measured acceptance rate and cost
    ratio, next to a sweep of every K), or a Medusa tree grown greedily from each head's measured top-k accuracy
    (next to mc_sim_7b_63), and the load-aware schedule (plain vs speculative at each batch size up to
    build.max_batch_size). Only the tuned values' text changes; comments and layout stay."""
    from specbuild.tune.stage import TuneOptions, run_tune

    try:
        options = TuneOptions(calib=calib, output=output, prompts=prompts, prompt_tokens=prompt_tokens,
                              new_tokens=new_tokens, max_k=max_k, repeats=repeats, nodes=nodes, top_k=top_k,
                              inline=inline, write=not dry_run, threads=threads, schedule=schedule)
        run_tune(spec_path, options, console=console, out=Console())
    except SpecbuildError as err:
        raise _fail(err) from None


@app.command()
def deploy(
    spec_path: Annotated[
        Path | None, typer.Argument(help="Pipeline spec whose built engines to deploy.", metavar="[SPEC]")
    ] = None,
    check: Annotated[
        Path | None, typer.Option("--check", help="Re-validate an existing model repository instead.", metavar="REPO")
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Rewrite even if the manifest says up to date.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the models and files; write nothing.")] = False,
) -> None:
    """Write the Triton model repository (preprocessing, tensorrt_llm[_draft], tensorrt_llm_bls, postprocessing,
    ensemble) for a built pipeline, or check one with `--check REPO`."""
    from specbuild.deploy.check import check_repository

    out = Console(width=max(Console().width, 132))  # the wiring table is unreadable folded into 80 columns
    with _errors():
        if (spec_path is None) == (check is None):
            raise SpecbuildError("give either a pipeline spec or --check REPO (not both, not neither)",
                                 hint="`specbuild deploy pipeline.yaml` or `specbuild deploy --check REPO`")
        if check is not None:
            report = check_repository(check)
            if report.models:
                out.print(report.table())
            report.raise_for_problems()
            console.print(f"ok: {check} ({len(report.models)} models)", highlight=False, soft_wrap=True)
            return
        from specbuild.deploy.repository import deploy_repository
        from specbuild.spec import load_spec

        assert spec_path is not None
        result = deploy_repository(load_spec(spec_path), dry_run=dry_run, force=force, console=console)
        if not dry_run:
            out.print(check_repository(result.repository).table())
        console.print(result.summary(), highlight=False, soft_wrap=True)


@app.command()
def serve(
    repository: Annotated[Path, typer.Argument(help="Triton model repository (what `specbuild deploy` wrote).")],
    http_port: Annotated[int | None, typer.Option("--http-port", help="Default: a free port.")] = None,
    grpc_port: Annotated[int | None, typer.Option("--grpc-port", help="Default: a free port.")] = None,
    metrics_port: Annotated[int | None, typer.Option("--metrics-port", help="Default: a free port.")] = None,
    host: Annotated[str, typer.Option("--host", help="Address to listen on (0.0.0.0 for every interface).")] = (
        "127.0.0.1"),
    log_file: Annotated[
        Path | None, typer.Option("--log-file", help="Server log (default: tritonserver.log beside REPOSITORY).")
    ] = None,
    ready_timeout: Annotated[float, typer.Option("--ready-timeout", help="Seconds to wait for every model.")] = 600.0,
    prompt: Annotated[
        list[str] | None,
        typer.Option("--prompt", help="Once ready, ask this over gRPC streaming and HTTP generate, print the "
                     "answers and acceptance statistics, then stop. Repeatable."),
    ] = None,
    max_tokens: Annotated[int, typer.Option("--max-tokens", min=1, help="New tokens per --prompt.")] = 32,
    num_draft_tokens: Annotated[
        int | None,
        typer.Option("--num-draft-tokens", min=0, help="Draft tokens per round (0: none; default: the deployment's)."),
    ] = None,
    model: Annotated[
        str | None, typer.Option("--model", help="Model for --prompt (default: tensorrt_llm_bls with a draft, else "
                                 "ensemble).")
    ] = None,
) -> None:
    """Start tritonserver on REPOSITORY, wait until every model is ready, and serve until Ctrl-C.

    Uses `tritonserver` from PATH (NGC containers) or the one bundled in nvidia-pytriton; sharded TensorRT-LLM
    engines (tp×pp > 1) get one MPI rank per GPU. Exits non-zero with the failing model's error."""
    from specbuild.serve.run import ServeOptions
    from specbuild.serve.run import serve as run_serve

    options = ServeOptions(repository=repository, http_port=http_port, grpc_port=grpc_port,
                           metrics_port=metrics_port, log_file=log_file, ready_timeout_s=ready_timeout, host=host,
                           prompts=tuple(prompt or ()), max_tokens=max_tokens, num_draft_tokens=num_draft_tokens,
                           model=model)
    try:
        run_serve(options, console=console, out=Console())
    except SpecbuildError as err:
        raise _fail(err) from None


@app.command()
def bench(
    url: Annotated[str, typer.Argument(help="Server address: host:port of its gRPC (default) or HTTP endpoint.")],
    model: Annotated[str | None, typer.Option("--model", help="Default: the repository's entry model.")] = None,
    protocol: Annotated[str, typer.Option("--protocol", help="grpc (streaming) or http (generate).")] = "grpc",
    concurrency: Annotated[
        list[int] | None, typer.Option("--concurrency", min=1, help="Clients in flight; repeat for several runs.")
    ] = None,
    prompts: Annotated[Path | None, typer.Option("--prompts", help="Prompt file, one per line.")] = None,
    max_tokens: Annotated[int, typer.Option("--max-tokens", min=1, help="New tokens per request.")] = 64,
    requests: Annotated[
        int | None, typer.Option("--requests", min=1, help="Measured requests per run (default: every prompt, at "
                                 "least 2 per client).")
    ] = None,
    stream: Annotated[
        bool | None, typer.Option("--stream/--no-stream", help="Default: stream when the model is decoupled.")
    ] = None,
    num_draft_tokens: Annotated[
        int | None, typer.Option("--num-draft-tokens", min=0, help="0: the same deployment without speculating.")
    ] = None,
    tokenizer: Annotated[
        Path | None, typer.Option("--tokenizer", help="Count output tokens with this tokenizer (e.g. "
                                  "REPO/preprocessing/tokenizer); default: the model's counts, else words.")
    ] = None,
    compare: Annotated[
        str | None, typer.Option("--compare", help="A second endpoint under the same load, e.g. the target "
                                 "deployed without speculation; ratios are URL vs this one.")
    ] = None,
    compare_model: Annotated[str | None, typer.Option("--compare-model")] = None,
    png: Annotated[Path | None, typer.Option("--png", help="Also plot tokens/s, TTFT and ITL (needs matplotlib).")] = (
        None),
    json_output: Annotated[bool, typer.Option("--json", help="Print the figures as one JSON object.")] = False,
) -> None:
    """Measure a running server from the client side: TTFT, inter-token latency, output tokens/s, acceptance."""
    from specbuild.bench.run import BenchOptions, run_bench

    if protocol not in ("grpc", "http"):
        raise _fail(SpecbuildError(f"--protocol must be grpc or http, not {protocol!r}"))
    options = BenchOptions(url=url, model=model, protocol="grpc" if protocol == "grpc" else "http",
                           concurrency=tuple(concurrency or (1,)),
                           prompts_file=prompts, max_tokens=max_tokens, requests=requests, stream=stream,
                           num_draft_tokens=num_draft_tokens, tokenizer=tokenizer, compare=compare,
                           compare_model=compare_model, png=png, json_output=json_output)
    try:
        run_bench(options, console=console, out=Console())
    except SpecbuildError as err:
        raise _fail(err) from None


medusa_app = typer.Typer(help="Medusa heads: train them on a frozen base model.", no_args_is_help=True)
app.add_typer(medusa_app, name="medusa")


@medusa_app.command("train")
def medusa_train(
    base: Annotated[Path, typer.Option("--base", help="Hugging Face base model directory (kept frozen).")],
    output: Annotated[Path, typer.Option("--output", help="Where to write the heads (FasterDecoding format).")],
    num_heads: Annotated[int, typer.Option("--num-heads", min=1, help="Heads; head k predicts token t+k+2.")] = 4,
    num_layers: Annotated[int, typer.Option("--num-layers", min=1, help="ResBlocks per head.")] = 1,
    steps: Annotated[int, typer.Option("--steps", min=1, help="Optimizer steps.")] = 300,
    seq_len: Annotated[int, typer.Option("--seq-len", min=8, help="Training sequence length.")] = 128,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1)] = 8,
    lr: Annotated[float, typer.Option("--lr", help="AdamW learning rate.")] = 1e-3,
    text: Annotated[
        list[Path] | None,
        typer.Option("--text", help="Training text files (repeatable); default: the built-in pydoc corpus."),
    ] = None,
    seed: Annotated[int, typer.Option("--seed")] = 0,
) -> None:
    """Train Medusa-1 heads on a frozen base (loss weights 0.8^k) and save medusa_lm_head.safetensors +
    config.json, ready for `specbuild convert --model BASE --medusa-heads OUTPUT`."""
    from specbuild.medusa.train import train_medusa_heads

    try:
        texts = [p.read_text(encoding="utf-8") for p in text] if text else None
        metrics = train_medusa_heads(base, output, num_heads=num_heads, num_layers=num_layers, steps=steps,
                                     seq_len=seq_len, batch_size=batch_size, lr=lr, seed=seed, texts=texts)
    except OSError as err:
        raise _fail(SpecbuildError(f"cannot read training text: {err}")) from None
    except SpecbuildError as err:
        raise _fail(err) from None
    for name, value in metrics.items():
        console.print(f"{name:16s} {value:.4f}", highlight=False)
    console.print(f"wrote {output}", highlight=False)


@app.command()
def generate(
    checkpoint: Annotated[Path, typer.Argument(help="TensorRT-LLM checkpoint directory (the target).")],
    tokenizer: Annotated[Path, typer.Option("--tokenizer", help="Hugging Face tokenizer directory.")],
    prompt: Annotated[list[str], typer.Option("--prompt", help="Prompt text; repeat for a batch.")],
    draft: Annotated[
        Path | None, typer.Option("--draft", help="Draft checkpoint: draft-target speculative decoding.")
    ] = None,
    num_draft_tokens: Annotated[int, typer.Option("--num-draft-tokens", min=1, help="K: tokens per draft round.")] = 4,
    adaptive: Annotated[
        bool, typer.Option("--adaptive-k", help="Choose K per request from its running acceptance rate.")
    ] = False,
    medusa: Annotated[bool, typer.Option("--medusa", help="Medusa decoding with the checkpoint's heads.")] = False,
    medusa_choices: Annotated[
        str, typer.Option("--medusa-choices", help="Tree: preset name (e.g. mc_sim_7b_63) or a JSON file.")
    ] = "mc_sim_7b_63",
    typical: Annotated[
        bool, typer.Option("--typical", help="Medusa typical acceptance (needs --temperature > 0).")
    ] = False,
    max_tokens: Annotated[int, typer.Option("--max-tokens", min=1, help="New tokens per prompt at most.")] = 64,
    temperature: Annotated[float, typer.Option("--temperature", min=0.0, help="0 = greedy.")] = 0.0,
    top_k: Annotated[int, typer.Option("--top-k", min=0, help="0 = no top-k cut.")] = 0,
    top_p: Annotated[float, typer.Option("--top-p", help="1.0 = no nucleus cut.")] = 1.0,
    seed: Annotated[int | None, typer.Option("--seed", help="Random seed for sampling.")] = None,
    stop: Annotated[list[str] | None, typer.Option("--stop", help="Stop word; repeatable.")] = None,
    device: Annotated[str, typer.Option("--device", help="cpu or cuda.")] = "cpu",
    threads: Annotated[
        int | None,
        typer.Option("--threads", min=1, help="CPU threads for torch (small models decode fastest on 1)."),
    ] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of text.")] = False,
) -> None:
    """Generate text from a TensorRT-LLM checkpoint with the reference runtime, optionally speculating.

    Prints the text and the statistics: tokens per target forward, acceptance rate per draft position and
    tokens/s. Greedy speculative output is identical to plain greedy output; only the speed differs.
    """
    import json

    from specbuild.runtime.cli_generate import GenerateOptions, run_generate

    options = GenerateOptions(
        checkpoint=checkpoint, tokenizer=tokenizer, prompts=prompt, draft=draft, num_draft_tokens=num_draft_tokens,
        adaptive=adaptive, medusa=medusa, medusa_choices=medusa_choices, typical=typical, max_tokens=max_tokens,
        temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, stop=stop or [], device=device,
        threads=threads,
    )
    with _errors():
        report = run_generate(options)
    if json_output:
        print(json.dumps(report if len(prompt) > 1 else {**report, **report["results"][0]}, indent=None))
        return
    out = Console()
    for result in report["results"]:
        out.print(result["text"], highlight=False, markup=False)
    console.print(
        f"target forwards {report['target_forwards']}, tokens/forward {report['tokens_per_target_forward']:.2f}, "
        f"acceptance by position {[round(a, 2) for a in report['acceptance_by_position']]}, "
        f"{report['tokens_per_second']:.1f} tokens/s",
        highlight=False, soft_wrap=True,
    )


def main() -> None:  # pragma: no cover - console-script entry point
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
