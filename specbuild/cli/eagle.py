"""`specbuild eagle ...`: EAGLE-3 drafts for a frozen target."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from specbuild.cli.errors import handled_errors, unreadable_model
from specbuild.cli.help import App
from specbuild.cli.options import TrainingText, print_training_metrics, read_training_texts

eagle_app = App(help="EAGLE-3 drafts: train one on a frozen target.")


@eagle_app.command("train")
def eagle_train(
    target_dir: Annotated[Path, typer.Argument(metavar="TARGET_DIR", help="Hugging Face target model directory, "
                                               "kept frozen: Llama, Mistral, Qwen2, Qwen3, Qwen3-MoE, Phi-3 or Gemma 3 "
                                               "(the families an engine runs EAGLE-3 drafts for).")],
    out_dir: Annotated[Path, typer.Argument(metavar="OUT_DIR", help="Where to write the draft (config.json + "
                                            "model.safetensors).")],
    steps: Annotated[int, typer.Option("--steps", min=1, help="Optimizer steps.")] = 300,
    lr: Annotated[float, typer.Option("--lr", help="AdamW learning rate (warmup, then cosine to zero).")] = 3e-3,
    seq_len: Annotated[int, typer.Option("--seq-len", min=8, help="Training sequence length.")] = 64,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, help="Sequences per optimizer step.")] = 8,
    ttt_steps: Annotated[int, typer.Option("--ttt-steps", min=1, help="Training-time-test passes: how many draft "
                                           "steps in a row the draft learns to make on its own hidden states.")] = 3,
    regenerate: Annotated[int, typer.Option("--regenerate", min=0, help="Train on this many of the target's own "
                                            "greedy continuations of prompts from the text instead of the text "
                                            "itself (0: the text).")] = 0,
    text: TrainingText = None,
    seed: Annotated[int, typer.Option("--seed", help="Random seed: initialisation and batch order.")] = 0,
) -> None:
    """Train an EAGLE-3 draft (Li et al. 2025) for TARGET_DIR and write it to OUT_DIR.

    An EAGLE-3 draft is one decoder layer that reads the target's own hidden states from three of its layers (low,
    middle, high), fused by `fc`, together with the next token's embedding, and predicts the token after it; its
    output feeds its own next step. Training runs the target frozen and unrolls the draft for --ttt-steps passes
    on its own outputs ("training-time test"), scoring every pass against the target's distribution. Held-out
    agreement with the target at draft steps 1..3 is printed before and after training.

    OUT_DIR is the checkpoint TensorRT-LLM's PyTorch backend, vLLM and SGLang load: put it in the spec as
    `speculative: {mode: eagle3}` with `draft: {model: OUT_DIR}` (see configs/demo-eagle3.yaml)."""
    from specbuild.eagle.train import Eagle3TrainSettings, train_eagle3

    with handled_errors():
        texts = read_training_texts(text)
        settings = Eagle3TrainSettings(steps=steps, lr=lr, seq_len=seq_len, batch_size=batch_size,
                                       ttt_steps=ttt_steps, regenerate=regenerate, seed=seed)
        with unreadable_model("train the EAGLE-3 draft"):
            metrics = train_eagle3(target_dir, out_dir, settings, texts=texts, text_files=text or [])
    print_training_metrics(metrics, out_dir, width=20)
