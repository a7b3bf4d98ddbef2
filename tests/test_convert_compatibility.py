"""Draft/target compatibility is checked before `convert SPEC` does any work: shared vocabulary and tokenizer
(identical ids for a probe text), a draft smaller than its target, supported architectures."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specbuild.cli import app
from specbuild.convert.compatibility import PROBE_TEXT, check_draft_target
from specbuild.errors import CheckpointError
from tests.tiny_models import edit_config, make_checkpoint

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def with_tokenizer(model_dir: Path, tokenizer_dir: Path) -> Path:
    for name in TOKENIZER_FILES:
        shutil.copy(tokenizer_dir / name, model_dir / name)
    return model_dir


@pytest.fixture
def pair(tmp_path: Path, demo_models: dict[str, Path]) -> tuple[Path, Path]:
    tok = demo_models["tokenizer"]
    target = with_tokenizer(make_checkpoint(tmp_path / "target", "llama", num_hidden_layers=4), tok)
    draft = with_tokenizer(make_checkpoint(tmp_path / "draft", "llama", seed=1, num_hidden_layers=1), tok)
    return target, draft


def test_compatible_pair_passes(pair: tuple[Path, Path]) -> None:
    check_draft_target(*pair)


def test_vocabulary_mismatch(pair: tuple[Path, Path]) -> None:
    target, draft = pair
    edit_config(draft, vocab_size=1001)
    with pytest.raises(CheckpointError, match=r"vocab_size differs: target 1000 .*, draft 1001"):
        check_draft_target(target, draft)


def test_draft_must_be_smaller(pair: tuple[Path, Path]) -> None:
    target, draft = pair
    with pytest.raises(CheckpointError, match="is not smaller than the target"):
        check_draft_target(draft, target)


def test_different_tokenizers_are_refused(pair: tuple[Path, Path]) -> None:
    """Same vocabulary size, but two token ids swapped: the probe text encodes differently."""
    from transformers import AutoTokenizer

    target, draft = pair
    ids = AutoTokenizer.from_pretrained(target).encode(PROBE_TEXT, add_special_tokens=False)
    a, b = ids[0], next(i for i in ids if i != ids[0])
    data = json.loads((draft / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    names = {v: k for k, v in vocab.items()}
    vocab[names[a]], vocab[names[b]] = b, a
    (draft / "tokenizer.json").write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match="the tokenizers differ"):
        check_draft_target(target, draft)


def test_missing_tokenizer_and_unsupported_architecture_reported_together(pair: tuple[Path, Path]) -> None:
    target, draft = pair
    for name in TOKENIZER_FILES:
        (draft / name).unlink()
    edit_config(draft, architectures=["FalconForCausalLM"])
    with pytest.raises(CheckpointError) as err:
        check_draft_target(target, draft)
    assert "draft architecture 'FalconForCausalLM' is not supported" in err.value.message
    assert "no tokenizer files" in err.value.message


def test_convert_spec_checks_the_pair_before_writing(pair: tuple[Path, Path], tmp_path: Path) -> None:
    target, draft = pair
    edit_config(draft, vocab_size=1001)
    spec = tmp_path / "pipeline.yaml"
    spec.write_text(
        f"name: t\noutput_dir: out\ntarget: {{model: {target}}}\ndraft: {{model: {draft}}}\n"
        "speculative: {mode: draft_target}\nbuild: {max_batch_size: 1, max_input_len: 8, max_output_len: 8}\n"
    )
    result = CliRunner().invoke(app, ["convert", str(spec)])
    assert result.exit_code == 1
    assert "cannot speculate for target" in result.output and "vocab_size differs" in result.output
    assert not (tmp_path / "out").exists()
