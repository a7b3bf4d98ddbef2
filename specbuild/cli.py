"""The `specbuild` command line.

Commands are thin: they parse arguments, call one stage function, and print what it did. Heavy imports
(torch, transformers, ModelOpt) happen inside the commands so that `specbuild --help` and `specbuild init`
answer at once.
"""

from __future__ import annotations

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
        "Typical flow: `specbuild init pipeline.yaml` writes a commented spec; edit it; then "
        "`specbuild convert pipeline.yaml` writes TensorRT-LLM checkpoints for the target and the draft."
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
    """Check a pipeline spec and print what it resolves to, without touching any model."""
    from specbuild.spec import load_spec, summarize_spec

    try:
        spec = load_spec(spec_path)
    except SpecbuildError as err:
        raise _fail(err) from None
    Console().print(summarize_spec(spec))


@app.command("demo-models")
def demo_models(
    out_dir: Annotated[Path, typer.Argument(help="Directory for the demo models (created).", metavar="DIR")],
    force: Annotated[bool, typer.Option("--force", help="Rebuild even if a complete copy is cached.")] = False,
) -> None:
    """Create small demo models offline: a tokenizer, a trained Llama target and draft, and untrained Qwen2,
    Mistral and GPT-2 checkpoints. A complete earlier build in DIR is reused."""
    from specbuild.demo_models import build_demo_models

    try:
        built = build_demo_models(out_dir, force=force)
    except SpecbuildError as err:
        raise _fail(err) from None
    for name, path in built.items():
        console.print(f"{name:10s} {path}", highlight=False, soft_wrap=True)


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
    force: Annotated[bool, typer.Option("--force", help="Convert even if the manifest says up to date.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Check and print the plan; write nothing.")] = False,
) -> None:
    """Convert Hugging Face checkpoints to TensorRT-LLM checkpoints (config.json + rank{N}.safetensors).

    Either `specbuild convert SPEC` (target and draft of a pipeline spec) or
    `specbuild convert --model HF_DIR --output OUT_DIR [--dtype ...] [--tp-size N] [--pp-size N]`.
    """
    from specbuild.convert.pipeline import ConvertRequest, convert_checkpoint, requests_from_spec

    try:
        if (spec_path is None) == (model is None):
            raise SpecbuildError(
                "give either a pipeline spec or --model (not both, not neither)",
                hint="`specbuild convert pipeline.yaml` or `specbuild convert --model HF_DIR --output OUT_DIR`",
            )
        if model is not None:
            if output is None:
                raise SpecbuildError("--model needs --output: the directory to write the checkpoint to")
            requests = [
                ConvertRequest(
                    name=model.name, source=model, output=output, dtype=dtype, tp_size=tp_size,
                    pp_size=pp_size, allow_pickle=allow_pickle,
                )
            ]
        else:
            from specbuild.spec import load_spec

            assert spec_path is not None
            requests = requests_from_spec(load_spec(spec_path), allow_pickle=allow_pickle)
        for request in requests:
            result = convert_checkpoint(request, force=force, dry_run=dry_run, console=console)
            console.print(result.summary(), highlight=False, soft_wrap=True)
    except SpecbuildError as err:
        raise _fail(err) from None


def main() -> None:  # pragma: no cover - console-script entry point
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
