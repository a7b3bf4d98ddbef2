"""Reliability of the build side (convert, build, deploy, validate, generate): no silent wrong output, every fault
named once with its fix, nothing left running or half-written.

Every error test checks the message (the file, field or tensor, and what to do), the exit code 1, that the earlier
output is byte-identical, and that no temporary directory or lock file is left next to it. Models are the tiny
random checkpoints of tests/tiny_models.py (no trained demo model, no tritonserver); a tiny byte-level BPE
tokenizer is trained here where a stage needs one.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from rich.console import Console
from typer.testing import CliRunner

from specbuild.cli import app
from specbuild.convert import safetensors_writer
from specbuild.convert.pipeline import ConvertRequest, convert_checkpoint
from specbuild.runtime import CausalLM
from tests.tiny_models import edit_config, make_checkpoint, make_model, save_model

REPO = Path(__file__).resolve().parents[1]
QUIET = Console(file=io.StringIO())
runner = CliRunner()


# -- helpers --------------------------------------------------------------------------------------------------------
def snapshot(directory: Path) -> dict[str, str]:
    """Every file under `directory` with its content hash: 'byte-identical' is equality of two snapshots."""
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def leftovers(directory: Path) -> list[str]:
    """Hidden temporary, moved-aside and lock files specbuild would leave next to its outputs."""
    return sorted(p.name for p in directory.rglob(".*") if ".tmp-" in p.name or ".old-" in p.name
                  or p.name.endswith(".lock"))


def cli(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, " ".join(result.output.split())


def add_tokenizer(directory: Path) -> Path:
    """A tiny byte-level BPE tokenizer (ids < 300, so < every tiny model's vocabulary) saved as transformers does."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>", "<pad>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(["The for statement iterates over the items of any sequence."] * 20, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>")
    fast.save_pretrained(str(directory))
    return directory


def write_spec(root: Path, target: Path, *, mode: str = "none", draft: dict[str, Any] | None = None,
               medusa: dict[str, Any] | None = None, build: dict[str, Any] | None = None) -> Path:
    data: dict[str, Any] = {
        "name": "faults", "output_dir": str(root / "out"), "target": {"model": str(target)},
        "speculative": {"mode": mode},
        "build": {"backend": "reference", "max_batch_size": 2, "max_input_len": 32, "max_output_len": 16,
                  **(build or {})},
    }
    if draft is not None:
        data["draft"] = draft
    if medusa is not None:
        data["medusa"] = medusa
    path = root / "pipeline.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def line_of(spec: Path, text: str) -> int:
    """The 1-based line of the first line of `spec` containing `text`."""
    return next(i for i, line in enumerate(spec.read_text().splitlines(), 1) if text in line)


def python(code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=REPO)


HOLDER = r"""
import sys, time
from pathlib import Path
from specbuild.atomic import atomic_directory
with atomic_directory(Path(sys.argv[1])) as tmp:
    (tmp / "rank0.safetensors").write_bytes(b"\0" * 200_000)  # half of a checkpoint
    print(tmp, flush=True)
    time.sleep(600)
"""
"""A writer that stops in the middle of an output (its temporary directory holds part of it) until killed."""


@contextlib.contextmanager
def holding(output: Path) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    process = python(HOLDER, str(output))
    try:
        assert process.stdout is not None
        line = process.stdout.readline().strip()
        assert line, process.stderr.read() if process.stderr else "holder died"
        yield process, Path(line)
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=30)


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama with a tokenizer (what a spec's target needs)."""
    return add_tokenizer(make_checkpoint(tmp_path_factory.mktemp("hf") / "llama", "llama", seed=1))


# -- 1. Mistral's sliding window ------------------------------------------------------------------------------------
WINDOW = 8


@pytest.fixture(scope="module")
def windowed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path, Path]:
    """(HF MistralForCausalLM float32 with sliding_window 8, its HF dir, its converted checkpoint)."""
    root = tmp_path_factory.mktemp("mistral")
    model = make_model("mistral", dtype=torch.float32, sliding_window=WINDOW)
    hf = add_tokenizer(save_model(model, root / "hf"))
    convert_checkpoint(ConvertRequest("m", hf, root / "trt", dtype="float32"), console=QUIET)
    return model, hf, root / "trt"


