"""Gemma 2 and Gemma 3 (text): HF -> TensorRT-LLM `GemmaForCausalLM`, as TensorRT-LLM 1.x's engine flow writes them.

Facts from NVIDIA/TensorRT-LLM:
- models/gemma/convert.py @65b31db1 (`HfParser.rename_to_trt_llm`, `load_gemma_weights`): the LLaMA names for
  attention and MLP (`attention.qkv` <- q/k/v_proj, `attention.dense` <- o_proj, `mlp.fc` <- gate_proj, `mlp.gate` <-
  up_proj, `mlp.proj` <- down_proj, `post_layernorm` <- post_attention_layernorm, `ln_f` <- model.norm), plus
  `pre_feedforward_layernorm`, `post_feedforward_layernorm` and Gemma 3's `attention.q_layernorm` / `k_layernorm`
  (<- self_attn.q_norm / k_norm); every norm weight is stored as `1 + w` (computed in float32); the lm_head is always
  the embedding (there is no lm_head source); with `use_parallel_embedding` the embedding is split on dim 0, which
  asserts `vocab_size % tp_size == 0`.
- models/gemma/config.py @9df6d722 (`GemmaConfig`): `use_parallel_embedding = tp_size > 1` whatever is passed;
  `inter_layernorms`, `attn_bias`/`mlp_bias` false (from_hugging_face passes no bias), `rotary_base` = HF `rope_theta`,
  `rotary_scaling` read from an HF attribute `rotary_scaling` that Gemma configs do not have (so always null);
  `hidden_act` only if HF has one (Gemma configs have `hidden_activation`), else PretrainedConfig's "gelu"; the
  Gemma2ConfigGroup / Gemma3ConfigGroup fields (models/modeling_utils.py, 1.x): query_pre_attn_scalar,
  final_logit_softcapping, and attn_logit_softcapping (Gemma 2) or _sliding_window_pattern, rope_local_base_freq,
  sliding_window (Gemma 3); `sliding_window` and `_sliding_window_pattern` are named arguments kept only for Gemma 3.
- models/gemma/model.py @5dedf53b: the embedding is multiplied by sqrt(hidden_size) at run time (stored unscaled);
  q_scaling = sqrt(query_pre_attn_scalar) / sqrt(head_size); Gemma 3 layer l slides iff (l + 1) %
  _sliding_window_pattern != 0 and sliding layers take the rope base rope_local_base_freq; q/k norms for Gemma 3 come
  from the architecture (`qk_layernorm=True`), not from config.json's qk_layernorm.
- layers/attention.py (1.x): one `rotary_scaling` applies to both rope tables (global and local), so HF Gemma 3's
  scaling of the global layers alone cannot be expressed; functional.py (1.x): `gelu` is the tanh approximation, and
  ACT2FN has no `gelu_pytorch_tanh` key.
- examples/models/core/gemma/README.md @b35ac1b6: windows per layer are the runtime's max_attention_window_size.
Gemma 2's window and pattern (HF: even layers slide) are written too, as `sliding_window` and
`_sliding_window_pattern: 2`: TensorRT-LLM ignores them on load, the reference runtime and deploy read them.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any, ClassVar

import torch

from specbuild.convert.architectures.base import refuse, register
from specbuild.convert.architectures.decoder import Decoder
from specbuild.convert.mapping import EngineLayoutError, TensorMapping
from specbuild.convert.sharding import Rank, split
from specbuild.errors import CheckpointError

SOURCES = "NVIDIA/TensorRT-LLM models/gemma (config.py @9df6d722, convert.py @65b31db1, model.py @5dedf53b)"
# HF activation names TensorRT-LLM's `gelu` (the tanh approximation, functional.py) computes.
TANH_GELU = ("gelu_pytorch_tanh", "gelu_new", "gelu_fast")
SLIDING, FULL = "sliding_attention", "full_attention"


def plus_one(weight: torch.Tensor) -> torch.Tensor:
    """A Gemma norm weight as TensorRT-LLM's RmsNorm takes it: HF Gemma computes x * (1 + w), TensorRT-LLM x * w."""
    return weight.float() + 1.0


