"""The FasterDecoding Medusa head file format, shared by the converter and the trainer.

A head file is the state dict of Medusa's `medusa_head` ModuleList: per head h, ResBlocks `{h}.{l}.linear.weight`
and `{h}.{l}.linear.bias`, then the head's vocabulary projection `{h}.{L}.weight` (shared/reference/
modelopt-medusa.md §2.1). Published configs disagree with their files, so counts always come from the keys.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from specbuild.errors import CheckpointError

WEIGHTS_NAME = "medusa_lm_head.safetensors"
PICKLE_NAME = "medusa_lm_head.pt"
MODULE_PREFIX = "medusa_head."  # some exports keep the module's attribute name; readers strip it
KEY_RE = re.compile(r"^(\d+)\.(\d+)\.(linear\.weight|linear\.bias|weight)$")


def count_heads(names: Iterable[str], path: Path) -> tuple[int, int]:
    """(num_heads, num_layers) from the keys; every head must have the same ResBlocks, each with weight and bias,
    followed by one vocabulary projection."""
    layers: dict[int, dict[int, set[str]]] = {}
    projection: dict[int, int] = {}
    for key in names:
        match = KEY_RE.match(key)
        if match is None:
            raise CheckpointError(
                f"{path}: unexpected tensor {key!r}",
                hint="FasterDecoding Medusa heads have keys like '0.0.linear.weight', '0.0.linear.bias', '0.1.weight'",
            )
        head, index, kind = int(match[1]), int(match[2]), match[3]
        if kind == "weight":
            if head in projection:
                raise CheckpointError(f"{path}: head {head} has two vocab projections ({projection[head]} and {index})")
            projection[head] = index
        else:
            layers.setdefault(head, {}).setdefault(index, set()).add(kind)
    heads = sorted(set(projection) | set(layers))
    if not heads:
        raise CheckpointError(f"{path}: no Medusa head tensors")
    if heads != list(range(len(heads))):
        raise CheckpointError(f"{path}: head indices {heads} are not 0..{len(heads) - 1}")
    counts = set()
    for head in heads:
        if head not in projection:
            raise CheckpointError(f"{path}: head {head} has no vocab projection '{head}.<num_layers>.weight'")
        count = projection[head]
        blocks = layers.get(head, {})
        if sorted(blocks) != list(range(count)):
            raise CheckpointError(
                f"{path}: head {head} has ResBlocks {sorted(blocks)} but its projection is '{head}.{count}.weight' "
                f"(expected ResBlocks 0..{count - 1})"
            )
        for layer, kinds in blocks.items():
            if kinds != {"linear.weight", "linear.bias"}:
                missing = ({"linear.weight", "linear.bias"} - kinds).pop()
                raise CheckpointError(f"{path}: missing '{head}.{layer}.{missing}'")
        counts.add(count)
    if len(counts) != 1:
        raise CheckpointError(f"{path}: heads have different numbers of ResBlocks ({sorted(counts)})")
    return len(heads), counts.pop()
