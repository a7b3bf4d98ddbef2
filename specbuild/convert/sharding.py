"""Tensor- and pipeline-parallel sharding, as TensorRT-LLM 1.x lays it out.

Facts from NVIDIA/TensorRT-LLM 1.x: tensorrt_llm/mapping.py, tensorrt_llm/models/convert_utils.py
(`dup_kv_weight`) and tensorrt_llm/models/llama/convert.py (commit 04a2cacb): rank = pp_rank * tp_size + tp_rank;
PP layers split with `torch.tensor_split`; TP splits are contiguous equal `torch.chunk`s; Q, K and V are split
separately and then concatenated; K/V heads are repeated when there are fewer KV heads than TP ranks; the lm_head
is zero-padded to a multiple of tp.
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


class RowBlocks:
    """A tensor kept as blocks to be concatenated along dim 0. Writing the blocks one after the other gives
    the bytes of `torch.cat(blocks)` (row-major layout) without building it, so a block that is an untouched
    slice of a source file can be copied file to file; it also lets plans work out shapes on `meta` tensors
    without torch.cat (whose first meta call imports torch._dynamo, over a second per run)."""

    def __init__(self, blocks: list[torch.Tensor], shape: tuple[int, ...] | None = None) -> None:
        self.blocks = [b for b in blocks if b.shape[0]]
        tail = {tuple(b.shape[1:]) for b in blocks}
        if len(tail) != 1 or len({b.dtype for b in blocks}) != 1:
            raise ValueError(f"blocks differ beyond dim 0: {[(tuple(b.shape), b.dtype) for b in blocks]}")
        self.shape = torch.Size((sum(b.shape[0] for b in blocks), *tail.pop()))
        if shape is not None:  # the same bytes seen as another shape (stacked experts: (E, rows, cols))
            if torch.Size(shape).numel() != self.shape.numel():
                raise ValueError(f"blocks of shape {list(self.shape)} cannot be viewed as {list(shape)}")
            self.shape = torch.Size(shape)
        self.dtype = blocks[0].dtype

    def to(self, dtype: torch.dtype) -> RowBlocks:
        return RowBlocks([b.to(dtype) for b in self.blocks], self.shape)


def fused_qkv_rows(heads: int, kv_heads: int, head_dim: int, tp_size: int) -> int:
    """Rows of one rank's fused QKV: heads/tp query heads and max(kv, tp)/tp KV heads each for K and V (repeated
    when kv < tp)."""
    return (heads + 2 * max(kv_heads, tp_size)) * head_dim // tp_size


def fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rank: Rank, num_kv_heads: int) -> RowBlocks:
    """This rank's fused QKV weight or bias: cat(split(q), split(k'), split(v')) along dim 0."""
    k = repeat_kv_heads(k, num_kv_heads, rank.tp_size)
    v = repeat_kv_heads(v, num_kv_heads, rank.tp_size)
    return RowBlocks([split(q, rank, 0), split(k, rank, 0), split(v, rank, 0)])


def padded_vocab(vocab_size: int, tp_size: int) -> int:
    """The lm_head's row count: the vocabulary rounded up to a multiple of tp (TensorRT-LLM's `pad_vocab_size`);
    the one place the converter computes it (the architectures and the ModelOpt repair use it)."""
    return -(-vocab_size // tp_size) * tp_size


def split_padded(tensor: torch.Tensor, rank: Rank, rows: int) -> RowBlocks:
    """This rank's dim-0 part of `tensor` zero-padded to `rows` rows (the lm_head's vocab padding)."""
    per_rank = rows // rank.tp_size
    start = rank.tp_rank * per_rank
    stop = start + per_rank
    real = tensor[start:min(stop, tensor.shape[0])]
    padding = tensor.new_zeros((max(0, stop - max(start, tensor.shape[0])), *tensor.shape[1:]))
    return RowBlocks([real, padding])


def fuse_experts(*weights: torch.Tensor, rank: Rank) -> RowBlocks:
    """This rank's fused expert `mlp.fc` weight (E, 2*inter/tp, hidden) from E "up" then E "gate" projections
    (inter, hidden): for each expert its up rows, then its gate rows, each this rank's contiguous part of the
    expert's intermediate dim (TensorRT-LLM 1.x `MOEWeightWrapper`: experts split by moe_tp_size, which defaults to
    tp, with every rank holding every expert). Kept as row blocks, so unsplit experts are copied file to file."""
    count = len(weights) // 2
    blocks = [split(w, rank, 0) for pair in zip(weights[:count], weights[count:], strict=True) for w in pair]
    return RowBlocks(blocks, (count, 2 * blocks[0].shape[0], *blocks[0].shape[1:]))


def stack_experts(*weights: torch.Tensor, rank: Rank, dim: int) -> RowBlocks:
    """This rank's stacked expert weight (E, ...): each expert's part along `dim` (the `mlp.proj` weights are
    split on dim 1, the intermediate dim, like a dense row-parallel projection)."""
    blocks = [split(w, rank, dim) for w in weights]
    return RowBlocks(blocks, (len(blocks), *blocks[0].shape))


def decoder_tp_problems(tp_size: int, heads: int, kv_heads: int, intermediate: int | None) -> list[str]:
    """Why `tp_size` cannot split a decoder's attention and dense MLP as TensorRT-LLM does (empty when it can):
    query heads and the MLP's intermediate dim are split evenly, KV heads are split or, when fewer than tp,
    repeated (`dup_kv_weight`), so one of kv and tp must divide the other. `intermediate` is None for a model
    without a dense MLP (experts split their own intermediate size)."""
    problems = []
    if heads % tp_size:
        problems.append(f"tp_size {tp_size} does not divide num_attention_heads {heads}")
    if kv_heads % tp_size and tp_size % kv_heads:
        problems.append(f"tp_size {tp_size} and num_key_value_heads {kv_heads}: one must divide the other")
    if intermediate is not None and intermediate % tp_size:
        problems.append(f"tp_size {tp_size} does not divide intermediate_size {intermediate}")
    return problems
