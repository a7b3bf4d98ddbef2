"""Demo extra "self-draft-adapter": a self-draft adapter trained on the demo target (`specbuild draft train`).

L = 2 of the target's 8 layers: the draft then costs 3 layers' compute (2 + the adapter) per token. Measured on
the demo text (bench/runtime_bench.py, K=4, batch 1) the 2-layer cut alone gives under 2 tokens per target forward
and the adapter well over 2; 150 steps of 8 x 64 tokens train in about 35 s on one core.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from specbuild.demo.extras import Extra, register

if TYPE_CHECKING:
    from rich.progress import Progress

NAME = "self-draft-adapter"
SETTINGS: dict[str, Any] = {"layers": 2, "steps": 150, "seq_len": 64, "batch_size": 8, "lr": 1e-3, "seed": 0}


def build(models_dir: Path, output: Path, settings: dict[str, Any], progress: Progress | None) -> dict[str, Any]:
    """Train the adapter; a target too shallow for the recipe's L (a shrunk test recipe) gets L = its layers - 1,
    and one of a single layer, which has no self-draft at all, gets a note instead of an adapter."""
    import json

    import torch

    from specbuild.self_draft.train import train_adapter

    total = json.loads((models_dir / "target" / "config.json").read_text())["num_hidden_layers"]
    if total < 2:
        reason = f"the demo target has {total} layer: a self-draft needs at least 2"
        (output / "SKIPPED.txt").write_text(reason + "\n")
        return {"skipped": reason}
    settings = {**settings, "layers": min(settings["layers"], total - 1)}

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the same bytes on every machine with the same demo target
    try:
        return train_adapter(models_dir / "target", output, progress=progress if progress is not None else False,
                             **settings)
    finally:
        torch.set_num_threads(threads)


EXTRA = register(Extra(NAME, build, SETTINGS, "self-draft adapter after the demo target's first 2 layers"))
