"""Medusa: the tree tensors and acceptance rules on hand-checked cases, presets, and heads trained on the demo target.

Small tree used throughout (node index: path):  0: root, 1: [0], 2: [1], 3: [0, 0], 4: [0, 1], 5: [1, 0].
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from specbuild.demo import models as dm
from specbuild.demo.recipe import RECIPE
from specbuild.demo.tokenizer import BOS_ID, EOS_ID
from specbuild.errors import CheckpointError
from specbuild.medusa.train import apply_heads, load_medusa_heads, train_medusa_heads
from specbuild.medusa.tree import MedusaTree, accept_greedy, accept_typical, load_choices, preset_names
from specbuild.tokenizer import load_tokenizer

SMALL = [[1, 0], [0], [0, 1], [1], [0, 0]]  # deliberately unsorted
PRESETS = {"mc_sim_7b_63": (63, 4), "mc_sim_7b_top24": (24, 3), "mc_sim_7b_top8": (8, 3), "chain_4": (4, 4)}
# Chance levels for head 0 (token t+2) on held-out text, measured with the shipped recipe: the base's own next-token
# guess scored against t+2 gets 0.030 (this is exactly what an untrained head, initialised from lm_head, predicts),
# always guessing the most frequent training token 0.038. The trained head 0 reaches 0.085 on 2 cores; requiring
# +0.03 over the best chance level fails an untrained or mis-shifted head and leaves room for float differences.
MIN_GAIN_OVER_CHANCE = 0.03


@pytest.fixture(scope="module")
def tree() -> MedusaTree:
    return MedusaTree.from_choices(SMALL)


# ---------------------------------------------------------------------------------------------- tree tensors


def test_small_tree_tensors(tree: MedusaTree) -> None:
    assert tree.choices == ((0,), (1,), (0, 0), (0, 1), (1, 0))
    assert tree.depth.tolist() == [0, 1, 1, 2, 2, 2]
    assert tree.parent.tolist() == [-1, 0, 0, 1, 1, 2]
    assert tree.rank.tolist() == [-1, 0, 1, 0, 1, 0]
    assert tree.attention_mask.dtype == torch.bool
    assert tree.attention_mask.int().tolist() == [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 0, 1, 0, 0, 0],
        [1, 1, 0, 1, 0, 0],
        [1, 1, 0, 0, 1, 0],
        [1, 0, 1, 0, 0, 1],
    ]
    assert tree.retrieve_indices.tolist() == [[0, 1, 3], [0, 1, 4], [0, 2, 5]]
    assert (tree.num_nodes, tree.max_depth, tree.num_heads_needed, tree.topk_needed) == (5, 2, 2, (2, 2))


def test_retrieve_indices_pad_short_leaves() -> None:
    uneven = MedusaTree.from_choices([[0], [1], [0, 0], [0, 0, 0]])
    assert uneven.retrieve_indices.tolist() == [[0, 1, 3, 4], [0, 2, -1, -1]]
    assert uneven.topk_needed == (2, 1, 1)


def test_candidates_take_each_nodes_head_and_rank(tree: MedusaTree) -> None:
    # head_topk[h][r] = 100 * (h + 1) + r: every (head, rank) gives a distinct id
    head_topk = [[100 * (h + 1) + r for r in range(3)] for h in range(3)]
    assert tree.candidates(7, head_topk) == [7, 100, 101, 200, 201, 200]
    with pytest.raises(ValueError, match="needs that many heads"):
        tree.candidates(7, head_topk[:1])
    with pytest.raises(ValueError, match="top-2"):
        tree.candidates(7, [guesses[:1] for guesses in head_topk])


def test_list_views_match_the_tensors_and_within_depth_keeps_a_tree(tree: MedusaTree) -> None:
    """The plain-list views a serving step reads agree with the index tensors; a tree cut to a depth keeps exactly
    the paths that shallow (a smaller valid tree), and is the tree itself when that deep already."""
    assert tree.ancestors == ((), (1,), (2,), (1, 3), (1, 4), (2, 5))
    for node, path in enumerate(tree.ancestors[1:], start=1):
        assert tree.parents[path[-1]] == (path[-2] if len(path) > 1 else 0)
        assert len(path) == tree.depths[node]
    assert tree.leaf_paths == ((0, 1, 3), (0, 1, 4), (0, 2, 5))  # [0,0], [0,1], [1,0], root first
    shallow = tree.within_depth(1)
    assert shallow.choices == ((0,), (1,)) and shallow.max_depth == 1
    assert tree.within_depth(2) is tree and tree.within_depth(5) is tree


# ---------------------------------------------------------------------------------------------- acceptance


TOKENS = torch.tensor([5, 10, 11, 20, 21, 22])  # root, [0], [1], [0,0], [0,1], [1,0]


@pytest.mark.parametrize(
    ("argmax", "expected"),
    [
        ([10, 20, 0, 0, 0, 0], [0, 1, 3]),  # full path through [0] then [0, 0]
        ([10, 21, 0, 0, 0, 0], [0, 1, 4]),  # the other child of [0]
        ([11, 0, 22, 0, 0, 0], [0, 2, 5]),  # the [1] branch
        ([10, 99, 0, 0, 0, 0], [0, 1]),  # partial: [0] right, none of its children
        ([99, 20, 22, 0, 0, 0], [0]),  # none: the root's guess matches no depth-1 node (children not reachable)
    ],
)
def test_accept_greedy(tree: MedusaTree, argmax: list[int], expected: list[int]) -> None:
    accepted, count = accept_greedy(tree, TOKENS, torch.tensor(argmax))
    assert accepted.tolist() == expected
    assert count == len(expected) - 1


def test_accept_greedy_tie_goes_to_first_leaf() -> None:
    """Only possible when a head's top-k repeats a token; then the higher-ranked (lexicographically first) path."""
    tree = MedusaTree.from_choices([[0], [1]])
    accepted, count = accept_greedy(tree, torch.tensor([5, 9, 9]), torch.tensor([9, 0, 0]))
    assert (accepted.tolist(), count) == ([0, 1], 1)


