"""Medusa heads (FasterDecoding format) + a base -> one TensorRT-LLM `MedusaForCausalLM` checkpoint.

The head file is read as `specbuild.medusa.heads_format` describes (the FasterDecoding format; heads and layers
counted from the keys). Output names, split dims and config fields follow NVIDIA/TensorRT-LLM 1.x
`tensorrt_llm/models/medusa/weight.py` and `examples/medusa/convert_checkpoint.py` (@b93e14ca):
`medusa_heads.{h}.medusa_layers.{l}.linear.{weight,bias}` and `medusa_heads.{h}.lm_head.weight`, all split on
dim 0 under tensor parallelism with no vocab padding.

The heads join the base checkpoint's tensors as sources named `medusa:<key>`, so the ordinary pull mapping,
coverage check and streaming writer handle them; `MedusaArchitecture` wraps the base family's module. Which bases
TensorRT-LLM's Medusa takes (Llama, Mistral, Mixtral, Qwen2) is `contracts.family_support`'s, which
`pipeline.with_medusa_heads` asks before wrapping.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

from specbuild.contracts.model_fit import MEDUSA_FIT_HINT, medusa_fit_problem, medusa_head_shape
from specbuild.convert.architectures.base import Architecture
from specbuild.convert.hf_checkpoint import HFCheckpoint
from specbuild.convert.mapping import Shape, TensorMapping
from specbuild.convert.sharding import Rank, split
from specbuild.errors import CheckpointError
from specbuild.medusa.heads_format import MODULE_PREFIX, WEIGHTS_NAME, count_heads, heads_file
from specbuild.pickle_weights import is_pickle

PREFIX = "medusa:"


def attach_heads(checkpoint: HFCheckpoint, heads_dir: Path, *, allow_pickle: bool) -> tuple[int, int]:
    """Add the head file's tensors to `checkpoint` as `medusa:` sources (safetensors mapped lazily, like the base's
    weights); return (heads, layers) counted from the keys. Heads of another width or vocabulary than the base's
    are refused here, naming the head file (`specbuild validate` reports it at medusa.heads), rather than as a
    shape mismatch of the merged checkpoint."""
    path = heads_file(heads_dir)
    if is_pickle(path):
        names = checkpoint.include_pickle(path, PREFIX, strip=MODULE_PREFIX, allow_pickle=allow_pickle,
                                          safe_format=WEIGHTS_NAME)
    else:
        names = checkpoint.include_safetensors(path, PREFIX, strip=MODULE_PREFIX)
    counts = count_heads(names, heads_dir)
    hidden, vocab = checkpoint.config.get("hidden_size"), checkpoint.config.get("vocab_size")
    if isinstance(hidden, int) and isinstance(vocab, int):  # else the base's own config check names the field
        shapes = {name: checkpoint.infos[PREFIX + name].shape for name in names}
        problem = medusa_fit_problem(shapes, hidden, vocab, checkpoint.directory)
        if problem is not None:
            raise CheckpointError(f"{path}: {problem}", hint=MEDUSA_FIT_HINT)
    return counts


class MedusaArchitecture(Architecture):
    """A base plus Medusa heads; delegates everything about the base to its module."""

    def __init__(self, base: Architecture, num_heads: int, head_layers: int, tree_nodes: int) -> None:
        super().__init__(base.config, base.config_path)
        self.base, self.num_heads, self.head_layers, self.tree_nodes = base, num_heads, head_layers, tree_nodes
        self.hidden = base.field("hidden_size")
        self.vocab = base.field("vocab_size")

    @property
    def num_layers(self) -> int:
        """The base decoder's layers (what pipeline parallelism splits)."""
        return self.base.num_layers

    def source_dtype_name(self) -> str | None:
        return self.base.source_dtype_name()

    def is_ignored(self, name: str) -> bool:
        return self.base.is_ignored(name)

    def bind_sources(self, names: set[str]) -> None:
        self.base.bind_sources(names)

    def check_source_values(self, checkpoint: HFCheckpoint) -> None:
        self.base.check_source_values(checkpoint)

    def _heads(self) -> list[tuple[str, str, Shape]]:
        """(source name, TensorRT-LLM name, full shape) per head tensor."""
        h, v, layers = self.hidden, self.vocab, self.head_layers
        items: list[tuple[str, str, Shape]] = []
        for head in range(self.num_heads):
            for layer in range(layers):
                for kind in ("weight", "bias"):
                    items.append((f"{PREFIX}{head}.{layer}.linear.{kind}",
                                  f"medusa_heads.{head}.medusa_layers.{layer}.linear.{kind}",
                                  medusa_head_shape(f"linear.{kind}", h, v)))
            items.append((f"{PREFIX}{head}.{layers}.weight", f"medusa_heads.{head}.lm_head.weight",
                          medusa_head_shape("weight", h, v)))
        return items

    def parallelism_problems(self, tp_size: int, pp_size: int) -> list[str]:
        problems = self.base.parallelism_problems(tp_size, pp_size)
        if self.vocab % tp_size:
            problems.append(f"tp_size {tp_size} does not divide vocab_size {self.vocab} (Medusa heads are not padded)")
        if self.hidden % tp_size:
            problems.append(f"tp_size {tp_size} does not divide hidden_size {self.hidden}")
        return problems

    def mapping(self, rank: Rank) -> TensorMapping:
        """The base's tensors, then (on the last pipeline stage) every head tensor split on dim 0."""
        mapping = self.base.mapping(rank)
        if rank.is_last_stage:
            column = partial(split, rank=rank, dim=0)
            for src, dst, shape in self._heads():
                mapping.add(dst, (shape[0] // rank.tp_size, *shape[1:]), {src: shape}, column)
        return mapping

    def trtllm_config(self, dtype: str, tp_size: int, pp_size: int) -> dict[str, Any]:
        config = self.base.trtllm_config(dtype, tp_size, pp_size)
        config.update(
            architecture="MedusaForCausalLM",
            model_type=self.config.get("model_type", "llama"),
            num_medusa_heads=self.num_heads,
            num_medusa_layers=self.head_layers,
            max_draft_len=self.tree_nodes,  # the draft tokens a step verifies: every node of the tree
        )
        return config
