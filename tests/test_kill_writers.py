"""Every writing command killed in the middle of its write leaves the previous output byte-identical or the new one
complete, and a rerun then succeeds with nothing left behind; and every stage refuses, before any work, an output
that is, contains or lies inside one of its inputs.

Where a command is killed is chosen, not guessed with delays: it runs in a process of its own (forked from one that
imported specbuild's commands once, `FORKER`, and running `python -m specbuild.cli`'s main) whose audit hook
(`sys.addaudithook`, Python's own events for open, os.link, os.rename and shutil.rmtree, and specbuild.atomic's
exchange of the new output with the previous one) stops it with SIGSTOP at one
step of its write to the watched output; the test then SIGKILLs it. Nothing in specbuild is replaced: the hook only
pauses the real command at a real filesystem step, and a command that ends without reaching it fails the test. The
steps:

- `lock`: about to take the output's lock (everything checked, nothing written);
- `first file` / `second file`: creating the first / second file in the output's temporary directory;
- `manifest`: creating manifest.json there, every other file written;
- `swap`: putting the temporary directory into place (exchanging it with the previous output in one step, or, on a
  filesystem that cannot, renaming it after the previous output was moved aside);
- `cleanup`: removing the moved-aside previous output (the new one in place).

Each kill starts from a complete previous output that the killed run would change. "Complete" for a changed output
means what a successful rerun of the same command writes, byte for byte (every stage writes the same bytes for the
same inputs); for the trainers, whose floating-point sums depend on the thread count, that their own loader reads it
and it has its manifest. Models are tiny random Llamas with a tokenizer trained here (no demo model).
"""

from __future__ import annotations

import hashlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from typer.testing import CliRunner

from specbuild import corpus
from specbuild.cli import app
from tests.tiny_models import make_checkpoint

REPO = Path(__file__).resolve().parents[1]
runner = CliRunner()

FORKER = r"""
import json, os, signal, sys, traceback

import specbuild.build.stage, specbuild.convert.pipeline, specbuild.deploy.repository, specbuild.export
import specbuild.eagle.train, specbuild.medusa.train, specbuild.self_draft.train
import torch, transformers
from transformers import AutoTokenizer, PreTrainedTokenizerFast  # transformers' lazy imports, done once here
from specbuild.cli.app import main


def watch(output, point):
    parent, name = os.path.split(output)
    tmp, old, lock = (os.path.join(parent, f".{name}.{kind}") for kind in ("tmp-", "old-", "lock"))
    writes = 0

    def inside_tmp(path):
        return path.startswith(tmp) and os.sep in path[len(parent) + 1:]

    def stop():
        sys.stderr.write(f"[stopped at {point}]\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGSTOP)  # and wait there for the test's SIGKILL

    def hook(event, args):
        nonlocal writes
        if event == "open" and not isinstance(args[0], int):
            path, mode, flags = os.fsdecode(os.fspath(args[0])), args[1], args[2]
            if point == "lock" and path == lock:
                return stop()
            written = any(c in mode for c in "wax+") if isinstance(mode, str) else flags & (os.O_WRONLY | os.O_RDWR)
            if written and inside_tmp(path):
                writes += 1
                top = os.path.dirname(os.path.dirname(path)) == parent  # directly in the temporary directory
                manifest = top and os.path.basename(path) == "manifest.json"
                if (point, writes) in (("first file", 1), ("second file", 2)) or (point == "manifest" and manifest):
                    return stop()
        elif event == "os.link" and inside_tmp(os.fsdecode(os.fspath(args[1]))):
            writes += 1
            if (point, writes) in (("first file", 1), ("second file", 2)):
                return stop()
        elif event in ("os.rename", "specbuild.atomic.exchange") and point == "swap" and \
                os.fsdecode(os.fspath(args[0])).startswith(tmp):
            return stop()
        elif event == "shutil.rmtree" and point == "cleanup" and os.fsdecode(os.fspath(args[0])).startswith(old):
            return stop()

    sys.addaudithook(hook)


def run(request):
    torch.set_num_threads(1)  # as the tests' own process (conftest): two threads crawl when the cores are busy
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    watch(request["output"], request["point"])
    sys.argv = ["specbuild", *request["argv"]]
    code = 0
    try:
        main()
    except SystemExit as end:
        code = end.code if isinstance(end.code, int) else (0 if end.code is None else 1)
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def reply(**message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


for line in sys.stdin:
    request = json.loads(line)
    pid = os.fork()
    if pid == 0:
        run(request)
    reply(pid=pid)
    _, status = os.waitpid(pid, os.WUNTRACED)
    if os.WIFSTOPPED(status):
        reply(stopped=True)
        _, status = os.waitpid(pid, 0)  # the test kills it
    reply(stopped=False, code=os.waitstatus_to_exitcode(status))
"""
"""Imports specbuild's commands once, then for each request line (JSON: output, point, argv, log) forks a process that
runs `specbuild ARGV` with an audit hook stopping it at POINT of its write to OUTPUT; replies with its pid, whether it
stopped there, and how it ended. A fork of this process is the command as `python -m specbuild.cli` runs it, without
paying for the imports on each kill (seconds on two busy cores)."""


