"""EAGLE-3 in the reference runtime: the draft checkpoint format, the target's captured hidden states, and decoding.

What users rely on: a draft written here is read back unchanged and a broken one is refused naming the file and
the tensor; layer id i is decoder layer i's output exactly as transformers' `output_hidden_states[i + 1]`;
EAGLE-3 greedy output is the target's plain greedy output token for token (for a batch of different prompts and
lengths, with end id and stop words), and sampled output follows the target's distribution, whatever the draft.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from specbuild.convert.pipeline import ConvertRequest, convert_checkpoint
from specbuild.eagle.format import (
    CONFIG_NAME,
    WEIGHTS_NAME,
    Eagle3DraftConfig,
    default_layer_ids,
    draft_to_target,
    read_eagle3_draft,
    vllm_layer_ids,
    write_eagle3_draft,
)
from specbuild.errors import CheckpointError
from specbuild.medusa.tree import load_choices
from specbuild.runtime.eagle3 import Eagle3Draft
from specbuild.runtime.eagle3_decoding import Eagle3Config, generate_eagle3
from specbuild.runtime.generation import generate
from specbuild.runtime.model import CausalLM
from specbuild.runtime.sequence import StopCriteria
from tests.eagle3_fixtures import random_draft_config, random_draft_tensors, write_random_draft
from tests.test_runtime_decoding import PARAMS, VOCAB, marginal_p_value
from tests.tiny_models import make_checkpoint

SMALL = Eagle3DraftConfig(hidden_size=16, intermediate_size=24, num_attention_heads=4, num_key_value_heads=2,
                          head_dim=4, vocab_size=50, draft_vocab_size=20, target_layer_ids=(1, 2, 4))


# -- the format ----------------------------------------------------------------------------------------------------
def test_format_round_trip(tmp_path: Path) -> None:
    tensors = random_draft_tensors(SMALL, own_embedding=True)
    write_eagle3_draft(tmp_path / "d", SMALL, tensors)
    config, read = read_eagle3_draft(tmp_path / "d")
    assert config == SMALL
    assert read.keys() == tensors.keys()
    assert all(torch.equal(read[k], tensors[k].to(read[k].dtype)) for k in tensors)
    data = json.loads((tmp_path / "d" / CONFIG_NAME).read_text())
    assert data["architectures"] == ["LlamaForCausalLMEagle3"] and data["draft_vocab_size"] == 20
    # Our ids (output of layer i) where SGLang and ModelOpt read them; vLLM's (input of layer i + 1) where it does.
    assert data["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 2, 4]
    assert data["eagle_aux_hidden_state_layer_ids"] == [2, 3, 5]
    targets = draft_to_target(config, read)  # draft index d is target token d + d2t[d], each a distinct token
    assert targets.unique().numel() == 20 and bool(read["t2d"][targets].all()) and int(read["t2d"].sum()) == 20


def test_default_layer_ids_are_tensorrt_llms() -> None:
    assert default_layer_ids(32) == (1, 15, 28)
    assert vllm_layer_ids(default_layer_ids(32)) == (2, 16, 29)  # vLLM's own default (2, n // 2, n - 3)
    with pytest.raises(CheckpointError, match="no default EAGLE-3 capture layers"):
        default_layer_ids(5)


def _break(directory: Path, change: str) -> None:
    from safetensors.torch import load_file, save_file

    path = directory / WEIGHTS_NAME
    tensors = load_file(str(path))
    if change == "missing":
        del tensors["midlayer.self_attn.k_proj.weight"]
    elif change == "extra":
        tensors["midlayer.self_attn.rotary_emb.inv_freq"] = torch.zeros(2)
    elif change == "shape":
        tensors["fc.weight"] = torch.zeros(16, 32)
    elif change == "d2t":
        tensors["d2t"] = torch.full((20,), 49)
    save_file(tensors, str(path))


@pytest.mark.parametrize(("change", "message"), [
    ("missing", "missing tensor 'midlayer.self_attn.k_proj.weight'"),
    ("extra", "unexpected tensor 'midlayer.self_attn.rotary_emb.inv_freq'"),
    ("shape", r"tensor 'fc.weight' has shape \[16, 32\], expected \[16, 48\]"),
    ("d2t", "tensor 'd2t' maps draft ids to target ids outside"),
])
def test_reader_refuses_broken_tensors(tmp_path: Path, change: str, message: str) -> None:
    write_eagle3_draft(tmp_path / "d", SMALL, random_draft_tensors(SMALL))
    _break(tmp_path / "d", change)
    with pytest.raises(CheckpointError, match=message) as err:
        read_eagle3_draft(tmp_path / "d")
    assert str(tmp_path / "d" / WEIGHTS_NAME) in str(err.value)


@pytest.mark.parametrize(("edit", "message"), [
    ({"architectures": ["LlamaForCausalLM"]}, "not an EAGLE-3 draft"),
    ({"eagle_aux_hidden_state_layer_ids": [1, 2, 4]}, "name different layers"),
    ({"num_hidden_layers": 2}, "one-layer EAGLE-3 drafts"),
    ({"hidden_size": None}, "missing hidden_size"),
])
def test_reader_refuses_bad_config(tmp_path: Path, edit: dict, message: str) -> None:
    write_eagle3_draft(tmp_path / "d", SMALL, random_draft_tensors(SMALL))
    path = tmp_path / "d" / CONFIG_NAME
    data = json.loads(path.read_text())
    data.update(edit)
    path.write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match=message) as err:
        read_eagle3_draft(tmp_path / "d")
    assert str(path) in str(err.value)


def test_writer_checks_before_writing(tmp_path: Path) -> None:
    tensors = random_draft_tensors(SMALL)
    del tensors["d2t"]  # a smaller draft vocabulary needs its map
    with pytest.raises(CheckpointError, match="missing tensor 'd2t'"):
        write_eagle3_draft(tmp_path / "d", SMALL, tensors)
    assert not (tmp_path / "d").exists()


def test_modelopt_layer_names_are_read(tmp_path: Path) -> None:
    """ModelOpt's export names the decoder layer `layers.0.`; every engine (and this reader) takes it."""
    from safetensors.torch import load_file, save_file

    write_eagle3_draft(tmp_path / "d", SMALL, random_draft_tensors(SMALL))
    path = tmp_path / "d" / WEIGHTS_NAME
    tensors = load_file(str(path))
    save_file({k.replace("midlayer.", "layers.0."): v for k, v in tensors.items()}, str(path))
    assert read_eagle3_draft(tmp_path / "d")[1].keys() == tensors.keys()