def test_mistral_window_reaches_the_checkpoint_and_the_runtime_gives_transformers_logits(
        windowed: tuple[Any, Path, Path]) -> None:
    """A prompt three windows long: full attention differs from the first token past the window, the window
    matches transformers' MistralForCausalLM at every position, in one forward and decoding token by token."""
    hf_model, _, checkpoint = windowed
    config = json.loads((checkpoint / "config.json").read_text())
    assert config["sliding_window"] == WINDOW
    model = CausalLM.from_checkpoint(checkpoint)
    assert model.config.sliding_window == WINDOW
    ids = torch.randint(0, 1000, (2, 3 * WINDOW), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = hf_model(ids).logits
    cache = model.new_cache(2, 4 * WINDOW)
    assert (model(ids, cache).logits - expected).abs().max() <= 1e-4
    cache = model.new_cache(2, 4 * WINDOW)
    steps = [model(ids[:, :5], cache).logits]
    cache.advance(5)
    for i in range(5, ids.shape[1]):
        steps.append(model(ids[:, i:i + 1], cache).logits)
        cache.advance(1)
    assert (torch.cat(steps, dim=1) - expected).abs().max() <= 1e-4
    assert hf_model(ids).logits[:, -1].argmax(-1).tolist() == expected[:, -1].argmax(-1).tolist()


def test_tree_and_draft_verification_respect_the_window(windowed: tuple[Any, Path, Path]) -> None:
    """Medusa-style tree verification (positions by depth) past the window gives each node what sequential
    decoding along its path gives; draft-target greedy output equals plain greedy output past the window."""
    from specbuild.runtime.generation import generate
    from specbuild.runtime.sequence import StopCriteria
    from specbuild.runtime.speculative import DraftTargetConfig, generate_draft_target

    hf_model, _, checkpoint = windowed
    model = CausalLM.from_checkpoint(checkpoint)
    parents = [-1, 0, 0, 1, 2, 3]
    paths: list[list[int]] = []
    for node, parent in enumerate(parents):
        paths.append([*(paths[parent] if parent >= 0 else []), node])
    mask = torch.zeros(len(parents), len(parents), dtype=torch.bool)
    for node, path in enumerate(paths):
        mask[node, path] = True
    depth = torch.tensor([len(p) - 1 for p in paths])
    gen = torch.Generator().manual_seed(1)
    prefix = torch.randint(0, 1000, (2 * WINDOW,), generator=gen)
    nodes = torch.randint(0, 1000, (len(parents),), generator=gen)
    cache = model.new_cache(1, 4 * WINDOW)
    model(prefix[None], cache)
    cache.advance(len(prefix))
    tree = model(nodes[None], cache, position_ids=cache.lengths[:, None] + depth, tree_mask=mask).logits[0]
    with torch.no_grad():
        for node, path in enumerate(paths):
            sequential = hf_model(torch.cat([prefix, nodes[path]])[None]).logits[0, -1]
            assert (tree[node] - sequential).abs().max() <= 1e-4, node
    prompts = [prefix.tolist(), prefix[:WINDOW + 3].tolist()]
    stop = StopCriteria(2 * WINDOW)
    plain = generate(model, prompts, stop=stop).output_ids
    speculated = generate_draft_target(model, model, prompts, stop=stop,
                                       config=DraftTargetConfig(num_draft_tokens=3)).output_ids
    assert speculated == plain
    with torch.no_grad():  # and the plain greedy tokens are transformers' own
        for prompt, output in zip(prompts, plain, strict=True):
            reference = hf_model.generate(torch.tensor([prompt]), max_new_tokens=len(output), do_sample=False,
                                          min_new_tokens=len(output))
            assert reference[0, len(prompt):].tolist() == output


def test_window_travels_to_the_engine_and_the_deployed_tensorrt_llm_model(
        windowed: tuple[Any, Path, Path], tmp_path: Path) -> None:
    from specbuild.build import build_pipeline
    from specbuild.build.plan import plan_engine
    from specbuild.contracts.engine_info import engine_dir, read_engine_info
    from specbuild.deploy.pbtxt import parameter, read_config
    from specbuild.deploy.repository import deploy_repository
    from specbuild.spec import load_spec

    _, hf, _ = windowed
    spec = load_spec(write_spec(tmp_path, hf, build={"dtype": "float32"}))
    code, text = cli("convert", str(spec.path))
    assert code == 0, text
    build_pipeline(spec, console=QUIET)
    info = read_engine_info(engine_dir(spec, "target"))
    assert plan_engine(spec, "target", None).engine_max_seq_len == 48 > WINDOW
    assert info.max_attention_window_size == WINDOW
    repository = deploy_repository(spec, console=QUIET).repository
    assert parameter(read_config(repository / "tensorrt_llm" / "config.pbtxt"), "max_attention_window_size") == "8"


def test_tensorrt_plan_of_a_speculating_windowed_engine_warns_and_carries_the_window(
        windowed: tuple[Any, Path, Path], tmp_path: Path) -> None:
    _, hf, _ = windowed
    draft = add_tokenizer(make_checkpoint(tmp_path / "draft", "mistral", seed=2, num_hidden_layers=1,
                                          sliding_window=WINDOW))
    spec = write_spec(tmp_path, hf, mode="draft_target", draft={"model": str(draft)},
                      build={"dtype": "float32", "backend": "tensorrt"})
    assert cli("convert", str(spec))[0] == 0
    code, text = cli("build", str(spec), "--dry-run")
    assert code == 0, text
    assert "warning: target engine: attention window 8 (sliding_window) is shorter than its sequences" in text
    assert "compare its output on prompts longer than the window with the reference backend's" in text
    script = (tmp_path / "out" / "build-scripts" / "target" / "build.sh").read_text()
    assert '"max_attention_window_size": 8' in script  # the engine.json the container writes


def test_qwen2_with_per_layer_sliding_windows_is_refused(tmp_path: Path) -> None:
    source = make_checkpoint(tmp_path / "qwen", "qwen2", use_sliding_window=True, sliding_window=8,
                             max_window_layers=1)
    edit_config(source, use_sliding_window=True, sliding_window=8, max_window_layers=1)
    code, text = cli("convert", "--model", str(source), "--output", str(tmp_path / "out"))
    assert code == 1
    assert "config.json: use_sliding_window is true (layers 1-1 attend to the last 8 tokens only)" in text
    assert "hint: use a checkpoint with use_sliding_window: false" in text
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []


# -- 2. tie_word_embeddings against an lm_head of its own ------------------------------------------------------------
def test_tied_config_with_a_different_lm_head_is_refused(tmp_path: Path) -> None:
    good = make_checkpoint(tmp_path / "good", "llama", seed=3)
    out = tmp_path / "out"
    assert cli("convert", "--model", str(good), "--output", str(out))[0] == 0
    before = snapshot(out)
    source = make_checkpoint(tmp_path / "m", "llama", seed=2)  # untied: lm_head.weight is its own tensor
    edit_config(source, tie_word_embeddings=True)
    code, text = cli("convert", "--model", str(source), "--output", str(out))
    assert code == 1
    assert f"{source / 'config.json'}: config.json says tie_word_embeddings: true" in text
    assert "model.safetensors holds its own lm_head.weight, which differs from model.embed_tokens.weight" in text
    assert "set \"tie_word_embeddings\": false in config.json" in text and "remove lm_head.weight" in text
    assert snapshot(out) == before and leftovers(tmp_path) == []
    code, text = cli("convert", "--model", str(source), "--output", str(out), "--dry-run")  # checked before a plan
    assert code == 1 and "tie_word_embeddings: true" in text


def test_tied_config_with_an_identical_lm_head_converts(tmp_path: Path) -> None:
    model = make_model("llama", seed=4)
    with torch.no_grad():
        model.lm_head.weight.copy_(model.model.embed_tokens.weight)
    source = save_model(model, tmp_path / "m")
    edit_config(source, tie_word_embeddings=True)
    code, text = cli("convert", "--model", str(source), "--output", str(tmp_path / "out"))
    assert code == 0, text


# -- 3. freshness: every setting an output depends on ---------------------------------------------------------------
@pytest.fixture
def deployed(tiny_llama: Path, tmp_path: Path) -> tuple[Path, Path]:
    """(spec, repository) of a converted, built and deployed plain float16 pipeline."""
    spec = write_spec(tmp_path, tiny_llama, build={"dtype": "float16"})
    for stage in ("convert", "build", "deploy"):
        code, text = cli(stage, str(spec))
        assert code == 0, text
    return spec, tmp_path / "out" / "model_repository"


def test_deploy_refuses_engines_built_for_another_dtype(deployed: tuple[Path, Path]) -> None:
    spec, repository = deployed
    before = snapshot(repository)
    spec.write_text(spec.read_text().replace("dtype: float16", "dtype: float32"))
    code, text = cli("deploy", str(spec))
    assert code == 1
    assert "engines/target/engine.json: build.dtype: the engine was built with float16, the spec now says float32" \
        in text
    assert "run `specbuild build SPEC`" in text
    assert snapshot(repository) == before and leftovers(repository.parent) == []


def test_stages_refuse_a_checkpoint_converted_from_an_older_model(tiny_llama: Path, tmp_path: Path) -> None:
    """A model retrained after `convert` (the draft here) leaves a checkpoint of the old weights: building engines
    from it, tuning K on it or deploying engines built from it would build, measure or serve the old model and say
    nothing (tune once measured a demo draft's predecessor this way and chose K by it). build, tune and deploy
    refuse, naming the checkpoint, the changed file and the fix; nothing is written; after `convert` they go on."""
    draft = add_tokenizer(make_checkpoint(tmp_path / "draft", "llama", seed=2, num_hidden_layers=1))
    spec = write_spec(tmp_path, tiny_llama, mode="draft_target", draft={"model": str(draft)},
                      build={"dtype": "float32"})
    assert cli("convert", str(spec))[0] == 0 and cli("build", str(spec))[0] == 0
    make_checkpoint(draft, "llama", seed=3, num_hidden_layers=1)  # retrained in place
    out = tmp_path / "out"
    before = snapshot(out)
    for stage in ("build", "tune", "deploy"):
        code, text = cli(stage, str(spec))
        assert code == 1, (stage, text)
        assert f"draft checkpoint {out / 'checkpoints' / 'draft'}: converted before" in text, (stage, text)
        assert str(draft / "model.safetensors") in text and "specbuild convert" in text, (stage, text)
        assert "target checkpoint" not in text, (stage, text)
        assert snapshot(out) == before, stage
    assert cli("convert", str(spec))[0] == 0
    for stage in ("build", "deploy"):
        code, text = cli(stage, str(spec))
        assert code == 0, (stage, text)


def test_the_llmapi_deploy_refuses_a_checkpoint_converted_from_an_older_model(tiny_llama: Path,
                                                                             tmp_path: Path) -> None:
    """The PyTorch flow on build.backend: reference serves the checkpoints `convert` wrote: a draft retrained after
    `convert` would be deployed (and served) as its old weights, the repository "up to date". deploy refuses, naming
    the checkpoint, the changed file and the fix, and writes nothing; after `convert` it deploys."""
    draft = add_tokenizer(make_checkpoint(tmp_path / "draft", "llama", seed=2, num_hidden_layers=1))
    spec = write_spec(tmp_path, tiny_llama, mode="draft_target", draft={"model": str(draft)},
                      build={"dtype": "float32", "flow": "pytorch"})
    for stage in ("convert", "build", "deploy"):
        assert cli(stage, str(spec))[0] == 0, stage
    make_checkpoint(draft, "llama", seed=3, num_hidden_layers=1)  # retrained in place
    out = tmp_path / "out"
    before = snapshot(out)
    code, text = cli("deploy", str(spec))
    assert code == 1, text
    assert f"draft checkpoint {out / 'checkpoints' / 'draft'}: converted before" in text, text
    assert str(draft / "model.safetensors") in text and "specbuild convert" in text, text
    assert "target checkpoint" not in text and snapshot(out) == before
    assert cli("convert", str(spec))[0] == 0
    code, text = cli("deploy", str(spec))
    assert code == 0 and "up to date" not in text, text


def test_deploy_refuses_engines_of_other_limits_and_of_a_reconverted_checkpoint(deployed: tuple[Path, Path],
                                                                               tmp_path: Path) -> None:
    spec, repository = deployed
    before = snapshot(repository)
    spec.write_text(spec.read_text().replace("max_batch_size: 2", "max_batch_size: 1"))
    code, text = cli("deploy", str(spec))
    assert code == 1 and "build.max_batch_size: the engine was built with 2, the spec now says 1" in text
    spec.write_text(spec.read_text().replace("max_batch_size: 1", "max_batch_size: 2"))
    other = add_tokenizer(make_checkpoint(tmp_path / "other", "llama", seed=9))
    data = yaml.safe_load(spec.read_text())
    data["target"]["model"] = str(other)
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    assert cli("convert", str(spec))[0] == 0  # a new checkpoint, no rebuild
    code, text = cli("deploy", str(spec))
    assert code == 1
    assert "engines/target: built from a checkpoint that has changed since (" in text
    assert "run `specbuild build SPEC`" in text
    assert snapshot(repository) == before and leftovers(repository.parent) == []


def test_convert_and_build_redo_their_work_when_a_tool_version_changes(deployed: tuple[Path, Path],
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    import specbuild.manifest as manifest

    spec, _ = deployed
    assert "up to date" in cli("convert", str(spec))[1] and "up to date" in cli("build", str(spec))[1]
    real = manifest.tool_versions
    monkeypatch.setattr(manifest, "tool_versions", lambda: {**real(), "torch": "0.0.1-other"})
    for module in ("specbuild.convert.pipeline", "specbuild.build.stage", "specbuild.deploy.repository"):
        monkeypatch.setattr(f"{module}.tool_versions", manifest.tool_versions)
    code, text = cli("convert", str(spec))
    assert code == 0 and "up to date" not in text and "wrote" in text
    code, text = cli("build", str(spec))
    assert code == 0 and "up to date" not in text and "built" in text


# -- 4. a full filesystem -------------------------------------------------------------------------------------------
@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 2 MB tmpfs (needs root and mount(2); skipped where the machine does not allow it)."""
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)],
                                           capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (not root, or mount is not permitted)")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(directory: Path) -> None:
    """Take every free byte of `directory`'s filesystem."""
    with (directory / "filler").open("wb") as handle, contextlib.suppress(OSError):
        while True:
            handle.write(b"\0" * 65536)
            handle.flush()


def test_full_tmpfs_is_one_message_for_convert_build_and_deploy(small_tmpfs: Path, tiny_llama: Path,
                                                                 tmp_path: Path) -> None:
    """A real full filesystem (a small tmpfs): convert, build and deploy each end with one message naming the
    directory and the fix, exit code 1, the earlier outputs byte-identical, nothing left behind."""
    spec = write_spec(tmp_path, tiny_llama, build={"dtype": "float16"})
    spec.write_text(spec.read_text().replace(str(tmp_path / "out"), str(small_tmpfs / "out")))
    for stage in ("convert", "build", "deploy"):
        code, text = cli(stage, str(spec))
        assert code == 0, text
    out = small_tmpfs / "out"
    before = snapshot(out)
    fill(small_tmpfs)
    for stage in ("convert", "build", "deploy"):
        code, text = cli(stage, str(spec), "--force")
        assert code == 1, (stage, text)
        assert "Traceback" not in text and "Errno" not in text
        assert "no space left on the device" in text and "free" in text, (stage, text)
        assert "hint: free space on that filesystem, or choose another output_dir" in text
        assert snapshot(out) == before and leftovers(small_tmpfs) == [], stage
    code, text = cli("convert", str(spec), "--force")
    assert f"{out / 'checkpoints'}: no space left on the device" in text and "needed" in text


def test_disk_full_while_writing_a_rank_file_is_one_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ENOSPC injected half-way through a rank file (the write path monkeypatched: runs where no tmpfs can be
    mounted), and the text a library wrapping the OS error gives (safetensors' "(os error 28)")."""
    good = make_checkpoint(tmp_path / "good", "llama", seed=3)
    out = tmp_path / "out"
    assert cli("convert", "--model", str(good), "--output", str(out))[0] == 0
    before = snapshot(out)
    source = make_checkpoint(tmp_path / "m", "llama", seed=2)
    writer = safetensors_writer.StreamingSafetensorsWriter
    real_check = writer._check_next
    for error in (OSError(28, "No space left on device"),
                  RuntimeError("Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "
                               "\"No space left on device\" }) (os error 28)")):
        calls = {"n": 0}

        def failing_check(self: Any, *args: Any, error: BaseException = error, calls: dict = calls) -> None:
            calls["n"] += 1
            if calls["n"] == 5:
                raise error
            real_check(self, *args)

        monkeypatch.setattr(writer, "_check_next", failing_check)
        code, text = cli("convert", "--model", str(source), "--output", str(out))
        assert code == 1 and calls["n"] == 5
        assert f"error: {tmp_path}: no space left on the device (" in text and "needed" in text
        assert "hint: free space on that filesystem, or choose another output_dir (--output)" in text
        assert "the previous output is unchanged" in text and "Traceback" not in text
        assert snapshot(out) == before and leftovers(tmp_path) == []


# -- 5. leftovers of killed runs ------------------------------------------------------------------------------------
def test_sigkilled_writer_leaves_a_temporary_directory_that_the_next_run_removes(tmp_path: Path) -> None:
    source = make_checkpoint(tmp_path / "m", "llama")
    out = tmp_path / "out"
    with holding(out) as (process, temporary):
        assert temporary.is_dir() and temporary.name.startswith(".out.tmp-")
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
    assert temporary.is_dir()  # what a killed convert leaves: part of a checkpoint, the size of the model
    code, text = cli("convert", "--model", str(source), "--output", str(out))
    assert code == 0, text
    assert not temporary.exists() and leftovers(tmp_path) == []
    assert (out / "rank0.safetensors").is_file() and (out / "manifest.json").is_file()


def test_a_live_runs_temporary_directory_is_never_removed(tmp_path: Path) -> None:
    from specbuild.atomic import owner_tag, remove_stale_temporaries

    out = tmp_path / "out"
    with holding(out) as (_, temporary):
        reused = tmp_path / f".out.tmp-{os.getpid()}-12345-abcdefgh"  # this pid, another process's start time
        reused.mkdir()
        mine = tmp_path / f".out.tmp-{owner_tag()}-abcdefgh"  # this very process: alive
        mine.mkdir()
        removed = remove_stale_temporaries(out)
        assert temporary.is_dir() and mine.is_dir(), "a live writer's directory was removed"
        assert removed == [reused] and not reused.exists()
        mine.rmdir()


# -- 6. one writer per output ---------------------------------------------------------------------------------------
def test_a_second_convert_into_the_same_output_fails_naming_the_first(tmp_path: Path) -> None:
    """Two real processes: one writing the output (held mid-write), and a real `specbuild convert` into it."""
    source = make_checkpoint(tmp_path / "m", "llama")
    out = tmp_path / "out"
    good = make_checkpoint(tmp_path / "g", "llama", seed=5)
    assert cli("convert", "--model", str(good), "--output", str(out))[0] == 0
    before = snapshot(out)
    with holding(out) as (process, _):
        second = subprocess.run([sys.executable, "-m", "specbuild.cli", "convert", "--model", str(source),
                                 "--output", str(out)], capture_output=True, text=True, cwd=REPO, timeout=120)
        text = " ".join(second.stderr.split())
        assert second.returncode == 1, text
        assert f"{out}: another specbuild run is using this output now (pid {process.pid}" in text
        assert "hint: wait for that run to finish, or stop it, then run again" in text
        assert "Traceback" not in text and snapshot(out) == before
    code, text = cli("convert", "--model", str(source), "--output", str(out))  # the holder is gone: it works
    assert code == 0, text
    assert leftovers(tmp_path) == []


def test_build_and_deploy_take_the_lock_too(deployed: tuple[Path, Path]) -> None:
    spec, repository = deployed
    engine = repository.parent / "engines" / "target"
    for stage, output in (("build", engine), ("deploy", repository)):
        before = snapshot(output)
        with holding(output) as (process, _):
            code, text = cli(stage, str(spec), "--force")
            assert code == 1 and f"another specbuild run is using this output now (pid {process.pid}" in text
        assert snapshot(output) == before
    assert leftovers(repository.parent)  # the killed holders' temporary directories and lock files
    for stage in ("build", "deploy"):  # up to date, and what the killed holders left is gone
        code, text = cli(stage, str(spec))
        assert code == 0 and "up to date" in text, text
    assert leftovers(repository.parent) == []


def test_the_pytorch_flow_takes_the_lock_too(tiny_llama: Path, tmp_path: Path) -> None:
    """build and deploy on `build.flow: pytorch` refuse, as the engine flow does, an output another run is writing:
    one message naming it, the output as it was, and up to date again once the holder is gone. (That build also
    reads its manifest under the lock, as every stage does, is not reproduced here: it would need two runs racing.)"""
    spec = tmp_path / "pt.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "pt", "output_dir": str(tmp_path / "out"), "target": {"model": str(tiny_llama)},
        "build": {"flow": "pytorch", "max_batch_size": 2, "max_input_len": 16, "max_output_len": 8},
    }))
    for stage in ("build", "deploy"):
        code, text = cli(stage, str(spec))
        assert code == 0, text
    for stage, output in (("build", tmp_path / "out" / "llm_api"), ("deploy", tmp_path / "out" / "model_repository")):
        before = snapshot(output)
        with holding(output) as (process, _):
            code, text = cli(stage, str(spec), "--force")
            assert code == 1 and f"another specbuild run is using this output now (pid {process.pid}" in text
        assert snapshot(output) == before
    for stage in ("build", "deploy"):
        code, text = cli(stage, str(spec))
        assert code == 0 and "up to date" in text, text


