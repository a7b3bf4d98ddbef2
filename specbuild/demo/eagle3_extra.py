"""Demo extra "eagle3-draft": an EAGLE-3 draft trained on the demo target (`specbuild eagle train`).

Trained on the target's own greedy continuations of 128 prompts cut from the demo's training text (the text the
draft will meet when it serves greedy requests), 3 training-time-test steps, on one torch thread so that every
machine with the same demo target writes the same bytes. The target's features and distributions over those 128
sequences are computed once (`specbuild.eagle.train.TargetSet`), so a step costs only the draft's passes: 180
steps at lr 6e-3 train in about 50 s of one core (measured on the demo target: 150 steps at 3e-3 took 41 s and
reached 2.93 tokens per target forward at K=4; 200 steps at 6e-3 reached 3.10; 2 TTT passes instead of 3
drafted worse past the second token: 2.96 at K=6; lr 1e-2 was worse than 6e-3).
Held-out figures are in the extra's demo-extra.json.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from specbuild.demo.extras import Extra, register

if TYPE_CHECKING:
    from rich.progress import Progress

NAME = "eagle3-draft"
SETTINGS: dict[str, Any] = {"steps": 180, "lr": 6e-3, "seq_len": 96, "batch_size": 8, "ttt_steps": 3,
                            "regenerate": 128, "prompt_tokens": 16, "seed": 0}


def build(models_dir: Path, output: Path, settings: dict[str, Any], progress: Progress | None) -> dict[str, Any]:
    """Train the draft; a target too shallow to capture three layers (a shrunk test recipe) gets a note instead,
    as the self-draft extra does, so that demo-models never fails on it."""
    import torch

    from specbuild.eagle.train import Eagle3TrainSettings, check_target, train_eagle3
    from specbuild.errors import CheckpointError

    try:
        check_target(models_dir / "target")
    except CheckpointError as err:
        (output / "SKIPPED.txt").write_text(f"{err.message}\n")
        return {"skipped": err.message}

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return train_eagle3(models_dir / "target", output, Eagle3TrainSettings(**settings),
                            progress=progress if progress is not None else False)
    finally:
        torch.set_num_threads(threads)


EXTRA = register(Extra(NAME, build, SETTINGS, "EAGLE-3 draft for the demo target (one layer over its features)"))
