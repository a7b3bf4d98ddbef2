"""Phi-3 (Phi-3/3.5-mini, Phi-3-medium, Phi-4-mini): HF `Phi3ForCausalLM` -> TensorRT-LLM `Phi3ForCausalLM`.

Facts from NVIDIA/TensorRT-LLM, 1.x line (the 1.2 engine flow):
- `MODEL_MAP['Phi3ForCausalLM']` is its own `Phi3ForCausalLM` class (tensorrt_llm/models/__init__.py @02267d3d);
  `Phi3SmallForCausalLM`, `PhiMoEForCausalLM`, `Phi3VForCausalLM` and `Phi4MMForCausalLM` share that class but are
  other models (block-sparse attention and GeGELU, MoE, vision): they are refused below, each with its reason.
- Tensor names (tensorrt_llm/models/phi3/convert.py @89fd9b74, `load_weights_from_hf_model`): the fused
  `self_attn.qkv_proj` is kept whole as `attention.qkv` (rows q, k, v), `o_proj` -> `attention.dense`, the fused
  `mlp.gate_up_proj` becomes `mlp.fc` with its two halves swapped ([up; gate]), `down_proj` -> `mlp.proj`,
  `post_attention_layernorm` -> `post_layernorm`, `model.norm` -> `transformer.ln_f`; with tie_word_embeddings the
  lm_head is the embedding. No `mlp.gate`, no biases: the decoder layer builds `Attention(bias=False)` and
  `MLP(hidden_act, bias=False)` with RmsNorms (models/phi3/model.py @c4dc529f).
- `mlp.fc` is an `MLP` with `hidden_act: swiglu` (Phi3Config maps HF `silu` to it), whose fc has 2 * intermediate
  rows and whose activation is `x, gate = chunk(fc_out, 2, dim=-1); silu(gate) * x` on each rank's own output
  (tensorrt_llm/layers/mlp.py @04a2cacb; functional.swiglu). So each rank's fc must be [up_r; gate_r]. TensorRT-LLM's
  own `split_weights_tp` (models/phi3/split_weights.py @7dfda15a) instead cuts the swapped [up; gate] into contiguous
  tp parts, which at tp=2 gives rank 0 only `up` rows and rank 1 only `gate` rows (the fused-SwiGLU TP pitfall, as
  in NVIDIA/Megatron-LM issue #360); specbuild writes the same names and shapes with the per-rank order the engine's
  arithmetic needs. At tp=1 both are [up; gate]. QKV is split per q/k/v as split_weights_tp does; where there are
  fewer KV heads than ranks (which split_weights_tp cannot cut) each is repeated as LLaMA's converter does
  (`dup_kv_weight`, see sharding.py), since every rank of the engine holds ceil(kv / tp) KV heads.
- config.json (`Phi3Config.from_hugging_face`, models/phi3/config.py @1e6a4f97): `rotary_base` = rope_theta,
  `rotary_scaling` always null, `rotary_pct` = partial_rotary_factor (PretrainedConfig then derives
  `rotary_embedding_dim` = int(head_size * rotary_pct), models/modeling_utils.py, 1.x), `norm_epsilon` = rms_norm_eps,
  `tie_word_embeddings`, and `head_size` left to its default hidden_size // num_attention_heads. Only when
  `max_position_embeddings >= 128000` does it write `position_embedding_type: long_rope` with
  `original_max_position_embeddings`, `longrope_scaling_short_factors` and `longrope_scaling_long_factors` (HF
  rope_scaling short_factor / long_factor); the attention then scales cos/sin by sqrt(1 + ln(s) / ln(original)),
  s = max / original (HF's default `attention_factor`). What that cannot express is refused below.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any, ClassVar

import torch

from specbuild.convert.architectures.base import refuse, register
from specbuild.convert.architectures.decoder import Decoder
from specbuild.convert.architectures.llama import Llama, Mistral
from specbuild.convert.mapping import TensorMapping
from specbuild.convert.sharding import Rank, RowBlocks, fuse_qkv, fused_qkv_rows, split
from specbuild.errors import CheckpointError

#: TensorRT-LLM's Phi3Config switches to long_rope at this max_position_embeddings (models/phi3/config.py @1e6a4f97).
LONG_ROPE_MIN_POSITIONS = 128000
#: transformers' Phi3Config default for original_max_position_embeddings, used when a config omits it.
HF_ORIGINAL_MAX_POSITIONS = 4096


def split_qkv_proj(qkv: torch.Tensor, rank: Rank, q_rows: int, kv_rows: int, num_kv_heads: int) -> RowBlocks:
    """This rank's fused QKV from HF's fused `qkv_proj` (rows q, k, v): the q, k and v blocks split separately."""
    q, k, v = qkv[:q_rows], qkv[q_rows:q_rows + kv_rows], qkv[q_rows + kv_rows:]
    return fuse_qkv(q, k, v, rank, num_kv_heads=num_kv_heads)


def swiglu_fc(gate_up: torch.Tensor, rank: Rank, intermediate: int) -> RowBlocks:
    """This rank's `mlp.fc` from HF's `gate_up_proj` (rows gate, up): [up_r; gate_r], the linear branch first and the
    SiLU branch second, as TensorRT-LLM's swiglu reads each rank's output."""
    gate, up = gate_up[:intermediate], gate_up[intermediate:]
    return RowBlocks([split(up, rank, 0), split(gate, rank, 0)])


@register
class Phi3(Llama):
    """LLaMA's shapes and parallelism rules with Phi-3's fused projections and its own TensorRT-LLM config class."""

    hf_architectures: ClassVar[tuple[str, ...]] = ("Phi3ForCausalLM",)

    def __init__(self, config: dict[str, Any], config_path: Any) -> None:
        super().__init__(config, config_path)
        act = self.field("hidden_act", default="silu", kind=str)
        if act != "silu":
            raise CheckpointError(
                f"{config_path}: field 'hidden_act' is {act!r}; TensorRT-LLM 1.2 runs Phi-3's gated MLP only with "
                "silu (its Phi3Config maps silu to swiglu; another activation would make the MLP ungated)",
                hint="Phi-3 checkpoints use silu; a checkpoint with another activation is not one TensorRT-LLM's Phi-3 "
                "model can serve",
            )
        if self.head_dim != self.hidden // self.heads:
            raise CheckpointError(
                f"{config_path}: field 'head_dim' is {self.head_dim}, not hidden_size / num_attention_heads = "
                f"{self.hidden // self.heads}; TensorRT-LLM 1.2's Phi3Config always derives the head size from those",
                hint="remove head_dim from config.json if it is wrong; a Phi-3 with another head size cannot be built",
            )
        self.rotary_base, self.rotary_pct, self.long_rope = self.rope_settings()

    def window(self) -> int | None:
        """HF Phi-3 attends to the last `sliding_window` tokens in every layer (Phi-3-mini-4k: 2047), as Mistral."""
        return Mistral.window(self)

    # -- rope ------------------------------------------------------------------------------------------------
    def rope_settings(self) -> tuple[float, float, dict[str, Any] | None]:
        """rotary_base, rotary_pct and (for long_rope) the extra config.json fields, from either HF layout:
        transformers 4's top-level rope_theta / partial_rotary_factor / rope_scaling {type: longrope|su} or
        transformers 5's rope_parameters."""
        params = self.config.get("rope_parameters") or {}
        base = float(self.config.get("rope_theta", params.get("rope_theta", 10000.0)))
        pct = float(self.config.get("partial_rotary_factor", params.get("partial_rotary_factor", 1.0)))
        scaling = self.config.get("rope_scaling")
        if scaling is None and params.get("rope_type", params.get("type", "default")) != "default":
            scaling = params
        positions = self.field("max_position_embeddings")
        if scaling is None:
            if positions >= LONG_ROPE_MIN_POSITIONS:
                raise CheckpointError(
                    f"{self.config_path}: max_position_embeddings is {positions} but there is no longrope "
                    "rope_scaling; TensorRT-LLM 1.2 reads short and long factors for every Phi-3 with "
                    f"max_position_embeddings >= {LONG_ROPE_MIN_POSITIONS}",
                    hint="restore the rope_scaling (type longrope, short_factor, long_factor) the checkpoint was "
                    "published with",
                )
            return base, pct, None
        kind = scaling.get("rope_type") or scaling.get("type")
        if kind not in ("longrope", "su"):
            raise CheckpointError(
                f"{self.config_path}: rope scaling type {kind!r} is not one TensorRT-LLM 1.2 converts for Phi-3 "
                "(its Phi3Config knows only longrope short/long factors)",
                hint="Phi-3 checkpoints use rope_scaling type longrope (or su); serve this model with an engine "
                "that supports its rope scaling",
            )
        if positions < LONG_ROPE_MIN_POSITIONS:
            raise CheckpointError(
                f"{self.config_path}: rope_scaling is {kind} but max_position_embeddings is {positions}; TensorRT-LLM "
                f"1.2 applies longrope factors only from max_position_embeddings >= {LONG_ROPE_MIN_POSITIONS} and "
                "would silently drop them, giving other outputs than transformers",
                hint="use the checkpoint's published config (Phi-3 128k configs have max_position_embeddings 131072), "
                "or remove rope_scaling if the model was trained without it",
            )
        original = int(self.config.get("original_max_position_embeddings",
                                       scaling.get("original_max_position_embeddings", HF_ORIGINAL_MAX_POSITIONS)))
        rotary_dim = int(self.head_dim * pct)
        factors = {}
        for name in ("short_factor", "long_factor"):
            values = scaling.get(name)
            if not isinstance(values, list) or len(values) != rotary_dim // 2:
                raise CheckpointError(
                    f"{self.config_path}: rope_scaling {name} must be a list of {rotary_dim // 2} numbers (half the "
                    f"rotary dimension {rotary_dim}), not {values!r}",
                    hint="restore the rope_scaling the checkpoint was published with",
                )
            factors[name] = [float(v) for v in values]
        self.check_longrope_scales(scaling, positions, original)
        return base, pct, {
            "original_max_position_embeddings": original,
            "longrope_scaling_short_factors": factors["short_factor"],
            "longrope_scaling_long_factors": factors["long_factor"],
        }

    def check_longrope_scales(self, scaling: dict[str, Any], positions: int, original: int) -> None:
        """TensorRT-LLM derives the long_rope attention scale from max / original positions alone (no mscale fields
        for Phi3ForCausalLM); HF honours an explicit `factor` or `attention_factor`: one that disagrees is refused."""
        ratio = positions / original
        derived = 1.0 if ratio <= 1.0 else math.sqrt(1 + math.log(ratio) / math.log(original))
        for name, expected in (("factor", ratio), ("attention_factor", derived)):
            value = scaling.get(name)
            if value is not None and not math.isclose(float(value), expected, rel_tol=1e-6):
                raise CheckpointError(
                    f"{self.config_path}: rope_scaling {name} is {value}, but TensorRT-LLM 1.2's Phi-3 long_rope "
                    f"always uses {expected:.6g} (from max_position_embeddings {positions} / "
                    f"original_max_position_embeddings {original})",
                    hint=f"remove {name} from rope_scaling if it is redundant; a Phi-3 scaled otherwise cannot be "
                    "built with TensorRT-LLM 1.2",
                )

    # -- tensors (Decoder's layer loop, with Phi-3's fused projections) ----------------------------------------
    # No biases (Attention(bias=False), MLP(bias=False), models/phi3/model.py @c4dc529f): Decoder's defaults, not
    # LLaMA's config-read ones.
    qkv_bias = Decoder.qkv_bias
    dense_bias = Decoder.dense_bias
    mlp_bias = Decoder.mlp_bias

    def add_qkv(self, m: TensorMapping, rank: Rank, src: str, dst: str) -> None:
        """`attention.qkv` from HF's fused `qkv_proj`, q, k and v split as from separate projections."""
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        m.add(dst + "attention.qkv.weight", (fused_qkv_rows(self.heads, self.kv_heads, self.head_dim, rank.tp_size), h),
              {src + "self_attn.qkv_proj.weight": (q + 2 * kv, h)},
              partial(split_qkv_proj, rank=rank, q_rows=q, kv_rows=kv, num_kv_heads=self.kv_heads))

    def add_mlp(self, m: TensorMapping, rank: Rank, src: str, dst: str) -> None:
        """The swiglu `mlp.fc` ([up_r; gate_r] per rank) from HF's fused `gate_up_proj`, and `mlp.proj`."""
        h, inter, tp = self.hidden, self.intermediate, rank.tp_size
        m.add(dst + "mlp.fc.weight", (2 * inter // tp, h), {src + "mlp.gate_up_proj.weight": (2 * inter, h)},
              partial(swiglu_fc, rank=rank, intermediate=inter))
        m.add(dst + "mlp.proj.weight", (h, inter // tp), {src + "mlp.down_proj.weight": (h, inter)},
              partial(split, rank=rank, dim=1))

    # -- config.json -------------------------------------------------------------------------------------------
    def trtllm_config(self, dtype: str, tp_size: int, pp_size: int) -> dict[str, Any]:
        positions = self.field("max_position_embeddings")
        config = {
            **self.shape_config(dtype, tp_size, pp_size),
            "hidden_act": "swiglu",
            "norm_epsilon": self.field("rms_norm_eps", default=1e-5, kind=float),
            "position_embedding_type": "long_rope" if self.long_rope else "rope_gpt_neox",
            "max_position_embeddings": positions,
            "rotary_embedding_dim": int(self.head_dim * self.rotary_pct),
            "rotary_pct": self.rotary_pct,
            "rotary_base": self.rotary_base,
            "rotary_scaling": None,
            "tie_word_embeddings": self.tied,
            **(self.long_rope or {}),
        }
        if self.sliding_window is not None:
            # As for Mistral (llama.py): TensorRT-LLM's Phi-3 model has no window field (a causal mask; the window is
            # the runtime's max_attention_window_size); the kept field carries it to build, deploy and the runtime.
            config["sliding_window"] = self.sliding_window
        return config


# (Not "use build.flow: pytorch": validate reads every flow's models through architecture_for, which refuses these.)
_OTHER_ENGINES = ("specbuild serves it on no flow; load its Hugging Face directory with an engine that implements "
                  "this architecture itself, or convert a Phi3ForCausalLM model")
refuse(("Phi3SmallForCausalLM",), "Phi-3-small's block-sparse attention, GeGELU MLP and muP scaling (TensorRT-LLM's "
       "Phi-3-small variant, models/phi3/model.py @c4dc529f) are not converted by specbuild", _OTHER_ENGINES)
refuse(("PhiMoEForCausalLM",), "Phi-3.5-MoE's sparse-mixer experts (TensorRT-LLM models/phi3/model.py @c4dc529f) are "
       "not converted by specbuild", _OTHER_ENGINES)
refuse(("Phi3VForCausalLM", "Phi4MMForCausalLM"), "a vision/multimodal Phi model; specbuild converts text-only "
       "decoders", "use a text-only Phi-3 checkpoint (Phi3ForCausalLM)")
