"""EAGLE-3 speculative decoding (Li et al. 2025, arXiv 2503.01840) in the reference runtime, chain drafts.

Each round, per row: the draft first catches up on the positions the target verified last round, fed with the
target's captured low/mid/high features there (its cache then holds one entry per verified position), which
gives the first draft token; K - 1 chain steps follow, each fed with the draft's own previous output. The target
verifies the pending token and the K drafts in one forward, capturing the features of all K + 1 positions; the
accepted prefix (greedy: the longest matching the target's argmax; sampling: the runtime's modified rejection
sampling, so the output follows the target's distribution) and the target's own next token are emitted through
the stop rules. Only accepted K/V stay committed in either cache: the target commits the pending token and the
accepted drafts, the draft's chain entries are rolled back (next round's catch-up rewrites those positions from
the target's features, as TensorRT-LLM's and vLLM's EAGLE-3 workers do).

With `choices` (a static tree in the `{0, 0, 0}, {0, 1}` format of Medusa's and TensorRT-LLM's `eagle_choices`,
EAGLE: Li et al. 2024, arXiv 2401.15077, section 3.3), greedy only: after the catch-up, the draft expands the tree
depth by depth, one forward per depth over that depth's nodes that have children (each fed its parent's output,
seeing only its ancestors through a tree mask on the draft's own cache), a node's children being the top-ranked
tokens of the draft's distribution there; the target verifies the whole tree in one forward with the tree mask
(`specbuild.medusa.tree.MedusaTree`: node order, mask, positions by depth, the longest greedy-accepted path), and
only the accepted path's K/V is committed (`KVCache.compact`). The depth bound is `num_draft_tokens`, as
TensorRT-LLM's `max_draft_len` bounds an `eagle_choices` tree's depth (tensorrt_llm.llmapi.EagleDecodingConfig,
TensorRT-LLM 1.3.0rc27 reference: `max_draft_len`, `max_total_draft_tokens`, `eagle_choices`). Sampling keeps the
chain: TensorRT-LLM verifies EAGLE/Medusa trees greedily (`greedy_sampling`), and a tree's lossless sampling
needs a multi-draft rule the runtime does not have.

Rows of a batch have their own lengths; a forward over rows that need different numbers of positions pads the
short rows at the end (causal attention keeps the padding out of the real positions) and commits each row's own.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from specbuild.medusa.tree import MedusaTree
from specbuild.medusa.tree import accept_greedy as accept_tree
from specbuild.runtime.acceptance import accept_greedy, accept_rejection_sampling
from specbuild.runtime.eagle3 import Eagle3Draft
from specbuild.runtime.model import CausalLM
from specbuild.runtime.sampling import SamplingParams, draw, probabilities
from specbuild.runtime.sequence import (
    GenerationResult,
    GenerationStats,
    RoundLoop,
    SequenceState,
    StopCriteria,
    check_prompts,
)


@dataclass(frozen=True)
class Eagle3Config:
    """What the draft proposes per round: a chain of `num_draft_tokens` tokens (`choices` None), or the static
    tree `choices` (paths of top-k ranks) at most `num_draft_tokens` deep."""

    num_draft_tokens: int = 4
    choices: tuple[tuple[int, ...], ...] | None = None

    def __post_init__(self) -> None:
        if self.num_draft_tokens < 1:
            raise ValueError(f"num_draft_tokens must be >= 1 (got {self.num_draft_tokens})")
        if self.choices is not None:
            object.__setattr__(self, "choices", tuple(tuple(int(r) for r in c) for c in self.choices))
            depth = self.tree.max_depth  # validates the paths (ValueError names a bad one)
            if depth > self.num_draft_tokens:
                raise ValueError(f"the EAGLE-3 tree is {depth} deep but num_draft_tokens allows "
                                 f"{self.num_draft_tokens} draft steps per round; raise num_draft_tokens to {depth} "
                                 "or use a shallower tree")

    @property
    def tree(self) -> MedusaTree:
        """The validated tree (ValueError without `choices`)."""
        if self.choices is None:
            raise ValueError("a chain Eagle3Config has no tree")
        return _tree(self.choices)


@functools.lru_cache(maxsize=16)
def _tree(choices: tuple[tuple[int, ...], ...]) -> MedusaTree:
    return MedusaTree.from_choices(choices)


def _pad(rows: Sequence[torch.Tensor], fill: float | int = 0) -> torch.Tensor:
    """[n_b, ...] per row -> [B, max n_b, ...], padded at the end."""
    width = max(r.shape[0] for r in rows)
    out = rows[0].new_full((len(rows), width, *rows[0].shape[1:]), fill)
    for b, r in enumerate(rows):
        out[b, : r.shape[0]] = r
    return out


class _Eagle3Run(RoundLoop):
    def __init__(self, target: CausalLM, draft: Eagle3Draft, prompts: Sequence[Sequence[int]], params: SamplingParams,
                 stop: StopCriteria, config: Eagle3Config,
                 on_tokens: Callable[[int, list[int]], None] | None) -> None:
        self.target, self.draft, self.params, self.stop, self.k = target, draft, params, stop, config.num_draft_tokens
        self.on_tokens = on_tokens
        self.seqs = [SequenceState(list(p)) for p in prompts]
        self.tree = config.tree if config.choices is not None else None
        if self.tree is not None and not params.greedy:
            raise ValueError("EAGLE-3 trees are verified greedily; sample with a chain (Eagle3Config(choices=None))")
        batch = len(prompts)
        # A tree's accepted path may run up to its depth past max_new_tokens (the surplus is not emitted) before its
        # N + 1 nodes are written; a chain's K + 1 block never overshoots.
        block = self.k if self.tree is None else self.tree.num_nodes + self.tree.max_depth
        capacity = max(len(p) for p in prompts) + stop.max_new_tokens + block + 2
        self.target_cache = target.new_cache(batch, capacity)
        self.draft_cache = draft.new_cache(batch, capacity)
        self.gens = [params.for_row(b).generator(target.device) for b in range(batch)]
        self.stats = GenerationStats()
        self.layers = tuple(draft.layer_ids)
        # Per row: the target features [n, F] and the tokens x[i+1] of the positions the draft has not seen yet.
        self.features: list[torch.Tensor] = []
        self.next_tokens: list[torch.Tensor] = []

    # -- tokens --------------------------------------------------------------------------------------------------
    def _choose(self, logits: torch.Tensor, row: int) -> int:
        if self.params.greedy:
            return int(logits.argmax())
        return int(draw(probabilities(logits, self.params), self.gens[row]))

    def _emit(self, row: int, tokens: list[int]) -> None:
        seq, sent = self.seqs[row], len(self.seqs[row].output)
        for token in tokens:
            if not seq.emit(token, self.stop):
                break
        if self.on_tokens is not None and len(seq.output) > sent:
            self.on_tokens(row, seq.output[sent:])

    def _features(self, out_captured: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return torch.cat(out_captured, dim=-1)  # [B, T, len(layers) * H], TensorRT-LLM's layout

    # -- the steps -----------------------------------------------------------------------------------------------
    def prefill(self) -> None:
        """The target over every prompt (padded), its first token per row; the draft learns the prompt's pairs."""
        lengths = [len(s.prompt) for s in self.seqs]
        ids = _pad([torch.tensor(s.prompt) for s in self.seqs])
        out = self.target(ids, self.target_cache, capture_layers=self.layers)
        self.stats.target_forwards += 1
        self.target_cache.advance(torch.tensor(lengths))
        features = self._features(out.captured)
        for b, n in enumerate(lengths):
            first = self._choose(out.logits[b, n - 1], b)
            self.features.append(features[b, :n])
            self.next_tokens.append(torch.tensor([*self.seqs[b].prompt[1:], first]))
            self._emit(b, [first])

    def round(self) -> None:
        if self.tree is not None:
            self._tree_round(self.tree)
            return
        rows = [b for b, s in enumerate(self.seqs) if not s.done]
        k_row = {b: max(0, min(self.k, self.stop.max_new_tokens - len(self.seqs[b].output) - 1)) for b in rows}
        sampling = not self.params.greedy
        drafts, q = self._draft(rows, k_row, sampling)
        # The target verifies [pending, d_1..d_K] in one forward (rows padded to K + 1), capturing features.
        width = 1 + max(k_row.values())
        verify = torch.zeros(len(self.seqs), width, dtype=torch.long)
        for b in rows:
            verify[b, 0] = self.seqs[b].tokens[-1]
            verify[b, 1: 1 + k_row[b]] = torch.tensor(drafts[b][: k_row[b]], dtype=torch.long)
        out = self.target(verify, self.target_cache, capture_layers=self.layers)
        self.stats.target_forwards += 1
        features = self._features(out.captured)
        commit = torch.zeros(len(self.seqs), dtype=torch.long)
        for b in rows:
            k = k_row[b]
            proposed = torch.tensor(drafts[b][:k], dtype=torch.long)
            logits = out.logits[b, : k + 1]
            if sampling:
                p = probabilities(logits, self.params)
                accepted, token = accept_rejection_sampling(p, q[b][:k], proposed, self.gens[b])
            else:
                accepted, token = accept_greedy(logits, logits, proposed, self.gens[b])
            if k:
                self.stats.record_acceptance(k, accepted)
            commit[b] = accepted + 1  # the pending token and the accepted drafts
            self.features[b] = features[b, : accepted + 1]
            emitted = [*proposed[:accepted].tolist(), token]
            self.next_tokens[b] = torch.tensor(emitted)
            self._emit(b, emitted)
        self.target_cache.advance(commit)

    def _draft(self, rows: list[int], k_row: dict[int, int], sampling: bool
               ) -> tuple[dict[int, list[int]], dict[int, torch.Tensor]]:
        """K chain tokens per row (and, sampling, the distributions q they were drawn from [K, V])."""
        drafts: dict[int, list[int]] = {b: [] for b in rows}
        q: dict[int, list[torch.Tensor]] = {b: [] for b in rows}
        k_max = max(k_row.values())
        if k_max == 0:
            return drafts, {b: torch.empty(0) for b in rows}
        draft, cache = self.draft, self.draft_cache
        step_logits, hidden = self._catch_up(k_row)
        committed = cache.lengths.clone()  # what the chain steps below must roll back to
        for step in range(k_max):
            chosen = torch.zeros(len(self.seqs), dtype=torch.long)
            for b in rows:
                if step < k_row[b]:
                    if sampling:
                        dist = probabilities(step_logits[b], self.params)
                        q[b].append(dist)
                        token = int(draw(dist, self.gens[b]))
                    else:
                        token = int(step_logits[b].argmax())
                    drafts[b].append(token)
                    chosen[b] = token
            if step == k_max - 1:
                break
            logits, out = draft(chosen[:, None], hidden[:, None], cache)
            self.stats.draft_forwards += 1
            cache.advance(1)
            step_logits, hidden = logits[:, 0], out[:, 0]
        cache.truncate(committed)
        return drafts, {b: torch.stack(q[b]) if q[b] else torch.empty(0) for b in rows}

    def _catch_up(self, active: dict[int, int] | list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """One draft position per target-verified position of the `active` rows, fed with the target's features
        there, committed; returns the logits [B, V] and output [B, H] at each row's last one (the root's)."""
        counts = [self.features[b].shape[0] if b in active else 0 for b in range(len(self.seqs))]
        feats = _pad([self.features[b] if counts[b] else self.features[b][:1] for b in range(len(self.seqs))])
        tokens = _pad([self.next_tokens[b] if counts[b] else self.next_tokens[b][:1] for b in range(len(self.seqs))])
        logits, out = self.draft(tokens, self.draft.fuse(feats), self.draft_cache)
        self.stats.draft_forwards += 1
        self.draft_cache.advance(torch.tensor(counts))
        last = torch.tensor([max(c - 1, 0) for c in counts])
        rows_index = torch.arange(len(self.seqs))
        return logits[rows_index, last], out[rows_index, last]

    def _draft_tree(self, tree: MedusaTree, rows: list[int]) -> torch.Tensor:
        """The tree's tokens [B, N + 1] (node 0: each row's pending token): the catch-up, then one draft forward
        per depth over that depth's nodes that have children; the draft cache is rolled back afterwards."""
        batch, size = len(self.seqs), tree.num_nodes + 1
        root_logits, root_out = self._catch_up(rows)
        cache = self.draft_cache
        committed = cache.lengths.clone()
        tokens = torch.zeros(batch, size, dtype=torch.long)
        tokens[:, 0] = torch.tensor([s.tokens[-1] for s in self.seqs])
        logits = {0: root_logits}  # node -> the draft's logits there [B, V], for nodes with children
        outs = {0: root_out}
        expanded: list[int] = []  # nodes whose K/V are committed in the draft cache (this round), in order
        ranks = int(tree.rank.max()) + 1
        for depth in range(1, tree.max_depth + 1):
            nodes = (tree.depth == depth).nonzero().flatten().tolist()
            for node in nodes:
                top = logits[int(tree.parent[node])].topk(ranks, dim=-1).indices  # [B, ranks]
                tokens[:, node] = top[:, int(tree.rank[node])]
            parents = [n for n in nodes if bool((tree.parent == n).any())]
            if not parents:
                break
            # Each expanded node sees the verified context, its ancestors among the earlier depths, and itself.
            index = torch.tensor(parents)
            mask = torch.cat([tree.attention_mask[index][:, expanded], torch.eye(len(parents), dtype=torch.bool)],
                             dim=1)
            hidden = torch.stack([outs[int(tree.parent[n])] for n in parents], dim=1)  # [B, T, H]
            positions = (committed + depth - 1)[:, None].expand(batch, len(parents))
            step_logits, step_out = self.draft(tokens[:, index], hidden, cache, position_ids=positions,
                                               tree_mask=mask)
            self.stats.draft_forwards += 1
            cache.advance(len(parents))
            expanded += parents
            for i, n in enumerate(parents):
                logits[n], outs[n] = step_logits[:, i], step_out[:, i]
        cache.truncate(committed)
        return tokens

    def _tree_round(self, tree: MedusaTree) -> None:
        """Draft the tree, verify it in one target forward, keep the longest greedy-accepted path (greedy)."""
        rows = [b for b, s in enumerate(self.seqs) if not s.done]
        tokens = self._draft_tree(tree, rows)
        positions = self.target_cache.lengths[:, None] + tree.depth[None, :]
        out = self.target(tokens, self.target_cache, position_ids=positions, tree_mask=tree.attention_mask,
                          capture_layers=self.layers)
        self.stats.target_forwards += 1
        features = self._features(out.captured)
        choice = out.logits.argmax(-1)  # [B, N + 1]
        for b in rows:
            path, accepted = accept_tree(tree, tokens[b], choice[b])
            self.stats.record_acceptance(tree.max_depth, accepted)
            self.target_cache.compact(b, path)
            self.features[b] = features[b, path]
            emitted = [*tokens[b, path[1:]].tolist(), int(choice[b, path[-1]])]
            self.next_tokens[b] = torch.tensor(emitted)
            self._emit(b, emitted)


def generate_eagle3(
    target: CausalLM,
    draft: Eagle3Draft,
    prompts: Sequence[Sequence[int]],
    config: Eagle3Config = Eagle3Config(),
    params: SamplingParams = SamplingParams(),
    stop: StopCriteria = StopCriteria(),
    on_tokens: Callable[[int, list[int]], None] | None = None,
) -> GenerationResult:
    """Generate a batch with the EAGLE-3 draft proposing K-token chains (or, greedy, the tree `config.choices`)
    and the target verifying them; greedy output equals plain greedy decoding, sampled output follows the target's
    distribution. `on_tokens(row,
    tokens)` is called with each row's newly emitted tokens after every round (a server streams them)."""
    check_prompts(prompts, target.config.vocab_size)
    return _Eagle3Run(target, draft, prompts, params, stop, config, on_tokens).run()
