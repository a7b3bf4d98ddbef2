"""The demo recipe: every setting that decides the bytes a demo build writes, and the hash that names a build.

A build is cached under `recipe_hash`: the hyper-parameters below, `RECIPE_VERSION`, the training text and the
library versions; the same hash means the same files, so a complete build with it is reused at once.

The trained weights differ from CPU to CPU (float kernels and summation orders differ), so nothing may rely on
the exact words these models say. To check that, two environment variables build the demo models under other
conditions, as another machine would: `SPECBUILD_DEMO_SEED_OFFSET=N` shifts every seed of the recipe and
`SPECBUILD_DEMO_TRAIN_THREADS=N` trains with N torch threads. Both are part of the cache key; they are meant
for that cross-machine check (`make test-variant`), not for users.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import os
import platform
from dataclasses import dataclass
from pathlib import Path

from specbuild.corpus import HELDOUT_EVERY, all_topics
from specbuild.errors import SpecbuildError

# Bump whenever a code change alters what a build produces (the hyper-parameters below are hashed anyway).
RECIPE_VERSION = 5  # 2: Medusa heads on the target; 3: an 8-layer target; 4: heads name their base relatively;
# 5: the draft distilled on the target's greedy text (specbuild.training.greedy_rows, whose code decides its bytes)
SEED_OFFSET_ENV = "SPECBUILD_DEMO_SEED_OFFSET"
TRAIN_THREADS_ENV = "SPECBUILD_DEMO_TRAIN_THREADS"


@dataclass(frozen=True)
class Shape:
    """Decoder shape shared by the Llama-family models (GPT-2 maps it onto n_embd/n_layer/n_head)."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int


@dataclass(frozen=True)
class Training:
    """One model's optimisation settings. Few steps, so a high peak LR with a short warmup."""

    steps: int
    lr: float
    seed: int
    batch_size: int = 16
    seq_len: int = 128
    warmup: float = 0.1
    final_lr_frac: float = 0.1
    weight_decay: float = 0.1
    grad_clip: float = 1.0


@dataclass(frozen=True)
class MedusaHeads:
    """Medusa-1 heads on the frozen target. 200 steps at 3e-3 reach the held-out accuracy that 600 steps at 1e-3
    reach (head 0 top-1 0.085 either way, measured on 2 cores) in about a third of the time."""

    num_heads: int = 4
    num_layers: int = 1
    steps: int = 200
    lr: float = 3e-3
    seed: int = 3
    batch_size: int = 8
    seq_len: int = 64  # the target was trained on 64-token windows too


@dataclass(frozen=True)
class Recipe:
    """Everything that determines the bytes a build writes (together with RECIPE_VERSION and library versions).

    The target has GQA (8 query / 4 KV heads) and untied embeddings, the draft is ~7x smaller with GQA too;
    Qwen2 ties its embeddings and has QKV biases, Mistral has a sliding window: each exercises a converter path.
    """

    vocab_size: int = 2048
    max_positions: int = 512
    rope_theta: float = 10000.0
    heldout_every: int = HELDOUT_EVERY  # the built-in corpus's split (specbuild.corpus)
    # 8 layers, not 4: on CPU these models cost the number of torch operations a step launches, so a 4-layer
    # target made the 2-layer draft cost 0.39 of a target step (speculation then gains 1.1x); with 8 layers the
    # draft costs about 0.2 of a step, the ratio real target/draft pairs have (bench/runtime_bench.py).
    target: Shape = Shape(256, 8, 8, 4, 688)
    draft: Shape = Shape(128, 2, 4, 2, 344)
    small: Shape = Shape(128, 2, 4, 2, 256)
    sliding_window: int = 256
    # Measured on 2 cores: many small steps beat fewer large ones at equal cost; 64-token windows for the target
    # still give it the same held-out loss at positions 64-255 as 128-token windows (both degrade past ~192).
    target_training: Training = Training(steps=500, lr=2e-3, seed=1, batch_size=8, seq_len=64)
    draft_training: Training = Training(steps=400, lr=3e-3, seed=2, batch_size=8, seq_len=128)
    distill_top_k: int = 64
    distill_weight: float = 0.9  # the rest is ordinary next-token cross-entropy on the text
    # The draft learns on the target's own greedy continuations of training-text prompts (sequence-level
    # distillation), the text it drafts for when a greedy request is served, besides the corpus windows. Measured on
    # 2 cores, the draft's top-1 agreement with the target on the target's greedy text (held-out prompts and the
    # serving benchmark's alike) / on held-out corpus text: 0.81 / 0.68 distilled on corpus windows only, 0.89 /
    # 0.54 on 1600 generated rows only (3200 did no better), 0.89 / 0.65 on both. The rows cost about 35 s to
    # generate in batches of 256.
    draft_generated_rows: int = 1600
    draft_prompt_tokens: int = 16
    generation_batch: int = 256
    eval_generated_rows: int = 32  # held-out prompts whose greedy continuations score the draft as served
    eval_seq_len: int = 128
    init_seed: int = 0
    medusa: MedusaHeads = MedusaHeads()


