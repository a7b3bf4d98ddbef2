"""`specbuild eagle train`: an EAGLE-3 draft trained on a frozen target.

What users rely on: training lowers the draft's held-out loss and makes it agree with the target more often
than the untrained draft (both measured in the same run); the trained module computes exactly what the reference
runtime's `Eagle3Draft` computes from the written checkpoint (two paths of one model: the first drafted token
over a context and a chained step on the draft's own output); the checkpoint reads back through the format's
reader with the module's tensors; the same seed writes the same bytes; a target that is not a Llama-family HF
checkpoint, or settings that leave nothing to score, are refused with the field named and nothing written. On
the demo target, the demo extra's greedy EAGLE-3 output is the target's plain greedy output, and it needs fewer
target forwards than an untrained draft of the same shape.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from specbuild import corpus
from specbuild.cli.app import app
from specbuild.convert.pipeline import ConvertRequest, convert_checkpoint
from specbuild.eagle.format import WEIGHTS_NAME, read_eagle3_draft
from specbuild.eagle.train import (
    Eagle3TrainSettings,
    build_draft,
    load_target,
    target_outputs,
    train_eagle3,
    ttt_mask,
)
from specbuild.errors import CheckpointError, SpecbuildError
from specbuild.runtime.eagle3 import Eagle3Draft
from specbuild.runtime.model import CausalLM
from tests.tiny_models import edit_config, make_checkpoint

TEXTS = corpus.training_texts()[:40]
HELD = corpus.heldout_texts()[:6]
QUICK = Eagle3TrainSettings(steps=40, lr=5e-3, seq_len=32, batch_size=4, seed=1)


def _tiny_target(directory: Path) -> Path:
    """A random 8-layer Llama in float32 with a tokenizer of its own vocabulary (trained on the corpus slice)."""
    from specbuild.demo.tokenizer import save_tokenizer, train_tokenizer

    make_checkpoint(directory, "llama", seed=3, dtype=torch.float32, num_hidden_layers=8, vocab_size=512,
                    bos_token_id=1, eos_token_id=2, pad_token_id=3)
    save_tokenizer(train_tokenizer(TEXTS, 512), directory, 256)
    return directory


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _tiny_target(tmp_path_factory.mktemp("eagle3-target") / "hf")


@pytest.fixture(scope="module")
def trained(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, float]]:
    out = tmp_path_factory.mktemp("eagle3-draft") / "draft"
    return out, train_eagle3(tiny, out, QUICK, texts=TEXTS, eval_texts=HELD, progress=False)


def test_training_lowers_the_loss_and_beats_the_untrained_draft(trained: tuple[Path, dict[str, float]]) -> None:
    _, metrics = trained
    assert metrics["loss"] < metrics["init_loss"]
    assert metrics["step1_top1"] > metrics["init_step1_top1"]
    assert {f"step{k}_top1" for k in (1, 2, 3)} <= metrics.keys()


def test_the_checkpoint_reads_back_with_the_modules_tensors(tiny: Path, trained: tuple[Path, dict[str, float]]
                                                            ) -> None:
    out, metrics = trained
    config, tensors = read_eagle3_draft(out)
    assert config.target_layer_ids == (1, 3, 4)  # TensorRT-LLM's default for 8 layers, written out
    assert config.draft_vocab == config.vocab_size == 512 and "d2t" not in tensors
    draft = build_draft(load_target(tiny))
    assert set(tensors) == set(draft.state_dict())  # every parameter written under its checkpoint name, nothing else
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["metrics"] == metrics and manifest["settings"]["steps"] == QUICK.steps


def test_the_same_seed_writes_the_same_bytes(tiny: Path, tmp_path: Path) -> None:
    settings = Eagle3TrainSettings(steps=3, seq_len=16, batch_size=2, seed=5)
    for name in ("a", "b"):
        train_eagle3(tiny, tmp_path / name, settings, texts=TEXTS[:5], eval_texts=HELD[:2], progress=False)
    assert (tmp_path / "a" / WEIGHTS_NAME).read_bytes() == (tmp_path / "b" / WEIGHTS_NAME).read_bytes()


def test_target_outputs_computed_once_train_as_computed_per_step(tiny: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """On a regenerated set the target's features and distributions are computed once and reused; the draft
    trained that way is the one a per-step target forward trains (the target is frozen)."""
    import specbuild.eagle.train as train

    settings = Eagle3TrainSettings(steps=4, seq_len=16, batch_size=2, seed=2, regenerate=6, prompt_tokens=4,
                                   eval_sequences=2)
    train_eagle3(tiny, tmp_path / "once", settings, texts=TEXTS[:5], eval_texts=HELD[:2], progress=False)
    monkeypatch.setattr(train, "PRECOMPUTE_BYTES", 0)  # nothing fits: the target runs on every batch
    train_eagle3(tiny, tmp_path / "each", settings, texts=TEXTS[:5], eval_texts=HELD[:2], progress=False)
    _, once = read_eagle3_draft(tmp_path / "once")
    _, each = read_eagle3_draft(tmp_path / "each")
    for name, tensor in once.items():
        assert float((tensor - each[name]).abs().max()) < 1e-4, (name, float((tensor - each[name]).abs().max()))


def _trained_module(tiny: Path, out: Path) -> tuple[object, object]:
    """The training module loaded with the written tensors, and the frozen HF target."""
    model = load_target(tiny)
    draft = build_draft(model)
    _, tensors = read_eagle3_draft(out)
    draft.load_state_dict(tensors)
    return draft.eval(), model


def test_module_logits_equal_the_runtime_draft(tiny: Path, trained: tuple[Path, dict[str, float]],
                                               tmp_path: Path) -> None:
    out, _ = trained
    draft, model = _trained_module(tiny, out)
    convert_checkpoint(ConvertRequest("target", tiny, tmp_path / "trt", "float32"))
    target = CausalLM.from_checkpoint(tmp_path / "trt")
    runtime = Eagle3Draft.from_directory(out, target)

    ids = torch.tensor([[1, 40, 7, 300, 12, 99, 5, 61, 230, 17]])
    t = ids.shape[1] - 1
    aux, _ = target_outputs(model, ids[:, :t], draft.cfg.target_layer_ids)
    with torch.no_grad():
        # the first drafted token: every position of the context, causal
        ours, kv = draft.step(draft.project(aux), ids[:, 1:], torch.arange(t)[None], [], ttt_mask(t, 0))
        cache = runtime.new_cache(1, 32)
        theirs_logits, theirs = runtime(ids[:, 1:], runtime.fuse(aux), cache)
        torch.testing.assert_close(draft.logits(ours), theirs_logits, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
        # a chained step on the draft's own output: one new position after the context
        token = theirs_logits[:, -1:].argmax(-1)
        cache.advance(torch.tensor([t]))
        chained, _ = draft.step(ours[:, -1:], token, torch.tensor([[t]]), [kv], torch.ones(1, t + 1, dtype=torch.bool))
        theirs_logits2, _ = runtime(token, theirs[:, -1:], cache)
        torch.testing.assert_close(draft.logits(chained), theirs_logits2, rtol=1e-5, atol=1e-5)


def test_ttt_mask_is_the_chain_each_drafted_token_sees() -> None:
    mask = ttt_mask(5, 2)  # pass 2: two drafts after the true context
    q = 4
    true_context = mask[q, :5].nonzero().flatten().tolist()
    own_chain = [int(i) for i in range(5, 15) if mask[q, i]]
    assert true_context == [0, 1, 2]  # the chain began after position q - 2
    assert own_chain == [5 + 3, 10 + 4]  # pass 1's key at q-1, pass 2's own key at q
    assert bool(mask.any(-1).all())  # no row without a key (softmax stays finite)


# -- refusals ------------------------------------------------------------------------------------------------------
def test_a_target_no_engine_serves_eagle3_on_is_refused(tmp_path: Path) -> None:
    hf = make_checkpoint(tmp_path / "gpt2", "gpt2", dtype=torch.float32)
    with pytest.raises(CheckpointError, match=r"config\.json: a GPT-2 \(GPT2LMHeadModel\) target: no engine serves"):
        train_eagle3(hf, tmp_path / "out", QUICK, texts=TEXTS, eval_texts=HELD, progress=False)
    assert not (tmp_path / "out").exists()


def test_a_target_with_too_few_layers_is_refused(tiny: Path, tmp_path: Path) -> None:
    shallow = tmp_path / "shallow"
    shutil.copytree(tiny, shallow)
    edit_config(shallow, num_hidden_layers=4)
    with pytest.raises(CheckpointError, match="num_hidden_layers"):
        train_eagle3(shallow, tmp_path / "out", QUICK, texts=TEXTS, eval_texts=HELD, progress=False)
    assert not (tmp_path / "out").exists()


def test_a_directory_without_config_is_refused(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match=r"config\.json: not found"):
        train_eagle3(tmp_path / "empty", tmp_path / "out", QUICK, progress=False)


@pytest.mark.parametrize("settings, field", [
    (Eagle3TrainSettings(seq_len=4, ttt_steps=3), "seq_len"),
    (Eagle3TrainSettings(steps=0), "steps"),
    (Eagle3TrainSettings(lr=0.0), "lr"),
    (Eagle3TrainSettings(regenerate=8, prompt_tokens=64, seq_len=64), "prompt_tokens"),
])
def test_settings_that_leave_nothing_to_train_are_refused(tiny: Path, tmp_path: Path,
                                                          settings: Eagle3TrainSettings, field: str) -> None:
    with pytest.raises(SpecbuildError, match=field):
        train_eagle3(tiny, tmp_path / "out", settings, texts=TEXTS, eval_texts=HELD, progress=False)
    assert not (tmp_path / "out").exists()


def test_the_command_refuses_in_one_line(tmp_path: Path) -> None:
    hf = make_checkpoint(tmp_path / "gpt2", "gpt2", dtype=torch.float32)
    result = CliRunner().invoke(app, ["eagle", "train", str(hf), str(tmp_path / "out"), "--steps", "2"])
    assert result.exit_code == 1
    assert "a GPT-2 (GPT2LMHeadModel) target: no engine serves" in result.output and "Traceback" not in result.output


# -- the demo extra ------------------------------------------------------------------------------------------------
def test_demo_eagle3_draft_decodes_the_targets_greedy_text_in_fewer_forwards(
    demo_models: dict[str, Path], demo_extra, tmp_path: Path
) -> None:
    from specbuild.runtime.eagle3_decoding import Eagle3Config, generate_eagle3
    from specbuild.runtime.generation import generate
    from specbuild.runtime.sequence import StopCriteria
    from specbuild.tokenizer import load_tokenizer
    from tests.eagle3_fixtures import write_random_draft

    directory = demo_extra("eagle3-draft")
    metrics = json.loads((directory / "demo-extra.json").read_text())["metrics"]
    assert metrics["loss"] < metrics["init_loss"] and metrics["step1_top1"] > metrics["init_step1_top1"]

    convert_checkpoint(ConvertRequest("target", demo_models["target"], tmp_path / "trt", "float32"))
    target = CausalLM.from_checkpoint(tmp_path / "trt")
    trained_draft = Eagle3Draft.from_directory(directory, target)
    untrained = Eagle3Draft.from_directory(write_random_draft(tmp_path / "random", target,
                                                              layer_ids=trained_draft.layer_ids), target)
    tokenizer = load_tokenizer(demo_models["target"])
    prompts = [tokenizer(text[:200])["input_ids"][:20] for text in corpus.heldout_texts()[:3]]
    stop = StopCriteria(max_new_tokens=32)
    plain = generate(target, prompts, stop=stop)
    config = Eagle3Config(num_draft_tokens=4)
    ours = generate_eagle3(target, trained_draft, prompts, config, stop=stop)
    theirs = generate_eagle3(target, untrained, prompts, config, stop=stop)
    assert ours.output_ids == plain.output_ids == theirs.output_ids
    assert ours.stats.target_forwards < theirs.stats.target_forwards
