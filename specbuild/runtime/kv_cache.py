"""A preallocated key/value cache with explicit commits, shaped for speculative decoding.

A forward writes the K/V of its T new tokens after each row's committed prefix without committing them; the
caller then keeps what was accepted: `advance` for a linear block (draft-target verification, plain decoding),
`compact` for the accepted path of a tree (Medusa), `truncate` to roll back. Storage is one tensor
[layers, 2, batch, kv_heads, max_len, head_dim] allocated once, so a decoding step never reallocates it. A
serving engine keeps one row per sequence: `view` runs a forward over a range of rows without copying them,
`swap_rows` and `copy_prefix` move sequences between rows (a shared prompt prefix is copied, not recomputed).
"""

from __future__ import annotations

import torch


class KVCache:
    """Per-layer K/V storage for `batch_size` sequences of up to `max_len` tokens each."""

    def __init__(self, num_layers: int, batch_size: int, num_kv_heads: int, head_dim: int, max_len: int,
                 dtype: torch.dtype, device: torch.device | str = "cpu") -> None:
        if min(num_layers, batch_size, num_kv_heads, head_dim, max_len) < 1:
            raise ValueError("KVCache sizes must all be at least 1")
        self.num_layers, self.batch_size, self.max_len = num_layers, batch_size, max_len
        self.data = torch.zeros(num_layers, 2, batch_size, num_kv_heads, max_len, head_dim, dtype=dtype,
                                device=device)
        self.lengths = torch.zeros(batch_size, dtype=torch.long, device=device)
        #: Size of the last forward's block, and per row how many of its tokens are still uncommitted.
        self.block_size = 0
        self.pending = torch.zeros(batch_size, dtype=torch.long, device=device)
        self._write_start: int | None = None  # all rows write from the same slot (a slice write suffices)
        self._write_slots: torch.Tensor | None = None  # else [B, T] slots per row

    @property
    def uniform(self) -> bool:
        """Whether the last `begin_block` found every row with the same committed length."""
        return self._write_start is not None

    @property
    def device(self) -> torch.device:
        return self.data.device

    @property
    def dtype(self) -> torch.dtype:
        return self.data.dtype

    def keys(self, layer: int) -> torch.Tensor:
        """Layer's keys [B, kv_heads, max_len, head_dim] (a view)."""
        return self.data[layer, 0]

    def values(self, layer: int) -> torch.Tensor:
        return self.data[layer, 1]

    # -- used by the model's forward -----------------------------------------------------------------------------
    def begin_block(self, num_tokens: int) -> int:
        """Reserve slots lengths[b] .. lengths[b]+T-1 for a forward of T tokens; returns the number of slots
        attention must look at (max committed length + T)."""
        lengths = self.lengths.tolist()
        longest = max(lengths)
        if longest + num_tokens > self.max_len:
            row = lengths.index(longest)
            raise ValueError(
                f"KV cache full: row {row} holds {longest} tokens and the forward adds {num_tokens}, "
                f"but the cache was made for max_len {self.max_len}"
            )
        if len(set(lengths)) == 1:
            self._write_start, self._write_slots = longest, None
        else:
            self._write_start = None
            self._write_slots = self.lengths[:, None] + torch.arange(num_tokens, device=self.device)
        self.block_size = num_tokens
        self.pending.fill_(num_tokens)
        return longest + num_tokens

    def write(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Store the block's keys/values [B, kv_heads, T, head_dim] in the slots reserved by `begin_block`."""
        if self._write_start is not None:
            stop = self._write_start + keys.shape[2]
            self.data[layer, 0, :, :, self._write_start:stop] = keys
            self.data[layer, 1, :, :, self._write_start:stop] = values
            return
        rows = torch.arange(self.batch_size, device=self.device)[:, None]
        # Advanced indices [B, 1] and [B, T] around a slice put their dims first: the target is [B, T, kv, hd].
        self.data[layer, 0][rows, :, self._write_slots] = keys.transpose(1, 2)
        self.data[layer, 1][rows, :, self._write_slots] = values.transpose(1, 2)

    # -- commits -------------------------------------------------------------------------------------------------
    def _counts(self, counts: torch.Tensor | int) -> torch.Tensor:
        counts = torch.as_tensor(counts, dtype=torch.long, device=self.device)
        if counts.dim() == 0:
            counts = counts.expand(self.batch_size)
        if counts.shape != (self.batch_size,):
            raise ValueError(f"counts must be an int or have shape [{self.batch_size}], got {tuple(counts.shape)}")
        return counts

    def advance(self, counts: torch.Tensor | int) -> None:
        """Commit the first counts[b] uncommitted tokens of the last forward's block for each row b."""
        counts = self._counts(counts)
        if bool((counts < 0).any()) or bool((counts > self.pending).any()):
            raise ValueError(
                f"advance({counts.tolist()}): each count must be between 0 and the uncommitted tokens of the "
                f"last forward ({self.pending.tolist()})"
            )
        self.lengths += counts
        self.pending -= counts

    def compact(self, batch_index: int, keep: torch.Tensor) -> None:
        """Commit an accepted tree path: the K/V at block positions `keep` (0-based within the last forward's
        block) move, in that order, to slots lengths[b] + 0..n-1, then lengths[b] grows by n."""
        if not 0 <= batch_index < self.batch_size:
            raise ValueError(f"batch_index {batch_index} out of range for batch size {self.batch_size}")
        keep = torch.as_tensor(keep, dtype=torch.long, device=self.device).reshape(-1)
        if int(self.pending[batch_index]) != self.block_size:
            raise ValueError(f"compact: row {batch_index} has already committed tokens of the last forward's block")
        if keep.numel() and (int(keep.min()) < 0 or int(keep.max()) >= self.block_size):
            raise ValueError(f"compact: keep {keep.tolist()} must index the last forward's {self.block_size} tokens")
        if keep.numel() > self.block_size:
            raise ValueError(f"compact: keeps {keep.numel()} tokens of a {self.block_size}-token block")
        start = int(self.lengths[batch_index])
        row = self.data[:, :, batch_index]  # [L, 2, kv, max_len, hd] view
        row.index_copy_(3, start + torch.arange(keep.numel(), device=self.device), row.index_select(3, start + keep))
        self.lengths[batch_index] += keep.numel()
        self.pending[batch_index] = 0

    # -- rows: what a serving engine needs to give sequences their own rows ------------------------------------
    def view(self, start: int, stop: int) -> KVCache:
        """Rows [start, stop) as a cache of their own that shares this one's storage: a forward over the view
        reads and writes those rows only, and its commits change this cache's lengths."""
        if not 0 <= start < stop <= self.batch_size:
            raise ValueError(f"view({start}, {stop}) is not a non-empty row range of a {self.batch_size}-row cache")
        view = KVCache.__new__(KVCache)
        view.num_layers, view.batch_size, view.max_len = self.num_layers, stop - start, self.max_len
        view.data = self.data[:, :, start:stop]
        view.lengths = self.lengths[start:stop]
        view.pending = self.pending[start:stop]
        view.block_size = 0
        view._write_start = view._write_slots = None
        return view

    def alias(self) -> KVCache:
        """A cache over this one's storage with lengths of its own (copied now): a self-draft writes its speculative
        slots into the target's cache and commits them for its next step without moving the target's lengths."""
        other = KVCache.__new__(KVCache)
        other.num_layers, other.batch_size, other.max_len = self.num_layers, self.batch_size, self.max_len
        other.data = self.data
        other.lengths = self.lengths.clone()
        other.pending = torch.zeros_like(self.pending)
        other.block_size = 0
        other._write_start = other._write_slots = None
        return other

    def swap_rows(self, a: int, b: int) -> None:
        """Exchange two rows' committed entries and lengths (only the longer one's committed slots move)."""
        if a == b:
            return
        n = int(max(self.lengths[a], self.lengths[b]))
        if n:
            rows = torch.tensor([a, b], device=self.device)
            self.data[:, :, [b, a], :, :n] = self.data[:, :, :, :, :n].index_select(2, rows)
        self.lengths[[a, b]] = self.lengths[[b, a]]
        self.pending[[a, b]] = 0

    def copy_prefix(self, source: int, target: int, length: int) -> None:
        """Give row `target` the first `length` committed entries of row `source` (and that length)."""
        if not 0 <= length <= int(self.lengths[source]):
            raise ValueError(f"copy_prefix: row {source} has {int(self.lengths[source])} committed entries, "
                             f"not {length}")
        if source != target and length:
            self.data[:, :, target, :, :length] = self.data[:, :, source, :, :length]
        self.lengths[target] = length
        self.pending[target] = 0

    def truncate_row(self, row: int, length: int) -> None:
        """Roll one row back to `length` committed entries."""
        if not 0 <= length <= int(self.lengths[row]):
            raise ValueError(f"truncate_row({row}, {length}) may only shrink its length {int(self.lengths[row])}")
        self.lengths[row] = length
        self.pending[row] = 0

    def truncate(self, lengths: torch.Tensor) -> None:
        """Roll committed lengths back (e.g. a draft model's rejected tokens); growing is not allowed."""
        lengths = self._counts(lengths)
        if bool((lengths < 0).any()) or bool((lengths > self.lengths).any()):
            raise ValueError(f"truncate({lengths.tolist()}) may only shrink the lengths {self.lengths.tolist()}")
        self.lengths.copy_(lengths)
        self.pending.zero_()
