"""The draft-target loop of tensorrt_llm_bls (specbuild.python_models.bls_loop) and the LLM calls the BLS builds for it
(specbuild.python_models.bls_calls), with fake propose/verify callables and a fake C++ backend: no server, no models.

The fake backend answers as NVIDIA's `tensorrtllm` backend does (model_instance_state.cc `fillTritonResponse`),
by the presence rules of specbuild.contracts.triton_backend: an output only when the request set its flag (and
asked for it), the ten perf metrics whenever return_perf_metrics is set, and an error for an output the model's
config does not declare. The loop's rules are those of NVIDIA's `_spec_generate` (NVIDIA/TensorRT-LLM
`triton_backend/all_models/inflight_batcher_llm/tensorrt_llm_bls/1/lib/decode.py` @4db68284).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pytest

from specbuild.contracts.triton_backend import PERF_METRICS, TENSORRT_LLM
from specbuild.python_models.bls_calls import (
    BlsRequest,
    Preprocessed,
    RequestError,
    RowCalls,
    chain_inputs,
    created_outputs,
)
from specbuild.python_models.bls_loop import (
    PLAIN_ROUND_MAX_TOKENS,
    PLAIN_ROUND_TOKENS,
    Chunk,
    DraftUnavailable,
    Proposal,
    Row,
    Verdict,
    plain_round_len,
    plain_round_most,
    speculate,
    stop_word_prefix,
)

VOCAB = 50


def target_next(sequence: Sequence[int]) -> int:
    """The fake target's greedy next token."""
    return (sum(sequence[-3:]) * 7 + len(sequence)) % VOCAB


def draft_next(sequence: Sequence[int]) -> int:
    """The fake draft: agrees with the target except at every fifth length."""
    token = target_next(sequence)
    return (token + 1) % VOCAB if len(sequence) % 5 == 0 else token


def greedy(model: Callable[[Sequence[int]], int], sequence: Sequence[int], n: int) -> list[int]:
    seq = list(sequence)
    for _ in range(n):
        seq.append(model(seq))
    return seq[len(sequence):]


class Fakes:
    """propose/verify over the fake models, recording every call."""

    def __init__(self, draft: Callable[[Sequence[int]], int] = draft_next) -> None:
        self.draft = draft
        self.proposed: list[int] = []  # n of each propose call
        self.verified: list[tuple[list[int], int]] = []  # (drafts, out_len) of each verify call

    def propose(self, sequence: np.ndarray, n: int) -> Proposal:
        self.proposed.append(n)
        return Proposal(greedy(self.draft, sequence.tolist(), n))

    def verify(self, sequence: np.ndarray, drafts: list[int], logits: Any, out_len: int) -> Verdict:
        self.verified.append((list(drafts), out_len))
        return Verdict(verify_greedy(sequence.tolist(), drafts, out_len))


def verify_greedy(sequence: list[int], drafts: Sequence[int], out_len: int) -> list[int]:
    """What a greedy target returns for draft_input_ids: the accepted drafts and its own next token; without
    drafts, out_len tokens of its own."""
    if not drafts:
        return greedy(target_next, sequence, out_len)
    out = []
    for draft in drafts:
        token = target_next(sequence + out)
        if token != draft:
            return [*out, token]
        out.append(draft)
    return [*out, target_next(sequence + out)]


PROMPT = [5, 9, 2]


def test_acceptance_bookkeeping_and_the_text_is_the_targets() -> None:
    """Accepted drafts are counted from the target's tokens against the drafts (no perf metrics needed), and the
    result is exactly the target's greedy continuation (decode.py `_spec_generate`: the target decides)."""
    fakes = Fakes()
    row = Row(PROMPT, max_tokens=20)
    assert speculate(row, 4, fakes.propose, fakes.verify)
    assert row.generated == greedy(target_next, PROMPT, 20)
    assert row.drafted == sum(len(d) for d, _ in fakes.verified)
    expected_accepted = 0
    sequence = list(PROMPT)
    for drafts, _ in fakes.verified:
        tokens = verify_greedy(sequence, drafts, len(drafts) + 1)
        expected_accepted += len(tokens) - 1 if drafts else 0
        sequence += tokens
    assert row.accepted == expected_accepted
    assert 0 < row.accepted < row.drafted  # the fake draft is wrong now and then
    assert row.finish == "length" and row.rounds == len(fakes.verified)


