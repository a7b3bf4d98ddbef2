"""LLaMA-family decoders (Llama, Mistral; Qwen2, Qwen3, Mixtral and Phi-3 subclass this): HF -> TensorRT-LLM
`LLaMAForCausalLM`.

Mapping as NVIDIA/TensorRT-LLM writes it: the legacy converter's `get_prefix_and_param_name_map()`
(tensorrt_llm/models/llama/convert.py, commit 04a2cacb) and the 1.x unified loader's default map
(tensorrt_llm/models/model_weights_loader.py, 1.x): note `mlp.fc` <- `gate_proj` (the activated branch) and
`mlp.gate` <- `up_proj`; `attention.dense` and `mlp.proj` are row-parallel (split on dim 1); the lm_head is
vocab-padded then split on dim 0. The layer loop is `decoder.Decoder`'s (shared with Gemma); LLaMA adds the optional
biases (`attention_bias`, `mlp_bias`) and the tied head.
"""

from __future__ import annotations

from typing import Any, ClassVar

from specbuild.convert.architectures.base import register
from specbuild.convert.architectures.decoder import Decoder
from specbuild.errors import CheckpointError


@register
class Llama(Decoder):
    """Llama 1/2/3.x and anything with the same tensor names and gated-SiLU MLP."""

    hf_architectures: ClassVar[tuple[str, ...]] = ("LlamaForCausalLM",)
    # Older checkpoints store RoPE inverse frequencies; TensorRT-LLM recomputes them from rotary_base.
    ignored_patterns: ClassVar[tuple[str, ...]] = (r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq",)

    def __init__(self, config: dict[str, Any], config_path: Any) -> None:
        super().__init__(config, config_path)
        self.read_sizes()
        self.tied = bool(config.get("tie_word_embeddings", False))
        self.sliding_window = self.window()

    def window(self) -> int | None:
        """The attention window every layer uses (tokens a query sees, itself included), or None for full
        attention. LLaMA has none (HF's LlamaAttention ignores any `sliding_window` field)."""
        return None

    # -- hooks subclasses override ---------------------------------------------------------------------------
    @property
    def qkv_bias(self) -> bool:
        return bool(self.config.get("attention_bias", False))

    @property
    def dense_bias(self) -> bool:
        return bool(self.config.get("attention_bias", False))

    @property
    def mlp_bias(self) -> bool:
        return bool(self.config.get("mlp_bias", False))

    def family_config(self) -> dict[str, Any]:
        """Fields of TensorRT-LLM's `LLaMAConfig` beyond the common ones (written with their 1.x defaults)."""
        return {
            "mlp_bias": self.mlp_bias,
            "attn_bias": self.qkv_bias,
            "residual_mlp": False,
            "disable_weight_only_quant_plugin": False,
            "remove_duplicated_kv_heads": False,
            "fc_after_embed": False,
            "use_input_layernorm_in_first_layer": True,
            "use_last_layernorm": True,
            "layer_idx_offset": 0,
            "embedding_multiplier": 1.0,
            "attention_multiplier": 1.0,
            "residual_multiplier": 1.0,
            "output_multiplier_scale": 1.0,
        }

    # -- tensors (the layer loop is Decoder's) -----------------------------------------------------------------
    def is_ignored(self, name: str) -> bool:
        # A tied checkpoint may still carry a copy of the embedding as lm_head; the embedding is used (after
        # check_source_values has made sure it is a copy).
        return super().is_ignored(name) or (self.tied and name == "lm_head.weight")

    def check_source_values(self, checkpoint: Any) -> None:
        if self.tied:
            self.check_tied_head(
                checkpoint, "model.embed_tokens.weight", "lm_head.weight", "config.json says tie_word_embeddings: true",
                hint="if lm_head.weight is the model's trained output layer, set \"tie_word_embeddings\": false in "
                "config.json; if the head is meant to be the embedding, remove lm_head.weight from the weight files "
                "(save the model with tied weights)",
            )

    def lm_head_source(self) -> str:
        return "model.embed_tokens.weight" if self.tied else "lm_head.weight"

    # -- config.json -------------------------------------------------------------------------------------------
    def rope(self) -> tuple[float, dict[str, Any] | None]:
        """rotary_base and rotary_scaling from either HF layout (top-level keys, or transformers 5's
        `rope_parameters`), passing the scaling dict through unchanged as TensorRT-LLM does."""
        params = self.config.get("rope_parameters") or {}
        base = self.config.get("rope_theta", params.get("rope_theta", self.default_rope_theta))
        scaling = self.config.get("rope_scaling")
        if scaling is None and params.get("rope_type", "default") != "default":
            scaling = {k: v for k, v in params.items() if k != "rope_theta"}
        return float(base), scaling

    default_rope_theta: ClassVar[float] = 10000.0

    def trtllm_config(self, dtype: str, tp_size: int, pp_size: int) -> dict[str, Any]:
        rotary_base, rotary_scaling = self.rope()
        config = {
            **self.shape_config(dtype, tp_size, pp_size),
            "hidden_act": self.field("hidden_act", default="silu", kind=str),
            "norm_epsilon": self.field("rms_norm_eps", default=1e-6, kind=float),
            "position_embedding_type": "rope_gpt_neox",
            "max_position_embeddings": self.field("max_position_embeddings", default=2048),
            "rotary_embedding_dim": self.head_dim,
            "rotary_base": rotary_base,
            "rotary_scaling": rotary_scaling,
            "tie_word_embeddings": self.tied,
        }
        if self.sliding_window is not None:
            # TensorRT-LLM 1.2's LLaMAConfig has no window field (its from_hugging_face reads none; the window is
            # the runtime's max_attention_window_size, examples/models/core/llama/README.md "Mistral v0.1").
            # PretrainedConfig keeps unknown fields ("Implicitly setting ..."), so the window travels with the
            # checkpoint and engine to `build` (plan, engine.json), `deploy` (max_attention_window_size) and the
            # reference runtime, which applies it.
            config["sliding_window"] = self.sliding_window
        config.update(self.family_config())
        return config


@register
class Mistral(Llama):
    """Mistral shares the LLaMA model class and tensor names in TensorRT-LLM (`MODEL_MAP`,
    tensorrt_llm/models/__init__.py, commit 02267d3d); every layer attends to the
    last `sliding_window` tokens (HF MistralAttention; `sliding_window: null` is full attention, as Mistral v0.2+)."""

    hf_architectures: ClassVar[tuple[str, ...]] = ("MistralForCausalLM",)

    def window(self) -> int | None:
        window = self.field("sliding_window", default=None)
        if window is not None and window < 1:
            raise CheckpointError(f"{self.config_path}: field 'sliding_window' must be a positive number of tokens "
                                  f"or null, not {window}")
        return window
