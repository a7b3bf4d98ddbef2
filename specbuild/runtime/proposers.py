"""Where a sequence's draft tokens come from, apart from how they are verified: the serving engine's proposers.

As vLLM's proposers do, a proposer only makes drafts; the serving engine (`specbuild.runtime.serving`) puts each
sequence's [last token, drafts] (or a token tree) into the same batched target forward as every other sequence's
block and accepts with its one set of rules (`accept_greedy`, modified rejection sampling against the draft's
distributions, the tree accept). So a method is lossless whatever its drafts are, and every method batches in
flight. A proposer drafts for many sequences at once: its model's forwards run over the engine's rows.

- `NGramProposer`: prompt lookup over the sequence's own tokens, no model (TensorRT-LLM's NGram drafter).
- `SAProposer`: the continuation of the longest earlier match of the sequence's suffix, from a suffix automaton
  extended by each accepted token (TensorRT-LLM's SA drafter; `specbuild.runtime.suffix_automaton`).
- `ModelProposer`: a draft model proposing K-token chains: a separate draft (draft-target) with its own KV cache,
  one row per engine row, or the target's own first L layers (`self_draft.self_draft_proposer`), which write only their
  speculative slots into the target's own cache (`specbuild.runtime.self_draft`).
- `Eagle3Proposer`: the EAGLE-3 draft layer (`specbuild.runtime.eagle3`), fed the target's captured low/mid/high
  features of the verified positions (the target's forward captures them for it), with its own KV cache rows;
  a chain, or the static tree `eagle_choices` expanded depth by depth.

A proposer's own cache rows follow the engine's rows (`swap_rows`, `admit`), and each row remembers the tokens its
entries stand for, so a reused prompt prefix or an accepted draft keeps its draft K/V and nothing else does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from specbuild.medusa.tree import MedusaTree
from specbuild.runtime.decoding import TokenDecoding
from specbuild.runtime.kv_cache import KVCache
from specbuild.runtime.model import CausalLM
from specbuild.runtime.sampling import draw
from specbuild.runtime.suffix_automaton import SuffixAutomaton

SHORT_FEED = 16
"""Feeds up to this many tokens share one draft forward; longer ones (a draft catching up on a prompt) run alone."""


@dataclass
class Proposal:
    """One sequence's drafts for one step: a chain, or (`tree`) the nodes 1..N of a token tree whose node 0 is the
    sequence's pending token."""

    tokens: list[int]
    logits: torch.Tensor | None = None  # [len(tokens), V] the draft's raw logits (sampling: rejection sampling's q)
    tree: MedusaTree | None = None


class Drafting(Protocol):
    """What a proposer reads of a sequence being served (the engine's `_Sequence`)."""

    row: int
    committed: list[int]  # the tokens whose K/V the target's row holds
    pending: list[int]  # [the newest token], fed with the drafts
    decoding: TokenDecoding
    gen: torch.Generator | None
    draft_state: Any


@dataclass
class ProposerStats:
    forwards: int = 0  # draft forwards (each over many sequences)
    rows: int = 0  # sum over draft forwards of the sequences that drafted in them


class Proposer:
    """The engine's interface to a drafting method (defaults: no model, no cache of its own)."""

    max_draft_len: int = 0
    capture_layers: tuple[int, ...] = ()  # target layers whose outputs `observe` gets for the committed tokens
    side_layers: tuple[int, Sequence[nn.Module]] | None = None  # run in every target forward (a self-draft adapter)
    extra_cache_layers: int = 0  # cache layers the target's cache needs beyond the target's own (side_layers')
    block_tokens: int = 0  # the most tokens one proposal puts in a target block (pending token included)

    def __init__(self) -> None:
        self.stats = ProposerStats()

    def bind(self, cache: KVCache) -> None:
        """The engine's target cache (its rows and length): a proposer with a cache of its own sizes it so."""

    def reusable(self, row: int, prompt: np.ndarray, n: int) -> int:
        """How much of the `n` prompt tokens the engine's row `row` holds may be reused (the draft must be able to
        follow from there)."""
        return n

    def admit(self, seq: Drafting, source: int, prompt: np.ndarray, match: int) -> None:
        """`seq` joined at row seq.row with the first `match` prompt tokens from engine row `source` (seq.row
        itself: that row's own contents, or a free row's)."""
        seq.draft_state = None

    def swap_rows(self, a: int, b: int) -> None:
        """The engine exchanged rows a and b."""

    def release(self, seq: Drafting) -> None:
        """`seq` finished (or failed, or was cancelled): its row returns to the engine's pool."""

    def observe(self, seq: Drafting, features: torch.Tensor) -> None:
        """The captured target features [n, F] of the n tokens the last target forward committed for `seq`."""

    def propose(self, seqs: Sequence[Drafting], ks: Sequence[int]) -> list[Proposal | None]:
        """Drafts for each sequence, at most ks[i] tokens deep (None: nothing to propose this step)."""
        raise NotImplementedError


