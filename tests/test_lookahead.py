"""Lookahead decoding in the reference runtime: the algorithm's pieces on hand-made inputs, and greedy output.

What users rely on: Lookahead output is plain greedy output token for token (one prompt, batches of different
lengths, requests joining a running engine with their own (w, n, g)), in fewer target forwards; a step's block
never holds more tokens than TensorRT-LLM sizes an engine for (W, N, G); a request's (w, n, g) beyond the
engine's is refused with TensorRT-LLM's rule. The pure pieces (window, pool, candidate choice, mask) are checked
without a model; greedy equality on small random checkpoints (fast tier) and on the trained demo target, where
the tokens per target forward are measured and printed.
"""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from rich.console import Console

from specbuild.contracts import lookahead as la
from specbuild.contracts.lookahead import speculative_resource
from specbuild.convert.pipeline import ConvertRequest, convert_checkpoint
from specbuild.runtime.generation import generate
from specbuild.runtime.lookahead import (
    LookaheadConfig,
    LookaheadState,
    NgramPool,
    StepPlan,
    Window,
    advance_window,
    ancestors,
    depths,
    initial_window,
    max_block_tokens,
    new_ngrams,
    plan_step,
    tree_mask,
    verify,
)
from specbuild.runtime.lookahead_decoding import generate_lookahead
from specbuild.runtime.model import CausalLM
from specbuild.runtime.sampling import SamplingParams
from specbuild.runtime.schedule import DraftSchedule
from specbuild.runtime.sequence import StopCriteria
from specbuild.runtime.serving import EngineRequest, ServingEngine
from tests.tiny_models import make_model, save_model

W3N3G2 = LookaheadConfig(3, 3, 2)


# -- the tree a step feeds -------------------------------------------------------------------------------------


def test_depths_ancestors_and_mask_follow_the_parents() -> None:
    parents = [-1, 0, 1, 0, 3]  # root; a chain 1-2; a chain 3-4
    assert depths(parents) == [0, 1, 2, 1, 2]
    assert ancestors(parents, 4) == [3, 4]
    assert ancestors(parents, 0) == []
    assert tree_mask(parents).int().tolist() == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0],
        [1, 0, 0, 1, 0],
        [1, 0, 0, 1, 1],
    ]


def full_window() -> Window:
    """W=3, N=3: three columns of N-1=2 tokens; column 0's first slot (90) stands for the last accepted token."""
    return Window((), ((90, 11), (20, 21), (30, 31)))


def test_a_full_window_and_candidates_make_the_papers_block() -> None:
    """Column 0 starts at the last accepted token (7), the other columns' first tokens continue that chain (one
    causal line of first guesses), each column's later token hangs under its first; each candidate is a chain
    under the root. Positions are the depths, so column c's tokens sit at offsets c .. c+N-2."""
    pool = NgramPool(3, capacity=2)
    for ngram in ([7, 40, 41], [7, 50, 51], [8, 60, 61]):
        pool.add(ngram)
    plan = plan_step(full_window(), pool, 7, W3N3G2)
    assert plan.tokens == [7, 11, 20, 21, 30, 31, 50, 51, 40, 41]
    assert plan.parents == [-1, 0, 0, 2, 2, 4, 0, 6, 0, 8]
    assert depths(plan.parents) == [0, 1, 1, 2, 2, 3, 1, 2, 1, 2]
    assert plan.column_ends == [1, 3, 5]
    assert plan.candidates == [[6, 7], [8, 9]]  # the most recent n-gram first
    mask = tree_mask(plan.parents)
    assert mask[5].nonzero().flatten().tolist() == [0, 2, 4, 5]  # column 2's second token: root, first guesses
    assert mask[9].nonzero().flatten().tolist() == [0, 8, 9]  # a candidate sees the root and itself
    # A full step is exactly TensorRT-LLM's maxDecodingTokens for (W, N, G) (decodingConfig.cpp).
    assert len(plan.tokens) == max_block_tokens(W3N3G2) == speculative_resource(3, 3, 2).max_decoding_tokens


