"""The reference runtime's model layer: checkpoints converted from real transformers models give transformers'
logits; sharded checkpoints give the unsharded ones; the KV cache's incremental, batched, tree-masked and
compacted forwards agree with plain full forwards; Medusa heads compute what TensorRT-LLM's MedusaLayer does;
and unusable checkpoints fail with messages that name the problem.

fp16: checkpoints are converted to float16 from a float32 HF model and run in float16; they are compared with the
same HF model cast to float16 (identical weights and precision, so argmax agrees at every position; against the
float32 HF model an argmax may legitimately flip where the top two logits of these random models are ~1e-4 apart).
"""

from __future__ import annotations

import copy
import dataclasses
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from rich.console import Console
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import PreTrainedModel

from specbuild.convert.pipeline import ConvertRequest, convert_checkpoint
from specbuild.runtime import CausalLM, KVCache, RuntimeCheckpointError, load_checkpoint
from tests.tiny_models import make_model, save_model

FAMILIES = ("llama", "mistral", "qwen2", "gpt2")
VOCAB = 1000

Builder = Callable[..., tuple[PreTrainedModel, Path]]


# -- fixtures and helpers -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Builder:
    """(HF float32 model, converted checkpoint dir), memoised per settings so tests share conversions."""
    cache: dict[str, tuple[PreTrainedModel, Path]] = {}
    models: dict[str, PreTrainedModel] = {}

    def make(family: str, dtype: str = "float32", tp: int = 1, pp: int = 1, **overrides: Any
             ) -> tuple[PreTrainedModel, Path]:
        model_key = f"{family}-{sorted(overrides.items())}"
        key = f"{model_key}-{dtype}-{tp}-{pp}"
        if key not in cache:
            root = tmp_path_factory.mktemp("runtime")
            if model_key not in models:
                models[model_key] = make_model(family, dtype=torch.float32, **overrides)
            save_model(models[model_key], root / "hf")
            request = ConvertRequest("m", root / "hf", root / "trt", dtype=dtype, tp_size=tp, pp_size=pp)
            convert_checkpoint(request, console=Console(file=io.StringIO()))
            cache[key] = (models[model_key], root / "trt")
        return cache[key]

    return make


def prompt(batch: int, length: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def full_logits(model: CausalLM, ids: torch.Tensor) -> torch.Tensor:
    """Logits of one forward over the whole of `ids` [B, T] from an empty cache."""
    return model(ids, model.new_cache(ids.shape[0], ids.shape[1] + 8)).logits


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


def read_rank(path: Path) -> dict[str, torch.Tensor]:
    with safe_open(path, "pt") as fh:
        return {name: fh.get_tensor(name) for name in fh.keys()}  # noqa: SIM118


def copy_checkpoint(source: Path, target: Path) -> Path:
    target.mkdir()
    for path in source.iterdir():
        (target / path.name).write_bytes(path.read_bytes())
    return target


def edit_trt_config(directory: Path, **changes: Any) -> None:
    path = directory / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


def add_medusa_heads(directory: Path, num_heads: int, num_layers: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Turn a converted LLaMA checkpoint into a MedusaForCausalLM one: random (seeded) head tensors, split on dim 0
    over the last pipeline stage's TP ranks as TensorRT-LLM lays them out (dim 0, no vocab padding: NVIDIA/TensorRT-LLM
    tensorrt_llm/models/medusa/weight.py, 1.x). Returns the full heads."""
    config = json.loads((directory / "config.json").read_text())
    hidden, vocab = config["hidden_size"], config["vocab_size"]
    tp, pp = config["mapping"]["tp_size"], config["mapping"]["pp_size"]
    gen = torch.Generator().manual_seed(seed)
    dtype = {"float32": torch.float32, "float16": torch.float16}[config["dtype"]]
    heads: dict[str, torch.Tensor] = {}
    for h in range(num_heads):
        for n in range(num_layers):
            p = f"medusa_heads.{h}.medusa_layers.{n}.linear."
            heads[p + "weight"] = (torch.randn(hidden, hidden, generator=gen) * 0.1).to(dtype)
            heads[p + "bias"] = (torch.randn(hidden, generator=gen) * 0.1).to(dtype)
        heads[f"medusa_heads.{h}.lm_head.weight"] = (torch.randn(vocab, hidden, generator=gen) * 0.1).to(dtype)
    for t in range(tp):
        path = directory / f"rank{(pp - 1) * tp + t}.safetensors"
        tensors = read_rank(path)
        tensors.update({name: torch.chunk(w, tp, dim=0)[t].contiguous() for name, w in heads.items()})
        save_file(tensors, path)
    edit_trt_config(directory, architecture="MedusaForCausalLM", num_medusa_heads=num_heads,
                    num_medusa_layers=num_layers, max_draft_len=63, model_type="llama")
    return heads


def medusa_reference(hidden: torch.Tensor, heads: dict[str, torch.Tensor], num_heads: int, num_layers: int
                     ) -> torch.Tensor:
    """TensorRT-LLM's MedusaLayer math in plain PyTorch, one head at a time: x + silu(W x + b), then lm_head."""
    out = []
    for h in range(num_heads):
        x = hidden.float()
        for n in range(num_layers):
            p = f"medusa_heads.{h}.medusa_layers.{n}.linear."
            x = x + torch.nn.functional.silu(x @ heads[p + "weight"].float().T + heads[p + "bias"].float())
        out.append(x @ heads[f"medusa_heads.{h}.lm_head.weight"].float().T)
    return torch.stack(out)


# -- equality with transformers -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("family", "overrides"),
    [*((f, {}) for f in FAMILIES), ("gpt2", {"activation_function": "gelu"}), ("llama", {"attention_bias": True})],
)
def test_float32_logits_equal_transformers(build: Builder, family: str, overrides: dict) -> None:
    hf, ckpt = build(family, **overrides)
    ids = prompt(2, 40)
    ours = full_logits(CausalLM.from_checkpoint(ckpt), ids)
    assert ours.dtype == torch.float32 and ours.shape == (2, 40, VOCAB)
    # Measured: 0 (LLaMA family) to 9e-8 (GPT-2); 1e-6 still catches erf-vs-tanh GELU (9e-6).
    assert max_diff(ours, hf(ids).logits) <= 1e-6


