"""Decoding with the reference runtime: plain, draft-target and Medusa.

What users rely on: greedy speculative output is token-for-token plain greedy output (only faster), for
batches of prompts of different lengths; speculative sampling draws from exactly the target's distribution
(a chi-square test that a deliberately wrong acceptance rule fails); stop conditions behave; the CLI
reports the statistics it promises.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from scipy.stats import chisquare
from typer.testing import CliRunner

from specbuild.cli import app
from specbuild.convert.pipeline import ConvertRequest, convert_checkpoint
from specbuild.runtime.generation import generate
from specbuild.runtime.medusa_decoding import MedusaConfig, generate_medusa
from specbuild.runtime.model import CausalLM
from specbuild.runtime.sampling import SamplingParams, probabilities
from specbuild.runtime.sequence import StopCriteria
from specbuild.runtime.speculative import (
    DraftTargetConfig,
    accept_rejection_sampling,
    best_k,
    expected_speedup,
    generate_draft_target,
)
from tests.tiny_models import make_checkpoint


@pytest.fixture(scope="session")
def demo_checkpoints(demo_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("demo-ckpt")
    convert_checkpoint(ConvertRequest("target", demo_models["target"], out / "target", "float32"))
    convert_checkpoint(ConvertRequest("draft", demo_models["draft"], out / "draft", "float32"))
    return {"target": out / "target", "draft": out / "draft", "tokenizer": demo_models["target"]}


@pytest.fixture(scope="session")
def medusa_model(demo_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> CausalLM:
    """The demo target with the demo's trained Medusa heads, as one MedusaForCausalLM checkpoint."""
    out = tmp_path_factory.mktemp("demo-medusa") / "medusa"
    convert_checkpoint(ConvertRequest("medusa", demo_models["target"], out, "float32",
                                      medusa_heads=demo_models["medusa-heads"]))
    return CausalLM.from_checkpoint(out)


@pytest.fixture(scope="session")
def prompts(demo_models: dict[str, Path]) -> list[list[int]]:
    from transformers import AutoTokenizer

    from specbuild.demo.models import heldout_texts

    tok = AutoTokenizer.from_pretrained(demo_models["target"])
    texts = heldout_texts()
    ids = [tok.encode(t, add_special_tokens=False) for t in texts[:3]]
    return [ids[0][:9], ids[1][:23], ids[2][:4]]  # different lengths in one batch


@pytest.fixture(scope="session")
def models(demo_checkpoints: dict[str, Path]) -> dict[str, CausalLM]:
    return {k: CausalLM.from_checkpoint(demo_checkpoints[k]) for k in ("target", "draft")}


STOP = StopCriteria(max_new_tokens=24)


def test_plain_batch_equals_one_prompt_at_a_time(models: dict[str, CausalLM], prompts: list[list[int]]) -> None:
    batch = generate(models["target"], prompts, stop=STOP).output_ids
    for prompt, out in zip(prompts, batch, strict=True):
        assert generate(models["target"], [prompt], stop=STOP).output_ids[0] == out
    assert all(len(o) == 24 for o in batch)


@pytest.mark.parametrize("config", [DraftTargetConfig(1), DraftTargetConfig(4), DraftTargetConfig(6, adaptive=True)],
                         ids=["K1", "K4", "adaptive"])
def test_draft_target_greedy_equals_plain_greedy(
    models: dict[str, CausalLM], prompts: list[list[int]], config: DraftTargetConfig
) -> None:
    plain = generate(models["target"], prompts, stop=STOP)
    spec = generate_draft_target(models["target"], models["draft"], prompts, stop=STOP, config=config)
    assert spec.output_ids == plain.output_ids
    assert spec.stats.target_forwards < plain.stats.target_forwards
    assert spec.stats.tokens_per_target_forward > 1.2
    positions = len(spec.stats.acceptance_by_position)
    assert 1 <= positions <= config.num_draft_tokens if config.adaptive else positions == config.num_draft_tokens


