"""A TensorRT-LLM checkpoint's `config.json`, parsed into what the reference runtime needs (`ModelConfig`).

The fields and their defaults are TensorRT-LLM's own (`PretrainedConfig` and the family configs,
NVIDIA/TensorRT-LLM 1.x, tensorrt_llm/models/modeling_utils.py, models/llama/config.py, models/qwen/config.py,
models/gpt/config.py), read here without `specbuild.convert`, so that loading a converted checkpoint stays an
independent check of the converter. Every refusal names the file and the field: a feature this runtime does not
implement is refused rather than silently computed otherwise.

The families of issue 49, as NVIDIA/TensorRT-LLM's engine flow describes them:
- Qwen3 / Qwen3-MoE: `qwen_type` "qwen3" / "qwen3_moe" turns on per-head RMSNorm of queries and keys
  (`qk_layernorm = config.qwen_type in ('qwen3', 'qwen3_moe')`, QWenDecoderLayer, tensorrt_llm/models/qwen/model.py);
  Qwen MoE experts have `moe_intermediate_size` rows, other families' experts `intermediate_size`.
- Mixture of experts: the `moe` object is `MoeConfig` (num_experts, top_k, normalization_mode: 0 NONE = softmax
  over all experts then top-k, 1 RENORMALIZE = softmax over the top-k logits; tensorrt_llm/layers/moe.py
  @03961722); experts are split over `mapping.moe_tp_size` (each expert's rows) and `moe_ep_size` (whole experts).
- Gemma 2 / Gemma 3 (`GemmaConfig`, tensorrt_llm/models/gemma/config.py, the 1.x version naming
  GEMMA3_ARCHITECTURE; `Gemma2ConfigGroup`/`Gemma3ConfigGroup`, models/modeling_utils.py): query_pre_attn_scalar
  (q_scaling = sqrt(query_pre_attn_scalar) / sqrt(head_size)), attn_logit_softcapping (Gemma 2's max_attn_value),
  final_logit_softcapping, inter_layernorms (norms after attention and around the MLP); Gemma 3 adds q/k norms,
  `sliding_window` with `_sliding_window_pattern` (layer i is local when (i + 1) % pattern != 0) and
  `rope_local_base_freq`, the rotary base of local layers (GemmaDecoderLayer, models/gemma/model.py @5dedf53b).
- Per-layer attention windows: TensorRT-LLM's `runtime_defaults.max_attention_window` lists windows that repeat
  over the layers (layer i uses entry i % len), as its runtime's max_attention_window_vec does.
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

LLAMA_FAMILY = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                "Qwen3MoeForCausalLM", "MixtralForCausalLM", "Phi3ForCausalLM")
GEMMA_FAMILY = ("Gemma2ForCausalLM", "Gemma3ForCausalLM")
GPT2_FAMILY = ("GPT2LMHeadModel",)
MEDUSA = ("MedusaForCausalLM",)
SUPPORTED_ARCHITECTURES = LLAMA_FAMILY + GEMMA_FAMILY + GPT2_FAMILY + MEDUSA
QK_NORM_QWEN_TYPES = ("qwen3", "qwen3_moe")
MOE_NORMALIZATION = {0: "none", 1: "renormalize"}  # MoeConfig.ExpertScaleNormalizationMode values run here
# TensorRT-LLM's gated activations over one fused fc, `x, gate = chunk(fc_out, 2); act(gate) * x`
# (tensorrt_llm/functional.py swiglu/geglu): Phi-3's MLP and MoE experts.
FUSED_GATED = ("swiglu", "geglu")
_RECONVERT = "convert the Hugging Face model again with `specbuild convert`, which writes what this runtime reads"

# Fields of TensorRT-LLM configs whose non-default values change the model's math in ways this runtime does
# not implement; refusing them beats silently computing something else.
_DEFAULTS_REQUIRED: dict[str, Any] = {
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
    `sliding_window`, TensorRT-LLM's max_attention_window_size); None: every earlier position. Where layers differ,
    `attention_windows` says which layers use it."""
    attention_windows: tuple[int | None, ...] = ()
    """Per-layer windows repeating over the layers (layer i: entry i % len; None = full attention); empty: every
    layer `sliding_window`."""
    qk_norm: bool = False  # RMSNorm over each head's queries and keys before RoPE (Qwen3, Gemma 3)
    attn_logit_softcap: float | None = None  # scores become cap * tanh(scores / cap) (Gemma 2)
    final_logit_softcap: float | None = None  # logits become cap * tanh(logits / cap) (Gemma 2, 3)
    inter_layernorms: bool = False  # Gemma 2/3: norm the attention output and the MLP's input and output
    rotary_base_local: float | None = None  # the rotary base of windowed layers (Gemma 3's rope_local_base_freq)
    moe_num_experts: int = 0
    moe_top_k: int = 0
    moe_normalization: str = "renormalize"  # "none": softmax, then top-k; "renormalize": softmax over the top-k
    moe_intermediate_size: int = 0
    moe_tp_size: int = 1
    moe_ep_size: int = 1

    @property
    def embedding_scale(self) -> float:
        """The embedding is multiplied by this: GemmaModel's sqrt(hidden_size) (models/gemma/model.py), else 1."""
        return self.hidden_size**0.5 if self.family == "gemma" else 1.0

    def layer_window(self, layer: int) -> int | None:
        """The attention window of decoder layer `layer` (None: every earlier position)."""
        if self.attention_windows:
            return self.attention_windows[layer % len(self.attention_windows)]
        return self.sliding_window

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
    mapping = config.get("mapping") or {}
    if mapping.get("cp_size", 1) != 1:
        raise RuntimeCheckpointError(f"{path}: context parallelism (mapping.cp_size > 1) is not supported")
    return architecture


