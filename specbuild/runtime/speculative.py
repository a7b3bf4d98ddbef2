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

from collections.abc import Sequence
from dataclasses import dataclass

from specbuild.runtime.acceptance import AcceptRule, accept_greedy, accept_rejection_sampling
from specbuild.runtime.model import CausalLM
from specbuild.runtime.sampling import SamplingParams
from specbuild.runtime.sequence import (
    GenerationResult,
    GenerationStats,
    RoundLoop,
    SequenceState,
    StopCriteria,
    check_prompts,
)
from specbuild.runtime.serving import EngineRequest, ServingEngine


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


class _DraftTargetRun(RoundLoop):
    """One batched draft-target generation over two serving engines: each round every unfinished sequence asks
    the draft engine for its K tokens and the target engine to verify them (one batched forward per engine
    step), then applies the stop rules to what the target returned."""

    def __init__(
        self, target: CausalLM, draft: CausalLM, prompts: Sequence[Sequence[int]], params: SamplingParams,
        stop: StopCriteria, config: DraftTargetConfig, accept: AcceptRule,
    ) -> None:
        self.params, self.stop, self.config = params, stop, config
        self.seqs = [SequenceState(list(p)) for p in prompts]
        # A round verifies the whole sequence so far plus at most K drafts.
        capacity = max(len(p) for p in prompts) + stop.max_new_tokens + config.num_draft_tokens + 2
        k = config.num_draft_tokens
        self.target = ServingEngine(target, max_batch=len(prompts), max_seq_len=capacity, max_draft_len=k,
                                    accept=accept)
        self.draft = ServingEngine(draft, max_batch=len(prompts), max_seq_len=capacity)
        self.stats = GenerationStats()
        self.alpha = [config.prior_acceptance] * len(prompts)
        self.cost_ratio = config.cost_ratio if config.cost_ratio is not None else parameter_ratio(draft, target)

    def round_k(self, seq: SequenceState, index: int) -> int:
        """This round's K: the configured (or adaptive) one, never past the budget (the target's own token makes
        the last one, as TensorRT-LLM's BLS counts)."""
        k = self.config.num_draft_tokens
        if self.config.adaptive:
            k = best_k(self.alpha[index], self.cost_ratio, k)
        return max(0, min(k, self.stop.max_new_tokens - len(seq.output) - 1))

    def round(self) -> None:
        rows = [(i, seq, self.round_k(seq, i)) for i, seq in enumerate(self.seqs) if not seq.done]
        sampling = not self.params.greedy
        proposals = {i: self.draft.submit(EngineRequest(seq.tokens, k, self.params.for_row(i),
                                                        return_logits=sampling)) for i, seq, k in rows if k}
        self.draft.run_until_idle()
        verdicts = {}
        for i, seq, k in rows:
            drafts = proposals[i].wait(0) if k else None
            verdicts[i] = self.target.submit(EngineRequest(
                seq.tokens, k + 1, self.params.for_row(i), end_id=self.stop.end_id,
                draft_tokens=drafts.tokens if drafts else [], one_round=True,
                draft_logits=drafts.logits if drafts and sampling else None))
        self.target.run_until_idle()
        for i, seq, _ in rows:
            result = verdicts[i].wait(0)
            proposed = result.draft_tokens
            if proposed:
                self.stats.record_acceptance(proposed, result.accepted_draft_tokens)
                self.alpha[i] += self.config.smoothing * (result.accepted_draft_tokens / proposed - self.alpha[i])
            for token in result.tokens:
                if not seq.emit(token, self.stop):
                    break
            if result.reason == "end_id" and not seq.done:
                seq.emit(self.stop.end_id, self.stop)  # type: ignore[arg-type]

    def finish(self) -> None:
        self.stats.target_forwards = self.target.stats.forwards
        self.stats.draft_forwards = self.draft.stats.forwards


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