def _logits_from_probs(rows: list[dict[int, float]], vocab: int = 32) -> torch.Tensor:
    """Logits whose softmax (temperature 1) is the given probabilities, the rest spread evenly."""
    logits = torch.empty(len(rows), vocab)
    for i, probs in enumerate(rows):
        rest = (1.0 - sum(probs.values())) / (vocab - len(probs))
        logits[i] = math.log(rest)
        for token, p in probs.items():
            logits[i, token] = math.log(p)
    return logits


def test_accept_typical(tree: MedusaTree) -> None:
    tokens = torch.tensor([5, 10, 11, 20, 21, 22])
    # Uncertain root: 10 and 11 both plausible (entropy high, so the bar is the 0.09 threshold at most).
    # Node [0] is confident on 20; node [1] spreads over 22 and more.
    logits = _logits_from_probs([{10: 0.4, 11: 0.35}, {20: 0.97}, {22: 0.3, 23: 0.3}, {}, {}, {}])
    accepted, count = accept_typical(tree, tokens, logits, temperature=1.0)
    assert (accepted.tolist(), count) == ([0, 1, 3], 2)  # [0,0] and [1,0] both accepted: higher likelihood wins

    # A confident target (entropy ~0.57, so the bar is the 0.09 threshold) refuses a token it gives 5%.
    confident = _logits_from_probs([{10: 0.9, 11: 0.05}, {}, {}, {}, {}, {}])
    tokens_b = torch.tensor([5, 12, 11, 20, 21, 22])  # node [0] is a token the target gives ~0.002
    accepted, count = accept_typical(tree, tokens_b, confident, temperature=1.0)
    assert (accepted.tolist(), count) == ([0], 0)

    # Among equally long paths the most likely one wins, even if it is not the first leaf.
    prefer_second = _logits_from_probs([{10: 0.3, 11: 0.6}, {20: 0.2}, {22: 0.9}, {}, {}, {}])
    accepted, count = accept_typical(tree, tokens, prefer_second, temperature=1.0)
    assert (accepted.tolist(), count) == ([0, 2, 5], 2)

    with pytest.raises(ValueError, match="temperature"):
        accept_typical(tree, tokens, logits, temperature=0.0)


