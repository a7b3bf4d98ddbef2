"""The reference runtime's models: TensorRT-LLM checkpoints run in plain PyTorch.

Written against TensorRT-LLM's tensor names and module semantics (NVIDIA/TensorRT-LLM 1.x,
tensorrt_llm/models/llama/model.py, models/gpt/model.py, models/medusa/model.py at commit 02499765), not by
mapping back to transformers: LLaMA-family decoders (Llama, Mistral, Qwen2; RMSNorm, GPT-NeoX RoPE,
fused QKV, gated MLP `proj(act(fc(x)) * gate(x))`), GPT-2 (LayerNorm, learned positions, `proj(act(fc(x)))`)
and Medusa (a LLaMA-family base plus heads `x + act(W x + b)` per ResBlock, then the head's own lm_head, all
reading the final normalised hidden state). The families of issue 49 are options of the same modules, set by the
config (`runtime.config` cites their sources): q/k RMSNorm (Qwen3, Gemma 3), a mixture-of-experts MLP
(`runtime.moe`: Mixtral, Qwen3-MoE), Gemma's scaled embedding, inter-layer norms and soft-caps, per-layer attention
windows and a local rope base (Gemma 2/3), a fused swiglu fc and LongRoPE (Phi-3).

A forward writes its tokens' K/V into a `KVCache` without committing them, and attends to each row's committed
prefix plus the new tokens a tree mask allows, which is what draft-target and Medusa verification need.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from specbuild.runtime.checkpoint import load_checkpoint
from specbuild.runtime.config import FUSED_GATED, ModelConfig, RuntimeCheckpointError
from specbuild.runtime.dequantize import (
    QuantizedCheckpointError,
    fp8_qdq,
    input_quantizer,
    kv_cache_scale,
    same_input,
)
from specbuild.runtime.kv_cache import KVCache
from specbuild.runtime.moe import MixtureOfExperts
from specbuild.runtime.rope import RotaryEmbedding, apply_rotary

__all__ = ["ACTIVATIONS", "CausalLM", "ForwardOutput", "ModelConfig"]


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


# Hugging Face's names (the converter passes `hidden_act`/`activation_function` through verbatim): `gelu` is the
# exact erf form, `gelu_new`/`gelu_pytorch_tanh`/`gelu_fast` the tanh approximation.
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "swish": F.silu,
    "gelu": F.gelu,
    "gelu_new": _gelu_tanh,
    "gelu_pytorch_tanh": _gelu_tanh,
    "gelu_fast": _gelu_tanh,
    "relu": F.relu,
    "swiglu": F.silu,
    "geglu": _gelu_tanh,
}
MEDUSA_ACT = F.silu  # TensorRT-LLM's MedusaLayer activation (the converter's --medusa_hidden_act default)


@dataclass
class ForwardOutput:
    """One forward's results for all T input positions."""

    logits: torch.Tensor  # [B, T, vocab_size] float32
    hidden: torch.Tensor  # [B, T, hidden] final normalised hidden state (lm_head's and Medusa heads' input)
    medusa_logits: torch.Tensor | None = None  # [num_medusa_heads, B, T, vocab_size] float32
    # The residual stream after each layer of `forward(capture_layers=...)`, in that order, [B, T, hidden] each:
    # id i is decoder layer i's output (0-based, before ln_f), as TensorRT-LLM's EAGLE-3 capture counts.
    captured: tuple[torch.Tensor, ...] = ()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm with the statistics in float32 (as TensorRT-LLM and HF do for half precision); torch's fused
    kernel, since small decode steps are bound by the number of operations, not their size."""
    return weight * F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)


class _Weights(nn.Module):
    """A module whose tensors are buffers (inference only), named after the checkpoint's tensors. The attributes in
    `input_major` hold their [out, in] GEMM weight as [in, out], contiguous (`project` reads them)."""

    def __init__(self, tensors: dict[str, torch.Tensor], prefix: str, names: dict[str, str],
                 input_major: tuple[str, ...] = ()) -> None:
        super().__init__()
        for attr, name in names.items():
            tensor = tensors.get(prefix + name)
            if attr in input_major and tensor is not None:
                tensor = tensor.t().contiguous()
            self.register_buffer(attr, tensor)


def project(x: torch.Tensor, weight_t: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """`F.linear(x, weight_t.T, bias)` from an [in, out] weight: on the CPU build's BLAS (oneDNN, 2-core Xeon with
    AVX512) the decoder's GEMMs took from a third (24 rows) to 45% (1 row) less time this way than F.linear's [out,
    in] weight, and at 2-3 rows up to 15% more; a decode step is a few dozen of them."""
    out = torch.matmul(x, weight_t)
    return out if bias is None else out + bias


class Attention(_Weights):
    """Fused-QKV multi-head attention with GQA, RoPE (LLaMA family) and the cache; per layer an attention window
    (`window`), the local rotary base (`local_rope`), q/k RMSNorm and Gemma 2's score soft-capping, as the config
    says."""

    def __init__(self, cfg: ModelConfig, tensors: dict[str, torch.Tensor], prefix: str, *,
                 window: int | None = None, local_rope: bool = False) -> None:
        super().__init__(tensors, prefix, {"qkv_weight": "qkv.weight", "qkv_bias": "qkv.bias",
                                           "dense_weight": "dense.weight", "dense_bias": "dense.bias",
                                           "q_norm": "q_layernorm.weight", "k_norm": "k_layernorm.weight"},
                         input_major=("qkv_weight", "dense_weight"))
        self.heads, self.kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.scale = cfg.attention_scale
        self.window, self.local_rope = window, local_rope
        self.eps, self.softcap = cfg.norm_epsilon, cfg.attn_logit_softcap
        if cfg.qk_norm and (self.q_norm is None or self.k_norm is None):
            raise RuntimeCheckpointError(f"{prefix}q_layernorm.weight and {prefix}k_layernorm.weight are needed "
                                         "(qk_layernorm)")
        self.sizes = [cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim]
        # Quantized checkpoints: what TensorRT-LLM does to the GEMM inputs and the KV cache (runtime.dequantize).
        self.qkv_input = input_quantizer(cfg.quant_algo, tensors, prefix + "qkv.")
        self.dense_input = input_quantizer(cfg.quant_algo, tensors, prefix + "dense.")
        self.register_buffer("kv_scale", kv_cache_scale(cfg.kv_cache_quant_algo, tensors, prefix))

    def forward(self, x: torch.Tensor, step: _Step, layer: int) -> torch.Tensor:
        b, t, _ = x.shape
        if self.qkv_input is not None:
            x = self.qkv_input(x)
        q, k, v = project(x, self.qkv_weight, self.qkv_bias).split(self.sizes, dim=-1)
        q = q.view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = k.view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        if self.q_norm is not None:  # per head, before RoPE (HF Qwen3/Gemma3 attention, TRT-LLM qk_layernorm)
            q, k = rms_norm(q, self.q_norm, self.eps), rms_norm(k, self.k_norm, self.eps)
        cos, sin = (step.cos_local, step.sin_local) if self.local_rope else (step.cos, step.sin)
        if cos is not None:
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if self.kv_scale is not None:  # an FP8 cache holds keys (after RoPE) and values rounded to fp8
            k, v = fp8_qdq(k, self.kv_scale), fp8_qdq(v, self.kv_scale)
        step.cache.write(layer, k, v)
        keys = step.cache.keys(layer)[:, :, : step.num_slots]
        values = step.cache.values(layer)[:, :, : step.num_slots]
        mask = step.mask if self.window is None else step.mask_for(self.window)
        if self.softcap is None:
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=self.scale,
                                                 enable_gqa=self.heads != self.kv_heads)
        else:
            out = softcapped_attention(q, keys, values, mask, self.scale, self.softcap)
        out = out.transpose(1, 2).reshape(b, t, -1)
        if self.dense_input is not None:
            out = self.dense_input(out)
        return project(out, self.dense_weight, self.dense_bias)


def softcapped_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None,
                         scale: float, cap: float) -> torch.Tensor:
    """Attention whose scores are soft-capped before the mask and softmax, `cap * tanh(q.k * scale / cap)`
    (HF Gemma 2; TensorRT-LLM's max_attn_value), with the softmax in float32. q [B, H, T, D], keys/values
    [B, KV, S, D] (GQA: each KV head serves H / KV query heads, as rows of one matmul, so that the cache is read as
    it is rather than copied once per query head at every step)."""
    b, heads, t, d = q.shape
    kv, slots = keys.shape[1], keys.shape[2]
    groups = heads // kv
    scores = torch.matmul(q.reshape(b, kv, groups * t, d), keys.transpose(-1, -2)) * scale
    scores = (torch.tanh(scores / cap) * cap).view(b, kv, groups, t, slots)
    if mask is not None:  # [B, 1, T, S], the same for every head
        scores = scores.masked_fill(~mask[:, :, None], float("-inf"))
    weights = torch.softmax(scores.float(), dim=-1).to(q.dtype).view(b, kv, groups * t, slots)
    return torch.matmul(weights, values).view(b, heads, t, d)


class MLP(_Weights):
    """GatedMLP `proj(act(fc(x)) * gate(x))` when there is a gate tensor, else `proj(act(fc(x)))`."""

    def __init__(self, cfg: ModelConfig, tensors: dict[str, torch.Tensor], prefix: str) -> None:
        super().__init__(tensors, prefix, {
            "fc_weight": "fc.weight", "fc_bias": "fc.bias", "gate_weight": "gate.weight", "gate_bias": "gate.bias",
            "proj_weight": "proj.weight", "proj_bias": "proj.bias",
        }, input_major=("fc_weight", "gate_weight", "proj_weight"))
        self.act = ACTIVATIONS[cfg.hidden_act]
        self.fused_gated = cfg.hidden_act in FUSED_GATED and self.gate_weight is None
        self.fc_input = input_quantizer(cfg.quant_algo, tensors, prefix + "fc.")
        self.proj_input = input_quantizer(cfg.quant_algo, tensors, prefix + "proj.")
        if self.gate_weight is not None and not same_input(
            input_quantizer(cfg.quant_algo, tensors, prefix + "gate."), self.fc_input
        ):
            raise RuntimeCheckpointError(f"{prefix}fc and {prefix}gate read the same input but have different "
                                         "activation or pre-quant scales")

        # fc and gate read the same input: one matmul over both weights is one kernel launch instead of two.
        if self.gate_weight is not None:
            self.register_buffer("fc_gate_weight", torch.cat([self.fc_weight, self.gate_weight], dim=1))  # [in, 2F]
            biases = (self.fc_bias, self.gate_bias)
            self.register_buffer("fc_gate_bias", None if biases[0] is None else torch.cat(biases))
            self.fc_weight = self.gate_weight = self.fc_bias = self.gate_bias = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fc_input is not None:
            x = self.fc_input(x)
        if self.fc_weight is None:
            fc, gate = project(x, self.fc_gate_weight, self.fc_gate_bias).chunk(2, dim=-1)
            hidden = self.act(fc) * gate
        elif self.fused_gated:  # one fc holding [x; gate] (Phi-3's swiglu MLP)
            fc, gate = project(x, self.fc_weight, self.fc_bias).chunk(2, dim=-1)
            hidden = fc * self.act(gate)
        else:
            hidden = self.act(project(x, self.fc_weight, self.fc_bias))
        if self.proj_input is not None:
            hidden = self.proj_input(hidden)
        return project(hidden, self.proj_weight, self.proj_bias)


class Norm(_Weights):
    """RMSNorm (LLaMA family) or LayerNorm with bias (GPT-2), by the config's family."""

    def __init__(self, cfg: ModelConfig, tensors: dict[str, torch.Tensor], prefix: str) -> None:
        super().__init__(tensors, prefix, {"weight": "weight", "bias": "bias"})
        self.eps, self.layer_norm = cfg.norm_epsilon, cfg.family == "gpt2"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.layer_norm:
            return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)
        return rms_norm(x, self.weight, self.eps)


