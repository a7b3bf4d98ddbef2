"""runtime stage (see shared/DESIGN.md): specbuild's own PyTorch runtime for TensorRT-LLM checkpoints.

It reads checkpoints without importing `specbuild.convert` (an independent check of the converter), runs
LLaMA-family, GPT-2 and Medusa models with a commit-on-accept KV cache, and is what the reference backend's
Triton models serve with where no TensorRT-LLM engine can be built.
"""

from specbuild.runtime.checkpoint import (
    LoadedCheckpoint,
    ModelConfig,
    RuntimeCheckpointError,
    expected_shapes,
    load_checkpoint,
    read_config,
)
from specbuild.runtime.kv_cache import KVCache
from specbuild.runtime.model import CausalLM, ForwardOutput

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
