"""`specbuild migrate` on any YAML a user may write: every spec in the repository, in block style, as one flow
mapping and with each section on one line (the README's style), migrates to the same data, changing only the keys
the new spec's header names (relative paths rebased to OUT's directory, pointing where they did); anchors and
aliases round-trip; Lookahead on default windows migrates; and a bad OUT or --text is refused before anything is
written."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from specbuild.cli.app import app
from specbuild.errors import SpecbuildError
from specbuild.migrate.rewrite import migrate_spec
from specbuild.spec import load_spec
from specbuild.spec.schema import LookaheadSpec

ROOT = Path(__file__).resolve().parents[1]
SPECS = sorted([*ROOT.glob("configs/**/*.yaml"), *ROOT.glob("tests/**/*.yaml"), *ROOT.glob("ci/**/*.yaml")])
README_SPEC = re.search(r"cat > /tmp/pipeline.yaml <<EOF\n(.*?)^EOF$", (ROOT / "README.md").read_text(),
                        re.MULTILINE | re.DOTALL)
runner = CliRunner()


def _flow(data: dict[str, Any]) -> str:
    return yaml.safe_dump(data, default_flow_style=True)


def _sections(data: dict[str, Any]) -> str:
    """Each top-level key on one line, its value a flow mapping: `target: {model: ...}`."""
    return "".join(yaml.safe_dump({key: value}, default_flow_style=True, width=1 << 20).strip()[1:-1] + "\n"
                   for key, value in data.items())


def _header(text: str, label: str) -> list[tuple[str, ...]]:
    """The keys a header line (`# <label>: a, b -> c, d (removed).`) names; a renamed key is both of its names."""
    found = re.search(rf"^# {re.escape(label)}: (.*)\.$", text, re.MULTILINE)
    named = [] if found is None else re.split(r", | -> ", found.group(1).replace(" (removed)", ""))
    return [tuple(name.split(".")) for name in named]


def _leaves(data: Any, loc: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    if isinstance(data, dict):
        return {found: value for key, item in data.items() for found, value in _leaves(item, (*loc, str(key))).items()}
    return {loc: data}


def _outside(leaves: dict[tuple[str, ...], Any], named: list[tuple[str, ...]]) -> dict[tuple[str, ...], Any]:
    return {loc: value for loc, value in leaves.items() if not any(loc[:len(key)] == key for key in named)}


def _assert_only_named_changed(source: Path, out: Path) -> list[tuple[str, ...]]:
    """OUT's data equals SPEC's outside the keys OUT's header names; a relative path it names as rebased points
    at the same place from OUT's directory. Returns the rewritten keys."""
    text = out.read_text()
    rewritten, rebased = _header(text, "Keys rewritten"), _header(text, "Relative paths rebased to this file's "
                                                                         "directory")
    assert rewritten, text[:2000]
    old = _outside(_leaves(yaml.safe_load(source.read_text())), rewritten)
    new = _outside(_leaves(yaml.safe_load(text)), rewritten)
    assert old.keys() == new.keys(), (source, sorted(old.keys() ^ new.keys()))
    for loc in old:
        if loc in rebased:
            assert os.path.normpath(source.parent / old[loc]) == os.path.normpath(out.parent / new[loc]), loc
        else:
            assert old[loc] == new[loc], (source, loc, old[loc], new[loc])
    return rewritten


INPUTS = {spec.relative_to(ROOT).as_posix(): spec.read_text() for spec in SPECS}
if README_SPEC is not None:  # else test_the_readme_spec_with_engine_settings... fails, saying so
    INPUTS["README.md"] = README_SPEC.group(1).replace("$PWD", str(ROOT))


