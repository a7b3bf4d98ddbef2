"""The LLM engine behind the reference backend's python `tensorrt_llm` models, free of Triton types.

One call = one sequence, decoded as TensorRT-LLM's executor decodes a request of the engine's decoding mode:
prefill (the longest cached prefix of the prompt is reused, `KVPool`), then - with external draft tokens - one
verification step (greedy: the longest prefix equal to the target's choice plus one target token; sampling:
rejection sampling, against the draft's logits when given), then plain steps, or Medusa steps with the engine's
tree, until max_new_tokens, the end id, a stop word or a stop request. `LLMRequest` carries the executor's
per-request settings; the Triton-facing rules (which inputs, which outputs, which errors) live in
`specbuild.deploy.llm_backend`.

Decoding semantics, each from NVIDIA/TensorRT-LLM:
- Sampling defaults: top_k 0 and top_p 0 (both unset) mean top_k 1, i.e. greedy, whatever the temperature;
  top_k > 0 with top_p unset means top_p 1.0 (`cpp/tensorrt_llm/kernels/samplingTopKKernels.cu`
  `setupTopKRuntimeArgs` @03961722; defaults temperature 1, top_k 0, top_p 0, seed 0, min length 1 in
  `cpp/tensorrt_llm/layers/defaultDecodingParams.h`).
- The penalty layer, in this order: embedding bias added, logits times 1/(temperature + 1e-6) when temperature
  is not 1, then for every token already in the sequence (prompt and generated) repetition (negative logits
  times, positive ones divided by the penalty), presence (minus the penalty) and frequency (minus penalty times
  the count); the end id masked while fewer than min_tokens tokens are generated
  (`cpp/tensorrt_llm/kernels/penaltyKernels.cu` `batchApplyPenalty` @249d93d5). Bad words are masked after it
  (the ban-words layer), stop words end the sequence with the stop word included in the output
  (`stopCriteriaKernels.cu`: "Update seq lengths up to stopped word (including)"), the end id ends it without
  being output.
- Decoding modes (`cpp/include/tensorrt_llm/executor/types.h` `DecodingMode`): top_k_top_p uses penalties, ban
  words and the standard stop criteria; Medusa uses only the min length, the standard stop criteria and the end
  id - no temperature, no repetition/presence/frequency penalties, no bad words - though the penalty layer (which
  adds the embedding bias) always runs first (`cpp/tensorrt_llm/layers/layersFactory.h`).
- Medusa (`cpp/tensorrt_llm/layers/medusaDecodingLayer.cpp` @015884d6): the model's token at every tree node is
  drawn by top-K sampling with the request's runtime_top_k (1 when unset: the argmax), a draft node is accepted
  when it equals the token drawn at its parent, the heads' top-k tokens fill the next tree.
- Log probabilities (`samplingTopKKernels.cu` `topKStage2Sampling`): the log of the emitted token's probability
  under the softmax of the processed logits; normalize_log_probs (the ExecutorConfig's, default true)
  renormalises output_log_probs over the top-k candidates (log P(token | top-k)), cum_log_probs always sums the
  unnormalised ones; on the top-p path (top_k unset, top_p set) both are unnormalised (`samplingTopPKernels.cu`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from specbuild.deploy.kv_pool import KVPool, Slot
from specbuild.medusa.tree import MedusaTree
from specbuild.medusa.tree import accept_greedy as accept_tree
from specbuild.runtime.model import CausalLM
from specbuild.runtime.sampling import SamplingParams, draw, probabilities
from specbuild.runtime.speculative import accept_greedy, accept_rejection_sampling

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
MASK = float(torch.finfo(torch.float32).min)
"""What TensorRT-LLM writes into a masked logit (-FLT_MAX, penaltyKernels.cu)."""


class RequestError(ValueError):
    """A request the engine cannot serve; its message goes back to the client."""


@dataclass(frozen=True)
class Decoding:
    """A request's sampling settings as the executor's SamplingConfig holds them (None/0: not set)."""

    top_k: int = 0
    top_p: float = 0.0  # the backend already dropped a top_p <= 0
    temperature: float = 1.0
    seed: int = 0  # DefaultDecodingParams::getSeed(): unseeded requests sample reproducibly too
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None

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
        return self.effective()[0] == 1 or self.temperature == 0.0


@dataclass
class LLMRequest:
    input_ids: list[int]
    max_new_tokens: int
    end_id: int | None = None
    stop_words: tuple[tuple[int, ...], ...] = ()
    bad_words: tuple[tuple[int, ...], ...] = ()
    draft_ids: list[int] | None = None
    draft_logits: torch.Tensor | None = None  # [k, V], the draft's logits for its k tokens
    decoding: Decoding = field(default_factory=Decoding)
    min_tokens: int = 0
    embedding_bias: torch.Tensor | None = None  # [n <= V], added to the first n logits
    return_generation_logits: bool = False
    return_context_logits: bool = False
    return_log_probs: bool = False
    normalize_log_probs: bool = True


@dataclass
class StepEvent:
    """What one decoding step added to a sequence (sent to the caller after every step)."""

    tokens: list[int]  # tokens appended by this step (the end id is never appended)
    log_probs: list[float]  # one per appended token, when asked for
    logits: list[torch.Tensor]  # the raw logits of every position this step decided (when asked for)
    done: bool
    finish_reason: str  # "" while running; "length", "end_id", "stop_words", "cancelled"
    accepted_draft_tokens: int  # totals so far (TensorRT-LLM's speculative-decoding perf metrics)
    draft_tokens: int
    reused_tokens: int  # prompt tokens whose KV cache was reused instead of computed
    cum_log_prob: float = 0.0  # the sum of the unnormalised log probs so far (cum_log_probs)
    context_logits: torch.Tensor | None = None  # [prompt, V] raw, when asked for (first event only)


OnStep = Callable[[StepEvent], None]


@dataclass
class LLMResult:
    tokens: list[int]  # new tokens (the end id not included, a stop word included)
    generation_logits: torch.Tensor | None = None  # [steps decided, V] raw logits, when asked for
    accepted_draft_tokens: int = 0
    draft_tokens: int = 0
    log_probs: list[float] = field(default_factory=list)
    cum_log_prob: float = 0.0
    context_logits: torch.Tensor | None = None
    reused_tokens: int = 0
    finish_reason: str = ""


class _Sequence:
    """One sequence's state: applies the stop rules token by token and reports each step."""

    def __init__(self, request: LLMRequest, on_step: OnStep | None, should_stop: Callable[[], bool] | None) -> None:
        self.request, self.on_step, self.should_stop = request, on_step, should_stop
        self.tokens: list[int] = []
        self.log_probs: list[float] = []
        self.cum_log_prob = 0.0
        self.rows: list[torch.Tensor] = []
        self.done = request.max_new_tokens <= 0
        self.finish_reason = "length" if self.done else ""
        self.accepted = self.drafted = self.reused = 0
        self.context_logits: torch.Tensor | None = None
        self._sent = self._sent_rows = 0
        self._sent_context = False

    def emit(self, tokens: Sequence[int], log_probs: Sequence[tuple[float, float]] = (),
             rows: Sequence[torch.Tensor] = ()) -> None:
        """Offer one step's tokens (with their (output, cumulative) log probs and raw logits): appended until
        one ends the sequence."""
        request = self.request
        for i, token in enumerate(tokens):
            if self.done:
                break
            if i < len(rows):
                self.rows.append(rows[i])
            if request.end_id is not None and token == request.end_id:
                self.done, self.finish_reason = True, "end_id"
                break
            self.tokens.append(int(token))
            if i < len(log_probs):
                self.log_probs.append(log_probs[i][0])
                self.cum_log_prob += log_probs[i][1]
            if any(word and self.tokens[-len(word):] == list(word) for word in request.stop_words):
                self.done, self.finish_reason = True, "stop_words"
            elif len(self.tokens) >= request.max_new_tokens:
                self.done, self.finish_reason = True, "length"

    def flush(self) -> bool:
        """Report the step; afterwards a stop request (polled only between steps, as the executor terminates
        cancelled requests between iterations) ends the sequence with one more, empty, report. Returns whether
        the sequence is done."""
        self._report()
        if not self.done and self.should_stop is not None and self.should_stop():
            self.done, self.finish_reason = True, "cancelled"
            self._report()
        return self.done

    def _report(self) -> None:
        if self.on_step is None:
            return
        event = StepEvent(self.tokens[self._sent:], self.log_probs[self._sent:], self.rows[self._sent_rows:],
                          self.done, self.finish_reason, self.accepted, self.drafted, self.reused,
                          self.cum_log_prob, None if self._sent_context else self.context_logits)
        self._sent, self._sent_rows, self._sent_context = len(self.tokens), len(self.rows), True
        self.on_step(event)

    def result(self) -> LLMResult:
        logits = torch.stack(self.rows) if self.rows else None
        return LLMResult(self.tokens, logits, self.accepted, self.drafted, self.log_probs, self.cum_log_prob,
                         self.context_logits, self.reused, self.finish_reason)


