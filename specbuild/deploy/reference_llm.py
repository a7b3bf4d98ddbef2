"""The LLM engine behind the reference backend's python `tensorrt_llm` models, free of Triton types.

One call = one sequence: plain decoding, verification of external draft tokens (greedy: longest prefix equal
to the target's argmax plus one target token; with draft logits and temperature > 0: rejection sampling), or
Medusa decoding with the engine's tree. Each call starts from the longest cached prefix of its input
(`KVPool`), so a speculative round that resends the whole sequence only computes its new tokens.
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
from specbuild.medusa.tree import accept_greedy as accept_tree_greedy
from specbuild.runtime.model import CausalLM
from specbuild.runtime.sampling import SamplingParams, next_tokens, probabilities
from specbuild.runtime.speculative import accept_greedy, accept_rejection_sampling

OnTokens = Callable[[list[int], bool, int, int], None]
"""Streaming callback: (tokens emitted by one step or round, whether the sequence is finished, draft tokens
accepted so far, draft tokens proposed so far)."""

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class RequestError(ValueError):
    """A request the engine cannot serve; its message goes back to the client."""


@dataclass
class LLMRequest:
    input_ids: list[int]
    max_new_tokens: int
    end_id: int | None = None
    stop_words: tuple[tuple[int, ...], ...] = ()
    bad_words: tuple[tuple[int, ...], ...] = ()
    draft_ids: list[int] | None = None
    draft_logits: torch.Tensor | None = None  # [k, V], the draft's logits for its k tokens
    params: SamplingParams = field(default_factory=SamplingParams)
    min_tokens: int = 0
    return_generation_logits: bool = False


@dataclass
class LLMResult:
    tokens: list[int]  # new tokens (end id and stop words not included)
    generation_logits: torch.Tensor | None = None  # [len(tokens) computed, V] when asked for
    accepted_draft_tokens: int = 0
    draft_tokens: int = 0


def _generator(request: LLMRequest) -> torch.Generator:
    """A seeded request draws differently at each sequence length, so rounds of one request do not repeat
    the same uniforms; an unseeded one draws from a random seed."""
    seed = request.params.seed
    gen = torch.Generator()
    gen.manual_seed(seed + len(request.input_ids) if seed is not None else int(torch.seed()))
    return gen


class _Emitter:
    """Applies stop rules token by token (as the runtime's SequenceState) and streams what passes."""

    def __init__(self, request: LLMRequest, on_tokens: OnTokens | None) -> None:
        self.request, self.on_tokens = request, on_tokens
        self.tokens: list[int] = []
        self.done = request.max_new_tokens <= 0

    def emit(self, tokens: Sequence[int], accepted: int = 0, drafted: int = 0) -> list[int]:
        """Append tokens until one ends the sequence; returns the ones appended, streamed as one chunk."""
        added: list[int] = []
        for token in tokens:
            if self.done:
                break
            if self.request.end_id is not None and token == self.request.end_id:
                self.done = True
                break
            self.tokens.append(token)
            added.append(token)
            for word in self.request.stop_words:
                if word and self.tokens[-len(word):] == list(word):
                    del self.tokens[-len(word):]
                    added = added[: max(0, len(added) - len(word))]
                    self.done = True
                    break
            if len(self.tokens) >= self.request.max_new_tokens:
                self.done = True
        if self.on_tokens is not None and (added or self.done):
            self.on_tokens(added, self.done, accepted, drafted)
        return added


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
        ids = request.input_ids
        if not ids:
            raise RequestError("input_ids is empty: a request needs at least one prompt token")
        if min(ids) < 0 or max(ids) >= self.vocab_size:
            raise RequestError(f"input_ids must be in [0, {self.vocab_size})")
        if request.max_new_tokens < 1:
            raise RequestError(f"request_output_len must be at least 1 (got {request.max_new_tokens})")
        drafts = len(request.draft_ids or ())
        if drafts > self.max_draft_len:
            raise RequestError(f"{drafts} draft tokens is more than the engine's max_draft_len {self.max_draft_len}")
        if len(ids) + request.max_new_tokens > self.max_seq_len:
            raise RequestError(
                f"input length {len(ids)} + request_output_len {request.max_new_tokens} = "
                f"{len(ids) + request.max_new_tokens} exceeds the engine's max_seq_len {self.max_seq_len}"
            )
        if request.draft_ids is not None and request.draft_ids:
            if min(request.draft_ids) < 0 or max(request.draft_ids) >= self.vocab_size:
                raise RequestError(f"draft_input_ids must be in [0, {self.vocab_size})")
            logits = request.draft_logits
            if logits is not None and tuple(logits.shape) != (drafts, self.vocab_size):
                raise RequestError(f"draft_logits must be [{drafts}, {self.vocab_size}], got {tuple(logits.shape)}")

    # -- entry point ----------------------------------------------------------------------------------------
    @torch.inference_mode()
    def run(self, request: LLMRequest, on_tokens: OnTokens | None = None) -> LLMResult:
        self.check(request)
        if request.draft_ids:
            return self._verify(request, on_tokens)
        if self.tree is not None and request.params.greedy and not request.bad_words and not request.min_tokens:
            return self._medusa(request, on_tokens)
        return self._plain(request, on_tokens)

    def _prefill(self, ids: np.ndarray, extra: Sequence[int] = ()) -> tuple[Slot, torch.Tensor, int]:
        """Forward the uncached tail of `ids` plus `extra`; returns the slot, the forward's output and how many
        input tokens it computed."""
        slot, cached = self.pool.acquire(ids)
        block = torch.as_tensor(np.concatenate([ids[cached:], np.asarray(extra, dtype=np.int64)]))[None]
        return slot, block, cached

    def _plain(self, request: LLMRequest, on_tokens: OnTokens | None) -> LLMResult:
        ids = np.asarray(request.input_ids, dtype=np.int64)
        slot, block, _ = self._prefill(ids)
        out = self.model(block, slot.cache)
        slot.cache.advance(block.shape[1])
        logits = out.logits[0, -1]
        emitter = _Emitter(request, on_tokens)
        gen = _generator(request) if not request.params.greedy else None
        kept: list[torch.Tensor] = []
        fed: list[int] = []
        while True:
            logits = self._constrain(logits, request, ids, emitter.tokens)
            if request.return_generation_logits:
                kept.append(logits)
            token = int(logits.argmax()) if gen is None else int(next_tokens(logits[None], request.params, gen))
            emitter.emit([token])
            if emitter.done:
                break
            fed.append(token)
            logits = self.model(torch.tensor([[token]]), slot.cache).logits[0, -1]
            slot.cache.advance(1)
        slot.set_tokens(np.concatenate([ids, np.asarray(fed, dtype=np.int64)]))
        return LLMResult(emitter.tokens, torch.stack(kept) if kept else None)

    def _constrain(self, logits: torch.Tensor, request: LLMRequest, ids: np.ndarray, out: list[int]) -> torch.Tensor:
        """Bad words and min_tokens, as logit masks (TensorRT-LLM's semantics)."""
        if not request.bad_words and len(out) >= request.min_tokens:
            return logits
        logits = logits.clone()
        if len(out) < request.min_tokens and request.end_id is not None:
            logits[request.end_id] = -math.inf
        history = [*ids[-16:].tolist(), *out]
        for word in request.bad_words:
            if word and (len(word) == 1 or history[-(len(word) - 1):] == list(word[:-1])):
                logits[word[-1]] = -math.inf
        return logits

    def _verify(self, request: LLMRequest, on_tokens: OnTokens | None) -> LLMResult:
        ids = np.asarray(request.input_ids, dtype=np.int64)
        drafts = list(request.draft_ids or ())
        k = len(drafts)
        slot, block, cached = self._prefill(ids, drafts)
        out = self.model(block, slot.cache)
        target = out.logits[0, -(k + 1):]
        if request.bad_words:
            target = torch.stack([self._constrain(target[i], request, ids, drafts[:i]) for i in range(k + 1)])
        draft_tensor = torch.tensor(drafts)
        if request.params.greedy or request.draft_logits is None:
            if request.params.greedy:
                accepted, nxt = accept_greedy(target, target, draft_tensor, None)  # type: ignore[arg-type]
            else:  # sampling without draft logits: the draft counts as a point mass on its tokens
                q = torch.nn.functional.one_hot(draft_tensor, self.vocab_size).float()
                gen = _generator(request)
                accepted, nxt = accept_rejection_sampling(probabilities(target, request.params), q, draft_tensor, gen)
        else:
            gen = _generator(request)
            p = probabilities(target, request.params)
            q = probabilities(request.draft_logits.float(), request.params)
            accepted, nxt = accept_rejection_sampling(p, q, draft_tensor, gen)
        slot.cache.advance(len(ids) - cached + accepted)
        slot.set_tokens(np.concatenate([ids, np.asarray(drafts[:accepted], dtype=np.int64)]))
        emitter = _Emitter(request, on_tokens)
        emitter.emit([*drafts[:accepted], nxt], accepted, k)
        logits = target[: accepted + 1] if request.return_generation_logits else None
        return LLMResult(emitter.tokens, logits, accepted_draft_tokens=accepted, draft_tokens=k)

    def _medusa(self, request: LLMRequest, on_tokens: OnTokens | None) -> LLMResult:
        tree = self.tree
        assert tree is not None
        ids = np.asarray(request.input_ids, dtype=np.int64)
        slot, block, _ = self._prefill(ids)
        out = self.model(block, slot.cache)
        slot.cache.advance(block.shape[1])
        topk_size = int(tree.rank.max()) + 1
        pending = int(out.logits[0, -1].argmax())
        topk = self._head_topk(out.hidden[:, -1:], topk_size)
        emitter = _Emitter(request, on_tokens)
        emitter.emit([pending])
        committed = list(ids.tolist())
        depth = tree.depth[None, :]
        accepted_total = drafted_total = 0
        while not emitter.done:
            tokens = tree.candidate_tokens(torch.tensor([pending]), topk)  # [1, nodes]
            out = self.model(tokens, slot.cache, position_ids=slot.cache.lengths[:, None] + depth,
                             tree_mask=tree.attention_mask)
            best = out.logits[0].argmax(-1)
            path, accepted = accept_tree_greedy(tree, tokens[0], best)
            accepted_total += accepted
            drafted_total += tree.max_depth
            last = int(path[-1])
            nxt = int(best[last])
            path_tokens = tokens[0, path].tolist()  # root (the pending token) + accepted nodes
            emitter.emit([*path_tokens[1:], nxt], accepted_total, drafted_total)
            slot.cache.compact(0, path)
            committed.extend(path_tokens)
            pending = nxt
            if not emitter.done:
                topk = self._head_topk(out.hidden[:, last : last + 1], topk_size)
        slot.set_tokens(committed)
        return LLMResult(emitter.tokens, None, accepted_draft_tokens=accepted_total, draft_tokens=drafted_total)

    def _head_topk(self, hidden: torch.Tensor, k: int) -> torch.Tensor:
        """[heads, 1, k] top token ids of every Medusa head at one position."""
        return torch.topk(self.model.medusa_logits(hidden)[:, :, 0], k, dim=-1).indices