def test_k_is_limited_by_the_remaining_budget() -> None:
    """n = min(K, prompt + max_tokens - current - 1) (decode.py @4db68284 `_spec_generate`): the draft never
    proposes past max_tokens, and the last token is the target's own (request_output_len 1, no drafts). The first
    round is the target alone for one token."""
    fakes = Fakes(draft=target_next)  # a perfect draft: every round accepts all
    row = Row(PROMPT, max_tokens=8)
    assert speculate(row, 4, fakes.propose, fakes.verify)
    assert fakes.proposed == [4, 1]
    assert [out_len for _, out_len in fakes.verified] == [1, 5, 2]
    assert row.generated == greedy(target_next, PROMPT, 8)
    fakes = Fakes(draft=target_next)
    row = Row(PROMPT, max_tokens=7)
    assert speculate(row, 4, fakes.propose, fakes.verify)
    assert fakes.proposed == [4] and fakes.verified[-1] == ([], 1)
    assert len(row.generated) == 7


def test_max_tokens_reached_mid_round() -> None:
    """A round that would end past max_tokens ends at max_tokens, even if the target answers more than it was
    asked for."""
    def generous_verify(sequence: np.ndarray, drafts: list[int], logits: Any, out_len: int) -> Verdict:
        return Verdict(greedy(target_next, sequence.tolist(), out_len + 3))

    row = Row(PROMPT, max_tokens=5)
    assert speculate(row, 4, Fakes(draft=target_next).propose, generous_verify)
    assert row.generated == greedy(target_next, PROMPT, 5) and row.finish == "length"


def test_a_draft_returning_fewer_tokens_and_one_returning_none() -> None:
    """The target verifies what the draft returned (request_output_len = drafts + 1; 1 without drafts, as
    triton_decoder.py `_get_llm_tensors_from_request` sets it)."""
    answers = iter([[], None])

    def short_propose(sequence: np.ndarray, n: int) -> Proposal:
        tokens = next(answers, None)
        return Proposal(greedy(draft_next, sequence.tolist(), 1) if tokens is None else tokens)

    seen: list[tuple[list[int], int]] = []

    def verify(sequence: np.ndarray, drafts: list[int], logits: Any, out_len: int) -> Verdict:
        seen.append((list(drafts), out_len))
        return Verdict(verify_greedy(sequence.tolist(), drafts, out_len))

    row = Row(PROMPT, max_tokens=6)
    assert speculate(row, 4, short_propose, verify)
    assert seen[:2] == [([], 1), ([], 1)]  # the first round (the target alone), then the empty proposal's
    assert all(len(d) == 1 and out_len == 2 for d, out_len in seen[2:-1])
    assert row.generated == greedy(target_next, PROMPT, 6)


def test_a_draft_that_refuses_leaves_the_target_to_finish_alone() -> None:
    """A draft error (DraftUnavailable) does not fail the request: the target generates the rest alone, in plain
    rounds (so a streaming row still streams)."""
    calls = {"n": 0}

    def refusing(sequence: np.ndarray, n: int) -> Proposal:
        calls["n"] += 1
        if calls["n"] > 1:
            raise DraftUnavailable("tensorrt_llm_draft: Prompt length (300) exceeds maximum input length (256)")
        return Proposal(greedy(draft_next, sequence.tolist(), n))

    fakes = Fakes()
    row = Row(PROMPT, max_tokens=20)
    assert speculate(row, 4, refusing, fakes.verify)
    assert row.generated == greedy(target_next, PROMPT, 20)
    assert "exceeds" in row.draft_error and calls["n"] == 2
    assert fakes.verified[0] == ([], 1) and fakes.verified[1][0]  # the first round, then the one that drafted
    made = 1 + len(verify_greedy([*PROMPT, *row.generated[:1]], *fakes.verified[1]))
    plain = fakes.verified[2:]  # then the target alone in growing plain rounds, never drafted again
    assert all(drafts == [] for drafts, _ in plain)
    assert [out_len for _, out_len in plain] == _plain_rounds(20 - made)