@pytest.mark.parametrize("name", sorted(INPUTS))
def test_every_spec_migrates_alike_in_block_and_flow_style(tmp_path: Path, name: str) -> None:
    """Each spec under configs/, tests/ and ci/ (and the README's quickstart spec) as written, re-dumped as one
    flow mapping, and with each section a one-line flow mapping: either all three are refused with the same
    message and nothing is written, or all three migrate, keep every key outside the ones the header names (paths
    rebased to OUT's deeper directory point where they did), parse to the same data, and load as a spec."""
    text = INPUTS[name]
    data = yaml.safe_load(text)
    sources = tmp_path / "spec"
    sources.mkdir()
    outcomes: dict[str, Any] = {}
    for style, written in (("block", text), ("flow", _flow(data)), ("sections", _sections(data))):
        source, out = sources / f"{style}.yaml", tmp_path / "out" / "deeper" / f"{style}.yaml"
        source.write_text(written)
        try:
            migrate_spec(source, out)
        except SpecbuildError as err:
            outcomes[style] = str(err).replace(str(source), "SPEC")
            assert not out.parent.exists(), f"{name} ({style}): refused, but wrote {list(out.parent.iterdir())}"
            continue
        rewritten = _assert_only_named_changed(source, out)
        outcomes[style] = (yaml.safe_load(out.read_text()), rewritten)
        assert load_spec(out).build.flow == "pytorch"
        assert "comments below are the engine-flow spec's, kept" in out.read_text(), (name, style)
    assert outcomes["block"] == outcomes["flow"] == outcomes["sections"], name