@pytest.mark.parametrize("tree", ["mc_sim_7b_63", "mc_sim_7b_top8", "chain_4"])
def test_medusa_greedy_equals_plain_greedy(
    models: dict[str, CausalLM], medusa_model: CausalLM, prompts: list[list[int]], tree: str
) -> None:
    from specbuild.medusa.tree import load_choices

    plain = generate(models["target"], prompts, stop=STOP)
    choices = tuple(tuple(c) for c in load_choices(tree))
    medusa = generate_medusa(medusa_model, prompts, MedusaConfig(choices), stop=STOP)
    assert medusa.output_ids == plain.output_ids
    assert medusa.stats.tokens_per_target_forward > 1.2


def test_medusa_typical_acceptance(
    models: dict[str, CausalLM], medusa_model: CausalLM, prompts: list[list[int]]
) -> None:
    """Typical acceptance samples; near temperature 0 its accept rule and its draws become the argmax, so it
    must reproduce greedy output, and at temperature 0.7 it still speculates (more than one token a forward)."""
    from specbuild.medusa.tree import load_choices

    choices = tuple(tuple(c) for c in load_choices("mc_sim_7b_top24"))
    config = MedusaConfig(choices, typical=True)
    plain = generate(models["target"], prompts, stop=STOP)
    cold = generate_medusa(medusa_model, prompts, config, SamplingParams(temperature=1e-4, seed=0), STOP)
    assert cold.output_ids == plain.output_ids
    warm = generate_medusa(medusa_model, prompts, config, SamplingParams(temperature=0.7, seed=0), STOP)
    assert all(len(o) == 24 for o in warm.output_ids)
    assert warm.stats.tokens_per_target_forward > 1.0
    with pytest.raises(ValueError, match="typical acceptance samples"):
        generate_medusa(medusa_model, prompts, config, SamplingParams(), STOP)


def test_rows_finishing_in_different_rounds(
    models: dict[str, CausalLM], medusa_model: CausalLM, demo_models: dict[str, Path]
) -> None:
    """A row that finishes while others go on must not keep growing its caches (it once overflowed them
    when its last round accepted tokens past max_new_tokens)."""
    from transformers import AutoTokenizer

    from specbuild.demo.models import heldout_texts
    from specbuild.medusa.tree import load_choices

    tok = AutoTokenizer.from_pretrained(demo_models["target"])
    batch = [tok.encode(t, add_special_tokens=False)[:24] for t in heldout_texts()[:8]]
    stop = StopCriteria(max_new_tokens=64)
    plain = generate(models["target"], batch, stop=stop).output_ids
    spec = generate_draft_target(models["target"], models["draft"], batch, stop=stop, config=DraftTargetConfig(6))
    assert spec.output_ids == plain
    choices = tuple(tuple(c) for c in load_choices("mc_sim_7b_top24"))
    assert generate_medusa(medusa_model, batch, MedusaConfig(choices), stop=stop).output_ids == plain


def test_medusa_needs_heads_deep_enough(
    models: dict[str, CausalLM], medusa_model: CausalLM, prompts: list[list[int]]
) -> None:
    deep = tuple((0,) * d for d in range(1, 7))  # 6 deep; the demo has 4 heads
    with pytest.raises(ValueError, match="6 deep but the checkpoint has only 4 heads"):
        generate_medusa(medusa_model, prompts, MedusaConfig(deep))
    with pytest.raises(ValueError, match="no Medusa heads"):
        generate_medusa(models["target"], prompts, MedusaConfig(((0,),)))


# -- sampling preserves the target's distribution ------------------------------------------------------------