def _plain_rounds(tokens: int) -> list[int]:
    """The plain rounds that make `tokens` after a speculative round: PLAIN_ROUND_TOKENS, doubling up to
    PLAIN_ROUND_MAX_TOKENS, the last cut by the budget."""
    rounds: list[int] = []
    size = PLAIN_ROUND_TOKENS
    while tokens > 0:
        rounds.append(min(size, tokens))
        tokens -= rounds[-1]
        size = min(2 * size, PLAIN_ROUND_MAX_TOKENS)
    return rounds


def test_plain_rounds_grow_from_one_token_to_the_most() -> None:
    """A row's first round asks one token; a run of plain rounds asks PLAIN_ROUND_TOKENS, then twice as many each
    round, never more than PLAIN_ROUND_MAX_TOKENS (a long run: no overflow)."""
    assert plain_round_len(0, 0) == 1 and plain_round_len(0, 5) == 1
    sizes = [plain_round_len(3, run) for run in range(200)]
    assert sizes[0] == PLAIN_ROUND_TOKENS and sizes == sorted(sizes) and sizes[-1] == PLAIN_ROUND_MAX_TOKENS
    assert all(b in (a, min(2 * a, PLAIN_ROUND_MAX_TOKENS)) for a, b in itertools.pairwise(sizes))
    assert [plain_round_len(1, run, most=6) for run in range(4)] == [PLAIN_ROUND_TOKENS, 6, 6, 6]
    assert [plain_round_len(1, run, most=2) for run in range(3)] == [2, 2, 2]  # fewer than PLAIN_ROUND_TOKENS
    assert [plain_round_len(1, run, most=1) for run in range(3)] == [1, 1, 1]
    with pytest.raises(ValueError, match="plain_round_max"):
        speculate(Row(PROMPT, max_tokens=4), 0, Fakes().propose, Fakes().verify, plain_round_max=0)


def test_the_most_tokens_of_a_plain_round_is_set_per_deployment() -> None:
    """`plain_round_max` caps every plain round (1: every token its own round and response, as plain decoding
    streams) and the text stays the target's greedy text; the BLS reads it from its `plain_round_tokens`
    parameter, whose unset value is PLAIN_ROUND_MAX_TOKENS and whose bad values name it."""
    for most in (1, 2, 16):
        fakes = Fakes()
        chunks: list[Chunk] = []
        row = Row(PROMPT, max_tokens=30)
        assert speculate(row, 0, fakes.propose, fakes.verify, on_chunk=chunks.append, plain_round_max=most)
        assert row.generated == greedy(target_next, PROMPT, 30)
        sizes = [out_len for _, out_len in fakes.verified]
        assert sizes[0] == 1 and max(sizes) == most and sum(sizes) == 30, (most, sizes)
        assert [len(c.tokens) for c in chunks if not c.final] == sizes[:len(sizes) - 1]
    assert plain_round_most(None) == plain_round_most("") == PLAIN_ROUND_MAX_TOKENS
    assert plain_round_most("1") == 1 and plain_round_most(" 12 ") == 12
    for bad in ("0", "-3", "four", "2.5"):
        with pytest.raises(ValueError, match="plain_round_tokens"):
            plain_round_most(bad)


def _switching_schedule(ks: Sequence[int]) -> tuple[Callable[[], int], list[int]]:
    """A forced load-aware schedule: round i gets ks[i] (the last one after that); the K of each round asked."""
    asked: list[int] = []

    def draft_len() -> int:
        asked.append(ks[min(len(asked), len(ks) - 1)])
        return asked[-1]

    return draft_len, asked


