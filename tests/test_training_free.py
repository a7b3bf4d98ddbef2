"""SA (suffix-automaton) drafting in the serving engine, TensorRT-LLM's PyTorch-backend successor of Lookahead.

What a user relies on: the automaton finds what TensorRT-LLM's does (the earliest earlier occurrence of the longest
suffix, or of the n-gram sizes n..1 - checked against a brute-force search, since TensorRT-LLM's kernel cannot run
here: NVIDIA/TensorRT-LLM cpp/tensorrt_llm/kernels/speculativeDecoding/suffixAutomaton/suffixAutomaton.h
@b120c7c9); it grows with each accepted token instead of being rebuilt; served requests that run together give
exactly the target's plain greedy output; sampled outputs keep the target's distribution (a wrong acceptance rule
is caught); bad SADecodingConfig settings are refused in TensorRT-LLM's words.
"""

from __future__ import annotations

import random

import pytest

from specbuild.python_models.llmapi_model import proposer as llmapi_proposer
from specbuild.runtime.model import CausalLM
from specbuild.runtime.proposers import SAConfig, SAProposer
from specbuild.runtime.sampling import SamplingParams
from specbuild.runtime.serving import EngineRequest, ServingEngine
from specbuild.runtime.suffix_automaton import SuffixAutomaton
from tests.test_runtime_decoding import accept_everything, marginal_p_value
from tests.test_serving_proposers import TINY_VOCAB, _greedy, _prompts, target, tiny, tiny_pair  # noqa: F401

K = 3


def _earliest(text: list[int], suffix: list[int], sizes: range) -> tuple[int, int] | None:
    """Brute force: for each size in order, the earliest end (before the text's last token) of the suffix's last
    `size` tokens -> (size, the position after it)."""
    for size in sizes:
        if size > len(suffix):
            continue
        tail = suffix[len(suffix) - size:]
        for end in range(size - 1, len(text) - 1):
            if text[end - size + 1 : end + 1] == tail:
                return size, end + 1
    return None


def test_the_automaton_finds_the_earliest_occurrence_of_the_longest_or_fixed_match() -> None:
    """Random texts over small vocabularies, extended token by token: the longest match, each fixed size, and a
    match of another text's tail all agree with the brute-force search; states stay within 2n."""
    rng = random.Random(0)
    for _ in range(150):
        vocab, automaton, text = rng.choice([2, 3, 6]), SuffixAutomaton(), []
        for _ in range(40):
            text.append(rng.randrange(vocab))
            automaton.extend(text[-1])
            assert automaton.longest_match() == _earliest(text, text, range(len(text) - 1, 0, -1))
            for n in (1, 2, 4):
                assert automaton.match(n) == _earliest(text, text, range(n, 0, -1))
        other = [rng.randrange(vocab) for _ in range(8)]
        assert automaton.match_other(other) == _earliest(text, other, range(len(other), 0, -1))
        assert len(automaton.length) <= 2 * len(text)
    length, drafts = SuffixAutomaton([5, 6, 7, 8, 5, 6]).drafts(3)
    assert (length, drafts) == (2, [7, 8, 5])


def test_the_proposer_extends_one_automaton_per_sequence() -> None:
    """A growing sequence is fed to the same automaton once per token (its length is the sequence's), and drafts
    as an automaton built afresh over the whole sequence would."""
    proposer = SAProposer(SAConfig(4))
    seq = type("Seq", (), {"draft_state": None})()
    proposer.admit(seq, 0, None, 0)  # type: ignore[arg-type]
    automaton = seq.draft_state.automaton
    tokens = [1, 2, 3, 4, 1, 2]
    for extra in ([3], [9, 1], [2, 3, 4]):
        tokens += extra
        drafts = proposer.lookup(seq.draft_state, tokens, 4)
        assert seq.draft_state.automaton is automaton and len(automaton) == len(tokens)
        assert drafts == SuffixAutomaton(tokens).drafts(4)[1]
    with pytest.raises(RuntimeError, match="out of step"):
        proposer.lookup(seq.draft_state, tokens[:3], 4)