@pytest.mark.parametrize("config", [(2, 2, 1), (4, 3, 4), (5, 4, 5), (7, 7, 7), (1, 5, 3)])
def test_no_block_is_larger_than_the_engine_tensorrt_llm_sizes(config: tuple[int, int, int]) -> None:
    """Through the filling steps and after, with the pool full for the key: never more than maxDecodingTokens,
    and exactly that once the window is full."""
    cfg = LookaheadConfig(*config)
    state = LookaheadState(list(range(100, 140)), cfg)
    for step in range(cfg.ngram_size + 2):
        for g in range(cfg.verification_set_size):
            state.pool.add([5, *[200 + g] * (cfg.ngram_size - 1)])
        plan = state.plan(5)
        assert len(plan.tokens) <= max_block_tokens(cfg)
        if state.window.levels == cfg.ngram_size - 1:
            assert len(plan.tokens) == max_block_tokens(cfg)
        state.after(plan, [step] * len(plan.tokens), [1, 2, 5])


def test_a_filling_window_keeps_each_column_where_the_full_window_has_it() -> None:
    """N=4: the first step has N-3 lead seeds and one guess per column; each step the columns grow by the model's
    choice at their last token, the lead one shorter, so column c always ends at offset c+N-2 (where a full
    window's column ends), and the third step's window is full and shifts up, giving one n-gram per column."""
    cfg = LookaheadConfig(2, 4, 1)
    window = initial_window([1, 2, 3, 4, 5, 6], cfg)
    assert window == Window((1,), ((3,), (5,)))
    pool = NgramPool(4, 1)
    offsets = []
    for step in range(3):
        plan = plan_step(window, pool, 9, cfg)
        offsets.append([depths(plan.parents)[end] for end in plan.column_ends])
        choices = [100 * (step + 1) + i for i in range(len(plan.tokens))]
        window, ngrams = advance_window(window, plan, choices, cfg)
        if step == 0:
            assert window == Window((), ((3, 102), (5, 103)))
            assert ngrams == []
        if step == 1:
            assert window == Window((), ((3, 102, 202), (5, 103, 204)))
        if step == 2:
            # column 0's first slot is the last accepted token (9) in the n-gram; the columns shift up
            assert ngrams == [[9, 102, 202, 302], [5, 103, 204, 305]]
            assert window == Window((), ((102, 202, 302), (103, 204, 305)))
    assert offsets == [[2, 3], [2, 3], [2, 3]]


# -- verification ----------------------------------------------------------------------------------------------


def plan_with(candidates: list[list[int]]) -> StepPlan:
    """A block of the root (token 7) and chains of candidate tokens only."""
    tokens, parents, indices = [7], [-1], []
    for tail in candidates:
        chain, parent = [], 0
        for token in tail:
            tokens.append(token)
            parents.append(parent)
            parent = len(tokens) - 1
            chain.append(parent)
        indices.append(chain)
    return StepPlan(tokens, parents, [0], indices)


def test_verify_keeps_the_longest_agreeing_prefix_and_the_models_next_token() -> None:
    plan = plan_with([[1, 2, 3], [1, 2, 4], [5, 6, 7]])  # block: 7 | 1 2 3 | 1 2 4 | 5 6 7
    # the model's choice after each block token: after 7 -> 1; in candidate 0: after 1 -> 2, after 2 -> 9 (so 3 is
    # rejected); in candidate 1: after 1 -> 2, after 2 -> 4, after 4 -> 8
    choices = [1, 2, 9, 0, 2, 4, 8, 0, 0, 0]
    assert verify(plan, choices) == ([0, 4, 5, 6], [1, 2, 4, 8])
    assert verify(plan, [3] + [0] * 9) == ([0], [3])  # nothing agrees: one token, the model's own
    tie = plan_with([[1, 5], [1, 6]])
    assert verify(tie, [1, 0, 0, 0, 0]) == ([0, 1], [1, 0])  # a tie goes to the first (most recent) candidate


# -- the pool --------------------------------------------------------------------------------------------------


