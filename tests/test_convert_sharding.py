"""TP/PP sharding: the rank files, put back together along the documented split dims, reproduce tp=1.

The merge below is written from TensorRT-LLM's converters (NVIDIA/TensorRT-LLM tensorrt_llm/models/llama/convert.py
at commit 04a2cacb, models/convert_utils.py, models/gpt/convert.py at commit f59aed07), not from ours: Q, K, V
are split separately and concatenated per rank; K/V heads are repeated tp/num_kv times when kv < tp;
`attention.dense` and `mlp.proj` split on dim 1, `mlp.fc`/`mlp.gate` (and their biases) on dim 0; the
lm_head is zero-padded to a multiple of tp then split on dim 0; PP stages hold contiguous layer ranges
(first stages get the extra layers) with local indices, the embedding on the first stage and ln_f/lm_head
on the last.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from specbuild.convert.pipeline import ConvertRequest, convert_checkpoint
from tests.tiny_models import make_checkpoint

ROW_PARALLEL = ("attention.dense.weight", "mlp.proj.weight")
COLUMN_PARALLEL = ("mlp.fc.weight", "mlp.gate.weight", "mlp.fc.bias", "mlp.gate.bias")


def load_rank(path: Path) -> dict[str, torch.Tensor]:
    with safe_open(path, "pt") as fh:
        return {k: fh.get_tensor(k) for k in fh.keys()}  # noqa: SIM118


def stage_layers(num_layers: int, pp: int) -> list[list[int]]:
    return [chunk.tolist() for chunk in torch.tensor_split(torch.arange(num_layers), pp)]


def merge_qkv(parts: list[torch.Tensor], heads: int, kv_heads: int, head_dim: int) -> torch.Tensor:
    tp = len(parts)
    kv_per_rank = max(kv_heads, tp) // tp
    q_rows, kv_rows = heads // tp * head_dim, kv_per_rank * head_dim
    qs = [p[:q_rows] for p in parts]
    ks = [p[q_rows:q_rows + kv_rows] for p in parts]
    vs = [p[q_rows + kv_rows:] for p in parts]

    def dedup(x: torch.Tensor) -> torch.Tensor:
        if kv_heads >= tp:
            return x
        reps = tp // kv_heads
        heads_view = x.reshape(kv_heads, reps, head_dim, *x.shape[1:])
        assert all(torch.equal(heads_view[:, 0], heads_view[:, r]) for r in range(reps)), "KV copies differ"
        return heads_view[:, 0].reshape(kv_heads * head_dim, *x.shape[1:])

    return torch.cat([torch.cat(qs), dedup(torch.cat(ks)), dedup(torch.cat(vs))])


def merge_checkpoint(directory: Path) -> dict[str, torch.Tensor]:
    """Rebuild the tp=1, pp=1 tensor set from a sharded checkpoint."""
    cfg = json.loads((directory / "config.json").read_text())
    tp, pp = cfg["mapping"]["tp_size"], cfg["mapping"]["pp_size"]
    heads, kv, head_dim = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_size"]
    layers = stage_layers(cfg["num_hidden_layers"], pp)
    merged: dict[str, torch.Tensor] = {}
    for stage in range(pp):
        files = [load_rank(directory / f"rank{stage * tp + t}.safetensors") for t in range(tp)]
        for name in files[0]:
            parts = [f[name] for f in files]
            match = re.match(r"transformer\.layers\.(\d+)\.(.*)", name)
            suffix = match.group(2) if match else name
            if match:
                name = f"transformer.layers.{layers[stage][int(match.group(1))]}.{suffix}"
            if suffix.startswith("attention.qkv"):
                merged[name] = merge_qkv(parts, heads, kv, head_dim)
            elif suffix in ROW_PARALLEL:
                merged[name] = torch.cat(parts, dim=1)
            elif suffix in COLUMN_PARALLEL:
                merged[name] = torch.cat(parts, dim=0)
            elif name == "lm_head.weight":
                full = torch.cat(parts, dim=0)
                assert not full[cfg["vocab_size"]:].any(), "vocab padding rows must be zero"
                merged[name] = full[: cfg["vocab_size"]]
            else:  # replicated: norms, embeddings, row-parallel biases
                assert all(torch.equal(parts[0], p) for p in parts[1:]), f"{name} differs across tp ranks"
                merged[name] = parts[0]
    return merged


def convert(src: Path, out: Path, tp: int = 1, pp: int = 1) -> Path:
    convert_checkpoint(ConvertRequest("m", src, out, dtype="float16", tp_size=tp, pp_size=pp))
    return out


@pytest.mark.parametrize(
    ("family", "overrides", "tp", "pp"),
    [
        ("llama", {}, 2, 1),  # GQA, kv (2) == tp
        ("llama", {}, 4, 1),  # GQA, kv (2) < tp: KV heads repeated
        ("llama", {"num_key_value_heads": 1}, 2, 1),  # MQA, kv < tp
        ("llama", {}, 1, 2),
        ("llama", {"num_hidden_layers": 3}, 2, 2),  # uneven stages: 2 + 1 layers
        ("llama", {"vocab_size": 1001}, 2, 1),  # vocab padded to a multiple of tp
        ("qwen2", {}, 2, 1),  # qkv bias, tied lm_head
        ("mistral", {}, 2, 2),
        ("gpt2", {}, 2, 1),  # Conv1D transposes, split c_attn, biases
        ("gpt2", {}, 1, 2),
    ],
)
def test_rank_files_merge_back_to_tp1(tmp_path: Path, family: str, overrides: dict, tp: int, pp: int) -> None:
    src = make_checkpoint(tmp_path / "hf", family, **overrides)
    single = load_rank(convert(src, tmp_path / "tp1") / "rank0.safetensors")
    sharded = convert(src, tmp_path / "sharded", tp, pp)
    assert sorted(p.name for p in sharded.glob("rank*.safetensors")) == sorted(
        f"rank{r}.safetensors" for r in range(tp * pp)
    )
    merged = merge_checkpoint(sharded)
    assert sorted(merged) == sorted(single)
    for name, tensor in single.items():
        assert torch.equal(merged[name], tensor), name


def test_each_rank_holds_one_kv_head_when_kv_below_tp(tmp_path: Path) -> None:
    src = make_checkpoint(tmp_path / "hf", "llama", num_key_value_heads=1)
    out = convert(src, tmp_path / "out", tp=4)
    head_dim = 16
    for r in range(4):
        qkv = load_rank(out / f"rank{r}.safetensors")["transformer.layers.0.attention.qkv.weight"]
        assert qkv.shape == ((4 // 4 + 2 * 1) * head_dim, 64)


def test_pipeline_stages_hold_embedding_first_and_head_last(tmp_path: Path) -> None:
    src = make_checkpoint(tmp_path / "hf", "llama", num_hidden_layers=3)
    out = convert(src, tmp_path / "out", pp=2)
    first, last = load_rank(out / "rank0.safetensors"), load_rank(out / "rank1.safetensors")
    assert "transformer.vocab_embedding.weight" in first and "lm_head.weight" not in first
    assert "lm_head.weight" in last and "transformer.ln_f.weight" in last
    assert "transformer.vocab_embedding.weight" not in last
    assert {n.split(".")[2] for n in first if n.startswith("transformer.layers.")} == {"0", "1"}
    assert {n.split(".")[2] for n in last if n.startswith("transformer.layers.")} == {"0"}
