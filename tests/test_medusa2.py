"""Medusa-2 (`specbuild medusa train --joint`): the base fine-tuned together with its heads.

What a user relies on: the heads get better at what they are asked at serving time (the model's own greedy
text) while the base stays, within a stated margin, as good a language model as the original; the new base and
heads go through convert and decode with Medusa greedy output equal to the new base's own greedy output; bad
input is refused before anything is written. Every expectation is measured in the same run (the demo weights
differ from CPU to CPU).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from specbuild import corpus
from specbuild.convert.pipeline import ConvertRequest, convert_checkpoint
from specbuild.demo.recipe import RECIPE
from specbuild.errors import CheckpointError, SpecbuildError
from specbuild.medusa.joint import HEADS_BASE_NAME, JointSettings, own_text_scores, train_medusa_joint, unigram_loss
from specbuild.medusa.train import build_heads, evaluate_heads, load_medusa_heads, write_heads
from specbuild.tokenizer import load_tokenizer
from specbuild.training import token_stream

# The base's held-out loss may rise by at most this fraction of the original's gain over a unigram model (one that
# knows token frequencies and no context). That gain is what the base learnt from context; Medusa-2 must keep 95%
# of it. On the demo target the gain is about 1.3 nats/token (5.05 against 6.38), so the margin is about 0.07 nats;
# the shipped recipe moved the loss by -0.003 (measured on 2 cores). The test derives the margin from the same
# run's own figures, so it holds for weights trained on any CPU.
KEPT_GAIN = 0.95


@pytest.fixture(scope="module")
def medusa2(demo_extra) -> Path:  # type: ignore[no-untyped-def]
    return demo_extra("medusa2")


def _load(directory: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()


def _heads(directory: Path) -> torch.nn.ModuleList:
    state_dict, num_heads, num_layers = load_medusa_heads(directory)
    vocab, hidden = state_dict[f"0.{num_layers}.weight"].shape
    heads = build_heads(int(hidden), int(vocab), num_heads, num_layers)
    heads.load_state_dict(state_dict)
    return heads.eval()


def test_joint_training_lowers_the_heads_loss_and_keeps_the_base_close(
    demo_models: dict[str, Path], medusa2: Path
) -> None:
    """Original base + Medusa-1 heads against new base + Medusa-2 heads, scored here on held-out text."""
    settings = JointSettings()
    tokenizer = load_tokenizer(demo_models["target"])
    train_ids = token_stream(tokenizer, corpus.training_texts(RECIPE.heldout_every))
    held_ids = token_stream(tokenizer, corpus.heldout_texts(RECIPE.heldout_every))
    pairs = {"medusa-1": (_load(demo_models["target"]), _heads(demo_models["medusa-heads"])),
             "medusa-2": (_load(medusa2 / "base"), _heads(medusa2 / "heads"))}
    span = settings.seq_len + len(pairs["medusa-1"][1]) + 1
    scores = {}
    for name, (model, heads) in pairs.items():
        scores[name] = evaluate_heads(heads, model, held_ids, train_ids, settings.seq_len, span)
        scores[name] |= own_text_scores(model, heads, held_ids, settings, span, tokenizer.eos_token_id)
    before, after = scores["medusa-1"], scores["medusa-2"]
    # the heads' loss on each model's own greedy continuations of held-out prompts: what speculation asks of them
    assert after["heads_own_loss"] < before["heads_own_loss"], (before, after)
    assert after["head0_own_top1"] > before["head0_own_top1"], (before, after)
    unigram = unigram_loss(train_ids, held_ids, pairs["medusa-1"][0].config.vocab_size)
    gain = unigram - before["base_heldout_loss"]
    assert gain > 0, "the original base should beat a unigram model on held-out text"
    margin = (1 - KEPT_GAIN) * gain
    assert after["base_heldout_loss"] <= before["base_heldout_loss"] + margin, (before, after, margin)


def test_training_reports_before_and_after(medusa2: Path) -> None:
    """The extra's manifest holds the run's own measurements: heads better on the model's own text, base close."""
    metrics = json.loads((medusa2 / "manifest.json").read_text())["metrics"]
    before, after = metrics["before"], metrics["after"]
    assert after["heads_own_loss"] < before["heads_own_loss"]
    gain = metrics["unigram_heldout_loss"] - before["base_heldout_loss"]
    assert after["base_heldout_loss"] <= before["base_heldout_loss"] + (1 - KEPT_GAIN) * gain
    assert metrics["kl_to_original"] >= 0 and 0 < metrics["greedy_agreement"] <= 1
    config = json.loads((medusa2 / "heads/config.json").read_text())
    assert config["base_model_name_or_path"] == HEADS_BASE_NAME
    assert (medusa2 / "heads" / HEADS_BASE_NAME).resolve() == (medusa2 / "base").resolve()
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        assert (medusa2 / "base" / name).is_file()


