"""A TensorRT-LLM checkpoint's `config.json`, parsed into what the reference runtime needs (`ModelConfig`).

The fields and their defaults are TensorRT-LLM's own (`PretrainedConfig` and the family configs,
NVIDIA/TensorRT-LLM 1.x, tensorrt_llm/models/modeling_utils.py, models/llama/config.py, models/qwen/config.py,
models/gpt/config.py), read here without `specbuild.convert`, so that loading a converted checkpoint stays an
independent check of the converter. Every refusal names the file and the field: a feature this runtime does not
implement is refused rather than silently computed otherwise.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specbuild.errors import SpecbuildError
from specbuild.runtime.dequantize import quantization_problem
from specbuild.runtime.rope import rope_scaling_problem

LLAMA_FAMILY = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
GPT2_FAMILY = ("GPT2LMHeadModel",)
MEDUSA = ("MedusaForCausalLM",)
SUPPORTED_ARCHITECTURES = LLAMA_FAMILY + GPT2_FAMILY + MEDUSA

# Fields of TensorRT-LLM configs whose non-default values change the model's math in ways this runtime does
# not implement; refusing them beats silently computing something else.
_DEFAULTS_REQUIRED: dict[str, Any] = {
    "qk_layernorm": False,
    "residual_mlp": False,
    "fc_after_embed": False,
    "remove_duplicated_kv_heads": False,
    "use_input_layernorm_in_first_layer": True,
    "use_last_layernorm": True,
    "embedding_multiplier": 1.0,
    "attention_multiplier": 1.0,
    "residual_multiplier": 1.0,
    "output_multiplier_scale": 1.0,
    "use_logn_attn": False,
    "apply_query_key_layer_scaling": False,
    "inner_layernorm": False,
}


class RuntimeCheckpointError(SpecbuildError):
    """A TensorRT-LLM checkpoint the reference runtime cannot load (missing file or tensor, wrong shape,
    or a feature the runtime does not implement)."""


@dataclass(frozen=True)
class ModelConfig:
    """The model as the TensorRT-LLM `config.json` describes it (only what the runtime needs)."""

    architecture: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    num_medusa_heads: int = 0
    num_medusa_layers: int = 0
    family: str = "llama"  # "llama" (RMSNorm, RoPE, gated MLP) or "gpt2" (LayerNorm, learned positions)
    intermediate_size: int = 0
    hidden_act: str = "silu"
    norm_epsilon: float = 1e-5
    rotary_base: float = 10000.0
    rotary_scaling: dict[str, Any] | None = field(default=None, hash=False)
    rotary_dim: int = 0
    qkv_bias: bool = False
    dense_bias: bool = False
    mlp_bias: bool = False
    q_scaling: float = 1.0
    tp_size: int = 1
    pp_size: int = 1
    dtype: str = "float32"
    qwen_type: str | None = None
    max_draft_len: int = 0
    use_parallel_embedding: bool = False
    embedding_sharding_dim: int = 0
    quant_algo: str | None = None  # weights dequantized at load; activations emulated (runtime.dequantize)
    kv_cache_quant_algo: str | None = None
    sliding_window: int | None = None
    """Every layer's attention window: a query at position p sees keys at positions p - W + 1 .. p (HF Mistral's
    `sliding_window`, TensorRT-LLM's max_attention_window_size); None: every earlier position."""

    @property
    def attention_scale(self) -> float:
        """TensorRT-LLM's softmax scale: 1 / (sqrt(head_size) * q_scaling)."""
        return 1.0 / (self.head_dim**0.5 * self.q_scaling)

    @classmethod
    def from_dict(cls, config: dict[str, Any], path: Path) -> ModelConfig:
        """Parse and check a TensorRT-LLM config; every refusal names `path` and the field."""
        return _parse_config(config, path)


def read_config(directory: Path) -> dict[str, Any]:
    """The raw `config.json` of a checkpoint directory (a JSON object), or an error naming the file."""
    path = Path(directory) / "config.json"
    if not path.is_file():
        raise RuntimeCheckpointError(f"{path}: not found; is {directory} a TensorRT-LLM checkpoint directory?")
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise RuntimeCheckpointError(f"{path}: cannot read config: {err}") from err
    if not isinstance(config, dict):
        raise RuntimeCheckpointError(f"{path}: expected a JSON object")
    return config


# -- config parsing ------------------------------------------------------------------------------------------------
def _field(config: dict[str, Any], path: Path, name: str, kind: Callable[[Any], Any], default: Any = ...) -> Any:
    value = config.get(name)
    if value is None:
        if default is ...:
            raise RuntimeCheckpointError(f"{path}: required field {name!r} is missing")
        return default
    try:
        return kind(value)
    except (TypeError, ValueError) as err:
        raise RuntimeCheckpointError(f"{path}: field {name!r} has an invalid value {value!r}") from err


def _check_supported(config: dict[str, Any], path: Path) -> str:
    architecture = config.get("architecture")
    if architecture is None and "architectures" in config:  # transformers' key: an HF checkpoint, not converted
        raise RuntimeCheckpointError(
            f"{path}: a Hugging Face checkpoint (config.json names `architectures`), not a TensorRT-LLM one",
            hint=f"convert it first: `specbuild convert --model {path.parent} --output CKPT`, then give CKPT",
        )
    if architecture not in SUPPORTED_ARCHITECTURES:
        raise RuntimeCheckpointError(
            f"{path}: architecture {architecture!r} is not supported by the reference runtime",
            hint=f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}",
        )
    problem = quantization_problem(config.get("quantization") or {})
    if problem:
        raise RuntimeCheckpointError(f"{path}: {problem}")
    for name, default in _DEFAULTS_REQUIRED.items():
        if config.get(name, default) not in (default, None):
            raise RuntimeCheckpointError(
                f"{path}: field {name!r} = {config[name]!r} is not supported by the reference runtime "
                f"(only {default!r})"
            )
    if (config.get("moe") or {}).get("num_experts", 0):
        raise RuntimeCheckpointError(f"{path}: mixture-of-experts checkpoints are not supported")
    mapping = config.get("mapping") or {}
    if mapping.get("cp_size", 1) != 1:
        raise RuntimeCheckpointError(f"{path}: context parallelism (mapping.cp_size > 1) is not supported")
    return architecture