def test_a_streaming_row_streams_and_speculates_again_when_the_schedule_turns_k_back_on() -> None:
    """Speculation switched off after round 2 (the load rose) and on again from round 5 (it fell): the row keeps
    streaming in plain rounds of the target alone (more than one response before its last), the draft is asked
    again as soon as K is back, and the text is the target's greedy text (issue 22: K = 0 used to be the whole rest
    of the answer in one non-streaming call, and the row never speculated again). The next run of plain rounds
    starts short again."""
    fakes = Fakes()
    chunks: list[Chunk] = []
    draft_len, asked = _switching_schedule([4, 0, 0, 4, 0, 4])
    row = Row(PROMPT, max_tokens=40)
    assert speculate(row, draft_len, fakes.propose, fakes.verify, on_chunk=chunks.append)
    assert row.generated == greedy(target_next, PROMPT, 40)
    assert len(asked) == len(fakes.verified) - 1 == row.rounds - 1  # K asked every round after the first
    kinds = ["draft" if drafts else "plain" for drafts, _ in fakes.verified]
    assert kinds[:7] == ["plain", "draft", "plain", "plain", "draft", "plain", "draft"]
    assert set(kinds[6:]) == {"draft"}
    plain = [out_len for drafts, out_len in fakes.verified[1:] if not drafts]
    assert plain == [PLAIN_ROUND_TOKENS, 2 * PLAIN_ROUND_TOKENS, PLAIN_ROUND_TOKENS]
    assert len([c for c in chunks if not c.final]) > 1
    assert [t for c in chunks for t in c.tokens] == row.generated


def test_k_zero_from_the_start_streams_its_first_token_alone() -> None:
    """Without speculation at all the first round asks the target for one token (the first response comes as soon
    as plain decoding's), later ones grow from PLAIN_ROUND_TOKENS; every chunk but the last is handed on before
    the end."""
    fakes = Fakes()
    chunks: list[Chunk] = []
    row = Row(PROMPT, max_tokens=30)
    assert speculate(row, 0, fakes.propose, fakes.verify, on_chunk=chunks.append)
    assert [out_len for _, out_len in fakes.verified] == [1, *_plain_rounds(29)]
    assert fakes.proposed == []
    assert [len(c.tokens) for c in chunks if not c.final][:1] == [1]
    assert row.generated == greedy(target_next, PROMPT, 30)


def test_end_id_and_a_target_that_stops_early() -> None:
    """The end id ends the row and is not part of it; a target that returns only accepted drafts (no token of
    its own) has stopped (decode.py: the sequence stopped changing)."""
    end = greedy(target_next, PROMPT, 20)[6]
    row = Row(PROMPT, max_tokens=20, end_id=end)
    assert speculate(row, 4, Fakes().propose, Fakes().verify)
    full = greedy(target_next, PROMPT, 20)
    assert row.generated == full[: full.index(end)] and row.finish == "end_id"

    def stopping(sequence: np.ndarray, drafts: list[int], logits: Any, out_len: int) -> Verdict:
        if not drafts:  # the first round: the target's own token
            return Verdict(greedy(target_next, sequence.tolist(), out_len))
        return Verdict(list(drafts[:2]))

    row = Row(PROMPT, max_tokens=20)
    assert speculate(row, 4, Fakes(draft=target_next).propose, stopping)
    assert row.finish == "stopped" and row.rounds == 2 and len(row.generated) == 3  # 1 + two accepted drafts


def _stream(row: Row, k: int, fakes: Fakes) -> list[Chunk]:
    chunks: list[Chunk] = []
    assert speculate(row, k, fakes.propose, fakes.verify, on_chunk=chunks.append)
    return chunks


def test_a_stop_word_spanning_rounds_ends_the_row_with_the_word() -> None:
    """TensorRT-LLM's executor outputs the stop word (stopCriteriaKernels.cu: sequence length "up to stopped
    word (including)"), and the loop does the same for a word the LLM could not see whole: its first token ends
    one round, its second starts the next (each target call sees only its own tokens)."""
    full = greedy(target_next, PROMPT, 30)
    word = (full[3], full[4])  # rounds of 1, then K + 1 = 3 tokens with a perfect draft: the word spans 4 | 5
    row = Row(PROMPT, max_tokens=30, stop_words=(word,))
    chunks = _stream(row, 2, Fakes(draft=target_next))
    assert row.generated == full[:5] and row.finish == "stop_word" and row.rounds == 3
    assert [t for c in chunks for t in c.tokens] == full[:5] and chunks[-1].final


