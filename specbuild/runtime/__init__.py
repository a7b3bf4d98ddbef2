"""specbuild's own PyTorch runtime for TensorRT-LLM checkpoints (the reference runtime).

It imports no pipeline stage: it reads checkpoints without `specbuild.convert` (an independent check of the
converter; `runtime.config` parses config.json, `runtime.checkpoint` merges the rank files), runs
LLaMA-family (with Qwen3's q/k norms, Mixtral's and Qwen3-MoE's experts, Phi-3), Gemma 2/3 text, GPT-2 and Medusa
models with a commit-on-accept KV cache, and is what the reference backend's
Triton models serve with where no TensorRT-LLM engine can be built.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from specbuild.runtime.checkpoint import LoadedCheckpoint, expected_shapes, load_checkpoint
    from specbuild.runtime.config import ModelConfig, RuntimeCheckpointError, read_config
    from specbuild.runtime.kv_cache import KVCache
    from specbuild.runtime.model import CausalLM, ForwardOutput

_HOMES = {"LoadedCheckpoint": "checkpoint", "expected_shapes": "checkpoint", "load_checkpoint": "checkpoint",
          "ModelConfig": "config", "RuntimeCheckpointError": "config", "read_config": "config",
          "KVCache": "kv_cache", "CausalLM": "model", "ForwardOutput": "model"}
"""Where each name of the package lives, imported on first use: the package's torch-free modules (schedule,
lookahead) are imported by the spec on every command, which must not wait 1.5 s for torch."""


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(f"specbuild.runtime.{_HOMES[name]}"), name)
    raise AttributeError(f"module 'specbuild.runtime' has no attribute {name!r}")


__all__ = [
    "CausalLM",
    "ForwardOutput",
    "KVCache",
    "LoadedCheckpoint",
    "ModelConfig",
    "RuntimeCheckpointError",
    "expected_shapes",
    "load_checkpoint",
    "read_config",
]
