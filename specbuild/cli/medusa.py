"""`specbuild medusa ...`: Medusa heads for a frozen base model."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from specbuild.cli.errors import console, handled_errors
from specbuild.cli.help import App
from specbuild.errors import SpecbuildError

medusa_app = App(help="Medusa heads: train them on a frozen base model.")


def _read_texts(paths: list[Path] | None) -> list[str] | None:
    try:
        return [p.read_text(encoding="utf-8") for p in paths] if paths else None
    except OSError as err:
        raise SpecbuildError(f"cannot read training text: {err}") from None


@medusa_app.command("train")
def medusa_train(
    base: Annotated[
        Path, typer.Option("--base", metavar="HF_DIR", help="Hugging Face base model directory (kept frozen).")
    ],
    output: Annotated[
        Path, typer.Option("--output", metavar="DIR", help="Where to write the heads (FasterDecoding format).")
    ],
    num_heads: Annotated[int, typer.Option("--num-heads", min=1, help="Heads; head k predicts token t+k+2.")] = 4,
    num_layers: Annotated[int, typer.Option("--num-layers", min=1, help="ResBlocks per head.")] = 1,
    steps: Annotated[int, typer.Option("--steps", min=1, help="Optimizer steps.")] = 300,
    seq_len: Annotated[int, typer.Option("--seq-len", min=8, help="Training sequence length.")] = 128,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, help="Sequences per optimizer step.")] = 8,
    lr: Annotated[float, typer.Option("--lr", help="AdamW learning rate.")] = 1e-3,
    text: Annotated[
        list[Path] | None,
        typer.Option("--text", metavar="FILE", help="Training text files (repeatable); default: the built-in pydoc "
                     "corpus."),
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Random seed: head initialisation and batch order.")] = 0,
) -> None:
    """Train Medusa-1 heads on a frozen base (loss weights 0.8^k) and save medusa_lm_head.safetensors +
    config.json, ready for `specbuild convert --model BASE --medusa-heads OUTPUT`."""
    from specbuild.atomic import is_no_space
    from specbuild.medusa.train import train_medusa_heads

    with handled_errors():
        texts = _read_texts(text)
        try:
            metrics = train_medusa_heads(base, output, num_heads=num_heads, num_layers=num_layers, steps=steps,
                                         seq_len=seq_len, batch_size=batch_size, lr=lr, seed=seed, texts=texts)
        except OSError as err:  # a base directory transformers cannot read: one line, not a traceback
            if is_no_space(err):
                raise
            raise SpecbuildError(f"cannot train Medusa heads: {err}") from None
    for name, value in metrics.items():
        console.print(f"{name:16s} {value:.4f}", highlight=False)
    console.print(f"wrote {output}", highlight=False)
