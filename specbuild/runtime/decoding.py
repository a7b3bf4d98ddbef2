"""How a request turns logits into tokens: the engine asks its request's decoding, and knows nothing else of it.

A `TokenDecoding` processes one step's raw logits (penalties, bans, biases), chooses tokens from them, gives the
distributions that rejection sampling compares, and the log probabilities the client may ask for. Two exist:
`SamplingDecoding`, the runtime's own (temperature, top-k, top-p as `SamplingParams` define them, bad words and
min_tokens as logit masks), and TensorRT-LLM's executor semantics for the reference Triton backend
(`specbuild.runtime.trtllm_decoding`). As in vLLM's sampler, none of this touches caches or stop rules.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from specbuild.runtime.sampling import SamplingParams, next_tokens, probabilities


class TokenDecoding(Protocol):
    """One request's decoding."""

    @property
    def greedy(self) -> bool:
        """Whether choices are the argmax (verification then matches tokens instead of sampling)."""

    @property
    def seed(self) -> int | None:
        """The request's seed (None: draw from a random one)."""

    def process(self, logits: torch.Tensor, history: Sequence[int], generated: int,
                ahead: Sequence[Sequence[int]] | None = None) -> torch.Tensor:
        """Raw logits [N, V] of one step's positions -> the logits tokens are chosen from; `history` is the
        sequence before the step (prompt and output), `generated` how many tokens it has produced, `ahead[i]`
        the tokens the step itself puts before position i (a verification's drafts so far)."""

    def choose(self, processed: torch.Tensor, gen: torch.Generator | None) -> list[int]:
        """One token per row of processed logits [N, V]."""

    def probabilities(self, processed: torch.Tensor) -> torch.Tensor:
        """The distributions [N, V] tokens are drawn from (rejection sampling's p)."""

    def draft_probabilities(self, draft_logits: torch.Tensor) -> torch.Tensor:
        """The draft's distributions [K, V] from its raw logits (rejection sampling's q)."""

    def log_probs(self, processed: torch.Tensor, token: int) -> tuple[float, float]:
        """(the reported log probability of `token`, its unnormalised log probability) under processed [V]."""

    def for_tree(self) -> TokenDecoding:
        """The decoding of Medusa tree nodes (TensorRT-LLM's Medusa layer decodes them differently)."""


MASK = -math.inf


@dataclass(frozen=True)
class SamplingDecoding:
    """The runtime's decoding: `SamplingParams`, bad words (a word's last token is banned where its other tokens
    were just generated) and min_tokens (the end id banned until then)."""

    params: SamplingParams = field(default_factory=SamplingParams)
    bad_words: tuple[tuple[int, ...], ...] = ()
    min_tokens: int = 0
    end_id: int | None = None

    @property
    def greedy(self) -> bool:
        return self.params.greedy

    @property
    def seed(self) -> int | None:
        return self.params.seed

    def process(self, logits: torch.Tensor, history: Sequence[int], generated: int,
                ahead: Sequence[Sequence[int]] | None = None) -> torch.Tensor:
        """Each position sees its own history (the step's tokens before it too), so speculative output with bad
        words or min_tokens still equals plain decoding."""
        if not self.bad_words and generated >= self.min_tokens:
            return logits
        logits = logits.clone()
        recent = list(history[-16:])
        for i in range(logits.shape[0]):
            extra = list(ahead[i]) if ahead is not None else []
            if generated + len(extra) < self.min_tokens and self.end_id is not None:
                logits[i, self.end_id] = MASK
            seen = recent + extra
            for word in self.bad_words:
                if word and (len(word) == 1 or seen[-(len(word) - 1):] == list(word[:-1])):
                    logits[i, word[-1]] = MASK
        return logits

    def choose(self, processed: torch.Tensor, gen: torch.Generator | None) -> list[int]:
        if gen is None or self.greedy:
            return processed.argmax(-1).tolist()
        return next_tokens(processed, self.params, gen).tolist()

    def probabilities(self, processed: torch.Tensor) -> torch.Tensor:
        return probabilities(processed, self.params)

    def draft_probabilities(self, draft_logits: torch.Tensor) -> torch.Tensor:
        return probabilities(draft_logits.float(), self.params)

    def log_probs(self, processed: torch.Tensor, token: int) -> tuple[float, float]:
        value = float(torch.log_softmax(processed.float(), -1)[token])
        return value, value

    def for_tree(self) -> TokenDecoding:
        return self
