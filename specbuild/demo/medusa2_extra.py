"""Demo extra "medusa2": Medusa-2 on the demo target, starting from the demo's Medusa-1 heads.

`demo/models/medusa2/base` is the fine-tuned target (an HF checkpoint with the tokenizer files) and
`demo/models/medusa2/heads` its heads (FasterDecoding format, `base_model_name_or_path: ../base`);
configs/demo-medusa2.yaml serves them. The settings are `JointSettings`' defaults, written out here because
they decide the extra's bytes (and its cache key): 100 joint steps, which took about 40 s of one core's time
(bench/runtime_bench.py measures the heads it gives against Medusa-1's).
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specbuild import corpus
from specbuild.demo.extras import Extra, register
from specbuild.demo.recipe import RECIPE
from specbuild.medusa.joint import JointSettings

if TYPE_CHECKING:
    from rich.progress import Progress

NAME = "medusa2"
SETTINGS = asdict(JointSettings(seed=5))
START_HEADS = "medusa-heads"  # specbuild.demo.models.MEDUSA_HEADS_DIR (not imported: models imports extras)


def build(models_dir: Path, out_dir: Path, settings: dict[str, Any], progress: Progress | None) -> dict[str, Any]:
    """Fine-tune the demo target with its Medusa-1 heads on the demo's own training split; held-out metrics
    come from the split no demo model was trained on."""
    from specbuild.demo.training import deterministic_torch
    from specbuild.medusa.joint import train_medusa_joint

    with deterministic_torch():
        return train_medusa_joint(
            models_dir / "target", models_dir / START_HEADS, out_dir, JointSettings(**settings),
            texts=corpus.training_texts(RECIPE.heldout_every), eval_texts=corpus.heldout_texts(RECIPE.heldout_every),
            progress=progress if progress is not None else False,
        )


EXTRA = register(Extra(NAME, build, SETTINGS, summary="Medusa-2: the demo target fine-tuned with its heads"))
