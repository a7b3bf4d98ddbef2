"""The serving engine: in-flight batching, per-sequence KV rows, prefix reuse, mixed batches, stop rules.

Every expectation is the same model's output on another path (each request served alone, or plain greedy
decoding), on small random checkpoints made here, so the tests need neither the trained demo models nor a server.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from rich.console import Console

from specbuild.convert.pipeline import ConvertRequest, convert_checkpoint
from specbuild.medusa.tree import load_choices
from specbuild.runtime.model import CausalLM
from specbuild.runtime.sampling import SamplingParams
from specbuild.runtime.schedule import DraftSchedule
from specbuild.runtime.serving import EngineRequest, ServingEngine, Update
from tests.test_runtime_model import add_medusa_heads
from tests.tiny_models import make_model, save_model

VOCAB = 1000
CHOICES = load_choices("mc_sim_7b_top8")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("engine")
    hf = save_model(make_model("llama", seed=3, dtype=torch.float32), root / "hf")
    quiet = Console(quiet=True)
    convert_checkpoint(ConvertRequest("target", hf, root / "target", "float32"), console=quiet)
    convert_checkpoint(ConvertRequest("medusa", hf, root / "medusa", "float32"), console=quiet)
    add_medusa_heads(root / "medusa", num_heads=3, num_layers=1, seed=5)
    return {"target": root / "target", "medusa": root / "medusa"}


@pytest.fixture(scope="module")
def model(checkpoints: dict[str, Path]) -> CausalLM:
    return CausalLM.from_checkpoint(checkpoints["target"])


@pytest.fixture(scope="module")
def medusa(checkpoints: dict[str, Path]) -> CausalLM:
    return CausalLM.from_checkpoint(checkpoints["medusa"])


def prompts(n: int, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(4, VOCAB, (int(torch.randint(2, 30, (1,), generator=gen)),), generator=gen).tolist()
            for _ in range(n)]


def alone(model: CausalLM, request: EngineRequest, **engine: object) -> list[int]:
    """The request served by a fresh engine with nothing else to do."""
    eng = ServingEngine(model, max_batch=1, max_seq_len=128, **engine)  # type: ignore[arg-type]
    handle = eng.submit(request)
    eng.run_until_idle()
    return handle.wait(0).tokens


def test_requests_that_arrive_while_others_run_join_the_batch(model: CausalLM) -> None:
    """Eight requests submitted one step apart: the engine runs them together (fewer forwards than serving them
    one after another, and several rows per forward), and each output equals that request served alone."""
    requests = [EngineRequest(p, 20) for p in prompts(8)]
    engine = ServingEngine(model, max_batch=8, max_seq_len=128)
    handles = []
    for request in requests:
        handles.append(engine.submit(request))
        engine.step()  # the earlier ones are decoding when the next one arrives
    engine.run_until_idle()
    serial_forwards = sum(len(alone(model, r)) for r in requests)  # one forward per token, served alone
    assert engine.stats.forwards < serial_forwards / 3
    assert engine.stats.rows_forwarded / engine.stats.forwards > 3
    assert [h.wait(0).tokens for h in handles] == [alone(model, r) for r in requests]


def test_a_background_engine_serves_concurrent_submitters(model: CausalLM) -> None:
    engine = ServingEngine(model, max_batch=4, max_seq_len=128)
    engine.start()
    try:
        requests = [EngineRequest(p, 12) for p in prompts(6, seed=1)]
        results: dict[int, list[int]] = {}
        threads = [threading.Thread(target=lambda i=i, r=r: results.__setitem__(i, engine.submit(r).wait(60).tokens))
                   for i, r in enumerate(requests)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    finally:
        engine.stop()
    assert results == {i: alone(model, r) for i, r in enumerate(requests)}


def test_mixed_batch_plain_verification_and_medusa_each_equal_alone(medusa: CausalLM) -> None:
    """One Medusa engine, one batch: Medusa requests, plain ones (speculate=False), one-round verifications of
    external draft tokens (some right, some wrong), stop words, an end id, different lengths and a request
    cancelled mid-batch; every surviving output equals the same request served alone."""
    ps = prompts(7, seed=2)
    greedy = alone(medusa, EngineRequest(ps[2], 10, speculate=False), medusa_choices=CHOICES)
    drafts = [*greedy[:2], (greedy[2] + 1) % VOCAB]  # two right guesses, then a wrong one
    stop_free = alone(medusa, EngineRequest(ps[4], 16), medusa_choices=CHOICES)
    word = tuple(stop_free[5:7])
    stop_at = next(i for i in range(len(stop_free)) if tuple(stop_free[i : i + 2]) == word)
    requests = [
        EngineRequest(ps[0], 16),
        EngineRequest(ps[1], 9, speculate=False),
        EngineRequest(ps[2], 4, draft_tokens=drafts, one_round=True),
        EngineRequest(ps[3], 14, end_id=stop_free[0]),
        EngineRequest(ps[4], 16, stop_words=(word,)),
        EngineRequest(ps[5], 30, speculate=False),
        EngineRequest(ps[6], 30),
    ]
    engine = ServingEngine(medusa, max_batch=8, max_seq_len=128, max_draft_len=4, medusa_choices=CHOICES)
    handles = [engine.submit(r) for r in requests]
    for _ in range(3):
        engine.step()
    handles[5].cancel()
    engine.run_until_idle()
    results = [h.wait(0) for h in handles]
    assert results[5].reason == "cancelled"
    expected = [alone(medusa, r, medusa_choices=CHOICES, max_draft_len=4) for r in requests]
    for index, (result, want) in enumerate(zip(results, expected, strict=True)):
        if index != 5:
            assert result.tokens == want, index
    assert results[2].tokens == greedy[:3] and results[2].accepted_draft_tokens == 2 and results[2].reason == "round"
    assert results[4].tokens == stop_free[:stop_at] and results[4].reason == "stop_word"
    assert results[0].draft_tokens > 0, "the Medusa request speculated"
    assert results[1].draft_tokens == 0, "the plain one did not"


def test_medusa_greedy_output_is_plain_greedy_output(medusa: CausalLM) -> None:
    for prompt in prompts(3, seed=4):
        assert alone(medusa, EngineRequest(prompt, 24), medusa_choices=CHOICES) == alone(
            medusa, EngineRequest(prompt, 24, speculate=False), medusa_choices=CHOICES)


def test_a_repeated_prefix_is_reused_not_recomputed(model: CausalLM) -> None:
    """A BLS sends the whole sequence every round: the second request finds the first one's row."""
    prompt = prompts(1, seed=5)[0]
    engine = ServingEngine(model, max_batch=2, max_seq_len=128)
    first = engine.submit(EngineRequest(prompt, 8))
    engine.run_until_idle()
    continued = prompt + first.wait(0).tokens
    second = engine.submit(EngineRequest(continued, 8))
    engine.run_until_idle()
    assert second.reused_tokens == len(continued) - 1
    assert second.wait(0).tokens == alone(model, EngineRequest(continued, 8))


