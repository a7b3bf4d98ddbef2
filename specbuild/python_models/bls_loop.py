"""The draft-target speculation loop of `tensorrt_llm_bls`, free of Triton: plain dataclasses and two callables.

TensorRT-LLM's BLS keeps its loop (`Decoder._spec_generate` in `tensorrt_llm_bls/1/lib/decode.py`) apart from
the Triton calls (`lib/triton_decoder.py`); here too. `propose(sequence, n)` asks the draft for up to `n` tokens,
`verify(sequence, drafts, logits, out_len)` hands them to the target as draft_input_ids and returns the target's
new tokens; the BLS model supplies both as Triton calls, the tests as fakes.

One round, as NVIDIA's loop (NVIDIA/TensorRT-LLM `triton_backend/all_models/inflight_batcher_llm/tensorrt_llm_bls/
1/lib/decode.py` @4db68284, `_spec_generate`):
- n = min(K, prompt + max_tokens - current - 1): the draft never proposes past the budget (the target's own
  token makes the last one);
- the draft is asked for n tokens (request_output_len n; the BLS also sends min_tokens n);
- the target verifies the drafts with request_output_len len(drafts) + 1 (1 without drafts) and returns the
  accepted drafts plus its own next token;
- the row stops at max_tokens, at the end id (not output), at a stop word (also one spanning rounds; output, as
  TensorRT-LLM's executor outputs it: `stopCriteriaKernels.cu` updates the sequence length "up to stopped word
  (including)"), or when the target stops early (it returned fewer tokens than a full answer).

Beyond NVIDIA's loop: rows stream (`on_chunk` gets each round's decided tokens; where stop words are dropped,
`Row.keep_stop_words` false, tokens that could be the start of one are held back until a later round decides
them), the acceptance counts come from the target's
tokens compared with the drafts (no perf-metrics request needed), and a draft that refuses leaves the target to
finish the row alone (the text is always the target's; only speed depends on the draft).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np


class DraftUnavailable(Exception):
    """`propose` raises it when the draft cannot answer (an error response): the target finishes the row."""


@dataclass
class Proposal:
    """The draft's answer: its tokens (completion only) and, when asked for, their logits ([len(tokens), V])."""

    tokens: list[int]
    logits: Any = None


@dataclass
class Verdict:
    """The target's answer to one verification call: its new tokens (completion only), and how many drafts it
    accepted when the backend reported it (perf metrics); None: the loop counts them from the tokens."""

    tokens: list[int]
    accepted: int | None = None


@dataclass
class Chunk:
    """Tokens a streaming row hands on: `tokens` = row.generated[start:start + len(tokens)], decided for good."""

    start: int
    tokens: list[int]
    final: bool


Propose = Callable[[np.ndarray, int], Proposal]
"""(sequence so far [L] int32, n) -> the draft's proposal of at most n tokens."""
Verify = Callable[[np.ndarray, list[int], Any, int], Verdict]
"""(sequence so far [L] int32, draft tokens, their logits or None, request_output_len) -> the target's tokens."""


@dataclass
class Row:
    """One sequence: its prompt and limits, and what the loop made of it."""

    prompt: Sequence[int]
    max_tokens: int
    end_id: int | None = None
    stop_words: tuple[tuple[int, ...], ...] = ()
    keep_stop_words: bool = True  # the executor's semantics; False: a stop word is cut off with what follows
    generated: list[int] = field(default_factory=list)
    accepted: int = 0  # drafts the target accepted, over all rounds
    drafted: int = 0  # drafts proposed, over all rounds
    rounds: int = 0
    streamed: int = 0  # generated tokens already handed to on_chunk
    finish: str = ""  # length, end_id, stop_word, stopped (the target stopped early), or "" while running
    draft_error: str = ""  # why the draft stopped proposing, if it refused

    def __post_init__(self) -> None:
        self._buffer = np.zeros(len(self.prompt) + max(self.max_tokens, 0) + 1, dtype=np.int32)
        self._buffer[: len(self.prompt)] = self.prompt
        self._length = len(self.prompt)

    def sequence(self) -> np.ndarray:
        """Prompt + generated tokens as one int32 array (a view: no conversion per round)."""
        return self._buffer[: self._length]

    def _extend(self, tokens: Sequence[int]) -> None:
        self.generated.extend(tokens)
        self._set_length()

    def _truncate(self, count: int) -> None:
        del self.generated[count:]
        self._set_length()

    def _set_length(self) -> None:
        n = len(self.generated)
        self._buffer[len(self.prompt) : len(self.prompt) + n] = self.generated[:n]
        self._length = len(self.prompt) + n


