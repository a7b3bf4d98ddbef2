"""The rank mapping TensorRT-LLM's LLaMA-style decoders share, written once: the embedding; per layer the input norm,
the fused QKV, `attention.dense`, the norm(s) before the MLP and the MLP; then `ln_f` and the LM head.

Names and splits as NVIDIA/TensorRT-LLM's LLaMA converter writes them (tensorrt_llm/models/llama/convert.py
@04a2cacb, `get_prefix_and_param_name_map()`): `mlp.fc` <- `gate_proj` (the activated branch), `mlp.gate` <-
`up_proj`; q, k and v split separately, then fused (KV heads repeated when fewer than tp, see sharding.py);
`attention.dense` and `mlp.proj` row-parallel (split on dim 1, their biases whole, added once after the
all-reduce); the other projections and their biases column-parallel (dim 0). Qwen (models/qwen/convert.py @0428c188),
Mixtral (layers/moe.py @03961722), Phi-3 (models/phi3/convert.py @89fd9b74) and Gemma (models/gemma/convert.py
@65b31db1) keep those names. What a family does differently is a hook below, overridden in its own class (Qwen3's q/k
norms: `attention_extras`; experts: `add_mlp`; Phi-3's fused projections: `add_qkv`, `add_mlp`; Gemma's +1 norms and
vocabulary-split embedding: `add_norm`, `add_embedding`, `mlp_norms`); the loop itself names no family.
"""

from __future__ import annotations

from functools import partial
from typing import Any, ClassVar

from specbuild.convert.architectures.base import Architecture
from specbuild.convert.mapping import TensorMapping
from specbuild.convert.sharding import Rank, decoder_tp_problems, fuse_qkv, fused_qkv_rows, split