class DecoderLayer(nn.Module):
    """Pre-norm residual block: x += attention(input_layernorm(x)); x += mlp(post_layernorm(x)). With Gemma's
    inter_layernorms (GemmaDecoderLayer, models/gemma/model.py @5dedf53b): x += post_layernorm(attention(...));
    x += post_feedforward_layernorm(mlp(pre_feedforward_layernorm(x))). The MLP is a mixture of experts when the
    config has experts."""

    def __init__(self, cfg: ModelConfig, tensors: dict[str, torch.Tensor], index: int) -> None:
        super().__init__()
        prefix = f"transformer.layers.{index}."
        self.index = index
        window = cfg.layer_window(index)
        self.input_layernorm = Norm(cfg, tensors, prefix + "input_layernorm.")
        # Gemma 3's windowed (local) layers use their own rotary base, unscaled (GemmaDecoderLayer).
        self.attention = Attention(cfg, tensors, prefix + "attention.", window=window,
                                   local_rope=cfg.rotary_base_local is not None and window is not None)
        self.post_layernorm = Norm(cfg, tensors, prefix + "post_layernorm.")
        self.mlp: nn.Module = MixtureOfExperts(
            cfg, tensors, prefix + "mlp.", ACTIVATIONS[cfg.hidden_act], gated=cfg.hidden_act in FUSED_GATED
        ) if cfg.moe_num_experts else MLP(cfg, tensors, prefix + "mlp.")
        self.inter_layernorms = cfg.inter_layernorms
        if cfg.inter_layernorms:
            self.pre_feedforward_layernorm = Norm(cfg, tensors, prefix + "pre_feedforward_layernorm.")
            self.post_feedforward_layernorm = Norm(cfg, tensors, prefix + "post_feedforward_layernorm.")

    def forward(self, x: torch.Tensor, step: _Step) -> torch.Tensor:
        if self.inter_layernorms:
            x = x + self.post_layernorm(self.attention(self.input_layernorm(x), step, self.index))
            return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))
        x = x + self.attention(self.input_layernorm(x), step, self.index)
        return x + self.mlp(self.post_layernorm(x))


