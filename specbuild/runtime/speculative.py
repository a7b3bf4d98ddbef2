"""Draft-target speculative decoding (Leviathan, Kalman & Matias, ICML 2023, arXiv 2211.17192).

Each round the draft proposes K tokens one at a time and the target scores all K+1 positions in one forward.
Greedy mode accepts the longest prefix that matches the target's argmax, then adds the target's own next
token, so its output equals plain greedy decoding token for token. Sampling mode accepts draft token x at
position i with probability min(1, p(x)/q(x)), on rejection draws from normalize(max(0, p - q)), and draws a
bonus token from the target when all K are accepted: the output distribution is exactly the target's.

Optionally each sequence picks its own K every round from its running acceptance rate alpha and the
draft/target cost ratio c, maximising the paper's expected speedup (1 - alpha^(K+1)) / ((1 - alpha)(cK + 1)).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specbuild.runtime.acceptance import AcceptRule, accept_greedy, accept_rejection_sampling
from specbuild.runtime.generation import padded, prefill
from specbuild.runtime.model import CausalLM
from specbuild.runtime.sampling import SamplingParams, draw, probabilities
from specbuild.runtime.sequence import GenerationResult, GenerationStats, SequenceState, StopCriteria, check_prompts


def expected_tokens_per_step(alpha: float, k: int) -> float:
    """Leviathan et al.'s expected tokens per verification step, (1 - alpha^(K+1)) / (1 - alpha)."""
    alpha = min(max(alpha, 0.0), 0.999)
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def expected_speedup(alpha: float, k: int, cost_ratio: float, verify_cost: float = 1.0) -> float:
    """Leviathan et al.'s expected improvement factor for acceptance rate alpha, K drafts, cost ratio c.

    `verify_cost` is the target's forward over K + 1 tokens relative to one over a single token: the paper
    takes it as 1 (true on a GPU with spare compute); on a CPU it grows with K, and `specbuild tune` measures it.
    """
    return expected_tokens_per_step(alpha, k) / (cost_ratio * k + verify_cost)


def best_k(alpha: float, cost_ratio: float, k_max: int) -> int:
    return max(range(1, k_max + 1), key=lambda k: expected_speedup(alpha, k, cost_ratio))


@dataclass(frozen=True)
class DraftTargetConfig:
    """How many tokens the draft proposes, and whether K adapts per sequence to its acceptance rate."""

    num_draft_tokens: int = 4
    adaptive: bool = False
    cost_ratio: float | None = None  # draft/target cost per forward; None: the parameter-count ratio
    prior_acceptance: float = 0.6  # alpha before any round is seen, for adaptive K
    smoothing: float = 0.3  # weight of the newest round in the running alpha

    def __post_init__(self) -> None:
        if self.num_draft_tokens < 1:
            raise ValueError(f"num_draft_tokens must be >= 1 (got {self.num_draft_tokens})")


def parameter_ratio(draft: CausalLM, target: CausalLM) -> float:
    return sum(p.numel() for p in draft.parameters()) / max(1, sum(p.numel() for p in target.parameters()))


def check_pair(draft: CausalLM, target: CausalLM) -> None:
    if draft.config.vocab_size != target.config.vocab_size:
        raise ValueError(
            f"draft vocabulary ({draft.config.vocab_size}) differs from the target's ({target.config.vocab_size}); "
            "draft and target must share a tokenizer"
        )