def _parse_config(config: dict[str, Any], path: Path) -> ModelConfig:
    architecture = _check_supported(config, path)
    family = "gpt2" if architecture in GPT2_FAMILY else "gemma" if architecture in GEMMA_FAMILY else "llama"
    hidden = _field(config, path, "hidden_size", int)
    heads = _field(config, path, "num_attention_heads", int)
    head_dim = _field(config, path, "head_size", int, hidden // heads)
    expected_pe = ("learned_absolute",) if family == "gpt2" else ("rope_gpt_neox", "long_rope") if (
        architecture == "Phi3ForCausalLM") else ("rope_gpt_neox",)
    pe = config.get("position_embedding_type", "learned_absolute")
    if pe not in expected_pe:
        raise RuntimeCheckpointError(
            f"{path}: position_embedding_type {pe!r} is not supported for {architecture} (expected "
            f"{' or '.join(map(repr, expected_pe))})"
        )
    scaling = config.get("rotary_scaling") if family != "gpt2" else None
    if pe == "long_rope":
        scaling = _long_rope(config, path)
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
    gemma2, gemma3 = architecture == "Gemma2ForCausalLM", architecture == "Gemma3ForCausalLM"
    q_scaling = _field(config, path, "q_scaling", float, 1.0)
    if family == "gemma":
        # GemmaDecoderLayer: q_scaling = sqrt(query_pre_attn_scalar) / sqrt(head_size), so the softmax scale is
        # 1 / sqrt(query_pre_attn_scalar).
        q_scaling = _field(config, path, "query_pre_attn_scalar", float) ** 0.5 / head_dim**0.5
    windows, window = _attention_windows(config, path, architecture)
    moe = _moe(config, path, architecture, tp)
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
        hidden_act=_hidden_act(config, path, family),
        norm_epsilon=_field(config, path, "norm_epsilon", float, 1e-5),
        rotary_base=_field(config, path, "rotary_base", float, 10000.0),
        rotary_scaling=dict(scaling) if scaling else None,
        rotary_dim=_field(config, path, "rotary_embedding_dim", int, head_dim) if family != "gpt2" else 0,
        qkv_bias=gpt2_bias if family == "gpt2" else attn_bias,
        # TensorRT-LLM's LLaMA attention uses attn_bias for dense too; QWen's passes dense_bias=False
        # (QWenDecoderLayer, NVIDIA/TensorRT-LLM 1.x tensorrt_llm/models/qwen/model.py).
        dense_bias=gpt2_bias if family == "gpt2" else attn_bias and not qwen,
        mlp_bias=gpt2_bias if family == "gpt2" else _field(config, path, "mlp_bias", bool, False),
        q_scaling=q_scaling,
        tp_size=tp,
        pp_size=pp,
        dtype=_field(config, path, "dtype", str),
        qwen_type=config.get("qwen_type"),
        max_draft_len=_field(config, path, "max_draft_len", int, 0),
        use_parallel_embedding=bool(config.get("use_parallel_embedding", False)),
        embedding_sharding_dim=int(config.get("embedding_sharding_dim", 0)),
        quant_algo=(config.get("quantization") or {}).get("quant_algo"),
        kv_cache_quant_algo=(config.get("quantization") or {}).get("kv_cache_quant_algo"),
        sliding_window=window,
        attention_windows=windows,
        qk_norm=bool(config.get("qk_layernorm")) or config.get("qwen_type") in QK_NORM_QWEN_TYPES or gemma3,
        attn_logit_softcap=_softcap(config, path, "attn_logit_softcapping") if gemma2 else None,
        final_logit_softcap=_softcap(config, path, "final_logit_softcapping") if family == "gemma" else None,
        inter_layernorms=family == "gemma" and _field(config, path, "inter_layernorms", bool, True),
        rotary_base_local=_field(config, path, "rope_local_base_freq", float, None) if gemma3 else None,
        **moe,
    )