def test_typical_threshold_is_entropy_dependent(tree: MedusaTree) -> None:
    """The same 0.05 probability is accepted under a flat distribution and refused under a peaked one."""
    tokens = torch.tensor([5, 10, 11, 20, 21, 22])
    flat = torch.zeros(6, 32)
    flat[0, 10] = math.log(0.05 * 31 / 0.95)  # p(10) = 0.05, the rest uniform: entropy ~3.4, bar 0.3*e^-3.4 = 0.01
    peaked = _logits_from_probs([{10: 0.05, 0: 0.94}, {}, {}, {}, {}, {}])  # entropy ~0.3, bar min(0.09, 0.22)
    assert accept_typical(tree, tokens, flat, temperature=1.0)[1] >= 1
    assert accept_typical(tree, tokens, peaked, temperature=1.0)[1] == 0


# ---------------------------------------------------------------------------------------------- presets


def test_every_preset_loads_and_validates() -> None:
    assert set(preset_names()) == set(PRESETS)
    for name, (nodes, depth) in PRESETS.items():
        tree = MedusaTree.from_choices(load_choices(name))
        assert (tree.num_nodes, tree.max_depth) == (nodes, depth), name
    big = MedusaTree.from_choices(load_choices("mc_sim_7b_63"))
    assert [int((big.depth == d).sum()) for d in range(1, 5)] == [10, 28, 23, 2]
    assert big.topk_needed == (10, 10, 10, 2)
    assert big.retrieve_indices.shape == (42, 5)


def test_load_choices_from_a_file(tmp_path: Path) -> None:
    (tmp_path / "bare.json").write_text("[[0], [0, 0], [1]]")
    assert load_choices(str(tmp_path / "bare.json")) == [[0], [0, 0], [1]]
    (tmp_path / "bad.json").write_text('{"choices": [[0], [0, 1, 0]]}')
    with pytest.raises(ValueError, match=r"bad\.json.*\[0, 1, 0\].*prefix \[0, 1\]"):
        load_choices(str(tmp_path / "bad.json"))
    with pytest.raises(ValueError, match=r"unknown medusa choices preset 'nope'.*mc_sim_7b_63"):
        load_choices("nope")