def _common(a: np.ndarray, b: Sequence[int] | np.ndarray) -> int:
    b = np.asarray(b, dtype=np.int64)
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


def _choose(logits: torch.Tensor, seq: Drafting) -> int:
    """The draft's token: its argmax for a greedy request, else a draw from the very distribution rejection
    sampling will use as q (`draft_probabilities`), which keeps sampled output the target's."""
    if seq.decoding.greedy or seq.gen is None:
        return int(logits.argmax())
    return int(draw(seq.decoding.draft_probabilities(logits[None])[0], seq.gen))


def _groups(rows: Sequence[int], widths: Sequence[int]) -> list[tuple[int, int, list[int]]]:
    """(lo, hi, members): the short feeds in one forward over rows lo..hi-1 (rows between that do not draft are
    padding, their outputs dropped and nothing committed), each long feed alone."""
    short = [i for i, w in enumerate(widths) if w <= SHORT_FEED]
    groups = [(rows[i], rows[i] + 1, [i]) for i, w in enumerate(widths) if w > SHORT_FEED]
    if short:
        groups.append((min(rows[i] for i in short), max(rows[i] for i in short) + 1, short))
    return groups


class _OwnRows:
    """A proposer's own KV cache, one row per engine row, and the tokens each row's entries stand for."""

    def __init__(self, cache: KVCache) -> None:
        self.cache = cache
        self.tokens = [np.zeros(0, dtype=np.int64) for _ in range(cache.batch_size)]

    def swap(self, a: int, b: int) -> None:
        self.cache.swap_rows(a, b)
        self.tokens[a], self.tokens[b] = self.tokens[b], self.tokens[a]

    def keep(self, dest: int, source: int, entries: int, tokens: np.ndarray) -> None:
        """Row `dest` holds the first `entries` entries of row `source`, standing for `tokens`."""
        if source != dest:
            self.cache.copy_prefix(source, dest, entries)
        else:
            self.cache.truncate_row(dest, entries)
        self.tokens[dest] = np.asarray(tokens, dtype=np.int64).copy()


# -- NGram -------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NGramConfig:
    """TensorRT-LLM's NGramDecodingConfig (tensorrt_llm/llmapi/llm_args.py): `max_draft_len` tokens per match,
    patterns of up to `max_matching_ngram_size` tokens, every match of a pattern kept (`is_keep_all`) or only the
    longest, the oldest match proposed (`is_use_oldest`) or the newest, one pool for all requests
    (`is_public_pool`) or one per request."""

    max_draft_len: int
    max_matching_ngram_size: int = 2
    is_keep_all: bool = True
    is_use_oldest: bool = True
    is_public_pool: bool = True

    def __post_init__(self) -> None:
        if self.max_draft_len < 1 or self.max_matching_ngram_size < 1:
            raise ValueError(f"NGram needs max_draft_len >= 1 and max_matching_ngram_size >= 1 (got "
                             f"{self.max_draft_len}, {self.max_matching_ngram_size})")


Pool = dict[tuple[int, ...], dict[tuple[int, ...], None]]
"""pattern -> its matches, oldest first (a dict as an ordered set)."""


@dataclass
class _NGramState:
    pool: Pool
    start: int = 0  # where the pool's next update starts in the sequence