def test_a_dropped_stop_word_spanning_rounds_was_never_streamed() -> None:
    """Where stop words are dropped (keep_stop_words false), a stop word whose first token ends one round and
    whose second starts the next: the first part is held back when its round is streamed, and dropped when the
    next round completes the word."""
    full = greedy(target_next, PROMPT, 30)
    word = (full[3], full[4])
    row = Row(PROMPT, max_tokens=30, stop_words=(word,), keep_stop_words=False)
    chunks = _stream(row, 2, Fakes(draft=target_next))
    cut = next(i for i in range(len(full) - 1) if (full[i], full[i + 1]) == word)
    assert cut == 3  # the word's first occurrence is the one across the round boundary
    assert row.generated == full[:cut] and row.finish == "stop_word"
    assert [t for c in chunks for t in c.tokens] == full[:cut]
    assert chunks[-1].final and not any(c.final for c in chunks[:-1])
    assert all(c.start + len(c.tokens) <= cut for c in chunks)  # the word's first token was never handed on


def test_a_held_back_stop_word_beginning_is_streamed_once_the_word_does_not_follow() -> None:
    """Held-back tokens that turn out not to begin the stop word are streamed with the next round."""
    full = greedy(target_next, PROMPT, 12)
    word = (full[3], (full[4] + 1) % VOCAB)  # begins at the end of round 2 (1 + 3 tokens), never completed
    row = Row(PROMPT, max_tokens=12, stop_words=(word,), keep_stop_words=False)
    chunks = _stream(row, 2, Fakes(draft=target_next))
    assert chunks[0].tokens == full[:1] and chunks[1].tokens == full[1:3]  # full[3] held back
    assert chunks[2].start == 3 and chunks[2].tokens[0] == full[3]
    assert [t for c in chunks for t in c.tokens] == full
    assert stop_word_prefix([1, 2, 3], ((3, 4), (9,))) == 1 and stop_word_prefix([1, 2], ((2, 3, 4), (1, 2, 5))) == 2


def test_a_cancelled_row_stops_without_a_final_chunk() -> None:
    chunks: list[Chunk] = []
    row = Row(PROMPT, max_tokens=30)
    assert not speculate(row, 2, Fakes().propose, Fakes().verify, on_chunk=chunks.append, cancelled=lambda: True)
    assert row.rounds == 1 and not any(c.final for c in chunks)


# -- the calls the BLS builds, against a fake C++ backend -----------------------------------------------------


class BackendError(RuntimeError):
    pass


class FakeBackend:
    """NVIDIA's C++ tensorrtllm backend as the contract describes it, over a fake model (`model_next`): the
    outputs it creates follow each output's `presence` rule; a requested output the config does not declare is
    refused (Triton core); a created one the config does not declare fails the response (fillTritonResponse ->
    "Error encountered while populating response")."""

    def __init__(self, declared: set[str], model_next: Callable[[Sequence[int]], int]) -> None:
        self.declared, self.model_next = declared, model_next
        self.calls: list[tuple[dict[str, np.ndarray], list[str]]] = []

    def __call__(self, inputs: Mapping[str, np.ndarray], requested: Sequence[str]) -> dict[str, np.ndarray]:
        self.calls.append((dict(inputs), list(requested)))
        for name in requested:
            if name not in self.declared:
                raise BackendError(f"unexpected inference output '{name}' for model 'tensorrt_llm'")
        flags = {name for name, value in inputs.items() if value.dtype == bool and value.size and value.all()}
        created = set()
        for tensor in TENSORRT_LLM.outputs:
            if tensor.extra is not None:
                continue
            rule = tensor.presence
            if rule == "always" or (rule == "flag" and tensor.flag in flags and tensor.name in requested) or \
                    (rule == "flag_unchecked" and tensor.flag in flags):
                created.add(tensor.name)
        undeclared = sorted(created - self.declared)
        if undeclared:
            raise BackendError(f"Error encountered while populating response: Could not get response output for "
                               f"output tensor {undeclared[0]}: unexpected inference output")
        sequence = inputs["input_ids"][0, : int(inputs["input_lengths"].reshape(-1)[0])].tolist()
        out_len = int(inputs["request_output_len"].reshape(-1)[0])
        drafts = inputs["draft_input_ids"][0].tolist() if "draft_input_ids" in inputs else []
        if drafts:
            tokens = []
            for draft in drafts:
                token = self.model_next(sequence + tokens)
                if token != draft:
                    break
                tokens.append(draft)
            accepted = len(tokens)
            tokens.append(self.model_next(sequence + tokens))
        else:
            tokens, accepted = greedy(self.model_next, sequence, out_len), 0
        if not bool(inputs.get("exclude_input_in_output", np.array([[False]])).reshape(-1)[0]):
            tokens = sequence + tokens
        answer = {"output_ids": np.array([[tokens]], dtype=np.int32),
                  "sequence_length": np.array([[len(tokens)]], dtype=np.int32),
                  "generation_logits": np.eye(VOCAB, dtype=np.float32)[tokens][None, None],
                  "total_accepted_draft_tokens": np.array([[accepted]], dtype=np.int32),
                  "total_draft_tokens": np.array([[len(drafts)]], dtype=np.int32)}
        for name in PERF_METRICS:
            answer.setdefault(name, np.zeros((1, 1), dtype=np.int64))
        return {name: answer.get(name, np.zeros((1, 1), np.float32)) for name in created if name in requested}