# -- 7 and 9. convert SPEC checks every model before writing any ----------------------------------------------------
def test_convert_spec_checks_the_draft_before_writing_the_target(tiny_llama: Path, tmp_path: Path) -> None:
    draft = add_tokenizer(make_checkpoint(tmp_path / "draft", "llama", seed=2, num_hidden_layers=1,
                                          intermediate_size=96))  # down_proj is 96 wide: no int4 group fits
    spec = write_spec(tmp_path, tiny_llama, mode="draft_target", draft={
        "model": str(draft), "quantization": {"format": "int4_awq", "calib": {"source": str(tmp_path / "nope.txt")}}})
    code, text = cli("convert", str(spec))
    assert code == 1
    assert "int4 AWQ needs every linear layer's input size to be a multiple of the group size" in text
    assert "transformer.layers.0.mlp.proj.weight is 96 wide" in text
    assert not (tmp_path / "out").exists(), "the target was written before the draft was checked"
    assert leftovers(tmp_path) == []
    spec.write_text(spec.read_text().replace("int4_awq", "int8_wo"))
    code, text = cli("convert", str(spec))
    assert code == 1 and f"{tmp_path / 'nope.txt'}: calibration source does not exist" in text
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []


def test_target_without_tokenizer_files_is_refused_by_convert(tmp_path: Path) -> None:
    target = make_checkpoint(tmp_path / "bare", "llama")
    spec = write_spec(tmp_path, target)
    code, text = cli("convert", str(spec))
    assert code == 1
    assert f"{target}: target.model has no tokenizer files; looked for tokenizer.json, tokenizer_config.json" in text
    assert "hint: copy the tokenizer files that came with the model" in text
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []


# -- 8. validate checks what convert and build would find -----------------------------------------------------------
def test_validate_reports_every_model_problem_at_its_line(tmp_path: Path) -> None:
    target = make_checkpoint(tmp_path / "target", "llama")  # no tokenizer files
    draft = add_tokenizer(make_checkpoint(tmp_path / "draft", "llama", seed=2, num_hidden_layers=1,
                                          intermediate_size=96))
    spec = write_spec(tmp_path, target, mode="draft_target", build={"gpu": "B200"}, draft={
        "model": str(draft), "quantization": {"format": "int4_awq", "calib": {"source": str(tmp_path / "nope.txt")}}})
    code, text = cli("validate", str(spec))
    assert code == 1
    s = str(spec)
    at = line_of(spec, "model: " + str(target))
    assert f"{s}:{at}: target.model: {target}: target.model has no tokenizer" in text
    assert f"{s}:{line_of(spec, 'format: int4_awq')}: draft.quantization.format: {draft}: int4 AWQ needs" in text
    assert f"{s}:{line_of(spec, 'source:')}: draft.quantization.calib.source: {tmp_path / 'nope.txt'}: calibration " \
           "source does not exist" in text
    assert f"{s}:{line_of(spec, 'format: int4_awq')}: draft.quantization.format: draft engine: checkpoint " \
           "quant_algo=W4A16_AWQ (draft.quantization.format int4_awq) cannot be built for B200" in text
    assert "5 problems" in text and leftovers(tmp_path) == [] and not (tmp_path / "out").exists()