def accepted_prefix(tokens: Sequence[int], drafts: Sequence[int]) -> int:
    """How many drafts the target accepted: the length of the common prefix of its tokens and the drafts. The
    target's token after the accepted drafts differs from the next draft (greedy: it is the target's argmax where
    the draft disagreed; rejection sampling: drawn from the residual distribution, which has no mass there)."""
    count = 0
    for token, draft in zip(tokens, drafts, strict=False):
        if token != draft:
            break
        count += 1
    return count


def stop_word_end(generated: Sequence[int], words: tuple[tuple[int, ...], ...],
                  since: int) -> tuple[int, int] | None:
    """(start, end) of the first stop word in `generated` that ends after index `since`, if any (a word that
    spans rounds ends in the newer round, so searching from the round's start finds it)."""
    for end in range(since + 1, len(generated) + 1):
        for word in words:
            if word and end >= len(word) and tuple(generated[end - len(word) : end]) == word:
                return end - len(word), end
    return None


def stop_word_prefix(generated: Sequence[int], words: tuple[tuple[int, ...], ...]) -> int:
    """The length of the longest tail of `generated` that is the beginning (not all) of a stop word: tokens
    that a later round may turn into a stop word, so they must not be streamed yet."""
    longest = 0
    for word in words:
        for size in range(min(len(word) - 1, len(generated)), longest, -1):
            if tuple(generated[len(generated) - size :]) == word[:size]:
                longest = size
                break
    return longest


PLAIN_ROUND_TOKENS = 4
"""Tokens the target generates in the first plain round after a speculative one (K 0 this round: the load-aware
schedule turned speculation off, or the draft refused), or fewer where the most a plain round may make is fewer:
rounds, not the rest of the answer in one call, so a streaming row still streams and K is asked again after each of
them (a request speculates again once the load falls)."""

PLAIN_ROUND_MAX_TOKENS = 8
"""Each further plain round in a row doubles, up to this many tokens: the default of the BLS's `plain_round_tokens`
parameter (`speculative.plain_round_tokens` in a spec). A round is one call to the target, and between two calls the
row is out of the target's running batch until the next one arrives (about one engine step), so a round of n tokens
makes at most n tokens per n + 1 steps; longer rounds lose less of plain decoding's rate but hand on coarser chunks
and ask K less often (docs/methods/draft-target.md has what each made on the demo deployment)."""

PLAIN_ROUND_PARAMETER = "plain_round_tokens"
"""The BLS parameter (config.pbtxt) that sets the most tokens of a plain round."""


def plain_round_most(value: str | None) -> int:
    """The most tokens of a plain round, from the BLS's `plain_round_tokens` parameter (unset or empty:
    PLAIN_ROUND_MAX_TOKENS); ValueError naming the parameter when it is not a whole number of at least 1."""
    if value is None or not value.strip():
        return PLAIN_ROUND_MAX_TOKENS
    try:
        most = int(value)
    except ValueError:
        most = 0
    if most < 1:
        raise ValueError(f"parameter {PLAIN_ROUND_PARAMETER} = {value!r}: the most tokens of a plain round must be a "
                         "whole number of at least 1 (1 streams every token of a round without speculation)")
    return most


def plain_round_len(rounds: int, plain_run: int, most: int = PLAIN_ROUND_MAX_TOKENS) -> int:
    """Tokens a plain round asks of the target: one in a row's first round (`rounds` 0: its prefill, so the first
    response comes as soon as plain decoding's), else PLAIN_ROUND_TOKENS (at most `most`) doubled for each of the
    `plain_run` plain rounds just before it, at most `most`."""
    if rounds == 0:
        return 1
    first = min(PLAIN_ROUND_TOKENS, most)
    return min(first << min(plain_run, most.bit_length()), most)