NVIDIA_DECLARED = {t.name for t in TENSORRT_LLM.nvidia_outputs()}
ACCEPTANCE = {"acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens"}
WITHOUT_SEVEN_PERF = NVIDIA_DECLARED - (set(PERF_METRICS) - ACCEPTANCE)


def bls_request(**extra: np.ndarray) -> BlsRequest:
    return BlsRequest({"text_input": np.array([[b"a prompt"]], dtype=object),
                       "max_tokens": np.array([[12]], dtype=np.int32), **extra})


def preprocessed(prompt: Sequence[int] = PROMPT) -> Preprocessed:
    return Preprocessed({
        "input_ids": np.array([prompt], dtype=np.int32), "input_lengths": np.array([[len(prompt)]], np.int32),
        "decoder_input_ids": np.array([[0]], np.int32), "bad_words_list": np.zeros((1, 2, 0), np.int32),
        "stop_words_list": np.zeros((1, 2, 0), np.int32), "embedding_bias": np.zeros((1, 0), np.float32),
        "end_id": np.array([[VOCAB + 1]], np.int32), "pad_id": np.array([[0]], np.int32)})


def run_row(request: BlsRequest, target: FakeBackend, draft: FakeBackend, *, use_draft_logits: bool,
            k: int = 3) -> tuple[Row, RowCalls]:
    """The BLS's `_speculate` for one row, with the fake backends in place of the Triton calls."""
    calls = RowCalls.build(request, preprocessed(), 0, use_draft_logits=use_draft_logits,
                           declared=target.declared, draft_declared=draft.declared)

    def propose(sequence: np.ndarray, n: int) -> Proposal:
        return calls.proposal(draft(calls.draft_call(sequence, n), calls.draft_outputs), n)

    def verify(sequence: np.ndarray, drafts: list[int], logits: Any, out_len: int) -> Verdict:
        return calls.verdict(target(calls.target_call(sequence, drafts, logits, out_len), calls.target_outputs))

    row = Row(PROMPT, max_tokens=12, end_id=VOCAB + 1)
    assert speculate(row, k, propose, verify)
    return row, calls


def test_verification_needs_no_perf_metrics_the_target_config_may_not_declare() -> None:
    """The C++ backend adds all ten perf outputs to every response of a request with return_perf_metrics,
    requested or not (model_instance_state.cc fillTritonResponse; contract `flag_unchecked`): a BLS that sets it
    on every verification, as specbuild's did to read total_accepted_draft_tokens, fails every speculative
    request on a target config without the seven other perf outputs. The BLS counts acceptance itself."""
    target = FakeBackend(WITHOUT_SEVEN_PERF, target_next)
    draft = FakeBackend(WITHOUT_SEVEN_PERF, draft_next)
    row, calls = run_row(bls_request(), target, draft, use_draft_logits=False)
    assert row.generated == greedy(target_next, PROMPT, 12)
    assert 0 < row.accepted <= row.drafted
    assert all("return_perf_metrics" not in inputs for inputs, _ in target.calls + draft.calls)
    assert not set(calls.target_outputs) & set(PERF_METRICS)
    # the fake is strict: the old verification inputs (return_perf_metrics always true) fail on this config
    old = {**calls.target_call(np.array(PROMPT, np.int32), [1], None, 2), "return_perf_metrics": np.array([[True]])}
    with pytest.raises(BackendError, match="populating response"):
        target(old, [*calls.target_outputs, "total_accepted_draft_tokens"])