Forker = subprocess.Popen[str]

POINTS = ("lock", "first file", "second file", "manifest", "swap", "cleanup")


# -- helpers --------------------------------------------------------------------------------------------------------
def snapshot(directory: Path) -> dict[str, str] | None:
    """Every file under `directory` with its content hash (None: no directory): byte-identical is equality."""
    if not directory.is_dir():
        return None
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def leftovers(directory: Path) -> list[str]:
    """Temporary, moved-aside and lock files next to the outputs in `directory`."""
    return sorted(p.name for p in directory.iterdir() if ".tmp-" in p.name or ".old-" in p.name
                  or p.name.endswith(".lock"))


def cli(*args: str | Path) -> tuple[int, str]:
    result = runner.invoke(app, [str(arg) for arg in args])
    return result.exit_code, " ".join(result.output.split())


@pytest.fixture(scope="module")
def forker() -> Iterator[Forker]:
    """The process every killed command is forked from (see FORKER)."""
    process = subprocess.Popen([sys.executable, "-c", FORKER], cwd=REPO, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    yield process
    assert process.stdin is not None
    process.stdin.close()
    process.wait(timeout=60)


def _message(process: Forker, deadline: float) -> dict[str, Any]:
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], max(0.0, deadline - time.monotonic()))
    assert ready, "no answer from the forked command in time"
    line = process.stdout.readline()
    assert line, f"the forking process died (exit {process.poll()})"
    return json.loads(line)


def killed_at(forker: Forker, point: str, output: Path, *args: str | Path,
              timeout: float = 300) -> str:
    """Run `specbuild ARGS` in its own process, stopped at `point` of its write to `output`, then SIGKILL it; returns
    its output. Fails when the command ends without reaching the point (the kill would then test nothing)."""
    assert point in POINTS and forker.stdin is not None
    output.parent.mkdir(parents=True, exist_ok=True)
    log = output.parent / f"killed-{output.name}.log"
    forker.stdin.write(json.dumps({"output": str(output), "point": point, "argv": [str(a) for a in args],
                                   "log": str(log)}) + "\n")
    forker.stdin.flush()
    deadline = time.monotonic() + timeout
    pid = _message(forker, deadline)["pid"]
    try:
        stopped = _message(forker, deadline)
    except AssertionError:
        os.kill(pid, signal.SIGKILL)
        raise
    text = log.read_text()
    log.unlink()
    if not stopped["stopped"]:
        pytest.fail(f"`specbuild {' '.join(map(str, args))}` ended (exit {stopped['code']}) before reaching "
                    f"{point!r} of {output}:\n{text}")
    os.kill(pid, signal.SIGKILL)
    assert _message(forker, deadline)["code"] == -signal.SIGKILL
    assert f"[stopped at {point}]" in text, text
    if point != "lock":  # killed inside the write: what it was writing (or moving aside) is left next to the output
        left = [name for name in leftovers(output.parent) if name.startswith(f".{output.name}.")]
        assert any(".tmp-" in name or ".old-" in name for name in left), (point, left)
    return text