class NGramProposer(Proposer):
    """Prompt lookup: the tokens that followed the sequence's last n tokens where they occurred before.

    The semantics of NVIDIA/TensorRT-LLM tensorrt_llm/_torch/speculative/ngram.py @02499765 (unchanged at
    @c4dc529f: `NGramPoolManager.get_draft_tokens`, a private pool dropped when its request completes; main's
    NGramDecodingConfig keeps these fields - a one-model NGram over the suffix automaton, ngram_worker.py
    @be5be52f, is what `SAProposer` does with a fixed max_matching_ngram_size), written anew: each step the pool
    learns every (pattern, match) pair of the sequence from `start` on (patterns of max_matching_ngram_size down to
    1 tokens, a match the up to max_draft_len tokens after it; a new match replaces the kept ones that are shorter,
    and with is_keep_all false a longer match replaces the one kept); the drafts are the match of the longest
    pattern that ends the sequence (the oldest or newest of its matches); `start` then moves to max_draft_len +
    max_matching_ngram_size - 1 tokens before the end. The pool's matches keep the full max_draft_len; the engine's
    load schedule shortens the drafts of a step, not the pool."""

    def __init__(self, config: NGramConfig) -> None:
        super().__init__()
        self.config = config
        self.max_draft_len = config.max_draft_len
        self.block_tokens = config.max_draft_len + 1
        self.public: Pool = {}

    def admit(self, seq: Drafting, source: int, prompt: np.ndarray, match: int) -> None:
        seq.draft_state = _NGramState(self.public if self.config.is_public_pool else {})

    def propose(self, seqs: Sequence[Drafting], ks: Sequence[int]) -> list[Proposal | None]:
        out: list[Proposal | None] = []
        for seq, k in zip(seqs, ks, strict=True):
            drafts = self.lookup(seq.draft_state, [*seq.committed, *seq.pending])[:k]
            out.append(Proposal(drafts) if drafts else None)
        return out

    def lookup(self, state: _NGramState, tokens: Sequence[int]) -> list[int]:
        """Update the pool with `tokens` (the whole sequence so far) and return the drafts that follow it."""
        c, pool = self.config, state.pool
        n, longest = len(tokens), min(self.config.max_matching_ngram_size, len(tokens) - 1)
        sequence = tuple(tokens[state.start:])
        for size in range(longest, 0, -1):
            for left in range(len(sequence) - size):
                pattern = sequence[left : left + size]
                match = sequence[left + size : min(left + size + c.max_draft_len, len(sequence))]
                kept = pool.get(pattern)
                if kept is None or (not c.is_keep_all and len(match) > len(next(iter(kept)))):
                    pool[pattern] = {match: None}
                elif match not in kept:
                    for shorter in [m for m in kept if len(m) < len(match)]:
                        del kept[shorter]
                    kept[match] = None
        drafts: list[int] = []
        for size in range(longest, 0, -1):
            kept = pool.get(tuple(tokens[n - size :]))
            if kept:
                matches = list(kept)
                drafts = list(matches[0] if c.is_use_oldest else matches[-1])
                break
        state.start = max(0, n - (c.max_draft_len + c.max_matching_ngram_size - 1))
        return drafts


# -- SA (suffix automaton) -------------------------------------------------------------------------------------------

GLOBAL_POOL_MATCH = 64
"""The most tokens of a request's tail matched against the other requests' automata (SADecodingConfig's doc:
"suffix matching is capped at 64 tokens per request" with enable_global_pool)."""


