"""specbuild's own PyTorch runtime for TensorRT-LLM checkpoints (the reference runtime).

It imports no pipeline stage: it reads checkpoints without `specbuild.convert` (an independent check of the
converter; `runtime.config` parses config.json, `runtime.checkpoint` merges the rank files), runs
LLaMA-family, GPT-2 and Medusa models with a commit-on-accept KV cache, and is what the reference backend's
Triton models serve with where no TensorRT-LLM engine can be built.
"""

from specbuild.runtime.checkpoint import LoadedCheckpoint, expected_shapes, load_checkpoint
from specbuild.runtime.config import ModelConfig, RuntimeCheckpointError, read_config
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