def check_after_kill(point: str, outputs: dict[Path, dict[str, str] | None], rerun: tuple[str | Path, ...],
                     complete: Callable[[Path, dict[str, str]], None] | None = None) -> None:
    """After a kill at `point`: each output is its previous self byte-identical, or complete; a rerun of the command
    succeeds and leaves nothing next to any output. `outputs` holds each output's snapshot before the kill.
    `complete(output, snapshot)` judges a changed output (default: it is what the rerun writes, byte for byte,
    and the rerun found it up to date)."""
    after = {output: snapshot(output) for output in outputs}
    changed = [output for output, before in outputs.items() if after[output] != before]
    for output in changed:
        assert after[output] is not None, f"{output}: gone after a kill at {point!r} (the previous output lost)"
        if complete is not None:
            complete(output, after[output])  # judged as the kill left it, before the rerun replaces it
    code, text = cli(*rerun)
    assert code == 0, f"the rerun after a kill at {point!r} failed: {text}"
    for output in outputs:
        assert leftovers(output.parent) == [], (point, output, text)
    for output in changed if complete is None else []:
        assert after[output] == snapshot(output), (
            f"{output}: after a kill at {point!r} neither the previous output nor the complete new one")
        if "export" not in rerun:  # an export has no freshness check: it always rewrites
            assert f"{output} is up to date" in text or f"up to date: {output}" in text, (point, output, text)


# -- models and specs -----------------------------------------------------------------------------------------------
TEXTS = corpus.training_texts()[:12]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A 6-layer target (EAGLE-3 needs more than 5), a 2-layer draft sharing its tokenizer, and a training text."""
    from specbuild.demo.tokenizer import save_tokenizer, train_tokenizer

    root = tmp_path_factory.mktemp("kill-models")
    tokenizer = train_tokenizer(TEXTS, 512)
    ids = {"vocab_size": 512, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3}
    found = {"target": make_checkpoint(root / "target", "llama", seed=3, dtype=torch.float32, num_hidden_layers=6,
                                       **ids),
             "draft": make_checkpoint(root / "draft", "llama", seed=4, dtype=torch.float32, num_hidden_layers=2,
                                      **ids)}
    for directory in found.values():
        save_tokenizer(tokenizer, directory, 256)
    found["text"] = root / "text.txt"
    found["text"].write_text("\n\n".join(TEXTS[:3]), encoding="utf-8")
    return found


def write_spec(root: Path, models: dict[str, Path], *, mode: str = "none", dtype: str = "float32",
               max_batch_size: int = 2, exclude_input: bool = False, **fields: Any) -> Path:
    """`root/pipeline.yaml` (output_dir `root/out`, reference backend); `fields` replace top-level entries."""
    data: dict[str, Any] = {
        "name": "kill", "output_dir": str(root / "out"), "target": {"model": str(models["target"])},
        "speculative": {"mode": mode, **({"num_draft_tokens": 2} if mode == "draft_target" else {})},
        "build": {"backend": "reference", "dtype": dtype, "max_batch_size": max_batch_size, "max_input_len": 32,
                  "max_output_len": 16},
    }
    if exclude_input:
        data["deploy"] = {"exclude_input_in_output": True}
    if mode == "draft_target":
        data["draft"] = {"model": str(models["draft"])}
    data.update(fields)
    path = root / "pipeline.yaml"
    root.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


# -- the stages killed ----------------------------------------------------------------------------------------------
def test_a_killed_convert_leaves_each_checkpoint_as_it_was_or_complete(
        forker: Forker, models: dict[str, Path], tmp_path: Path
) -> None:
    """convert SPEC writes two checkpoints (target, then draft): killed before locking, inside the target's write,
    at the draft's manifest (the target already new) and while removing the old target, each is old or new."""
    spec = write_spec(tmp_path, models, mode="draft_target", dtype="float16")
    assert cli("convert", spec)[0] == 0
    target, draft = tmp_path / "out" / "checkpoints" / "target", tmp_path / "out" / "checkpoints" / "draft"
    for step, (point, watched) in enumerate((("lock", target), ("second file", target), ("manifest", draft),
                                             ("cleanup", target))):
        write_spec(tmp_path, models, mode="draft_target", dtype="float32" if step % 2 == 0 else "float16")
        before = {output: snapshot(output) for output in (target, draft)}
        killed_at(forker, point, watched, "convert", spec)
        check_after_kill(point, before, ("convert", spec))


