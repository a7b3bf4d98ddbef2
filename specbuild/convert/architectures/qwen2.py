"""Qwen2: LLaMA tensor names plus Q/K/V biases, under TensorRT-LLM's `QWenForCausalLM` class.

Facts (shared/reference/tensorrt-llm.md §1.2, §1.5): the checkpoint keeps `architecture: Qwen2ForCausalLM`
with `qwen_type: qwen2`, `attn_bias: true` (q/k/v only; `attention.dense` has no bias), `mlp_bias: false`,
and `rotary_base` from `rope_theta` (default 1e6 in HF Qwen2 configs).
"""

from __future__ import annotations

from typing import Any, ClassVar

from specbuild.convert.architectures.base import register
from specbuild.convert.architectures.llama import Llama


@register
class Qwen2(Llama):
    hf_architectures: ClassVar[tuple[str, ...]] = ("Qwen2ForCausalLM",)
    default_rope_theta: ClassVar[float] = 1000000.0

    @property
    def qkv_bias(self) -> bool:
        return True

    @property
    def dense_bias(self) -> bool:
        return False

    @property
    def mlp_bias(self) -> bool:
        return False

    def family_config(self) -> dict[str, Any]:
        """Fields of TensorRT-LLM's `QWenConfig`."""
        return {
            "qwen_type": self.config.get("model_type", "qwen2"),
            "attn_bias": True,
            "mlp_bias": False,
            "seq_length": self.field("max_position_embeddings", default=8192),
            "use_logn_attn": False,
            "moe_intermediate_size": 0,
            "moe_shared_expert_intermediate_size": 0,
        }
