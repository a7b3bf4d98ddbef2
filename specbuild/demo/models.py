"""Small demo models, built offline and deterministically.

No model can be downloaded where specbuild is developed and tested, yet the converter, the runtime and the
speculative-decoding service need real checkpoints with a realistic draft/target acceptance rate. So we make
them: a byte-level BPE tokenizer and two Llama models (target and draft) trained for a few hundred CPU steps on
the built-in corpus (`specbuild.corpus`: the Python reference text that ships with every Python), plus untrained
Qwen2, Mistral and GPT-2 checkpoints that exist only to cover the converter's other architectures, and Medusa
heads trained on the frozen target (FasterDecoding format, `specbuild.medusa.train`).

This module builds and caches; `recipe` holds the settings and the cache key, `tokenizer` and `training` the
work. A build is cached: `DIR/demo-models.json` records the recipe hash (`recipe.recipe_hash`); a complete build
with the same hash is reused at once. Builds happen in a temporary sibling directory that replaces DIR only when
complete (`specbuild.atomic`), under DIR's lock, which a second builder waits for, so parallel test sessions share
one build and an interrupted build never leaves a half-written DIR. Nothing in DIR names an absolute path, so a
built DIR can be moved or copied to another machine.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specbuild import corpus
from specbuild.atomic import atomic_directory, output_lock
from specbuild.demo import recipe as demo_recipe
from specbuild.demo.recipe import (
    Recipe,
    cpu_description,
    library_versions,
    recipe_from_environment,
    recipe_hash,
    train_threads,
)
from specbuild.demo.tokenizer import BOS_ID, EOS_ID, PAD_ID, save_tokenizer, token_stream, train_tokenizer
from specbuild.demo.training import (
    deterministic_torch,
    evaluate,
    llama,
    train_draft,
    train_medusa_heads,
    train_target,
    untrained_models,
)
from specbuild.errors import SpecbuildError

if TYPE_CHECKING:
    from rich.progress import Progress
    from transformers import PreTrainedModel

MANIFEST_NAME = "demo-models.json"
TOKENIZER_DIR = "tokenizer"
MODEL_NAMES = ("target", "draft", "qwen2", "mistral", "gpt2")
MEDUSA_HEADS_DIR = "medusa-heads"
ALL_NAMES = (TOKENIZER_DIR, *MODEL_NAMES, MEDUSA_HEADS_DIR)
# The Medusa heads' `base_model_name_or_path`: the target beside them, relative to the heads directory, so the
# demo directory stays valid wherever it is moved.
MEDUSA_BASE_NAME = "../target"


def build_demo_models(
    out_dir: Path, *, force: bool = False, progress: bool = True, recipe: Recipe | None = None
) -> dict[str, Path]:
    """Build (or reuse) the demo models in `out_dir`; returns name → directory.

    A complete build with the same recipe hash is returned without touching any file. Otherwise everything is
    built in a temporary sibling directory and swapped in, so readers never see a partial DIR.
    """
    recipe = recipe or recipe_from_environment()
    out_dir = Path(out_dir).absolute()
    key = recipe_hash(recipe)
    if not force and is_complete(out_dir, key):
        return _layout(out_dir)
    with output_lock(out_dir, wait=True):  # one builder per DIR: the others wait for its build, then reuse it
        if not force and is_complete(out_dir, key):  # another process finished it while we waited
            return _layout(out_dir)
        _remove_legacy_build_dirs(out_dir)
        with atomic_directory(out_dir, replaceable=_check_replaceable) as tmp:
            manifest = _build_into(tmp, recipe, key, progress=progress)
            _write_json(tmp / MANIFEST_NAME, manifest)
            _normalize_permissions(tmp)
    return _layout(out_dir)


def is_complete(out_dir: Path, key: str) -> bool:
    """True if `out_dir` holds a finished build with recipe hash `key` and every recorded file is intact."""
    try:
        manifest = json.loads((out_dir / MANIFEST_NAME).read_text())
    except (OSError, ValueError):
        return False
    if manifest.get("recipe_hash") != key:
        return False
    files = manifest.get("files", {})
    if not all(any(rel.startswith(f"{name}/") for rel in files) for name in ALL_NAMES):
        return False
    for rel, info in files.items():
        path = out_dir / rel
        if not path.is_file() or path.stat().st_size != info.get("size"):
            return False
    return True


def heldout_texts(recipe: Recipe | None = None) -> list[str]:
    """The built-in corpus's held-out topics under `recipe`'s split: what no demo model was trained on."""
    return corpus.heldout_texts((recipe or demo_recipe.RECIPE).heldout_every)


def training_texts(recipe: Recipe | None = None) -> list[str]:
    """The built-in corpus's training topics under `recipe`'s split (the tokenizer, models and Medusa heads)."""
    return corpus.training_texts((recipe or demo_recipe.RECIPE).heldout_every)


# ---------------------------------------------------------------------------------------------------- cache


def _layout(out_dir: Path) -> dict[str, Path]:
    return {name: out_dir / name for name in ALL_NAMES}


def _check_replaceable(out_dir: Path) -> None:
    """Refuse to replace a directory that is not ours (e.g. `demo-models ~`). One with our manifest is ours,
    including what later stages added to it (Medusa heads trained on this target are stale once it changes)."""
    if not out_dir.exists():
        return
    if not out_dir.is_dir():
        raise SpecbuildError(f"{out_dir} exists and is not a directory", hint="choose a new or empty DIR")
    if (out_dir / MANIFEST_NAME).is_file():
        return
    foreign = sorted(p.name for p in out_dir.iterdir() if p.name not in (*ALL_NAMES, MANIFEST_NAME))
    if foreign:
        raise SpecbuildError(
            f"{out_dir} holds files that are not demo models ({', '.join(foreign[:5])}); refusing to replace it",
            hint="choose a new or empty DIR, or delete it first",
        )


def _remove_legacy_build_dirs(out_dir: Path) -> None:
    """Drop the `.DIR.building-*` directories that killed builds of earlier versions left (they built there, not in
    atomic.py's temporaries, which `output_lock` cleans up itself); safe because we hold the lock."""
    for stale in out_dir.parent.glob(f".{out_dir.name}.building-*"):
        shutil.rmtree(stale, ignore_errors=True)


def _normalize_permissions(root: Path) -> None:
    """mkdtemp makes 0700 and transformers writes weights 0600; give the usual umask-based modes instead, so
    that e.g. a Triton server running as another user can read the models."""
    umask = os.umask(0)
    os.umask(umask)
    for path in [root, *root.rglob("*")]:
        path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def _file_records(root: Path) -> dict[str, dict[str, Any]]:
    records = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        records[path.relative_to(root).as_posix()] = {
            "size": path.stat().st_size,
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        }
    return records



# ---------------------------------------------------------------------------------------------------- build


def _build_into(root: Path, recipe: Recipe, key: str, *, progress: bool) -> dict[str, Any]:
    """Write the tokenizer, all models and the Medusa heads below `root` (renamed into place afterwards);
    returns the manifest (metrics, file hashes)."""
    started = time.perf_counter()
    train_texts, held_texts = corpus.split_topics(recipe.heldout_every)
    with deterministic_torch(), _progress(progress) as bars:
        tokenizer = train_tokenizer(train_texts, recipe.vocab_size)
        save_tokenizer(tokenizer, root / TOKENIZER_DIR, recipe.max_positions)
        train_ids = token_stream(tokenizer, train_texts)
        held_ids = token_stream(tokenizer, held_texts)

        t0 = time.perf_counter()
        target = llama(recipe, recipe.target, seed=recipe.init_seed)
        target_loss = train_target(target, train_ids, recipe.target_training, bars)
        target_seconds = time.perf_counter() - t0

        t0 = time.perf_counter()
        draft = llama(recipe, recipe.draft, seed=recipe.init_seed + 1)
        draft_loss = train_draft(draft, target, train_ids, recipe, bars)
        draft_seconds = time.perf_counter() - t0

        evaluation = evaluate(target, draft, held_ids, recipe, bars)
        models: dict[str, PreTrainedModel] = {"target": target, "draft": draft, **untrained_models(recipe)}
        for name, model in models.items():
            save_model(model, root / name, root / TOKENIZER_DIR)
        medusa_metrics = train_medusa_heads(root / "target", root / MEDUSA_HEADS_DIR, recipe.medusa, MEDUSA_BASE_NAME,
                                            train_texts, held_texts, bars)
    metrics = {
        "target": {"final_train_loss": target_loss, "train_seconds": round(target_seconds, 1)},
        "draft": {"final_train_loss": draft_loss, "train_seconds": round(draft_seconds, 1)},
        MEDUSA_HEADS_DIR: medusa_metrics,
        **evaluation,
        "heldout_tokens": int(held_ids.numel()),
        "train_tokens": int(train_ids.numel()),
        "build_seconds": round(time.perf_counter() - started, 1),
        "torch_threads": train_threads(),
        "cpu": cpu_description(),
    }
    if progress:
        _print_summary(metrics)
    return {
        "recipe_hash": key,
        "recipe_version": demo_recipe.RECIPE_VERSION,
        "recipe": dataclasses.asdict(recipe),
        "versions": library_versions(),
        "metrics": metrics,
        "shapes": {name: _shape_summary(model) for name, model in models.items()},
        "files": _file_records(root),
    }


@contextlib.contextmanager
def _progress(enabled: bool) -> Iterator[Progress | None]:
    if not enabled:
        yield None
        return
    from rich.console import Console
    from rich.progress import Progress

    from specbuild.training import bar_columns

    with Progress(*bar_columns(), console=Console(stderr=True)) as bars:
        yield bars


def _print_summary(metrics: dict[str, Any]) -> None:
    from rich.console import Console

    Console(stderr=True).print(
        f"target loss {metrics['target_heldout_loss']:.3f}, draft loss {metrics['draft_heldout_loss']:.3f} "
        f"(held-out), draft/target top-1 agreement {metrics['top1_agreement']:.1%} "
        f"({metrics['top1_agreement_on_target_text']:.1%} on the target's own text), "
        f"Medusa head 0 top-1 {metrics[MEDUSA_HEADS_DIR]['head0_top1']:.1%}, "
        f"built in {metrics['build_seconds']:.0f} s",
        highlight=False,
    )


def save_model(model: PreTrainedModel, out: Path, tokenizer_dir: Path) -> None:
    """float32 safetensors (the exact trained weights; converters cast), generation config, tokenizer files."""
    model.generation_config.bos_token_id = BOS_ID
    model.generation_config.eos_token_id = EOS_ID
    model.generation_config.pad_token_id = PAD_ID
    model.save_pretrained(str(out))
    for path in sorted(tokenizer_dir.iterdir()):
        shutil.copy2(path, out / path.name)


def _shape_summary(model: PreTrainedModel) -> dict[str, Any]:
    config = model.config
    keys = (
        "model_type",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "intermediate_size",
        "vocab_size",
        "tie_word_embeddings",
        "sliding_window",
    )
    summary = {k: getattr(config, k) for k in keys if getattr(config, k, None) is not None}
    summary["parameters"] = sum(p.numel() for p in model.parameters())
    return summary
