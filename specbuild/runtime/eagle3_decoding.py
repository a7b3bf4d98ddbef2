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

Rows of a batch have their own lengths; a forward over rows that need different numbers of positions pads the
short rows at the end (causal attention keeps the padding out of the real positions) and commits each row's own.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from specbuild.runtime.acceptance import accept_greedy, accept_rejection_sampling
from specbuild.runtime.eagle3 import Eagle3Draft
from specbuild.runtime.model import CausalLM
from specbuild.runtime.sampling import SamplingParams, draw, probabilities
from specbuild.runtime.sequence import GenerationResult, GenerationStats, SequenceState, StopCriteria, check_prompts


@dataclass(frozen=True)
class Eagle3Config:
    """How many tokens the draft proposes per round (a chain)."""

    num_draft_tokens: int = 4

    def __post_init__(self) -> None:
        if self.num_draft_tokens < 1:
            raise ValueError(f"num_draft_tokens must be >= 1 (got {self.num_draft_tokens})")


def _pad(rows: Sequence[torch.Tensor], fill: float | int = 0) -> torch.Tensor:
    """[n_b, ...] per row -> [B, max n_b, ...], padded at the end."""
    width = max(r.shape[0] for r in rows)
    out = rows[0].new_full((len(rows), width, *rows[0].shape[1:]), fill)
    for b, r in enumerate(rows):
        out[b, : r.shape[0]] = r
    return out


class _Eagle3Run:
    def __init__(self, target: CausalLM, draft: Eagle3Draft, prompts: Sequence[Sequence[int]], params: SamplingParams,
                 stop: StopCriteria, config: Eagle3Config,
                 on_tokens: Callable[[int, list[int]], None] | None) -> None:
        self.target, self.draft, self.params, self.stop, self.k = target, draft, params, stop, config.num_draft_tokens
        self.on_tokens = on_tokens
        self.seqs = [SequenceState(list(p)) for p in prompts]
        batch = len(prompts)
        capacity = max(len(p) for p in prompts) + stop.max_new_tokens + self.k + 2
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
        # Catch-up: one position per target-verified position, fed with the target's features there.
        counts = [self.features[b].shape[0] if b in k_row else 0 for b in range(len(self.seqs))]
        feats = _pad([self.features[b] if counts[b] else self.features[b][:1] for b in range(len(self.seqs))])
        tokens = _pad([self.next_tokens[b] if counts[b] else self.next_tokens[b][:1] for b in range(len(self.seqs))])
        logits, out = draft(tokens, draft.fuse(feats), cache)
        self.stats.draft_forwards += 1
        cache.advance(torch.tensor(counts))
        last = torch.tensor([max(c - 1, 0) for c in counts])
        rows_index = torch.arange(len(self.seqs))
        step_logits, hidden = logits[rows_index, last], out[rows_index, last]
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

    def run(self) -> GenerationResult:
        start = time.perf_counter()
        self.prefill()
        while not all(s.done for s in self.seqs):
            self.round()
        self.stats.generated_tokens = sum(len(s.output) for s in self.seqs)
        self.stats.seconds = time.perf_counter() - start
        return GenerationResult([s.output for s in self.seqs], self.stats)


def generate_eagle3(
    target: CausalLM,
    draft: Eagle3Draft,
    prompts: Sequence[Sequence[int]],
    config: Eagle3Config = Eagle3Config(),
    params: SamplingParams = SamplingParams(),
    stop: StopCriteria = StopCriteria(),
    on_tokens: Callable[[int, list[int]], None] | None = None,
) -> GenerationResult:
    """Generate a batch with the EAGLE-3 draft proposing K-token chains and the target verifying them; greedy
    output equals plain greedy decoding, sampled output follows the target's distribution. `on_tokens(row,
    tokens)` is called with each row's newly emitted tokens after every round (a server streams them)."""
    check_prompts(prompts, target.config.vocab_size)
    return _Eagle3Run(target, draft, prompts, params, stop, config, on_tokens).run()