VOCAB = 8
PARAMS = SamplingParams(temperature=1.0, seed=1234)


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[CausalLM, CausalLM]:
    """An 8-token vocabulary, so exact marginals are a handful of forwards; different seeds make q differ from p."""
    root = tmp_path_factory.mktemp("tiny")
    models = []
    for name, seed in (("target", 0), ("draft", 5)):
        hf = make_checkpoint(root / f"hf-{name}", "llama", seed=seed, vocab_size=VOCAB, num_hidden_layers=2)
        convert_checkpoint(ConvertRequest(name, hf, root / name, "float32"))
        models.append(CausalLM.from_checkpoint(root / name, dtype=torch.float32))
    for model in models:  # random init is near-uniform: sharpen the outputs so that p and q differ clearly
        for name, param in model.named_parameters():
            if "lm_head" in name:
                param.data.mul_(40.0)
    return models[0], models[1]


def exact_marginal(model: CausalLM, prompt: list[int], position: int) -> torch.Tensor:
    """P(token at `position` of the output), summing over all earlier outputs (VOCAB ** position paths)."""
    paths = {(): 1.0}
    for _ in range(position + 1):
        nxt: dict[tuple[int, ...], float] = {}
        for path, weight in paths.items():
            cache = model.new_cache(1, len(prompt) + position + 2)
            logits = model(torch.tensor([prompt + list(path)]), cache).logits[0, -1]
            for token, p in enumerate(probabilities(logits, PARAMS).tolist()):
                nxt[(*path, token)] = weight * p
        paths = nxt
    marginal = torch.zeros(VOCAB)
    for path, weight in paths.items():
        marginal[path[-1]] += weight
    return marginal


def accept_everything(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, gen: torch.Generator) -> tuple[int, int]:
    """A wrong rule: keep every draft token, which yields the draft's distribution, not the target's."""
    return len(drafts), int(torch.multinomial(p[len(drafts)], 1, generator=gen))


@pytest.mark.parametrize(("rule", "should_match"), [(accept_rejection_sampling, True), (accept_everything, False)])
def test_speculative_sampling_matches_target_distribution(
    tiny_pair: tuple[CausalLM, CausalLM], rule: object, should_match: bool
) -> None:
    target, draft = tiny_pair
    prompt, trials = [1, 2, 3], 3000
    result = generate_draft_target(target, draft, [prompt] * trials, PARAMS, StopCriteria(max_new_tokens=3),
                                   DraftTargetConfig(3), accept=rule)  # type: ignore[arg-type]
    # The first round drafts from the prompt (as TensorRT-LLM's BLS): with 3 new tokens it proposes K = 2, so
    # positions 0 and 1 are draft tokens accepted or resampled, the rule under test.
    for position in (0, 1):
        p_value = marginal_p_value(target, prompt, position, result.output_ids)
        assert (p_value > 0.01) == should_match, f"position {position}: p={p_value:.2e}"


def marginal_p_value(target: CausalLM, prompt: list[int], position: int, outputs: list[list[int]]) -> float:
    """Chi-square p-value of the tokens at `position` of `outputs` (one sample per output) against the target's
    exact marginal there (shared with the EAGLE-3 sampling test)."""
    trials = len(outputs)
    expected = exact_marginal(target, prompt, position)
    observed = torch.bincount(torch.tensor([o[position] for o in outputs]), minlength=VOCAB).float()
    keep = expected * trials >= 5  # chi-square needs expected counts >= 5; pool the rest
    f_exp = torch.cat([expected[keep] * trials, (expected[~keep] * trials).sum()[None]])
    f_obs = torch.cat([observed[keep], observed[~keep].sum()[None]])
    if f_exp[-1] < 5:
        f_exp, f_obs = f_exp[:-1], f_obs[:-1]
        f_exp = f_exp * (f_obs.sum() / f_exp.sum())
    return float(chisquare(f_obs.numpy(), f_exp.numpy()).pvalue)


