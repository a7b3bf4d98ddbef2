"""TensorRT-LLM's executor decoding, as a `TokenDecoding`: what the reference Triton backend serves with.

Each rule is NVIDIA/TensorRT-LLM's:
- Sampling defaults: top_k 0 and top_p 0 (both unset) mean top_k 1, i.e. greedy, whatever the temperature;
  top_k > 0 with top_p unset means top_p 1.0 (`cpp/tensorrt_llm/kernels/samplingTopKKernels.cu`
  `setupTopKRuntimeArgs` @03961722; defaults temperature 1, top_k 0, top_p 0, seed 0 in
  `cpp/tensorrt_llm/layers/defaultDecodingParams.h`).
- The penalty layer, in this order: embedding bias added, logits times 1/(temperature + 1e-6) when temperature
  is not 1, then for every token already in the sequence (prompt and generated) repetition (negative logits
  times, positive ones divided by the penalty), presence (minus the penalty) and frequency (minus penalty times
  the count); the end id masked while fewer than min_tokens tokens are generated
  (`cpp/tensorrt_llm/kernels/penaltyKernels.cu` `batchApplyPenalty` @249d93d5). Bad words are masked after it
  (the ban-words layer). Every position of one step sees the sequence as it was before the step (the kernels'
  `currentStep`).
- Medusa engines decode in `DecodingMode::Medusa` (`cpp/include/tensorrt_llm/executor/types.h`): the penalty
  layer still runs (embedding bias, min length) but no temperature, repetition/presence/frequency penalty or bad
  words (`cpp/tensorrt_llm/layers/layersFactory.h`), and `MedusaDecodingLayer` picks the model's token at every
  tree node by top-K sampling with the request's runtime_top_k (1 when unset: the argmax)
  (`cpp/tensorrt_llm/layers/medusaDecodingLayer.cpp` @015884d6).
- Log probabilities (`samplingTopKKernels.cu` `topKStage2Sampling`): the log of the emitted token's probability
  under the softmax of the processed logits; normalize_log_probs (the ExecutorConfig's, default true)
  renormalises the reported value over the top-k candidates (log P(token | top-k)), the cumulative one is always
  unnormalised; on the top-p path (top_k unset, top_p set) both are unnormalised (`samplingTopPKernels.cu`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specbuild.runtime.decoding import TokenDecoding
from specbuild.runtime.sampling import SamplingParams, draw, probabilities

MASK = float(torch.finfo(torch.float32).min)
"""What TensorRT-LLM writes into a masked logit (-FLT_MAX, penaltyKernels.cu)."""


@dataclass(frozen=True)
class TrtllmDecoding:
    """A request's SamplingConfig as the executor holds it (None / 0: not set), plus the request fields the
    decoding layers read."""

    top_k: int = 0
    top_p: float = 0.0  # the backend already dropped a top_p <= 0
    temperature: float = 1.0
    request_seed: int = 0  # DefaultDecodingParams::getSeed(): unseeded requests sample reproducibly too
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    min_tokens: int = 0
    end_id: int | None = None
    bad_words: tuple[tuple[int, ...], ...] = ()
    embedding_bias: torch.Tensor | None = None  # [n <= V], added to the first n logits
    normalize_log_probs: bool = True
    medusa: bool = False  # DecodingMode::Medusa: the engine is a Medusa engine

    def effective(self) -> tuple[int, float]:
        """(top_k, top_p) after setupTopKRuntimeArgs: both unset -> greedy; top_k alone -> top_p 1."""
        k, p = self.top_k, self.top_p
        if k == 0 and p == 0.0:
            k = 1
        if k > 0 and p == 0.0:
            p = 1.0
        return k, p

    @property
    def greedy(self) -> bool:
        """top_k 1 is the argmax; temperature 0 scales the logits by 1e6, which leaves only the argmax."""
        if self.medusa:
            return self._medusa_top_k == 1
        return self.effective()[0] == 1 or self.temperature == 0.0

    @property
    def seed(self) -> int | None:
        return self.request_seed

    @property
    def _medusa_top_k(self) -> int:
        return self.top_k if self.top_k > 1 else 1  # runtimeTopK, default 1

    def process(self, logits: torch.Tensor, history: Sequence[int], generated: int,
                ahead: Sequence[Sequence[int]] | None = None) -> torch.Tensor:
        out = logits.float().clone()
        bias = self.embedding_bias
        if bias is not None and bias.numel():
            n = min(bias.numel(), out.shape[-1])
            out[:, :n] += bias.reshape(-1)[:n].to(out.dtype)
        if not self.medusa:
            if self.temperature != 1.0:
                out *= 1.0 / (self.temperature + 1e-6)
            penalties = (self.repetition_penalty, self.presence_penalty, self.frequency_penalty)
            if any(p is not None for p in penalties) and history:
                counts = torch.bincount(torch.as_tensor(list(history), dtype=torch.long),
                                        minlength=out.shape[-1])[: out.shape[-1]].to(out.dtype)
                seen = counts > 0
                if self.repetition_penalty is not None:
                    rp = self.repetition_penalty
                    out = torch.where(seen, torch.where(out < 0, out * rp, out / rp), out)
                if self.presence_penalty is not None:
                    out = out - seen.to(out.dtype) * self.presence_penalty
                if self.frequency_penalty is not None:
                    out = out - counts * self.frequency_penalty
        end = self.end_id
        if generated < self.min_tokens and end is not None and 0 <= end < out.shape[-1]:
            out[:, end] = MASK
        if not self.medusa:
            for word in self.bad_words:
                if word and (len(word) == 1 or list(history[-(len(word) - 1):]) == list(word[:-1])) \
                        and 0 <= word[-1] < out.shape[-1]:
                    out[:, word[-1]] = MASK
        return out

    def _params(self) -> SamplingParams:
        if self.medusa:
            return SamplingParams(temperature=1.0, top_k=self._medusa_top_k)
        k, p = self.effective()
        return SamplingParams(temperature=1.0, top_k=max(k, 0), top_p=p if 0.0 < p < 1.0 else 1.0)

    def choose(self, processed: torch.Tensor, gen: torch.Generator | None) -> list[int]:
        if self.greedy or gen is None:
            return processed.argmax(-1).tolist()
        return draw(probabilities(processed, self._params()), gen).tolist()

    def probabilities(self, processed: torch.Tensor) -> torch.Tensor:
        return probabilities(processed, self._params())

    def draft_probabilities(self, draft_logits: torch.Tensor) -> torch.Tensor:
        """The draft's logits go through the same temperature as the target's before rejection sampling."""
        draft = draft_logits.float()
        if self.temperature != 1.0:
            draft = draft * (1.0 / (self.temperature + 1e-6))
        return probabilities(draft, self._params())

    def log_probs(self, processed: torch.Tensor, token: int) -> tuple[float, float]:
        probs = torch.softmax(processed.float(), dim=-1)
        value = math.log(max(float(probs[token]), 1e-45))
        k = self._medusa_top_k if self.medusa else self.effective()[0]
        if k > 0 and self.normalize_log_probs:
            top = float(torch.topk(probs, min(k, probs.numel())).values.sum())
            return value - math.log(max(top, 1e-45)), value
        return value, value

    def for_tree(self) -> TokenDecoding:
        return self