def test_validate_checks_quantization_against_the_gpu_and_the_medusa_tree_against_the_heads(tiny_llama: Path,
                                                                                           tmp_path: Path) -> None:
    from tests.build_pipelines import _write_heads

    draft = add_tokenizer(make_checkpoint(tmp_path / "draft", "llama", seed=2, num_hidden_layers=1))
    spec = write_spec(tmp_path, tiny_llama, mode="draft_target", build={"gpu": "A100"},
                      draft={"model": str(draft), "quantization": {"format": "fp8"}})
    code, text = cli("validate", str(spec))
    assert code == 1
    assert f"{spec}:{line_of(spec, 'format: fp8')}: draft.quantization.format: draft checkpoint is quantized " \
           "quant_algo=FP8, which needs Ada or Hopper" in text
    heads = _write_heads(tmp_path / "heads", 2)
    spec = write_spec(tmp_path, tiny_llama, mode="medusa", medusa={"heads": str(heads),
                                                                   "choices": [[0], [0, 0], [0, 0, 0]]})
    code, text = cli("validate", str(spec))
    assert code == 1
    assert f"{spec}:{line_of(spec, 'choices:')}: medusa.choices: medusa.choices: the tree is 3 deep, but the " \
           "checkpoint has 2 Medusa heads" in text
    spec = write_spec(tmp_path, tmp_path / "missing")
    code, text = cli("validate", str(spec))
    assert code == 1 and f"{spec}:{line_of(spec, 'model:')}: target.model: {tmp_path / 'missing'}: model " \
        "directory does not exist" in text


