"""Medusa sparse-tree construction (Cai et al. 2024, arXiv 2401.10774, "Optimized tree construction").

Torch-free: input is each head's measured top-k accuracy, output is a `medusa_choices` list.

Why greedy is enough: a node's expected acceptance is the product of its path's accuracies, so it is never
larger than its parent's. Adding, one at a time, the candidate with the highest expected acceptance whose parent
is already in the tree therefore yields, for every node budget, the tree that maximises the expected accepted
length (the sum of the nodes' expected acceptances) under the paper's independence assumption.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

from specbuild.medusa.choices import MAX_MEDUSA_DEPTH

MAX_TOP_K = 16
"""TensorRT-LLM packs each level's top-k index into 4 bits (NVIDIA/TensorRT-LLM
`cpp/tensorrt_llm/runtime/utils/speculativeChoicesUtils.cpp` @b4f2086d): ranks 0..15."""

Path = tuple[int, ...]


@dataclass(frozen=True)
class GrownTree:
    """A greedily grown tree: paths in the order they were added (each after its parent, so every leading
    slice is itself the best tree of that size), with each node's expected acceptance."""

    paths: tuple[Path, ...]
    expected: tuple[float, ...]

    @property
    def choices(self) -> list[list[int]]:
        return [list(path) for path in self.paths]

    @property
    def expected_accepted_length(self) -> float:
        """Expected accepted tree tokens per step; one more token (the target's own) comes with every step."""
        return math.fsum(self.expected)

    @property
    def depth(self) -> int:
        return max((len(p) for p in self.paths), default=0)

    def nodes_per_depth(self) -> list[int]:
        return nodes_per_depth(self.paths)


def nodes_per_depth(paths: Sequence[Sequence[int]]) -> list[int]:
    """How many nodes each level 1, 2, ... of a tree holds."""
    depth = max((len(p) for p in paths), default=0)
    return [sum(1 for p in paths if len(p) == d) for d in range(1, depth + 1)]


def check_accuracies(accuracies: Sequence[Sequence[float]]) -> None:
    """accuracies[h][i]: probability that head h's rank-i guess is right (ranks are exclusive, so a row sums to
    at most 1)."""
    if not accuracies or not all(accuracies):
        raise ValueError("need at least one head with at least one measured rank")
    if len(accuracies) > MAX_MEDUSA_DEPTH:
        raise ValueError(f"{len(accuracies)} heads: a tree is at most {MAX_MEDUSA_DEPTH} deep")
    for h, row in enumerate(accuracies):
        if len(row) > MAX_TOP_K:
            raise ValueError(f"head {h}: {len(row)} ranks; a tree index is at most {MAX_TOP_K - 1}")
        if any(not 0.0 <= a <= 1.0 for a in row) or math.fsum(row) > 1.0 + 1e-9:
            raise ValueError(f"head {h}: accuracies must be in [0, 1] and sum to at most 1, got {list(row)}")


def path_expectation(path: Sequence[int], accuracies: Sequence[Sequence[float]]) -> float:
    """The paper's estimate of P(node accepted): the product of its path's per-head accuracies (0 where the
    path reads a head or rank that was not measured)."""
    value = 1.0
    for depth, rank in enumerate(path):
        if depth >= len(accuracies) or rank >= len(accuracies[depth]):
            return 0.0
        value *= accuracies[depth][rank]
    return value


def expected_accepted_length(choices: Sequence[Sequence[int]], accuracies: Sequence[Sequence[float]]) -> float:
    """Predicted accepted tree tokens per step of any tree, e.g. a preset, under the same model."""
    return math.fsum(path_expectation(path, accuracies) for path in choices)


def grow_tree(accuracies: Sequence[Sequence[float]], budget: int, max_depth: int | None = None) -> GrownTree:
    """The greedy tree of `budget` nodes, depth <= max_depth (default: the number of heads).

    Ties go to the shallower node, then the lexicographically smaller path, so the result is deterministic. A
    budget larger than the number of reachable nodes is an error rather than a silently smaller tree.
    """
    check_accuracies(accuracies)
    if budget < 1:
        raise ValueError(f"the node budget must be >= 1 (got {budget})")
    depth_limit = len(accuracies) if max_depth is None else min(max_depth, len(accuracies))
    if depth_limit < 1:
        raise ValueError(f"max_depth must be >= 1 (got {max_depth})")
    reachable = sum(math.prod(len(accuracies[d]) for d in range(n)) for n in range(1, depth_limit + 1))
    if budget > reachable:
        raise ValueError(f"a node budget of {budget} is more than the {reachable} nodes that {depth_limit} heads with "
                         "the measured top-k can form; measure more ranks or lower the budget")
    # heap entries: (-expected, depth, path); the root's children first
    frontier: list[tuple[float, int, Path]] = []
    for rank, accuracy in enumerate(accuracies[0]):
        heapq.heappush(frontier, (-accuracy, 1, (rank,)))
    paths: list[Path] = []
    expected: list[float] = []
    while len(paths) < budget:
        negative, depth, path = heapq.heappop(frontier)
        paths.append(path)
        expected.append(-negative)
        if depth < depth_limit:
            for rank, accuracy in enumerate(accuracies[depth]):
                heapq.heappush(frontier, (negative * accuracy, depth + 1, (*path, rank)))
    return GrownTree(tuple(paths), tuple(expected))