def test_a_dropped_stop_word_is_never_streamed(model: CausalLM) -> None:
    """Tokens that could start a stop word wait until it is decided: the stream only ever grows."""
    prompt = prompts(1, seed=6)[0]
    free = alone(model, EngineRequest(prompt, 20))
    word = tuple(free[8:11])
    first = next(i for i in range(len(free)) if tuple(free[i : i + 3]) == word)
    streamed: list[int] = []
    done = alone(model, EngineRequest(prompt, 20, stop_words=(word,),
                                      on_update=lambda u: streamed.extend(u.tokens)))
    assert done == free[:first] == streamed
    kept = alone(model, EngineRequest(prompt, 20, stop_words=(word,), include_stop_words=True))
    assert kept == free[: first + 3], "TensorRT-LLM's semantics: the stop word is part of the output"


def test_the_schedule_shrinks_the_medusa_tree_with_load(medusa: CausalLM) -> None:
    """TensorRT-LLM's draft_len_schedule: 4 active sequences get the tree's first 3 paths, and none above
    max_concurrency; the output stays the plain greedy output either way."""
    ps = prompts(4, seed=7)
    for schedule, proposed in ((DraftSchedule({1: 8, 3: 3}, 8), 3), (DraftSchedule({1: 8}, 8, max_concurrency=2), 0)):
        engine = ServingEngine(medusa, max_batch=4, max_seq_len=128, medusa_choices=CHOICES, schedule=schedule)
        handles = [engine.submit(EngineRequest(p, 12)) for p in ps]
        engine.step()
        engine.step()  # prefill, then the first tree step with all four active
        assert engine.tree_for(4) is None if proposed == 0 else engine.tree_for(4).num_nodes == proposed
        engine.run_until_idle()
        assert [h.wait(0).tokens for h in handles] == [
            alone(medusa, EngineRequest(p, 12, speculate=False), medusa_choices=CHOICES) for p in ps]
    with pytest.raises(ValueError, match="batch size 1 must draft the full length 8"):
        DraftSchedule({1: 4}, 8)


