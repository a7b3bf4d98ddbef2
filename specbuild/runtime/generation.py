"""Plain (non-speculative) decoding of a batch of prompts: the serving engine run to completion."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from specbuild.runtime.sampling import SamplingParams
from specbuild.runtime.sequence import (
    GenerationResult,
    StopCriteria,
    check_prompts,
)

if TYPE_CHECKING:
    from specbuild.runtime.lookahead import LookaheadConfig
    from specbuild.runtime.model import CausalLM
    from specbuild.runtime.proposers import Proposer
    from specbuild.runtime.serving import Typical


def generate(
    model: CausalLM,
    prompts: Sequence[Sequence[int]],
    params: SamplingParams = SamplingParams(),
    stop: StopCriteria = StopCriteria(),
) -> GenerationResult:
    """Plain autoregressive decoding of a batch of prompts: one target forward per generated token."""
    return run_to_completion(model, prompts, params, stop)


def generate_proposed(
    model: CausalLM,
    prompts: Sequence[Sequence[int]],
    proposer: Proposer,
    params: SamplingParams = SamplingParams(),
    stop: StopCriteria = StopCriteria(),
) -> GenerationResult:
    """Speculative decoding as the server's one engine runs it: `proposer` (a draft model, a self-draft sharing
    the target's cache, EAGLE-3, n-grams) drafts its max_draft_len tokens for every sequence each step."""
    return run_to_completion(model, prompts, params, stop, proposer=proposer)


def run_to_completion(
    model: CausalLM,
    prompts: Sequence[Sequence[int]],
    params: SamplingParams,
    stop: StopCriteria,
    *,
    medusa_choices: Sequence[Sequence[int]] | None = None,
    typical: Typical | None = None,
    lookahead: LookaheadConfig | None = None,
    proposer: Proposer | None = None,
) -> GenerationResult:
    """Every prompt as one request of a serving engine sized for the whole batch, stepped until all finish:
    the batch methods and the server run the same steps and the same stop rules. A sequence the engine failed
    (e.g. past a model's learned positions) raises ValueError, never a silently short output."""
    from specbuild.runtime.serving import EngineRequest, ServingEngine

    check_prompts(prompts, model.config.vocab_size)
    start = time.perf_counter()
    extra = len(medusa_choices) + 1 if medusa_choices else 0
    if lookahead is not None:
        from specbuild.runtime.lookahead import max_block_tokens

        extra = max_block_tokens(lookahead)
    if proposer is not None:
        extra = proposer.block_tokens
    engine = ServingEngine(model, max_batch=len(prompts), medusa_choices=medusa_choices, lookahead=lookahead,
                           proposer=proposer,
                           max_seq_len=max(len(p) for p in prompts) + stop.max_new_tokens + extra + 1)
    handles = [engine.submit(EngineRequest(list(p), stop.max_new_tokens, params.for_row(row), stop.end_id,
                                           stop.stop_words, stop.include_stop_words, typical=typical))
               for row, p in enumerate(prompts)]
    engine.run_until_idle()
    results = [handle.wait(0) for handle in handles]
    failed = next(((row, r.error) for row, r in enumerate(results) if r.reason == "error"), None)
    if failed is not None:  # the engine ends a failed sequence early: its tokens so far are not the answer
        raise ValueError(f"prompt {failed[0] + 1} failed after {len(results[failed[0]].tokens)} tokens: {failed[1]}")
    outputs = [result.tokens for result in results]
    stats = engine.stats.acceptance
    stats.target_forwards = engine.stats.forwards
    stats.generated_tokens = sum(len(o) for o in outputs)
    stats.seconds = time.perf_counter() - start
    return GenerationResult(outputs, stats)
