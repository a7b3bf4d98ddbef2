"""Pull-style weight mapping, each TensorRT-LLM tensor declared once, and its coverage check.

An architecture declares every TensorRT-LLM tensor of a rank once, in one loop: its name and shape, the Hugging
Face tensors it is made from (with the full shapes config.json implies) and a pure function that combines them,
identity by default. This is the shape of mlc-llm's `ExternMapping.add_mapping(name, [sources], func)`
(mlc-ai/mlc-llm, python/mlc_llm/loader/mapping.py, commit 79d603f0). The HF tensor list, the model definition and
the rules are read off that one list (`TensorMapping`). Before anything is read, `plan_conversion` checks it in
both directions against the checkpoint: every HF tensor is used or explicitly ignored, every expected
TensorRT-LLM tensor is produced, and the shapes the functions produce (evaluated on `meta` tensors, so no data
is touched) are the declared shapes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from specbuild.convert.safetensors_reader import TensorInfo
from specbuild.convert.sharding import Rank, RowBlocks
from specbuild.errors import CheckpointError

Shape = tuple[int, ...]
Combine = Callable[..., torch.Tensor | RowBlocks]


class EngineLayoutError(CheckpointError):
    """A sound checkpoint that TensorRT-LLM's engine-flow layout cannot hold (e.g. dense layers inside a Qwen3-MoE
    model): refused wherever specbuild converts it, but not where the model is served from its Hugging Face
    directory as it is (`build.flow: pytorch` on TensorRT-LLM's own backend), which `validate` knows."""


def identity(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


@dataclass(frozen=True)
class Rule:
    """One output tensor: its HF sources, in argument order, the pure function that combines them, and its own
    dtype where TensorRT-LLM fixes one whatever the checkpoint's (None: the checkpoint's dtype)."""

    sources: tuple[str, ...]
    combine: Combine = identity
    dtype: torch.dtype | None = None


@dataclass(frozen=True)
class Target:
    """One TensorRT-LLM tensor of one rank: its shape there, its HF sources (name -> full shape, in argument
    order) and the function that makes it from them."""

    name: str
    shape: Shape
    sources: dict[str, Shape]
    combine: Combine = identity
    dtype: torch.dtype | None = None

    @property
    def rule(self) -> Rule:
        return Rule(tuple(self.sources), self.combine, self.dtype)


class TensorMapping:
    """Every TensorRT-LLM tensor of one rank, in write order, each declared once with its sources."""

    def __init__(self) -> None:
        self.targets: dict[str, Target] = {}

    def add(self, name: str, shape: Shape, sources: dict[str, Shape], combine: Combine = identity,
            dtype: torch.dtype | None = None) -> None:
        """Declare `name` (of `shape` on this rank) as `combine(*sources)`, stored in `dtype` when given (e.g. an
        MoE router, float32 in every TensorRT-LLM checkpoint), else in the checkpoint's dtype."""
        if name in self.targets:  # a bug in an architecture module, not a user error
            raise RuntimeError(f"{name} is mapped twice")
        self.targets[name] = Target(name, tuple(shape), dict(sources), combine, dtype)

    def copy(self, name: str, source: str, shape: Shape) -> None:
        """Declare `name` as the whole of `source`, unchanged (norms, embeddings, replicated biases)."""
        self.add(name, shape, {source: shape})

    def rules(self) -> dict[str, Rule]:
        return {name: target.rule for name, target in self.targets.items()}

    def target_shapes(self) -> dict[str, Shape]:
        return {name: target.shape for name, target in self.targets.items()}

    def source_shapes(self) -> dict[str, Shape]:
        """Every HF tensor the targets use, with its shape, grouped by HF module (a module's weight beside its
        bias) in the order the targets first use each module: the order checkpoint problems are listed in."""
        modules: dict[str, dict[str, Shape]] = {}
        seen: dict[str, Shape] = {}
        for target in self.targets.values():
            for name, shape in target.sources.items():
                if seen.setdefault(name, shape) != shape:
                    raise RuntimeError(f"{name} is declared as {list(seen[name])} and as {list(shape)}")
                modules.setdefault(name.rpartition(".")[0], {})[name] = shape
        return {name: shape for module in modules.values() for name, shape in module.items()}


@dataclass
class RankPlan:
    """Everything needed to write one `rank{N}.safetensors`: rules and planned shapes, in write order."""

    rank: Rank
    rules: dict[str, Rule]
    shapes: dict[str, Shape] = field(default_factory=dict)

    @property
    def filename(self) -> str:
        return f"rank{self.rank.rank}.safetensors"

    def dtype_of(self, name: str, default: torch.dtype) -> torch.dtype:
        """The dtype `name` is written in: its own where the mapping fixes one, else the checkpoint's."""
        return self.rules[name].dtype or default

    def nbytes(self, default: torch.dtype) -> int:
        """What this rank's file holds, tensor data only, with `default` as the checkpoint's dtype."""
        return sum(torch.Size(shape).numel() * self.dtype_of(name, default).itemsize
                   for name, shape in self.shapes.items())


def check_sources(
    where: str,
    present: dict[str, TensorInfo],
    expected: dict[str, Shape],
    ignored: Callable[[str], bool],
    config_hint: str,
) -> None:
    """Compare the checkpoint's tensors with what its config implies; one error lists every problem."""
    problems: list[str] = []
    for name, shape in expected.items():
        info = present.get(name)
        if info is None:
            problems.append(f"tensor {name!r} is missing")
        elif info.shape != shape:
            problems.append(
                f"tensor {name!r} in {info.path.name} has shape {list(info.shape)}, but {config_hint} "
                f"implies {list(shape)}"
            )
        elif not info.dtype.is_floating_point:
            problems.append(f"tensor {name!r} in {info.path.name} has dtype {info.dtype}, expected a float type")
    unknown = sorted(n for n in present if n not in expected and not ignored(n))
    if unknown:
        shown = ", ".join(repr(n) for n in unknown[:5]) + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else "")
        problems.append(f"tensors not used by the mapping: {shown}")
    if problems:
        raise CheckpointError(
            f"{where}: checkpoint does not match its config.json:\n  - " + "\n  - ".join(problems),
            hint="check that config.json belongs to these weights (layer count, head counts, sizes)",
        )


def plan_rank(rank: Rank, mapping: TensorMapping, sources: dict[str, TensorInfo]) -> RankPlan:
    """Work out every output shape of one rank by running its functions on `meta` tensors, and check each against
    the declared shape. (Rules and shapes are read off the one mapping, so neither can name a tensor the other
    lacks; for Medusa too, whose heads are added to the base's mapping.)"""
    expected = mapping.target_shapes()
    plan = RankPlan(rank, mapping.rules())
    for name, rule in plan.rules.items():
        metas = [torch.empty(sources[s].shape, dtype=sources[s].dtype, device="meta") for s in rule.sources]
        shape = tuple(rule.combine(*metas).shape)
        if shape != expected[name]:
            raise RuntimeError(
                f"rank {rank.rank}: {name} would be {list(shape)}, the model definition says {list(expected[name])}"
            )
        plan.shapes[name] = shape
    return plan


def check_all_used(plans: list[RankPlan], expected_sources: dict[str, Shape]) -> None:
    """Every HF tensor the architecture expects must feed at least one output tensor on some rank."""
    used = {s for plan in plans for rule in plan.rules.values() for s in rule.sources}
    unused = sorted(set(expected_sources) - used)
    if unused:
        raise RuntimeError(f"mapping never uses {unused}")
