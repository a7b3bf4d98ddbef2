"""`specbuild medusa ...`: Medusa heads for a base model, frozen (Medusa-1) or fine-tuned with it (Medusa-2)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from specbuild.cli.errors import console, handled_errors, unreadable_model
from specbuild.cli.help import App
from specbuild.cli.options import TrainingText, given_options, print_training_metrics, read_training_texts
from specbuild.errors import SpecbuildError

medusa_app = App(help="Medusa heads: train them on a frozen base model, or fine-tune the base with them (--joint).")

# Each method's own defaults where one option serves both: Medusa-1's are train_medusa_heads', Medusa-2's
# JointSettings' (not imported here, so that --help stays fast; a test checks they agree).
MEDUSA1_DEFAULTS = {"steps": 300, "lr": 1e-3, "seq_len": 128}
JOINT_DEFAULTS = {"steps": 100, "lr": 2e-3, "seq_len": 64}
JOINT_ONLY = ("heads", "base_lr", "heads_coefficient", "generated", "warmup_steps")
"""Options Medusa-1 has no use for: given without --joint, each is refused rather than ignored."""


@medusa_app.command("train")
def medusa_train(
    ctx: typer.Context,
    base: Annotated[
        Path, typer.Option("--base", metavar="HF_DIR", help="Hugging Face base model directory (read, never changed).")
    ],
    output: Annotated[
        Path, typer.Option("--output", metavar="DIR", help="Where to write the heads (FasterDecoding format); with "
                           "--joint, DIR/base (the fine-tuned model) and DIR/heads.")
    ],
    joint: Annotated[
        bool, typer.Option("--joint", help="Medusa-2: fine-tune the base together with the heads (see above).")
    ] = False,
    heads: Annotated[
        Path | None,
        typer.Option("--heads", metavar="DIR", help="--joint: Medusa-1 heads of this base to start from; without "
                     "it, new heads first train alone on the frozen base (--warmup-steps)."),
    ] = None,
    num_heads: Annotated[int, typer.Option("--num-heads", min=1, help="Heads; head k predicts token t+k+2.")] = 4,
    num_layers: Annotated[int, typer.Option("--num-layers", min=1, help="ResBlocks per head.")] = 1,
    steps: Annotated[
        int | None, typer.Option("--steps", min=1, help="Optimizer steps (default 300; --joint: 100 joint steps).")
    ] = None,
    seq_len: Annotated[int | None, typer.Option("--seq-len", min=8, help="Training sequence length (default 128; "
                                                "--joint: 64).")] = None,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, help="Sequences per optimizer step.")] = 8,
    lr: Annotated[
        float | None, typer.Option("--lr", help="AdamW learning rate of the heads (default 1e-3; --joint: 2e-3).")
    ] = None,
    base_lr: Annotated[
        float, typer.Option("--base-lr", help="--joint: the base's learning rate, far below the heads' (the base is "
                            "trained already; a high one moves it away from the original).")
    ] = 1e-4,
    heads_coefficient: Annotated[
        float, typer.Option("--heads-coefficient", help="--joint: λ0, the heads' weight against the base's "
                            "self-distillation loss.")
    ] = 0.2,
    generated: Annotated[
        int, typer.Option("--generated", min=0, help="--joint: greedy continuations the original base writes from "
                          "training-text prompts, half of each batch (self-distillation data; 0: the text only).")
    ] = 256,
    warmup_steps: Annotated[
        int, typer.Option("--warmup-steps", min=0, help="--joint without --heads: steps of the new heads alone.")
    ] = 200,
    text: TrainingText = None,
    seed: Annotated[int, typer.Option("--seed", help="Random seed: head initialisation and batch order.")] = 0,
) -> None:
    """Train Medusa heads and save medusa_lm_head.safetensors + config.json, ready for
    `specbuild convert --model BASE --medusa-heads OUTPUT`.

    Medusa-1 (default): the heads learn on a frozen base (loss weights 0.8^k); the model you serve is the base
    you gave, unchanged.

    Medusa-2 (--joint; Cai et al. 2024 §2.3): the base is fine-tuned together with the heads, so its hidden state
    learns to carry what the heads need; the heads then guess more tokens and each target forward accepts more
    of them. The base is held to the original by self-distillation (KL to the original's next-token
    distribution) at a low learning rate, and half of each batch is the original's own greedy text. It is worth
    it when the Medusa-1 heads' acceptance is the bottleneck and you may ship a new base: the greedy output is
    then the NEW base's greedy output, not the original's (close, not equal; the printed greedy_agreement and
    kl_to_original say how close). Convert and serve DIR/base with DIR/heads:
    `specbuild convert --model DIR/base --medusa-heads DIR/heads`. Serving costs no more memory than Medusa-1;
    training holds the original base beside the one it trains.
    """

    with handled_errors():
        _refuse_ignored_options(ctx, joint, heads)
        texts = read_training_texts(text)
        defaults = JOINT_DEFAULTS if joint else MEDUSA1_DEFAULTS
        # `is not None`, not `or`: an explicit --lr 0 must reach the check that refuses it, not become the default
        chosen_steps = steps if steps is not None else defaults["steps"]
        chosen_lr = lr if lr is not None else defaults["lr"]
        chosen_seq_len = seq_len if seq_len is not None else defaults["seq_len"]
        with unreadable_model("train Medusa heads"):
            if joint:
                metrics = _train_joint(base, heads, output, texts, text or [], steps=chosen_steps,
                                       seq_len=chosen_seq_len, batch_size=batch_size, heads_lr=chosen_lr,
                                       base_lr=base_lr, heads_coefficient=heads_coefficient,
                                       generated_sequences=generated, num_heads=num_heads, num_layers=num_layers,
                                       warmup_steps=warmup_steps, seed=seed)
            else:
                from specbuild.medusa.train import train_medusa_heads

                metrics = train_medusa_heads(base, output, num_heads=num_heads, num_layers=num_layers,
                                             steps=chosen_steps, seq_len=chosen_seq_len, batch_size=batch_size,
                                             lr=chosen_lr, seed=seed, texts=texts, text_files=text or [])
    if joint:
        _print_joint(metrics)
        console.print(f"wrote {output}", highlight=False)
    else:
        print_training_metrics(metrics, output)


def _refuse_ignored_options(ctx: typer.Context, joint: bool, heads: Path | None) -> None:
    """An option the chosen method would not use is refused, not silently dropped: Medusa-2's options without
    --joint; with --heads, --warmup-steps (the given heads need none) and a --num-heads / --num-layers that
    differs from the heads' own (they are continued as they are)."""
    if not joint:
        ignored = given_options(ctx, *JOINT_ONLY)
        if ignored:
            raise SpecbuildError(f"{', '.join(ignored)}: only Medusa-2 (--joint) uses "
                                 f"{'this option' if len(ignored) == 1 else 'these options'}",
                                 hint=f"add --joint, or drop {', '.join(ignored)}")
        return
    if heads is None:
        return
    if given_options(ctx, "warmup_steps"):
        raise SpecbuildError("--warmup-steps trains new heads before Medusa-2, but --heads gives trained ones",
                             hint="drop --warmup-steps, or leave out --heads to warm new heads up")
    from specbuild.medusa.joint import check_start_heads

    shape = {"--num-heads": ctx.params["num_heads"], "--num-layers": ctx.params["num_layers"]}
    check_start_heads(heads, {option: shape[option] for option in given_options(ctx, "num_heads", "num_layers")})


def _train_joint(base: Path, heads: Path | None, output: Path, texts: list[str] | None, text_files: list[Path],
                 **settings: Any) -> dict:
    from specbuild.medusa.joint import JointSettings, train_medusa_joint

    try:
        chosen = JointSettings(**settings)
        chosen.check()
    except ValueError as err:
        raise SpecbuildError(str(err)) from None
    return train_medusa_joint(base, heads, output, chosen, texts=texts, text_files=text_files)


def _print_joint(metrics: dict[str, Any]) -> None:
    """Before/after side by side: the base's held-out loss (should barely move), the heads' (should fall)."""
    before, after = metrics["before"], metrics["after"]
    console.print(f"{'held-out':24s} {'before':>8s} {'after':>8s}", highlight=False)
    for name in after:
        if name != "eval_positions" and name in before:
            console.print(f"{name:24s} {before[name]:8.4f} {after[name]:8.4f}", highlight=False)
    for name in ("unigram_heldout_loss", "kl_to_original", "greedy_agreement", "train_seconds"):
        console.print(f"{name:24s} {metrics[name]:8.4f}", highlight=False)
