"""The Medusa token tree as the tensors a runtime needs, and the rules that accept a path of it.

A tree (`medusa_choices`) lists paths of top-k ranks: `[0, 1]` is head 0's best guess followed by head 1's second
best. Each step the runtime feeds the root (the last verified token) plus every tree node to the target in one
forward pass, with an attention mask that lets a node see only its ancestors, then keeps the longest path whose
tokens the target agrees with. Node order is FasterDecoding's and TensorRT-LLM's: sorted by (depth, path), root
first, so index tensors built here line up with theirs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import torch

from specbuild.medusa.choices import load_choices, preset_names, validated

__all__ = ["MedusaTree", "accept_greedy", "accept_typical", "load_choices", "preset_names"]


@dataclass(frozen=True, eq=False)
class MedusaTree:
    """A validated tree. Node 0 is the root; node i >= 1 is `choices[i - 1]`."""

    choices: tuple[tuple[int, ...], ...]
    depth: torch.Tensor
    parent: torch.Tensor
    rank: torch.Tensor
    attention_mask: torch.Tensor
    retrieve_indices: torch.Tensor

    @classmethod
    def from_choices(cls, choices: Sequence[Sequence[int]]) -> MedusaTree:
        """Validate `choices` (any order) and build the tree's index tensors; ValueError names bad paths."""
        paths = validated(choices)
        index = {path: node for node, path in enumerate(paths, start=1)}
        size = len(paths) + 1
        depth = torch.zeros(size, dtype=torch.long)
        parent = torch.full((size,), -1, dtype=torch.long)
        rank = torch.full((size,), -1, dtype=torch.long)
        mask = torch.eye(size, dtype=torch.bool)
        mask[:, 0] = True
        for node, path in enumerate(paths, start=1):
            depth[node] = len(path)
            rank[node] = path[-1]
            parent[node] = index.get(path[:-1], 0)
            for cut in range(1, len(path)):
                mask[node, index[path[:cut]]] = True
        # Leaves in lexicographic path order (FasterDecoding sorts its retrieve_indices the same way), so a tie
        # between equally long accepted paths goes to the one made of higher-ranked guesses.
        has_child = {path[:-1] for path in paths}
        leaves = sorted(path for path in paths if path not in has_child)
        max_depth = max(len(path) for path in paths)
        retrieve = torch.full((len(leaves), max_depth + 1), -1, dtype=torch.long)
        for row, leaf in enumerate(leaves):
            retrieve[row, 0] = 0
            for cut in range(1, len(leaf) + 1):
                retrieve[row, cut] = index[leaf[:cut]]
        return cls(paths, depth, parent, rank, mask, retrieve)

    @property
    def num_nodes(self) -> int:
        """Tree nodes excluding the root: the draft tokens verified per step (TensorRT-LLM's max_draft_len)."""
        return len(self.choices)

    @cached_property
    def max_depth(self) -> int:
        return int(self.depth.max())

    @cached_property
    def num_heads_needed(self) -> int:
        """Depth d uses head d - 1, so a checkpoint needs at least this many heads."""
        return self.max_depth

    @cached_property
    def topk_needed(self) -> tuple[int, ...]:
        """Per depth (1..max_depth), how many of that head's top tokens the tree reads."""
        return tuple(int(self.rank[self.depth == d].max()) + 1 for d in range(1, self.max_depth + 1))

    # The same structure as plain lists, for the per-row work of a decode step: on a few nodes, Python lists cost a
    # serving step microseconds where each small tensor operation costs several.
    @cached_property
    def parents(self) -> tuple[int, ...]:
        return tuple(self.parent.tolist())

    @cached_property
    def depths(self) -> tuple[int, ...]:
        return tuple(self.depth.tolist())

    @cached_property
    def ancestors(self) -> tuple[tuple[int, ...], ...]:
        """Per node, the non-root nodes from the root down to it, in order (what precedes its successor's
        prediction within the step); () for the root."""
        paths: list[tuple[int, ...]] = [()]
        for node in range(1, len(self.parents)):
            paths.append((*paths[self.parents[node]], node))
        return tuple(paths)

    @cached_property
    def guesses(self) -> tuple[tuple[int, int], ...]:
        """Per non-root node, (head, rank): the head guess it takes (`candidates`)."""
        return tuple(zip((self.depth[1:] - 1).tolist(), self.rank[1:].tolist(), strict=True))

    @cached_property
    def leaf_paths(self) -> tuple[tuple[int, ...], ...]:
        """`retrieve_indices` without its padding: each leaf's nodes from the root, in the same order."""
        return tuple(tuple(node for node in row if node >= 0) for row in self.retrieve_indices.tolist())

    def longest_matching(self, tokens: Sequence[int], choice: Sequence[int]) -> tuple[list[int], int]:
        """Greedy acceptance on plain lists (`accept_greedy`'s rule): the longest root path whose every token is
        `choice` at its parent, the first leaf's on a tie; (its nodes from the root, its non-root count)."""
        parents = self.parents
        best: tuple[int, ...] = (0,)
        for path in self.leaf_paths:
            length = 1
            while length < len(path) and tokens[path[length]] == choice[parents[path[length]]]:
                length += 1
            if length > len(best):
                best = path[:length]
        return list(best), len(best) - 1

    def candidates(self, root_token: int, head_topk: Sequence[Sequence[int]]) -> list[int]:
        """The tree's input tokens [N+1] for one sequence: the root token, then each node's head guess, from every
        head's top-k ids (head_topk[head][rank]).

        The node with path [r1..rd] takes head d-1's rank-rd token: every node at a depth shares its head's
        guesses, which is why one forward of the heads fills the whole tree.
        """
        if len(head_topk) < self.num_heads_needed:
            raise ValueError(f"the tree has depth {self.max_depth} and needs that many heads, got {len(head_topk)}")
        if min(len(guesses) for guesses in head_topk) < max(self.topk_needed):
            raise ValueError(f"the tree reads top-{max(self.topk_needed)} guesses, got fewer")
        return [root_token, *(head_topk[head][rank] for head, rank in self.guesses)]

    def within_depth(self, depth: int) -> MedusaTree:
        """This tree's nodes at most `depth` deep (itself when it is no deeper): still a tree, since a path's
        prefixes are shallower than it."""
        if self.max_depth <= depth:
            return self
        return MedusaTree.from_choices([path for path in self.choices if len(path) <= depth])


