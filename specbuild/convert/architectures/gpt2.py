"""GPT-2: HF `GPT2LMHeadModel` -> TensorRT-LLM `GPTForCausalLM` (gpt_variant gpt2).

Mapping as NVIDIA/TensorRT-LLM's GPT converter writes it (tensorrt_llm/models/gpt/convert.py, commit f59aed07,
1.x): HF GPT-2 uses Conv1D layers whose weights are stored (in, out), so every linear weight is transposed; the
fused `c_attn` is split into Q, K, V rows which are TP-split separately; row-parallel biases are not split;
learned position embeddings; the lm_head is always the (tied) token embedding.
"""

from __future__ import annotations

from functools import partial
from typing import Any, ClassVar

import torch

from specbuild.convert.architectures.base import Architecture, register
from specbuild.convert.mapping import TensorMapping
from specbuild.convert.sharding import Rank, RowBlocks, fuse_qkv, split


def transposed(tensor: torch.Tensor, rank: Rank, dim: int | None) -> torch.Tensor:
    """Conv1D (in, out) -> Linear (out, in), then this rank's part along `dim` (None: whole)."""
    tensor = tensor.t()
    return tensor if dim is None else split(tensor, rank, dim)


def conv1d_qkv(tensor: torch.Tensor, rank: Rank, hidden: int, heads: int) -> RowBlocks:
    """Split `c_attn` (weight (H, 3H) or bias (3H,)) into Q, K, V and fuse this rank's parts."""
    fused = tensor.t() if tensor.dim() == 2 else tensor
    q, k, v = torch.split(fused, hidden, dim=0)
    return fuse_qkv(q, k, v, rank, num_kv_heads=heads)


@register
class GPT2(Architecture):
    hf_architectures: ClassVar[tuple[str, ...]] = ("GPT2LMHeadModel",)
    # Causal-mask buffers saved by older transformers, and the tied lm_head copy some files carry.
    ignored_patterns: ClassVar[tuple[str, ...]] = (
        r"(transformer\.)?h\.\d+\.attn\.(bias|masked_bias)",
        r"lm_head\.weight",
    )

    def __init__(self, config: dict[str, Any], config_path: Any) -> None:
        super().__init__(config, config_path)
        self.hidden = self.field("n_embd", "hidden_size")
        self.layers = self.field("n_layer", "num_hidden_layers")
        self.heads = self.field("n_head", "num_attention_heads")
        self.inner = self.field("n_inner", default=4 * self.hidden)
        self.vocab = self.field("vocab_size")
        self.positions = self.field("n_positions", "max_position_embeddings")
        self.prefix = "transformer."

    def check_source_values(self, checkpoint: Any) -> None:
        # TensorRT-LLM's GPT converter always takes the LM head from wte (models/gpt/convert.py); a different
        # lm_head is refused.
        self.check_tied_head(
            checkpoint, f"{self.prefix}wte.weight", "lm_head.weight",
            "GPT-2's LM head is its token embedding (TensorRT-LLM's GPT converter takes lm_head from wte)",
            hint="GPT2LMHeadModel ties lm_head to transformer.wte; a checkpoint with another lm_head is not a GPT-2 "
            "specbuild can convert: remove lm_head.weight if it is stale, or convert the model's real architecture",
        )

    def bind_sources(self, names: set[str]) -> None:
        # The original OpenAI checkpoints on the Hub store names without the `transformer.` prefix.
        if "transformer.wte.weight" not in names and "wte.weight" in names:
            self.prefix = ""

    @property
    def num_layers(self) -> int:
        return self.layers

    def parallelism_problems(self, tp_size: int, pp_size: int) -> list[str]:
        problems = super().parallelism_problems(tp_size, pp_size)
        if self.heads % tp_size:
            problems.append(f"tp_size {tp_size} does not divide n_head {self.heads}")
        if self.inner % tp_size:
            problems.append(f"tp_size {tp_size} does not divide the MLP size {self.inner}")
        return problems

    def mapping(self, rank: Rank) -> TensorMapping:
        tp, h, inner, p = rank.tp_size, self.hidden, self.inner, self.prefix
        qkv = partial(conv1d_qkv, rank=rank, hidden=h, heads=self.heads)
        column = partial(split, rank=rank, dim=0)
        # Conv1D weights are stored (in, out): transposed to Linear's (out, in), then split.
        column_t = partial(transposed, rank=rank, dim=0)
        row_t = partial(transposed, rank=rank, dim=1)
        m = TensorMapping()
        if rank.is_first_stage:
            m.copy("transformer.vocab_embedding.weight", p + "wte.weight", (self.vocab, h))
            m.copy("transformer.position_embedding.weight", p + "wpe.weight", (self.positions, h))
        for i, layer in enumerate(rank.layers):
            src, dst = f"{p}h.{layer}.", f"transformer.layers.{i}."
            for hf, trt in (("ln_1", "input_layernorm"), ("ln_2", "post_layernorm")):
                m.copy(dst + f"{trt}.weight", src + f"{hf}.weight", (h,))
                m.copy(dst + f"{trt}.bias", src + f"{hf}.bias", (h,))
            m.add(dst + "attention.qkv.weight", (3 * h // tp, h), {src + "attn.c_attn.weight": (h, 3 * h)}, qkv)
            m.add(dst + "attention.qkv.bias", (3 * h // tp,), {src + "attn.c_attn.bias": (3 * h,)}, qkv)
            m.add(dst + "attention.dense.weight", (h, h // tp), {src + "attn.c_proj.weight": (h, h)}, row_t)
            m.copy(dst + "attention.dense.bias", src + "attn.c_proj.bias", (h,))  # row-parallel: not split
            m.add(dst + "mlp.fc.weight", (inner // tp, h), {src + "mlp.c_fc.weight": (h, inner)}, column_t)
            m.add(dst + "mlp.fc.bias", (inner // tp,), {src + "mlp.c_fc.bias": (inner,)}, column)
            m.add(dst + "mlp.proj.weight", (h, inner // tp), {src + "mlp.c_proj.weight": (inner, h)}, row_t)
            m.copy(dst + "mlp.proj.bias", src + "mlp.c_proj.bias", (h,))  # row-parallel: not split
        if rank.is_last_stage:
            m.copy("transformer.ln_f.weight", p + "ln_f.weight", (h,))
            m.copy("transformer.ln_f.bias", p + "ln_f.bias", (h,))
            self.add_lm_head(m, rank, p + "wte.weight", self.vocab, h)  # always the tied embedding
        return m

    def trtllm_config(self, dtype: str, tp_size: int, pp_size: int) -> dict[str, Any]:
        return {
            "architecture": self.hf_architecture,
            **self.common_config(dtype, tp_size, pp_size),
            "gpt_variant": "gpt2",
            "vocab_size": self.vocab,
            "hidden_size": self.hidden,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.heads,
            "head_size": self.hidden // self.heads,
            "intermediate_size": self.inner,
            "hidden_act": self.field("activation_function", default="gelu_new", kind=str),
            "norm_epsilon": self.field("layer_norm_epsilon", default=1e-5, kind=float),
            "position_embedding_type": "learned_absolute",
            "max_position_embeddings": self.positions,
            "bias": True,
            "q_scaling": 1.0,
            "apply_query_key_layer_scaling": False,
            "rotary_pct": 0.0,
            "tie_word_embeddings": True,
        }
