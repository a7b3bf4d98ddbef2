"""Small demo models, built offline and deterministically.

No model can be downloaded where specbuild is developed and tested, yet the converter, the runtime and the
speculative-decoding service need real checkpoints with a realistic draft/target acceptance rate. So we make
them: a byte-level BPE tokenizer and two Llama models (target and draft) trained for a few hundred CPU steps on
the Python reference text that ships with every Python (`pydoc_data.topics`), plus untrained Qwen2, Mistral and
GPT-2 checkpoints that exist only to cover the converter's other architectures, and Medusa heads trained on the
frozen target (FasterDecoding format, `specbuild.medusa.train`).

The draft is distilled from the target (top-k soft labels computed once after the target is trained), which
makes it agree with the target far more often than an independently trained model of the same size would.

A build is cached: `DIR/demo-models.json` records a hash of the recipe (hyper-parameters, `RECIPE_VERSION`, the
training text and the library versions); a complete build with the same hash is reused at once. Builds happen
in a sibling temporary directory that is renamed into place only when complete, under a lock, so parallel test
sessions share one build and an interrupted build never leaves a half-written DIR. Nothing in DIR names an
absolute path, so a built DIR can be moved or copied to another machine.

The trained weights differ from CPU to CPU (float kernels and summation orders differ), so nothing may rely on
the exact words these models say. To check that, two environment variables build the demo models under other
conditions, as another machine would: `SPECBUILD_DEMO_SEED_OFFSET=N` shifts every seed of the recipe and
`SPECBUILD_DEMO_TRAIN_THREADS=N` trains with N torch threads. Both are part of the cache key; they are meant
for that cross-machine check (`make test-variant`), not for users.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import importlib.metadata
import json
import math
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specbuild.errors import SpecbuildError

if TYPE_CHECKING:
    import torch
    from rich.progress import Progress
    from tokenizers import Tokenizer
    from transformers import PreTrainedModel

# Bump whenever a code change alters what a build produces (the hyper-parameters below are hashed anyway).
RECIPE_VERSION = 4  # 2: Medusa heads on the target; 3: an 8-layer target; 4: heads name their base relatively
MANIFEST_NAME = "demo-models.json"
TOKENIZER_DIR = "tokenizer"
MODEL_NAMES = ("target", "draft", "qwen2", "mistral", "gpt2")
MEDUSA_HEADS_DIR = "medusa-heads"
ALL_NAMES = (TOKENIZER_DIR, *MODEL_NAMES, MEDUSA_HEADS_DIR)
# Fixed ids 0..3: the BPE trainer puts special tokens first, in this order.
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<pad>")
UNK_ID, BOS_ID, EOS_ID, PAD_ID = range(4)
# Written into tokenizer_config.json instead of transformers 5's "TokenizersBackend", which transformers 4.x
# (the TensorRT-LLM containers) cannot resolve; both versions load "PreTrainedTokenizerFast".
TOKENIZER_CLASS = "PreTrainedTokenizerFast"
SEED_OFFSET_ENV = "SPECBUILD_DEMO_SEED_OFFSET"
TRAIN_THREADS_ENV = "SPECBUILD_DEMO_TRAIN_THREADS"
# The Medusa heads' `base_model_name_or_path`: the target beside them, relative to the heads directory, so the
# demo directory stays valid wherever it is moved.
MEDUSA_BASE_NAME = "../target"


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
    heldout_every: int = 10  # every 10th pydoc topic (sorted by name) is held out of all training
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
    eval_seq_len: int = 128
    init_seed: int = 0
    medusa: MedusaHeads = MedusaHeads()


RECIPE = Recipe()


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
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with _build_lock(out_dir):
        if not force and is_complete(out_dir, key):  # another process finished it while we waited
            return _layout(out_dir)
        _check_replaceable(out_dir)
        _remove_stale_siblings(out_dir)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.building-", dir=out_dir.parent))
        try:
            manifest = _build_into(tmp, recipe, key, progress=progress)
            _write_json(tmp / MANIFEST_NAME, manifest)
            _normalize_permissions(tmp)
            _swap_into_place(tmp, out_dir)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return _layout(out_dir)


def recipe_from_environment() -> Recipe:
    """The shipped recipe, with every seed shifted by `SPECBUILD_DEMO_SEED_OFFSET` when that is set."""
    recipe = RECIPE
    offset = _env_int(SEED_OFFSET_ENV)
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
        "corpus_sha256": hashlib.sha256("\0".join(_all_topics()).encode()).hexdigest(),
        "versions": _versions(),
        "train_threads_override": _env_int(TRAIN_THREADS_ENV),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


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
    """The pydoc topics that no demo model or tokenizer was trained on, for evaluations."""
    return _split_topics(recipe or RECIPE)[1]


def training_texts(recipe: Recipe | None = None) -> list[str]:
    """The pydoc topics the tokenizer and the models are trained on (later used for Medusa heads)."""
    return _split_topics(recipe or RECIPE)[0]


# ---------------------------------------------------------------------------------------------------- cache


def _layout(out_dir: Path) -> dict[str, Path]:
    return {name: out_dir / name for name in ALL_NAMES}


def _versions() -> dict[str, str]:
    return {pkg: importlib.metadata.version(pkg) for pkg in ("torch", "transformers", "tokenizers")}


@contextlib.contextmanager
def _build_lock(out_dir: Path) -> Iterator[None]:
    """One builder per DIR at a time: parallel test sessions wait for one build instead of each doing it."""
    lock_path = out_dir.parent / f".{out_dir.name}.lock"
    with lock_path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


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


def _remove_stale_siblings(out_dir: Path) -> None:
    """Drop leftovers of killed builds; safe because we hold the lock."""
    for pattern in (f".{out_dir.name}.building-*", f".{out_dir.name}.old-*"):
        for stale in out_dir.parent.glob(pattern):
            shutil.rmtree(stale, ignore_errors=True)


def _swap_into_place(tmp: Path, out_dir: Path) -> None:
    """Rename the finished build to DIR; an old DIR is moved aside first and deleted after."""
    old = None
    if out_dir.exists():
        old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}")
        os.replace(out_dir, old)
    os.replace(tmp, out_dir)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


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


# ---------------------------------------------------------------------------------------------------- corpus


def _all_topics() -> list[str]:
    from pydoc_data.topics import topics

    return [topics[name] for name in sorted(topics)]


def _split_topics(recipe: Recipe) -> tuple[list[str], list[str]]:
    texts = _all_topics()
    held = set(range(0, len(texts), recipe.heldout_every))
    return [t for i, t in enumerate(texts) if i not in held], [t for i, t in enumerate(texts) if i in held]


def _token_stream(tokenizer: Tokenizer, texts: list[str]) -> torch.Tensor:
    """All documents as one `<s> doc </s> <s> doc </s> ...` id stream, which training samples windows from."""
    import torch

    ids: list[int] = []
    for encoding in tokenizer.encode_batch(texts):
        ids += [BOS_ID, *encoding.ids, EOS_ID]
    return torch.tensor(ids, dtype=torch.long)


# ---------------------------------------------------------------------------------------------------- build


def _train_threads() -> int:
    """All cores, capped at 8 (these models are too small to use more), unless `SPECBUILD_DEMO_TRAIN_THREADS`
    says otherwise. Results are bit-identical for a given thread count; another count changes float summation
    order, so the weights (not the quality) differ, as they do on another CPU."""
    return _env_int(TRAIN_THREADS_ENV) or max(1, min(os.cpu_count() or 1, 8))


def _env_int(name: str) -> int | None:
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        raise SpecbuildError(
            f"{name}={value!r} is not an integer", hint=f"unset {name} or give a whole number"
        ) from None


@contextlib.contextmanager
def _deterministic_torch() -> Iterator[None]:
    """Fixed threads, deterministic kernels and a private RNG; the caller's torch settings are restored."""
    import torch
    from transformers.utils import logging as hf_logging

    threads = torch.get_num_threads()
    deterministic = torch.are_deterministic_algorithms_enabled()
    hf_bars = hf_logging.is_progress_bar_enabled()
    torch.set_num_threads(_train_threads())
    torch.use_deterministic_algorithms(True)
    hf_logging.disable_progress_bar()  # "Writing model shards" bars would interleave with ours
    try:
        with torch.random.fork_rng(devices=[]):
            yield
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)
        if hf_bars:
            hf_logging.enable_progress_bar()