@pytest.mark.parametrize("tree", ["mc_sim_7b_top8", "mc_sim_7b_63"])
def test_new_base_and_heads_convert_and_decode_as_the_new_base(
    demo_models: dict[str, Path], medusa2: Path, tmp_path: Path, tree: str
) -> None:
    """Through the converter, Medusa greedy output is the new base's plain greedy output, in fewer forwards."""
    from specbuild.medusa.tree import load_choices
    from specbuild.runtime.generation import generate
    from specbuild.runtime.medusa_decoding import MedusaConfig, generate_medusa
    from specbuild.runtime.model import CausalLM
    from specbuild.runtime.sequence import StopCriteria

    convert_checkpoint(ConvertRequest("target", medusa2 / "base", tmp_path / "plain", "float32"))
    convert_checkpoint(ConvertRequest("medusa", medusa2 / "base", tmp_path / "medusa", "float32",
                                      medusa_heads=medusa2 / "heads"))
    tokenizer = load_tokenizer(medusa2 / "base")
    texts = corpus.heldout_texts(RECIPE.heldout_every)[:3]
    ids = [tokenizer(t, add_special_tokens=False).input_ids for t in texts]
    prompts = [ids[0][:9], ids[1][:23], ids[2][:4]]
    stop = StopCriteria(max_new_tokens=24)
    plain = generate(CausalLM.from_checkpoint(tmp_path / "plain"), prompts, stop=stop)
    medusa = generate_medusa(CausalLM.from_checkpoint(tmp_path / "medusa"), prompts,
                             MedusaConfig(tuple(tuple(c) for c in load_choices(tree))), stop=stop)
    assert medusa.output_ids == plain.output_ids
    assert medusa.stats.target_forwards < plain.stats.target_forwards


# ---------------------------------------------------------------------------------------------- refusals