def test_validate_passes_a_good_spec(tiny_llama: Path, tmp_path: Path) -> None:
    code, text = cli("validate", str(write_spec(tmp_path, tiny_llama)))
    assert code == 0, text
    assert not (tmp_path / "out").exists()


# -- 10. generate on a device that is not there ---------------------------------------------------------------------
@pytest.mark.parametrize(("device", "cuda", "available", "message"), [
    ("cuda", None, False, "--device cuda: this torch ("),
    ("cuda", "12.8", False, "--device cuda: torch"),
    ("cuda:7", "12.8", True, "--device cuda:7: this machine has 1 CUDA GPU(s), numbered 0-0"),
    ("tpu", None, False, "--device tpu: not a device name"),
    ("mps", None, False, "--device mps: the reference runtime runs on cpu or cuda, not mps"),
])
def test_generate_on_a_missing_device_is_one_message(device: str, cuda: str | None, available: bool, message: str,
                                                     windowed: tuple[Any, Path, Path],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    _, hf, checkpoint = windowed
    monkeypatch.setattr(torch.version, "cuda", cuda)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1 if available else 0)
    result = runner.invoke(app, ["generate", str(checkpoint), "--tokenizer", str(hf), "--prompt", "The for",
                                 "--device", device])
    text = " ".join(result.output.split())
    assert result.exit_code == 1, text
    assert message in text and "hint: use" in text and "Traceback" not in text and "AssertionError" not in text