def _build_into(root: Path, recipe: Recipe, key: str, *, progress: bool) -> dict[str, Any]:
    """Write the tokenizer, all models and the Medusa heads below `root` (renamed into place afterwards);
    returns the manifest (metrics, file hashes)."""
    started = time.perf_counter()
    train_texts, held_texts = _split_topics(recipe)
    with _deterministic_torch(), _progress(progress) as bars:
        tokenizer = _train_tokenizer(train_texts, recipe.vocab_size)
        _save_tokenizer(tokenizer, root / TOKENIZER_DIR, recipe.max_positions)
        train_ids = _token_stream(tokenizer, train_texts)
        held_ids = _token_stream(tokenizer, held_texts)

        t0 = time.perf_counter()
        target = _llama(recipe, recipe.target, seed=recipe.init_seed)
        target_loss = _train_target(target, train_ids, recipe.target_training, bars)
        target_seconds = time.perf_counter() - t0

        t0 = time.perf_counter()
        draft = _llama(recipe, recipe.draft, seed=recipe.init_seed + 1)
        draft_loss = _train_draft(draft, target, train_ids, recipe, bars)
        draft_seconds = time.perf_counter() - t0

        evaluation = _evaluate(target, draft, held_ids, recipe.eval_seq_len)
        models: dict[str, PreTrainedModel] = {"target": target, "draft": draft, **_untrained_models(recipe)}
        for name, model in models.items():
            _save_model(model, root / name, root / TOKENIZER_DIR)
        medusa_metrics = _train_medusa_heads(root, recipe, train_texts, held_texts, bars)
    metrics = {
        "target": {"final_train_loss": target_loss, "train_seconds": round(target_seconds, 1)},
        "draft": {"final_train_loss": draft_loss, "train_seconds": round(draft_seconds, 1)},
        MEDUSA_HEADS_DIR: medusa_metrics,
        **evaluation,
        "heldout_tokens": int(held_ids.numel()),
        "train_tokens": int(train_ids.numel()),
        "build_seconds": round(time.perf_counter() - started, 1),
        "torch_threads": _train_threads(),
    }
    if progress:
        _print_summary(metrics)
    return {
        "recipe_hash": key,
        "recipe_version": RECIPE_VERSION,
        "recipe": dataclasses.asdict(recipe),
        "versions": _versions(),
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
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (
        TextColumn("{task.description:<8}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]:.3f}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=Console(stderr=True)) as bars:
        yield bars


def _print_summary(metrics: dict[str, Any]) -> None:
    from rich.console import Console

    Console(stderr=True).print(
        f"target loss {metrics['target_heldout_loss']:.3f}, draft loss {metrics['draft_heldout_loss']:.3f} "
        f"(held-out), draft/target top-1 agreement {metrics['top1_agreement']:.1%}, "
        f"Medusa head 0 top-1 {metrics[MEDUSA_HEADS_DIR]['head0_top1']:.1%}, "
        f"built in {metrics['build_seconds']:.0f} s",
        highlight=False,
    )


# ---------------------------------------------------------------------------------------------------- tokenizer


def _train_tokenizer(texts: list[str], vocab_size: int) -> Tokenizer:
    """Byte-level BPE: every string, any script, encodes without <unk> and decodes back exactly."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    if [tokenizer.token_to_id(token) for token in SPECIAL_TOKENS] != list(range(len(SPECIAL_TOKENS))):
        raise RuntimeError(f"the BPE trainer did not give {SPECIAL_TOKENS} the ids 0..{len(SPECIAL_TOKENS) - 1}")
    return tokenizer


def _save_tokenizer(tokenizer: Tokenizer, out: Path, max_length: int) -> None:
    """Save as a transformers fast tokenizer that AutoTokenizer loads offline (transformers 4.x and 5.x)."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token=SPECIAL_TOKENS[UNK_ID],
        bos_token=SPECIAL_TOKENS[BOS_ID],
        eos_token=SPECIAL_TOKENS[EOS_ID],
        pad_token=SPECIAL_TOKENS[PAD_ID],
        model_max_length=max_length,
    )
    fast.save_pretrained(str(out))
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = TOKENIZER_CLASS
    _write_json(config_path, config)


# ---------------------------------------------------------------------------------------------------- models


def _common_config(recipe: Recipe) -> dict[str, Any]:
    return {
        "vocab_size": recipe.vocab_size,
        "max_position_embeddings": recipe.max_positions,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "pad_token_id": PAD_ID,
    }


def _llama_family_config(recipe: Recipe, shape: Shape) -> dict[str, Any]:
    return {
        **_common_config(recipe),
        **dataclasses.asdict(shape),
        "rope_theta": recipe.rope_theta,
        "rms_norm_eps": 1e-5,
    }


def _seeded(seed: int) -> None:
    import torch

    torch.manual_seed(seed)


def _llama(recipe: Recipe, shape: Shape, *, seed: int) -> PreTrainedModel:
    from transformers import LlamaConfig, LlamaForCausalLM

    _seeded(seed)
    config = LlamaConfig(**_llama_family_config(recipe, shape), tie_word_embeddings=False)
    return LlamaForCausalLM(config)


def _untrained_models(recipe: Recipe) -> dict[str, PreTrainedModel]:
    """Random models for converter coverage, with 1-D weights (biases, norms) perturbed away from 0 and 1 so
    that a converter mixing them up produces visibly wrong logits."""
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        MistralConfig,
        MistralForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    small = recipe.small
    _seeded(recipe.init_seed + 10)
    qwen2 = Qwen2ForCausalLM(Qwen2Config(**_llama_family_config(recipe, small), tie_word_embeddings=True))
    _seeded(recipe.init_seed + 11)
    mistral = MistralForCausalLM(
        MistralConfig(
            **_llama_family_config(recipe, small), sliding_window=recipe.sliding_window, tie_word_embeddings=False
        )
    )
    _seeded(recipe.init_seed + 12)
    gpt2 = GPT2LMHeadModel(
        GPT2Config(
            **_common_config(recipe),
            n_positions=recipe.max_positions,
            n_embd=small.hidden_size,
            n_layer=small.num_hidden_layers,
            n_head=small.num_attention_heads,
            n_inner=4 * small.hidden_size,
        )
    )
    models = {"qwen2": qwen2, "mistral": mistral, "gpt2": gpt2}
    for offset, model in enumerate(models.values()):
        _perturb_vectors(model, seed=recipe.init_seed + 20 + offset)
    return models


def _perturb_vectors(model: PreTrainedModel, *, seed: int) -> None:
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, param in sorted(model.named_parameters()):
            if param.ndim == 1:
                param.add_(0.1 * torch.randn(param.shape, generator=generator))


def _save_model(model: PreTrainedModel, out: Path, tokenizer_dir: Path) -> None:
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


# ---------------------------------------------------------------------------------------------------- training


def _lr_factor(step: int, settings: Training) -> float:
    """Linear warmup, then cosine decay to `final_lr_frac` of the peak."""
    warmup = max(1, round(settings.warmup * settings.steps))
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, settings.steps - warmup))
    floor = settings.final_lr_frac
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def _optimizer(model: PreTrainedModel, settings: Training) -> tuple[Any, Any]:
    import torch

    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": settings.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=settings.lr,
        betas=(0.9, 0.95),
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: _lr_factor(step, settings))
    return optimizer, scheduler


