"""Lookahead decoding's algorithm (Fu et al. 2024, arXiv 2402.02057): the Jacobi window, the n-gram pool and the
choice of the verified candidate, as pure functions on token lists.

Nothing here knows of a model, a KV cache or stop rules; `specbuild.runtime.serving` runs it (one forward per
step, the accepted tokens' K/V committed as a Medusa path is) and `specbuild.runtime.lookahead_decoding` drives it.

One step feeds a block that is a tree rooted at the last accepted token x (block index 0, position offset 0):

- the lookahead branch, W columns of Jacobi guesses. Their first tokens form one causal chain (x's own column
  first, so with a full window column 0's first token *is* x, as in TensorRT-LLM's layout); every later token of a
  column hangs under the one before it. So a token sees the prefix, the first tokens of the columns left of it and
  its own column's earlier tokens: the 2-D window of the paper, each column one n-gram trajectory;
- the verification branch, up to G n-grams from the pool whose first token is x: N-1 tokens each, a chain under x.

A token's position is its depth in that tree and it attends to its ancestors only, which is exactly what a Medusa
tree step feeds the model. The model's choice at each column's last token extends the column; a full column
(N-1 tokens) and that choice are an n-gram for the pool, and the column then drops its oldest token (the window
shifts up). While the window fills (its first N-2 steps) the columns grow by one token a step after a lead chain of
seed tokens that keeps them where a full window would be. Verification keeps the longest candidate prefix whose
every token is the model's choice after the one before (after x for the first), plus the model's next token:
greedy output is plain greedy output, only in fewer forwards.

The block holds at most 1 + (N-2) + (W-1+G)(N-1) tokens, TensorRT-LLM's `calculateSpeculativeResourceTuple`
(`specbuild.contracts.lookahead.speculative_resource`), so an engine built for (W, N, G) runs it unchanged.

Upstream facts used (NVIDIA/TensorRT-LLM): the block layout (column 0 keyed by the last accepted token, the first
guesses one causal line, each column a chain) and the filling phase are those of
cpp/tensorrt_llm/layers/lookaheadAlgorithm.cpp @22d95135 (`lookahead`, `posIdsToMask`, `update`); the pool keeps
at most G distinct tails per key, the newest last, and a guess takes the newest G, as
cpp/tensorrt_llm/layers/lookaheadPoolManager.cpp @1020a8d7 (`insertOne`, `guess`). Written here independently:
seeds are spread over the prompt instead of drawn at random, the candidates are not merged into a trie
(`treeEncode`), and column 0's n-gram is keyed by the last accepted token.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specbuild.contracts.lookahead import LookaheadConfig, legal_problems, request_problem, speculative_resource

__all__ = [
    "LookaheadConfig",
    "LookaheadState",
    "NgramPool",
    "StepPlan",
    "Window",
    "advance_window",
    "ancestors",
    "check_config",
    "depths",
    "initial_window",
    "max_block_tokens",
    "new_ngrams",
    "plan_step",
    "request_problem",
    "seed_tokens",
    "tree_mask",
    "verify",
]


def check_config(config: LookaheadConfig) -> None:
    """ValueError naming the rule a (W, N, G) breaks (TensorRT-LLM's LookaheadDecodingConfig rules)."""
    problems = legal_problems(*config)
    if problems:
        raise ValueError(f"lookahead (W, N, G) = {tuple(config)}: {problems[0]}")


def max_block_tokens(config: LookaheadConfig) -> int:
    """The most tokens one step feeds: the draft tokens plus the last accepted token (maxDecodingTokens)."""
    return speculative_resource(*config).max_decoding_tokens


# -- the n-gram pool -----------------------------------------------------------------------------------------------


class NgramPool:
    """N-grams seen so far, by first token: for each key the `capacity` most recent distinct tails (N-1 tokens),
    so a key's candidates are the last G n-grams the text or the window produced after it."""

    def __init__(self, n: int, capacity: int) -> None:
        if n < 2:
            raise ValueError(f"an n-gram pool needs n >= 2 (got {n})")
        self.n, self.capacity = n, capacity
        self._tails: dict[int, OrderedDict[tuple[int, ...], None]] = {}

    def add(self, ngram: Sequence[int]) -> None:
        """Insert one n-gram (n tokens) as its key's most recent; the oldest beyond capacity leaves."""
        if len(ngram) != self.n:
            raise ValueError(f"a {self.n}-gram pool got {len(ngram)} tokens")
        if self.capacity <= 0:
            return
        tails = self._tails.setdefault(int(ngram[0]), OrderedDict())
        tail = tuple(int(t) for t in ngram[1:])
        tails.pop(tail, None)
        tails[tail] = None
        while len(tails) > self.capacity:
            tails.popitem(last=False)

    def add_text(self, tokens: Sequence[int]) -> None:
        """Every n-gram of `tokens`, in order (a prompt's n-grams are candidates from the first step)."""
        for start in range(len(tokens) - self.n + 1):
            self.add(tokens[start : start + self.n])

    def candidates(self, key: int, count: int) -> list[tuple[int, ...]]:
        """Up to `count` tails after `key`, most recent first."""
        tails = self._tails.get(int(key))
        if not tails or count <= 0:
            return []
        return list(reversed(tails))[:count]

    def __len__(self) -> int:
        return sum(len(t) for t in self._tails.values())


def new_ngrams(history: Sequence[int], emitted: Sequence[int], n: int) -> list[list[int]]:
    """The n-grams of `history + emitted` that end in an emitted token (what one step's accepted text adds)."""
    text = [*history[-(n - 1):], *emitted] if n > 1 else list(emitted)
    first = max(0, len(text) - len(emitted) - n + 1)
    return [text[s : s + n] for s in range(first, len(text) - n + 1)]


# -- the window ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Window:
    """The lookahead branch's state: `columns` (W of them, each its trajectory's tokens, oldest first, f = 1..N-1
    of them) and, while filling, the `lead` chain of N-2-f seed tokens before the columns. Once full (f = N-1),
    column 0's first slot stands for the last accepted token and is replaced by it in every block."""

    lead: tuple[int, ...]
    columns: tuple[tuple[int, ...], ...]

    @property
    def levels(self) -> int:
        return len(self.columns[0])


def seed_tokens(prompt: Sequence[int], count: int) -> list[int]:
    """`count` starting guesses spread over the prompt (deterministic, so a run repeats; the paper and
    TensorRT-LLM draw them from the prompt at random, which changes no output, only which guesses land)."""
    if not prompt:
        raise ValueError("lookahead needs a prompt to seed its window")
    return [int(prompt[(i * len(prompt)) // max(count, 1)]) for i in range(count)]


def initial_window(prompt: Sequence[int], config: LookaheadConfig) -> Window:
    """The first step's window: one level of seeds per column after N-3 lead seeds (none for N = 2, whose
    window is full from the start)."""
    check_config(config)
    w, n, _ = config
    if n < 2:
        raise ValueError("lookahead with N = 1 drafts nothing: decode plainly instead")
    lead = max(n - 3, 0)
    seeds = seed_tokens(prompt, lead + w)
    return Window(tuple(seeds[:lead]), tuple((s,) for s in seeds[lead:]))


# -- one step's block ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepPlan:
    """One step's block: `tokens[0]` is the last accepted token; `parents[i]` the block index token i hangs under
    (-1 for the root), from which positions (`depths`) and the attention mask (`tree_mask`) follow;
    `column_ends[c]` the block index of column c's last token; `candidates[g]` the block indices of verification
    candidate g's tokens."""

    tokens: list[int]
    parents: list[int]
    column_ends: list[int]
    candidates: list[list[int]]

    @property
    def num_drafts(self) -> int:
        return len(self.tokens) - 1


def plan_step(window: Window, pool: NgramPool, last_token: int, config: LookaheadConfig) -> StepPlan:
    """The block for one step: the window's columns and up to G pool candidates keyed by `last_token`."""
    w, n, g = config
    full = window.levels == n - 1
    tokens, parents = [int(last_token)], [-1]

    def add(token: int, parent: int) -> int:
        tokens.append(int(token))
        parents.append(parent)
        return len(tokens) - 1

    chain = 0  # the chain of first tokens: root, lead, then each column's first token
    for token in window.lead:
        chain = add(token, chain)
    column_ends = []
    for c, column in enumerate(window.columns[:w]):
        if c == 0 and full:
            first = 0  # column 0's first slot is the last accepted token itself
        else:
            first = chain = add(column[0], chain)
        end = first
        for token in column[1:]:
            end = add(token, end)
        column_ends.append(end)
    candidates = []
    for tail in pool.candidates(last_token, g):
        indices, parent = [], 0
        for token in tail:
            parent = add(token, parent)
            indices.append(parent)
        candidates.append(indices)
    return StepPlan(tokens, parents, column_ends, candidates)


def depths(parents: Sequence[int]) -> list[int]:
    """Each block token's depth under the root: its position offset."""
    out: list[int] = []
    for parent in parents:
        out.append(0 if parent < 0 else out[parent] + 1)
    return out


def ancestors(parents: Sequence[int], node: int) -> list[int]:
    """The non-root block indices from the root down to `node` (included): the step's tokens before the
    prediction made at `node`."""
    path = []
    while node > 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


def tree_mask(parents: Sequence[int]) -> torch.Tensor:
    """[T, T] bool: token i may attend to token j when j is i or one of its ancestors (a parent comes before its
    children). Built as lists, one tensor at the end: each step builds one per row."""
    size = len(parents)
    rows: list[list[bool]] = []
    for node, parent in enumerate(parents):
        row = list(rows[parent]) if parent >= 0 else [False] * size
        row[node] = True
        rows.append(row)
    return torch.tensor(rows, dtype=torch.bool)


# -- after the forward ---------------------------------------------------------------------------------------------


def verify(plan: StepPlan, choices: Sequence[int]) -> tuple[list[int], list[int]]:
    """(the accepted path as block indices, root first; the tokens it emits: the accepted drafts and the model's
    choice after the last). `choices[i]` is the model's token after block token i. The longest candidate prefix
    that agrees wins, the first listed (the most recent n-gram) on a tie."""
    best: list[int] = [0]
    for candidate in plan.candidates:
        path, previous = [0], 0
        for index in candidate:
            if plan.tokens[index] != choices[previous]:
                break
            path.append(index)
            previous = index
        if len(path) > len(best):
            best = path
    emitted = [plan.tokens[i] for i in best[1:]] + [int(choices[best[-1]])]
    return best, emitted


def advance_window(window: Window, plan: StepPlan, choices: Sequence[int],
                   config: LookaheadConfig) -> tuple[Window, list[list[int]]]:
    """The window after a step, and the n-grams its full columns produced. Each column takes the model's choice at
    its last token; a filling window grows (its lead chain one shorter), a full one shifts up."""
    _, n, _ = config
    outputs = [int(choices[end]) for end in plan.column_ends]
    if window.levels < n - 1:
        return Window(window.lead[1:], tuple((*col, out) for col, out in zip(window.columns, outputs,
                                                                               strict=True))), []
    ngrams = []
    for c, (column, out) in enumerate(zip(window.columns, outputs, strict=True)):
        first = plan.tokens[0] if c == 0 else column[0]
        ngrams.append([first, *column[1:], out])
    return Window((), tuple((*col[1:], out) for col, out in zip(window.columns, outputs, strict=True))), ngrams


class LookaheadState:
    """One sequence's lookahead: its window and pool (seeded from its prompt), stepped by the runtime."""

    def __init__(self, prompt: Sequence[int], config: LookaheadConfig) -> None:
        self.config = LookaheadConfig(*config)
        self.window = initial_window(prompt, self.config)
        self.pool = NgramPool(self.config.ngram_size, self.config.verification_set_size)
        self.pool.add_text(prompt)

    def plan(self, last_token: int) -> StepPlan:
        return plan_step(self.window, self.pool, last_token, self.config)

    def after(self, plan: StepPlan, choices: Sequence[int], history: Sequence[int]) -> tuple[list[int], list[int]]:
        """Verify, then learn: the window's new n-grams and those of the accepted text enter the pool.
        `history` is the sequence before this step (prompt and output up to the last accepted token)."""
        path, emitted = verify(plan, choices)
        self.window, ngrams = advance_window(self.window, plan, choices, self.config)
        for ngram in ngrams:
            self.pool.add(ngram)
        for ngram in new_ngrams(history, emitted, self.config.ngram_size):
            self.pool.add(ngram)
        return path, emitted