@pytest.mark.parametrize(
    ("choices", "message"),
    [
        ([[0], [1, 2]], r"\[1, 2\]: prefix \[1\] is not listed"),
        ([[0], [0]], r"\[0\] is listed twice"),
        ([[0], [-1]], r"\[-1\]: top-k indices must be >= 0"),
        ([[0], []], r"\[\] is not a path"),
        ([], "empty"),
        ([[0], [True]], "list of integers"),
    ],
)
def test_invalid_trees_name_the_path(choices: list[list[int]], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MedusaTree.from_choices(choices)


# ---------------------------------------------------------------------------------------------- trained heads


def _heldout_stream(tokenizer: object) -> torch.Tensor:
    ids: list[int] = []
    for text in dm.heldout_texts():
        ids += [BOS_ID, *tokenizer(text, add_special_tokens=False, verbose=False).input_ids, EOS_ID]
    return torch.tensor(ids)


def test_demo_heads_beat_chance_on_heldout_text(demo_models: dict[str, Path]) -> None:
    """Recomputed here from the saved file with the plain-PyTorch reference, not taken from the training metrics."""
    heads_dir = demo_models["medusa-heads"]
    state_dict, num_heads, num_layers = load_medusa_heads(heads_dir)
    assert (num_heads, num_layers) == (RECIPE.medusa.num_heads, RECIPE.medusa.num_layers)
    base = AutoModelForCausalLM.from_pretrained(demo_models["target"]).eval()
    tokenizer = load_tokenizer(heads_dir)  # the heads directory carries the tokenizer
    ids = _heldout_stream(tokenizer)
    seq_len = 64
    windows = ids[: (ids.numel() - 2) // seq_len * seq_len + 2].unfold(0, seq_len + 2, seq_len)
    with torch.inference_mode():
        hidden = base.model(input_ids=windows[:, :seq_len]).last_hidden_state
        torch.testing.assert_close(base.lm_head(hidden), base(input_ids=windows[:, :seq_len]).logits)
        head0 = apply_heads(state_dict, num_heads, num_layers, hidden)[0]
        base_guess = base.lm_head(hidden).argmax(-1)
    t2 = windows[:, 2:]
    head0_top1 = float((head0.argmax(-1) == t2).float().mean())
    base_guess_at_t2 = float((base_guess == t2).float().mean())
    train_counts = torch.bincount(
        torch.tensor([t for text in dm.training_texts() for t in tokenizer(text, verbose=False).input_ids])
    )
    unigram = float((t2 == train_counts.argmax()).float().mean())
    assert head0_top1 > max(base_guess_at_t2, unigram) + MIN_GAIN_OVER_CHANCE, (head0_top1, base_guess_at_t2, unigram)

    manifest = json.loads((demo_models["target"].parent / dm.MANIFEST_NAME).read_text())
    metrics = manifest["metrics"]["medusa-heads"]
    assert metrics["head0_top1"] > metrics["head1_top1"] > metrics["base_top1_at_t2"]
    assert all(metrics[f"head{k}_top5"] > metrics[f"head{k}_top1"] for k in range(num_heads))


def test_demo_heads_files_follow_fasterdecoding(demo_models: dict[str, Path]) -> None:
    heads_dir = demo_models["medusa-heads"]
    tensors = load_file(heads_dir / "medusa_lm_head.safetensors")
    hidden, vocab = 256, RECIPE.vocab_size
    expected = {}
    for h in range(4):
        expected[f"{h}.0.linear.weight"] = (hidden, hidden)
        expected[f"{h}.0.linear.bias"] = (hidden,)
        expected[f"{h}.1.weight"] = (vocab, hidden)
    assert {key: tuple(t.shape) for key, t in tensors.items()} == expected
    config = json.loads((heads_dir / "config.json").read_text())
    assert config == {
        "medusa_num_heads": 4,
        "medusa_num_layers": 1,
        "base_model_name_or_path": dm.MEDUSA_BASE_NAME,  # relative: neither the temporary build dir nor absolute
        "hidden_size": hidden,
        "vocab_size": vocab,
    }
    assert (heads_dir / config["base_model_name_or_path"]).resolve() == demo_models["target"].resolve()
    assert (heads_dir / "tokenizer.json").read_bytes() == (demo_models["tokenizer"] / "tokenizer.json").read_bytes()
    # Trained away from the lm_head copy they started from, each head differently.
    lm_head = load_file(demo_models["target"] / "model.safetensors")["lm_head.weight"]
    projections = [tensors[f"{h}.1.weight"] for h in range(4)]
    assert all(not torch.allclose(p, lm_head) for p in projections)
    assert not torch.allclose(projections[0], projections[1])


# ---------------------------------------------------------------------------------------------- loading


def _fake_heads(num_heads: int, num_layers: int, hidden: int = 8, vocab: int = 16) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    tensors = {}
    for h in range(num_heads):
        for layer in range(num_layers):
            tensors[f"{h}.{layer}.linear.weight"] = torch.randn(hidden, hidden, generator=generator)
            tensors[f"{h}.{layer}.linear.bias"] = torch.randn(hidden, generator=generator)
        tensors[f"{h}.{num_layers}.weight"] = torch.randn(vocab, hidden, generator=generator)
    return tensors


def test_counts_come_from_the_keys_not_the_config(tmp_path: Path) -> None:
    save_file(_fake_heads(4, 2), tmp_path / "medusa_lm_head.safetensors")
    (tmp_path / "config.json").write_text(json.dumps({"medusa_num_heads": 2, "medusa_num_layers": 1}))
    state_dict, num_heads, num_layers = load_medusa_heads(tmp_path)
    assert (num_heads, num_layers) == (4, 2)
    assert len(state_dict) == 4 * (2 * 2 + 1)


def test_apply_heads_matches_the_formula(tmp_path: Path) -> None:
    tensors = _fake_heads(2, 2)
    x = torch.randn(3, 5, 8, generator=torch.Generator().manual_seed(1))
    out = apply_heads(tensors, 2, 2, x)
    assert out.shape == (2, 3, 5, 16)
    h = x
    for layer in range(2):
        h = h + torch.nn.functional.silu(h @ tensors[f"1.{layer}.linear.weight"].T + tensors[f"1.{layer}.linear.bias"])
    torch.testing.assert_close(out[1], h @ tensors["1.2.weight"].T)


def test_pickle_needs_opt_in(tmp_path: Path) -> None:
    """The trainer refuses a pickled head file with the converter's words (one rule: specbuild.pickle_weights)."""
    torch.save(_fake_heads(3, 1), tmp_path / "medusa_lm_head.pt")
    with pytest.raises(CheckpointError, match=r"weights are pickle files \(medusa_lm_head.pt\)") as refused:
        load_medusa_heads(tmp_path)
    assert "--allow-pickle" in (refused.value.hint or "")
    state_dict, num_heads, num_layers = load_medusa_heads(tmp_path, allow_pickle=True)
    assert (num_heads, num_layers) == (3, 1)
    torch.testing.assert_close(state_dict["2.1.weight"], _fake_heads(3, 1)["2.1.weight"])


@pytest.mark.parametrize(
    ("drop", "message"),
    [("1.0.linear.bias", r"missing '1\.0\.linear\.bias'"), ("2.1.weight", "head 2 has no vocab projection")],
)
def test_incomplete_heads_are_refused(tmp_path: Path, drop: str, message: str) -> None:
    tensors = _fake_heads(3, 1)
    del tensors[drop]
    save_file(tensors, tmp_path / "medusa_lm_head.safetensors")
    with pytest.raises(CheckpointError, match=message):
        load_medusa_heads(tmp_path)


# ---------------------------------------------------------------------------------------------- training


def test_training_is_deterministic_and_saves_atomically(demo_models: dict[str, Path], tmp_path: Path) -> None:
    """A few steps on the demo target twice: identical bytes; a rerun replaces its own output."""
    texts = dm.training_texts()[:40]
    kwargs = {"num_heads": 2, "num_layers": 1, "steps": 3, "seq_len": 16, "batch_size": 2, "seed": 5,
              "texts": texts, "eval_texts": dm.heldout_texts()[:5], "progress": False}
    first = train_medusa_heads(demo_models["target"], tmp_path / "a", **kwargs)
    train_medusa_heads(demo_models["target"], tmp_path / "b", **kwargs)
    weights = "medusa_lm_head.safetensors"
    assert (tmp_path / "a" / weights).read_bytes() == (tmp_path / "b" / weights).read_bytes()
    assert {"head0_top1", "head1_top5", "train_seconds", "base_top1_at_t2"} <= set(first)
    train_medusa_heads(demo_models["target"], tmp_path / "a", **{**kwargs, "seed": 6})
    assert (tmp_path / "a" / weights).read_bytes() != (tmp_path / "b" / weights).read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]  # no temporary leftovers


def test_medusa_train_cli_writes_heads_the_converter_reads(demo_models: dict[str, Path], tmp_path: Path) -> None:
    """`specbuild medusa train` output feeds `specbuild convert --medusa-heads` directly."""
    from typer.testing import CliRunner

    from specbuild.cli import app

    runner = CliRunner()
    heads = tmp_path / "heads"
    result = runner.invoke(app, ["medusa", "train", "--base", str(demo_models["target"]), "--output", str(heads),
                                 "--num-heads", "2", "--steps", "3", "--seq-len", "16", "--batch-size", "2"])
    assert result.exit_code == 0, result.output
    assert "head0_top1" in result.output
    converted = runner.invoke(app, ["convert", "--model", str(demo_models["target"]), "--medusa-heads", str(heads),
                                    "--output", str(tmp_path / "ckpt"), "--max-draft-len", "3"])
    assert converted.exit_code == 0, converted.output
    config = json.loads((tmp_path / "ckpt/config.json").read_text())
    assert (config["num_medusa_heads"], config["num_medusa_layers"]) == (2, 1)
