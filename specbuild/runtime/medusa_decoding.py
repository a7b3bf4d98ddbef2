"""Medusa speculative decoding (Cai et al. 2024, arXiv 2401.10774): one model, extra heads, a candidate tree.

Each round the heads' top-k tokens at the last accepted position fill the nodes of the tree given by
`medusa_choices`; the target runs once over the whole tree (tree attention mask: a node sees its ancestors;
positions: the node's depth), and verification keeps the longest root-to-node path whose tokens equal the
target's argmax at their parents (TensorRT-LLM's Medusa is greedy-only), or, as an option, the paper's typical
acceptance. The accepted nodes' KV entries are compacted into the cache and the target's prediction after the
last accepted node becomes the next pending token.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specbuild.medusa.tree import MedusaTree, accept_greedy, accept_typical
from specbuild.runtime.generation import (
    GenerationResult,
    GenerationStats,
    SequenceState,
    StopCriteria,
    check_prompts,
    last_logits,
    padded,
)
from specbuild.runtime.model import CausalLM
from specbuild.runtime.sampling import SamplingParams, next_tokens


@dataclass(frozen=True)
class MedusaConfig:
    choices: tuple[tuple[int, ...], ...]
    typical: bool = False  # typical acceptance instead of greedy verification (needs temperature > 0)
    posterior_threshold: float = 0.09
    posterior_alpha: float = 0.3


def check_medusa_model(model: CausalLM, tree: MedusaTree) -> None:
    heads = model.config.num_medusa_heads
    if heads == 0:
        raise ValueError("this checkpoint has no Medusa heads (architecture MedusaForCausalLM is needed)")
    if tree.max_depth > heads:
        raise ValueError(f"the Medusa tree is {tree.max_depth} deep but the checkpoint has only {heads} heads")


def _on_device(tree: MedusaTree, device: torch.device) -> MedusaTree:
    """The tree's index tensors on the model's device, so a CUDA round never mixes devices."""
    return dataclasses.replace(
        tree, depth=tree.depth.to(device), parent=tree.parent.to(device), rank=tree.rank.to(device),
        attention_mask=tree.attention_mask.to(device), retrieve_indices=tree.retrieve_indices.to(device),
    )


def _head_topk(medusa_logits: torch.Tensor, k: int) -> torch.Tensor:
    """[heads, B, V] -> [heads, B, k] token ids, best first."""
    return torch.topk(medusa_logits, k, dim=-1).indices


def generate_medusa(
    model: CausalLM,
    prompts: Sequence[Sequence[int]],
    config: MedusaConfig,
    params: SamplingParams = SamplingParams(),
    stop: StopCriteria = StopCriteria(),
) -> GenerationResult:
    """Generate a batch with Medusa heads; greedy output equals plain greedy decoding of the base model."""
    check_prompts(prompts, model.config.vocab_size)
    tree = MedusaTree.from_choices(config.choices)
    check_medusa_model(model, tree)
    tree = _on_device(tree, model.device)
    if config.typical and params.greedy:
        raise ValueError("typical acceptance samples: give a temperature > 0 (greedy uses exact verification)")
    start = time.perf_counter()
    seqs = [SequenceState(list(p)) for p in prompts]
    gen = params.generator(model.device)
    nodes = tree.num_nodes + 1
    cache = model.new_cache(len(seqs), max(len(p) for p in prompts) + stop.max_new_tokens + nodes + 1)
    stats = GenerationStats()
    k = int(tree.rank.max()) + 1

    ids, lengths = padded([s.prompt for s in seqs])
    out = model(ids, cache, medusa=True)
    stats.target_forwards += 1
    cache.advance(lengths)
    rows = torch.arange(len(seqs))
    pending = next_tokens(last_logits(out.logits, lengths), params, gen)
    topk = _head_topk(out.medusa_logits[:, rows, lengths - 1], k)
    for seq, token in zip(seqs, pending.tolist(), strict=True):
        seq.emit(token, stop)

    depth = tree.depth[None, :]
    while not all(s.done for s in seqs):
        tokens = tree.candidate_tokens(pending, topk)  # [B, nodes]
        out = model(tokens, cache, position_ids=cache.lengths[:, None] + depth, tree_mask=tree.attention_mask)
        stats.target_forwards += 1
        best = out.logits.argmax(-1)
        for b, seq in enumerate(seqs):
            if seq.done:
                continue
            if config.typical:
                path, accepted = accept_typical(tree, tokens[b], out.logits[b], params.temperature,
                                                config.posterior_threshold, config.posterior_alpha)
            else:
                path, accepted = accept_greedy(tree, tokens[b], best[b])
            stats.record_acceptance(tree.max_depth, accepted)
            last = int(path[-1])
            nxt = int(best[b, last]) if params.greedy else int(next_tokens(out.logits[b, last], params, gen))
            for token in [*tokens[b, path[1:]].tolist(), nxt]:
                if not seq.emit(token, stop):
                    break
            if not seq.done:  # a finished sequence's cache is never read again: commit nothing more
                cache.compact(b, path)
            pending[b] = nxt
            topk[:, b] = _head_topk(model.medusa_logits(out.hidden[b : b + 1, last : last + 1])[:, 0, 0], k)
    stats.generated_tokens = sum(len(s.output) for s in seqs)
    stats.seconds = time.perf_counter() - start
    return GenerationResult([s.output for s in seqs], stats)
