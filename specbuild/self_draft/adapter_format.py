"""The self-draft adapter format: one decoder layer of the target's own family, stored as the target's layer L.

Decision: the adapter is one more decoder layer after the target's first L layers, not a head of a new kind, so
the draft checkpoint `convert` writes (layers 0..L-1 of the target, then the adapter as layer L, the target's final
norm and LM head) is an ordinary checkpoint of the target's family with L + 1 layers: the TensorRT-LLM build,
the BLS and the reference runtime take it unchanged, and tensor/pipeline sharding is the family's own mapping.

A directory holds `adapter.safetensors` (the layer's tensors under the target's Hugging Face names for layer L,
e.g. `model.layers.4.self_attn.q_proj.weight`: exactly what the target's own layer L is called, so convert's
mapping reads it in that layer's place) and `adapter.json` (`format`, `layers` = L, the target's `hidden_size`,
`num_hidden_layers` and `model_type`, and how it was trained), with the trainer's `manifest.json` beside them
(what every specbuild output has: it lets a rerun replace the directory; readers ignore it). `read_adapter`
checks what can be checked without the target; convert checks every tensor's name and shape against the
target's mapping.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specbuild.errors import CheckpointError

WEIGHTS_NAME = "adapter.safetensors"
CONFIG_NAME = "adapter.json"
FORMAT = "specbuild-self-draft-adapter/1"
LAYER_RE = re.compile(r"(?:^|\.)layers\.(\d+)\.")
HINT = "train one with `specbuild draft train --target HF_DIR --layers L --output DIR`"


@dataclass(frozen=True)
class AdapterInfo:
    """What an adapter directory declares, checked (no tensor data read)."""

    directory: Path
    layers: int  # L: the adapter runs after the target's first L layers, as the draft's layer L
    hidden_size: int
    target_layers: int
    model_type: str
    shapes: dict[str, tuple[int, ...]]  # tensor name -> shape

    @property
    def weights(self) -> Path:
        return self.directory / WEIGHTS_NAME

    @property
    def config_path(self) -> Path:
        return self.directory / CONFIG_NAME


def _int(config: dict[str, Any], name: str, path: Path) -> int:
    value = config.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise CheckpointError(f"{path}: field {name!r} must be a positive integer (got {value!r})", hint=HINT)
    return value


def read_adapter(directory: Path) -> AdapterInfo:
    """Check an adapter directory's config and weight header; every refusal names the file and field or tensor."""
    from safetensors import safe_open

    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: self-draft adapter directory does not exist", hint=HINT)
    config_path, weights = directory / CONFIG_NAME, directory / WEIGHTS_NAME
    for path in (config_path, weights):
        if not path.is_file():
            raise CheckpointError(f"{path}: not found; is {directory} a self-draft adapter directory?", hint=HINT)
    try:
        config = json.loads(config_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{config_path}: cannot read: {err}") from None
    if not isinstance(config, dict) or config.get("format") != FORMAT:
        found = config.get("format") if isinstance(config, dict) else None
        raise CheckpointError(f"{config_path}: field 'format' must be {FORMAT!r} (got {found!r})", hint=HINT)
    layers = _int(config, "layers", config_path)
    hidden, total = _int(config, "hidden_size", config_path), _int(config, "num_hidden_layers", config_path)
    shapes: dict[str, tuple[int, ...]] = {}
    try:
        with safe_open(str(weights), "pt") as fh:
            for name in fh.keys():  # noqa: SIM118 (not a dict)
                piece = fh.get_slice(name)
                if not piece.get_dtype().startswith(("F", "BF")):
                    raise CheckpointError(f"{weights}: tensor {name!r} has dtype {piece.get_dtype()}, expected a "
                                          "float type")
                shapes[name] = tuple(piece.get_shape())
    except CheckpointError:
        raise
    except Exception as err:  # safetensors raises its own types for a corrupt or truncated header
        raise CheckpointError(f"{weights}: cannot read safetensors file ({err})", hint=HINT) from None
    if not shapes:
        raise CheckpointError(f"{weights}: holds no tensors", hint=HINT)
    for name in shapes:
        match = LAYER_RE.search(name)
        if match is None or int(match[1]) != layers:
            raise CheckpointError(f"{weights}: tensor {name!r} is not a tensor of layer {layers} ({config_path} says "
                                  f"layers: {layers}; an adapter's tensors are named as the target's layer L)",
                                  hint=HINT)
    return AdapterInfo(directory, layers, hidden, total, str(config.get("model_type", "")), shapes)


def adapter_problem(info: AdapterInfo, layers: int, target_config: dict[str, Any]) -> str | None:
    """Why this adapter cannot extend the first `layers` layers of the target whose HF config.json is given."""
    if info.layers != layers:
        return (f"{info.config_path}: the adapter was trained after {info.layers} layers, but draft.layers is "
                f"{layers}; set draft.layers: {info.layers} or train an adapter for {layers}")
    for name, ours in (("hidden_size", info.hidden_size), ("num_hidden_layers", info.target_layers)):
        theirs = target_config.get(name)
        if theirs != ours:
            return (f"{info.config_path}: {name} is {ours}, the target's is {theirs}: this adapter was trained "
                    "on another model")
    return None