@dataclass(frozen=True)
class SAConfig:
    """TensorRT-LLM's SADecodingConfig (NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/llm_args.py, main as indexed in
    2026): `max_draft_len` tokens after the match; `max_matching_ngram_size` -1 the longest match, n > 0 sizes n
    down to 1 (0 invalid); `enable_global_pool` searches every active request's automaton (and completed ones
    kept until `global_pool_size`, default max(64, max_batch_size), evicting the oldest completed)."""

    max_draft_len: int
    max_matching_ngram_size: int = -1
    enable_global_pool: bool = False
    global_pool_size: int | None = None

    def __post_init__(self) -> None:
        """SADecodingConfig.validate_sa_config's refusals, in its words."""
        if self.max_draft_len < 1:
            raise ValueError("max_draft_len must be > 0 for SA")
        n = self.max_matching_ngram_size
        if n == 0 or n < -1:
            raise ValueError(f"max_matching_ngram_size must be > 0 (fixed ngram) or -1 (longest match). Got {n}.")
        if self.enable_global_pool and n != -1 and not 1 <= n <= GLOBAL_POOL_MATCH:
            raise ValueError("max_matching_ngram_size must be -1 (longest match) or in [1, 64] when "
                             f"enable_global_pool is True. Got {n}.")
        if self.global_pool_size is not None:
            if self.global_pool_size < 1:
                raise ValueError("global_pool_size must be >= 1")
            if not self.enable_global_pool:
                raise ValueError("global_pool_size requires enable_global_pool=True")


@dataclass
class _SAState:
    automaton: SuffixAutomaton
    active: bool = True


class SAProposer(Proposer):
    """Suffix-automaton drafting (TensorRT-LLM's standalone SA, `SAWorker`): each sequence's automaton is built
    from its prompt when it first drafts and then extended with exactly the tokens accepted since (never rebuilt);
    the drafts are the up to K tokens that followed the earliest earlier occurrence of the match
    (`SuffixAutomaton.match`). Without a match the sequence drafts nothing that step (TensorRT-LLM's kernel then
    leaves its draft buffer as it was, to be rejected by verification: the same output, fewer wasted slots here).

    With `enable_global_pool`, the longest match of the sequence's last (at most 64) tokens over the other pool
    members' automata counts too when it is longer than its own; the pool holds the active sequences and the
    most recently completed ones up to `global_pool_size`."""

    def __init__(self, config: SAConfig, max_batch: int = 1) -> None:
        super().__init__()
        self.config = config
        self.max_draft_len = config.max_draft_len
        self.block_tokens = config.max_draft_len + 1
        self.pool_size = config.global_pool_size or max(GLOBAL_POOL_MATCH, max_batch)
        if config.global_pool_size is not None and config.global_pool_size < max_batch:
            raise ValueError(f"global_pool_size {config.global_pool_size} must be >= max_batch_size {max_batch}")
        self.pool: list[_SAState] = []  # admission order: active and retained completed automata

    def admit(self, seq: Drafting, source: int, prompt: np.ndarray, match: int) -> None:
        seq.draft_state = state = _SAState(SuffixAutomaton())
        if self.config.enable_global_pool:
            self.pool.append(state)
            finished = [s for s in self.pool if not s.active]
            while len(self.pool) > self.pool_size and finished:
                self.pool.remove(finished.pop(0))

    def release(self, seq: Drafting) -> None:
        if isinstance(seq.draft_state, _SAState):
            seq.draft_state.active = False

    def propose(self, seqs: Sequence[Drafting], ks: Sequence[int]) -> list[Proposal | None]:
        out: list[Proposal | None] = []
        for seq, k in zip(seqs, ks, strict=True):
            drafts = self.lookup(seq.draft_state, [*seq.committed, *seq.pending], k)
            out.append(Proposal(drafts) if drafts else None)
        return out

    def lookup(self, state: _SAState, tokens: Sequence[int], k: int) -> list[int]:
        """Extend the automaton with the tokens it has not seen (the sequence only grows) and draft up to k."""
        automaton = state.automaton
        if len(tokens) < len(automaton):
            raise RuntimeError(f"SA drafter out of step: its automaton holds {len(automaton)} tokens, the "
                               f"sequence {len(tokens)}")
        automaton.extend_all(tokens[len(automaton):])
        length, drafts = automaton.drafts(k, self.config.max_matching_ngram_size)
        if self.config.enable_global_pool:
            tail = tokens[-GLOBAL_POOL_MATCH:]
            for other in self.pool:
                if other is state:
                    continue
                found = other.automaton.match_other(tail)
                if found is not None and found[0] > length:
                    length, start = found
                    drafts = other.automaton.tokens[start : start + k]
        return drafts