def test_a_killed_single_model_convert_leaves_the_checkpoint_as_it_was_or_complete(
        forker: Forker, models: dict[str, Path], tmp_path: Path
) -> None:
    """`convert --model X --output Y` killed at the swap of the new checkpoint with the previous one: the output must
    still be the one or the other (two renames with a kill between them left neither)."""
    out = tmp_path / "trt"
    assert cli("convert", "--model", models["draft"], "--output", out)[0] == 0
    before = {out: snapshot(out)}
    killed_at(forker, "swap", out, "convert", "--model", models["target"], "--output", out)
    check_after_kill("swap", before, ("convert", "--model", models["target"], "--output", out))


@pytest.fixture
def built(models: dict[str, Path], tmp_path: Path) -> Path:
    """A converted, built and deployed plain pipeline (its spec)."""
    spec = write_spec(tmp_path, models)
    for stage in ("convert", "build", "deploy"):
        code, text = cli(stage, spec)
        assert code == 0, text
    return spec


def test_a_killed_build_leaves_the_engine_as_it_was_or_complete(
        forker: Forker, built: Path, models: dict[str, Path], tmp_path: Path
) -> None:
    engine = tmp_path / "out" / "engines" / "target"
    for step, point in enumerate(("lock", "second file", "manifest")):
        write_spec(tmp_path, models, max_batch_size=3 if step % 2 == 0 else 2)
        before = {engine: snapshot(engine)}
        killed_at(forker, point, engine, "build", built)
        check_after_kill(point, before, ("build", built))


def test_a_killed_deploy_leaves_the_repository_as_it_was_or_complete(
        forker: Forker, built: Path, models: dict[str, Path], tmp_path: Path
) -> None:
    repository = tmp_path / "out" / "model_repository"
    for step, point in enumerate(("second file", "manifest", "cleanup")):
        write_spec(tmp_path, models, exclude_input=step % 2 == 0)
        before = {repository: snapshot(repository)}
        killed_at(forker, point, repository, "deploy", built)
        check_after_kill(point, before, ("deploy", built))


def test_a_killed_export_leaves_the_export_as_it_was_or_complete(
        forker: Forker, models: dict[str, Path], tmp_path: Path
) -> None:
    spec = write_spec(tmp_path, models, mode="draft_target")
    out = tmp_path / "vllm"
    assert cli("export", "vllm", spec, "--output", out)[0] == 0
    for step, point in enumerate(("first file", "manifest")):
        write_spec(tmp_path, models, mode="draft_target", max_batch_size=3 if step % 2 == 0 else 2)
        before = {out: snapshot(out)}
        killed_at(forker, point, out, "export", "vllm", spec, "--output", out)
        check_after_kill(point, before, ("export", "vllm", spec, "--output", out))


# -- the trainers killed --------------------------------------------------------------------------------------------
QUICK = ("--steps", "1", "--seq-len", "16", "--batch-size", "2")


def _medusa(output: Path) -> None:
    from specbuild.medusa.train import load_medusa_heads

    load_medusa_heads(output)


def _eagle(output: Path) -> None:
    from specbuild.eagle.format import read_eagle3_draft

    read_eagle3_draft(output)


def _adapter(output: Path) -> None:
    from specbuild.self_draft.adapter_format import read_adapter

    read_adapter(output)


TRAINERS = {
    "medusa": (lambda m, out: ("medusa", "train", "--base", m["target"], "--output", out), _medusa, "first file"),
    "eagle": (lambda m, out: ("eagle", "train", m["target"], out, "--ttt-steps", "1"), _eagle, "manifest"),
    "draft": (lambda m, out: ("draft", "train", "--target", m["target"], "--layers", "1", "--output", out),
              _adapter, "cleanup"),
}


@pytest.mark.parametrize("trainer", sorted(TRAINERS))
def test_a_killed_trainer_leaves_its_output_as_it_was_or_complete(
        forker: Forker, trainer: str, models: dict[str, Path], tmp_path: Path
) -> None:
    """Each trainer run twice into one output (its own earlier output replaced), the second run killed in its
    write; the output is the first run's byte-identical, or the second's read back by its loader."""
    command, load, point = TRAINERS[trainer]
    out = tmp_path / "out"
    args = (*command(models, out), *QUICK, "--text", models["text"])
    code, text = cli(*args, "--seed", "0")
    assert code == 0, text
    before = {out: snapshot(out)}

    def complete(output: Path, found: dict[str, str]) -> None:
        assert "manifest.json" in found, f"{output}: changed after a kill at {point!r}, without its manifest"
        load(output)

    killed_at(forker, point, out, *args, "--seed", "1")
    check_after_kill(point, before, (*args, "--seed", "1"), complete)