def _step(model: PreTrainedModel, loss: torch.Tensor, optimizer: Any, scheduler: Any, clip: float) -> float:
    import torch

    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return float(loss.detach())


def _track(bars: Progress | None, name: str, total: int) -> Any:
    return None if bars is None else bars.add_task(name, total=total, loss=float("nan"))


def _advance(bars: Progress | None, task: Any, loss: float) -> None:
    if bars is not None:
        bars.update(task, advance=1, loss=loss)


def _train_target(model: PreTrainedModel, ids: torch.Tensor, settings: Training, bars: Progress | None) -> float:
    """Plain next-token training on random windows of the training text; returns the last step's loss."""
    import torch
    import torch.nn.functional as F

    model.train()
    optimizer, scheduler = _optimizer(model, settings)
    generator = torch.Generator().manual_seed(settings.seed)
    span = settings.seq_len + 1
    task = _track(bars, "target", settings.steps)
    loss_value = float("nan")
    for _ in range(settings.steps):
        starts = torch.randint(0, ids.numel() - span, (settings.batch_size,), generator=generator)
        batch = torch.stack([ids[s : s + span] for s in starts.tolist()])
        logits = model(input_ids=batch[:, :-1]).logits
        loss = F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
        loss_value = _step(model, loss, optimizer, scheduler, settings.grad_clip)
        _advance(bars, task, loss_value)
    model.eval()
    return loss_value


