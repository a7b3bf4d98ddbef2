"""Outputs the user pointed somewhere, and paths that reach a shell.

An output path that is a symbolic link (output_dir on another disk, an export or repository directory linked there)
is followed: its target is written and the link stays, never replaced by a local directory that leaves the target
as it was. A path that reaches a generated script is one word there, comments included: a spec path or a model
path holding a newline, quotes or `$(...)` runs nothing. The scripts are run by the shell, with stand-ins for the
engines' programs that record the words they were given.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from specbuild.atomic import atomic_directory
from specbuild.build.plan import BuildPlan
from specbuild.build.script import render_build_script
from specbuild.cli import app
from specbuild.contracts.engine_info import EngineInfo
from specbuild.errors import SpecbuildError
from specbuild.export import build_plan

runner = CliRunner()
ODD = "odd 'dir' \"q\" $(touch PWNED) `touch PWNED`\ntouch PWNED\n# x"
"""A directory name a shell would run something from, were it not quoted: quotes, substitutions, a newline."""


def _spec(root: Path) -> Path:
    """A plain vLLM-exportable spec, and the model it names, both under a directory named ODD."""
    home = root / ODD
    model = home / "model"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps({"hidden_size": 8, "vocab_size": 16}), encoding="utf-8")
    spec = home / "pipeline.yaml"
    spec.write_text(yaml.safe_dump({"name": "odd", "target": {"model": str(model)}, "build": {
        "dtype": "float16", "max_batch_size": 2, "max_input_len": 16, "max_output_len": 8}}), encoding="utf-8")
    return spec


def _stand_in(bin_dir: Path, program: str, record: Path, prints: str = "") -> None:
    """An executable `program` that writes its arguments (NUL-separated) to `record` and prints `prints`."""
    bin_dir.mkdir(exist_ok=True)
    path = bin_dir / program
    path.write_text(f'#!/bin/sh\nprintf "%s\\0" "$@" > "{record}"\nprintf "%s" "{prints}"\n', encoding="utf-8")
    path.chmod(0o755)


def _leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if ".tmp-" in p.name or ".old-" in p.name or
                  p.name.endswith(".lock"))


# -- symlinked outputs ---------------------------------------------------------------------------------------------
def test_an_export_through_a_symlink_writes_the_target_and_keeps_the_link(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    disk = tmp_path / "disk"
    (disk / "vllm").mkdir(parents=True)
    link = tmp_path / "export-link"
    link.symlink_to(disk / "vllm")
    for _ in range(2):  # a new output, then the replacement of the previous one
        result = runner.invoke(app, ["export", "vllm", str(spec), "--output", str(link)])
        assert result.exit_code == 0, result.output
        assert link.is_symlink() and link.readlink() == disk / "vllm"
        assert (disk / "vllm" / "serve.sh").is_file() and (disk / "vllm" / "manifest.json").is_file()
        assert _leftovers(tmp_path) == [] and _leftovers(disk) == []


def test_a_dangling_link_is_followed_and_one_that_leads_nowhere_is_refused(tmp_path: Path) -> None:
    dangling = tmp_path / "out"
    dangling.symlink_to(tmp_path / "elsewhere" / "out")
    with atomic_directory(dangling) as tmp:
        (tmp / "manifest.json").write_text("{}", encoding="utf-8")
    assert dangling.is_symlink() and (tmp_path / "elsewhere" / "out" / "manifest.json").is_file()

    loop = tmp_path / "loop"
    loop.symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(loop)
    followed = "loop: the output is a symbolic link that cannot be followed"
    with pytest.raises(SpecbuildError, match=followed) as error, atomic_directory(loop):
        pytest.fail("a loop of links was written through")
    assert error.value.hint and loop.is_symlink()

    file_link = tmp_path / "file-link"
    (tmp_path / "notes.txt").write_text("keep", encoding="utf-8")
    file_link.symlink_to(tmp_path / "notes.txt")
    with pytest.raises(SpecbuildError, match="exists and is not a directory"), atomic_directory(file_link):
        pytest.fail("a file was replaced")
    assert file_link.is_symlink() and (tmp_path / "notes.txt").read_text(encoding="utf-8") == "keep"


# -- paths in scripts ----------------------------------------------------------------------------------------------
def test_serve_sh_runs_only_its_command_whatever_the_spec_path_holds(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    out = tmp_path / "export"
    result = runner.invoke(app, ["export", "vllm", str(spec), "--output", str(out)])
    assert result.exit_code == 0, result.output
    script = out / "serve.sh"
    header = script.read_text(encoding="utf-8").split("\nexec ", 1)[0]
    assert all(line.startswith("#") for line in header.splitlines()), header
    record, work = tmp_path / "argv", tmp_path / "work"
    work.mkdir()
    _stand_in(tmp_path / "bin", "vllm", record)
    done = subprocess.run(["sh", str(script), "--port", "9"], cwd=work, capture_output=True, text=True,
                          env={**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"})
    assert done.returncode == 0, done.stderr
    from specbuild.spec import load_spec

    expected = build_plan(load_spec(spec), "vllm", out).argv
    assert record.read_text(encoding="utf-8").split("\0")[:-1] == [*expected[1:], "--port", "9"]  # one word each
    assert list(work.iterdir()) == [], "the script ran something besides its command"


def test_build_sh_takes_its_paths_as_one_word_each(tmp_path: Path) -> None:
    checkpoint, engines = tmp_path / ODD / "checkpoint", tmp_path / ODD / "engines"
    plan = BuildPlan(role="target", max_batch_size=2, max_input_len=16, max_seq_len=24, max_num_tokens=64,
                     checkpoint_dir=checkpoint, output_dir=engines)
    info = EngineInfo(role="target", backend="tensorrt", architecture="LlamaForCausalLM", dtype="float16",
                      vocab_size=16, tp_size=1, pp_size=1, max_batch_size=2, max_input_len=16, max_seq_len=24,
                      max_num_tokens=64)
    script = tmp_path / "build.sh"
    script.write_text(render_build_script(plan, info, "odd"), encoding="utf-8")
    subprocess.run(["bash", "-n", str(script)], check=True)
    work = tmp_path / "work"
    work.mkdir()
    _stand_in(tmp_path / "bin", "python3", tmp_path / "argv", prints="1.2.0")  # the TensorRT-LLM version check
    done = subprocess.run(["bash", str(script)], cwd=work, capture_output=True, text=True,
                          env={**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"})
    # No checkpoint there yet: the script stops at its first use of the path, naming it as given.
    assert done.returncode == 1 and f"build.sh: {checkpoint} has no config.json" in done.stderr, done.stderr
    assert list(work.iterdir()) == [] and not engines.exists()


def test_a_linked_llmapi_repository_is_written_through_and_its_trtllm_serve_sh_quotes_every_path(
        tmp_path: Path) -> None:
    """`deploy` on the PyTorch flow into a model repository that is a symlink, from a spec and model under ODD."""
    from specbuild.build.llm_api import build_llm_api
    from specbuild.contracts.llm_api import SERVE_OPTIONS, SERVE_SCRIPT, serve_command
    from specbuild.deploy.llmapi import _built_settings, deploy_llm_api
    from specbuild.spec import load_spec

    path = _spec(tmp_path)
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    data["build"]["flow"] = "pytorch"
    link, target = tmp_path / "repository", tmp_path / "disk" / "repository"
    target.mkdir(parents=True)
    link.symlink_to(target)
    data["deploy"] = {"model_repository": str(link)}
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    spec = load_spec(path)
    build_llm_api(spec)
    assert deploy_llm_api(spec).status == "written"
    assert link.is_symlink() and (target / SERVE_SCRIPT).is_file() and _leftovers(tmp_path) == []

    record, work = tmp_path / "argv", tmp_path / "work"
    work.mkdir()
    _stand_in(tmp_path / "bin", "trtllm-serve", record)
    done = subprocess.run(["sh", str(link / SERVE_SCRIPT)], cwd=work, capture_output=True, text=True,
                          env={**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"})
    assert done.returncode == 0, done.stderr
    command, _ = serve_command(spec, _built_settings(spec), str(link / SERVE_OPTIONS))
    assert record.read_text(encoding="utf-8").split("\0")[:-1] == command[1:]
    assert list(work.iterdir()) == []


def test_file_outputs_through_a_symlink_write_the_target_and_keep_the_link(tmp_path: Path) -> None:
    """`init --force` and `migrate`'s OUT name a file that is a link (a spec kept in another checkout): the file
    the link points at gets the new text and the link stays a link, with no temporary left beside either."""
    elsewhere, here = tmp_path / "elsewhere", tmp_path / "here"
    elsewhere.mkdir()
    here.mkdir()
    (elsewhere / "pipeline.yaml").write_text("# the user's old spec\n", encoding="utf-8")
    (here / "pipeline.yaml").symlink_to(elsewhere / "pipeline.yaml")
    result = runner.invoke(app, ["init", str(here / "pipeline.yaml"), "--force"])
    assert result.exit_code == 0, result.output
    assert (here / "pipeline.yaml").is_symlink()
    assert "speculative:" in (elsewhere / "pipeline.yaml").read_text(encoding="utf-8")

    source = here / "la.yaml"
    source.write_text("name: la\ntarget:\n  model: models/target\nspeculative:\n  mode: lookahead\nbuild:\n"
                      "  dtype: float32\n  max_batch_size: 4\n  max_input_len: 64\n  max_output_len: 32\n")
    (elsewhere / "out.yaml").write_text("# replaced by migrate\n", encoding="utf-8")
    (here / "out.yaml").symlink_to(elsewhere / "out.yaml")
    result = runner.invoke(app, ["migrate", str(source), str(here / "out.yaml"), "--no-measure"])
    assert result.exit_code == 0, result.output
    assert (here / "out.yaml").is_symlink()
    assert "mode: ngram" in (elsewhere / "out.yaml").read_text(encoding="utf-8")
    assert _leftovers(here) == _leftovers(elsewhere) == []


def test_a_file_output_the_filesystem_refuses_is_a_message_naming_it(tmp_path: Path) -> None:
    """`init` under a file (the parent cannot be made) ended in a FileExistsError traceback; every whole-file
    output (init, migrate's OUT, tune's spec and report) now says which path and what to do, and writes nothing."""
    (tmp_path / "notes.txt").write_text("mine\n", encoding="utf-8")
    result = runner.invoke(app, ["init", str(tmp_path / "notes.txt" / "pipeline.yaml")])
    output = " ".join(result.output.split())
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), output
    assert "notes.txt/pipeline.yaml: cannot write it" in output and "hint:" in output, output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