def test_rejection_sampling_on_a_rejection_draws_from_the_residual() -> None:
    """Draft token 2 has p = 0, so it is always rejected; the replacement comes from max(0, p - q) normalised,
    i.e. token 0 with probability 0.6 / 0.8 = 0.75 — not from p itself (0.6)."""
    p = torch.tensor([[0.6, 0.4, 0.0], [1 / 3, 1 / 3, 1 / 3]])
    q = torch.tensor([[0.0, 0.2, 0.8]])
    gen = torch.Generator().manual_seed(0)
    draws = [accept_rejection_sampling(p, q, torch.tensor([2]), gen) for _ in range(4000)]
    assert {n for n, _ in draws} == {0}
    share = sum(token == 0 for _, token in draws) / len(draws)
    assert share == pytest.approx(0.75, abs=0.03)


@pytest.mark.parametrize(("rule", "should_match"), [(accept_rejection_sampling, True), (accept_everything, False)])
def test_one_round_emits_the_target_distribution(rule: object, should_match: bool) -> None:
    """Exact check of one round on fixed, very different p and q: the first emitted token (accepted draft or
    replacement) must follow p[0], over enough trials for a chi-square test."""
    p = torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.25] * 4, [0.25] * 4])
    q = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.4, 0.3, 0.2, 0.1]])
    gen = torch.Generator().manual_seed(3)
    counts = torch.zeros(4)
    trials = 8000
    for _ in range(trials):
        drafts = torch.multinomial(q, 1, generator=gen)[:, 0]
        accepted, nxt = rule(p, q, drafts, gen)  # type: ignore[operator]
        counts[int(drafts[0]) if accepted > 0 else nxt] += 1
    p_value = chisquare(counts.numpy(), (p[0] * trials).numpy()).pvalue
    assert (p_value > 0.01) == should_match, f"p={p_value:.2e}"


def test_adaptive_k_follows_acceptance() -> None:
    assert expected_speedup(0.8, 4, 0.1) == pytest.approx((1 - 0.8**5) / (0.2 * 1.4))
    assert best_k(0.95, 0.05, 8) > best_k(0.5, 0.05, 8) >= 1
    assert best_k(0.1, 0.5, 8) == 1


# -- stop conditions ----------------------------------------------------------------------------------------


def test_stop_conditions(models: dict[str, CausalLM], prompts: list[list[int]]) -> None:
    target = models["target"]
    free = generate(target, prompts[:1], stop=STOP).output_ids[0]
    end = free[5]
    cut = generate(target, prompts[:1], stop=StopCriteria(24, end_id=end)).output_ids[0]
    assert cut == free[: free.index(end)]
    word = tuple(free[7:9])
    stopped = generate(target, prompts[:1], stop=StopCriteria(24, stop_words=(word,))).output_ids[0]
    assert stopped == free[:7] or stopped == free[: free.index(word[0])]
    spec = generate_draft_target(target, models["draft"], prompts[:1], stop=StopCriteria(24, end_id=end))
    assert spec.output_ids[0] == cut


def test_sampling_is_reproducible_with_a_seed(models: dict[str, CausalLM], prompts: list[list[int]]) -> None:
    params = SamplingParams(temperature=0.8, top_k=20, top_p=0.9, seed=7)
    a = generate_draft_target(models["target"], models["draft"], prompts, params, STOP).output_ids
    b = generate_draft_target(models["target"], models["draft"], prompts, params, STOP).output_ids
    assert a == b


# -- CLI ----------------------------------------------------------------------------------------------------


def test_generate_without_tokenizer_files_says_where_to_point(demo_checkpoints: dict[str, Path],
                                                               tmp_path: Path) -> None:
    """A --tokenizer directory without tokenizer files is one message naming it, and a hint, before any model loads."""
    result = CliRunner().invoke(app, ["generate", str(demo_checkpoints["target"]), "--tokenizer", str(tmp_path),
                                      "--prompt", "x", "--json"])
    assert result.exit_code == 1 and f"{tmp_path}: no tokenizer files" in " ".join(result.output.split())
    assert "give --tokenizer a directory that holds them" in " ".join(result.output.split())


