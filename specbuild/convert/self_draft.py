"""A self-draft: the target's first L decoder layers, its final norm and its LM head, as one ordinary checkpoint.

No new weights: the base family's own mapping (`Architecture.mapping`) is run over L layers instead of all of
them, so the draft's tensors are the target's, named and sharded exactly as the target's conversion writes them,
and config.json is the target's with `num_hidden_layers: L`. The layers past L are the only HF tensors left out,
and they are declared ignored, so the coverage check still proves every other tensor is used. The result is a
draft checkpoint like any other: the draft-target build plans, the engines, the BLS and the reference runtime
take it unchanged (`draft.source: target_layers` in the spec).

With an adapter (`draft.adapter`, `specbuild draft train`; format in `specbuild.self_draft.adapter_format`) the
draft has L + 1 layers: the target's first L, then the adapter in layer L's place. The adapter's tensors carry the
target's own HF names for layer L and join the checkpoint as sources named `adapter:<name>`, so the family's own
mapping shards them like any layer, the coverage check proves each is used, and the target's own layer L is
declared ignored with the layers after it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from specbuild.convert.architectures.base import Architecture
from specbuild.convert.mapping import TensorMapping
from specbuild.convert.sharding import Rank
from specbuild.errors import CheckpointError
from specbuild.self_draft.adapter_format import AdapterInfo, adapter_problem, read_adapter

if TYPE_CHECKING:
    from specbuild.convert.hf_checkpoint import HFCheckpoint
    from specbuild.convert.request import ConvertRequest

ADAPTER_PREFIX = "adapter:"


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

    def __init__(self, base: Architecture, layers: int, adapter: AdapterInfo | None = None) -> None:
        super().__init__(base.config, base.config_path)
        problem = self_draft_problem(layers, base.num_layers)
        if problem is not None:
            raise CheckpointError(f"{base.config_path}: {problem}",
                                  hint="set draft.layers in the spec to fewer layers than the target has")
        self.base, self.layers, self.adapter = base, layers, adapter
        self._dropped: frozenset[str] | None = None

    @property
    def num_layers(self) -> int:
        """The draft's layers: L, or L + 1 with the adapter as the last."""
        return self.layers + (self.adapter is not None)

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
            kept = self.base.mapping(Rank(0, 1, 1, self.layers)).source_shapes()
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
        if pp_size > self.num_layers:
            problems.append(f"pp_size {pp_size} exceeds the self-draft's {self.num_layers} layers (draft.layers"
                            + (" and the adapter)" if self.adapter is not None else ")"))
        return problems

    def mapping(self, rank: Rank) -> TensorMapping:
        """The base's mapping for a rank of the draft's grid: `rank.layers` never reaches past the draft's layers,
        the first stage holds the embedding and the last the final norm and LM head, as in the target's own
        conversion; the adapter's tensors are read for layer L's."""
        mapping = self.base.mapping(rank)
        if self.adapter is None:
            return mapping
        adapter_sources = set(self.adapter_shapes())
        for name, target in list(mapping.targets.items()):
            if adapter_sources & set(target.sources):
                mapping.targets[name] = replace(
                    target, sources={ADAPTER_PREFIX + s: shape for s, shape in target.sources.items()})
        return mapping

    def adapter_shapes(self) -> dict[str, tuple[int, ...]]:
        """The HF tensors (name -> shape) of the target's layer L: what an adapter must hold, exactly."""
        full = self.base.mapping(Rank(0, 1, 1, self.layers + 1)).source_shapes()
        kept = self.base.mapping(Rank(0, 1, 1, self.layers)).source_shapes()
        return {name: shape for name, shape in full.items() if name not in kept}

    def check_adapter(self) -> None:
        """Every tensor of the target's layer L in the adapter, with its shape, and nothing else."""
        assert self.adapter is not None
        expected, found, path = self.adapter_shapes(), self.adapter.shapes, self.adapter.weights
        for name, shape in expected.items():
            if name not in found:
                raise CheckpointError(f"{path}: tensor {name!r} is missing (an adapter holds every tensor of the "
                                      f"target's layer {self.layers})")
            if tuple(found[name]) != tuple(shape):
                raise CheckpointError(f"{path}: tensor {name!r} has shape {list(found[name])}, the target's layer "
                                      f"{self.layers} needs {list(shape)}")
        unknown = sorted(set(found) - set(expected))
        if unknown:
            raise CheckpointError(f"{path}: tensor {unknown[0]!r} is not a tensor of the target's layer {self.layers}")

    def trtllm_config(self, dtype: str, tp_size: int, pp_size: int) -> dict[str, Any]:
        config = self.base.trtllm_config(dtype, tp_size, pp_size)
        config["num_hidden_layers"] = self.num_layers
        return config


def self_draft_architecture(base: Architecture, checkpoint: HFCheckpoint, request: ConvertRequest) -> Architecture:
    """The self-draft of `request` over the target's `base` module; an adapter's file is checked against the
    target's layer L and joins `checkpoint` as `adapter:` sources before anything is planned."""
    assert request.self_draft_layers is not None
    if request.self_draft_adapter is None:
        return SelfDraftArchitecture(base, request.self_draft_layers)
    from specbuild.contracts.family_support import family, refusal

    refused = refusal(base.hf_architecture, "self_draft_adapter", "specbuild")
    if refused is not None:
        raise CheckpointError(f"{request.source / 'config.json'}: draft.adapter is not trained for a "
                              f"{family(base.hf_architecture)} target: {refused.reason}", hint="remove draft.adapter")
    info = read_adapter(request.self_draft_adapter)
    problem = adapter_problem(info, request.self_draft_layers, checkpoint.config)
    if problem is not None:
        raise CheckpointError(problem, hint="the adapter must be trained on this target with this draft.layers")
    arch = SelfDraftArchitecture(base, request.self_draft_layers, info)
    arch.check_adapter()
    checkpoint.include_safetensors(info.weights, ADAPTER_PREFIX)
    return arch
