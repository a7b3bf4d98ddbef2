"""The contract every architecture module fulfils, and the registry that finds it.

An architecture reads the HF `config.json`, declares each rank's TensorRT-LLM tensors once, in one loop
(`mapping`: name, shape, HF sources with their shapes, combine function), and says what the TensorRT-LLM
`config.json` contains. The HF tensors a checkpoint must hold, each rank's model definition and its rules are
read off that mapping; the shared driver in `specbuild.convert.pipeline` does the rest. A new family is one
small module with a `@register`ed class; its exceptions (a tied head, transposed weights, biases, the padded
vocabulary, repeated KV heads) are hooks and combine functions, not a second list of names.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from specbuild import __version__
from specbuild.convert.mapping import Shape, TensorMapping
from specbuild.convert.sharding import Rank, padded_vocab, split_padded
from specbuild.errors import CheckpointError

if TYPE_CHECKING:
    from specbuild.convert.hf_checkpoint import HFCheckpoint

REGISTRY: dict[str, type[Architecture]] = {}
#: Architectures a family module knows and refuses: name -> (why, what to do instead).
REFUSED: dict[str, tuple[str, str]] = {}


def register(cls: type[Architecture]) -> type[Architecture]:
    for name in cls.hf_architectures:
        REGISTRY[name] = cls
    return cls


def refuse(names: tuple[str, ...], reason: str, hint: str) -> None:
    """Record HF architectures a family module knows but does not convert, so the refusal says why."""
    for name in names:
        REFUSED[name] = (reason, hint)


def architecture_for(config: dict[str, Any], config_path: Path) -> Architecture:
    """Instantiate the registered architecture named by `architectures[0]` of an HF config."""
    names = config.get("architectures") or []
    name = names[0] if names else None
    if name in REFUSED:
        reason, hint = REFUSED[name]
        raise CheckpointError(f"{config_path}: architecture {name!r} is not supported: {reason}", hint=hint)
    if name not in REGISTRY:
        raise CheckpointError(
            f"{config_path}: architecture {name!r} is not supported",
            hint=f"supported: {', '.join(sorted(REGISTRY))}",
        )
    return REGISTRY[name](config, config_path)


class Architecture:
    """Base class: config parsing helpers and the hooks subclasses fill in."""

    hf_architectures: ClassVar[tuple[str, ...]] = ()
    #: HF tensors that may be present and are deliberately not converted (regexes).
    ignored_patterns: ClassVar[tuple[str, ...]] = ()

    def __init__(self, config: dict[str, Any], config_path: Path) -> None:
        self.config = config
        self.config_path = config_path
        self.hf_architecture: str = config["architectures"][0]

    # -- config helpers -------------------------------------------------------------------------------------
    def field(self, *names: str, default: Any = ..., kind: Callable[[Any], Any] = int) -> Any:
        """The first of `names` present in config.json, converted by `kind`; a clear error if required."""
        for name in names:
            if self.config.get(name) is not None:
                try:
                    return kind(self.config[name])
                except (TypeError, ValueError) as err:
                    raise CheckpointError(
                        f"{self.config_path}: field {name!r} has an invalid value {self.config[name]!r}"
                    ) from err
        if default is ...:
            raise CheckpointError(f"{self.config_path}: required field {names[0]!r} is missing")
        return default

    @property
    def num_layers(self) -> int:
        raise NotImplementedError

    def source_dtype_name(self) -> str | None:
        """The checkpoint's declared dtype (transformers 5 writes `dtype`, 4.x `torch_dtype`)."""
        value = self.config.get("dtype") or self.config.get("torch_dtype")
        return str(value) if value else None

    def is_ignored(self, name: str) -> bool:
        return any(re.fullmatch(p, name) for p in self.ignored_patterns)

    def bind_sources(self, names: set[str]) -> None:
        """Adapt to naming variants seen in the checkpoint's tensor names (default: none)."""

    def check_source_values(self, checkpoint: HFCheckpoint) -> None:
        """Checks that need tensor data (default: none): run by `plan_conversion` before anything is written."""

    def check_tied_head(self, checkpoint: HFCheckpoint, embedding: str, head: str, why: str, hint: str) -> None:
        """Refuse a checkpoint whose `head` tensor (a trained LM head) would be dropped for `embedding`: both are
        read (memory-mapped, block by block, stopping at the first difference); identical tensors are fine."""
        if head not in checkpoint.infos or embedding not in checkpoint.infos:
            return
        first = _first_difference(checkpoint.tensor(embedding), checkpoint.tensor(head))
        checkpoint.release(embedding)
        checkpoint.release(head)
        if first is None:
            return
        raise CheckpointError(
            f"{self.config_path}: {why}, but {checkpoint.infos[head].path.name} holds its own {head}, which differs "
            f"from {embedding} ({first}); converting would serve the embedding as the LM head and drop the trained "
            "one",
            hint=hint,
        )

    # -- hooks -----------------------------------------------------------------------------------------------
    def parallelism_problems(self, tp_size: int, pp_size: int) -> list[str]:
        """Reasons the tp x pp grid cannot hold this model (empty when it can)."""
        problems = []
        if pp_size > self.num_layers:
            problems.append(f"pp_size {pp_size} exceeds num_hidden_layers {self.num_layers}")
        return problems

    def mapping(self, rank: Rank) -> TensorMapping:
        """Every TensorRT-LLM tensor `rank` holds, in write order, each with its HF sources (full shapes) and
        the function that makes it from them."""
        raise NotImplementedError

    def source_shapes(self) -> dict[str, Shape]:
        """Every HF tensor the config implies, with its shape: the sources of the unsharded (tp=1, pp=1) mapping,
        which holds every layer."""
        return self.mapping(Rank(0, 1, 1, self.num_layers)).source_shapes()

    @staticmethod
    def add_lm_head(mapping: TensorMapping, rank: Rank, source: str, vocab: int, hidden: int) -> None:
        """The lm_head: `source` (vocab, hidden) zero-padded to a multiple of tp rows, this rank's dim-0 part."""
        rows = padded_vocab(vocab, rank.tp_size)
        mapping.add("lm_head.weight", (rows // rank.tp_size, hidden), {source: (vocab, hidden)},
                    partial(split_padded, rank=rank, rows=rows))

    def trtllm_config(self, dtype: str, tp_size: int, pp_size: int) -> dict[str, Any]:
        """The TensorRT-LLM `config.json`: the keyword arguments of `PretrainedConfig` and the family's config class
        (NVIDIA/TensorRT-LLM 1.x, tensorrt_llm/models/modeling_utils.py and models/<family>/config.py)."""
        raise NotImplementedError

    # -- shared config pieces --------------------------------------------------------------------------------
    @staticmethod
    def common_config(dtype: str, tp_size: int, pp_size: int) -> dict[str, Any]:
        """Fields every TensorRT-LLM `PretrainedConfig` carries, with 1.x defaults written out."""
        return {
            "producer": {"name": "specbuild", "version": __version__},
            "dtype": dtype,
            "logits_dtype": "float32",
            "runtime_defaults": None,
            # A 1.x Mapping accepts only constructor kwargs (`Mapping.from_dict` is `Mapping(**d)`,
            # NVIDIA/TensorRT-LLM 1.x tensorrt_llm/mapping.py); this minimal set is always safe.
            "mapping": {"world_size": tp_size * pp_size, "tp_size": tp_size, "pp_size": pp_size},
            "quantization": {
                "quant_algo": None,
                "kv_cache_quant_algo": None,
                "group_size": 128,
                "smoothquant_val": 0.5,
                "clamp_val": None,
                "use_meta_recipe": False,
                "has_zero_point": False,
                "pre_quant_scale": False,
                "exclude_modules": None,
            },
            "use_parallel_embedding": False,
            "embedding_sharding_dim": 0,
            "qk_layernorm": False,
        }


def _first_difference(a: Any, b: Any, rows: int = 4096) -> str | None:
    """Where two tensors first differ (a short phrase), or None when they are equal."""
    if tuple(a.shape) != tuple(b.shape):
        return f"shape {list(b.shape)} against {list(a.shape)}"
    for start in range(0, a.shape[0], rows):
        x, y = a[start:start + rows], b[start:start + rows]
        if x.dtype != y.dtype:
            y = y.to(x.dtype)
        if not bool((x == y).all()):
            row = start + int((x != y).reshape(x.shape[0], -1).any(dim=1).nonzero()[0])
            return f"first at row {row}"
    return None