def test_perf_metrics_only_when_the_client_asked_and_then_the_backends_count() -> None:
    target = FakeBackend(NVIDIA_DECLARED, target_next)
    draft = FakeBackend(NVIDIA_DECLARED, draft_next)
    row, calls = run_row(bls_request(return_perf_metrics=np.array([True])), target, draft, use_draft_logits=False)
    assert set(PERF_METRICS) <= set(calls.target_outputs)
    assert all(bool(inputs["return_perf_metrics"].all()) for inputs, _ in target.calls)
    assert all("return_perf_metrics" not in inputs for inputs, _ in draft.calls)  # the draft's are not used
    assert row.generated == greedy(target_next, PROMPT, 12) and row.accepted > 0
    with pytest.raises(RequestError, match="does not declare"):
        RowCalls.build(bls_request(return_perf_metrics=np.array([True])), preprocessed(), 0, use_draft_logits=False,
                       declared=WITHOUT_SEVEN_PERF)


def test_draft_generation_logits_only_when_asked_for() -> None:
    """The backend creates generation_logits only with return_generation_logits true (contract `flag`); the
    draft call sets it to use_draft_logits (triton_decoder.py `_get_llm_tensors_from_request`, draft branch)
    and reads the logits only then: specbuild's BLS asked for them and read them on every draft call
    (`None.as_numpy()` on the C++ backend). The strict fake returns only what it created."""
    target = FakeBackend(NVIDIA_DECLARED, target_next)
    draft = FakeBackend(NVIDIA_DECLARED, draft_next)
    row, calls = run_row(bls_request(), target, draft, use_draft_logits=False)
    assert "generation_logits" not in calls.draft_outputs
    assert all(not inputs["return_generation_logits"].any() for inputs, _ in draft.calls)
    assert all("draft_logits" not in inputs for inputs, _ in target.calls)
    assert row.generated == greedy(target_next, PROMPT, 12)

    target = FakeBackend(NVIDIA_DECLARED, target_next)
    draft = FakeBackend(NVIDIA_DECLARED, draft_next)
    row, calls = run_row(bls_request(use_draft_logits=np.array([True])), target, draft, use_draft_logits=True)
    assert "generation_logits" in calls.draft_outputs
    with_drafts = [inputs for inputs, _ in target.calls if "draft_input_ids" in inputs]
    assert with_drafts and all(inputs["draft_logits"].shape == (1, inputs["draft_input_ids"].shape[1], VOCAB)
                               for inputs in with_drafts)


def test_the_draft_call_as_nvidias_bls_sends_it() -> None:
    """decode.py @4db68284 `_spec_generate` + triton_decoder.py @07f3e442: the draft gets min_tokens = n
    (the client's min_tokens overwritten), request_output_len = n, return_generation_logits = use_draft_logits,
    return_context_logits false; the target gets no min_tokens, request_output_len = drafts + 1, both logits
    flags false; both get the sampling inputs under the LLM's names and (specbuild) exclude_input_in_output."""
    request = bls_request(min_tokens=np.array([[7]], np.int32), top_k=np.array([[1]], np.int32),
                          temperature=np.array([[0.0]], np.float32), stream=np.array([[True]]))
    pre = preprocessed()
    pre.tensors["stop_words_list"] = np.array([[[7, 8], [2, -1]]], dtype=np.int32)
    calls = RowCalls.build(request, pre, 0, use_draft_logits=False)
    sequence = np.array(PROMPT, dtype=np.int32)
    draft = calls.draft_call(sequence, 3)
    assert draft["min_tokens"].tolist() == [[3]] and draft["request_output_len"].tolist() == [[3]]
    assert draft["return_generation_logits"].tolist() == [[False]] and draft["return_context_logits"].tolist() == \
        [[False]]
    assert draft["runtime_top_k"].tolist() == [[1]] and "top_k" not in draft and "streaming" not in draft
    assert draft["input_ids"].tolist() == [PROMPT] and draft["input_lengths"].tolist() == [[3]]
    target = calls.target_call(sequence, [4, 5], None, 3)
    assert "min_tokens" not in target and target["request_output_len"].tolist() == [[3]]
    assert target["draft_input_ids"].tolist() == [[4, 5]] and "draft_logits" not in target
    assert target["exclude_input_in_output"].tolist() == [[True]] == draft["exclude_input_in_output"].tolist()
    assert not target["return_generation_logits"].any() and not target["return_context_logits"].any()
    assert target["end_id"].tolist() == [[VOCAB + 1]] and target["stop_words_list"].tolist() == [[[7, 8], [2, -1]]]
    # empty word lists and bias are no-ops for the backend (zero length ignored): not carried every round
    assert "bad_words_list" not in target and "embedding_bias" not in draft