class MedusaHeads(nn.Module):
    """All Medusa heads at once: weights stacked over heads and stored as the batched matmuls read them ([in, out],
    contiguous: a transposed view costs a decode step's heads a third more on CPU), so a step is a few matmuls."""

    def __init__(self, cfg: ModelConfig, tensors: dict[str, torch.Tensor]) -> None:
        super().__init__()
        heads, layers = range(cfg.num_medusa_heads), range(cfg.num_medusa_layers)
        p = "medusa_heads.{h}.medusa_layers.{l}.linear."
        # [heads, layers, in, out], [heads, layers, 1, out], [heads, hidden, vocab]
        self.register_buffer("weight_t", torch.stack([
            torch.stack([tensors[p.format(h=h, l=n) + "weight"].t() for n in layers]) for h in heads]).contiguous())
        self.register_buffer("bias", torch.stack([
            torch.stack([tensors[p.format(h=h, l=n) + "bias"] for n in layers]) for h in heads])[:, :, None, :])
        self.register_buffer("lm_head_t", torch.stack(
            [tensors[f"medusa_heads.{h}.lm_head.weight"].t() for h in heads]).contiguous())

    def forward(self, hidden: torch.Tensor, heads: int | None = None) -> torch.Tensor:
        """[B, T, H] -> [heads, B, T, V] float32; `heads`: only the first this many (a tree that deep reads no
        others), default all."""
        b, t, h = hidden.shape
        n = self.lm_head_t.shape[0] if heads is None else heads
        x = hidden.reshape(1, b * t, h).expand(n, b * t, h)
        for layer in range(self.weight_t.shape[1]):
            x = x + MEDUSA_ACT(torch.baddbmm(self.bias[:n, layer], x, self.weight_t[:n, layer]))
        logits = torch.bmm(x, self.lm_head_t[:n])
        return logits.float().reshape(n, b, t, -1)