@pytest.mark.parametrize("style", ["sections", "block"])
def test_engine_settings_go_and_everything_else_stays(tmp_path: Path, style: str) -> None:
    """The README's spec with engine-only settings added (speculative.max_draft_len, build.gather_context_logits
    last in its section, deploy.exclude_input_in_output its section's only key), as written (one line a section)
    and in block style: only those go, every other entry stays (a line-wise removal would drop a one-line section),
    deploy stays an (empty) mapping, and the comments are kept."""
    assert README_SPEC is not None, "README.md: the quickstart spec's heredoc moved"
    text = README_SPEC.group(1).replace("$PWD", str(ROOT))
    text = text.replace("num_draft_tokens: 3}", "num_draft_tokens: 3, max_draft_len: 3}")
    text = text.replace("max_output_len: 64}", "max_output_len: 64, gather_context_logits: false}")
    text = "# quickstart\n" + text + "deploy: {exclude_input_in_output: false}\n"
    if style == "block":
        text = "# quickstart\n" + yaml.safe_dump(yaml.safe_load(text), sort_keys=False)
    source, out = tmp_path / "pipeline.yaml", tmp_path / "migrated.yaml"
    source.write_text(text)
    result = runner.invoke(app, ["migrate", str(source), str(out), "--no-measure"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    rewritten = _assert_only_named_changed(source, out)
    assert {("speculative", "max_draft_len"), ("build", "gather_context_logits"),
            ("deploy", "exclude_input_in_output")} <= set(rewritten)
    old, new = load_spec(source), load_spec(out)
    assert (new.speculative.mode, new.speculative.num_draft_tokens) == (old.speculative.mode, 3)
    assert new.build.max_input_len == old.build.max_input_len and new.draft.model == old.draft.model
    assert yaml.safe_load(out.read_text())["deploy"] == {}
    assert "# quickstart" in out.read_text() and "not kept" not in result.output


def test_lookahead_on_default_windows_becomes_ngram(tmp_path: Path) -> None:
    """`mode: lookahead` without a `lookahead:` section runs TensorRT-LLM's default (W, N, G): it migrates to
    NGram with K = that N, matching on N - 1 tokens."""
    source, out = tmp_path / "la.yaml", tmp_path / "out.yaml"
    source.write_text("name: la  # default windows\ntarget:\n  model: models/target\nspeculative:\n  mode: lookahead\n"
                      "build:\n  dtype: float32\n  max_batch_size: 4\n  max_input_len: 64\n  max_output_len: 32\n")
    result = runner.invoke(app, ["migrate", str(source), str(out), "--no-measure"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    new, n = load_spec(out), LookaheadSpec().ngram_size
    assert (new.speculative.mode, new.speculative.num_draft_tokens) == ("ngram", n)
    assert new.speculative.ngram.max_matching_ngram_size == n - 1
    assert "# default windows" in out.read_text()
    _assert_only_named_changed(source, out)


ANCHORED = """\
# a spec with anchors
name: anchored
target: {model: &model models/target}
draft:
  model: *model   # the target as its own draft
  quantization: {format: int8_sq}
speculative:
  mode: draft_target
  num_draft_tokens: &k 4
  max_draft_len: *k
  draft_len_schedule: {1: *k, 3: 0}
build:
  dtype: float32
  max_batch_size: 4
  max_input_len: &len 128
  max_output_len: *len
"""


def test_anchors_and_aliases_round_trip(tmp_path: Path) -> None:
    """Anchors and aliases, one of them on a path that is rebased (shared by target and draft) and one on a key
    migrate removes: the aliased values stay what they were, the anchors and comments stay in the text."""
    source, out = tmp_path / "spec.yaml", tmp_path / "deeper" / "out.yaml"
    source.write_text(ANCHORED)
    migrate_spec(source, out)
    _assert_only_named_changed(source, out)
    new, text = load_spec(out), out.read_text()
    assert new.draft.model == new.target.model == tmp_path / "models" / "target"
    assert new.build.max_output_len == new.build.max_input_len == 128 and new.speculative.draft_len_schedule[1] == 4
    assert "&len" in text and "*len" in text and "# a spec with anchors" in text


def test_an_anchor_migrate_cannot_keep_gives_plain_yaml_and_says_so(tmp_path: Path) -> None:
    """An anchor inside the lookahead section, aliased elsewhere: replacing the section would leave the alias
    dangling, so OUT is the migrated data as plain YAML, and its header and the command say the comments went."""
    source, out = tmp_path / "spec.yaml", tmp_path / "out.yaml"
    source.write_text("name: la  # a comment\ntarget: {model: models/target}\nspeculative:\n  mode: lookahead\n"
                      "  lookahead: {window_size: 2, ngram_size: &n 2, verification_set_size: 2}\n"
                      "build: {dtype: float32, max_batch_size: *n, max_input_len: 64, max_output_len: 32}\n")
    result = runner.invoke(app, ["migrate", str(source), str(out), "--no-measure"], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    assert "comments and layout not kept" in result.output
    _assert_only_named_changed(source, out)
    assert load_spec(out).build.max_batch_size == 2 and "comments and layout were not kept" in out.read_text()


def _listing(directory: Path) -> dict[str, bytes]:
    return {p.relative_to(directory).as_posix(): p.read_bytes() if p.is_file() else b"" for p in directory.rglob("*")}


@pytest.mark.parametrize("case", ["a directory", "under a file", "bad --text", "unreadable --text"])
def test_a_bad_out_or_text_is_refused_before_anything_is_written(tmp_path: Path, case: str) -> None:
    """OUT an existing directory, OUT under a file, or a --text that cannot be read: one message naming it,
    exit 1, no traceback, and the directory exactly as it was (no OUT, no temporary file)."""
    (tmp_path / "results").mkdir()
    (tmp_path / "notes.txt").write_text("kept\n")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9\n".encode("latin-1"))
    out, extra, named = {
        "a directory": (tmp_path / "results", ["--no-measure"], "OUT is a directory"),
        "under a file": (tmp_path / "notes.txt" / "out.yaml", ["--no-measure"], "is a file"),
        "bad --text": (tmp_path / "out.yaml", ["--text", str(tmp_path / "missing.txt")], "--text"),
        "unreadable --text": (tmp_path / "out.yaml", ["--text", str(tmp_path / "latin1.txt")], "--text"),
    }[case]
    before = _listing(tmp_path)
    result = runner.invoke(app, ["migrate", str(ROOT / "configs" / "demo-lookahead.yaml"), str(out), *extra],
                           env={"COLUMNS": "300"})
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit), result.exception  # a message, not a traceback
    assert named in result.output and "hint:" in result.output, result.output
    assert _listing(tmp_path) == before


def test_a_text_too_short_to_measure_on_is_refused_before_out_is_written(tmp_path: Path,
                                                                         demo_models: dict[str, Path]) -> None:
    """The measurement's prompts come from --text through the target's tokenizer: a text with too few tokens for
    them is refused, naming --text, and OUT keeps what it held."""
    source, out, text = tmp_path / "la.yaml", tmp_path / "out.yaml", tmp_path / "short.txt"
    source.write_text((ROOT / "configs" / "demo-lookahead.yaml").read_text().replace(
        "../demo/models/target", str(demo_models["target"])))
    out.write_text("kept\n")
    text.write_text("far too short\n")
    result = runner.invoke(app, ["migrate", str(source), str(out), "--text", str(text)], env={"COLUMNS": "300"})
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    assert f"--text {text}" in result.output and "too few" in result.output, result.output
    assert out.read_text() == "kept\n" and sorted(p.name for p in tmp_path.iterdir()) == [
        "la.yaml", "out.yaml", "short.txt"]