@pytest.mark.parametrize("family", FAMILIES)
def test_float16_argmax_equals_transformers(build: Builder, family: str) -> None:
    hf, ckpt = build(family, dtype="float16")
    model = CausalLM.from_checkpoint(ckpt, dtype=torch.float16)
    ids = prompt(2, 40)
    ours = full_logits(model, ids)
    assert ours.dtype == torch.float32
    reference = copy.deepcopy(hf).to(torch.float16)(ids).logits.float()  # the builder shares `hf`: copy it
    assert torch.equal(ours.argmax(-1), reference.argmax(-1))
    assert max_diff(ours, reference) <= 2e-3
    assert max_diff(ours, hf(ids).logits) <= 5e-3


ROPE_VARIANTS = {
    "llama3": dict(rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                    "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                    "original_max_position_embeddings": 64}),  # some wavelengths in the ramp
    "linear": dict(rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}),
    "yarn": dict(rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                  "original_max_position_embeddings": 32}),
    "dynamic": dict(rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 8.0},
                    max_position_embeddings=24),
}


@pytest.mark.parametrize("variant", sorted(ROPE_VARIANTS))
def test_rope_scaling_equals_transformers(build: Builder, variant: str) -> None:
    hf, ckpt = build("llama", **ROPE_VARIANTS[variant])
    config = json.loads((ckpt / "config.json").read_text())
    assert config["rotary_scaling"]["rope_type"] == variant
    ids = prompt(1, 48)
    model = CausalLM.from_checkpoint(ckpt)
    reference = hf(ids).logits
    error = max_diff(full_logits(model, ids), reference)
    assert error <= 1e-4
    # ... and the scaling really changes these logits (by far more than our error), so the check is not vacuous.
    unscaled = CausalLM(dataclasses.replace(model.config, rotary_scaling=None), load_checkpoint(ckpt).tensors)
    assert max_diff(full_logits(unscaled, ids), reference) > max(100 * error, 1e-4)