@dataclass
class _Step:
    """What every layer of one forward shares."""

    cache: KVCache
    mask: torch.Tensor | None  # [B, 1, T, num_slots] bool, True = may attend; None = every slot
    num_slots: int
    cos: torch.Tensor | None
    sin: torch.Tensor | None
    # Layers with an attention window take their mask from `mask_for`, built once per window and forward.
    window_mask: Callable[[int], torch.Tensor | None] | None = None
    cos_local: torch.Tensor | None = None  # Gemma 3's local layers: their own rotary base
    sin_local: torch.Tensor | None = None
    masks: dict[int, torch.Tensor | None] = field(default_factory=dict)

    def mask_for(self, window: int) -> torch.Tensor | None:
        """The mask of a layer that sees `window` positions (its own included)."""
        if self.window_mask is None:
            return self.mask
        if window not in self.masks:
            self.masks[window] = self.window_mask(window)
        return self.masks[window]


def attention_mask(lengths: torch.Tensor, num_tokens: int, num_slots: int,
                   tree_mask: torch.Tensor | None, *, positions: torch.Tensor | None = None,
                   window: int | None = None) -> torch.Tensor:
    """[B, 1, T, num_slots]: query t of row b sees slots [0, lengths[b]) and the new token in slot
    lengths[b] + s when tree_mask[b, t, s] (default causal: s <= t).

    With an attention `window` W (a sliding window), a query sees only keys whose position is within W - 1 of its
    own: HF's `kv_idx > q_idx - sliding_window`. Positions are the committed slots' indices (slot i holds position
    i) and, for the new tokens, `positions` [B, T] (a tree's nodes share positions by depth; default: the slot's)."""
    device = lengths.device
    rel = torch.arange(num_slots, device=device)[None, :] - lengths[:, None]  # slot's offset in the block, [B, S]
    rel = rel[:, None, :]  # [B, 1, S]
    if tree_mask is None:
        new = (rel >= 0) & (rel <= torch.arange(num_tokens, device=device)[None, :, None])
    else:
        batch = lengths.shape[0]
        index = rel.clamp(0, num_tokens - 1).expand(batch, num_tokens, num_slots)
        tree = tree_mask.to(device=device, dtype=torch.bool).expand(batch, num_tokens, num_tokens)
        new = (rel >= 0) & (rel < num_tokens) & torch.gather(tree, 2, index)
    allowed = (rel < 0) | new
    if window is not None:
        batch = lengths.shape[0]
        if positions is None:
            positions = lengths[:, None] + torch.arange(num_tokens, device=device)
        positions = positions.to(device).expand(batch, num_tokens)
        slots = torch.arange(num_slots, device=device)[None, :].expand(batch, num_slots)
        block = positions.gather(1, (slots - lengths[:, None]).clamp(0, num_tokens - 1))  # new tokens' positions
        key_positions = torch.where(slots < lengths[:, None], slots, block)  # [B, S]
        allowed = allowed & (key_positions[:, None, :] > positions[:, :, None] - window)
    return allowed[:, None]