def _windows(ids: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Non-overlapping windows of seq_len + 1 tokens (inputs plus the next token), [N, seq_len + 1]."""
    span = seq_len + 1
    count = (ids.numel() - 1) // seq_len
    return ids[: count * seq_len + 1].unfold(0, span, seq_len)


def _teacher_top_k(
    teacher: PreTrainedModel, inputs: torch.Tensor, top_k: int, batch_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The teacher's top-k tokens and their renormalised probabilities at every position, computed once (a
    forward pass per window) instead of at every draft step."""
    import torch

    indices, probs = [], []
    with torch.inference_mode():
        for chunk in inputs.split(batch_size):
            values, idx = teacher(input_ids=chunk).logits.topk(top_k, dim=-1)
            indices.append(idx.int())  # int32 halves the memory; widened again per batch
            probs.append(values.softmax(dim=-1))
    return torch.cat(indices), torch.cat(probs)


def _train_draft(
    draft: PreTrainedModel, target: PreTrainedModel, ids: torch.Tensor, recipe: Recipe, bars: Progress | None
) -> float:
    """Distil the draft: cross-entropy against the target's top-k distribution (weight `distill_weight`)
    plus ordinary next-token loss. Training on what the target predicts is what raises acceptance."""
    import torch
    import torch.nn.functional as F

    settings = recipe.draft_training
    generator = torch.Generator().manual_seed(settings.seed)
    windows = _windows(ids, settings.seq_len)
    needed = min(windows.shape[0], settings.steps * settings.batch_size)
    windows = windows[torch.randperm(windows.shape[0], generator=generator)[:needed]]
    teacher_idx, teacher_prob = _teacher_top_k(target, windows[:, :-1], recipe.distill_top_k, settings.batch_size)

    draft.train()
    optimizer, scheduler = _optimizer(draft, settings)
    task = _track(bars, "draft", settings.steps)
    epochs = -(-settings.steps * settings.batch_size // needed)
    order = torch.cat([torch.randperm(needed, generator=generator) for _ in range(epochs)])
    loss_value = float("nan")
    for step in range(settings.steps):
        pick = order[step * settings.batch_size : (step + 1) * settings.batch_size]
        batch = windows[pick]
        log_probs = draft(input_ids=batch[:, :-1]).logits.log_softmax(dim=-1)
        soft = -(teacher_prob[pick] * log_probs.gather(-1, teacher_idx[pick].long())).sum(-1).mean()
        hard = F.nll_loss(log_probs.flatten(0, 1), batch[:, 1:].flatten())
        loss = recipe.distill_weight * soft + (1 - recipe.distill_weight) * hard
        loss_value = _step(draft, loss, optimizer, scheduler, settings.grad_clip)
        _advance(bars, task, loss_value)
    draft.eval()
    return loss_value


def _train_medusa_heads(
    root: Path, recipe: Recipe, train_texts: list[str], held_texts: list[str], bars: Progress | None
) -> dict[str, float]:
    """Heads on the saved target, trained on the same text. config.json names the target relative to the heads
    (`MEDUSA_BASE_NAME`), neither the temporary build directory nor an absolute path that a copy would break."""
    from specbuild.medusa.train import train_medusa_heads

    settings = recipe.medusa
    started = time.perf_counter()
    metrics = train_medusa_heads(
        root / "target",
        root / MEDUSA_HEADS_DIR,
        num_heads=settings.num_heads,
        num_layers=settings.num_layers,
        steps=settings.steps,
        seq_len=settings.seq_len,
        batch_size=settings.batch_size,
        lr=settings.lr,
        seed=settings.seed,
        texts=train_texts,
        eval_texts=held_texts,
        base_model_name_or_path=MEDUSA_BASE_NAME,
        progress=bars if bars is not None else False,
    )
    return {**metrics, "step_seconds": round(time.perf_counter() - started, 1)}  # with loading, evaluation, saving


def _evaluate(
    target: PreTrainedModel, draft: PreTrainedModel, held_ids: torch.Tensor, seq_len: int
) -> dict[str, float]:
    """Held-out next-token losses and how often the draft's greedy token equals the target's (teacher-forced
    on real text: a proxy for the per-token acceptance rate of greedy speculative decoding)."""
    import torch
    import torch.nn.functional as F

    windows = _windows(held_ids, seq_len)
    inputs, labels = windows[:, :-1], windows[:, 1:].flatten()
    with torch.inference_mode():
        target_logits = target(input_ids=inputs).logits.flatten(0, 1)
        draft_logits = draft(input_ids=inputs).logits.flatten(0, 1)
    return {
        "target_heldout_loss": round(float(F.cross_entropy(target_logits, labels)), 4),
        "draft_heldout_loss": round(float(F.cross_entropy(draft_logits, labels)), 4),
        "top1_agreement": round(float((target_logits.argmax(-1) == draft_logits.argmax(-1)).float().mean()), 4),
        "target_heldout_top1_accuracy": round(float((target_logits.argmax(-1) == labels).float().mean()), 4),
    }
