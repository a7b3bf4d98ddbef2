"""A suffix automaton over one request's tokens, extended token by token, for SA (suffix-automaton) drafting.

TensorRT-LLM's PyTorch backend drafts "SA" from a per-request suffix automaton built over the prompt and extended
with every accepted token (NVIDIA/TensorRT-LLM cpp/tensorrt_llm/kernels/speculativeDecoding/suffixAutomaton/
suffixAutomaton.h @b120c7c9, suffixAutomatonKernels.cu @a070a1f7; tensorrt_llm/_torch/speculative/sa_worker.py
@0260785a; adapted there from Baseten's sa_spec). The semantics kept here, in an implementation of our own:

- every state remembers the end position of its first occurrence (a clone keeps the position of the state it was
  cloned from), so the continuation proposed is the one after the *earliest* earlier occurrence;
- longest match (`max_matching_ngram_size` -1): the longest suffix of the text that also ends earlier is the
  suffix link of the newest state (the newest state's class ends only at the last position), so the lookup is O(1);
- fixed n-gram (`max_matching_ngram_size` n > 0): sizes n down to 1, the first suffix of that size that ends
  earlier, found on the suffix-link chain (a state covers the lengths link.len + 1 .. len);
- the drafts are the up to K tokens after the match's end in the text itself (fewer when the text ends first).

`extend` is amortized O(1) per token (the classic online construction: at most 2n states, 3n transitions).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


class SuffixAutomaton:
    """The suffix automaton of `tokens` (appended with `extend`), with the lookups SA drafting needs."""

    __slots__ = ("first_end", "last", "length", "link", "next", "tokens")

    def __init__(self, tokens: Iterable[int] = ()) -> None:
        self.length: list[int] = [0]  # the longest string of each state
        self.link: list[int] = [-1]  # suffix link (root: -1)
        self.first_end: list[int] = [-1]  # end position of the state's first occurrence
        self.next: list[dict[int, int]] = [{}]
        self.tokens: list[int] = []
        self.last = 0
        for token in tokens:
            self.extend(token)

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, token: int) -> None:
        """Append one token (amortized O(1))."""
        token = int(token)
        self.tokens.append(token)
        cur = self._state(self.length[self.last] + 1, len(self.tokens) - 1)
        p = self.last
        while p != -1 and token not in self.next[p]:
            self.next[p][token] = cur
            p = self.link[p]
        if p == -1:
            self.link[cur] = 0
        else:
            q = self.next[p][token]
            if self.length[p] + 1 == self.length[q]:
                self.link[cur] = q
            else:
                clone = self._state(self.length[p] + 1, self.first_end[q])
                self.next[clone] = dict(self.next[q])
                self.link[clone] = self.link[q]
                while p != -1 and self.next[p].get(token) == q:
                    self.next[p][token] = clone
                    p = self.link[p]
                self.link[q] = self.link[cur] = clone
        self.last = cur

    def extend_all(self, tokens: Iterable[int]) -> None:
        for token in tokens:
            self.extend(token)

    def _state(self, length: int, first_end: int) -> int:
        self.length.append(length)
        self.link.append(-1)
        self.first_end.append(first_end)
        self.next.append({})
        return len(self.length) - 1

    # -- lookups ---------------------------------------------------------------------------------------------------
    def longest_match(self) -> tuple[int, int] | None:
        """(length, continuation start) of the longest suffix of the text that also ends earlier; None: none."""
        if len(self.tokens) < 2:
            return None
        state = self.link[self.last]
        if state <= 0:
            return None
        return self.length[state], self.first_end[state] + 1

    def fixed_match(self, size: int) -> tuple[int, int] | None:
        """(size, continuation start) of the earliest earlier occurrence of the text's last `size` tokens."""
        n = len(self.tokens)
        if size <= 0 or n < size + 1:
            return None
        state = self.last
        while state > 0 and self.length[state] >= size:
            low = self.length[self.link[state]] + 1 if self.link[state] > 0 else 1
            if low <= size and self.first_end[state] < n - 1:
                return size, self.first_end[state] + 1
            state = self.link[state]
        return None

    def match(self, max_ngram_size: int = -1) -> tuple[int, int] | None:
        """TensorRT-LLM's choice: the longest match (-1), else sizes max_ngram_size down to 1."""
        if max_ngram_size == -1:
            return self.longest_match()
        for size in range(max_ngram_size, 0, -1):
            found = self.fixed_match(size)
            if found is not None:
                return found
        return None

    def drafts(self, k: int, max_ngram_size: int = -1) -> tuple[int, list[int]]:
        """(match length, the up to `k` tokens that followed the match); (0, []) without a match."""
        found = self.match(max_ngram_size)
        if found is None or k <= 0:
            return 0, []
        length, start = found
        return length, self.tokens[start : start + k]

    def match_other(self, suffix: Sequence[int]) -> tuple[int, int] | None:
        """The longest tail of `suffix` (another request's last tokens) that occurs in this text with at least one
        token after it: (length, continuation start), for a pool shared across requests. O(len(suffix))."""
        state, length = 0, 0
        for token in suffix:  # the usual longest-common-substring walk, ending at the suffix's last token
            while state != 0 and token not in self.next[state]:
                state = self.link[state]
                length = self.length[state]
            if token in self.next[state]:
                state = self.next[state][token]
                length += 1
        while state > 0:
            if self.first_end[state] + 1 < len(self.tokens):
                return length, self.first_end[state] + 1
            state = self.link[state]
            length = self.length[state]
        return None


__all__ = ["SuffixAutomaton"]