RECIPE = Recipe()


def recipe_from_environment() -> Recipe:
    """The shipped recipe, with every seed shifted by `SPECBUILD_DEMO_SEED_OFFSET` when that is set."""
    recipe = RECIPE
    offset = env_int(SEED_OFFSET_ENV)
    return recipe if offset is None else with_seed_offset(recipe, offset)


def with_seed_offset(recipe: Recipe, offset: int) -> Recipe:
    """The same recipe with every random seed (initialisation, data order, Medusa heads) moved by `offset`."""
    shift = dataclasses.replace
    return shift(
        recipe,
        init_seed=recipe.init_seed + offset,
        target_training=shift(recipe.target_training, seed=recipe.target_training.seed + offset),
        draft_training=shift(recipe.draft_training, seed=recipe.draft_training.seed + offset),
        medusa=shift(recipe.medusa, seed=recipe.medusa.seed + offset),
    )


def recipe_hash(recipe: Recipe) -> str:
    """Hash of what decides the build's output; cheap (no torch import) so a cache hit stays well under 1 s."""
    payload = {
        "recipe_version": RECIPE_VERSION,
        "recipe": dataclasses.asdict(recipe),
        "corpus_sha256": hashlib.sha256("\0".join(all_topics()).encode()).hexdigest(),
        "versions": library_versions(),
        "train_threads_override": env_int(TRAIN_THREADS_ENV),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def library_versions() -> dict[str, str]:
    """The libraries whose versions change the trained bytes (recorded in the hash and the manifest)."""
    return {pkg: importlib.metadata.version(pkg) for pkg in ("torch", "transformers", "tokenizers")}


def cpu_description() -> str:
    """The CPU and the torch kernels it runs ("Intel(R) Xeon(R) Processor, torch AVX512"): the demo weights, and
    every speed measured on them, differ from one to another, so a build and a benchmark record which it was."""
    import torch

    try:
        lines = Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines()
    except OSError:
        lines = []
    name = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "")
    return f"{name or platform.processor() or platform.machine()}, torch {torch.backends.cpu.get_cpu_capability()}"


def train_threads() -> int:
    """All cores, capped at 8 (these models are too small to use more), unless `SPECBUILD_DEMO_TRAIN_THREADS`
    says otherwise. Results are bit-identical for a given thread count; another count changes float summation
    order, so the weights (not the quality) differ, as they do on another CPU."""
    return env_int(TRAIN_THREADS_ENV) or max(1, min(os.cpu_count() or 1, 8))


def env_int(name: str) -> int | None:
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        raise SpecbuildError(
            f"{name}={value!r} is not an integer", hint=f"unset {name} or give a whole number"
        ) from None
