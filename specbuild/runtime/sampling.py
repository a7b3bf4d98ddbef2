"""Turning logits into the distribution a token is drawn from, and drawing it.

Speculative sampling is only exact when the draft's q and the target's p are the very distributions tokens
are drawn from, so temperature, top-k and top-p are applied here once, to both models alike.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 means greedy (argmax); top_k 0 and top_p 1.0 mean no truncation."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (got {self.temperature})")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (got {self.top_k})")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1] (got {self.top_p})")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def for_row(self, row: int) -> SamplingParams:
        """The parameters for row `row` of a batch seeded as a whole: its own seed, so identical prompts in one
        batch still draw independently (a request's seed alone would make them draw alike)."""
        if self.seed is None or self.greedy:
            return self
        return dataclasses.replace(self, seed=(self.seed * 7919 + row) % (2**63))

    def generator(self, device: torch.device | str = "cpu") -> torch.Generator:
        """A generator on the device the probabilities live on (CUDA draws need a CUDA generator)."""
        gen = torch.Generator(device=device)
        gen.manual_seed(self.seed if self.seed is not None else int(torch.seed()))
        return gen


def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Softmax of `logits / temperature` restricted to the top-k and the top-p nucleus, renormalised.
    Works on any leading shape; the last dimension is the vocabulary."""
    logits = logits.float()
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    logits = logits / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        sorted_probs = sorted_probs.masked_fill(before >= params.top_p, 0.0)  # keep the smallest set reaching top_p
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def draw(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One token per row of `probs` ([..., V] -> [...])."""
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])


def next_tokens(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> torch.Tensor:
    """The next token for each row of logits: argmax when greedy, else a draw from `probabilities`."""
    if params.greedy:
        return logits.argmax(-1)
    return draw(probabilities(logits, params), generator)
