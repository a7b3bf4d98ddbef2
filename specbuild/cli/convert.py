"""`specbuild convert`: Hugging Face checkpoints to TensorRT-LLM checkpoints, for a spec or one directory."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from specbuild.cli.errors import console, handled_errors
from specbuild.cli.options import DryRun, Force, OptionalSpec
from specbuild.errors import SpecbuildError


def convert(
    spec_path: OptionalSpec = None,
    model: Annotated[
        Path | None,
        typer.Option("--model", metavar="HF_DIR", help="Convert one Hugging Face checkpoint directory, without a "
                     "spec."),
    ] = None,
    output: Annotated[
        Path | None, typer.Option("--output", metavar="OUT_DIR", help="Output directory (with --model).")
    ] = None,
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
            metavar="DIR",
            help="With --model: a FasterDecoding Medusa head directory (medusa_lm_head.safetensors); writes one "
            "MedusaForCausalLM checkpoint of the base model plus its heads.",
        ),
    ] = None,
    medusa_tree_nodes: Annotated[
        int, typer.Option("--max-draft-len", min=1, help="Medusa: the tree's node count (config max_draft_len).")
    ] = 63,
    force: Force = False,
    dry_run: DryRun = False,
) -> None:
    """Convert Hugging Face checkpoints to TensorRT-LLM checkpoints (config.json + rank{N}.safetensors).

    \b
    Either `specbuild convert SPEC` (target and draft of a pipeline spec) or
    `specbuild convert --model HF_DIR --output OUT_DIR [--dtype ...] [--tp-size N] [--pp-size N]`.
    """
    from specbuild.convert.pipeline import ConvertRequest, ConvertResult
    from specbuild.convert.run import convert_model, convert_spec

    def report(result: ConvertResult) -> None:
        console.print(result.summary(), highlight=False, soft_wrap=True)

    with handled_errors():
        if (spec_path is None) == (model is None):
            raise SpecbuildError(
                "give either a pipeline spec or --model (not both, not neither)",
                hint="`specbuild convert pipeline.yaml` or `specbuild convert --model HF_DIR --output OUT_DIR`",
            )
        if model is None:
            assert spec_path is not None
            convert_spec(spec_path, allow_pickle=allow_pickle, force=force, dry_run=dry_run, console=console,
                         on_result=report)
            return
        if output is None:
            raise SpecbuildError("--model needs --output: the directory to write the checkpoint to")
        request = ConvertRequest(
            name=model.name, source=model, output=output, dtype=dtype, tp_size=tp_size, pp_size=pp_size,
            allow_pickle=allow_pickle, medusa_heads=medusa_heads, medusa_tree_nodes=medusa_tree_nodes,
            inputs=(("--model", model), ("--medusa-heads", medusa_heads)), output_name="--output",
        )
        convert_model(request, force=force, dry_run=dry_run, console=console, on_result=report)
