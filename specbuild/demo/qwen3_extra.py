"""Demo extra "qwen3": a second demo pair of another family, a Qwen3 target and a Qwen3 draft.

`demo/models/qwen3/target` and `demo/models/qwen3/draft` are Qwen3ForCausalLM checkpoints shaped as the small Qwen3s
ship (q/k norm, an explicit head_dim that is not hidden_size / heads, tied embeddings; `training.qwen3`), trained
exactly as the Llama pair is (`specbuild.demo.models`): the target on windows of the built-in corpus's training
split, the draft distilled from it on its own greedy text and on the corpus, on the demo tokenizer, so a prompt
reads the same to both pairs. configs/demo-qwen3.yaml serves it with draft-target speculation, and make test's
Triton tests run it (tests/test_qwen3_demo_served.py), so a family other than Llama goes end to end on every run.

It is an extra, not part of the base build, so that `make demo` does not pay for it, and it is smaller than the
Llama pair (4 layers of 192 against 8 of 256; fewer steps, fewer generated rows), because every fresh CI machine
trains it. Measured on the 2-core dev machine (AMD EPYC): 300 target + 300 draft steps took 74 s idle, with a
repetitive target (held-out loss 5.56, agreement 0.96 on its own text); 500 target steps reach the Llama target's
held-out loss (5.08); the shipped 400 + 250 took 224 s wall (239 s CPU) with the cores shared by other work, and
gave held-out loss 5.32, draft/target agreement 0.73 on held-out text and 0.90 on the target's own text.
The settings below decide its bytes (and its cache key); `SPECBUILD_DEMO_SEED_OFFSET` shifts its seeds as it
shifts the base recipe's (`make test-variant`). Its metrics (losses, draft/target agreement, seconds) are in the
extra's demo-extra.json.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specbuild.demo.extras import Extra, register

if TYPE_CHECKING:
    from rich.progress import Progress

    from specbuild.demo.recipe import Recipe

NAME = "qwen3"
TARGET_DIR = "target"
DRAFT_DIR = "draft"
SETTINGS: dict[str, Any] = {
    # Shape fields (recipe.Shape): GQA in both; 4 heads of 64 over a hidden size of 192 (target) and 128 (draft)
    "target": {"hidden_size": 192, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
               "intermediate_size": 512},
    "draft": {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "intermediate_size": 256},
    "head_dim": 64,
    "rope_theta": 1000000.0,  # Qwen3's
    # recipe.Training fields
    "target_training": {"steps": 400, "lr": 3e-3, "seed": 41, "batch_size": 8, "seq_len": 64},
    "draft_training": {"steps": 250, "lr": 3e-3, "seed": 42, "batch_size": 8, "seq_len": 128},
    "draft_generated_rows": 400,
    "eval_generated_rows": 16,
    "init_seed": 40,
}


def qwen3_recipe(settings: dict[str, Any]) -> Recipe:
    """The demo recipe with this extra's shapes and training settings (the base's tokenizer, corpus split and
    distillation settings stay), its seeds shifted by `SPECBUILD_DEMO_SEED_OFFSET` as the base recipe's are."""
    from specbuild.demo.recipe import RECIPE, SEED_OFFSET_ENV, Shape, Training, env_int, with_seed_offset

    recipe = dataclasses.replace(
        RECIPE,
        target=Shape(**settings["target"]),
        draft=Shape(**settings["draft"]),
        rope_theta=settings["rope_theta"],
        target_training=Training(**settings["target_training"]),
        draft_training=Training(**settings["draft_training"]),
        draft_generated_rows=settings["draft_generated_rows"],
        eval_generated_rows=settings["eval_generated_rows"],
        init_seed=settings["init_seed"],
    )
    offset = env_int(SEED_OFFSET_ENV)
    return recipe if offset is None else with_seed_offset(recipe, offset)


def build(models_dir: Path, output: Path, settings: dict[str, Any], progress: Progress | None) -> dict[str, Any]:
    """Train the pair on the base build's tokenizer and save both beside its tokenizer files."""
    from tokenizers import Tokenizer

    from specbuild import corpus
    from specbuild.demo.models import TOKENIZER_DIR, save_model
    from specbuild.demo.tokenizer import token_stream
    from specbuild.demo.training import deterministic_torch, evaluate, qwen3, train_draft, train_target

    tokenizer_dir = models_dir / TOKENIZER_DIR
    tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    recipe = dataclasses.replace(qwen3_recipe(settings), vocab_size=tokenizer.get_vocab_size())  # the base build's
    train_texts, held_texts = corpus.split_topics(recipe.heldout_every)
    with deterministic_torch():
        train_ids = token_stream(tokenizer, train_texts)
        held_ids = token_stream(tokenizer, held_texts)

        t0 = time.perf_counter()
        target = qwen3(recipe, recipe.target, head_dim=settings["head_dim"], seed=recipe.init_seed)
        target_loss = train_target(target, train_ids, recipe.target_training, progress)
        target_seconds = time.perf_counter() - t0

        t0 = time.perf_counter()
        draft = qwen3(recipe, recipe.draft, head_dim=settings["head_dim"], seed=recipe.init_seed + 1)
        draft_loss = train_draft(draft, target, train_ids, recipe, progress)
        draft_seconds = time.perf_counter() - t0

        evaluation = evaluate(target, draft, held_ids, recipe, progress)
        save_model(target, output / TARGET_DIR, tokenizer_dir)
        save_model(draft, output / DRAFT_DIR, tokenizer_dir)
    return {
        TARGET_DIR: {"final_train_loss": round(target_loss, 4), "train_seconds": round(target_seconds, 1)},
        DRAFT_DIR: {"final_train_loss": round(draft_loss, 4), "train_seconds": round(draft_seconds, 1)},
        **evaluation,
    }


EXTRA = register(Extra(NAME, build, SETTINGS, "a Qwen3 target and draft (q/k norm, tied embeddings) on the demo "
                                               "tokenizer"))