def _long_rope(config: dict[str, Any], path: Path) -> dict[str, Any]:
    """Phi-3's LongRoPE as TensorRT-LLM's Phi3 config carries it (`longrope_scaling_short_factors`,
    `longrope_scaling_long_factors`, `original_max_position_embeddings`; Phi3DecoderLayer, models/phi3/model.py
    @c4dc529f), as the rotary_scaling object `runtime.rope` reads (HF's "longrope" type). Phi3ForCausalLM has no mscale
    fields: the attention factor follows from max_position_embeddings / original_max_position_embeddings."""
    names = ("longrope_scaling_short_factors", "longrope_scaling_long_factors", "original_max_position_embeddings")
    missing = [name for name in names if config.get(name) is None]
    if missing:
        raise RuntimeCheckpointError(f"{path}: position_embedding_type 'long_rope' needs field {missing[0]!r}",
                                     hint=_RECONVERT)
    return {"rope_type": "longrope", "short_factor": list(config[names[0]]), "long_factor": list(config[names[1]]),
            "original_max_position_embeddings": _field(config, path, names[2], int)}


def _hidden_act(config: dict[str, Any], path: Path, family: str) -> str:
    """The activation under the runtime's names (HF's, which specbuild's converter writes verbatim). A Gemma
    checkpoint's `gelu` is TensorRT-LLM's own: its GemmaConfig copies HF's `hidden_act`, which Gemma configs lack
    (theirs is `hidden_activation`, gelu_pytorch_tanh), leaving PretrainedConfig's default "gelu", and TensorRT-LLM's
    gelu is the tanh form (tensorrt_llm/functional.py `gelu`)."""
    act = _field(config, path, "hidden_act", str, "gelu")
    return "gelu_pytorch_tanh" if family == "gemma" and act == "gelu" else act


def _softcap(config: dict[str, Any], path: Path, name: str) -> float | None:
    cap = _field(config, path, name, float, None)
    if cap is not None and cap <= 0:
        raise RuntimeCheckpointError(f"{path}: field {name!r} must be positive or null, not {cap}", hint=_RECONVERT)
    return cap