def test_the_pool_keeps_the_most_recent_distinct_tails_per_key() -> None:
    pool = NgramPool(3, capacity=2)
    pool.add_text([1, 2, 3, 1, 4, 5, 1, 2, 3])  # 1 -> (2, 3), (4, 5), then (2, 3) again: most recent
    assert pool.candidates(1, 5) == [(2, 3), (4, 5)]
    pool.add([1, 6, 7])  # capacity 2: the oldest, (4, 5), leaves
    assert pool.candidates(1, 5) == [(6, 7), (2, 3)]
    assert pool.candidates(1, 1) == [(6, 7)]
    assert pool.candidates(99, 3) == []
    with pytest.raises(ValueError, match="3-gram pool got 2 tokens"):
        pool.add([1, 2])


def test_new_ngrams_are_those_ending_in_the_steps_tokens() -> None:
    assert new_ngrams([1, 2, 3, 4], [5, 6], 3) == [[3, 4, 5], [4, 5, 6]]
    assert new_ngrams([4], [5, 6, 7], 3) == [[4, 5, 6], [5, 6, 7]]
    assert new_ngrams([], [5], 3) == []


def test_bad_configurations_are_refused_with_the_rule() -> None:
    with pytest.raises(ValueError, match="ngramSize=1 requires windowSize=1"):
        LookaheadState([1, 2], LookaheadConfig(3, 1, 0))
    with pytest.raises(ValueError, match="N = 1 drafts nothing"):
        initial_window([1, 2], LookaheadConfig(1, 1, 0))


# -- on a model ------------------------------------------------------------------------------------------------

VOCAB = 64


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> CausalLM:
    """A small random llama; a 64-token vocabulary makes its greedy text repeat, so n-grams do get accepted."""
    root = tmp_path_factory.mktemp("lookahead")
    hf = save_model(make_model("llama", seed=11, dtype=torch.float32, vocab_size=VOCAB), root / "hf")
    convert_checkpoint(ConvertRequest("target", hf, root / "target", "float32"), console=Console(quiet=True))
    return CausalLM.from_checkpoint(root / "target")


def random_prompts(n: int, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (int(torch.randint(1, 20, (1,), generator=gen)),), generator=gen).tolist()
            for _ in range(n)]


@pytest.mark.parametrize("config", [(2, 2, 1), (4, 3, 4), (5, 4, 3), (1, 4, 2)])
def test_tiny_model_greedy_equals_plain(tiny: CausalLM, config: tuple[int, int, int]) -> None:
    prompts = random_prompts(5)
    stop = StopCriteria(max_new_tokens=40)
    plain = generate(tiny, prompts, stop=stop)
    spec = generate_lookahead(tiny, prompts, LookaheadConfig(*config), stop=stop)
    assert spec.output_ids == plain.output_ids
    assert sum(spec.stats.accepted_by_position) > 0  # the accepted paths' K/V was compacted, and still exact
    assert spec.stats.target_forwards < plain.stats.target_forwards


def test_requests_with_their_own_w_n_g_join_a_running_engine(tiny: CausalLM) -> None:
    """One engine built for (5, 4, 4); requests arrive a step apart with smaller (w, n, g), none (the engine's),
    plain ones (speculate=False, a sampling request), stop words, bad words and min_tokens; each output equals the
    request served by a plain engine."""
    prompts = random_prompts(6, seed=3)
    requests = [
        EngineRequest(prompts[0], 30),
        EngineRequest(prompts[1], 25, lookahead=LookaheadConfig(2, 2, 1)),
        EngineRequest(prompts[2], 30, lookahead=LookaheadConfig(3, 3, 2), stop_words=((prompts[2][0],),)),
        EngineRequest(prompts[3], 30, speculate=False, bad_words=((prompts[3][-1],),), min_tokens=5, end_id=0),
        EngineRequest(prompts[4], 20, lookahead=LookaheadConfig(5, 4, 4), bad_words=((7, 8),), min_tokens=10,
                      end_id=1),
        EngineRequest(prompts[5], 20, SamplingParams(temperature=0.8, seed=4)),
    ]
    engine = ServingEngine(tiny, max_batch=4, max_seq_len=96, lookahead=LookaheadConfig(5, 4, 4))
    handles = []
    for request in requests:
        handles.append(engine.submit(request))
        engine.step()
    engine.run_until_idle()
    for request, handle in zip(requests, handles, strict=True):
        plain = ServingEngine(tiny, max_batch=1, max_seq_len=96)
        expected = plain.submit(dataclasses.replace(request, lookahead=None))
        plain.run_until_idle()
        assert handle.wait(0).tokens == expected.wait(0).tokens
        assert handle.wait(0).reason == expected.wait(0).reason
    with pytest.raises(ValueError, match=r"lookahead requires setup g \(5\) <= max_g \(4\)"):
        engine.submit(EngineRequest(prompts[0], 5, lookahead=LookaheadConfig(4, 3, 5)))
    with pytest.raises(ValueError, match="not made for Lookahead"):
        ServingEngine(tiny, max_batch=1, max_seq_len=32).submit(
            EngineRequest(prompts[0], 5, lookahead=LookaheadConfig(2, 2, 1)))
    with pytest.raises(ValueError, match="windowSize requires >= 1"):
        ServingEngine(tiny, max_batch=1, max_seq_len=32, lookahead=LookaheadConfig(0, 3, 1))
    with pytest.raises(ValueError, match="greedy"):
        generate_lookahead(tiny, prompts, LookaheadConfig(2, 2, 1), SamplingParams(temperature=0.5))