def _parse_config(config: dict[str, Any], path: Path) -> ModelConfig:
    architecture = _check_supported(config, path)
    family = "gpt2" if architecture in GPT2_FAMILY else "llama"
    hidden = _field(config, path, "hidden_size", int)
    heads = _field(config, path, "num_attention_heads", int)
    head_dim = _field(config, path, "head_size", int, hidden // heads)
    expected_pe = "learned_absolute" if family == "gpt2" else "rope_gpt_neox"
    pe = config.get("position_embedding_type", "learned_absolute")
    if pe != expected_pe:
        raise RuntimeCheckpointError(
            f"{path}: position_embedding_type {pe!r} is not supported for {architecture} (expected {expected_pe!r})"
        )
    scaling = config.get("rotary_scaling") if family == "llama" else None
    problem = rope_scaling_problem(scaling)
    if problem:
        raise RuntimeCheckpointError(f"{path}: rotary_scaling: {problem}")
    qwen = architecture == "Qwen2ForCausalLM" or bool(config.get("qwen_type"))
    attn_bias = _field(config, path, "attn_bias", bool, qwen)
    gpt2_bias = _field(config, path, "bias", bool, True)  # GPTConfig.bias: every linear layer has one
    mapping = config.get("mapping") or {}
    tp, pp = int(mapping.get("tp_size", 1)), int(mapping.get("pp_size", 1))
    if tp * pp != int(mapping.get("world_size", tp * pp)):
        raise RuntimeCheckpointError(f"{path}: mapping.world_size {mapping['world_size']} != tp_size * pp_size")
    medusa = architecture in MEDUSA
    return ModelConfig(
        architecture=architecture,
        vocab_size=_field(config, path, "vocab_size", int),
        hidden_size=hidden,
        num_layers=_field(config, path, "num_hidden_layers", int),
        num_heads=heads,
        num_kv_heads=_field(config, path, "num_key_value_heads", int, heads),
        head_dim=head_dim,
        max_position_embeddings=_field(config, path, "max_position_embeddings", int, 2048),
        num_medusa_heads=_field(config, path, "num_medusa_heads", int, 4) if medusa else 0,
        num_medusa_layers=_field(config, path, "num_medusa_layers", int, 1) if medusa else 0,
        family=family,
        intermediate_size=_field(config, path, "intermediate_size", int, 4 * hidden),
        hidden_act=_field(config, path, "hidden_act", str, "gelu"),
        norm_epsilon=_field(config, path, "norm_epsilon", float, 1e-5),
        rotary_base=_field(config, path, "rotary_base", float, 10000.0),
        rotary_scaling=dict(scaling) if scaling else None,
        rotary_dim=_field(config, path, "rotary_embedding_dim", int, head_dim) if family == "llama" else 0,
        qkv_bias=gpt2_bias if family == "gpt2" else attn_bias,
        # TensorRT-LLM's LLaMA attention uses attn_bias for dense too; QWen's passes dense_bias=False
        # (QWenDecoderLayer, NVIDIA/TensorRT-LLM 1.x tensorrt_llm/models/qwen/model.py).
        dense_bias=gpt2_bias if family == "gpt2" else attn_bias and not qwen,
        mlp_bias=gpt2_bias if family == "gpt2" else _field(config, path, "mlp_bias", bool, False),
        q_scaling=_field(config, path, "q_scaling", float, 1.0),
        tp_size=tp,
        pp_size=pp,
        dtype=_field(config, path, "dtype", str),
        qwen_type=config.get("qwen_type"),
        max_draft_len=_field(config, path, "max_draft_len", int, 0),
        use_parallel_embedding=bool(config.get("use_parallel_embedding", False)),
        embedding_sharding_dim=int(config.get("embedding_sharding_dim", 0)),
        quant_algo=(config.get("quantization") or {}).get("quant_algo"),
        kv_cache_quant_algo=(config.get("quantization") or {}).get("kv_cache_quant_algo"),
        sliding_window=_attention_window(config, path),
    )


def _attention_window(config: dict[str, Any], path: Path) -> int | None:
    """The checkpoint's attention window: specbuild's `sliding_window` field (the HF value, kept by the converter),
    else TensorRT-LLM's own `runtime_defaults.max_attention_window` when it names one window for every layer."""
    window = _field(config, path, "sliding_window", int, None)
    if window is None:
        windows = (config.get("runtime_defaults") or {}).get("max_attention_window")
        if isinstance(windows, list) and windows:
            if len(set(windows)) != 1:
                raise RuntimeCheckpointError(
                    f"{path}: runtime_defaults.max_attention_window {windows} gives layers different attention "
                    "windows, which the reference runtime does not implement"
                )
            window = _field({"max_attention_window": windows[0]}, path, "max_attention_window", int)
    if window is not None and window < 1:
        raise RuntimeCheckpointError(f"{path}: field 'sliding_window' must be a positive number of tokens, "
                                     f"not {window}")
    return window
