"""The trainable EAGLE-3 draft: one decoder layer over the target's own low/mid/high features (Li et al. 2025,
"EAGLE-3", arXiv 2503.01840).

Per position t the draft reads `fc([h_low; h_mid; h_high])` (three captured target layers, 3H -> H) and the
embedding of token t+1, and predicts token t+2. Its one layer attends over `[input_layernorm(embedding);
hidden_norm(hidden)]` (2H wide), its residual stream starts at the hidden state (not the embedding), and its
pre-norm output is the hidden state the next draft step reads in place of the target's features. Final `norm`
and `lm_head` give the draft's logits. This is the layer vLLM loads (vllm-project/vllm
vllm/model_executor/models/llama_eagle3.py @00bd1493, `LlamaDecoderLayer.forward` with layer_idx 0 and
`_norm_after_residual`, `LlamaModel.forward` returning (normed, pre-norm)) and SGLang's SpecForge trains
(sgl-project/SpecForge specforge/modeling/draft/llama3_eagle.py @89241ea0).

Parameter names are the checkpoint's (`specbuild.eagle.format.TENSORS`: `fc.weight`,
`midlayer.self_attn.q_proj.weight`, ..., `norm.weight`, `lm_head.weight`), so `state_dict()` is what the format
writes, and the shape is the format's `Eagle3DraftConfig`. The token embedding is the target's (`embed_tokens`, a
frozen buffer, not saved: every loader shares the target's when the draft has none).

Vocabulary: the demo vocabulary is small (2048), so the draft vocabulary is the full one. Its `d2t` would be all
zeros (target id = draft id + d2t[id]); the format lets a full-vocabulary draft omit it, so none is written. A
reduced vocabulary (the paper's 32k of Llama-3's 128k) would need a frequency count over the training text and
`format.vocab_maps`; it is left out.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from specbuild.eagle.format import Eagle3DraftConfig
from specbuild.runtime.model import rms_norm
from specbuild.runtime.rope import RotaryEmbedding, apply_rotary

__all__ = ["Eagle3DraftModule", "StepKV"]


class _Norm(nn.Module):
    """RMSNorm with the runtime's arithmetic (`specbuild.runtime.model.rms_norm`), as a trainable weight."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class _Attention(nn.Module):
    def __init__(self, cfg: Eagle3DraftConfig) -> None:
        super().__init__()
        inner, kv = cfg.num_attention_heads * cfg.head_size, cfg.num_key_value_heads * cfg.head_size
        self.q_proj = nn.Linear(2 * cfg.hidden_size, inner, bias=False)
        self.k_proj = nn.Linear(2 * cfg.hidden_size, kv, bias=False)
        self.v_proj = nn.Linear(2 * cfg.hidden_size, kv, bias=False)
        self.o_proj = nn.Linear(inner, cfg.hidden_size, bias=False)
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_size


class _MLP(nn.Module):
    def __init__(self, cfg: Eagle3DraftConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _MidLayer(nn.Module):
    def __init__(self, cfg: Eagle3DraftConfig) -> None:
        super().__init__()
        self.input_layernorm = _Norm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hidden_norm = _Norm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = _Attention(cfg)
        self.post_attention_layernorm = _Norm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = _MLP(cfg)


@dataclass
class StepKV:
    """One draft step's keys and values [B, kv_heads, T, head_dim] (after RoPE), kept for later steps."""

    keys: torch.Tensor
    values: torch.Tensor


class Eagle3DraftModule(nn.Module):
    """The draft as a trainable module; `step` runs one draft pass over T positions given earlier passes' K/V."""

    def __init__(self, cfg: Eagle3DraftConfig, embed_tokens: torch.Tensor) -> None:
        super().__init__()
        if cfg.target_layer_ids is None:
            raise ValueError("the trainable draft needs explicit target_layer_ids (format.default_layer_ids)")
        if cfg.needs_vocab_maps:
            raise ValueError("a reduced draft vocabulary is not trained here (draft_vocab_size must be vocab_size)")
        self.cfg = cfg
        self.fc = nn.Linear(cfg.num_captured * cfg.feature_size, cfg.hidden_size, bias=False)
        self.midlayer = _MidLayer(cfg)
        self.norm = _Norm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab, bias=False)
        self.register_buffer("embed_tokens", embed_tokens.detach().clone(), persistent=False)
        self.rope = RotaryEmbedding(cfg.head_size, cfg.rope_theta, cfg.rope_scaling, cfg.max_position_embeddings)

    def project(self, aux_hidden: torch.Tensor) -> torch.Tensor:
        """fc over the concatenated captured target layers [B, T, 3H] -> [B, T, H]."""
        return self.fc(aux_hidden)

    def logits(self, prenorm: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(prenorm))

    def step(
        self,
        hidden: torch.Tensor,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        earlier: list[StepKV],
        mask: torch.Tensor,
    ) -> tuple[torch.Tensor, StepKV]:
        """One pass of the draft layer: `hidden` [B, T, H] (fc output or an earlier pass's pre-norm output),
        `input_ids` [B, T] (token t+1 at position t), `positions` [B, T]. Queries attend to the keys of
        `earlier` passes and this one, concatenated in that order, where the boolean `mask` [T, T*(len(earlier)+1)]
        (or [B, 1, T, ...]) allows. Returns the pre-norm output and this pass's K/V."""
        layer, attn = self.midlayer, self.midlayer.self_attn
        b, t, _ = hidden.shape
        embeds = F.embedding(input_ids, self.embed_tokens)
        residual = hidden
        x = torch.cat([layer.input_layernorm(embeds), layer.hidden_norm(hidden)], dim=-1)
        q = attn.q_proj(x).view(b, t, attn.heads, attn.head_dim).transpose(1, 2)
        k = attn.k_proj(x).view(b, t, attn.kv_heads, attn.head_dim).transpose(1, 2)
        v = attn.v_proj(x).view(b, t, attn.kv_heads, attn.head_dim).transpose(1, 2)
        cos, sin = self.rope.cos_sin(positions, q.dtype)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        keys = torch.cat([*(e.keys for e in earlier), k], dim=2)
        values = torch.cat([*(e.values for e in earlier), v], dim=2)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask,
                                             enable_gqa=attn.heads != attn.kv_heads)
        h = residual + attn.o_proj(out.transpose(1, 2).reshape(b, t, -1))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
        return h, StepKV(k, v)
