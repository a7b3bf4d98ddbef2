"""The reference runtime runs the families of issue 49 (Qwen3, Qwen3-MoE, Mixtral, Gemma 2, Gemma 3 text, Phi-3):
each tiny checkpoint, written by transformers and converted by `specbuild convert`, decodes greedily token for token
as transformers' own `generate` does on the same float32 model, on a prompt shorter and one longer than the 8-token
attention window of the tiny Gemmas; a TP=2 conversion gives the TP=1 logits; the serving engine's batches of
different-length prompts give each prompt's output alone; and draft-target decoding with a draft of the same family
is lossless (speculative greedy == plain greedy).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from transformers import PreTrainedModel

from specbuild.runtime import CausalLM, RuntimeCheckpointError, load_checkpoint
from specbuild.runtime.generation import generate
from specbuild.runtime.sequence import StopCriteria
from specbuild.runtime.serving import EngineRequest, ServingEngine
from specbuild.runtime.speculative import DraftTargetConfig, generate_draft_target
from tests import test_runtime_model
from tests.test_runtime_model import (
    Builder,
    copy_checkpoint,
    edit_trt_config,
    full_logits,
    max_diff,
    prompt,
    read_rank,
)

build = test_runtime_model.build  # the same memoised convert-a-tiny-model fixture the runtime model tests use

FAMILIES = ("qwen3", "qwen3_moe", "mixtral", "gemma2", "gemma3", "phi3")
NEW_TOKENS = 12
WINDOW = 8  # tests/tiny_models.py gives the Gemmas an 8-token sliding window
ROTARY_HALF = 8  # Phi-3's tiny head_size 16 / 2: one LongRoPE factor per rotary frequency
#: Phi-3 128k-style LongRoPE whose original context (16) the longer prompt passes: the long factors take over there.
LONGROPE = dict(max_position_embeddings=131072, original_max_position_embeddings=16,
                rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                 "short_factor": [1.0 + i / 8 for i in range(ROTARY_HALF)],
                                 "long_factor": [3.0 + i for i in range(ROTARY_HALF)]})
#: Random routers are nearly uniform and attention scores tiny (initializer_range 0.02): larger weights make which
#: experts win, how their outputs are weighted, and a score soft-cap change the logits well past the tolerance.
SHARP_ROUTER = {"initializer_range": 0.3}
#: Each family as tiny_models makes it, plus the variants that take another path through the runtime, or make a path
#: visible: soft-caps small enough to bend these random models' scores and logits (tiny_models' 50 / 30 barely do).
VARIANTS = [*((f, {}) for f in FAMILIES), ("phi3", LONGROPE), ("phi3", {"sliding_window": WINDOW}),
            ("mixtral", SHARP_ROUTER), ("qwen3_moe", SHARP_ROUTER),
            ("qwen3_moe", {**SHARP_ROUTER, "norm_topk_prob": False}),
            # transformers' SDPA attention leaves Gemma 2's score soft-cap out; its eager attention is the model.
            ("gemma2", {**SHARP_ROUTER, "attn_logit_softcapping": 1.0, "final_logit_softcapping": 2.0,
                        "attn_implementation": "eager"}),
            ("gemma3", {"final_logit_softcapping": 2.0})]
VARIANT_IDS = [*FAMILIES, "phi3-longrope", "phi3-window", "mixtral-sharp-router", "qwen3_moe-sharp-router",
               "qwen3_moe-no-renormalization", "gemma2-small-softcaps", "gemma3-final-softcap"]


def hf_greedy(hf: PreTrainedModel, ids: list[int], new_tokens: int) -> list[int]:
    out = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                      max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    return out[0, len(ids):].tolist()


def two_prompts() -> list[list[int]]:
    """One prompt shorter than the window and one three windows long, so that generation runs past it."""
    return [prompt(1, 5, seed=3)[0].tolist(), prompt(1, 3 * WINDOW, seed=4)[0].tolist()]


@pytest.mark.parametrize(("family", "overrides"), VARIANTS, ids=VARIANT_IDS)
def test_greedy_equals_transformers(build: Builder, family: str, overrides: dict) -> None:
    hf, ckpt = build(family, **overrides)
    model = CausalLM.from_checkpoint(ckpt)
    stop = StopCriteria(max_new_tokens=NEW_TOKENS)
    for ids in two_prompts():
        assert generate(model, [ids], stop=stop).output_ids[0] == hf_greedy(hf, ids, NEW_TOKENS), ids


@pytest.mark.parametrize(("family", "overrides"), VARIANTS, ids=VARIANT_IDS)
def test_logits_equal_transformers_past_the_window(build: Builder, family: str, overrides: dict) -> None:
    """One forward over 3 windows of tokens gives transformers' logits at every position, and so does feeding the
    same tokens one at a time through the cache (the decode path: a window's mask at every step) against transformers
    fed the same way (with LongRoPE the two differ: keys cached before the original context keep the short factors)."""
    hf, ckpt = build(family, **overrides)
    model = CausalLM.from_checkpoint(ckpt)
    ids = prompt(2, 3 * WINDOW, seed=5)
    with torch.no_grad():
        expected = hf(ids).logits.float()
        past, hf_steps = None, []
        for t in range(ids.shape[1]):
            out = hf(ids[:, t:t + 1], past_key_values=past, use_cache=True)
            past = out.past_key_values
            hf_steps.append(out.logits.float())
    assert max_diff(full_logits(model, ids), expected) < 1e-3
    cache = model.new_cache(2, ids.shape[1])
    stepwise = []
    for t in range(ids.shape[1]):
        stepwise.append(model(ids[:, t:t + 1], cache).logits)
        cache.advance(1)
    assert max_diff(torch.cat(stepwise, dim=1), torch.cat(hf_steps, dim=1)) < 1e-3


@pytest.mark.parametrize(("family", "tp", "pp"), [*((f, 2, 1) for f in FAMILIES), ("gemma3", 1, 2), ("mixtral", 2, 2)])
def test_sharded_checkpoint_gives_unsharded_logits(build: Builder, family: str, tp: int, pp: int) -> None:
    """TP=2 merges experts, fused gated fc and replicated norms back; PP=2 keeps each layer's window and rope base
    by its global index."""
    _, one = build(family)
    _, sharded = build(family, tp=tp, pp=pp)
    ids = prompt(2, 2 * WINDOW, seed=6)
    assert max_diff(full_logits(CausalLM.from_checkpoint(sharded), ids),
                    full_logits(CausalLM.from_checkpoint(one), ids)) < 1e-4


def alone(model: CausalLM, request: EngineRequest) -> list[int]:
    engine = ServingEngine(model, max_batch=1, max_seq_len=96)
    handle = engine.submit(request)
    engine.run_until_idle()
    return handle.wait(0).tokens


@pytest.mark.parametrize("family", ("qwen3_moe", "mixtral", "gemma2", "gemma3"))
def test_serving_batch_equals_each_alone(build: Builder, family: str) -> None:
    """Prompts of different lengths (some past the window) joining a running batch: MoE routing per token and
    per-layer windows per row give each request what it gets alone."""
    _, ckpt = build(family)
    model = CausalLM.from_checkpoint(ckpt)
    gen = torch.Generator().manual_seed(7)
    requests = [EngineRequest(torch.randint(4, 1000, (n,), generator=gen).tolist(), 14) for n in (3, 11, 20, 6)]
    engine = ServingEngine(model, max_batch=4, max_seq_len=96)
    handles = []
    for request in requests:
        handles.append(engine.submit(request))
        engine.step()
    engine.run_until_idle()
    assert engine.stats.rows_forwarded > engine.stats.forwards  # they did share forwards
    assert [h.wait(0).tokens for h in handles] == [alone(model, r) for r in requests]


@pytest.mark.parametrize("family", FAMILIES)
def test_draft_target_with_a_same_family_draft_is_lossless(build: Builder, family: str) -> None:
    _, target_dir = build(family)
    _, draft_dir = build(family, seed=1)
    target, draft = CausalLM.from_checkpoint(target_dir), CausalLM.from_checkpoint(draft_dir)
    prompts = two_prompts()
    stop = StopCriteria(max_new_tokens=NEW_TOKENS)
    plain = generate(target, prompts, stop=stop).output_ids
    for k in (1, 4):
        assert generate_draft_target(target, draft, prompts, stop=stop, config=DraftTargetConfig(k)).output_ids == plain



def test_expert_parallel_shards_give_unsharded_logits(build: Builder, tmp_path: Path) -> None:
    """Experts split whole over moe_ep_size ranks (no converter writes this yet; the layout is TensorRT-LLM's:
    rank t holds expert shard moe_ep_rank = t % moe_ep_size, num_experts / moe_ep_size consecutive experts, by
    tensorrt_llm/mapping.py's `moe_ep_rank = tp_rank % moe_ep_size` and layers/moe.py's ep_experts): made here from
    the TP=1 experts over a TP=2 conversion, it gives the TP=1 logits."""
    _, one = build("mixtral")
    ckpt = copy_checkpoint(build("mixtral", tp=2)[1], tmp_path / "ep")
    full = read_rank(one / "rank0.safetensors")
    config = json.loads((ckpt / "config.json").read_text())
    edit_trt_config(ckpt, mapping={**config["mapping"], "moe_tp_size": 1, "moe_ep_size": 2})
    for rank in range(2):
        path = ckpt / f"rank{rank}.safetensors"
        tensors = read_rank(path)
        for name in tensors:
            if name.endswith(("mlp.fc.weight", "mlp.proj.weight")):
                tensors[name] = full[name].chunk(2, dim=0)[rank % 2].contiguous()
        save_file(tensors, path)
    ids = prompt(2, 2 * WINDOW, seed=8)
    assert max_diff(full_logits(CausalLM.from_checkpoint(ckpt), ids), full_logits(CausalLM.from_checkpoint(one), ids)
                    ) < 1e-4


@pytest.mark.parametrize(("family", "changes", "message"), [
    ("mixtral", {"moe": {"num_experts": 4, "top_k": 2, "normalization_mode": 2}},
     r"field 'moe\.normalization_mode' = 2 is not supported by the reference runtime"),
    ("mixtral", {"moe": {"num_experts": 4, "top_k": 5, "normalization_mode": 1}},
     r"field 'moe\.top_k' = 5 must be in 1\.\.moe\.num_experts \(4\)"),
    ("mixtral", {"quantization": {"quant_algo": "FP8"}}, r"quantized mixture-of-experts checkpoint"),
    ("qwen3", {"sliding_window": "eight"}, r"field 'sliding_window' has an invalid value 'eight'"),
    ("qwen3", {"sliding_window": 0}, r"field 'sliding_window' must be a positive number of tokens, not 0"),
    ("qwen3", {"runtime_defaults": {"max_attention_window": [8, None]}},
     r"required field 'runtime_defaults\.max_attention_window' is missing"),
])
def test_unsupported_or_bad_settings_are_refused_by_field(build: Builder, tmp_path: Path, family: str,
                                                          changes: dict, message: str) -> None:
    """An MoE setting the runtime does not run, or a bad attention window (specbuild's field or TensorRT-LLM's
    per-layer list), is refused naming that field."""
    ckpt = copy_checkpoint(build(family)[1], tmp_path / "c")
    edit_trt_config(ckpt, **changes)
    with pytest.raises(RuntimeCheckpointError, match=message):
        load_checkpoint(ckpt)


def test_long_rope_without_its_factors_is_refused(build: Builder, tmp_path: Path) -> None:
    ckpt = copy_checkpoint(build("phi3", **LONGROPE)[1], tmp_path / "c")
    edit_trt_config(ckpt, longrope_scaling_long_factors=None)
    with pytest.raises(RuntimeCheckpointError, match=r"'long_rope' needs field 'longrope_scaling_long_factors'"):
        load_checkpoint(ckpt)
