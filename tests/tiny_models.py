"""Tiny random Hugging Face checkpoints written by real transformers, for converter tests.

Each builder returns the saved directory; models are float16 unless asked otherwise, seeded, and small
enough that a test converts several in well under a second.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from transformers import (
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    PreTrainedModel,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

# name -> (config class, model class, default config kwargs, ModelOpt decoder_type)
FAMILIES: dict[str, tuple[type, type, dict[str, Any], str]] = {
    "llama": (
        LlamaConfig,
        LlamaForCausalLM,
        dict(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, tie_word_embeddings=False, max_position_embeddings=256),
        "llama",
    ),
    "mistral": (
        MistralConfig,
        MistralForCausalLM,
        dict(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, sliding_window=64, max_position_embeddings=256),
        "llama",
    ),
    "qwen2": (
        Qwen2Config,
        Qwen2ForCausalLM,
        dict(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, tie_word_embeddings=True, max_position_embeddings=256),
        "qwen",
    ),
    "gpt2": (
        GPT2Config,
        GPT2LMHeadModel,
        dict(vocab_size=1000, n_embd=64, n_layer=2, n_head=4, n_positions=128, bos_token_id=0, eos_token_id=0),
        "gpt",
    ),
    # The families of issue 49. Windows are small (8 tokens) so that a test prompt is longer than them; head_dim
    # differs from hidden/heads where the family allows it, so that a converter using hidden/heads is caught.
    "qwen3": (
        Qwen3Config,
        Qwen3ForCausalLM,
        dict(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=32, tie_word_embeddings=True, max_position_embeddings=256),
        "qwen",
    ),
    "qwen3_moe": (
        Qwen3MoeConfig,
        Qwen3MoeForCausalLM,
        dict(vocab_size=1000, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_experts=4,
             num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
             tie_word_embeddings=False, max_position_embeddings=256),
        "qwen",
    ),
    "mixtral": (
        MixtralConfig,
        MixtralForCausalLM,
        dict(vocab_size=1000, hidden_size=64, intermediate_size=32, num_local_experts=4, num_experts_per_tok=2,
             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, sliding_window=None,
             tie_word_embeddings=False, max_position_embeddings=256),
        "llama",
    ),
    "gemma2": (
        Gemma2Config,
        Gemma2ForCausalLM,
        dict(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, head_dim=32, sliding_window=8, query_pre_attn_scalar=24,
             attn_logit_softcapping=50.0, final_logit_softcapping=30.0, max_position_embeddings=256),
        "gemma2",
    ),
    "gemma3": (
        Gemma3TextConfig,
        Gemma3ForCausalLM,
        dict(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, head_dim=32, sliding_window=8, query_pre_attn_scalar=24,
             layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
             max_position_embeddings=256),
        "gemma3",
    ),
    "phi3": (
        Phi3Config,
        Phi3ForCausalLM,
        dict(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256, original_max_position_embeddings=256,
             sliding_window=None, pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False),
        "phi3",
    ),
}


def make_model(family: str, seed: int = 0, dtype: torch.dtype = torch.float16, **overrides: Any) -> PreTrainedModel:
    """A randomly initialised model; biases are randomised too so that bias mappings are visible."""
    config_cls, model_cls, defaults, _ = FAMILIES[family]
    torch.manual_seed(seed)
    model = model_cls(config_cls(**{**defaults, **overrides}))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias") or "norm" in name or "ln_" in name:
                param.normal_(0.0, 0.5)
    return model.to(dtype).eval()


def save_model(model: PreTrainedModel, directory: Path, **save_kwargs: Any) -> Path:
    model.save_pretrained(directory, **save_kwargs)
    return directory


def make_checkpoint(directory: Path, family: str, seed: int = 0, **overrides: Any) -> Path:
    return save_model(make_model(family, seed, **overrides), directory)


def edit_config(directory: Path, **changes: Any) -> None:
    path = directory / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))