@pytest.mark.parametrize("config", [SAConfig(K), SAConfig(K, max_matching_ngram_size=2),
                                    SAConfig(K, enable_global_pool=True)], ids=["longest", "ngram-2", "global-pool"])
def test_sa_requests_join_one_batch_and_equal_plain_greedy(config: SAConfig, target: CausalLM) -> None:  # noqa: F811
    """Six requests arriving a step apart draft from their automata and are verified together; every output is
    the target's plain greedy one, drafts were proposed and some accepted (the prompts repeat themselves)."""
    engine = ServingEngine(target, max_batch=6, max_seq_len=160, proposer=SAProposer(config, 6))
    prompts = _prompts(6)
    handles = []
    for prompt in prompts:
        handles.append(engine.submit(EngineRequest(prompt, 20)))
        engine.step()
    engine.run_until_idle()
    results = [h.wait(0) for h in handles]
    assert [r.tokens for r in results] == [_greedy(target, p, 20) for p in prompts]
    assert engine.stats.max_rows >= 4 and engine.stats.proposals > 0
    assert sum(r.draft_tokens for r in results) > 0
    assert engine.stats.forwards < sum(len(r.tokens) for r in results)  # drafts were accepted: fewer forwards


@pytest.mark.parametrize(("rule", "should_match"), [(None, True), (accept_everything, False)],
                         ids=["rejection-sampling", "wrong-rule"])
def test_sa_sampled_outputs_follow_the_target(rule: object, should_match: bool,
                                              tiny_pair: tuple[CausalLM, CausalLM]) -> None:  # noqa: F811
    """Sampling at temperature 1 (as the other methods are tested): the tokens at positions 1 and 2, drafted by
    the automaton after the first sampled token and accepted or resampled, follow the target's exact marginal;
    keeping every draft does not. The prompt holds every token, so whatever comes first has a match."""
    model = tiny_pair[0]
    prompt = list(range(TINY_VOCAB)) * 2
    engine = ServingEngine(model, max_batch=256, max_seq_len=40, proposer=SAProposer(SAConfig(2)),
                           accept=rule)  # type: ignore[arg-type]
    handles = [engine.submit(EngineRequest(prompt, 3, SamplingParams(temperature=1.0, seed=i))) for i in range(2500)]
    engine.run_until_idle()
    outputs = [h.wait(0).tokens for h in handles]
    assert engine.stats.proposals > 0
    p_values = {position: marginal_p_value(model, prompt, position, outputs) for position in (1, 2)}
    if should_match:
        assert all(p > 0.01 for p in p_values.values()), p_values
    else:
        assert min(p_values.values()) < 0.01, p_values


def test_the_llmapi_model_builds_sa_from_the_speculative_config() -> None:
    """decoding_type SA with SADecodingConfig's fields becomes the engine's SA proposer; TensorRT-LLM's refusals
    (llm_args.py SADecodingConfig.validate_sa_config) come with its words."""
    built = llmapi_proposer({"decoding_type": "SA", "max_draft_len": 5, "max_matching_ngram_size": 3},
                            lambda: None, lambda: None, 8)
    assert isinstance(built, SAProposer) and built.max_draft_len == 5
    assert built.config.max_matching_ngram_size == 3 and not built.config.enable_global_pool
    pooled = llmapi_proposer({"decoding_type": "SA", "max_draft_len": 2, "enable_global_pool": True},
                             lambda: None, lambda: None, 100)
    assert pooled.pool_size == 100  # max(64, max_batch_size)
    for bad, words in (({"max_matching_ngram_size": 0}, "0 is invalid|Got 0"),
                       ({"global_pool_size": 4}, "requires enable_global_pool"),
                       ({"enable_global_pool": True, "max_matching_ngram_size": 65}, r"in \[1, 64\]"),
                       ({"max_draft_len": 0}, "max_draft_len must be > 0 for SA")):
        with pytest.raises(ValueError, match=words):
            llmapi_proposer({"decoding_type": "SA", "max_draft_len": 2, **bad}, lambda: None, lambda: None, 8)
    with pytest.raises(ValueError, match="must be >= max_batch_size"):
        SAProposer(SAConfig(2, enable_global_pool=True, global_pool_size=4), max_batch=8)