def test_a_schedule_turns_lookahead_off_under_load_and_on_again_when_it_falls(tiny: CausalLM) -> None:
    """The reference-only Lookahead schedule (as Medusa's tree schedule): {1: full, 2: 0} runs windows for a
    sequence alone, none while two are active, and windows again once the second has finished; both outputs still
    equal plain greedy."""
    config = LookaheadConfig(2, 2, 4)
    full = la.max_draft_len(*config)
    engine = ServingEngine(tiny, max_batch=2, max_seq_len=96, lookahead=config,
                           schedule=DraftSchedule({1: full, 2: 0}, full))
    prompts = random_prompts(2, seed=5)
    drafted_at: list[tuple[int, int]] = []  # (active sequences in the step, the long request's drafts so far)
    long = EngineRequest(prompts[0], 40, on_update=lambda u: drafted_at.append((len(engine.active), u.draft_tokens)))
    short = EngineRequest(prompts[1], 8)
    handles = [engine.submit(long)]
    for _ in range(3):  # alone: windows
        engine.step()
    handles.append(engine.submit(short))
    engine.run_until_idle()
    for request, handle in zip((long, short), handles, strict=True):
        plain = ServingEngine(tiny, max_batch=1, max_seq_len=96)
        expected = plain.submit(dataclasses.replace(request, on_update=None))
        plain.run_until_idle()
        assert handle.wait(0).tokens == expected.wait(0).tokens
    growth = {1: 0, 2: 0}
    for (_, before), (active, after) in itertools.pairwise(drafted_at):
        growth[active] += after - before
    assert [active for active, _ in drafted_at].count(2) >= 3, "the two requests never shared enough steps"
    assert growth[2] == 0, "Lookahead drafted while the schedule had it off"
    first_together = next(i for i, (active, _) in enumerate(drafted_at) if active == 2)
    assert drafted_at[first_together][1] > 0, "no windows while the long request was alone at first"
    last_together = max(i for i, (active, _) in enumerate(drafted_at) if active == 2)
    assert drafted_at[-1][1] > drafted_at[last_together][1], "windows did not resume when the load fell"


# -- the trained demo target -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def demo_target(demo_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> CausalLM:
    out = tmp_path_factory.mktemp("lookahead-demo") / "target"
    convert_checkpoint(ConvertRequest("target", demo_models["target"], out, "float32"), console=Console(quiet=True))
    return CausalLM.from_checkpoint(out)


@pytest.fixture(scope="module")
def demo_prompts(demo_models: dict[str, Path]) -> list[list[int]]:
    from specbuild.demo.models import heldout_texts
    from specbuild.tokenizer import load_tokenizer

    tok = load_tokenizer(demo_models["target"])
    ids = [tok.encode(t, add_special_tokens=False) for t in heldout_texts()[:6]]
    return [ids[0][:9], ids[1][:23], ids[2][:4], ids[3][:16], ids[4][:12], ids[5][:30]]