# -- captured hidden states ----------------------------------------------------------------------------------------
def test_captured_layers_are_hf_hidden_states(tmp_path: Path) -> None:
    """Layer id i is decoder layer i's output: transformers' output_hidden_states[i + 1] (its last entry is after
    the final norm, so the last layer is compared against the pre-norm output through the norm)."""
    from transformers import AutoModelForCausalLM

    hf_dir = make_checkpoint(tmp_path / "hf", "llama", seed=3, num_hidden_layers=4, dtype=torch.float32)
    convert_checkpoint(ConvertRequest("target", hf_dir, tmp_path / "trt", "float32"))
    model = CausalLM.from_checkpoint(tmp_path / "trt")
    hf = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    ids = torch.tensor([[3, 14, 15, 92, 65, 35]])
    with torch.no_grad():
        expected = hf(ids, output_hidden_states=True).hidden_states
    out = model(ids, model.new_cache(1, 8), capture_layers=(0, 1, 2, 3))
    for i in range(3):
        torch.testing.assert_close(out.captured[i], expected[i + 1], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(model.ln_f(out.captured[3]), expected[4], atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="capture_layers"):
        model(ids, model.new_cache(1, 8), capture_layers=(4,))


# -- decoding on the demo target -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def demo_target(demo_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> CausalLM:
    out = tmp_path_factory.mktemp("eagle3-target") / "target"
    convert_checkpoint(ConvertRequest("target", demo_models["target"], out, "float32"))
    return CausalLM.from_checkpoint(out)


@pytest.fixture(scope="module")
def demo_prompts(demo_models: dict[str, Path]) -> list[list[int]]:
    from transformers import AutoTokenizer

    from specbuild.demo.models import heldout_texts

    tok = AutoTokenizer.from_pretrained(demo_models["target"])
    ids = [tok.encode(t, add_special_tokens=False) for t in heldout_texts()[:3]]
    return [ids[0][:9], ids[1][:23], ids[2][:4]]  # different lengths in one batch


@pytest.mark.parametrize(("k", "draft_vocab"), [(1, None), (4, 700)])
def test_greedy_equals_plain_greedy(demo_target: CausalLM, demo_prompts: list[list[int]], tmp_path: Path,
                                    k: int, draft_vocab: int | None) -> None:
    draft = Eagle3Draft.from_directory(write_random_draft(tmp_path / "d", demo_target, draft_vocab_size=draft_vocab),
                                       demo_target)
    assert draft.layer_ids == default_layer_ids(demo_target.config.num_layers)
    stop = StopCriteria(max_new_tokens=20)
    plain = generate(demo_target, demo_prompts, stop=stop)
    streamed: dict[int, list[int]] = {}
    result = generate_eagle3(demo_target, draft, demo_prompts, Eagle3Config(k), stop=stop,
                             on_tokens=lambda row, tokens: streamed.setdefault(row, []).extend(tokens))
    assert result.output_ids == plain.output_ids
    assert streamed == dict(enumerate(plain.output_ids))
    stats = result.stats
    assert stats.generated_tokens == sum(map(len, plain.output_ids))
    assert stats.proposed_by_position and len(stats.proposed_by_position) <= k
    assert stats.target_forwards <= plain.stats.target_forwards


def test_greedy_stop_rules(demo_target: CausalLM, demo_prompts: list[list[int]], tmp_path: Path) -> None:
    """End id and stop words cut the output where plain decoding cuts it, rows finishing in different rounds."""
    draft = Eagle3Draft.from_directory(write_random_draft(tmp_path / "d", demo_target, seed=2), demo_target)
    free = generate(demo_target, demo_prompts, stop=StopCriteria(max_new_tokens=16)).output_ids
    end_id, word = free[0][5], tuple(free[1][3:5])  # derived from this run: tokens the target does emit
    for stop in (StopCriteria(max_new_tokens=16, end_id=end_id), StopCriteria(max_new_tokens=16, stop_words=(word,)),
                 StopCriteria(max_new_tokens=16, stop_words=(word,), include_stop_words=True)):
        expected = generate(demo_target, demo_prompts, stop=stop).output_ids
        assert generate_eagle3(demo_target, draft, demo_prompts, Eagle3Config(3), stop=stop).output_ids == expected


def test_draft_must_fit_its_target(demo_target: CausalLM, tmp_path: Path) -> None:
    config = random_draft_config(demo_target, layer_ids=(1, 3, 8))
    write_eagle3_draft(tmp_path / "a", config, random_draft_tensors(config))
    with pytest.raises(CheckpointError, match=r"\[8\] is not a layer of the target's 8 \(valid ids: 0..7"):
        Eagle3Draft.from_directory(tmp_path / "a", demo_target)
    other = Eagle3DraftConfig(**{**random_draft_config(demo_target).__dict__, "vocab_size": 4096})
    write_eagle3_draft(tmp_path / "b", other, random_draft_tensors(other))
    with pytest.raises(CheckpointError, match="vocab_size 4096 differs from the target's 2048"):
        Eagle3Draft.from_directory(tmp_path / "b", demo_target)


# -- trees (greedy) ------------------------------------------------------------------------------------------------
TOP24 = tuple(tuple(c) for c in load_choices("mc_sim_7b_top24"))


@pytest.mark.parametrize("name", ["mc_sim_7b_top24", "mc_sim_7b_63"])
def test_tree_greedy_equals_plain_greedy(demo_target: CausalLM, demo_prompts: list[list[int]], demo_extra,
                                         name: str) -> None:
    """A static tree drafted by the demo draft and verified in one target forward per round: the output is plain
    greedy's for a batch of different lengths under every stop rule (an accepted path may run past the last token
    wanted), in fewer target forwards than plain decoding."""
    draft = Eagle3Draft.from_directory(demo_extra("eagle3-draft"), demo_target)
    choices = tuple(tuple(c) for c in load_choices(name))
    config = Eagle3Config(num_draft_tokens=max(map(len, choices)), choices=choices)
    free = generate(demo_target, demo_prompts, stop=StopCriteria(max_new_tokens=24))
    end_id, word = free.output_ids[0][5], tuple(free.output_ids[1][3:5])  # tokens the target does emit, this run
    for stop in (StopCriteria(max_new_tokens=24), StopCriteria(max_new_tokens=24, end_id=end_id),
                 StopCriteria(max_new_tokens=24, stop_words=(word,)),
                 StopCriteria(max_new_tokens=24, stop_words=(word,), include_stop_words=True)):
        plain = generate(demo_target, demo_prompts, stop=stop)
        streamed: dict[int, list[int]] = {}
        result = generate_eagle3(demo_target, draft, demo_prompts, config, stop=stop,
                                 on_tokens=lambda row, tokens, seen=streamed: seen.setdefault(row, []).extend(tokens))
        assert result.output_ids == plain.output_ids
        if not stop.stop_words or stop.include_stop_words:  # an excluded stop word's first part was streamed
            assert streamed == {b: out for b, out in enumerate(plain.output_ids) if out}
    assert result.stats.target_forwards < free.stats.target_forwards


def test_tree_path_is_the_chain(demo_target: CausalLM, demo_prompts: list[list[int]], tmp_path: Path) -> None:
    """The tree's all-top-1 path is exactly the chain's drafts from the same state: the depth-by-depth forwards'
    masks and positions give each node what the chain step at that depth sees."""
    from specbuild.runtime.eagle3_decoding import _Eagle3Run
    from specbuild.runtime.sampling import SamplingParams

    draft = Eagle3Draft.from_directory(write_random_draft(tmp_path / "d", demo_target, seed=4), demo_target)
    stop = StopCriteria(max_new_tokens=8)
    choices = ((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (1, 0, 0), (0, 0, 0, 0))
    tree_run = _Eagle3Run(demo_target, draft, demo_prompts, SamplingParams(), stop, Eagle3Config(4, choices), None)
    chain_run = _Eagle3Run(demo_target, draft, demo_prompts, SamplingParams(), stop, Eagle3Config(4), None)
    tree_run.prefill()
    chain_run.prefill()
    rows = list(range(len(demo_prompts)))
    tokens = tree_run._draft_tree(tree_run.tree, rows)
    chain, _ = chain_run._draft(rows, dict.fromkeys(rows, 4), sampling=False)
    path = [1 + choices.index(choices[0][:1] * d) for d in range(1, 5)]  # nodes (0,), (0, 0), ...
    assert [tokens[b, path].tolist() for b in rows] == [chain[b] for b in rows]
    assert tree_run.draft_cache.lengths.tolist() == chain_run.draft_cache.lengths.tolist()  # rolled back alike


def test_tree_deeper_than_allowed_or_sampled_is_refused(demo_target: CausalLM, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="tree is 3 deep but num_draft_tokens allows 2"):
        Eagle3Config(num_draft_tokens=2, choices=((0,), (0, 0), (0, 0, 0)))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):  # a path whose parent is missing, named
        Eagle3Config(num_draft_tokens=2, choices=((0, 1),))
    draft = Eagle3Draft.from_directory(write_random_draft(tmp_path / "d", demo_target), demo_target)
    with pytest.raises(ValueError, match="verified greedily"):
        generate_eagle3(demo_target, draft, [[1, 2, 3]], Eagle3Config(3, TOP24), PARAMS)


# -- sampling keeps the target's distribution ----------------------------------------------------------------------
def test_sampling_matches_target_distribution(tmp_path: Path) -> None:
    """A random (so wrong) draft with sharp proposals: the output still follows the target's exact marginals, by the
    chi-square test the draft-target test uses (whose wrong-rule control shows the test can fail)."""
    hf = make_checkpoint(tmp_path / "hf", "llama", seed=0, vocab_size=VOCAB, num_hidden_layers=3)
    convert_checkpoint(ConvertRequest("target", hf, tmp_path / "target", "float32"))
    target = CausalLM.from_checkpoint(tmp_path / "target")
    for name, param in target.named_buffers():
        if name == "lm_head":
            param.mul_(40.0)  # random init is near-uniform: sharpen p so that q differs from it
    draft = Eagle3Draft.from_directory(
        write_random_draft(tmp_path / "d", target, layer_ids=(0, 1, 2), lm_head_scale=20.0, seed=5), target)
    prompt, trials = [1, 2, 3], 2000
    result = generate_eagle3(target, draft, [prompt] * trials, Eagle3Config(2), PARAMS, StopCriteria(max_new_tokens=3))
    assert sum(result.stats.accepted_by_position) < sum(result.stats.proposed_by_position)  # rejections happened
    for position in (1, 2):  # position 0 is the prefill's own draw; 1 and 2 are drafts accepted or resampled
        p_value = marginal_p_value(target, prompt, position, result.output_ids)
        assert p_value > 0.01, f"position {position}: p={p_value:.2e}"