# -- an output overlapping an input ---------------------------------------------------------------------------------
def refused(args: tuple[str | Path, ...], *phrases: str | Path) -> str:
    code, text = cli(*args)
    assert code == 1, text
    assert "Traceback" not in text
    for phrase in phrases:
        assert str(phrase) in text, (phrase, text)
    return text


def test_convert_refuses_an_output_that_is_contains_or_lies_inside_an_input(
        models: dict[str, Path], tmp_path: Path
) -> None:
    model = tmp_path / "models" / "m"
    make_checkpoint(model, "llama", seed=5)
    before = snapshot(tmp_path / "models")
    refused(("convert", "--model", model, "--output", model / "trt"),
            f"{model / 'trt'}: the --output lies inside the input --model {model}")
    refused(("convert", "--model", model, "--output", tmp_path / "models"),
            f"{tmp_path / 'models'}: the --output contains the input --model {model}", "would delete")
    refused(("convert", "--model", model, "--output", model), f"{model}: the --output is the input --model {model}")
    assert snapshot(tmp_path / "models") == before and leftovers(tmp_path / "models") == []
    # a spec: its output_dir inside target.model, and target.model where convert writes the target's checkpoint
    target = models["target"]
    kept = snapshot(target)
    spec = write_spec(tmp_path / "a", models, output_dir=str(target / "build"))
    refused(("convert", spec), f"{target / 'build' / 'checkpoints' / 'target'}: the output_dir's target checkpoint "
            f"lies inside the input target.model {target}")
    assert snapshot(target) == kept and not (target / "build").exists()
    inside = tmp_path / "b" / "out" / "checkpoints" / "target" / "hf"  # where convert would delete it
    shutil.copytree(target, inside)
    spec = write_spec(tmp_path / "b", models, target={"model": str(inside)})
    refused(("convert", spec), f"{inside.parent}: the output_dir's target checkpoint contains the input target.model "
            f"{inside}", "would delete")
    assert snapshot(inside) == kept


def test_build_refuses_an_engine_directory_overlapping_a_checkpoint_or_a_model(
        models: dict[str, Path], tmp_path: Path
) -> None:
    """Through symlinks (output_dir parts moved to another disk) an engine directory can hold or sit in its own
    checkpoint; on the PyTorch flow the llm_api directory can sit inside target.model."""
    spec = write_spec(tmp_path, models)
    assert cli("convert", spec)[0] == 0
    out = tmp_path / "out"
    checkpoint, engine = out / "checkpoints" / "target", out / "engines" / "target"
    moved = engine / "ckpt"  # the checkpoint inside the engine directory, linked back where build reads it
    moved.parent.mkdir(parents=True)
    checkpoint.rename(moved)
    os.symlink(moved, checkpoint)
    kept = snapshot(moved)
    refused(("build", spec), f"{engine}: the output_dir's target engine contains the input output_dir's target "
            f"checkpoint {checkpoint}")
    assert snapshot(moved) == kept and sorted(p.name for p in engine.iterdir()) == ["ckpt"]
    checkpoint.unlink()
    moved.rename(checkpoint)
    engine.rmdir()
    (out / "engines").rmdir()
    (checkpoint / "engines").mkdir()  # the engines directory linked into the checkpoint
    os.symlink(checkpoint / "engines", out / "engines")
    kept = snapshot(checkpoint)
    refused(("build", spec), f"{engine}: the output_dir's target engine lies inside the input output_dir's target "
            f"checkpoint {checkpoint}")
    assert snapshot(checkpoint) == kept and list((checkpoint / "engines").iterdir()) == []
    target = models["target"]
    kept = snapshot(target)
    pytorch = write_spec(tmp_path / "pt", models, output_dir=str(target / "build"),
                         build={"flow": "pytorch", "max_batch_size": 2, "max_input_len": 16, "max_output_len": 8})
    refused(("build", pytorch), f"{target / 'build' / 'llm_api'}: the output_dir's llm_api directory lies inside the "
            f"input target.model {target}")
    assert snapshot(target) == kept and not (target / "build").exists()


