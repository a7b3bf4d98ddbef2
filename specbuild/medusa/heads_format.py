"""The FasterDecoding Medusa head file format, shared by the converter and the trainer: which file, whether a pickle
may be read (`specbuild.pickle_weights`), and what the keys say.

A head file is the state dict of Medusa's `medusa_head` ModuleList: per head h, ResBlocks `{h}.{l}.linear.weight`
and `{h}.{l}.linear.bias`, then the head's vocabulary projection `{h}.{L}.weight` (FasterDecoding/Medusa
`medusa/model/medusa_model.py` and `medusa/train/train_legacy.py`, which writes `medusa_lm_head.safetensors`;
published Medusa-1 heads ship `medusa_lm_head.pt`). Published configs disagree with their files (NVIDIA/TensorRT-LLM
`examples/medusa/README.md`: medusa-vicuna-7b-v1.3 says 2 heads, its file has 4), so counts always come from the
keys.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from specbuild.errors import CheckpointError
from specbuild.pickle_weights import check_pickle_allowed, is_pickle, load_pickled_state

if TYPE_CHECKING:
    import torch

WEIGHTS_NAME = "medusa_lm_head.safetensors"
PICKLE_NAME = "medusa_lm_head.pt"
MODULE_PREFIX = "medusa_head."  # some exports keep the module's attribute name; readers strip it
KEY_RE = re.compile(r"^(\d+)\.(\d+)\.(linear\.weight|linear\.bias|weight)$")


def heads_file(path: Path) -> Path:
    """The head file of a heads directory (`WEIGHTS_NAME`, else `PICKLE_NAME`), or `path` when it is that file."""
    path = Path(path)
    if path.is_file():
        return path
    if not path.is_dir():
        raise CheckpointError(f"{path}: Medusa heads directory does not exist")
    for name in (WEIGHTS_NAME, PICKLE_NAME):
        if (path / name).is_file():
            return path / name
    raise CheckpointError(f"{path}: no {WEIGHTS_NAME} (or {PICKLE_NAME}) here",
                          hint="is this a Medusa heads directory?")


def read_heads(path: Path, *, allow_pickle: bool = False) -> dict[str, torch.Tensor]:
    """The state dict (keys without `MODULE_PREFIX`) of the head file `heads_file(path)` finds; a pickle only with
    the opt-in, and then read with `torch.load(weights_only=True)` (`specbuild.pickle_weights`)."""
    path = heads_file(path)
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            state_dict = load_file(str(path))
        except Exception as err:  # safetensors raises its own error types for corrupt headers
            raise CheckpointError(f"{path}: cannot read safetensors file ({err})") from err
    elif is_pickle(path):
        check_pickle_allowed([path], allow_pickle=allow_pickle, safe_format=WEIGHTS_NAME)
        state_dict = load_pickled_state(path)
    else:
        raise CheckpointError(f"{path}: unknown Medusa heads file type (expected {WEIGHTS_NAME} or {PICKLE_NAME})")
    return {key.removeprefix(MODULE_PREFIX): value for key, value in state_dict.items()}


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