class _DraftTargetRun:
    """State of one batched draft-target generation."""

    def __init__(
        self, target: CausalLM, draft: CausalLM, prompts: Sequence[Sequence[int]], params: SamplingParams,
        stop: StopCriteria, config: DraftTargetConfig, accept: AcceptRule,
    ) -> None:
        self.target, self.draft, self.params, self.stop, self.config = target, draft, params, stop, config
        self.accept = accept
        self.seqs = [SequenceState(list(p)) for p in prompts]
        self.gen = params.generator(target.device)
        # Committed tokens stay below prompt + max_new_tokens; a round writes at most K + 1 more past them.
        capacity = max(len(p) for p in prompts) + stop.max_new_tokens + config.num_draft_tokens + 2
        self.tcache = target.new_cache(len(prompts), capacity)
        self.dcache = draft.new_cache(len(prompts), capacity)
        self.stats = GenerationStats()
        self.alpha = [config.prior_acceptance] * len(prompts)
        self.cost_ratio = config.cost_ratio if config.cost_ratio is not None else parameter_ratio(draft, target)

    def round_k(self) -> list[int]:
        k_max = self.config.num_draft_tokens
        if not self.config.adaptive:
            return [k_max] * len(self.seqs)
        return [best_k(a, self.cost_ratio, k_max) for a in self.alpha]

    def propose(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The draft's k tokens per sequence ([B, k]) and the distributions they were drawn from ([B, k, V])."""
        backlog = [s.tokens[int(n):] for s, n in zip(self.seqs, self.dcache.lengths.tolist(), strict=True)]
        ids, lengths = padded(backlog)
        out = self.draft(ids, self.dcache)
        self.dcache.advance(lengths)
        logits = out.logits[torch.arange(len(backlog)), lengths - 1]
        tokens, dists = [], []
        for step in range(k):
            if self.params.greedy:  # greedy verification never reads q: skip building it
                token, q = logits.argmax(-1), logits
            else:
                q = probabilities(logits, self.params)
                token = draw(q, self.gen)
            tokens.append(token)
            dists.append(q)
            if step + 1 < k:
                logits = self.draft(token[:, None], self.dcache).logits[:, -1]
                self.dcache.advance(1)
        self.stats.draft_forwards += k
        return torch.stack(tokens, 1), torch.stack(dists, 1)

    def verify(self, pending: torch.Tensor, drafts: torch.Tensor, q: torch.Tensor, ks: list[int]) -> torch.Tensor:
        """Score pending + drafts with the target, accept per sequence, commit, emit; returns the new pending."""
        out = self.target(torch.cat([pending[:, None], drafts], 1), self.tcache)
        self.stats.target_forwards += 1
        p = out.logits if self.params.greedy else probabilities(out.logits, self.params)
        new_pending = pending.clone()
        commit = torch.zeros(len(self.seqs), dtype=torch.long)
        # The draft cache may hold rejected drafts: it keeps at most what each sequence has committed.
        draft_keep = torch.tensor([len(s.tokens) for s in self.seqs])
        for b, seq in enumerate(self.seqs):
            if seq.done:
                continue
            k = ks[b]
            accepted, nxt = self.accept(p[b, : k + 1], q[b, :k], drafts[b, :k], self.gen)
            self.stats.record_acceptance(k, accepted)
            self.alpha[b] += self.config.smoothing * (accepted / k - self.alpha[b])
            before = len(seq.tokens)
            for token in [*drafts[b, :accepted].tolist(), nxt]:
                if not seq.emit(token, self.stop):
                    break
            new_pending[b] = nxt
            if not seq.done:  # a finished sequence's caches are never read again: commit nothing more
                commit[b] = 1 + accepted
                draft_keep[b] = before + accepted
        self.tcache.advance(commit)
        self.dcache.truncate(torch.minimum(self.dcache.lengths, draft_keep.to(self.dcache.lengths.device)))
        return new_pending

    def run(self) -> GenerationResult:
        start = time.perf_counter()
        pending = prefill(self.target, self.tcache, self.seqs, self.params, self.gen, self.stop)
        self.stats.target_forwards += 1
        while not all(s.done for s in self.seqs):
            ks = self.round_k()
            drafts, q = self.propose(max(k for k, s in zip(ks, self.seqs, strict=True) if not s.done))
            pending = self.verify(pending, drafts, q, ks)
        self.stats.generated_tokens = sum(len(s.output) for s in self.seqs)
        self.stats.seconds = time.perf_counter() - start
        return GenerationResult([s.output for s in self.seqs], self.stats)


def generate_draft_target(
    target: CausalLM,
    draft: CausalLM,
    prompts: Sequence[Sequence[int]],
    params: SamplingParams = SamplingParams(),
    stop: StopCriteria = StopCriteria(),
    config: DraftTargetConfig = DraftTargetConfig(),
    accept: AcceptRule | None = None,
) -> GenerationResult:
    """Generate with the draft proposing and the target verifying; `accept` overrides the acceptance rule
    (tests use it to show that a wrong rule changes the output distribution)."""
    check_prompts(prompts, target.config.vocab_size)
    check_pair(draft, target)
    rule = accept or (accept_greedy if params.greedy else accept_rejection_sampling)
    return _DraftTargetRun(target, draft, prompts, params, stop, config, rule).run()