@register
class Gemma2(Decoder):
    """Gemma 2: every norm +1, pre/post feed-forward norms, attention and final soft-capping, alternating windows."""

    hf_architectures: ClassVar[tuple[str, ...]] = ("Gemma2ForCausalLM",)
    #: config.json fields that may hold the sliding pattern when there is no `layer_types` (Gemma 2 has none: HF
    #: Gemma 2 always alternates, the even layers sliding).
    pattern_fields: ClassVar[tuple[str, ...]] = ()
    default_pattern: ClassVar[int] = 2

    def __init__(self, config: dict[str, Any], config_path: Path) -> None:
        super().__init__(config, config_path)
        self.read_sizes(default_head_dim=256)  # HF Gemma2Config/Gemma3TextConfig's head_dim default
        self.window = self.sliding_window()
        self.pattern = self.window_pattern()
        self.check_expressible()

    # -- what TensorRT-LLM's Gemma model can express ---------------------------------------------------------------
    # (Refusals are raised as literal messages, so the troubleshooting page's tables list them; those of a sound
    # checkpoint that only the engine flow's layout cannot hold are EngineLayoutError, which validate does not raise
    # for a model the PyTorch flow loads from its Hugging Face directory.)
    def check_expressible(self) -> None:
        """Refuse a config whose model TensorRT-LLM's GemmaForCausalLM would compute differently."""
        activation = self.config.get("hidden_activation") or self.config.get("hidden_act") or "gelu_pytorch_tanh"
        if activation not in TANH_GELU:
            raise CheckpointError(
                f"{self.config_path}: hidden_activation {activation!r}: TensorRT-LLM's Gemma MLP computes the tanh "
                "GELU (its `gelu`, NVIDIA/TensorRT-LLM tensorrt_llm/functional.py), so this model would give other "
                "outputs",
                hint="use a checkpoint with hidden_activation gelu_pytorch_tanh (as Gemma 2 and 3 ship)")
        for name in ("attention_bias", "use_bidirectional_attention"):
            if self.config.get(name):
                raise CheckpointError(
                    f"{self.config_path}: {name} is true, which TensorRT-LLM's GemmaForCausalLM cannot express (no "
                    f"attention biases, causal attention only; {SOURCES})",
                    hint=f"use a checkpoint with {name}: false (as Gemma 2 and 3 text models ship)")
        self.rope_thetas()  # refuses rope scaling
        self.softcaps()

    def softcaps(self) -> dict[str, float | None]:
        """The soft-capping fields TensorRT-LLM's config group carries for this family (null: no capping)."""
        return {"final_logit_softcapping": self.optional_number("final_logit_softcapping", 30.0),
                "attn_logit_softcapping": self.optional_number("attn_logit_softcapping", 50.0)}

    def optional_number(self, name: str, default: float | None) -> float | None:
        """A positive number or null; absent means transformers' default."""
        value = self.config.get(name, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise CheckpointError(
                f"{self.config_path}: field {name!r} must be a positive number or null, not {value!r}",
                hint="fix config.json: it does not look like one transformers wrote")
        return value

    def sliding_window(self) -> int:
        """Tokens a query on a sliding layer sees (itself included)."""
        window = self.config.get("sliding_window", 4096)  # transformers' default
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise CheckpointError(
                f"{self.config_path}: field 'sliding_window' must be a positive number of tokens, not {window!r}: "
                f"TensorRT-LLM's Gemma config needs the window of its sliding layers ({SOURCES})",
                hint="set sliding_window to the window the model was trained with (Gemma 2: 4096, Gemma 3: 512 or "
                "1024)")
        return window

    def window_pattern(self) -> int:
        """`_sliding_window_pattern` p: layer l slides iff (l + 1) % p != 0 (the only per-layer rule TensorRT-LLM's
        Gemma model has). From `layer_types` when present (transformers 5 writes a stale `_sliding_window_pattern`
        beside it), else from the family's pattern fields."""
        types = self.config.get("layer_types")
        if not types:
            pattern = self.field(*self.pattern_fields, default=self.default_pattern) if self.pattern_fields \
                else self.default_pattern
            if pattern < 1:
                raise CheckpointError(
                    f"{self.config_path}: field {self.pattern_fields[0]!r} must be a positive number of layers, not "
                    f"{pattern}", hint="fix config.json: it does not look like one transformers wrote")
            return pattern
        if not isinstance(types, list) or len(types) != self.layers or not set(types) <= {SLIDING, FULL}:
            raise CheckpointError(
                f"{self.config_path}: field 'layer_types' must list {SLIDING!r} or {FULL!r} for each of the "
                f"{self.layers} layers",
                hint="fix config.json: it does not look like one transformers wrote")
        full = [i for i, kind in enumerate(types) if kind == FULL]
        pattern = full[0] + 1 if full else self.layers + 1
        expected = [SLIDING if (i + 1) % pattern else FULL for i in range(self.layers)]
        if types != expected:
            bad = next(i for i, (kind, rule) in enumerate(zip(types, expected, strict=True)) if kind != rule)
            raise EngineLayoutError(
                f"{self.config_path}: layer_types marks layer {bad} {types[bad]!r}, which TensorRT-LLM cannot "
                "express: its Gemma model slides layer l iff (l + 1) % _sliding_window_pattern != 0 "
                "(NVIDIA/TensorRT-LLM tensorrt_llm/models/gemma/model.py @5dedf53b), and the first full-attention "
                f"layer ({pattern - 1}) makes that pattern {pattern}, under which layer {bad} is {expected[bad]!r}; "
                "TensorRT-LLM's PyTorch backend (build.flow: pytorch), vLLM and SGLang load the Hugging Face "
                "directory as it is",
                hint="serve it from its Hugging Face directory instead: build.flow: pytorch (TensorRT-LLM's own "
                "backend), or `specbuild export vllm|sglang`; or convert a checkpoint whose layer_types repeat one "
                "group of sliding layers ending in a full one")
        return pattern

    def rope_parameters(self, kind: str) -> dict[str, Any]:
        """The rope settings of `kind` layers from either HF layout: transformers 5's `rope_parameters` (flat, or one
        per layer type), or transformers 4's top-level rope_theta / rope_scaling."""
        params = self.config.get("rope_parameters")
        if isinstance(params, dict) and params:
            nested = params.get(kind)
            return nested if isinstance(nested, dict) else params
        return self.legacy_rope(kind)

    def legacy_rope(self, kind: str) -> dict[str, Any]:
        """Rope settings from transformers 4's top-level keys (Hub configs): one rope for every layer."""
        return {"rope_theta": self.config.get("rope_theta", 10000.0), **(self.config.get("rope_scaling") or {})}

    def rope_thetas(self) -> dict[str, float]:
        """config.json's rope bases; a rope scaling is refused: TensorRT-LLM's Gemma config never carries one."""
        return {"rotary_base": self.rope_base(FULL)}

    def rope_base(self, kind: str) -> float:
        params = self.rope_parameters(kind)
        rope_type = params.get("rope_type", params.get("type", "default"))
        if rope_type != "default":
            raise EngineLayoutError(
                f"{self.config_path}: the {kind} layers use {rope_type!r} rope scaling ({params}), which "
                "TensorRT-LLM 1.2's Gemma checkpoint cannot carry: its converter writes rotary_scaling null (it reads "
                "an HF field `rotary_scaling` Gemma configs do not have, models/gemma/config.py @9df6d722), and its "
                "attention applies one scaling to the global and the local rope alike (tensorrt_llm/layers/"
                "attention.py), where HF Gemma 3 scales its global layers only; TensorRT-LLM's PyTorch backend "
                "(build.flow: pytorch), vLLM and SGLang load the Hugging Face directory as it is",
                hint="serve it from its Hugging Face directory instead: build.flow: pytorch (TensorRT-LLM's own "
                "backend), or `specbuild export vllm|sglang`; or convert a Gemma without rope scaling (Gemma 3 1B, "
                "Gemma 2)")
        try:
            return float(params.get("rope_theta", 10000.0))
        except (TypeError, ValueError) as err:
            raise CheckpointError(f"{self.config_path}: rope_theta {params.get('rope_theta')!r} is not a number",
                                  hint="fix config.json: it does not look like one transformers wrote") from err

    # -- shapes ---------------------------------------------------------------------------------------------------
    def parallelism_problems(self, tp_size: int, pp_size: int) -> list[str]:
        problems = super().parallelism_problems(tp_size, pp_size)
        if self.vocab % tp_size:
            problems.append(
                f"tp_size {tp_size} does not divide vocab_size {self.vocab} (TensorRT-LLM's Gemma splits the "
                "embedding by vocabulary rows when tp > 1, models/gemma/config.py and convert.py)")
        return problems

    def is_ignored(self, name: str) -> bool:
        # TensorRT-LLM's Gemma serves the embedding as the LM head; a copy of it saved as lm_head.weight is checked
        # (check_source_values) and not converted.
        return super().is_ignored(name) or name == "lm_head.weight"

    def check_source_values(self, checkpoint: Any) -> None:
        self.check_tied_head(
            checkpoint, "model.embed_tokens.weight", "lm_head.weight",
            f"TensorRT-LLM's Gemma always serves the embedding as the LM head ({SOURCES})",
            hint="convert a checkpoint whose LM head is its embedding (tie_word_embeddings: true, as Gemma 2 and 3 "
            "ship); a Gemma with a trained head of its own cannot be served by TensorRT-LLM's GemmaForCausalLM",
        )

    # -- tensors: Decoder's layer loop with Gemma's norms and embedding ---------------------------------------------
    #: Gemma normalises the attention output and the MLP's input and output (all three before the MLP is declared).
    mlp_norms: ClassVar[tuple[tuple[str, str], ...]] = (
        ("post_layernorm", "post_attention_layernorm"),
        ("pre_feedforward_layernorm", "pre_feedforward_layernorm"),
        ("post_feedforward_layernorm", "post_feedforward_layernorm"),
    )

    def add_embedding(self, m: TensorMapping, rank: Rank) -> None:
        """Split by vocabulary rows when tp > 1 (use_parallel_embedding)."""
        m.add("transformer.vocab_embedding.weight", (self.vocab // rank.tp_size, self.hidden),
              {"model.embed_tokens.weight": (self.vocab, self.hidden)}, partial(split, rank=rank, dim=0))

    def add_norm(self, m: TensorMapping, name: str, source: str, size: int | None = None) -> None:
        shape = (size or self.hidden,)
        m.add(name, shape, {source: shape}, plus_one)

    def lm_head_source(self) -> str:
        return "model.embed_tokens.weight"

    # -- config.json ------------------------------------------------------------------------------------------------
    def trtllm_config(self, dtype: str, tp_size: int, pp_size: int) -> dict[str, Any]:
        config = {
            **self.shape_config(dtype, tp_size, pp_size),
            "hidden_act": "gelu",  # TensorRT-LLM's tanh GELU (checked in check_expressible)
            "norm_epsilon": self.field("rms_norm_eps", default=1e-6, kind=float),
            "position_embedding_type": "rope_gpt_neox",
            "max_position_embeddings": self.field("max_position_embeddings", default=8192),
            "rotary_embedding_dim": self.head_dim,
            "use_parallel_embedding": tp_size > 1,
            **self.rope_thetas(),
            "rotary_scaling": None,
            "attn_bias": False,
            "mlp_bias": False,
            "inter_layernorms": True,
            "query_pre_attn_scalar": self.query_pre_attn_scalar(),
            **self.softcaps(),
            "sliding_window": self.window,
            "_sliding_window_pattern": self.pattern,
        }
        return config

    def query_pre_attn_scalar(self) -> int | float:
        value = self.config.get("query_pre_attn_scalar", 256)  # transformers' default
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise CheckpointError(
                f"{self.config_path}: field 'query_pre_attn_scalar' must be a positive number, not {value!r}",
                hint="fix config.json: it does not look like one transformers wrote")
        return value


@register
class Gemma3(Gemma2):
    """Gemma 3 text: Gemma 2's layout plus q/k norms; a local rope base on sliding layers; no attention soft-cap."""

    hf_architectures: ClassVar[tuple[str, ...]] = ("Gemma3ForCausalLM",)
    pattern_fields: ClassVar[tuple[str, ...]] = ("sliding_window_pattern", "_sliding_window_pattern")
    default_pattern: ClassVar[int] = 6

    def softcaps(self) -> dict[str, float | None]:
        if self.config.get("attn_logit_softcapping") is not None:
            raise CheckpointError(
                f"{self.config_path}: attn_logit_softcapping is {self.config['attn_logit_softcapping']!r}: "
                "TensorRT-LLM's Gemma 3 config has no attention soft-capping (Gemma3ConfigGroup, "
                "tensorrt_llm/models/modeling_utils.py; models/gemma/model.py @5dedf53b caps only Gemma 2)",
                hint="use a Gemma 3 checkpoint with attn_logit_softcapping: null, as Gemma 3 ships")
        return {"final_logit_softcapping": self.optional_number("final_logit_softcapping", None)}

    def legacy_rope(self, kind: str) -> dict[str, Any]:
        if kind == SLIDING:  # transformers 4: the local layers use rope_local_base_freq, never scaled
            return {"rope_theta": self.config.get("rope_local_base_freq", 10000.0)}
        return {"rope_theta": self.config.get("rope_theta", 1000000.0), **(self.config.get("rope_scaling") or {})}

    def rope_thetas(self) -> dict[str, float]:
        return {"rotary_base": self.rope_base(FULL), "rope_local_base_freq": self.rope_base(SLIDING)}

    def attention_extras(self, m: TensorMapping, rank: Rank, src: str, dst: str) -> None:
        self.add_qk_norms(m, src, dst)  # +1 like every Gemma norm (add_norm)

refuse(("Gemma3ForConditionalGeneration",),
       "Gemma 3 with a vision tower; specbuild converts Gemma 3 text models only (TensorRT-LLM's GemmaForCausalLM has "
       "no vision encoder, and its Gemma converter reads Gemma3ForCausalLM checkpoints, models/gemma/config.py "
       "@9df6d722)",
       "convert a text-only Gemma 3 checkpoint (architectures: [\"Gemma3ForCausalLM\"], e.g. google/gemma-3-1b-it)")