class Decoder(Architecture):
    """A decoder-only transformer in TensorRT-LLM's LLaMA layout. Subclasses read the sizes in `__init__`."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    #: The norms between attention and MLP, as (TensorRT-LLM, HF) names under each layer, in write order.
    mlp_norms: ClassVar[tuple[tuple[str, str], ...]] = (("post_layernorm", "post_attention_layernorm"),)

    def read_sizes(self, default_head_dim: int | None = None) -> None:
        """The sizes from HF config.json (head_dim defaults to hidden / heads unless the family says otherwise)."""
        self.hidden = self.field("hidden_size")
        self.layers = self.field("num_hidden_layers")
        self.heads = self.field("num_attention_heads")
        self.kv_heads = self.field("num_key_value_heads", default=self.heads)
        self.head_dim = self.field("head_dim", default=default_head_dim or self.hidden // self.heads)
        self.intermediate = self.field("intermediate_size")
        self.vocab = self.field("vocab_size")

    @property
    def num_layers(self) -> int:
        return self.layers

    # -- biases (none unless the family has them) ------------------------------------------------------------------
    @property
    def qkv_bias(self) -> bool:
        return False

    @property
    def dense_bias(self) -> bool:
        return False

    @property
    def mlp_bias(self) -> bool:
        return False

    # -- config.json ---------------------------------------------------------------------------------------------
    def shape_config(self, dtype: str, tp_size: int, pp_size: int) -> dict[str, Any]:
        """The head of every decoder's TensorRT-LLM `config.json`: the architecture, the common fields and the sizes
        (in this key order, which the families' config.json bytes keep)."""
        return {
            "architecture": self.hf_architecture,
            **self.common_config(dtype, tp_size, pp_size),
            "vocab_size": self.vocab,
            "hidden_size": self.hidden,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "head_size": self.head_dim,
            "intermediate_size": self.intermediate,
        }

    # -- tensor parallelism ----------------------------------------------------------------------------------------
    def parallelism_problems(self, tp_size: int, pp_size: int) -> list[str]:
        return super().parallelism_problems(tp_size, pp_size) + decoder_tp_problems(
            tp_size, self.heads, self.kv_heads, self.dense_intermediate)

    @property
    def dense_intermediate(self) -> int | None:
        """The intermediate size tp splits in the dense MLP, or None where no layer has one (experts split their
        own size, which their family checks)."""
        return self.intermediate

    # -- the one layer loop ----------------------------------------------------------------------------------------
    def mapping(self, rank: Rank) -> TensorMapping:
        m = TensorMapping()
        if rank.is_first_stage:
            self.add_embedding(m, rank)
        for i, layer in enumerate(rank.layers):
            src, dst = f"model.layers.{layer}.", f"transformer.layers.{i}."
            self.add_norm(m, dst + "input_layernorm.weight", src + "input_layernorm.weight")
            self.add_qkv(m, rank, src, dst)
            self.add_dense(m, rank, src, dst)
            self.attention_extras(m, rank, src, dst)
            for trt, hf in self.mlp_norms:
                self.add_norm(m, dst + f"{trt}.weight", src + f"{hf}.weight")
            self.add_mlp(m, rank, src, dst)
        if rank.is_last_stage:
            self.add_norm(m, "transformer.ln_f.weight", "model.norm.weight")
            self.add_lm_head(m, rank, self.lm_head_source(), self.vocab, self.hidden)
        return m

    # -- hooks -----------------------------------------------------------------------------------------------------
    def add_embedding(self, m: TensorMapping, rank: Rank) -> None:
        """The token embedding, whole on every rank (no parallel embedding)."""
        m.copy("transformer.vocab_embedding.weight", "model.embed_tokens.weight", (self.vocab, self.hidden))

    def add_norm(self, m: TensorMapping, name: str, source: str, size: int | None = None) -> None:
        """One RMSNorm weight (of `size` values, hidden_size by default), copied as it is."""
        m.copy(name, source, (size or self.hidden,))

    def lm_head_source(self) -> str:
        """The HF tensor the LM head is made from."""
        return "lm_head.weight"

    def add_qkv(self, m: TensorMapping, rank: Rank, src: str, dst: str) -> None:
        """`attention.qkv` (and its bias) from the separate q, k and v projections."""
        h, rows = self.hidden, fused_qkv_rows(self.heads, self.kv_heads, self.head_dim, rank.tp_size)
        kv = self.kv_heads * self.head_dim
        projections = {"q": self.heads * self.head_dim, "k": kv, "v": kv}
        qkv = partial(fuse_qkv, rank=rank, num_kv_heads=self.kv_heads)
        m.add(dst + "attention.qkv.weight", (rows, h),
              {src + f"self_attn.{p}_proj.weight": (n, h) for p, n in projections.items()}, qkv)
        if self.qkv_bias:
            m.add(dst + "attention.qkv.bias", (rows,),
                  {src + f"self_attn.{p}_proj.bias": (n,) for p, n in projections.items()}, qkv)

    def add_dense(self, m: TensorMapping, rank: Rank, src: str, dst: str) -> None:
        """`attention.dense` (row-parallel) and its bias (whole: added once after the all-reduce)."""
        h, q = self.hidden, self.heads * self.head_dim
        m.add(dst + "attention.dense.weight", (h, q // rank.tp_size), {src + "self_attn.o_proj.weight": (h, q)},
              partial(split, rank=rank, dim=1))
        if self.dense_bias:
            m.copy(dst + "attention.dense.bias", src + "self_attn.o_proj.bias", (h,))

    def attention_extras(self, m: TensorMapping, rank: Rank, src: str, dst: str) -> None:
        """Tensors of the attention beyond QKV and dense (e.g. `add_qk_norms`), declared after `attention.dense`."""

    def add_qk_norms(self, m: TensorMapping, src: str, dst: str) -> None:
        """Per-head RMSNorm weights of the queries and keys (head_dim values, whole on every TP rank):
        `attention.q_layernorm` / `k_layernorm` <- `self_attn.q_norm` / `k_norm`, as TensorRT-LLM's Qwen and Gemma
        converters name them (models/qwen/convert.py @0428c188, models/gemma/convert.py @65b31db1)."""
        for trt, hf in (("q_layernorm", "q_norm"), ("k_layernorm", "k_norm")):
            self.add_norm(m, dst + f"attention.{trt}.weight", src + f"self_attn.{hf}.weight", self.head_dim)

    def add_mlp(self, m: TensorMapping, rank: Rank, src: str, dst: str) -> None:
        """The dense gated MLP: `mlp.fc` <- gate_proj and `mlp.gate` <- up_proj column-parallel, `mlp.proj` <-
        down_proj row-parallel (its bias whole)."""
        h, inter, tp = self.hidden, self.intermediate, rank.tp_size
        column = partial(split, rank=rank, dim=0)
        for trt, hf in (("fc", "gate"), ("gate", "up")):
            m.add(dst + f"mlp.{trt}.weight", (inter // tp, h), {src + f"mlp.{hf}_proj.weight": (inter, h)}, column)
            if self.mlp_bias:
                m.add(dst + f"mlp.{trt}.bias", (inter // tp,), {src + f"mlp.{hf}_proj.bias": (inter,)}, column)
        m.add(dst + "mlp.proj.weight", (h, inter // tp), {src + "mlp.down_proj.weight": (h, inter)},
              partial(split, rank=rank, dim=1))
        if self.mlp_bias:
            m.copy(dst + "mlp.proj.bias", src + "mlp.down_proj.bias", (h,))
