"""`specbuild draft ...`: drafts made from the target itself."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from specbuild.cli.errors import handled_errors, unreadable_model
from specbuild.cli.help import App
from specbuild.cli.options import TrainingText, print_training_metrics, read_training_texts

draft_app = App(help="Self-drafts (draft.source: target_layers): train an adapter that raises their acceptance.")


@draft_app.command("train")
def draft_train(
    target: Annotated[
        Path, typer.Option("--target", metavar="HF_DIR", help="Hugging Face target model directory (kept frozen).")
    ],
    layers: Annotated[
        int, typer.Option("--layers", min=1, help="L: the adapter runs after the target's first L layers "
                          "(draft.layers in the spec).")
    ],
    output: Annotated[Path, typer.Option("--output", metavar="DIR", help="Where to write the adapter.")],
    steps: Annotated[int, typer.Option("--steps", min=1, help="Optimizer steps.")] = 200,
    seq_len: Annotated[int, typer.Option("--seq-len", min=8, help="Training sequence length.")] = 64,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, help="Sequences per optimizer step.")] = 8,
    lr: Annotated[float, typer.Option("--lr", help="AdamW learning rate.")] = 1e-3,
    text: TrainingText = None,
    seed: Annotated[int, typer.Option("--seed", help="Random seed: batch order.")] = 0,
) -> None:
    """Train a self-draft adapter: one decoder layer after the frozen target's first L layers, distilled from the
    target's own logits (KL), starting as the target's layer L. Writes adapter.safetensors + adapter.json; set
    `draft: {source: target_layers, layers: L, adapter: OUTPUT}` in the spec and `convert` writes a draft of
    L + 1 layers. Prints held-out KL and argmax agreement with the target, with and without the adapter."""
    from specbuild.self_draft.train import train_adapter

    with handled_errors():
        texts = read_training_texts(text)
        with unreadable_model("train the adapter"):
            metrics = train_adapter(target, output, layers=layers, steps=steps, seq_len=seq_len,
                                    batch_size=batch_size, lr=lr, seed=seed, texts=texts, text_files=text or [])
    print_training_metrics(metrics, output)