# -- a draft model (draft-target, self-draft) -----------------------------------------------------------------------


class ModelProposer(Proposer):
    """A draft CausalLM proposing K-token chains, batched over the sequences: one forward feeding each row what
    its draft has not seen (its newest token; after a reused prompt or a rejected draft, more), then K - 1
    one-token forwards.

    `shared` (a self-draft): the draft's layers are the target's own and write only speculative slots after the
    committed prefix in the target's own cache (a `KVCache.alias` with lengths of its own), which the target's
    verify forward overwrites; the target's forward fills the adapter's cache layer (`side_layers`). Otherwise
    the draft keeps a cache of its own, rows following the engine's."""

    def __init__(self, draft: CausalLM, max_draft_len: int, *, shared: bool = False,
                 side_layers: tuple[int, Sequence[nn.Module]] | None = None) -> None:
        super().__init__()
        if max_draft_len < 1:
            raise ValueError(f"a draft model proposes at least 1 token per step (max_draft_len {max_draft_len})")
        self.draft, self.max_draft_len, self.shared = draft, max_draft_len, shared
        self.side_layers = side_layers
        self.extra_cache_layers = len(side_layers[1]) if side_layers is not None else 0
        self.block_tokens = max_draft_len + 1
        self.rows: _OwnRows | None = None
        self.target_cache: KVCache | None = None

    def bind(self, cache: KVCache) -> None:
        if self.shared:
            self.target_cache = cache
        else:
            self.rows = _OwnRows(self.draft.new_cache(cache.batch_size, cache.max_len + SHORT_FEED + 1))

    def swap_rows(self, a: int, b: int) -> None:
        if self.rows is not None:
            self.rows.swap(a, b)

    def admit(self, seq: Drafting, source: int, prompt: np.ndarray, match: int) -> None:
        seq.draft_state = None
        if self.rows is not None:  # keep the draft's entries that stand for this prompt (never its last token)
            entries = min(_common(self.rows.tokens[source], prompt), len(prompt) - 1)
            self.rows.keep(seq.row, source, entries, prompt[:entries])

    def propose(self, seqs: Sequence[Drafting], ks: Sequence[int]) -> list[Proposal | None]:
        rows = [seq.row for seq in seqs]
        lo, hi = min(rows), max(rows) + 1
        if self.shared:
            assert self.target_cache is not None
            cache = self.target_cache.view(lo, hi).alias()  # the committed prefix is the target's
            feeds = [list(seq.pending) for seq in seqs]
            offset = lo
        else:
            assert self.rows is not None
            cache, offset = self.rows.cache, 0
            feeds = []
            for seq in seqs:
                tokens = [*seq.committed, *seq.pending]
                seen = min(_common(self.rows.tokens[seq.row], tokens), len(tokens) - 1)
                self.rows.cache.truncate_row(seq.row, seen)
                self.rows.tokens[seq.row] = np.asarray(tokens, dtype=np.int64)
                feeds.append(tokens[seen:])
        last: list[torch.Tensor] = [torch.empty(0)] * len(seqs)
        for g_lo, g_hi, members in _groups(rows, [len(f) for f in feeds]):
            width = max(len(feeds[i]) for i in members)
            ids = torch.zeros(g_hi - g_lo, width, dtype=torch.long)
            counts = torch.zeros(g_hi - g_lo, dtype=torch.long)
            for i in members:
                ids[rows[i] - g_lo, : len(feeds[i])] = torch.tensor(feeds[i])
                counts[rows[i] - g_lo] = len(feeds[i])
            view = cache.view(g_lo - offset, g_hi - offset)
            logits = self.draft(ids, view).logits
            self._count(len(members))
            view.advance(counts)
            for i in members:
                last[i] = logits[rows[i] - g_lo, len(feeds[i]) - 1]
        drafts: list[list[int]] = [[] for _ in seqs]
        raw: list[list[torch.Tensor]] = [[] for _ in seqs]
        for step in range(max(ks)):
            chosen = torch.zeros(hi - lo, dtype=torch.long)
            counts = torch.zeros(hi - lo, dtype=torch.long)
            for i, seq in enumerate(seqs):
                if step < ks[i]:
                    token = _choose(last[i], seq)
                    drafts[i].append(token)
                    raw[i].append(last[i])
                    chosen[rows[i] - lo] = token
                    counts[rows[i] - lo] = step + 1 < ks[i]
            if step + 1 == max(ks):
                break
            view = cache.view(lo - offset, hi - offset)
            logits = self.draft(chosen[:, None], view).logits[:, 0]
            self._count(int(counts.sum()))
            view.advance(counts)
            for i, seq in enumerate(seqs):
                if counts[rows[i] - lo]:
                    last[i] = logits[rows[i] - lo]
                    if self.rows is not None:
                        self.rows.tokens[seq.row] = np.append(self.rows.tokens[seq.row], drafts[i][-1])
        return [Proposal(d, None if seq.decoding.greedy else torch.stack(r)) if d else None
                for seq, d, r in zip(seqs, drafts, raw, strict=True)]

    def _count(self, rows: int) -> None:
        self.stats.forwards += 1
        self.stats.rows += rows


