"""A self-draft: the target's first L decoder layers, its final norm and its LM head, as one ordinary checkpoint.

No new weights: the base family's own mapping (`Architecture.mapping`) is run over L layers instead of all of
them, so the draft's tensors are the target's, named and sharded exactly as the target's conversion writes them,
and config.json is the target's with `num_hidden_layers: L`. The layers past L are the only HF tensors left out,
and they are declared ignored, so the coverage check still proves every other tensor is used. The result is a
draft checkpoint like any other: the draft-target build plans, the engines, the BLS and the reference runtime
take it unchanged (`draft.source: target_layers` in the spec).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from specbuild.convert.architectures.base import Architecture
from specbuild.convert.mapping import TensorMapping
from specbuild.convert.sharding import Rank
from specbuild.errors import CheckpointError

if TYPE_CHECKING:
    from specbuild.convert.hf_checkpoint import HFCheckpoint


def self_draft_problem(layers: int, target_layers: int) -> str | None:
    """Why a self-draft of `layers` layers cannot be made from a target of `target_layers`, or None."""
    if layers < 1:
        return f"draft.layers must be at least 1 (got {layers})"
    if layers >= target_layers:
        return (f"draft.layers {layers} is not less than the target's num_hidden_layers {target_layers}: the draft "
                f"would be the whole target and could not make decoding faster; use 1 to {target_layers - 1}")
    return None


class SelfDraftArchitecture(Architecture):
    """The base family's module over its first `layers` decoder layers; everything else is delegated to it."""

    def __init__(self, base: Architecture, layers: int) -> None:
        super().__init__(base.config, base.config_path)
        problem = self_draft_problem(layers, base.num_layers)
        if problem is not None:
            raise CheckpointError(f"{base.config_path}: {problem}",
                                  hint="set draft.layers in the spec to fewer layers than the target has")
        self.base, self.layers = base, layers
        self._dropped: frozenset[str] | None = None

    @property
    def num_layers(self) -> int:
        return self.layers

    @property
    def target_layers(self) -> int:
        """The whole target's decoder layers."""
        return self.base.num_layers

    def source_dtype_name(self) -> str | None:
        return self.base.source_dtype_name()

    def bind_sources(self, names: set[str]) -> None:
        self.base.bind_sources(names)
        self._dropped = None  # the base may have renamed its sources (GPT-2's prefix): recompute

    def dropped_sources(self) -> frozenset[str]:
        """The target's tensors the draft does not use: exactly those of the layers past L (the full mapping's
        sources less the truncated mapping's)."""
        if self._dropped is None:
            full = self.base.mapping(Rank(0, 1, 1, self.base.num_layers)).source_shapes()
            kept = self.mapping(Rank(0, 1, 1, self.layers)).source_shapes()
            self._dropped = frozenset(set(full) - set(kept))
        return self._dropped

    def is_ignored(self, name: str) -> bool:
        return self.base.is_ignored(name) or name in self.dropped_sources()

    def check_source_values(self, checkpoint: HFCheckpoint) -> None:
        self.base.check_source_values(checkpoint)

    def parallelism_problems(self, tp_size: int, pp_size: int) -> list[str]:
        # The base's tensor-parallel rules (pp=1 skips its layer count, which is the whole target's); the pipeline
        # split is over the draft's L layers.
        problems = self.base.parallelism_problems(tp_size, 1)
        if pp_size > self.layers:
            problems.append(f"pp_size {pp_size} exceeds the self-draft's {self.layers} layers (draft.layers)")
        return problems

    def mapping(self, rank: Rank) -> TensorMapping:
        """The base's mapping for a rank of an L-layer grid: `rank.layers` never reaches past L, the first stage
        holds the embedding and the last the final norm and LM head, as in the target's own conversion."""
        return self.base.mapping(rank)

    def trtllm_config(self, dtype: str, tp_size: int, pp_size: int) -> dict[str, Any]:
        config = self.base.trtllm_config(dtype, tp_size, pp_size)
        config["num_hidden_layers"] = self.layers
        return config
