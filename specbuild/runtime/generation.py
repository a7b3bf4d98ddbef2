"""Plain (non-speculative) decoding of a batch of prompts: the serving engine run to completion.

`prefill`, `padded` and `last_logits` are the lock-step helpers the in-process draft-target loop still uses.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from specbuild.runtime.sampling import SamplingParams, next_tokens
from specbuild.runtime.sequence import (
    GenerationResult,
    SequenceState,
    StopCriteria,
    check_prompts,
)

if TYPE_CHECKING:
    from specbuild.runtime.kv_cache import KVCache
    from specbuild.runtime.model import CausalLM
    from specbuild.runtime.serving import Typical


def padded(rows: Sequence[Sequence[int]], pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded [B, T] ids and each row's real length."""
    lengths = torch.tensor([len(r) for r in rows], dtype=torch.long)
    ids = torch.full((len(rows), int(lengths.max())), pad, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
    return ids, lengths


def last_logits(logits: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Each row's logits at its last real (non-padding) position: [B, T, V] -> [B, V]."""
    return logits[torch.arange(logits.shape[0]), lengths - 1]


def prefill(
    model: CausalLM, cache: KVCache, seqs: list[SequenceState], params: SamplingParams, gen: torch.Generator,
    stop: StopCriteria,
) -> torch.Tensor:
    """Run the prompts through the model, commit them, and emit each sequence's first token, which becomes
    the pending token returned here ([B])."""
    ids, lengths = padded([s.prompt for s in seqs])
    out = model(ids, cache)
    cache.advance(lengths)
    first = next_tokens(last_logits(out.logits, lengths), params, gen)
    for seq, token in zip(seqs, first.tolist(), strict=True):
        seq.emit(token, stop)
    return first


def generate(
    model: CausalLM,
    prompts: Sequence[Sequence[int]],
    params: SamplingParams = SamplingParams(),
    stop: StopCriteria = StopCriteria(),
) -> GenerationResult:
    """Plain autoregressive decoding of a batch of prompts: one target forward per generated token."""
    return run_to_completion(model, prompts, params, stop)


def run_to_completion(
    model: CausalLM,
    prompts: Sequence[Sequence[int]],
    params: SamplingParams,
    stop: StopCriteria,
    *,
    medusa_choices: Sequence[Sequence[int]] | None = None,
    typical: Typical | None = None,
) -> GenerationResult:
    """Every prompt as one request of a serving engine sized for the whole batch, stepped until all finish:
    the batch methods and the server run the same steps and the same stop rules."""
    from specbuild.runtime.serving import EngineRequest, ServingEngine

    check_prompts(prompts, model.config.vocab_size)
    start = time.perf_counter()
    extra = len(medusa_choices) + 1 if medusa_choices else 0
    engine = ServingEngine(model, max_batch=len(prompts), medusa_choices=medusa_choices,
                           max_seq_len=max(len(p) for p in prompts) + stop.max_new_tokens + extra + 1)
    handles = [engine.submit(EngineRequest(list(p), stop.max_new_tokens, params, stop.end_id, stop.stop_words,
                                           stop.include_stop_words, typical=typical)) for p in prompts]
    engine.run_until_idle()
    outputs = [handle.wait(0).tokens for handle in handles]
    stats = engine.stats.acceptance
    stats.target_forwards = engine.stats.forwards
    stats.generated_tokens = sum(len(o) for o in outputs)
    stats.seconds = time.perf_counter() - start
    return GenerationResult(outputs, stats)