def _moe(config: dict[str, Any], path: Path, architecture: str, tp: int) -> dict[str, Any]:
    """The ModelConfig fields of TensorRT-LLM's `moe` object (MoeConfig) and the mapping's expert split."""
    moe = config.get("moe") or {}
    if not isinstance(moe, dict):
        raise RuntimeCheckpointError(f"{path}: field 'moe' must be an object, not {moe!r}", hint=_RECONVERT)
    experts = _field(moe, path, "num_experts", int, 0)
    if experts <= 1:  # MoeConfig.has_moe: num_experts > 1
        return {}
    top_k = _field(moe, path, "top_k", int, 0)
    if not 1 <= top_k <= experts:
        raise RuntimeCheckpointError(f"{path}: field 'moe.top_k' = {top_k} must be in 1..moe.num_experts ({experts})",
                                     hint=_RECONVERT)
    mode = _field(moe, path, "normalization_mode", int, 1)
    if mode not in MOE_NORMALIZATION:
        raise RuntimeCheckpointError(
            f"{path}: field 'moe.normalization_mode' = {mode} is not supported by the reference runtime "
            f"(supported: {', '.join(f'{k} ({v})' for k, v in MOE_NORMALIZATION.items())})",
            hint="these are the routings of Mixtral and Qwen3-MoE; serve other MoE models with TensorRT-LLM, or "
                 "`specbuild export vllm|sglang`")
    if moe.get("shared_expert_intermediate_size"):
        raise RuntimeCheckpointError(f"{path}: field 'moe.shared_expert_intermediate_size' (shared experts) is not "
                                     "supported by the reference runtime",
                                     hint="serve this model with TensorRT-LLM, or `specbuild export vllm|sglang`")
    if (config.get("quantization") or {}).get("quant_algo"):
        raise RuntimeCheckpointError(f"{path}: a quantized mixture-of-experts checkpoint (moe with "
                                     "quantization.quant_algo) is not supported by the reference runtime",
                                     hint="convert it without quantization for the reference runtime")
    qwen_moe = config.get("qwen_type") in ("qwen2_moe", "qwen3_moe")
    inter = _field(config, path, "moe_intermediate_size" if qwen_moe else "intermediate_size", int)
    mapping = config.get("mapping") or {}
    moe_tp, moe_ep = int(mapping.get("moe_tp_size", -1)), int(mapping.get("moe_ep_size", -1))
    if moe_tp == -1 and moe_ep == -1:  # TensorRT-LLM's Mapping default: experts' rows split over every TP rank
        moe_tp, moe_ep = tp, 1
    elif moe_tp == -1:
        moe_tp = tp // moe_ep
    elif moe_ep == -1:
        moe_ep = tp // moe_tp
    if moe_tp * moe_ep != tp or experts % moe_ep or inter % moe_tp:
        raise RuntimeCheckpointError(
            f"{path}: mapping.moe_tp_size {moe_tp} * moe_ep_size {moe_ep} must be tp_size {tp}, dividing "
            f"moe.num_experts {experts} and the experts' intermediate size {inter}", hint=_RECONVERT)
    return {"moe_num_experts": experts, "moe_top_k": top_k, "moe_normalization": MOE_NORMALIZATION[mode],
            "moe_intermediate_size": inter, "moe_tp_size": moe_tp, "moe_ep_size": moe_ep}


def _window_value(value: Any, path: Path, name: str) -> int:
    window = _field({name: value}, path, name, int)  # errors name the config field, not a placeholder
    if window < 1:
        raise RuntimeCheckpointError(f"{path}: field {name!r} must be a positive number of tokens, not {window}",
                                     hint=_RECONVERT)
    return window


def _attention_windows(config: dict[str, Any], path: Path, architecture: str
                       ) -> tuple[tuple[int | None, ...], int | None]:
    """(per-layer window pattern, the sliding window): `sliding_window` on the layers `_sliding_window_pattern`
    makes local (Gemma 3's fields; specbuild writes them for Gemma 2 too, whose HF layers alternate the same way);
    else TensorRT-LLM's `runtime_defaults.max_attention_window` repeating over
    the layers; else specbuild's `sliding_window` (the HF value the converter keeps) on every layer. A window of at
    least max_position_embeddings hides nothing and counts as full attention."""
    window = None if config.get("sliding_window") is None else _window_value(
        config["sliding_window"], path, "sliding_window")
    pattern = config.get("_sliding_window_pattern")
    if window is not None and pattern is not None:
        every = _window_value(pattern, path, "_sliding_window_pattern")
        return tuple(window if (i + 1) % every else None for i in range(every)), window
    windows = (config.get("runtime_defaults") or {}).get("max_attention_window")
    if windows is None:
        return (), window
    if not isinstance(windows, list) or not windows:
        raise RuntimeCheckpointError(f"{path}: runtime_defaults.max_attention_window must be a non-empty list of "
                                     f"token counts, not {windows!r}", hint=_RECONVERT)
    longest = _field(config, path, "max_position_embeddings", int, 2048)
    values = [_window_value(w, path, "runtime_defaults.max_attention_window") for w in windows]
    pattern_windows = tuple(None if w >= longest else w for w in values)
    local = {w for w in pattern_windows if w is not None}
    if window is None and len(local) == 1:
        window = local.pop()
    if len(set(pattern_windows)) == 1:
        return (), window if window is not None else pattern_windows[0]
    return pattern_windows, window
