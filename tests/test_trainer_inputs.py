"""What every trainer (`medusa train`, `medusa train --joint`, `eagle train`, `draft train`) does with bad input:
one error naming the file and what to do, exit code 1, no traceback, nothing written and every input exactly as
it was, before any work.

- An output that is, contains or lies inside one of the inputs (the model, --heads, a --text file) is refused
  before the model is read: the atomic swap replaces the output whole, so an input inside it would be deleted.
- Too little --text for one training window, --text that is not UTF-8 and a truncated model.safetensors are
  refused naming the files.
- Options the chosen method would ignore (Medusa-2's without --joint, --warmup-steps with --heads, a
  --num-heads / --num-layers the --heads contradict) are refused instead of dropped, and so is a learning rate
  that trains nothing.
- `draft train` into its own earlier output replaces it (the adapter carries a manifest.json).
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
from tests.tiny_models import make_checkpoint

TEXTS = corpus.training_texts()[:40]
COMMANDS = {
    "medusa": ["medusa", "train", "--base", "{model}", "--output", "{out}"],
    "medusa-joint": ["medusa", "train", "--joint", "--base", "{model}", "--output", "{out}"],
    "eagle": ["eagle", "train", "{model}", "{out}"],
    "draft": ["draft", "train", "--target", "{model}", "--layers", "2", "--output", "{out}"],
}
"""Each trainer's command line; its model and output option names, as its messages must say them."""
NAMES = {"medusa": ("--output", "--base"), "medusa-joint": ("--output", "--base"), "eagle": ("OUT_DIR", "TARGET_DIR"),
         "draft": ("--output", "--target")}
WINDOWS = {"medusa": 128 + 4 + 1, "medusa-joint": 64 + 4 + 1, "eagle": 64 + 1, "draft": 64}
"""One training window at each command's default --seq-len (Medusa: plus the four heads' labels, EAGLE: plus
the next token)."""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random 8-layer Llama (EAGLE-3 needs that many to capture three) with a tokenizer of its vocabulary."""
    from specbuild.demo.tokenizer import save_tokenizer, train_tokenizer

    directory = tmp_path_factory.mktemp("trainer-inputs") / "hf"
    make_checkpoint(directory, "llama", seed=3, dtype=torch.float32, num_hidden_layers=8, vocab_size=512,
                    bos_token_id=1, eos_token_id=2, pad_token_id=3)
    save_tokenizer(train_tokenizer(TEXTS, 512), directory, 256)
    return directory


def _run(command: str, model: Path, out: Path, *extra: str) -> tuple[int, str]:
    args = [part.format(model=model, out=out) for part in COMMANDS[command]]
    result = CliRunner().invoke(app, [*args, "--steps", "1", *extra])
    output = " ".join(result.output.split())  # rich wraps long lines on a narrow terminal
    assert "Traceback" not in output, output
    assert result.exception is None or isinstance(result.exception, SystemExit), output  # not a crash
    return result.exit_code, output


def _tree(root: Path) -> dict[str, bytes]:
    """Every file under `root` (hidden ones too: locks, temporaries) with its bytes."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _text(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


# -- an output over an input ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("relation", ["contains", "is", "lies inside"])
@pytest.mark.parametrize("command", list(COMMANDS))
def test_an_output_over_its_model_is_refused_before_any_work(command: str, relation: str, tiny: Path,
                                                             tmp_path: Path) -> None:
    """`cp -r demo/models/medusa2 m2; specbuild eagle train m2/base m2` deleted m2/base: now each relation of
    output and model is one message naming both, and every file is as it was."""
    if relation == "contains":  # an earlier specbuild output holding the model, as demo/models/medusa2 does
        model, out = tmp_path / "m2" / "base", tmp_path / "m2"
        _text(out / "manifest.json", json.dumps({"producer": "specbuild.medusa.joint"}))
    else:
        model = tmp_path / "hf"
        out = model if relation == "is" else model / "draft"
    shutil.copytree(tiny, model)
    before = _tree(tmp_path)
    code, output = _run(command, model, out)
    assert code == 1, output
    output_name, model_name = NAMES[command]
    assert f"{out}: the {output_name} {relation} the input {model_name} {model}" in output
    assert _tree(tmp_path) == before