@pytest.mark.parametrize("config", [(4, 3, 4), (2, 2, 1), (7, 5, 7)], ids=["default", "smallest", "large"])
def test_demo_greedy_equals_plain_and_takes_fewer_forwards(
    demo_target: CausalLM, demo_prompts: list[list[int]], config: tuple[int, int, int]
) -> None:
    """The batch (different prompt lengths) and each prompt alone equal plain greedy; tokens per target forward
    is measured per prompt alone (a batch's forward serves every row) and printed. Only > 1.0 is required: what
    the trained weights reach is the benchmark's to report."""
    stop = StopCriteria(max_new_tokens=48)
    cfg = LookaheadConfig(*config)
    plain = generate(demo_target, demo_prompts, stop=stop)
    assert generate_lookahead(demo_target, demo_prompts, cfg, stop=stop).output_ids == plain.output_ids
    tokens = forwards = 0
    for prompt, expected in zip(demo_prompts, plain.output_ids, strict=True):
        alone = generate_lookahead(demo_target, [prompt], cfg, stop=stop)
        assert alone.output_ids[0] == expected
        tokens += alone.stats.generated_tokens
        forwards += alone.stats.target_forwards
    print(f"lookahead {config}: {tokens / forwards:.2f} tokens per target forward on the demo text (plain: 1.00)")
    assert tokens / forwards > 1.0


def test_the_reference_backend_serves_decoding_mode_lookahead(tiny: CausalLM) -> None:
    """The tensorrt_llm model deployed with decoding_mode lookahead and its three parameters (what deploy writes)
    runs Lookahead steps; requests with and without their own lookahead_* inputs answer exactly what a plain
    instance answers, in fewer forwards."""
    from specbuild.contracts import lookahead as la
    from specbuild.python_models.llm_backend import Backend, BackendConfig

    server = LookaheadConfig(4, 3, 4)
    info = type("Engine", (), dict(max_input_len=32, max_seq_len=96, max_draft_len=la.max_draft_len(*server),
                                   vocab_size=VOCAB, gather_context_logits=False, gather_generation_logits=False))()
    params = {"decoding_mode": "lookahead", **{name: str(v) for name, v in zip(la.PARAMETERS, server, strict=True)}}
    lookahead_config, _ = BackendConfig.from_model(params, {}, info)
    plain_config, _ = BackendConfig.from_model({}, {}, info)
    assert lookahead_config.lookahead_config == server
    engines = {
        "lookahead": ServingEngine(tiny, max_batch=4, max_seq_len=96, max_draft_len=info.max_draft_len,
                                   lookahead=lookahead_config.lookahead_config),
        "plain": ServingEngine(tiny, max_batch=4, max_seq_len=96, max_draft_len=info.max_draft_len),
    }
    answers: dict[str, list[list[int]]] = {}
    for name, engine in engines.items():
        backend = Backend(lookahead_config if name == "lookahead" else plain_config, engine,
                          log_info=lambda line: None, log_warn=lambda line: None)
        engine.start()
        try:
            answers[name] = []
            for i, prompt in enumerate(random_prompts(4, seed=7)):
                inputs = {"input_ids": np.array([prompt], dtype=np.int32),
                          "input_lengths": np.array([[len(prompt)]], dtype=np.int32),
                          "request_output_len": np.array([[40]], dtype=np.int32)}
                if name == "lookahead" and i % 2:
                    for input_name, value in zip(la.PARAMETERS, (3, 3, 2), strict=True):
                        inputs[input_name] = np.array([[value]], dtype=np.int32)
                sent: list[Any] = []
                job = backend.receive(inputs, None, sent.append)
                assert job is not None
                backend.run(job, timeout=60)
                assert sent[-1].error is None, sent[-1].error
                answers[name].append(sent[-1].outputs["output_ids"].reshape(-1).tolist())
        finally:
            engine.stop()
    assert answers["lookahead"] == answers["plain"]
    assert engines["lookahead"].stats.forwards < engines["plain"].stats.forwards
