"""The acceptance rules of draft-target verification, on probabilities alone: no caches, no stop rules.

Greedy accepts the longest prefix of the drafts that matches the target's argmax, then adds the target's own
next token, so greedy speculative output equals plain greedy decoding. Modified rejection sampling (Leviathan,
Kalman & Matias, ICML 2023, arXiv 2211.17192) accepts draft token x at position i with probability
min(1, p(x)/q(x)), on rejection draws from normalize(max(0, p - q)), and draws a bonus token from the target
when all K are accepted: the emitted tokens are distributed exactly as the target's.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from specbuild.runtime.sampling import draw

# (target probs [k+1, V], draft probs [k, V], draft tokens [k], generator) -> (accepted count, next token)
AcceptRule = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Generator], tuple[int, int]]


def accept_greedy(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, gen: torch.Generator) -> tuple[int, int]:
    """Longest prefix of drafts equal to the target's argmax, then the target's argmax after it (`p` may be
    logits or probabilities: only its argmax is read)."""
    best = p.argmax(-1)
    matches = (drafts == best[: len(drafts)]).long()
    accepted = int(matches.cumprod(0).sum())
    return accepted, int(best[accepted])


def accept_rejection_sampling(
    p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, gen: torch.Generator
) -> tuple[int, int]:
    """Modified rejection sampling: the emitted tokens are distributed exactly as the target's p."""
    uniforms = torch.rand(len(drafts), generator=gen, device=gen.device).tolist()
    for i, token in enumerate(drafts.tolist()):
        p_x, q_x = float(p[i, token]), float(q[i, token])
        if uniforms[i] * q_x <= p_x:  # accept with probability min(1, p/q)
            continue
        residual = torch.clamp(p[i] - q[i], min=0.0)
        total = residual.sum()
        residual = residual / total if total > 0 else p[i]
        return i, int(draw(residual, gen))
    return len(drafts), int(draw(p[len(drafts)], gen))
