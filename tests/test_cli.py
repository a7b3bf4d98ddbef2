"""The CLI's face as a new user meets it: every command's `--help`, walked from the app (no command listed by hand),
and the bench's choice of tokenizer.

Help: exits 0; no type column on flags (`<bool>`) or arguments, no `<list[...]>`, option values named in words
(TEXT, not `<str>`); every option and argument says what it is for; the usage line spells arguments as the table
does (SPEC or [SPEC], never {SPEC} or [[SPEC]]); no sentence is broken mid-line by a docstring's wrapping. Bench:
with --repository the output is counted with the tokenizer the repository's preprocessing model names; with no
tokenizer found, the figures say words.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
import typer.main
from typer.core import TyperArgument, TyperGroup, TyperOption
from typer.testing import CliRunner

from specbuild.bench import run as bench_run
from specbuild.bench.client import Generation
from specbuild.bench.load import Load, TokenCounter, summarise
from specbuild.bench.tokenizer_source import choose_tokenizer, repository_tokenizer
from specbuild.cli import app
from specbuild.errors import SpecbuildError

runner = CliRunner()
WIDTH = 100


def _commands() -> Iterator[tuple[list[str], Any]]:
    """Every command and group of the app, as (argv to reach it, click command), found by walking the tree."""
    root = typer.main.get_command(app)
    stack: list[tuple[list[str], Any]] = [([], root)]
    while stack:
        path, command = stack.pop()
        yield path, command
        if isinstance(command, TyperGroup):
            stack.extend(([*path, name], sub) for name, sub in command.commands.items())


COMMANDS = sorted(_commands(), key=lambda item: item[0])


def _params(command: Any) -> list[Any]:
    import click

    return command.get_params(click.Context(command, info_name=command.name))


def _help(path: list[str]) -> str:
    result = runner.invoke(app, [*path, "--help"], env={"COLUMNS": str(WIDTH), "TERMINAL_WIDTH": str(WIDTH)})
    assert result.exit_code == 0, result.output
    return result.output


def test_the_walk_finds_every_command() -> None:
    names = {" ".join(path) for path, _ in COMMANDS}
    assert {"", "convert", "build", "deploy", "serve", "bench", "medusa", "medusa train"} <= names
    assert len(names) >= 13


@pytest.mark.parametrize("path", [path for path, _ in COMMANDS], ids=lambda p: " ".join(p) or "specbuild")
def test_help_has_no_type_noise_and_one_argument_spelling(path: list[str]) -> None:
    text = _help(path)
    assert "<bool>" not in text
    assert "<list[" not in text
    assert not re.search(r"<(str|int|float|path|file|dir)\b", text), "a value named by its Python type, not in words"
    usage = next(line for line in text.splitlines() if "Usage:" in line)
    assert "{" not in usage and "[[" not in usage, usage
    for word in re.findall(r"(?<![\[\w])([A-Za-z_]+)(?=\s|$)", usage.split("[OPTIONS]", 1)[-1]):
        assert word.isupper(), f"usage {usage.strip()!r}: argument {word} not spelled as a metavar (SPEC, URL)"


@pytest.mark.parametrize("path,command", COMMANDS, ids=[" ".join(p) or "specbuild" for p, _ in COMMANDS])
def test_every_option_and_argument_says_what_it_is_for(path: list[str], command: Any) -> None:
    assert (command.help or "").strip(), f"{' '.join(path)}: no help text"
    for param in _params(command):
        if isinstance(param, TyperOption | TyperArgument) and not getattr(param, "hidden", False):
            assert (param.help or "").strip(), f"specbuild {' '.join(path)} {param.opts[0]}: no help text"
        if isinstance(param, TyperArgument):
            assert param.metavar and param.metavar.isupper(), f"{' '.join(path)} {param.name}: metavar {param.metavar}"


@pytest.mark.parametrize("path", [path for path, _ in COMMANDS if path], ids=lambda p: " ".join(p))
def test_help_text_reflows_instead_of_breaking_sentences(path: list[str]) -> None:
    """A wrapped docstring line ends where the source wrapped it, well short of the terminal's width, mid-sentence;
    reflowed text fills the line. So: a description line that ends without punctuation, followed by one that
    starts in lower case, was broken by the source, not by the terminal."""
    text = _help(path)
    description = text.split("╭", 1)[0].splitlines()
    lines = [line.rstrip() for line in description if line.strip()]
    for this, following in pairwise(lines):
        short = len(this) < WIDTH - 25
        if short and not this.endswith((".", ":", ";", ")", "`")) and following.strip()[:1].islower():
            pytest.fail(f"specbuild {' '.join(path)} --help breaks a sentence after {this.strip()!r}")


def test_triton_model_and_hf_directory_have_different_option_names() -> None:
    options = {" ".join(path): {opt for p in _params(command) for opt in getattr(p, "opts", [])}
               for path, command in COMMANDS}
    assert "--model" in options["convert"] and "--model-name" not in options["convert"]
    for name in ("serve", "bench"):
        assert "--model-name" in options[name] and "--model" not in options[name]


def _repository(root: Path, tokenizer_dir: str = "tokenizer") -> Path:
    """A model repository as `specbuild deploy` lays out its tokenizer: preprocessing names it relatively."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    repository = root / "repo"
    (repository / "preprocessing").mkdir(parents=True)
    (repository / "preprocessing" / "config.pbtxt").write_text(
        'name: "preprocessing"\nbackend: "python"\n'
        f'parameters {{ key: "tokenizer_dir" value {{ string_value: "{tokenizer_dir}" }} }}\n')
    tokenizer = Tokenizer(models.WordPiece({"[UNK]": 0, "hello": 1, "##0": 2}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    (repository / "preprocessing" / "tokenizer").mkdir()
    tokenizer.save(str(repository / "preprocessing" / "tokenizer" / "tokenizer.json"))
    return repository


def test_the_repository_names_the_tokenizer_bench_counts_with(tmp_path: Path) -> None:
    repository = _repository(tmp_path)
    expected = (repository / "preprocessing" / "tokenizer").resolve()
    assert repository_tokenizer(repository) == expected
    choice = choose_tokenizer("127.0.0.1:1", "grpc", repository=repository)
    assert choice.directory == expected
    assert choice.counter().count(Generation(text="hello0 hello1"))[0] == 3  # hello ##0, [UNK]
    given = tmp_path / "elsewhere"
    assert choose_tokenizer("127.0.0.1:1", "grpc", tokenizer=given, repository=repository).directory == given


def test_a_repository_without_a_tokenizer_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(SpecbuildError, match=r"preprocessing/config.pbtxt"):
        repository_tokenizer(tmp_path)
    repository = _repository(tmp_path, tokenizer_dir="missing")
    with pytest.raises(SpecbuildError, match=r"tokenizer_dir 'missing' .* holds no tokenizer files"):
        repository_tokenizer(repository)


def test_an_llmapi_repository_names_its_tokenizer_through_model_yaml(tmp_path: Path) -> None:
    """Triton's llmapi repository (build.flow: pytorch) has no preprocessing model: bench --repository finds the
    tokenizer where the LLM API does, model.yaml's `tokenizer`, else its `model` (it failed without --tokenizer)."""
    source = _repository(tmp_path / "source")
    model_dir = source / "preprocessing" / "tokenizer"
    repository = tmp_path / "llmapi"
    (repository / "tensorrt_llm" / "1").mkdir(parents=True)
    model_yaml = repository / "tensorrt_llm" / "1" / "model.yaml"
    model_yaml.write_text(f"model: {model_dir}\nbackend: pytorch\n")
    assert repository_tokenizer(repository) == model_dir
    choice = choose_tokenizer("127.0.0.1:1", "grpc", repository=repository)
    assert choice.directory == model_dir and "model.yaml" in choice.found_by
    model_yaml.write_text(f"model: {tmp_path / 'weights-only'}\ntokenizer: {model_dir}\n")
    assert repository_tokenizer(repository) == model_dir
    model_yaml.write_text(f"model: {tmp_path / 'weights-only'}\n")
    with pytest.raises(SpecbuildError, match=r"model.yaml: model .*weights-only.* holds no tokenizer files"):
        repository_tokenizer(repository)


def test_no_tokenizer_means_words_named_words() -> None:
    choice = choose_tokenizer("127.0.0.1:1", "http")  # no server there: nothing to ask
    assert choice.directory is None
    counter = choice.counter()
    # words, even where the model reports num_output_tokens: a compared endpoint might not
    assert counter.count(Generation(text="a b c", reported_tokens=7)) == (3, "words")


def _fake_run_load(text: str):
    def run_load(url: str, load: Load, *, model: str | None = None, protocol: str = "grpc",
                 counter: TokenCounter | None = None, timeout_s: float = 300.0):
        assert counter is not None
        done = Generation(text=text, response_times=[0.1, 0.2], latency_s=0.3, reported_tokens=2,
                          acceptance_rate=0.5, accepted_draft_tokens=2, draft_tokens=4)
        return summarise(url, model or "ensemble", protocol, load, [(done, None)] * 2, 1.0, counter)
    return run_load


@pytest.mark.parametrize("with_repository", [True, False], ids=["repository", "none"])
def test_bench_counts_with_the_repository_tokenizer_and_labels_the_unit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, with_repository: bool) -> None:
    monkeypatch.setattr(bench_run, "run_load", _fake_run_load("hello0 hello1 hello2"))
    args = ["bench", "127.0.0.1:1", "--model-name", "m", "--requests", "2", "--compare", "127.0.0.1:2"]
    if with_repository:
        args += ["--repository", str(_repository(tmp_path))]
    report = json.loads(runner.invoke(app, [*args, "--json"]).stdout)
    table = runner.invoke(app, args, env={"COLUMNS": "160"})
    assert table.exit_code == 0, table.output
    for label in ("endpoint", "compare"):
        summary = report[label][0]
        if with_repository:  # hello ##0, [UNK], [UNK] per request
            assert summary["output_tokens"] == 2 * 4 and summary["tokens_counted_by"].startswith("tokenizer")
        else:
            assert summary["output_tokens"] == 2 * 3 and summary["tokens_counted_by"] == "words"
    unit = "tokens" if with_repository else "words"
    assert report["unit"] == unit
    assert f"output {unit}/s" in table.stdout and f"output {unit} " in table.stdout
    assert f"{unit} per response" in table.stdout and "longest gap" in table.stdout  # how coarsely it streamed
    if not with_repository:
        assert "tokens/s" not in table.stdout and "counting words, not tokens" in table.output


def test_bench_png_names_the_unit_the_deployments_and_acceptance(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                 ) -> None:
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    monkeypatch.setattr(bench_run, "run_load", _fake_run_load("one two three"))
    titles: list[str] = []
    real_savefig = plt.Figure.savefig

    def savefig(figure: Any, *args: Any, **kwargs: Any) -> None:
        titles.extend(axis.get_title() for axis in figure.axes)
        titles.append(figure._suptitle.get_text())
        titles.extend(text.get_text() for legend in figure.legends for text in legend.get_texts())
        real_savefig(figure, *args, **kwargs)

    monkeypatch.setattr(plt.Figure, "savefig", savefig)
    png = tmp_path / "bench.png"
    result = runner.invoke(app, ["bench", "127.0.0.1:1", "--model-name", "m", "--compare", "127.0.0.1:2",
                                 "--compare-model-name", "plain", "--png", str(png), "--json"])
    assert result.exit_code == 0, result.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "output words/s" in titles and "acceptance rate" in titles
    assert "endpoint: 127.0.0.1:1 (m)" in titles and "compare: 127.0.0.1:2 (plain)" in titles
    assert any("words" in title and "tokens/s" not in title for title in titles if title.startswith("specbuild"))


@pytest.mark.parametrize("command", [["draft", "train", "--target", "{model}", "--layers", "2", "--output", "{out}"],
                                     ["medusa", "train", "--base", "{model}", "--output", "{out}"],
                                     ["eagle", "train", "{model}", "{out}"]])
def test_training_commands_say_an_unreadable_model_in_one_line(command: list[str], demo_models: dict[str, Path],
                                                               tmp_path: Path) -> None:
    """A model directory transformers cannot load (config and tokenizer, no weights) is one error line naming it,
    not a traceback, and nothing is written."""
    import shutil

    model = tmp_path / "no-weights"
    model.mkdir()
    for path in demo_models["target"].iterdir():
        if path.suffix == ".json" and path.name != "generation_config.json":
            shutil.copy2(path, model / path.name)
    out = tmp_path / "out"
    args = [part.format(model=model, out=out) for part in command] + ["--steps", "1"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output and str(model) in " ".join(result.output.split())
    assert not out.exists()