class CausalLM(nn.Module):
    """A decoder-only LM (optionally with Medusa heads) built from a TensorRT-LLM checkpoint's tensors."""

    def __init__(self, config: ModelConfig, tensors: dict[str, torch.Tensor]) -> None:
        super().__init__()
        if config.hidden_act not in ACTIVATIONS:
            raise RuntimeCheckpointError(
                f"hidden_act {config.hidden_act!r} is not supported (supported: {', '.join(ACTIVATIONS)})"
            )
        self.config = config
        self.register_buffer("vocab_embedding", tensors["transformer.vocab_embedding.weight"])
        self.register_buffer("position_embedding", tensors.get("transformer.position_embedding.weight"))
        self.layers = nn.ModuleList(DecoderLayer(config, tensors, i) for i in range(config.num_layers))
        self.ln_f = Norm(config, tensors, "transformer.ln_f.")
        self.register_buffer("lm_head", tensors["lm_head.weight"])
        self.medusa_heads = MedusaHeads(config, tensors) if config.num_medusa_heads else None
        self.rope = None if config.family == "gpt2" else RotaryEmbedding(
            config.rotary_dim, config.rotary_base, config.rotary_scaling, config.max_position_embeddings)
        # Gemma 3's local layers: their own base, no scaling (rotary_embedding_base_local, GemmaDecoderLayer).
        self.rope_local = None if config.rotary_base_local is None else RotaryEmbedding(
            config.rotary_dim, config.rotary_base_local, None, config.max_position_embeddings)

    @classmethod
    def from_checkpoint(cls, directory: Path, *, dtype: torch.dtype = torch.float32,
                        device: str | torch.device = "cpu") -> CausalLM:
        """Load a TensorRT-LLM checkpoint directory (any tp/pp) and run it in `dtype` on `device`."""
        loaded = load_checkpoint(Path(directory), dtype=dtype)
        try:
            model = cls(loaded.model_config, loaded.tensors)
        except (RuntimeCheckpointError, QuantizedCheckpointError) as err:
            raise RuntimeCheckpointError(f"{loaded.directory / 'config.json'}: {err.message}") from err
        return model.to(device).eval()

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.dtype

    @property
    def device(self) -> torch.device:
        return self.lm_head.device

    def new_cache(self, batch_size: int, max_len: int) -> KVCache:
        """An empty cache for `batch_size` sequences of up to `max_len` tokens, in the model's dtype/device."""
        c = self.config
        return KVCache(c.num_layers, batch_size, c.num_kv_heads, c.head_dim, max_len, self.dtype, self.device)

    # -- input checks --------------------------------------------------------------------------------------------
    def _check_inputs(self, input_ids: torch.Tensor, cache: KVCache, position_ids: torch.Tensor | None,
                      tree_mask: torch.Tensor | None) -> torch.Tensor:
        """Validate shapes and ranges; returns position_ids as [B, T] on the model's device."""
        if input_ids.dim() != 2 or input_ids.shape[1] < 1:
            raise ValueError(f"input_ids must be [batch, tokens] with at least one token, got {tuple(input_ids.shape)}")
        b, t = input_ids.shape
        if b != cache.batch_size:
            raise ValueError(f"input_ids has batch {b} but the cache was made for batch {cache.batch_size}")
        low, high = int(input_ids.min()), int(input_ids.max())
        if low < 0 or high >= self.config.vocab_size:
            raise ValueError(f"input_ids must be in [0, {self.config.vocab_size}), got values {low}..{high}")
        if tree_mask is not None and (tree_mask.shape[-2:] != (t, t) or tree_mask.dim() not in (2, 3)
                                      or (tree_mask.dim() == 3 and tree_mask.shape[0] not in (1, b))):
            raise ValueError(f"tree_mask must be [T, T] or [B, T, T] with T={t}, B={b}; got {tuple(tree_mask.shape)}")
        if position_ids is None:
            position_ids = cache.lengths[:, None] + torch.arange(t, device=cache.device)
        position_ids = torch.as_tensor(position_ids, dtype=torch.long, device=self.device)
        if position_ids.shape not in ((t,), (1, t), (b, t)):
            raise ValueError(f"position_ids must be [T] or [B, T] with T={t}, B={b}; got {tuple(position_ids.shape)}")
        position_ids = position_ids.expand(b, t)
        if self.position_embedding is not None and int(position_ids.max()) >= self.position_embedding.shape[0]:
            raise ValueError(
                f"position {int(position_ids.max())} is past the model's {self.position_embedding.shape[0]} learned "
                "position embeddings"
            )
        if int(position_ids.min()) < 0:
            raise ValueError("position_ids must be non-negative")
        return position_ids

    def medusa_logits(self, hidden: torch.Tensor, heads: int | None = None) -> torch.Tensor:
        """The Medusa heads on chosen final hidden states [B, T, H] -> [heads, B, T, V]: decoding needs them at
        one accepted position per row, not at every node of the tree the forward just verified; `heads`: the
        first this many only (default all)."""
        if self.medusa_heads is None:
            raise ValueError("this checkpoint has no Medusa heads")
        if heads is not None and not 1 <= heads <= self.config.num_medusa_heads:
            raise ValueError(f"heads must be in [1, {self.config.num_medusa_heads}] (got {heads})")
        return self.medusa_heads(hidden, heads)

    # -- forward -------------------------------------------------------------------------------------------------
    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, cache: KVCache, *, position_ids: torch.Tensor | None = None,
                tree_mask: torch.Tensor | None = None, medusa: bool = False,
                side_layers: tuple[int, Sequence[nn.Module]] | None = None,
                capture_layers: Sequence[int] = ()) -> ForwardOutput:
        """Run T new tokens per row after each row's committed cache prefix; their K/V are written to slots
        lengths[b] .. lengths[b]+T-1 but not committed (see KVCache.advance/compact).

        `side_layers` (n, layers): the residual stream after the first n layers also runs through `layers` (with
        this forward's mask and positions), which only write their own cache layers; their output is dropped. A
        self-draft's adapter layer fills its cache this way in the target's own forward
        (specbuild.runtime.self_draft)."""
        input_ids = input_ids.to(self.device)
        position_ids = self._check_inputs(input_ids, cache, position_ids, tree_mask)
        t = input_ids.shape[1]
        num_slots = cache.begin_block(t)
        # One new token after equally long prefixes sees every slot in use: no mask needed (the common decode step).
        # A layer with an attention window that hides some of the slots gets a mask of its own (`mask_for`), built
        # once per window and forward, only when a layer asks for it.
        uniform_step = t == 1 and tree_mask is None and cache.uniform
        mask = None if uniform_step else attention_mask(cache.lengths, t, num_slots, tree_mask, positions=position_ids)

        def window_mask(window: int) -> torch.Tensor | None:
            if num_slots <= window:
                return mask
            return attention_mask(cache.lengths, t, num_slots, tree_mask, positions=position_ids, window=window)

        x = F.embedding(input_ids, self.vocab_embedding)
        if self.config.embedding_scale != 1.0:  # Gemma: the scale rounded to the activations' dtype, as HF does
            x = x * torch.tensor(self.config.embedding_scale, dtype=x.dtype)
        cos = sin = cos_local = sin_local = None
        if self.rope is not None:
            cos, sin = self.rope.cos_sin(position_ids, x.dtype)
        else:
            x = x + F.embedding(position_ids, self.position_embedding)
        if self.rope_local is not None:
            cos_local, sin_local = self.rope_local.cos_sin(position_ids, x.dtype)
        step = _Step(cache, mask, num_slots, cos, sin, window_mask, cos_local, sin_local)
        if any(not 0 <= i < len(self.layers) for i in capture_layers):
            raise ValueError(f"capture_layers {list(capture_layers)} must be layer ids in [0, {len(self.layers)})")
        captured: dict[int, torch.Tensor] = {}
        for index, layer in enumerate(self.layers):
            if side_layers is not None and index == side_layers[0]:
                side = x
                for extra in side_layers[1]:
                    side = extra(side, step)
            x = layer(x, step)
            if index in capture_layers:
                captured[index] = x
        hidden = self.ln_f(x)
        logits = F.linear(hidden, self.lm_head).float()
        cap = self.config.final_logit_softcap
        if cap is not None:  # Gemma: logits = cap * tanh(logits / cap)
            logits = torch.tanh(logits / cap) * cap
        heads = None
        if medusa and self.medusa_heads is not None:
            heads = self.medusa_heads(hidden)
        return ForwardOutput(logits=logits, hidden=hidden, medusa_logits=heads,
                             captured=tuple(captured[i] for i in capture_layers))