def test_generate_runs_where_the_device_is(windowed: tuple[Any, Path, Path]) -> None:
    _, hf, checkpoint = windowed
    devices = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]
    for device in devices:
        result = runner.invoke(app, ["generate", str(checkpoint), "--tokenizer", str(hf), "--prompt", "The for",
                                     "--device", device, "--max-tokens", "4", "--json"])
        assert result.exit_code == 0, result.output
        assert len(json.loads(result.stdout.splitlines()[-1])["output_ids"]) == 4


@pytest.mark.parametrize("family", ["gemma2", "gemma3"])
def test_gemma_per_layer_windows_reach_the_engine_and_the_deployed_model(family: str, tmp_path: Path) -> None:
    """Gemma alternates sliding and global layers: the engine (engine.json, the TensorRT build script's and the
    reference bundle's) and the deployed tensorrt_llm model carry one period of per-layer windows, which TensorRT-LLM
    repeats over the layers (examples/models/core/gemma/README.md @b35ac1b6); repeated, it must give every layer
    the window transformers gives it (layer_types), and a global layer the whole sequence."""
    from specbuild.build import build_pipeline
    from specbuild.build.plan import plan_engine
    from specbuild.contracts.engine_info import engine_dir, read_engine_info
    from specbuild.deploy.pbtxt import parameter, read_config
    from specbuild.deploy.repository import deploy_repository
    from specbuild.spec import load_spec

    hf = add_tokenizer(make_checkpoint(tmp_path / "hf", family, dtype=torch.float32))
    layer_types = json.loads((hf / "config.json").read_text())["layer_types"]
    window = json.loads((hf / "config.json").read_text())["sliding_window"]
    spec_path = write_spec(tmp_path, hf, build={"dtype": "float32", "backend": "tensorrt"})
    assert cli("convert", str(spec_path))[0] == 0
    code, text = cli("build", str(spec_path), "--dry-run")
    assert code == 0, text
    spec = load_spec(spec_path)
    seq = plan_engine(spec, "target", None).engine_max_seq_len
    expected = [window if kind == "sliding_attention" else seq for kind in layer_types]
    script = (tmp_path / "out" / "build-scripts" / "target" / "build.sh").read_text()
    period = json.loads(script.split('"max_attention_window_size": ', 1)[1].split("]", 1)[0] + "]")
    assert [period[layer % len(period)] for layer in range(len(layer_types))] == expected

    spec = load_spec(write_spec(tmp_path, hf, build={"dtype": "float32"}))
    build_pipeline(spec, console=QUIET)
    assert read_engine_info(engine_dir(spec, "target")).max_attention_window_size == period
    repository = deploy_repository(spec, console=QUIET).repository
    deployed = parameter(read_config(repository / "tensorrt_llm" / "config.pbtxt"), "max_attention_window_size")
    assert deployed == ",".join(map(str, period))