def test_deploy_refuses_a_repository_overlapping_an_engine_or_the_tokenizer(
        built: Path, models: dict[str, Path], tmp_path: Path
) -> None:
    engines = tmp_path / "out" / "engines"
    kept = snapshot(engines)
    data = yaml.safe_load(built.read_text())
    data["deploy"] = {"model_repository": str(engines)}
    built.write_text(yaml.safe_dump(data, sort_keys=False))
    refused(("deploy", built), f"{engines}: the deploy.model_repository contains the input output_dir's target "
            f"engine {engines / 'target'}", "would delete")
    assert snapshot(engines) == kept and leftovers(engines.parent) == []
    target = models["target"]
    kept = snapshot(target)
    data["deploy"]["model_repository"] = str(target / "repo")
    built.write_text(yaml.safe_dump(data, sort_keys=False))
    refused(("deploy", built), f"{target / 'repo'}: the deploy.model_repository lies inside the input target.model "
            f"{target}")
    assert snapshot(target) == kept and not (target / "repo").exists()


def test_export_refuses_a_directory_overlapping_a_model_or_the_spec(models: dict[str, Path], tmp_path: Path) -> None:
    spec = write_spec(tmp_path, models, mode="draft_target")
    target, draft = models["target"], models["draft"]
    kept = snapshot(target.parent)
    refused(("export", "vllm", spec, "--output", target.parent),
            f"{target.parent}: the --output contains the input target.model {target}")
    refused(("export", "vllm", spec, "--output", draft / "vllm"),
            f"{draft / 'vllm'}: the --output lies inside the input draft.model {draft}")
    refused(("export", "sglang", spec, "--output", tmp_path),
            f"{tmp_path}: the --output contains the input SPEC {spec}")
    assert snapshot(target.parent) == kept and not (draft / "vllm").exists()
    inside = write_spec(tmp_path / "in", models, mode="draft_target", output_dir=str(target / "build"))
    refused(("export", "vllm", inside), f"{target / 'build' / 'export' / 'vllm'}: the output_dir's export directory "
            f"lies inside the input target.model {target}")
    assert snapshot(target.parent) == kept


# -- the swap itself ------------------------------------------------------------------------------------------------
def test_a_filesystem_without_exchange_still_loses_no_previous_output(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Where renameat2's exchange is not available the swap is two renames; a run that died between them (the previous
    output moved aside under its dead owner's tag, no output) has the previous output put back by the next run on it,
    before anything else, instead of removed as a stale leftover."""
    from specbuild import atomic

    final = tmp_path / "out"
    with atomic.atomic_directory(final) as tmp:
        (tmp / "manifest.json").write_text("{}")
        (tmp / "weights").write_bytes(b"previous")
    before = snapshot(final)
    dead = final.parent / f".{final.name}.old-{os.getpid()}-1-deadbeef"  # our pid, another start stamp: dead
    final.rename(dead)
    with atomic.output_lock(final):
        pass
    assert snapshot(final) == before and not dead.exists()

    monkeypatch.setattr(atomic, "_renameat2", lambda: None)
    with atomic.atomic_directory(final) as tmp:
        (tmp / "manifest.json").write_text("{}")
        (tmp / "weights").write_bytes(b"new")
    assert (final / "weights").read_bytes() == b"new" and leftovers(tmp_path) == []


def test_an_input_reached_through_a_link_inside_the_output_is_refused(tmp_path: Path) -> None:
    """The swap would delete the user's link with the output: compared as written, not only resolved."""
    from specbuild.atomic import refuse_overlap
    from specbuild.errors import SpecbuildError

    model = tmp_path / "models" / "target"
    model.mkdir(parents=True)
    output = tmp_path / "out"
    output.mkdir()
    (output / "target").symlink_to(model)
    with pytest.raises(SpecbuildError, match=r"the output contains the input --model .*out/target"):
        refuse_overlap(output, {"--model": output / "target"})
