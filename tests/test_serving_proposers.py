"""The serving engine's own drafting (specbuild.runtime.proposers): NGram, a draft model, the self-draft and EAGLE-3
(chain and tree) propose for many sequences at once, verified in the engine's batched target forwards.

What a user relies on: requests that arrive while others run share the target's forwards (and the draft's) with
every method; each output equals that request's plain greedy output, under load schedules that turn speculation
off and on, and for a follow-up request that reuses a finished one's cached prefix; sampled outputs follow the
target's distribution (a wrong acceptance rule is caught); the self-draft holds no copy of a target tensor and no
cache of its own. Expectations come from the same models in the same run (plain decoding), on small random
checkpoints, except the one test that needs a trained EAGLE-3 draft to accept anything.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from rich.console import Console

from specbuild.convert.pipeline import ConvertRequest, convert_checkpoint
from specbuild.runtime.eagle3 import Eagle3Draft
from specbuild.runtime.generation import generate
from specbuild.runtime.model import CausalLM
from specbuild.runtime.proposers import (
    Eagle3Proposer,
    ModelProposer,
    NGramConfig,
    NGramProposer,
    Proposer,
)
from specbuild.runtime.sampling import SamplingParams
from specbuild.runtime.schedule import DraftSchedule
from specbuild.runtime.self_draft import self_draft_proposer
from specbuild.runtime.sequence import StopCriteria
from specbuild.runtime.serving import EngineRequest, ServingEngine
from tests.eagle3_fixtures import write_random_draft
from tests.test_runtime_decoding import accept_everything, marginal_p_value
from tests.test_self_draft_runtime import write_adapter
from tests.tiny_models import make_checkpoint

QUIET = Console(file=io.StringIO())
K = 3
TREE = ((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0))


def _convert(source: Path, output: Path, **kwargs: object) -> Path:
    convert_checkpoint(ConvertRequest(output.name, source, output, "float32", **kwargs), console=QUIET)  # type: ignore[arg-type]
    return output


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("proposers")
    hf = make_checkpoint(root / "hf", "llama", seed=0, dtype=torch.float32, num_hidden_layers=4)
    other = make_checkpoint(root / "hf-draft", "llama", seed=5, dtype=torch.float32, num_hidden_layers=2)
    adapter = write_adapter(root / "adapter", 2, seed=7)
    return {"target": _convert(hf, root / "target"), "draft": _convert(other, root / "draft"),
            "adapted": _convert(hf, root / "adapted", self_draft_layers=2, self_draft_adapter=adapter),
            "root": root}


@pytest.fixture(scope="module")
def target(tiny: dict[str, Path]) -> CausalLM:
    return CausalLM.from_checkpoint(tiny["target"])


def _proposer(kind: str, target: CausalLM, tiny: dict[str, Path]) -> Proposer:
    if kind == "ngram":
        return NGramProposer(NGramConfig(K, max_matching_ngram_size=2))
    if kind == "ngram-private-newest":
        return NGramProposer(NGramConfig(K, 3, is_keep_all=False, is_use_oldest=False, is_public_pool=False))
    if kind == "draft":
        return ModelProposer(CausalLM.from_checkpoint(tiny["draft"]), K)
    if kind == "draft-is-target":  # every greedy draft is accepted: the accepted rows' draft K/V are kept
        return ModelProposer(CausalLM.from_checkpoint(tiny["target"]), K)
    if kind == "self-draft":
        return self_draft_proposer(target, 2, K)
    if kind == "self-draft-adapter":
        return self_draft_proposer(target, 2, K, tiny["adapted"])
    directory = tiny["root"] / "eagle3"
    if not directory.exists():
        write_random_draft(directory, target, seed=3, layer_ids=(0, 1, 3))
    draft = Eagle3Draft.from_directory(directory, target)
    return Eagle3Proposer(draft, K, TREE if kind == "eagle3-tree" else None)


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        piece = torch.randint(4, 1000, (int(torch.randint(2, 8, (1,), generator=gen)),), generator=gen).tolist()
        out.append(piece * 3)  # repeats: something for the n-gram pool to find
    return out


def _greedy(model: CausalLM, prompt: list[int], n: int) -> list[int]:
    return list(generate(model, [prompt], stop=StopCriteria(n)).output_ids[0])


KINDS = ["ngram", "ngram-private-newest", "draft", "draft-is-target", "self-draft", "self-draft-adapter",
         "eagle3-chain", "eagle3-tree"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("schedule", [None, {1: K, 3: 1, 5: 0}], ids=["full", "by-load"])
def test_requests_join_one_batch_and_equal_plain_greedy(kind: str, schedule: dict[int, int] | None,
                                                        target: CausalLM, tiny: dict[str, Path]) -> None:
    """Six requests arriving a step apart are drafted for and verified together (several sequences per target
    and draft forward); every output is the target's plain greedy one, also for follow-ups that reuse a finished
    request's cached prompt and output (in part or whole), and with a schedule that turns drafting off under
    load."""
    proposer = _proposer(kind, target, tiny)
    engine = ServingEngine(target, max_batch=6, max_seq_len=160, proposer=proposer,
                           schedule=DraftSchedule(schedule, K) if schedule else None)
    prompts = _prompts(6)
    handles = []
    for prompt in prompts:
        handles.append(engine.submit(EngineRequest(prompt, 20)))
        engine.step()
    engine.run_until_idle()
    outputs = [h.wait(0).tokens for h in handles]
    assert outputs == [_greedy(target, p, 20) for p in prompts]
    follow = [*([*p, *out, 7, 8] for p, out in zip(prompts[:2], outputs[:2], strict=True)),
              [*prompts[2], *outputs[2]]]  # the whole prompt cached: its first step is still the target's own
    again = [engine.submit(EngineRequest(p, 12)) for p in follow]
    engine.run_until_idle()
    assert [h.wait(0).tokens for h in again] == [_greedy(target, p, 12) for p in follow]
    assert engine.stats.reused_tokens >= len(follow[0]) - len(prompts[0])  # the follow-up reused its prefix
    stats = engine.stats
    assert stats.max_rows >= 4 and stats.batched_forwards > 0
    assert stats.proposals > 0
    results = [h.wait(0) for h in [*handles, *again]]
    assert sum(r.draft_tokens for r in results) > 0
    if not kind.startswith("ngram"):
        assert stats.draft_rows > stats.draft_forwards > 0  # the draft ran for several sequences at once
    if kind == "draft-is-target":
        assert all(r.accepted_draft_tokens == r.draft_tokens for r in results)


@pytest.mark.parametrize("kind", ["eagle3-chain", "eagle3-tree", "self-draft-adapter"])
def test_a_request_arriving_while_the_draft_runs_is_prefilled_first_and_drafted_for_next(
        kind: str, target: CausalLM, tiny: dict[str, Path]) -> None:
    """Time to first token under load with the proposers that read the target's own state (EAGLE-3's hidden
    states, the self-draft's shared cache): a request that arrives while the step's draft runs gets its first
    token from its own forward before that step's verification, and the next step drafts for it from what that
    forward left (EAGLE-3 needs its prompt's hidden states); every output is still plain greedy."""
    proposer = _proposer(kind, target, tiny)
    engine = ServingEngine(target, max_batch=6, max_seq_len=160, proposer=proposer)
    prompts = _prompts(4, seed=21)
    running = [engine.submit(EngineRequest(p, 24)) for p in prompts[:3]]
    for _ in range(2):
        engine.step()
    first: list[int] = []  # the engine's forward count at the late request's first token
    late: list = []
    propose = proposer.propose

    def on_update(_update: object) -> None:
        if not first:
            first.append(engine.stats.forwards)

    def propose_then_arrive(seqs, ks):  # type: ignore[no-untyped-def]
        out = propose(seqs, ks)
        if not late:
            late.append(engine.submit(EngineRequest(prompts[3], 16, on_update=on_update)))
        return out

    proposer.propose = propose_then_arrive  # type: ignore[method-assign]
    before = engine.stats.forwards
    engine.step()
    assert late and first == [before + 1], "the request that arrived while drafting waited for the verification"
    assert engine.stats.admitted_mid_step == 1
    engine.run_until_idle()
    results = [h.wait(0) for h in [*running, late[0]]]
    assert [r.tokens for r in results] == [_greedy(target, p, n)
                                          for p, n in zip(prompts, (24, 24, 24, 16), strict=True)]
    assert results[3].draft_tokens > 0  # it was drafted for in the steps after it joined


def test_a_trained_eagle3_draft_accepts_in_the_batch(demo_models: dict[str, Path], demo_extra: Callable[[str], Path],
                                                     tmp_path: Path) -> None:
    """The demo target with its trained EAGLE-3 draft, chain and tree: batched requests accept drafts (the
    accepted path's features feed the next catch-up) and still give the target's plain greedy output."""
    from transformers import AutoTokenizer

    from specbuild.demo.models import heldout_texts

    target = CausalLM.from_checkpoint(_convert(demo_models["target"], tmp_path / "target"))
    draft = Eagle3Draft.from_directory(demo_extra("eagle3-draft"), target)
    tok = AutoTokenizer.from_pretrained(demo_models["target"])
    prompts = [tok.encode(t, add_special_tokens=False)[: 6 + 5 * i] for i, t in enumerate(heldout_texts()[:4])]
    for choices in (None, TREE):
        engine = ServingEngine(target, max_batch=4, max_seq_len=160, proposer=Eagle3Proposer(draft, 4, choices))
        handles = [engine.submit(EngineRequest(p, 24)) for p in prompts]
        engine.run_until_idle()
        results = [h.wait(0) for h in handles]
        assert [r.tokens for r in results] == [_greedy(target, p, 24) for p in prompts]
        assert sum(r.accepted_draft_tokens for r in results) > 0
        assert engine.stats.max_rows == len(prompts)


def test_the_self_draft_shares_the_targets_weights_and_cache(target: CausalLM, tiny: dict[str, Path]) -> None:
    """No tensor of the served self-draft is a copy of the target's (storage identity); with an adapter only the
    adapter's own tensors are new, and the engine's one cache holds the adapter's layer (no second cache)."""
    owned = {t.untyped_storage().data_ptr() for t in target.buffers()}
    plain = self_draft_proposer(target, 2, K)
    assert all(t.untyped_storage().data_ptr() in owned for t in plain.draft.buffers())
    adapted = self_draft_proposer(target, 2, K, tiny["adapted"])
    own = [t for t in adapted.draft.buffers() if t.untyped_storage().data_ptr() not in owned]
    assert own and all(any(t is b for b in adapted.draft.layers[2].buffers()) for t in own)
    engine = ServingEngine(target, max_batch=2, max_seq_len=64, proposer=adapted)
    assert engine.cache.num_layers == target.config.num_layers + 1
    assert adapted.rows is None and adapted.target_cache is engine.cache


TINY_VOCAB = 8


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[CausalLM, CausalLM]:
    """An 8-token vocabulary (exact marginals are cheap) and sharpened outputs, so that p and q differ clearly."""
    root = tmp_path_factory.mktemp("proposers-sampling")
    models = []
    for name, seed in (("target", 0), ("draft", 5)):
        hf = make_checkpoint(root / f"hf-{name}", "llama", seed=seed, vocab_size=TINY_VOCAB, num_hidden_layers=2,
                             dtype=torch.float32)
        models.append(CausalLM.from_checkpoint(_convert(hf, root / name)))
    for model in models:
        model.lm_head.mul_(40.0)
    return models[0], models[1]


@pytest.mark.parametrize(("rule", "should_match"), [(None, True), (accept_everything, False)],
                         ids=["rejection-sampling", "wrong-rule"])
@pytest.mark.parametrize("kind", ["draft", "ngram", "eagle3"])
def test_sampled_outputs_follow_the_target(kind: str, rule: object, should_match: bool,
                                           tiny_pair: tuple[CausalLM, CausalLM], tmp_path: Path) -> None:
    """Sampling at temperature 1: the tokens at positions 1 and 2 (drafted after the first, accepted or
    resampled) follow the target's exact marginal; keeping every draft (a wrong rule) does not. For EAGLE-3 a
    random draft on the target's features (its chain drafts sampled from its own distribution, the q of
    rejection sampling)."""
    target, draft = tiny_pair
    # For n-grams: a prompt in which every token has a successor, so that whatever the target samples first the
    # lookup drafts (a prompt of few tokens drafts for some first tokens only, and keeping those few drafts does
    # not show), with the pool per request (a public one fills with the other requests' samples, whose drafts
    # follow the target's distribution already).
    prompt = [1, 2, 3, 1, 2, 3, 1, 2] if kind == "draft" else list(range(TINY_VOCAB)) * 2
    proposer: Proposer
    if kind == "draft":
        proposer = ModelProposer(draft, 2)
    elif kind == "ngram":
        proposer = NGramProposer(NGramConfig(2, 3, is_public_pool=False))
    else:
        directory = write_random_draft(tmp_path / "eagle3", target, seed=4, layer_ids=(0, 1), lm_head_scale=40.0)
        proposer = Eagle3Proposer(Eagle3Draft.from_directory(directory, target), 2)
    engine = ServingEngine(target, max_batch=256, max_seq_len=40, proposer=proposer, accept=rule)  # type: ignore[arg-type]
    handles = [engine.submit(EngineRequest(prompt, 3, SamplingParams(temperature=1.0, seed=i))) for i in range(2500)]
    engine.run_until_idle()
    outputs = [h.wait(0).tokens for h in handles]
    assert engine.stats.proposals > 0
    p_values = {position: marginal_p_value(target, prompt, position, outputs) for position in (1, 2)}
    if should_match:  # every drafted position follows the target
        assert all(p > 0.01 for p in p_values.values()), p_values
    else:
        assert min(p_values.values()) < 0.01, p_values