def test_guesses_from_a_shallower_load_verify_a_tree_cut_to_their_depth(medusa: CausalLM) -> None:
    """Under load the heads run only as deep as that load's tree (the first 3 paths: 2 deep); when the load falls
    the next step's tree is the full one (3 deep), and a row whose guesses came from 2 heads verifies the full tree
    cut to depth 2 for that step. Outputs stay each request's plain greedy output."""
    ps = prompts(4, seed=9)
    lengths = [3, 4, 5, 16]  # three finish early: the last request's load falls from 4 to 1
    engine = ServingEngine(medusa, max_batch=4, max_seq_len=128, medusa_choices=CHOICES,
                           schedule=DraftSchedule({1: 8, 3: 3}, 8))
    assert engine.tree_for(4).max_depth == 2 and engine.tree_for(1).max_depth == 3
    heads_asked: list[int | None] = []
    widths: list[int] = []  # tokens per row of each tree step's forward
    heads, forward = medusa.medusa_logits, medusa.forward

    def counted_heads(hidden: torch.Tensor, n: int | None = None) -> torch.Tensor:
        heads_asked.append(n)
        return heads(hidden, n)

    def counted_forward(ids: torch.Tensor, *args: object, **kwargs: object) -> object:
        if kwargs.get("tree_mask") is not None:  # a tree step (prompts run without one)
            widths.append(ids.shape[1])
        return forward(ids, *args, **kwargs)

    medusa.medusa_logits, medusa.forward = counted_heads, counted_forward  # type: ignore[method-assign]
    try:
        handles = [engine.submit(EngineRequest(p, n)) for p, n in zip(ps, lengths, strict=True)]
        engine.run_until_idle()
    finally:
        del medusa.medusa_logits, medusa.forward
    assert [h.wait(0).tokens for h in handles] == [
        alone(medusa, EngineRequest(p, n, speculate=False), medusa_choices=CHOICES)
        for p, n in zip(ps, lengths, strict=True)]
    assert {2, 3} <= set(heads_asked), "the heads ran as deep as each load's tree"
    cut = 1 + sum(len(path) <= 2 for path in CHOICES)  # the full tree within depth 2, with its root
    assert cut in widths, "the step after the load fell verified the full tree cut to the guesses' depth"


def test_seeded_sampling_is_reproducible_and_bad_requests_are_refused(model: CausalLM) -> None:
    prompt = prompts(1, seed=8)[0]
    params = SamplingParams(temperature=0.9, top_k=50, seed=11)
    assert alone(model, EngineRequest(prompt, 16, params)) == alone(model, EngineRequest(prompt, 16, params))
    engine = ServingEngine(model, max_batch=1, max_seq_len=32, max_draft_len=2)
    for request, message in ((EngineRequest([], 4), "at least one prompt token"),
                             (EngineRequest([VOCAB], 4), r"must be in \[0, 1000\)"),
                             (EngineRequest([5] * 30, 4), "max_seq_len 32"),
                             (EngineRequest([5], 4, draft_tokens=[1, 2, 3]), "max_draft_len 2")):
        with pytest.raises(ValueError, match=message):
            engine.submit(request)


def _engine_of(kind: str, model: CausalLM, medusa: CausalLM) -> ServingEngine:
    from specbuild.runtime.proposers import ModelProposer, NGramConfig, NGramProposer

    if kind == "medusa":
        return ServingEngine(medusa, max_batch=6, max_seq_len=128, medusa_choices=CHOICES)
    if kind == "lookahead":
        return ServingEngine(model, max_batch=6, max_seq_len=128, lookahead=(3, 3, 2))
    proposer = NGramProposer(NGramConfig(3, max_matching_ngram_size=2)) if kind == "ngram" else ModelProposer(model, 3)
    return ServingEngine(model, max_batch=6, max_seq_len=128, proposer=proposer)