def speculate(row: Row, k: int | Callable[[], int], propose: Propose, verify: Verify, *,
              on_chunk: Callable[[Chunk], None] | None = None,
              cancelled: Callable[[], bool] | None = None,
              plain_round_max: int = PLAIN_ROUND_MAX_TOKENS) -> bool:
    """Run rounds until the row is finished (True) or `cancelled()` says the client went away (False: nothing
    final was handed on). `k` is the draft length, or a callable asked every round but the first (load-aware
    speculation, `specbuild.runtime.schedule`). The first round is the target alone for one token, as an engine
    makes a request's first token (NVIDIA's loop drafts first: the first response then waits for a draft call and
    a verification); a later round with k = 0 (or after the draft refused) is the target alone for
    `plain_round_len` tokens (at most `plain_round_max`), handed on like any round."""
    if plain_round_max < 1:
        raise ValueError(f"plain rounds need plain_round_max >= 1 (got {plain_round_max})")
    if row.max_tokens <= 0:
        row.finish = "length"
        _hand_on(row, on_chunk, final=True)
        return True
    draft_len = k if callable(k) else (lambda fixed=k: fixed)
    refused = False
    plain_run = 0  # plain rounds since the last speculative one
    while True:
        remaining = row.max_tokens - len(row.generated)
        k = 0 if refused or row.rounds == 0 else draft_len()
        n = min(k, remaining - 1)
        drafts: list[int] = []
        logits = None
        if n > 0:
            try:
                proposal = propose(row.sequence(), n)
            except DraftUnavailable as err:
                row.draft_error = str(err) or "the draft refused"
                refused = True
                k = n = 0
            else:
                drafts = [int(t) for t in proposal.tokens[:n]]
                logits = proposal.logits
                if logits is not None and len(logits) > len(drafts):
                    logits = logits[len(logits) - len(drafts) :]  # the rows of the kept drafts (decode.py: last n)
        # With speculation one round verifies the drafts (+1: the target's own token); without, the target
        # generates a plain round, and K is asked again after it.
        if k > 0:
            out_len, plain_run = len(drafts) + 1, 0
        else:
            out_len = min(remaining, plain_round_len(row.rounds, plain_run, plain_round_max))
            plain_run += int(row.rounds > 0)
        verdict = verify(row.sequence(), drafts, logits if drafts else None, out_len)
        raw = [int(t) for t in verdict.tokens[:out_len]]
        accepted = accepted_prefix(raw, drafts) if verdict.accepted is None else min(verdict.accepted, len(drafts))
        row.rounds += 1
        row.accepted += accepted
        row.drafted += len(drafts)
        # A full answer holds the accepted drafts and one token of the target's own (or all out_len tokens when
        # the target continued); fewer means the target stopped (end id, stop word, its own limits).
        expected = accepted + 1 if drafts and len(raw) <= accepted + 1 else out_len
        stopped = len(raw) < expected
        start = len(row.generated)
        new = raw
        if row.end_id is not None and row.end_id in new:
            new = new[: new.index(row.end_id)]
            row.finish = "end_id"
        row._extend(new)
        word = stop_word_end(row.generated, row.stop_words, start)
        if word is not None:
            row._truncate(word[1] if row.keep_stop_words else word[0])
            row.finish = "stop_word"
        if len(row.generated) >= row.max_tokens:
            row._truncate(row.max_tokens)
            row.finish = row.finish or "length"
        if stopped and not row.finish:
            row.finish = "stopped"
        done = bool(row.finish)
        if not done and cancelled is not None and cancelled():
            return False
        _hand_on(row, on_chunk, final=done)
        if done:
            return True


def _hand_on(row: Row, on_chunk: Callable[[Chunk], None] | None, *, final: bool) -> None:
    """Stream what is decided: everything once the row is done, else all but a possible stop-word beginning."""
    if on_chunk is None:
        return
    held = 0 if final or row.keep_stop_words else stop_word_prefix(row.generated, row.stop_words)
    end = len(row.generated) - held
    end = max(end, row.streamed)
    if end > row.streamed or final:
        chunk = Chunk(row.streamed, row.generated[row.streamed : end], final)
        row.streamed = end
        on_chunk(chunk)