# -- EAGLE-3 ---------------------------------------------------------------------------------------------------------


@dataclass
class _EagleState:
    features: list[torch.Tensor] = field(default_factory=list)  # target features of the positions not yet fed


class Eagle3Proposer(Proposer):
    """EAGLE-3 drafting over many sequences (the method of `specbuild.runtime.eagle3_decoding`, batched in
    flight): each step the draft first catches up on the positions the target committed since, fed the target's
    captured features there (one forward for every drafting row), which gives the first draft token; then K - 1
    chain forwards, or, with `choices` (TensorRT-LLM's `eagle_choices`), one forward per tree depth over that
    depth's nodes with children, a node's children the draft's top-ranked tokens there. Only caught-up entries
    stay in the draft's cache: chain and tree entries are rolled back (the next catch-up rewrites them from the
    target's features). A step's K bounds the tree's depth: the paths of at most K tokens."""

    def __init__(self, draft: Any, max_draft_len: int, choices: Sequence[Sequence[int]] | None = None) -> None:
        super().__init__()
        if max_draft_len < 1:
            raise ValueError(f"EAGLE-3 proposes at least 1 token per step (max_draft_len {max_draft_len})")
        self.draft, self.max_draft_len = draft, max_draft_len
        self.capture_layers = tuple(draft.layer_ids)
        self.choices = tuple(tuple(int(r) for r in c) for c in choices) if choices else None
        self._tree_cache: dict[int, MedusaTree | None] = {}
        self.block_tokens = max_draft_len + 1
        if self.choices is not None:
            tree = self.tree(max_draft_len)
            if tree is None or tree.max_depth < max(len(c) for c in self.choices):
                deepest = max(len(c) for c in self.choices)
                raise ValueError(f"the EAGLE-3 tree is {deepest} deep but max_draft_len allows {max_draft_len} "
                                 "draft tokens per path; raise max_draft_len or use a shallower tree")
            self.block_tokens = tree.num_nodes + 1
        self.rows: _OwnRows | None = None

    def tree(self, depth: int) -> MedusaTree | None:
        """The tree of the paths of at most `depth` tokens (None: none)."""
        assert self.choices is not None
        if depth not in self._tree_cache:
            paths = [c for c in self.choices if len(c) <= depth]
            self._tree_cache[depth] = MedusaTree.from_choices(paths) if paths else None
        return self._tree_cache[depth]

    def bind(self, cache: KVCache) -> None:
        self.rows = _OwnRows(self.draft.new_cache(cache.batch_size, cache.max_len + self.block_tokens + SHORT_FEED))

    def swap_rows(self, a: int, b: int) -> None:
        assert self.rows is not None
        self.rows.swap(a, b)

    def reusable(self, row: int, prompt: np.ndarray, n: int) -> int:
        """Entry i pairs the target's features at position i with token i + 1, and features are not kept: the
        target recomputes (and captures) every position the draft has no entry for."""
        assert self.rows is not None
        return min(n, max(0, _common(self.rows.tokens[row], prompt) - 1))

    def admit(self, seq: Drafting, source: int, prompt: np.ndarray, match: int) -> None:
        assert self.rows is not None
        self.rows.keep(seq.row, source, match, prompt[: match + 1] if match else prompt[:0])
        seq.draft_state = _EagleState()

    def observe(self, seq: Drafting, features: torch.Tensor) -> None:
        seq.draft_state.features.append(features)

    def propose(self, seqs: Sequence[Drafting], ks: Sequence[int]) -> list[Proposal | None]:
        assert self.rows is not None
        rows = [seq.row for seq in seqs]
        root_logits, root_out = self._catch_up(seqs, rows)
        if self.choices is not None:
            return self._trees(seqs, rows, ks, root_logits, root_out)
        return self._chains(seqs, rows, ks, root_logits, root_out)

    def _catch_up(self, seqs: Sequence[Drafting], rows: list[int]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Feed every position the target committed since the row's last catch-up (features there, the next
        token), committed in the draft's cache; returns each row's logits and output at its last one."""
        assert self.rows is not None
        cache = self.rows.cache
        feeds = []
        for seq in seqs:
            tokens = [*seq.committed, *seq.pending]
            start = int(cache.lengths[seq.row])
            features = torch.cat(seq.draft_state.features) if seq.draft_state.features else None
            if features is None or start + features.shape[0] != len(seq.committed):
                raise RuntimeError(f"EAGLE-3 draft out of step: its row holds {start} positions and has features "
                                   f"for {0 if features is None else features.shape[0]} more, the target "
                                   f"{len(seq.committed)}")
            feeds.append((tokens[start + 1 :], features))
            seq.draft_state.features = []
            self.rows.tokens[seq.row] = np.asarray(tokens, dtype=np.int64)
        logits_at: list[torch.Tensor] = [torch.empty(0)] * len(seqs)
        out_at: list[torch.Tensor] = [torch.empty(0)] * len(seqs)
        hidden_size = self.draft.config.hidden_size
        for lo, hi, members in _groups(rows, [len(f[0]) for f in feeds]):
            width = max(len(feeds[i][0]) for i in members)
            ids = torch.zeros(hi - lo, width, dtype=torch.long)
            hidden = torch.zeros(hi - lo, width, hidden_size, dtype=self.draft.dtype)
            counts = torch.zeros(hi - lo, dtype=torch.long)
            for i in members:
                tokens, features = feeds[i]
                r = rows[i] - lo
                ids[r, : len(tokens)] = torch.tensor(tokens)
                hidden[r, : len(tokens)] = self.draft.fuse(features)
                counts[r] = len(tokens)
            view = cache.view(lo, hi)
            logits, out = self.draft(ids, hidden, view)
            self._count(len(members))
            view.advance(counts)
            for i in members:
                logits_at[i] = logits[rows[i] - lo, len(feeds[i][0]) - 1]
                out_at[i] = out[rows[i] - lo, len(feeds[i][0]) - 1]
        return logits_at, out_at

    def _chains(self, seqs: Sequence[Drafting], rows: list[int], ks: Sequence[int], last: list[torch.Tensor],
                hidden: list[torch.Tensor]) -> list[Proposal | None]:
        assert self.rows is not None
        cache = self.rows.cache
        lo, hi = min(rows), max(rows) + 1
        committed = cache.lengths.clone()
        drafts: list[list[int]] = [[] for _ in seqs]
        raw: list[list[torch.Tensor]] = [[] for _ in seqs]
        for step in range(max(ks)):
            ids = torch.zeros(hi - lo, 1, dtype=torch.long)
            h = torch.zeros(hi - lo, 1, self.draft.config.hidden_size, dtype=self.draft.dtype)
            counts = torch.zeros(hi - lo, dtype=torch.long)
            for i, seq in enumerate(seqs):
                if step < ks[i]:
                    token = _choose(last[i], seq)
                    drafts[i].append(token)
                    raw[i].append(last[i])
                    ids[rows[i] - lo, 0], h[rows[i] - lo, 0] = token, hidden[i]
                    counts[rows[i] - lo] = step + 1 < ks[i]
            if step + 1 == max(ks):
                break
            view = cache.view(lo, hi)
            logits, out = self.draft(ids, h, view)
            self._count(int(counts.sum()))
            view.advance(counts)
            for i in range(len(seqs)):
                if counts[rows[i] - lo]:
                    last[i], hidden[i] = logits[rows[i] - lo, 0], out[rows[i] - lo, 0]
        cache.truncate(committed)
        return [Proposal(d, None if seq.decoding.greedy else torch.stack(r)) if d else None
                for seq, d, r in zip(seqs, drafts, raw, strict=True)]

    def _trees(self, seqs: Sequence[Drafting], rows: list[int], ks: Sequence[int], root_logits: list[torch.Tensor],
               root_out: list[torch.Tensor]) -> list[Proposal | None]:
        """One tree per step (the deepest the step's K allows, the same for every row: one forward per depth);
        rows whose own K is smaller get their own shallower tree's nodes, taken from the same expansion."""
        assert self.rows is not None
        cache = self.rows.cache
        tree = self.tree(max(ks))
        if tree is None:
            return [None] * len(seqs)
        lo, hi = min(rows), max(rows) + 1
        batch, size = hi - lo, tree.num_nodes + 1
        committed = cache.lengths.clone()
        index = torch.tensor([r - lo for r in rows])
        tokens = torch.zeros(batch, size, dtype=torch.long)
        width = root_logits[0].shape[-1]
        logits = {0: torch.zeros(batch, width).index_copy(0, index, torch.stack(root_logits))}
        outs = {0: torch.zeros(batch, root_out[0].shape[-1], dtype=root_out[0].dtype)
                .index_copy(0, index, torch.stack(root_out))}
        expanded: list[int] = []
        ranks = int(tree.rank.max()) + 1
        start = cache.lengths[lo:hi].clone()
        for depth in range(1, tree.max_depth + 1):
            nodes = (tree.depth == depth).nonzero().flatten().tolist()
            for node in nodes:
                top = logits[int(tree.parent[node])].topk(ranks, dim=-1).indices
                tokens[:, node] = top[:, int(tree.rank[node])]
            parents = [n for n in nodes if bool((tree.parent == n).any())]
            if not parents:
                break
            at = torch.tensor(parents)
            mask = torch.cat([tree.attention_mask[at][:, expanded], torch.eye(len(parents), dtype=torch.bool)], dim=1)
            hidden = torch.stack([outs[int(tree.parent[n])] for n in parents], dim=1)
            positions = (start + depth - 1)[:, None].expand(batch, len(parents))
            view = cache.view(lo, hi)
            step_logits, step_out = self.draft(tokens[:, at], hidden, view, position_ids=positions, tree_mask=mask)
            self._count(len(seqs))
            view.advance(len(parents))  # every row of the view (the mask counts the earlier depths' entries)
            expanded += parents
            for i, n in enumerate(parents):
                logits[n], outs[n] = step_logits[:, i], step_out[:, i]
        cache.truncate(committed)
        proposals: list[Proposal | None] = []
        for i, k in enumerate(ks):
            own = tree if k == max(ks) else self.tree(k)
            if own is None:
                proposals.append(None)
                continue
            nodes = tokens[rows[i] - lo]
            if own is not tree:  # the shallower tree's nodes are the same paths of the deeper one
                nodes = _nodes_of(own, tree, nodes)
            proposals.append(Proposal(nodes[1:].tolist(), tree=own))
        return proposals

    def _count(self, rows: int) -> None:
        self.stats.forwards += 1
        self.stats.rows += rows


def _nodes_of(small: MedusaTree, big: MedusaTree, tokens: torch.Tensor) -> torch.Tensor:
    """`tokens` of the nodes of tree `big` [N_big + 1] -> those of `small`, whose paths are some of big's."""
    index = {path: node for node, path in enumerate(big.choices, start=1)}
    return tokens[torch.tensor([0, *(index[path] for path in small.choices)])]


__all__ = ["Eagle3Proposer", "ModelProposer", "NGramConfig", "NGramProposer", "Proposal", "Proposer", "SAConfig",
           "SAProposer"]