@pytest.mark.parametrize("cached", [False, True], ids=["new-prompt", "prefix-hit"])
@pytest.mark.parametrize("kind", ["draft", "ngram", "medusa", "lookahead"])
def test_a_request_arriving_under_load_gets_its_first_token_before_the_others_speculate(
        kind: str, cached: bool, model: CausalLM, medusa: CausalLM) -> None:
    """Time to first token under load, by counted forwards: a request that joins while others are speculating
    gets its first token from the step's first target forward, one of its own (no draft forward before it), and
    then decodes in the same step's batch with the others; every output is still the one it gets served alone.
    The same when the cache holds its whole prompt but the last token (`prefix-hit`: a prompt served before, as
    a benchmark's or a chat's repeated prompts are): a cache hit must not make the first token wait for the
    drafts and the tree, later than a miss's."""
    engine = _engine_of(kind, model, medusa)
    drafts = (lambda: engine.proposer.stats.forwards) if engine.proposer is not None else (lambda: 0)
    ps = prompts(4, seed=7)
    if cached:
        engine.submit(EngineRequest(ps[3], 2))
        engine.run_until_idle()
    running = [engine.submit(EngineRequest(p, 24)) for p in ps[:3]]
    for _ in range(3):
        engine.step()
    first: list[tuple[int, int, int]] = []
    received: list[int] = []
    before = (engine.stats.forwards, drafts(), engine.stats.rows_forwarded)

    def on_update(update: Update) -> None:
        if not first:
            first.append((engine.stats.forwards, drafts(), engine.stats.rows_forwarded))
        received.extend(update.tokens)

    reused = engine.stats.reused_tokens
    late = engine.submit(EngineRequest(ps[3], 12, on_update=on_update))
    engine.step()
    assert engine.stats.reused_tokens - reused == (len(ps[3]) - 1 if cached else 0)
    assert first, "the late request got nothing in the step it joined"
    forwards, draft_forwards, rows = first[0]
    assert forwards == before[0] + 1 and draft_forwards == before[1]  # its own forward came first
    assert rows == before[2] + 1  # and carried no running row
    assert len(received) >= 2  # it decoded in the same step too
    engine.run_until_idle()
    served = [h.wait(0).tokens for h in [*running, late]]
    engine_kwargs: dict[str, object] = {}
    if kind == "medusa":
        engine_kwargs = {"medusa_choices": CHOICES}
    elif kind == "lookahead":
        engine_kwargs = {"lookahead": (3, 3, 2)}
    base = medusa if kind == "medusa" else model
    assert served == [alone(base, EngineRequest(p, n), **engine_kwargs)
                      for p, n in zip(ps, (24, 24, 24, 12), strict=True)]


@pytest.mark.parametrize("cached", [False, True], ids=["new-prompt", "prefix-hit"])
@pytest.mark.parametrize("kind", ["draft", "ngram"])
def test_a_request_arriving_while_the_proposer_drafts_is_prefilled_before_verification(
        kind: str, cached: bool, model: CausalLM, medusa: CausalLM) -> None:
    """Time to first token under a closed load: a request that arrives while the step's proposer is drafting
    (a finished request's successor) gets its first token from a forward of its own before that step's
    verification, not after it, and then joins the verification forward without drafts; every output is still
    the one it gets served alone. A prompt the cache holds but for its last token (`prefix-hit`) has nothing
    left to wait for once the drafts are made: it joins the verification forward at once, and the step costs no
    forward of its own for it."""
    engine = _engine_of(kind, model, medusa)
    assert engine.proposer is not None
    ps = prompts(4, seed=13)
    if cached:
        engine.submit(EngineRequest(ps[3], 2))
        engine.run_until_idle()
    running = [engine.submit(EngineRequest(p, 24)) for p in ps[:3]]
    for _ in range(3):
        engine.step()
    first: list[int] = []
    received: list[int] = []

    def on_update(update: Update) -> None:
        if not first:
            first.append(engine.stats.forwards)
        received.extend(update.tokens)

    propose = engine.proposer.propose
    late: list = []

    def propose_then_arrive(seqs, ks):  # type: ignore[no-untyped-def]
        out = propose(seqs, ks)
        if not late:
            late.append(engine.submit(EngineRequest(ps[3], 12, on_update=on_update)))
        return out

    engine.proposer.propose = propose_then_arrive  # type: ignore[method-assign]
    before = engine.stats.forwards
    engine.step()
    assert late and first, "the request that arrived during drafting got nothing in that step"
    assert first[0] == before + 1  # its own forward, or the verification for a prefix hit
    assert engine.stats.forwards == before + (1 if cached else 2)
    assert len(received) >= (1 if cached else 2)  # a new prompt decoded in the verification too
    assert engine.stats.admitted_mid_step == 1
    engine.run_until_idle()
    served = [h.wait(0).tokens for h in [*running, late[0]]]
    assert served == [alone(model, EngineRequest(p, n)) for p, n in zip(ps, (24, 24, 24, 12), strict=True)]


