"""Qwen2: LLaMA tensor names plus Q/K/V biases, under TensorRT-LLM's `QWenForCausalLM` class.

Facts from NVIDIA/TensorRT-LLM (`QWenConfig`, tensorrt_llm/models/qwen/config.py, commit 373970a8; the
decoder layer's `Attention(..., bias=config.attn_bias, dense_bias=False)` in models/qwen/model.py, 1.x): the
checkpoint keeps `architecture: Qwen2ForCausalLM` with `qwen_type: qwen2`, `attn_bias: true` (q/k/v only;
`attention.dense` has no bias), `mlp_bias: false`, and `rotary_base` from `rope_theta` (default 1e6 in HF Qwen2
configs).
"""

from __future__ import annotations

from typing import Any, ClassVar

from specbuild.convert.architectures.base import register
from specbuild.convert.architectures.decoder import Decoder
from specbuild.convert.architectures.llama import Llama
from specbuild.errors import CheckpointError


@register
class Qwen2(Llama):
    hf_architectures: ClassVar[tuple[str, ...]] = ("Qwen2ForCausalLM",)
    default_rope_theta: ClassVar[float] = 1000000.0

    def window(self) -> int | None:
        """HF Qwen2 slides its window only with `use_sliding_window: true`, and then only in the layers from
        `max_window_layers` on (or where `layer_types` says `sliding_attention`): per-layer windows, which specbuild
        does not carry; refused rather than converted to full attention."""
        window = self.config.get("sliding_window")
        if not self.config.get("use_sliding_window") or window is None:
            return None
        types = self.config.get("layer_types")
        if isinstance(types, list) and types:
            sliding = [i for i, kind in enumerate(types) if kind == "sliding_attention"]
        else:
            first = self.field("max_window_layers", default=self.layers)
            sliding = list(range(first, self.layers))
        if not sliding:
            return None
        raise CheckpointError(
            f"{self.config_path}: use_sliding_window is true (layers {sliding[0]}-{sliding[-1]} attend to the last "
            f"{window} tokens only), which specbuild does not convert: the converted model would attend to every "
            "token and give other outputs",
            hint="use a checkpoint with use_sliding_window: false (as Qwen2/2.5 ship), or serve it elsewhere",
        )

    @property
    def qkv_bias(self) -> bool:
        return True

    # attention.dense and the MLP have no biases: Decoder's defaults, not LLaMA's config-read ones.
    dense_bias = Decoder.dense_bias
    mlp_bias = Decoder.mlp_bias

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
