"""Tensor- and pipeline-parallel sharding, as TensorRT-LLM 1.x lays it out.

Facts from shared/reference/tensorrt-llm.md §1.2 and §1.4 (TensorRT-LLM `mapping.py`, `convert_utils.py`,
`llama/convert.py`): rank = pp_rank * tp_size + tp_rank; PP layers split with `torch.tensor_split`; TP splits
are contiguous equal `torch.chunk`s; Q, K and V are split separately and then concatenated; K/V heads are
repeated when there are fewer KV heads than TP ranks; the lm_head is zero-padded to a multiple of tp.
All functions here are pure and work on `meta` tensors too, which is how output shapes are planned.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Rank:
    """One rank's place in the tp x pp grid, and the slice of layers it holds."""

    rank: int
    tp_size: int
    pp_size: int
    num_layers: int

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tp_size

    @property
    def pp_rank(self) -> int:
        return self.rank // self.tp_size

    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.pp_size - 1

    @property
    def layers(self) -> range:
        """Global layer indices on this rank (first `num_layers % pp` stages get one extra)."""
        base, extra = divmod(self.num_layers, self.pp_size)
        start = self.pp_rank * base + min(self.pp_rank, extra)
        return range(start, start + base + (1 if self.pp_rank < extra else 0))


def ranks(tp_size: int, pp_size: int, num_layers: int) -> list[Rank]:
    return [Rank(r, tp_size, pp_size, num_layers) for r in range(tp_size * pp_size)]


def split(tensor: torch.Tensor, rank: Rank, dim: int) -> torch.Tensor:
    """This rank's contiguous part of `tensor` along `dim` (tp must divide that dim; checked by the plan)."""
    if rank.tp_size == 1:
        return tensor
    return torch.chunk(tensor, rank.tp_size, dim=dim)[rank.tp_rank]


def repeat_kv_heads(tensor: torch.Tensor, num_kv_heads: int, tp_size: int) -> torch.Tensor:
    """Repeat each KV head tp/num_kv times consecutively, so that every TP rank gets one (GQA, kv < tp)."""
    if num_kv_heads >= tp_size:
        return tensor
    reps = tp_size // num_kv_heads
    rows = tensor.reshape(num_kv_heads, -1, *tensor.shape[1:])
    expanded = rows.unsqueeze(1).expand(num_kv_heads, reps, *rows.shape[1:])
    return expanded.reshape(-1, *tensor.shape[1:])


def fuse_qkv(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rank: Rank, num_kv_heads: int
) -> torch.Tensor:
    """This rank's fused QKV weight or bias: cat(split(q), split(k'), split(v')) along dim 0."""
    k = repeat_kv_heads(k, num_kv_heads, rank.tp_size)
    v = repeat_kv_heads(v, num_kv_heads, rank.tp_size)
    return torch.cat([split(q, rank, 0), split(k, rank, 0), split(v, rank, 0)], dim=0)


def padded_vocab(vocab_size: int, tp_size: int) -> int:
    return -(-vocab_size // tp_size) * tp_size


def pad_rows(tensor: torch.Tensor, rows: int) -> torch.Tensor:
    """Zero-pad dim 0 to `rows` (vocab padding of the lm_head)."""
    missing = rows - tensor.shape[0]
    if missing <= 0:
        return tensor
    return torch.cat([tensor, tensor.new_zeros((missing, *tensor.shape[1:]))], dim=0)