def test_generate_cli_json(demo_checkpoints: dict[str, Path]) -> None:
    runner = CliRunner()
    base = ["generate", str(demo_checkpoints["target"]), "--tokenizer", str(demo_checkpoints["tokenizer"]),
            "--prompt", "The for statement", "--max-tokens", "16", "--json"]
    plain = runner.invoke(app, base)
    assert plain.exit_code == 0, plain.output
    spec = runner.invoke(app, [*base, "--draft", str(demo_checkpoints["draft"]), "--num-draft-tokens", "3"])
    assert spec.exit_code == 0, spec.output
    a, b = json.loads(plain.stdout), json.loads(spec.stdout)
    for key in ("text", "output_ids", "target_forwards", "tokens_per_target_forward", "acceptance_by_position",
                "tokens_per_second"):
        assert key in b, key
    assert b["text"] == a["text"] and b["output_ids"] == a["output_ids"]
    assert b["target_forwards"] < a["target_forwards"]
    assert len(b["acceptance_by_position"]) == 3


def test_generate_cli_every_method_gives_plain_greedy_text(demo_checkpoints: dict[str, Path],
                                                           demo_extra: Callable[[str], Path]) -> None:
    """`specbuild generate` with EAGLE-3 (chain and tree), Lookahead, a shared-cache self-draft, n-grams and SA
    (the docs say every method: these two were missing, issue 48): the same text as plain greedy decoding of the
    same checkpoint, in no more target forwards; two methods at once, or an option of a method not chosen (it was
    ignored), are refused."""
    runner = CliRunner()
    base = ["generate", str(demo_checkpoints["target"]), "--tokenizer", str(demo_checkpoints["tokenizer"]),
            "--prompt", "The for statement", "--prompt", "A module", "--max-tokens", "16", "--json"]
    plain = runner.invoke(app, base)
    assert plain.exit_code == 0, plain.output
    expected = json.loads(plain.stdout)
    eagle = demo_extra("eagle3-draft")
    for extra in (["--eagle3", str(eagle), "--num-draft-tokens", "3"],
                  ["--eagle3", str(eagle), "--eagle3-choices", "mc_sim_7b_top8"],
                  ["--lookahead", "4,3,4"],
                  ["--self-draft", "2", "--num-draft-tokens", "3"],
                  ["--ngram", "--num-draft-tokens", "3"],
                  ["--sa", "--num-draft-tokens", "3", "--max-matching-ngram-size", "2"]):
        result = runner.invoke(app, [*base, *extra])
        assert result.exit_code == 0, (extra, result.output)
        report = json.loads(result.stdout)
        assert [r["output_ids"] for r in report["results"]] == [r["output_ids"] for r in expected["results"]], extra
        assert report["target_forwards"] <= expected["target_forwards"], extra
    both = runner.invoke(app, [*base, "--lookahead", "4,3,4", "--self-draft", "2"])
    assert both.exit_code != 0 and "choose one speculative method" in both.output
    assert "keep one of --lookahead, --self-draft" in both.output  # the hint says what to change
    bad = runner.invoke(app, [*base, "--lookahead", "4,3"])
    assert bad.exit_code != 0 and "W,N,G" in bad.output
    for extra, says in ((["--max-matching-ngram-size", "2"], "without a speculative method: it belongs to --ngram"),
                        (["--lookahead", "4,3,4", "--num-draft-tokens", "3"], "with --lookahead: it belongs to"),
                        (["--ngram", "--adaptive-k"], "with --ngram: it belongs to --draft, --self-draft"),
                        (["--typical"], "--typical would change nothing without")):
        ignored = runner.invoke(app, [*base, *extra])  # each would be ignored: refused by name instead
        assert ignored.exit_code == 1 and says in " ".join(ignored.output.split()), (extra, ignored.output)
    zero = runner.invoke(app, [*base, "--sa", "--max-matching-ngram-size", "0"])
    assert zero.exit_code == 1 and "--max-matching-ngram-size 0: max_matching_ngram_size must be > 0" in zero.output
