"""Pickled weight files (`torch.save`: `pytorch_model*.bin`, Medusa's `medusa_lm_head.pt`): the one opt-in rule and
the one weights-only load, for the converter's checkpoints and head files and for the Medusa trainer alike.

Unpickling can run arbitrary code, so a pickle is read only when the user allows it (`--allow-pickle`,
`allow_pickle=True`), and then with `torch.load(weights_only=True)`, which refuses anything but tensors and plain
containers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from specbuild.errors import CheckpointError

if TYPE_CHECKING:
    import torch

PICKLE_SUFFIXES = (".pt", ".pth", ".bin")


def is_pickle(path: Path) -> bool:
    return path.suffix in PICKLE_SUFFIXES


def check_pickle_allowed(files: Sequence[Path], *, allow_pickle: bool, safe_format: str = "safetensors") -> None:
    """Refuse to read the pickle `files` (all in one directory) without the user's opt-in; `safe_format` names
    what to convert them to."""
    if allow_pickle or not files:
        return
    raise CheckpointError(
        f"{files[0].parent}: weights are pickle files ({', '.join(f.name for f in files)}); loading pickle can run "
        "arbitrary code, so it is off by default",
        hint=f"convert them to {safe_format}, or, if you trust their source, allow pickle (--allow-pickle, "
        "allow_pickle=True) to load them with torch.load(weights_only=True)",
    )


def load_pickled_state(path: Path, *, mmap: bool = False) -> dict[str, torch.Tensor]:
    """A pickled state dict read with `torch.load(weights_only=True)` on the CPU (memory-mapped with `mmap`, which
    needs torch's zip format); call `check_pickle_allowed` first."""
    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as err:  # weights_only unpickling raises UnpicklingError and many other types
        raise CheckpointError(f"{path}: cannot load pickle weights ({err})") from err
    if not isinstance(state, Mapping) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{path}: expected a dict of tensors (a state dict)")
    return dict(state)