def test_the_plain_call_passes_only_what_the_client_sent() -> None:
    """triton_decoder.py `_get_llm_tensors`: preprocessing's tensors, the request's optional inputs under the
    LLM's names only when sent, request_output_len <- max_tokens, explicit return_context/generation_logits."""
    inputs = chain_inputs(bls_request(top_p=np.array([[0.5]], np.float32), length_penalty=np.array([[1.0]],
                                                                                                 np.float32),
                                      return_log_probs=np.array([True])), preprocessed())
    assert inputs["runtime_top_p"].tolist() == [[0.5]] and "len_penalty" in inputs
    assert inputs["return_log_probs"].shape == (1, 1)  # a reshaped [B] input goes on as [B, 1]
    for absent in ("runtime_top_k", "temperature", "seed", "streaming", "exclude_input_in_output", "min_tokens",
                   "return_perf_metrics", "beam_width", "decoder_input_lengths"):
        assert absent not in inputs
    assert inputs["request_output_len"].tolist() == [[12]]
    assert inputs["return_context_logits"].tolist() == [[False]] == inputs["return_generation_logits"].tolist()
    assert created_outputs(inputs) == ["output_ids", "sequence_length", "cum_log_probs", "output_log_probs"]


def test_prompt_table_extra_ids_grow_with_the_sequence() -> None:
    """The backend uses prompt_table_extra_ids only when they are as long as input_ids (utils.cc; with a prompt
    table and KV-cache reuse it then refuses the request), so each round's call carries them for the whole
    sequence: the prompt's, then 0 for generated tokens (vocabulary ids, preprocessing/1/model.py)."""
    pre = preprocessed()
    pre.tensors["prompt_table_extra_ids"] = np.array([[7, 0, 7]], dtype=np.uint64)
    calls = RowCalls.build(bls_request(), pre, 0, use_draft_logits=False)
    sequence = np.array([*PROMPT, 11, 12], dtype=np.int32)
    for inputs in (calls.draft_call(sequence, 2), calls.target_call(sequence, [1], None, 2)):
        assert inputs["prompt_table_extra_ids"].tolist() == [[7, 0, 7, 0, 0]]
        assert inputs["prompt_table_extra_ids"].dtype == np.uint64


def test_a_draft_that_cannot_return_logits_proposes_without_them() -> None:
    """A draft engine built without gather_generation_logits refuses return_generation_logits (executorImpl.cpp:
    "To return generation logits, gather_generation_logits must be enabled in ExecutorConfig"): the BLS then
    drops the flag and the output, and the target verifies the drafts without draft_logits."""
    calls = RowCalls.build(bls_request(), preprocessed(), 0, use_draft_logits=True)
    assert "generation_logits" in calls.draft_outputs
    calls.drop_draft_logits()
    sequence = np.array(PROMPT, dtype=np.int32)
    assert not calls.draft_call(sequence, 2)["return_generation_logits"].any()
    assert "generation_logits" not in calls.draft_outputs
    assert "draft_logits" not in calls.target_call(sequence, [1, 2], np.zeros((2, VOCAB), np.float32), 3)