@pytest.mark.parametrize("command", list(COMMANDS))
def test_an_output_holding_a_text_file_is_refused(command: str, tiny: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    _text(out / "manifest.json", "{}")
    text = _text(out / "notes.txt", "\n".join(TEXTS))
    before = _tree(tmp_path)
    code, output = _run(command, tiny, out, "--text", str(text))
    assert code == 1, output
    assert f"{out}: the {NAMES[command][0]} contains the input --text {text}" in output
    assert _tree(tmp_path) == before


@pytest.mark.parametrize("command", list(COMMANDS))
def test_the_overlap_is_refused_before_the_model_is_read(command: str, tiny: Path, tmp_path: Path) -> None:
    """With weights that cannot even be read, the refusal is still the overlap's: nothing was loaded first."""
    model = tmp_path / "hf"
    shutil.copytree(tiny, model)
    (model / "model.safetensors").write_bytes(b"")
    code, output = _run(command, model, model)
    assert code == 1 and f"the input {NAMES[command][1]} {model}" in output, output


# -- bad text, bad weights ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("command", list(COMMANDS))
def test_text_shorter_than_one_window_is_refused_naming_the_file(command: str, tiny: Path, tmp_path: Path) -> None:
    short = _text(tmp_path / "short.txt", "def f(): return 1")
    code, output = _run(command, tiny, tmp_path / "out", "--text", str(short))
    assert code == 1, output
    assert f"--text {short}: " in output
    assert f"tokens, fewer than one window of {WINDOWS[command]} tokens (--seq-len" in output
    assert "smaller --seq-len" in output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", list(COMMANDS))
def test_text_that_is_not_utf8_is_refused_naming_the_file(command: str, tiny: Path, tmp_path: Path) -> None:
    good = _text(tmp_path / "good.txt", TEXTS[0])
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("café au lait\n".encode("latin-1"))
    code, output = _run(command, tiny, tmp_path / "out", "--text", str(good), "--text", str(latin1))
    assert code == 1, output
    assert f"{latin1}: --text is not UTF-8 text (byte 3" in output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_truncated_weights_file_is_refused_naming_it(command: str, tiny: Path, tmp_path: Path) -> None:
    model = tmp_path / "hf"
    shutil.copytree(tiny, model)
    weights = model / "model.safetensors"
    with weights.open("r+b") as handle:
        handle.truncate(weights.stat().st_size // 2)
    before = _tree(tmp_path)
    code, output = _run(command, model, tmp_path / "out")
    assert code == 1, output
    assert f"{weights}: cannot read this safetensors file" in output and "fetch or save the model again" in output
    assert _tree(tmp_path) == before


# -- options that would be ignored ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def four_heads(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Medusa-1 heads of the tiny model: four heads of one ResBlock (never trained: only their shape counts)."""
    from specbuild.medusa.train import build_heads, write_heads

    directory = tmp_path_factory.mktemp("heads") / "heads"
    write_heads(directory, build_heads(64, 512, 4, 1), tiny, str(tiny), {}, {})
    return directory


@pytest.mark.parametrize("options, message", [
    (["--joint", "--heads", "{heads}", "--num-heads", "2"],
     "{heads}: --num-heads 2 contradicts the given --heads (head count: 4)"),
    (["--joint", "--heads", "{heads}", "--num-layers", "2"],
     "{heads}: --num-layers 2 contradicts the given --heads (layers per head: 1)"),
    (["--joint", "--heads", "{heads}", "--warmup-steps", "5"], "--warmup-steps trains new heads"),
    (["--base-lr", "1e-5", "--generated", "0"], "--base-lr, --generated: only Medusa-2 (--joint) uses these"),
    (["--heads", "{heads}"], "--heads: only Medusa-2 (--joint) uses this option"),
])
def test_medusa_options_that_would_be_ignored_are_refused(options: list[str], message: str, tiny: Path,
                                                          four_heads: Path, tmp_path: Path) -> None:
    args = [part.format(heads=four_heads) for part in options]
    result = CliRunner().invoke(app, ["medusa", "train", "--base", str(tiny), "--output", str(tmp_path / "out"),
                                      *args])
    output = " ".join(result.output.split())
    assert result.exit_code == 1, output
    assert message.format(heads=four_heads) in output and "Traceback" not in output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_learning_rate_that_trains_nothing_is_refused(command: str, tiny: Path, tmp_path: Path) -> None:
    """--lr 0 was replaced by the default (medusa) or trained nothing (draft); a negative one was a traceback."""
    for lr in ("0", "-1"):
        code, output = _run(command, tiny, tmp_path / "out", "--lr", lr)
        assert code == 1 and "lr must be > 0" in output, output
    assert not (tmp_path / "out").exists()


def test_a_head_count_the_heads_agree_with_is_taken(tiny: Path, four_heads: Path, tmp_path: Path) -> None:
    """--num-heads 4 with four-head --heads passes the option check: the run goes on to the text (too short here,
    so it stops there, before training)."""
    short = _text(tmp_path / "short.txt", "x = 1")
    result = CliRunner().invoke(app, ["medusa", "train", "--joint", "--base", str(tiny), "--heads", str(four_heads),
                                      "--num-heads", "4", "--num-layers", "1", "--output", str(tmp_path / "out"),
                                      "--text", str(short)])
    output = " ".join(result.output.split())
    assert result.exit_code == 1 and f"--text {short}: " in output, output


# -- a rerun ----------------------------------------------------------------------------------------------------------
def test_draft_train_twice_into_one_output_replaces_the_first(tiny: Path, tmp_path: Path) -> None:
    from specbuild.self_draft.adapter_format import read_adapter

    out = tmp_path / "adapter"
    text = _text(tmp_path / "text.txt", "\n".join(TEXTS[:4]))
    for steps in ("1", "2"):
        result = CliRunner().invoke(app, ["draft", "train", "--target", str(tiny), "--layers", "2", "--output",
                                          str(out), "--text", str(text), "--steps", steps, "--seq-len", "8",
                                          "--batch-size", "1"])
        assert result.exit_code == 0, result.output
    assert json.loads((out / "adapter.json").read_text())["training"]["steps"] == 2
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["producer"] == "specbuild.self_draft.train" and manifest["settings"]["steps"] == 2
    assert read_adapter(out).layers == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapter", "text.txt"]  # no temporaries left
