"""A small random EAGLE-3 draft for a given target, written in the real checkpoint format (specbuild.eagle.format):
greedy equality and lossless sampling must hold for any draft, trained or not."""

from __future__ import annotations

from pathlib import Path

import torch

from specbuild.eagle.format import Eagle3DraftConfig, expected_shapes, vocab_maps, write_eagle3_draft
from specbuild.runtime.model import CausalLM


def random_draft_config(target: CausalLM, *, layer_ids: tuple[int, ...] | None = None,
                        draft_vocab_size: int | None = None) -> Eagle3DraftConfig:
    t = target.config
    return Eagle3DraftConfig(
        hidden_size=t.hidden_size, intermediate_size=2 * t.hidden_size, num_attention_heads=t.num_heads,
        num_key_value_heads=t.num_kv_heads, head_dim=t.head_dim, vocab_size=t.vocab_size,
        draft_vocab_size=draft_vocab_size, target_layer_ids=layer_ids, rope_theta=t.rotary_base,
        max_position_embeddings=t.max_position_embeddings, rms_norm_eps=t.norm_epsilon)


def random_draft_tensors(config: Eagle3DraftConfig, *, seed: int = 0, scale: float = 0.05,
                         lm_head_scale: float = 1.0, own_embedding: bool = False) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, shape in expected_shapes(config).items():
        if name in ("d2t", "t2d") or (name == "embed_tokens.weight" and not own_embedding):
            continue
        if name.endswith("norm.weight"):
            tensors[name] = torch.ones(shape)
        else:
            tensors[name] = torch.randn(shape, generator=gen) * (lm_head_scale if name == "lm_head.weight" else scale)
    if config.needs_vocab_maps:
        ids = torch.randperm(config.vocab_size, generator=gen)[: config.draft_vocab].sort().values
        tensors["d2t"], tensors["t2d"] = vocab_maps(ids, config.vocab_size)
    return tensors


def write_random_draft(directory: Path, target: CausalLM, *, seed: int = 0, layer_ids: tuple[int, ...] | None = None,
                       draft_vocab_size: int | None = None, lm_head_scale: float = 1.0) -> Path:
    config = random_draft_config(target, layer_ids=layer_ids, draft_vocab_size=draft_vocab_size)
    return write_eagle3_draft(directory, config, random_draft_tensors(config, seed=seed, lm_head_scale=lm_head_scale))
