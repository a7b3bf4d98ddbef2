"""Pull-style weight mapping and its coverage check.

Every TensorRT-LLM output tensor declares the Hugging Face tensors it is made from and a pure function that
combines them (the shape of mlc-llm's ExternMapping). Before anything is read, `plan_conversion` checks the
mapping in both directions against the checkpoint and the architecture's own model definition:
every HF tensor is used or explicitly ignored, every expected TensorRT-LLM tensor is produced, and the
shapes the functions produce (evaluated on `meta` tensors, so no data is touched) are the shapes the model
definition expects.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from specbuild.convert.safetensors_reader import TensorInfo
from specbuild.convert.sharding import Rank, RowBlocks
from specbuild.errors import CheckpointError

Shape = tuple[int, ...]


def identity(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


@dataclass(frozen=True)
class Rule:
    """One output tensor: its HF sources, in argument order, and the pure function that combines them."""

    sources: tuple[str, ...]
    combine: Callable[..., torch.Tensor | RowBlocks] = identity


@dataclass
class RankPlan:
    """Everything needed to write one `rank{N}.safetensors`: rules and planned shapes, in write order."""

    rank: Rank
    rules: dict[str, Rule]
    shapes: dict[str, Shape] = field(default_factory=dict)

    @property
    def filename(self) -> str:
        return f"rank{self.rank.rank}.safetensors"


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


def plan_rank(
    rank: Rank, rules: dict[str, Rule], expected: dict[str, Shape], sources: dict[str, TensorInfo]
) -> RankPlan:
    """Check one rank's rules against the model definition and work out every output shape."""
    missing = [n for n in expected if n not in rules]
    extra = [n for n in rules if n not in expected]
    if missing or extra:  # a bug in an architecture module, not a user error
        raise RuntimeError(f"rank {rank.rank}: mapping lacks {missing} / produces undeclared {extra}")
    plan = RankPlan(rank, rules)
    for name, rule in rules.items():
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