# -- sharded checkpoints --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("family", "tp", "pp", "overrides"),
    [
        ("llama", 2, 1, {}),
        ("llama", 4, 1, {}),  # 2 KV heads < tp 4: repeated KV heads de-duplicated
        ("llama", 2, 1, {"num_key_value_heads": 1}),
        ("llama", 1, 2, {}),
        ("llama", 2, 2, {"num_hidden_layers": 3}),  # uneven stages
        ("llama", 2, 1, {"vocab_size": 1001}),  # padded lm_head rows dropped
        ("qwen2", 2, 1, {}),
        ("mistral", 2, 2, {}),
        ("gpt2", 2, 1, {}),
        ("gpt2", 1, 2, {}),
    ],
)
def test_sharded_checkpoints_equal_tp1(build: Builder, family: str, tp: int, pp: int, overrides: dict) -> None:
    _, single = build(family, **overrides)
    _, sharded = build(family, tp=tp, pp=pp, **overrides)
    ids = prompt(2, 16) % overrides.get("vocab_size", VOCAB)
    expected = full_logits(CausalLM.from_checkpoint(single), ids)
    assert max_diff(full_logits(CausalLM.from_checkpoint(sharded), ids), expected) <= 1e-6
    merged, reference = load_checkpoint(sharded).tensors, load_checkpoint(single).tensors
    assert sorted(merged) == sorted(reference)
    assert all(torch.equal(merged[name], reference[name]) for name in reference)


@pytest.mark.parametrize("sharding_dim", [0, 1])
def test_parallel_embedding_is_merged(build: Builder, tmp_path: Path, sharding_dim: int) -> None:
    """use_parallel_embedding splits the embedding over TP ranks on embedding_sharding_dim (NVIDIA/TensorRT-LLM
    tensorrt_llm/models/llama/convert.py, commit 04a2cacb)."""
    _, single = build("llama")
    ckpt = copy_checkpoint(build("llama", tp=2)[1], tmp_path / "c")
    for t in range(2):
        path = ckpt / f"rank{t}.safetensors"
        tensors = read_rank(path)
        name = "transformer.vocab_embedding.weight"
        tensors[name] = torch.chunk(tensors[name], 2, dim=sharding_dim)[t].contiguous()
        save_file(tensors, path)
    edit_trt_config(ckpt, use_parallel_embedding=True, embedding_sharding_dim=sharding_dim)
    ids = prompt(1, 8)
    expected = full_logits(CausalLM.from_checkpoint(single), ids)
    assert max_diff(full_logits(CausalLM.from_checkpoint(ckpt), ids), expected) <= 1e-6


# -- the KV cache ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2"])
def test_incremental_decoding_equals_full_forward(build: Builder, family: str) -> None:
    model = CausalLM.from_checkpoint(build(family)[1])
    ids = prompt(1, 24)
    expected = full_logits(model, ids)
    cache = model.new_cache(1, 32)
    pieces = [(0, 10), *((i, i + 1) for i in range(10, 16)), (16, 19), (19, 24)]  # prefill, singles, chunks
    got = []
    for start, stop in pieces:
        got.append(model(ids[:, start:stop], cache).logits)
        cache.advance(stop - start)
    assert int(cache.lengths[0]) == 24
    assert max_diff(torch.cat(got, dim=1), expected) <= 1e-5


def test_right_padded_batch_equals_separate_forwards(build: Builder) -> None:
    model = CausalLM.from_checkpoint(build("llama")[1])
    lengths = [5, 12, 9]
    prompts = [prompt(1, n, seed=10 + i)[0] for i, n in enumerate(lengths)]
    batch = torch.zeros(3, 12, dtype=torch.long)
    for row, p in enumerate(prompts):
        batch[row, : len(p)] = p
    cache = model.new_cache(3, 32)
    out = model(batch, cache).logits
    cache.advance(torch.tensor(lengths))
    continuations = prompt(3, 4, seed=99)
    decoded = []
    for i in range(4):
        decoded.append(model(continuations[:, i: i + 1], cache).logits)
        cache.advance(1)
    for row, p in enumerate(prompts):
        alone = full_logits(model, torch.cat([p, continuations[row]])[None])
        assert max_diff(out[row, : len(p)], alone[0, : len(p)]) <= 1e-5
        assert max_diff(torch.cat(decoded, dim=1)[row], alone[0, len(p):]) <= 1e-5
    assert cache.lengths.tolist() == [n + 4 for n in lengths]


# A tree after the committed prefix: node 0 is the root; 1 and 2 its children; 3 child of 1; 4 child of 2.
PARENTS = [-1, 0, 0, 1, 2]