def accept_greedy(tree: MedusaTree, tokens: torch.Tensor, target_argmax: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Longest path whose every token is the target's greedy choice after its parent.

    tokens, target_argmax: [N+1] for one sequence. Returns (node indices root→deepest accepted, starting with 0;
    number of accepted non-root nodes). Equal lengths go to the first leaf in `retrieve_indices`.
    """
    _check_one_sequence(tree, tokens, target_argmax)
    path, accepted = tree.longest_matching(tokens.tolist(), target_argmax.tolist())
    return torch.tensor(path, dtype=torch.long), accepted


def accept_typical(
    tree: MedusaTree,
    tokens: torch.Tensor,
    target_logits: torch.Tensor,
    temperature: float,
    posterior_threshold: float = 0.09,
    posterior_alpha: float = 0.3,
) -> tuple[torch.Tensor, int]:
    """Medusa's typical acceptance: a node is accepted iff the target, at its parent, gives its token probability
    above min(threshold, alpha * exp(-entropy)); confident targets demand agreement, uncertain ones allow any
    plausible token. Among the longest accepted paths the most likely (sum of log p) wins.

    tokens [N+1], target_logits [N+1, V] (the target's logits at each tree node), temperature > 0. The defaults
    are the ones `medusa_generate` uses (FasterDecoding's helper functions have the two swapped).
    """
    if not temperature > 0:
        raise ValueError(f"typical acceptance needs temperature > 0 (got {temperature}); use accept_greedy")
    _check_one_sequence(tree, tokens, target_logits)
    log_probs = torch.log_softmax(target_logits.float() / temperature, dim=-1)
    entropy = -(log_probs.exp() * log_probs).nansum(dim=-1)  # nansum: 0 * log 0 where p underflows
    parent = tree.parent[1:]
    token_log_prob = log_probs[parent, tokens[1:]]
    limit = torch.minimum(
        torch.full_like(entropy[parent], posterior_threshold), posterior_alpha * torch.exp(-entropy[parent])
    )
    accepted = torch.ones_like(tokens, dtype=torch.bool)
    accepted[1:] = token_log_prob.exp() > limit
    score = torch.zeros(tokens.shape[0], dtype=log_probs.dtype)
    score[1:] = token_log_prob
    return _longest_accepted(tree, accepted, score=score)


def _check_one_sequence(tree: MedusaTree, tokens: torch.Tensor, target: torch.Tensor) -> None:
    size = tree.num_nodes + 1
    if tokens.shape != (size,) or target.shape[0] != size:
        raise ValueError(
            f"expected one sequence's {size} tree tokens and target outputs, got {tuple(tokens.shape)} and "
            f"{tuple(target.shape)}"
        )


def _longest_accepted(tree: MedusaTree, accepted: torch.Tensor, score: torch.Tensor | None) -> tuple[torch.Tensor, int]:
    """Per leaf path, the all-accepted prefix length; pick the longest (then best score, then first leaf)."""
    paths = tree.retrieve_indices
    valid = paths >= 0
    ok = accepted[paths.clamp(min=0)] & valid
    lengths = ok.long().cumprod(dim=1).sum(dim=1) - 1  # column 0 is the root, always accepted
    best_length = int(lengths.max())
    candidates = lengths == best_length
    if score is not None and best_length > 0:
        in_prefix = torch.arange(paths.shape[1]) <= best_length
        totals = (score[paths.clamp(min=0)] * (valid & in_prefix)).sum(dim=1)
        totals = totals.masked_fill(~candidates, float("-inf"))
        row = int(torch.argmax(totals))  # argmax returns the first maximum
    else:
        row = int(torch.argmax(candidates.long()))
    return paths[row, : best_length + 1].clone(), best_length