class ReferenceLLM:
    """A reference bundle's checkpoint, served one sequence at a time with prefix-reusing KV caches."""

    def __init__(self, checkpoint: Path, *, dtype: str, max_seq_len: int, cache_slots: int,
                 max_draft_len: int = 0, medusa_choices: Sequence[Sequence[int]] | None = None) -> None:
        self.model = CausalLM.from_checkpoint(checkpoint, dtype=_DTYPES.get(dtype, torch.float32))
        self.vocab_size = self.model.config.vocab_size
        self.max_seq_len, self.max_draft_len = max_seq_len, max_draft_len
        self.tree = MedusaTree.from_choices(medusa_choices) if medusa_choices else None
        if self.tree is not None and self.model.config.num_medusa_heads < self.tree.max_depth:
            raise ValueError(f"the Medusa tree is {self.tree.max_depth} deep but the checkpoint has "
                             f"{self.model.config.num_medusa_heads} heads")
        tree_nodes = self.tree.num_nodes + 1 if self.tree is not None else 0
        capacity = max_seq_len + max(max_draft_len, tree_nodes) + 2
        self.pool = KVPool(self.model, cache_slots, capacity, speculative_tail=max(max_draft_len, tree_nodes) + 1)

    # -- checks ---------------------------------------------------------------------------------------------
    def check(self, request: LLMRequest) -> None:
        """What the engine itself cannot run (the backend applies TensorRT-LLM's own limits before this)."""
        ids = request.input_ids
        if not ids:
            raise RequestError("input_ids is empty: a request needs at least one prompt token")
        if min(ids) < 0 or max(ids) >= self.vocab_size:
            raise RequestError(f"input_ids must be in [0, {self.vocab_size}) (the reference backend has no "
                               "prompt tables)")
        drafts = len(request.draft_ids or ())
        if len(ids) + max(request.max_new_tokens, 0) > self.max_seq_len:
            raise RequestError(f"input length {len(ids)} + max_new_tokens {request.max_new_tokens} exceeds the "
                               f"engine's max_seq_len {self.max_seq_len}")
        if drafts > max(self.max_draft_len, 0):
            raise RequestError(f"{drafts} draft tokens is more than the engine's max_draft_len {self.max_draft_len}")
        if request.draft_ids:
            if min(request.draft_ids) < 0 or max(request.draft_ids) >= self.vocab_size:
                raise RequestError(f"draft_input_ids must be in [0, {self.vocab_size})")
            logits = request.draft_logits
            if logits is not None and tuple(logits.shape) != (drafts, self.vocab_size):
                raise RequestError(f"draft_logits must be [{drafts}, {self.vocab_size}], got {tuple(logits.shape)}")

    # -- entry point ----------------------------------------------------------------------------------------
    @torch.inference_mode()
    def run(self, request: LLMRequest, on_step: OnStep | None = None,
            should_stop: Callable[[], bool] | None = None) -> LLMResult:
        """Decode one sequence; `on_step` sees every step, `should_stop` is asked between steps."""
        self.check(request)
        seq = _Sequence(request, on_step, should_stop)
        ids = np.asarray(request.input_ids, dtype=np.int64)
        drafts = list(request.draft_ids or ())
        # Context logits need every prompt position computed: no prefix reuse for such a request.
        slot, cached = self.pool.acquire(ids, reuse=not request.return_context_logits)
        seq.reused = cached
        block = torch.as_tensor(np.concatenate([ids[cached:], np.asarray(drafts, dtype=np.int64)]))[None]
        out = self.model(block, slot.cache)
        if request.return_context_logits:
            seq.context_logits = out.logits[0, : len(ids)].clone()
        gen = torch.Generator()
        gen.manual_seed(request.decoding.seed)
        if seq.done:  # nothing to generate (max_new_tokens shortened to 0): the prompt alone, one report
            slot.cache.advance(len(ids) - cached)
            slot.set_tokens(ids)
            seq.flush()
            return seq.result()
        if drafts:
            fed = self._verify(seq, slot, out.logits[0, -(len(drafts) + 1):], ids, cached, gen)
        elif self.tree is not None:
            slot.cache.advance(block.shape[1])
            self._medusa(seq, slot, out, ids, gen)
            return seq.result()
        else:
            slot.cache.advance(block.shape[1])
            fed = self._decode(seq, slot, out.logits[0, -1], ids, gen)
        slot.set_tokens(np.concatenate([ids, np.asarray(fed, dtype=np.int64)]))
        return seq.result()

    # -- logits ---------------------------------------------------------------------------------------------
    def _process(self, logits: torch.Tensor, request: LLMRequest, history: Sequence[int], generated: int, *,
                 medusa: bool = False) -> torch.Tensor:
        """The penalty and ban-words layers on raw logits [N, V] of one step (every position of a step sees the
        sequence as it was before the step, as the kernels' `currentStep` does)."""
        out = logits.float().clone()
        bias = request.embedding_bias
        if bias is not None and bias.numel():
            n = min(bias.numel(), out.shape[-1])
            out[:, :n] += bias.reshape(-1)[:n].to(out.dtype)
        decoding = request.decoding
        if not medusa:
            if decoding.temperature != 1.0:
                out *= 1.0 / (decoding.temperature + 1e-6)
            penalties = (decoding.repetition_penalty, decoding.presence_penalty, decoding.frequency_penalty)
            if any(p is not None for p in penalties) and history:
                counts = torch.bincount(torch.as_tensor(list(history), dtype=torch.long),
                                        minlength=out.shape[-1])[: out.shape[-1]].to(out.dtype)
                seen = counts > 0
                if decoding.repetition_penalty is not None:
                    rp = decoding.repetition_penalty
                    out = torch.where(seen, torch.where(out < 0, out * rp, out / rp), out)
                if decoding.presence_penalty is not None:
                    out = out - seen.to(out.dtype) * decoding.presence_penalty
                if decoding.frequency_penalty is not None:
                    out = out - counts * decoding.frequency_penalty
        end = request.end_id
        if generated < request.min_tokens and end is not None and 0 <= end < out.shape[-1]:
            out[:, end] = MASK
        if not medusa:
            for word in request.bad_words:
                if word and (len(word) == 1 or list(history[-(len(word) - 1):]) == list(word[:-1])) \
                        and 0 <= word[-1] < out.shape[-1]:
                    out[:, word[-1]] = MASK
        return out

    @staticmethod
    def _sampling(decoding: Decoding) -> SamplingParams:
        k, p = decoding.effective()
        return SamplingParams(temperature=1.0, top_k=max(k, 0), top_p=p if 0.0 < p < 1.0 else 1.0)

    def _choose(self, processed: torch.Tensor, decoding: Decoding, gen: torch.Generator) -> int:
        if decoding.greedy:
            return int(processed.argmax())
        return int(draw(probabilities(processed[None], self._sampling(decoding)), gen)[0])

    @staticmethod
    def _log_probs(processed: torch.Tensor, token: int, request: LLMRequest, top_k: int | None = None
                   ) -> tuple[float, float]:
        """(output_log_probs entry, cum_log_probs increment) for one emitted token."""
        probs = torch.softmax(processed.float(), dim=-1)
        lp = math.log(max(float(probs[token]), 1e-45))
        k = request.decoding.effective()[0] if top_k is None else top_k
        if k > 0 and request.normalize_log_probs:
            top = float(torch.topk(probs, min(k, probs.numel())).values.sum())
            return lp - math.log(max(top, 1e-45)), lp
        return lp, lp

    # -- decoding modes -------------------------------------------------------------------------------------
    def _decode(self, seq: _Sequence, slot: Slot, logits: torch.Tensor, ids: np.ndarray, gen: torch.Generator,
                fed: list[int] | None = None) -> list[int]:
        """Plain steps from `logits` (the raw logits for the next token); returns the tokens fed to the cache."""
        request = seq.request
        fed = [] if fed is None else fed
        prompt = ids.tolist()
        while not seq.done:
            processed = self._process(logits[None], request, prompt + seq.tokens, len(seq.tokens))[0]
            token = self._choose(processed, request.decoding, gen)
            lps = [self._log_probs(processed, token, request)] if request.return_log_probs else []
            seq.emit([token], lps, [logits] if request.return_generation_logits else [])
            if seq.flush():
                break
            fed.append(token)
            logits = self.model(torch.tensor([[token]]), slot.cache).logits[0, -1]
            slot.cache.advance(1)
        return fed

    def _verify(self, seq: _Sequence, slot: Slot, target: torch.Tensor, ids: np.ndarray, cached: int,
                gen: torch.Generator) -> list[int]:
        """One verification step of external draft tokens, then plain steps to max_new_tokens (the drafts only
        speed up the first step of the request)."""
        request = seq.request
        drafts = list(request.draft_ids or ())
        k = len(drafts)
        processed = self._process(target, request, ids.tolist(), 0)
        draft_tensor = torch.tensor(drafts)
        decoding = request.decoding
        if decoding.greedy:
            accepted, nxt = accept_greedy(processed, processed, draft_tensor, gen)
        else:
            params = self._sampling(decoding)
            p = probabilities(processed, params)
            if request.draft_logits is None:  # the draft counts as a point mass on its tokens
                q = torch.nn.functional.one_hot(draft_tensor, self.vocab_size).float()
            else:
                draft = request.draft_logits.float()
                if decoding.temperature != 1.0:
                    draft = draft * (1.0 / (decoding.temperature + 1e-6))
                q = probabilities(draft, params)
            accepted, nxt = accept_rejection_sampling(p, q, draft_tensor, gen)
        emitted = [*drafts[:accepted], nxt]
        slot.cache.advance(len(ids) - cached + accepted)
        lps = [self._log_probs(processed[i], t, request) for i, t in enumerate(emitted)] \
            if request.return_log_probs else []
        rows = list(target[: accepted + 1]) if request.return_generation_logits else []
        seq.accepted, seq.drafted = accepted, k
        seq.emit(emitted, lps, rows)
        fed = drafts[:accepted]
        if seq.flush():
            return fed
        fed.append(nxt)
        logits = self.model(torch.tensor([[nxt]]), slot.cache).logits[0, -1]
        slot.cache.advance(1)
        return self._decode(seq, slot, logits, ids, gen, fed)

    def _medusa(self, seq: _Sequence, slot: Slot, out: object, ids: np.ndarray, gen: torch.Generator) -> None:
        tree = self.tree
        assert tree is not None
        request = seq.request
        top_k = request.decoding.top_k if request.decoding.top_k > 1 else 1  # runtimeTopK, default 1
        prompt = ids.tolist()
        topk_size = int(tree.rank.max()) + 1

        def choose(processed: torch.Tensor) -> torch.Tensor:
            """The model's token at every position [N, V] -> [N]: argmax, or top-K sampling (no temperature)."""
            if top_k == 1:
                return processed.argmax(-1)
            return draw(probabilities(processed, SamplingParams(temperature=1.0, top_k=top_k)), gen)

        logits = out.logits[0, -1:]  # type: ignore[attr-defined]
        processed = self._process(logits, request, prompt, 0, medusa=True)
        pending = int(choose(processed)[0])
        topk = self._head_topk(out.hidden[:, -1:], topk_size)  # type: ignore[attr-defined]
        lps = [self._log_probs(processed[0], pending, request, top_k)] if request.return_log_probs else []
        seq.emit([pending], lps, [logits[0]] if request.return_generation_logits else [])
        committed = list(prompt)
        depth = tree.depth[None, :]
        done = seq.flush()
        while not done:
            tokens = tree.candidate_tokens(torch.tensor([pending]), topk)  # [1, nodes]
            out = self.model(tokens, slot.cache, position_ids=slot.cache.lengths[:, None] + depth,
                             tree_mask=tree.attention_mask)
            raw = out.logits[0]
            processed = self._process(raw, request, [*committed, pending], len(seq.tokens), medusa=True)
            chosen = choose(processed)
            path, accepted = accept_tree(tree, tokens[0], chosen)
            last = int(path[-1])
            path_tokens = tokens[0, path].tolist()  # root (the pending token) + accepted nodes
            nxt = int(chosen[last])
            emitted = [*path_tokens[1:], nxt]
            positions = path.tolist()  # emitted token j is decided at node positions[j]
            lps = [self._log_probs(processed[n], t, request, top_k) for n, t in zip(positions, emitted, strict=True)] \
                if request.return_log_probs else []
            rows = [raw[n] for n in positions] if request.return_generation_logits else []
            seq.accepted += accepted
            seq.drafted += min(tree.num_nodes, tree.max_depth)  # llmRequest.h updateNumTokensPerIteration
            seq.emit(emitted, lps, rows)
            slot.cache.compact(0, path)
            committed.extend(path_tokens)
            pending = nxt
            done = seq.flush()
            if not done:
                topk = self._head_topk(out.hidden[:, last : last + 1], topk_size)
        slot.set_tokens(committed)

    def _head_topk(self, hidden: torch.Tensor, k: int) -> torch.Tensor:
        """[heads, 1, k] top token ids of every Medusa head at one position."""
        return torch.topk(self.model.medusa_logits(hidden)[:, :, 0], k, dim=-1).indices