def tree_tensors(parents: list[int]) -> tuple[torch.Tensor, torch.Tensor, list[list[int]]]:
    """(mask [T, T]: True where column is an ancestor-or-self of row, depth [T], path to each node)."""
    paths: list[list[int]] = []
    for node, parent in enumerate(parents):
        paths.append([*(paths[parent] if parent >= 0 else []), node])
    mask = torch.zeros(len(parents), len(parents), dtype=torch.bool)
    for node, path in enumerate(paths):
        mask[node, path] = True
    return mask, torch.tensor([len(p) - 1 for p in paths]), paths


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_tree_forward_and_compaction_equal_sequential_decoding(build: Builder, family: str) -> None:
    model = CausalLM.from_checkpoint(build(family)[1])
    mask, depth, paths = tree_tensors(PARENTS)
    prefixes = [prompt(1, 7, seed=3)[0], prompt(1, 11, seed=4)[0]]  # rows with different committed lengths
    nodes = prompt(2, len(PARENTS), seed=5)
    accepted = [[0, 2, 4], [0, 1]]  # per row: the path the verifier accepted
    cache = model.new_cache(2, 32)
    padded = torch.zeros(2, 11, dtype=torch.long)
    for row, p in enumerate(prefixes):
        padded[row, : len(p)] = p
    model(padded, cache)
    cache.advance(torch.tensor([len(p) for p in prefixes]))
    tree = model(nodes, cache, position_ids=cache.lengths[:, None] + depth, tree_mask=mask).logits
    for row, prefix in enumerate(prefixes):
        for node, path in enumerate(paths):
            sequential = full_logits(model, torch.cat([prefix, nodes[row, path]])[None])[0, -1]
            assert max_diff(tree[row, node], sequential) <= 1e-5, (row, node)
    for row, keep in enumerate(accepted):
        cache.compact(row, torch.tensor(keep))
    assert cache.lengths.tolist() == [len(p) + len(k) for p, k in zip(prefixes, accepted, strict=True)]
    following = prompt(2, 1, seed=6)
    step = model(following, cache).logits
    for row, (prefix, keep) in enumerate(zip(prefixes, accepted, strict=True)):
        sequential = full_logits(model, torch.cat([prefix, nodes[row, keep], following[row]])[None])[0, -1]
        assert max_diff(step[row, 0], sequential) <= 1e-5


def test_cache_rejects_misuse() -> None:
    cache = KVCache(num_layers=1, batch_size=2, num_kv_heads=1, head_dim=4, max_len=8, dtype=torch.float32)
    assert cache.begin_block(3) == 3
    with pytest.raises(ValueError, match="between 0 and the uncommitted"):
        cache.advance(4)
    cache.advance(torch.tensor([1, 2]))
    cache.advance(torch.tensor([2, 1]))
    assert cache.lengths.tolist() == [3, 3]
    with pytest.raises(ValueError, match="between 0 and the uncommitted"):
        cache.advance(1)
    with pytest.raises(ValueError, match="max_len 8"):
        cache.begin_block(6)
    cache.begin_block(2)
    with pytest.raises(ValueError, match="must index"):
        cache.compact(0, torch.tensor([2]))
    cache.compact(0, torch.tensor([1]))
    with pytest.raises(ValueError, match="already committed"):
        cache.compact(0, torch.tensor([0]))
    with pytest.raises(ValueError, match="only shrink"):
        cache.truncate(torch.tensor([5, 3]))
    cache.truncate(torch.tensor([1, 0]))
    assert cache.lengths.tolist() == [1, 0]


