"""Per-sequence KV caches that outlive a call, reused by longest token prefix.

A speculative BLS sends the whole sequence to the draft and the target every round; TensorRT-LLM answers
that with KV-cache block reuse, and this pool does the same for the reference runtime: a call finds the
cached sequence sharing the longest prefix with its input and only computes the tokens after it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from specbuild.runtime.kv_cache import KVCache
from specbuild.runtime.model import CausalLM


@dataclass
class Slot:
    """One cached sequence: `tokens` are exactly the committed entries of `cache` (batch 1)."""

    cache: KVCache
    tokens: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    last_used: int = 0

    def set_tokens(self, tokens: Sequence[int] | np.ndarray) -> None:
        length = int(self.cache.lengths[0])
        self.tokens = np.asarray(tokens, dtype=np.int64)[:length].copy()


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


class KVPool:
    """At most `size` cached sequences of up to `capacity` tokens each, least recently used evicted first."""

    def __init__(self, model: CausalLM, size: int, capacity: int, speculative_tail: int) -> None:
        self.model, self.size, self.capacity = model, max(1, size), capacity
        self.speculative_tail = speculative_tail
        """Tokens past the shared prefix that are dropped in place (rejected drafts), not worth keeping."""
        self.slots: list[Slot] = []
        self._clock = 0
        self.reused_tokens = 0

    def acquire(self, ids: np.ndarray, *, reuse: bool = True) -> tuple[Slot, int]:
        """A slot whose cache holds a prefix of `ids` (at most len(ids) - 1 tokens, so the caller always
        computes the last position's logits), and that prefix's length; `reuse=False` gives a slot to compute
        from the first token (a request that wants every prompt position's logits)."""
        self._clock += 1
        limit = len(ids) - 1 if reuse else 0
        best, match = None, 0  # the longest shared prefix anywhere
        own, own_match = None, -1  # the longest one whose slot ends within the speculative tail of it
        for slot in self.slots:
            n = min(common_prefix(slot.tokens, ids), limit)
            if n > match:
                best, match = slot, n
            if len(slot.tokens) - n <= self.speculative_tail and n > own_match:
                own, own_match = slot, n
        if own is not None and own_match > 0:
            slot = own  # this sequence's own slot, maybe past rejected drafts: truncate in place
            if match > own_match:  # another slot knows more of it (a repeated prompt): copy just that part
                self._copy_range(best, slot, own_match, match)  # type: ignore[arg-type]
        else:
            slot = self._fresh_slot(exclude=best)
            if best is not None and match > 0:
                self._copy_range(best, slot, 0, match)
            else:
                match = 0
        slot.cache.truncate(torch.tensor([match]))
        slot.tokens = slot.tokens[:match]
        slot.last_used = self._clock
        self.reused_tokens += match
        return slot, match

    def _fresh_slot(self, exclude: Slot | None) -> Slot:
        if len(self.slots) < self.size:
            slot = Slot(self.model.new_cache(1, self.capacity))
            self.slots.append(slot)
            return slot
        candidates = [s for s in self.slots if s is not exclude] or self.slots
        return min(candidates, key=lambda s: s.last_used)

    @staticmethod
    def _copy_range(source: Slot, target: Slot, start: int, stop: int) -> None:
        """Give `target` the cached tokens [start, stop) of `source` (it already holds [0, start) of them)."""
        if source is target:
            return
        target.cache.data[:, :, :, :, start:stop] = source.cache.data[:, :, :, :, start:stop]
        target.cache.lengths.fill_(stop)
        target.cache.pending.zero_()
        target.tokens = source.tokens[:stop].copy()