def test_a_base_without_config_is_refused_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / "base").mkdir()
    with pytest.raises(CheckpointError, match=r"base/config\.json: not found"):
        train_medusa_joint(tmp_path / "base", None, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_heads_of_another_base_are_refused_naming_them(demo_models: dict[str, Path], tmp_path: Path) -> None:
    wrong = build_heads(64, 2048, 2, 1)  # hidden 64: not the demo target's 256
    write_heads(tmp_path / "heads", wrong, demo_models["target"], "elsewhere", {}, {})
    with pytest.raises(CheckpointError, match=r"heads: head 0\.1\.weight has shape \[2048, 64\]"):
        train_medusa_joint(demo_models["target"], tmp_path / "heads", tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_an_output_that_would_replace_an_input_is_refused(demo_models: dict[str, Path], tmp_path: Path) -> None:
    heads = demo_models["medusa-heads"]
    with pytest.raises(SpecbuildError, match="the --output is the input --heads"):
        train_medusa_joint(demo_models["target"], heads, heads, progress=False)
    with pytest.raises(SpecbuildError, match="the --output contains the input --base"):
        train_medusa_joint(demo_models["target"], None, demo_models["target"].parent, progress=False)


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="base_lr must be > 0"):
        JointSettings(base_lr=0).check()
    with pytest.raises(ValueError, match="steps must be >= 1"):
        JointSettings(steps=0).check()


# ---------------------------------------------------------------------------------------------- command line


def test_cli_defaults_are_joint_settings_defaults() -> None:
    """The CLI states Medusa-2's defaults without importing torch; they must be JointSettings' own."""
    from specbuild.cli.medusa import JOINT_DEFAULTS

    defaults = JointSettings()
    assert {"steps": defaults.steps, "lr": defaults.heads_lr, "seq_len": defaults.seq_len} == JOINT_DEFAULTS


def test_cli_joint_writes_a_base_and_heads_the_converter_reads(demo_models: dict[str, Path], tmp_path: Path) -> None:
    """`medusa train --joint` without --heads warms new heads up first, then trains both; the output converts."""
    from typer.testing import CliRunner

    from specbuild.cli import app

    runner = CliRunner()
    out = tmp_path / "m2"
    result = runner.invoke(app, ["medusa", "train", "--joint", "--base", str(demo_models["target"]), "--output",
                                 str(out), "--num-heads", "2", "--steps", "2", "--warmup-steps", "2", "--seq-len",
                                 "16", "--batch-size", "2", "--generated", "2"])
    assert result.exit_code == 0, result.output
    assert "base_heldout_loss" in result.output and "greedy_agreement" in result.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["metrics"]["heads_warmup_loss"] is not None
    converted = runner.invoke(app, ["convert", "--model", str(out / "base"), "--medusa-heads", str(out / "heads"),
                                    "--output", str(tmp_path / "ckpt"), "--max-draft-len", "3"])
    assert converted.exit_code == 0, converted.output
    config = json.loads((tmp_path / "ckpt/config.json").read_text())
    assert config["num_medusa_heads"] == 2


def test_cli_heads_without_joint_is_refused(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from specbuild.cli import app

    result = CliRunner().invoke(app, ["medusa", "train", "--base", str(tmp_path), "--output", str(tmp_path / "o"),
                                      "--heads", str(tmp_path)])
    assert result.exit_code == 1
    assert "add --joint" in result.output


# ---------------------------------------------------------------------------------------------- the demo spec


def test_demo_spec_converts_builds_and_deploys(medusa2: Path, tmp_path: Path) -> None:
    """configs/demo-medusa2.yaml (paths pointed at this session's extra) goes through the pipeline like
    demo-medusa.yaml, and the engine it builds serves the new base: its reference checkpoint holds the new
    base's weights, not the original target's."""
    import yaml
    from safetensors.torch import load_file

    from specbuild.contracts.engine_info import engine_dir, reference_checkpoint
    from specbuild.deploy.check import check_repository
    from specbuild.deploy.repository import deploy_repository
    from tests.deploy_fixtures import convert_and_build, write_spec

    config = Path(__file__).resolve().parents[1] / "configs" / "demo-medusa2.yaml"
    data = yaml.safe_load(config.read_text(encoding="utf-8"))
    data["target"]["model"] = str(medusa2 / "base")
    data["medusa"]["heads"] = str(medusa2 / "heads")
    data["output_dir"] = str(tmp_path / "out")
    data["build"]["backend"] = "reference"
    spec = write_spec(tmp_path / "specs", data)
    convert_and_build(spec)
    deploy_repository(spec)
    repository = spec.deploy.model_repository
    assert repository is not None
    assert check_repository(repository).problems == []
    checkpoint = reference_checkpoint(engine_dir(spec, "medusa"))
    served = load_file(checkpoint / "rank0.safetensors")["transformer.layers.0.mlp.fc.weight"]
    new_base = load_file(medusa2 / "base/model.safetensors")["model.layers.0.mlp.gate_proj.weight"]
    assert torch.equal(served, new_base)
