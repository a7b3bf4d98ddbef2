"""Qwen3 and Qwen3-MoE: Qwen2's layout without attention biases, with per-head q/k RMSNorm, and (MoE) experts in
every layer, under TensorRT-LLM's `QWenForCausalLM`.

Facts from NVIDIA/TensorRT-LLM (1.x engine flow):
- `MODEL_MAP` maps `Qwen3ForCausalLM` (tensorrt_llm/models/__init__.py @02267d3d) and, since NVIDIA/TensorRT-LLM
  PR #6470 ("Add Qwen3 MoE support to TensorRT backend", merged for 1.1/1.2), `Qwen3MoeForCausalLM` to
  `QWenForCausalLM`.
- `QWenConfig.from_hugging_face` (tensorrt_llm/models/qwen/config.py @0428c188): `qwen_type` = HF `model_type`
  (qwen3, qwen3_moe), `attn_bias` false for both, `hidden_act` "swiglu" for qwen3_moe, `moe_intermediate_size` =
  HF's, `moe.num_experts` = HF `num_experts`, `moe.top_k` = `num_experts_per_tok`, `moe.normalization_mode` NONE
  whatever HF `norm_topk_prob` says; `mlp_only_layers` and `decoder_sparse_step` are written through.
- `QWenDecoderLayer` (tensorrt_llm/models/qwen/model.py, 1.2 line): `qk_layernorm = qwen_type in (qwen3,
  qwen3_moe)` with RmsNorm; every layer is an MoE layer when `moe.has_moe()` (no dense layers in an MoE model);
  qwen3_moe uses the plain `MOE` (no shared expert) with `moe_intermediate_size` per expert; the unified loader
  maps `q_layernorm` <- `q_norm`, `k_layernorm` <- `k_norm` and the experts' `fc` <- [up_proj, gate_proj].
- The legacy converter (tensorrt_llm/models/qwen/convert.py @0428c188) writes `attention.q_layernorm.weight` /
  `attention.k_layernorm.weight` from `self_attn.q_norm` / `k_norm` unsplit, the router `mlp.router.weight` from
  `mlp.gate` in float32, `mlp.fc` = cat(up_proj, gate_proj) per expert and `mlp.proj` = stacked down_proj, experts
  split on the intermediate dim by moe_tp (see `mixtral.py` for the MoE layout shared with Mixtral).

Two deliberate differences from `QWenConfig.from_hugging_face`, both fields the engine reads as written:
`qk_layernorm` is written true (TensorRT-LLM leaves the PretrainedConfig default false and derives the norms from
`qwen_type`; true says what the checkpoint holds), and `moe.normalization_mode` follows HF `norm_topk_prob`
(RENORMALIZE when true, as Qwen3-30B-A3B and 235B-A22B ship it): NONE would weight the experts by probabilities that
do not sum to one and serve another model than the checkpoint's.
"""

from __future__ import annotations

from typing import Any, ClassVar

from specbuild.convert.architectures.base import register
from specbuild.convert.architectures.mixtral import (
    NORMALIZE_NONE,
    NORMALIZE_RENORMALIZE,
    MixtureOfExperts,
    moe_config,
)
from specbuild.convert.architectures.qwen2 import Qwen2
from specbuild.convert.mapping import EngineLayoutError, TensorMapping
from specbuild.convert.sharding import Rank


@register
class Qwen3(Qwen2):
    """Qwen3 dense models (0.6B to 32B)."""

    hf_architectures: ClassVar[tuple[str, ...]] = ("Qwen3ForCausalLM",)

    def __init__(self, config: dict[str, Any], config_path: Any) -> None:
        super().__init__(config, config_path)
        if config.get("attention_bias"):
            raise EngineLayoutError(
                f"{config_path}: attention_bias is true, but TensorRT-LLM's Qwen3 model has no attention biases "
                "(QWenConfig sets attn_bias false for qwen3): converting would drop them and serve another model; "
                "TensorRT-LLM's PyTorch backend (build.flow: pytorch), vLLM and SGLang load the Hugging Face "
                "directory as it is",
                hint="serve it from its Hugging Face directory instead: build.flow: pytorch (TensorRT-LLM's own "
                "backend), or `specbuild export vllm|sglang`",
            )

    @property
    def qkv_bias(self) -> bool:
        return False

    def attention_extras(self, m: TensorMapping, rank: Rank, src: str, dst: str) -> None:
        self.add_qk_norms(m, src, dst)

    def family_config(self) -> dict[str, Any]:
        return {
            **super().family_config(),
            "attn_bias": False,
            "qk_layernorm": True,
            "mlp_only_layers": [],
            "decoder_sparse_step": 1,
            "moe": moe_config(0, 0, NORMALIZE_NONE),  # QWenConfig's for a dense model
        }



@register
class Qwen3Moe(MixtureOfExperts, Qwen3):
    """Qwen3 mixture-of-experts models (30B-A3B, 235B-A22B): Qwen3 attention, experts in every layer."""

    hf_architectures: ClassVar[tuple[str, ...]] = ("Qwen3MoeForCausalLM",)
    moe_module: ClassVar[str] = "mlp"
    expert_names: ClassVar[tuple[str, str, str]] = ("up_proj", "gate_proj", "down_proj")
    expert_intermediate_field: ClassVar[str] = "moe_intermediate_size"

    def __init__(self, config: dict[str, Any], config_path: Any) -> None:
        super().__init__(config, config_path)
        # Hub configs (transformers 4) say num_experts; transformers 5 writes num_local_experts.
        self.experts = self.field("num_experts", "num_local_experts")
        self.top_k = self.field("num_experts_per_tok")
        self.expert_intermediate = self.field("moe_intermediate_size")
        self.norm_topk_prob = bool(config.get("norm_topk_prob", False))
        self.check_routing(config_path)
        dense = config.get("mlp_only_layers") or []
        step = self.field("decoder_sparse_step", default=1)
        if dense or step != 1:
            which = f"mlp_only_layers {dense}" if dense else f"decoder_sparse_step {step}"
            raise EngineLayoutError(
                f"{config_path}: {which} makes some layers dense, but TensorRT-LLM's engine flow builds experts in "
                "every layer of a Qwen3-MoE model (QWenDecoderLayer), so these layers' weights would not fit; "
                "TensorRT-LLM's PyTorch backend (build.flow: pytorch), vLLM and SGLang load the Hugging Face "
                "directory as it is",
                hint="serve it from its Hugging Face directory instead: build.flow: pytorch (TensorRT-LLM's own "
                "backend), or `specbuild export vllm|sglang`",
            )

    def normalization_mode(self) -> int:
        return NORMALIZE_RENORMALIZE if self.norm_topk_prob else NORMALIZE_NONE

    def family_config(self) -> dict[str, Any]:
        return {
            **super().family_config(),
            "hidden_act": "swiglu",
            "moe_intermediate_size": self.expert_intermediate,
            "moe": self.moe_config(),
        }