def test_a_continuation_shares_the_steps_forward(model: CausalLM) -> None:
    """A request whose prompt the cache holds but for its newest token (the BLS's next round, with its drafts) is
    no new prompt: it joins the running sequences' forward (one forward that step, not one of its own), and its
    answer is still the one it gets alone."""
    engine = ServingEngine(model, max_batch=6, max_seq_len=128, max_draft_len=3)
    ps = prompts(3, seed=11)
    first = engine.submit(EngineRequest(ps[0], 6))
    engine.run_until_idle()
    running = [engine.submit(EngineRequest(p, 20)) for p in ps[1:]]
    engine.step()
    engine.step()
    sequence = [*ps[0], *first.wait(0).tokens]
    drafts = alone(model, EngineRequest(sequence, 3))  # the target's own continuation: drafts it accepts
    before = engine.stats.forwards
    follow = engine.submit(EngineRequest(sequence, 4, draft_tokens=drafts[:3]))
    engine.step()
    assert engine.stats.forwards == before + 1
    assert follow.reused_tokens == len(sequence) - 1  # all but its newest token came from the cache
    engine.run_until_idle()
    assert follow.wait(0).tokens == alone(model, EngineRequest(sequence, 4, draft_tokens=drafts[:3]),
                                          max_draft_len=3)
    assert [h.wait(0).tokens for h in running] == [alone(model, EngineRequest(p, 20)) for p in ps[1:]]


def test_a_failing_update_callback_ends_its_request_with_an_error_and_the_engine_goes_on(
        model: CausalLM, caplog: pytest.LogCaptureFixture) -> None:
    """The update callback is the caller's code on the engine's thread (a Triton model building its response).
    When it raises, that request ends with an error update naming the failure; one failing on its last update keeps
    its result and is logged. The background engine keeps serving the others, whose outputs equal each served
    alone, and serves requests submitted afterwards."""
    first, second, third, later = (EngineRequest(p, 12) for p in prompts(4, seed=7))
    seen: list[Update] = []

    def breaks_on_second_token(update: Update) -> None:
        seen.append(update)
        if len(seen) == 2:
            raise RuntimeError("the response could not be built")

    def breaks_on_the_last(update: Update) -> None:
        if update.finished:
            raise RuntimeError("the last response could not be sent")

    engine = ServingEngine(model, max_batch=4, max_seq_len=128)
    engine.start()
    try:
        failing = engine.submit(EngineRequest(first.prompt, 12, on_update=breaks_on_second_token))
        other = engine.submit(second)
        last_fails = engine.submit(EngineRequest(third.prompt, 12, on_update=breaks_on_the_last))
        failed, served, finished = failing.wait(60), other.wait(60), last_fails.wait(60)
        after = engine.submit(later).wait(60)
    finally:
        engine.stop()
    assert failed.reason == "error" and failed.error is not None
    assert "RuntimeError: the response could not be built" in failed.error
    assert seen[-1].finished and seen[-1].reason == "error" and len(seen) == 3
    assert finished.reason == "length" and finished.tokens == alone(model, third)
    assert "the last response could not be sent" in caplog.text
    assert served.tokens == alone(model, second) and after.tokens == alone(model, later)
