"""The EAGLE-3 draft as an inference module of the reference runtime, built from the runtime's own pieces
(Attention, MLP, Norm, RotaryEmbedding, KVCache, attention_mask): one decoder layer with its own KV cache.

One draft position i pairs the token embedding of x[i+1] with a hidden input and predicts x[i+2]. The hidden input
is `fc` of the target's captured features at position i (`fuse`) when the target has verified position i, else the
draft's own output at position i - 1 (a chain step). The layer computes, as TensorRT-LLM's `Eagle3DecoderLayer`,
vLLM's and SGLang's llama_eagle3 do (sources in `specbuild.eagle.format`):

    residual = h;  a = attention(cat[input_layernorm(embed(x)), hidden_norm(h)])   # queries read width 2H
    residual = a + residual;  out = mlp(post_attention_layernorm(residual)) + residual
    logits = lm_head(norm(out)) over the draft vocabulary;  the next chain step's h = out (before `norm`)

The draft shares the target's token embedding unless its checkpoint has its own `embed_tokens`.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from specbuild.eagle.format import (
    Eagle3DraftConfig,
    Eagle3Target,
    draft_to_target,
    fit_problems,
    read_eagle3_draft,
)
from specbuild.errors import CheckpointError
from specbuild.runtime.config import ModelConfig
from specbuild.runtime.kv_cache import KVCache
from specbuild.runtime.model import ACTIVATIONS, MLP, Attention, CausalLM, Norm, _Step, attention_mask
from specbuild.runtime.rope import RotaryEmbedding

_P = "layer."  # the runtime's names for the one layer's tensors (Attention/MLP/Norm read TensorRT-LLM names)


def _runtime_tensors(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """HF names -> the runtime modules' TensorRT-LLM names: fused QKV, mlp.fc <- gate_proj, mlp.gate <- up_proj
    (NVIDIA/TensorRT-LLM's Llama mapping, as specbuild.convert does it)."""
    m = "midlayer."
    return {
        _P + "attention.qkv.weight": torch.cat([tensors[m + f"self_attn.{x}_proj.weight"] for x in "qkv"]),
        _P + "attention.dense.weight": tensors[m + "self_attn.o_proj.weight"],
        _P + "mlp.fc.weight": tensors[m + "mlp.gate_proj.weight"],
        _P + "mlp.gate.weight": tensors[m + "mlp.up_proj.weight"],
        _P + "mlp.proj.weight": tensors[m + "mlp.down_proj.weight"],
        _P + "input_layernorm.weight": tensors[m + "input_layernorm.weight"],
        _P + "hidden_norm.weight": tensors[m + "hidden_norm.weight"],
        _P + "post_layernorm.weight": tensors[m + "post_attention_layernorm.weight"],
        "norm.weight": tensors["norm.weight"],
    }


class Eagle3Draft(nn.Module):
    """An EAGLE-3 draft paired with its target: `fuse` the captured features, run positions with `forward`."""

    def __init__(self, config: Eagle3DraftConfig, tensors: dict[str, torch.Tensor], target: CausalLM,
                 *, dtype: torch.dtype | None = None, source: Path | None = None) -> None:
        super().__init__()
        where = f"{source}: " if source else ""
        t = target.config
        self.config = config
        _check_fits(config, target, where, own_embedding="embed_tokens.weight" in tensors)
        self.layer_ids = config.resolve_layer_ids(t.num_layers)
        if config.hidden_act not in ACTIVATIONS:
            raise CheckpointError(f"{where}hidden_act {config.hidden_act!r} is not supported "
                                  f"(supported: {', '.join(ACTIVATIONS)})")
        self.model_config = ModelConfig(
            architecture="LlamaForCausalLM", vocab_size=config.draft_vocab, hidden_size=config.hidden_size,
            num_layers=1, num_heads=config.num_attention_heads, num_kv_heads=config.num_key_value_heads,
            head_dim=config.head_size, max_position_embeddings=config.max_position_embeddings,
            intermediate_size=config.intermediate_size, hidden_act=config.hidden_act, norm_epsilon=config.rms_norm_eps,
            rotary_base=config.rope_theta, rotary_scaling=config.rope_scaling, rotary_dim=config.head_size)
        dtype, device = dtype or target.dtype, target.device
        named = {k: v.to(device=device, dtype=dtype) for k, v in _runtime_tensors(tensors).items()}
        cfg = self.model_config
        self.input_layernorm = Norm(cfg, named, _P + "input_layernorm.")
        self.hidden_norm = Norm(cfg, named, _P + "hidden_norm.")
        self.attention = Attention(cfg, named, _P + "attention.")
        self.post_layernorm = Norm(cfg, named, _P + "post_layernorm.")
        self.mlp = MLP(cfg, named, _P + "mlp.")
        self.norm = Norm(cfg, named, "norm.")
        self.register_buffer("fc", tensors["fc.weight"].to(device=device, dtype=dtype))
        self.register_buffer("lm_head", tensors["lm_head.weight"].to(device=device, dtype=dtype))
        own = tensors.get("embed_tokens.weight")
        shared = target.vocab_embedding  # no copy when the dtypes agree
        self.register_buffer("embedding", (own if own is not None else shared).to(device=device, dtype=dtype))
        self.register_buffer("draft_ids", draft_to_target(config, tensors).to(device))  # draft index -> target id
        self.target_vocab = t.vocab_size
        self.rope = RotaryEmbedding(cfg.rotary_dim, cfg.rotary_base, cfg.rotary_scaling,
                                    cfg.max_position_embeddings, device)

    @classmethod
    def from_directory(cls, directory: Path, target: CausalLM, *, dtype: torch.dtype = torch.float32) -> Eagle3Draft:
        """Load an EAGLE-3 draft checkpoint (`specbuild.eagle.format`) for `target`; it runs on the target's
        device in `dtype` (the target's features are cast to it)."""
        config, tensors = read_eagle3_draft(Path(directory))
        return cls(config, tensors, target, dtype=dtype, source=Path(directory)).eval()

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.dtype

    @property
    def device(self) -> torch.device:
        return self.lm_head.device

    def new_cache(self, batch_size: int, max_len: int) -> KVCache:
        c = self.model_config
        return KVCache(1, batch_size, c.num_kv_heads, c.head_dim, max_len, self.dtype, self.device)

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """The target's captured features [..., len(layer_ids) * H_target] (concatenated in `layer_ids` order)
        -> the draft's hidden input [..., H]."""
        return F.linear(features.to(self.dtype), self.fc)

    def to_target_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits [..., Vd] -> target-vocabulary logits [..., V], -inf where the draft cannot
        propose (vLLM's Eagle3LlamaForCausalLM.compute_logits does the same)."""
        if logits.shape[-1] == self.target_vocab and self.draft_ids.numel() == self.target_vocab:
            return logits.index_select(-1, torch.argsort(self.draft_ids))  # a permutation (identity without d2t)
        out = logits.new_full((*logits.shape[:-1], self.target_vocab), float("-inf"))
        out[..., self.draft_ids] = logits
        return out

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, hidden: torch.Tensor, cache: KVCache,
                position_ids: torch.Tensor | None = None,
                tree_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """T positions per row after each row's committed draft cache: input_ids [B, T] are the tokens x[i+1],
        hidden [B, T, H] the hidden inputs (`fuse`d features or the previous `out`). Returns (logits over the
        target vocabulary [B, T, V] float32, out [B, T, H] for the next chain step). K/V are written, not
        committed (KVCache.advance).

        `tree_mask` [T, P + T] (or [B, T, P + T]), for a token tree drafted depth by depth: query t sees the
        row's last P committed entries (the tree's earlier depths) and the T new ones only where it is True;
        entries before those (the verified context) stay visible to every query. Default: causal."""
        b, t = input_ids.shape
        if hidden.shape != (b, t, self.config.hidden_size):
            raise ValueError(f"hidden must be [{b}, {t}, {self.config.hidden_size}], got {tuple(hidden.shape)}")
        input_ids, hidden = input_ids.to(self.device), hidden.to(self.device, self.dtype)
        if position_ids is None:
            position_ids = cache.lengths[:, None] + torch.arange(t, device=cache.device)
        position_ids = position_ids.to(self.device).expand(b, t)
        num_slots = cache.begin_block(t)
        if tree_mask is None:
            mask = attention_mask(cache.lengths, t, num_slots, None)
        else:
            mask = _tree_slots_mask(cache.lengths, tree_mask.to(self.device), b, t, num_slots)
        cos, sin = self.rope.cos_sin(position_ids, self.dtype)
        step = _Step(cache, mask, num_slots, cos, sin)
        embeds = F.embedding(input_ids, self.embedding)
        x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)
        residual = self.attention(x, step, 0) + hidden
        out = self.mlp(self.post_layernorm(residual)) + residual
        logits = F.linear(self.norm(out), self.lm_head).float()
        return self.to_target_logits(logits), out


def _tree_slots_mask(lengths: torch.Tensor, tree_mask: torch.Tensor, batch: int, t: int, num_slots: int
                     ) -> torch.Tensor:
    """[B, 1, T, num_slots] from a mask over each row's last P committed slots and its T new ones (see forward)."""
    width = tree_mask.shape[-1]
    if tree_mask.shape[-2] != t or width < t or tree_mask.dim() not in (2, 3):
        raise ValueError(f"tree_mask must be [T, P + T] or [B, T, P + T] with T={t}, got {tuple(tree_mask.shape)}")
    earlier = width - t
    if bool((lengths < earlier).any()):
        raise ValueError(f"tree_mask covers {earlier} committed entries but a row holds {lengths.min().item()}")
    rel = torch.arange(num_slots, device=lengths.device)[None, :] - (lengths[:, None] - earlier)  # [B, S]
    tree = tree_mask.to(torch.bool).expand(batch, t, width)
    seen = torch.gather(tree, 2, rel.clamp(0, width - 1)[:, None, :].expand(batch, t, num_slots))
    rel = rel[:, None, :]
    return ((rel < 0) | ((rel < width) & seen))[:, None]


def _check_fits(config: Eagle3DraftConfig, target: CausalLM, where: str, *, own_embedding: bool) -> None:
    """The draft reads the target's features, embedding and vocabulary: refuse a pair that cannot work, by the
    one fit rule `validate` also applies (`specbuild.eagle.format.fit_problems`)."""
    t = target.config
    problems = fit_problems(config, Eagle3Target(t.architecture, t.hidden_size, t.vocab_size, t.num_layers),
                            own_embedding=own_embedding)
    if problems:
        more = f" (and {len(problems) - 1} more: {'; '.join(problems[1:])})" if len(problems) > 1 else ""
        raise CheckpointError(f"{where}{problems[0]}{more}",
                              hint="an EAGLE-3 draft is trained for one target: `specbuild eagle train TARGET_DIR "
                                   "OUT_DIR` makes one for this target")