def test_forward_rejects_overflow_and_bad_shapes(build: Builder) -> None:
    model = CausalLM.from_checkpoint(build("llama")[1])
    cache = model.new_cache(1, 8)
    with pytest.raises(ValueError, match="max_len 8"):
        model(prompt(1, 9), cache)
    with pytest.raises(ValueError, match="tree_mask"):
        model(prompt(1, 3), cache, tree_mask=torch.ones(2, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="batch"):
        model(prompt(2, 3), cache)
    assert int(cache.lengths[0]) == 0


# -- Medusa ---------------------------------------------------------------------------------------------------------
def test_medusa_heads_read_the_final_normed_hidden_state(build: Builder, tmp_path: Path) -> None:
    hf, ckpt = build("llama")
    medusa_dir = copy_checkpoint(ckpt, tmp_path / "medusa")
    heads = add_medusa_heads(medusa_dir, num_heads=3, num_layers=2)
    model = CausalLM.from_checkpoint(medusa_dir)
    assert (model.config.architecture, model.config.num_medusa_heads, model.config.num_medusa_layers) == (
        "MedusaForCausalLM", 3, 2)
    ids = prompt(2, 12)
    out = model(ids, model.new_cache(2, 16), medusa=True)
    assert max_diff(out.hidden, hf.model(ids).last_hidden_state) <= 1e-5
    assert max_diff(out.logits, hf(ids).logits) <= 1e-4
    assert out.medusa_logits is not None and out.medusa_logits.shape == (3, 2, 12, VOCAB)
    assert out.medusa_logits.dtype == torch.float32
    assert max_diff(out.medusa_logits, medusa_reference(out.hidden, heads, 3, 2)) <= 1e-4
    assert model(ids, model.new_cache(2, 16)).medusa_logits is None


def test_medusa_heads_merge_across_tensor_parallel_ranks(build: Builder, tmp_path: Path) -> None:
    dirs = []
    for tp in (1, 2):
        _, ckpt = build("llama", tp=tp)
        target = copy_checkpoint(ckpt, tmp_path / f"tp{tp}")
        add_medusa_heads(target, num_heads=2, num_layers=1, seed=7)
        dirs.append(target)
    ids = prompt(1, 6)
    single, sharded = (CausalLM.from_checkpoint(d) for d in dirs)
    a = single(ids, single.new_cache(1, 8), medusa=True).medusa_logits
    b = sharded(ids, sharded.new_cache(1, 8), medusa=True).medusa_logits
    assert a is not None and b is not None and max_diff(a, b) <= 1e-6


# -- errors ---------------------------------------------------------------------------------------------------------
def test_missing_rank_file_is_named(build: Builder, tmp_path: Path) -> None:
    ckpt = copy_checkpoint(build("llama", tp=2)[1], tmp_path / "c")
    (ckpt / "rank1.safetensors").unlink()
    with pytest.raises(RuntimeCheckpointError, match=r"rank1\.safetensors: rank file is missing"):
        load_checkpoint(ckpt)


def test_config_claiming_quantization_over_float_weights_is_refused(build: Builder, tmp_path: Path) -> None:
    """A config.json that says W8A16 over float weights is an inconsistent checkpoint (e.g. a hand-edited
    config): running it as float would silently differ from what TensorRT-LLM builds, so it is refused."""
    ckpt = copy_checkpoint(build("llama")[1], tmp_path / "c")
    edit_trt_config(ckpt, quantization={"quant_algo": "W8A16", "kv_cache_quant_algo": None})
    with pytest.raises(RuntimeCheckpointError, match=r"quantization\.quant_algo is 'W8A16'"):
        CausalLM.from_checkpoint(ckpt)


def test_unknown_rotary_scaling_is_refused(build: Builder, tmp_path: Path) -> None:
    ckpt = copy_checkpoint(build("llama")[1], tmp_path / "c")
    edit_trt_config(ckpt, rotary_scaling={"rope_type": "mrope", "factor": 2.0})  # Qwen2-VL's multimodal RoPE
    with pytest.raises(RuntimeCheckpointError, match=r"config\.json: rotary_scaling: type 'mrope' is not supported"):
        load_checkpoint(ckpt)


def test_missing_tensor_and_shape_mismatch_are_named(build: Builder, tmp_path: Path) -> None:
    ckpt = copy_checkpoint(build("llama")[1], tmp_path / "c")
    tensors = read_rank(ckpt / "rank0.safetensors")
    del tensors["transformer.layers.1.mlp.gate.weight"]
    save_file(tensors, ckpt / "rank0.safetensors")
    with pytest.raises(RuntimeCheckpointError, match=r"'transformer\.layers\.1\.mlp\.gate\.weight' is missing"):
        load_checkpoint(ckpt)
    ckpt = copy_checkpoint(build("llama")[1], tmp_path / "d")
    edit_trt_config(ckpt, intermediate_size=96)
    with pytest.raises(RuntimeCheckpointError, match=r"'transformer\.layers\.0\.mlp\.fc\.weight' has merged shape"):
        load_checkpoint(ckpt)


def test_unsupported_architecture_is_refused(build: Builder, tmp_path: Path) -> None:
    ckpt = copy_checkpoint(build("llama")[1], tmp_path / "c")
    edit_trt_config(ckpt, architecture="DeepseekV2ForCausalLM")
    with pytest.raises(RuntimeCheckpointError, match="'DeepseekV2ForCausalLM' is not supported"):
        load_checkpoint(ckpt)
