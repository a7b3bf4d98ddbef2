"""`specbuild deploy` without a server: what the repository holds, how it is checked, and the pieces the python
models run on (incremental detokenisation, prefix-reusing KV caches, draft verification)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specbuild.deploy.check import check_repository
from specbuild.deploy.pbtxt import parameter, read_config
from specbuild.deploy.repository import deploy_repository
from specbuild.errors import SpecbuildError
from specbuild.medusa.choices import format_choices, parse_choices
from specbuild.python_models.bls_loop import PLAIN_ROUND_MAX_TOKENS, PLAIN_ROUND_PARAMETER
from tests.deploy_fixtures import Deployed

DT_MODELS = {"preprocessing", "postprocessing", "tensorrt_llm", "tensorrt_llm_draft", "tensorrt_llm_bls", "ensemble"}


def _configs(repository: Path) -> dict[str, object]:
    return {p.parent.name: read_config(p) for p in repository.glob("*/config.pbtxt")}


def test_draft_target_repository_has_every_model_filled_and_consistent(deployed: Deployed) -> None:
    repository = deployed.repository("draft_target")
    configs = _configs(repository)
    assert set(configs) == DT_MODELS
    for path in repository.rglob("config.pbtxt"):
        assert "${" not in path.read_text()
    spec = deployed.specs["draft_target"]
    assert {c.max_batch_size for c in configs.values()} == {spec.deploy.triton_max_batch_size}
    bls, target, draft = configs["tensorrt_llm_bls"], configs["tensorrt_llm"], configs["tensorrt_llm_draft"]
    assert bls.model_transaction_policy.decoupled is True  # demo streams
    assert not target.model_transaction_policy.decoupled and not draft.model_transaction_policy.decoupled
    assert parameter(bls, "tensorrt_llm_model_name") == "tensorrt_llm"
    assert parameter(bls, "tensorrt_llm_draft_model_name") == "tensorrt_llm_draft"
    assert parameter(bls, "num_draft_tokens") == "4"
    # the spec's most tokens of a round without speculation, or the BLS's own default where it sets none
    assert parameter(bls, PLAIN_ROUND_PARAMETER) == str(spec.speculative.plain_round_tokens or PLAIN_ROUND_MAX_TOKENS)
    assert target.backend == "python" and (repository / "tensorrt_llm" / "1" / "model.py").is_file()
    engines = spec.output_dir / "engines"
    assert Path(parameter(target, "gpt_model_path")) == (engines / "target").resolve()
    assert Path(parameter(draft, "gpt_model_path")) == (engines / "draft").resolve()
    ids = {(parameter(c, "end_id"), parameter(c, "pad_id")) for c in configs.values() if parameter(c, "end_id")}
    assert ids == {("2", "3")}  # the demo tokenizer's </s> and <pad>, the same in every model
    inputs = {t.name for t in target.input}
    outputs = {t.name for t in target.output}
    assert {"input_ids", "input_lengths", "request_output_len", "draft_input_ids", "draft_logits"} <= inputs
    assert {"output_ids", "sequence_length", "acceptance_rate", "total_accepted_draft_tokens",
            "total_draft_tokens"} <= outputs
    steps = [s.model_name for s in configs["ensemble"].ensemble_scheduling.step]
    assert steps == ["preprocessing", "tensorrt_llm", "postprocessing"]


def test_medusa_repository_goes_through_the_ensemble_with_its_tree(deployed: Deployed) -> None:
    configs = _configs(deployed.repository("medusa"))
    assert set(configs) == {"preprocessing", "postprocessing", "tensorrt_llm", "tensorrt_llm_bls", "ensemble"}
    assert parameter(configs["tensorrt_llm_bls"], "tensorrt_llm_draft_model_name") == "", "no draft: a plain chain"
    llm = configs["tensorrt_llm"]
    assert parameter(llm, "decoding_mode") == "medusa"
    tree = deployed.specs["medusa"].medusa.resolved_choices()
    assert parse_choices(parameter(llm, "medusa_choices")) == tree
    assert llm.model_transaction_policy.decoupled is True  # the ensemble streams Medusa rounds


def test_tokenizer_travels_with_the_repository(deployed: Deployed, tmp_path: Path) -> None:
    moved = tmp_path / "elsewhere"
    shutil.copytree(deployed.repository("draft_target"), moved)
    report = check_repository(moved)
    assert report.problems == []
    for model in ("preprocessing", "postprocessing"):
        config = read_config(moved / model / "config.pbtxt")
        assert not Path(parameter(config, "tokenizer_dir")).is_absolute()
        assert (moved / model / parameter(config, "tokenizer_dir") / "tokenizer.json").is_file()


def test_rerun_is_a_no_op_and_dry_run_writes_nothing(deployed: Deployed, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """An unchanged re-run neither rewrites nor re-reads: inputs whose stat the manifest recorded keep their hash."""
    from specbuild import manifest as manifest_module

    spec = deployed.specs["none"]
    manifest = spec.deploy.model_repository / "manifest.json"
    before = manifest.stat().st_mtime_ns
    hashed: list[str] = []
    real = manifest_module.content_hash
    monkeypatch.setattr(manifest_module, "content_hash", lambda path: hashed.append(path.name) or real(path))
    assert deploy_repository(spec).status == "up to date"
    assert hashed == []
    assert manifest.stat().st_mtime_ns == before
    assert deploy_repository(spec, dry_run=True).status == "planned"
    assert deploy_repository(spec, force=True).status == "written"


def test_deploy_checks_the_repository_once_and_the_cli_shows_that_check(deployed: Deployed,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The check deploy runs before the swap is the one `specbuild deploy` prints, under the repository's final
    name (not its temporary one); an up-to-date re-run checks what it found, also once."""
    from typer.testing import CliRunner

    from specbuild.cli.app import app
    from specbuild.deploy import check
    from specbuild.deploy import repository as repository_module

    spec = deployed.specs["none"]
    repository = spec.deploy.model_repository
    result = deploy_repository(spec, force=True)
    assert result.report is not None and result.report.problems == []
    assert result.report.repository == repository
    assert all(model.directory.parent == repository and model.directory.is_dir()
               for model in result.report.models.values())
    assert deploy_repository(spec, dry_run=True).report is None
    calls: list[Path] = []
    real = check.check_repository
    counted = lambda path: calls.append(path) or real(path)  # noqa: E731
    monkeypatch.setattr(check, "check_repository", counted)
    monkeypatch.setattr(repository_module, "check_repository", counted)
    for args, status in ((["--force"], "written"), ([], "up to date")):
        calls.clear()
        run = CliRunner().invoke(app, ["deploy", str(spec.path), *args])
        assert run.exit_code == 0, run.output
        assert len(calls) == 1, calls
        assert "tensorrt_llm_bls" in run.output and status in run.output


def _specbuild(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "specbuild.cli", *args], capture_output=True, text=True,
                          timeout=120)


def test_check_names_the_model_and_parameter_of_a_misspelt_draft(deployed: Deployed, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(deployed.repository("draft_target"), broken)
    config = broken / "tensorrt_llm_bls" / "config.pbtxt"
    config.write_text(config.read_text().replace('"tensorrt_llm_draft"', '"tensorrt_llm_drfat"'))
    report = check_repository(broken)
    assert any("tensorrt_llm_bls" in p and "tensorrt_llm_draft_model_name" in p and "tensorrt_llm_drfat" in p
               for p in report.problems), report.problems
    result = _specbuild("deploy", "--check", str(broken))
    assert result.returncode == 1
    assert "tensorrt_llm_draft_model_name" in result.stderr and "tensorrt_llm_drfat" in result.stderr
    ok = _specbuild("deploy", "--check", str(deployed.repository("draft_target")))
    assert ok.returncode == 0, ok.stderr
    assert "tensorrt_llm_bls" in ok.stdout and "calls" in ok.stdout


@pytest.mark.parametrize(("edit", "expected"), [
    (lambda t: t.replace("max_batch_size: 4", "max_batch_size: ${triton_max_batch_size}"), "unfilled template"),
    (lambda t: t.replace('model_name: "tensorrt_llm"', 'model_name: "tensorrt_lm"'), "'tensorrt_lm' is not in"),
    (lambda t: t.replace('key: "SEQUENCE_LENGTH"', 'key: "SEQ_LEN"'), "'SEQ_LEN' is not an input"),
    (lambda t: t.replace("dims: [ 1 ]", "dims: [ one ]", 1), "not a valid Triton ModelConfig"),
])
def test_check_finds_ensemble_mistakes(deployed: Deployed, tmp_path: Path, edit: object, expected: str) -> None:
    broken = tmp_path / "repo"
    shutil.copytree(deployed.repository("medusa"), broken)
    config = broken / "ensemble" / "config.pbtxt"
    config.write_text(edit(config.read_text()))  # type: ignore[operator]
    problems = check_repository(broken).problems
    assert any(expected in p for p in problems), problems


def test_check_applies_the_medusa_tree_rules(deployed: Deployed, tmp_path: Path) -> None:
    broken = tmp_path / "repo"
    shutil.copytree(deployed.repository("medusa"), broken)
    config = broken / "tensorrt_llm" / "config.pbtxt"
    text = config.read_text()
    config.write_text(re.sub(r'(key: "medusa_choices" value: \{ string_value: ")', r"\1{5, 5}, ", text))
    problems = check_repository(broken).problems
    assert any("tensorrt_llm: parameter medusa_choices" in p and "prefix [5] is not listed" in p
               for p in problems), problems


def test_deploy_without_built_engines_says_to_build(tmp_path: Path, demo_models: dict[str, Path]) -> None:
    from tests.deploy_fixtures import pipeline_data, write_spec

    spec = write_spec(tmp_path, pipeline_data("nobuild", demo_models, "none", tmp_path / "out"))
    with pytest.raises(SpecbuildError, match="specbuild build"):
        deploy_repository(spec)
    assert not (tmp_path / "out" / "model_repository").exists()


# -- pieces the python models run on -------------------------------------------------------------------------


def test_medusa_choices_parameter_round_trips() -> None:
    tree = [[0], [0, 0], [1], [0, 1, 2]]
    assert format_choices(tree) == "{0}, {0, 0}, {1}, {0, 1, 2}"
    assert parse_choices(format_choices(tree)) == tree
    with pytest.raises(ValueError):
        parse_choices("{0, x}")


def test_a_repository_deployed_before_llm_engine_still_finds_what_its_model_imports() -> None:
    """Repositories deployed before b32a0e5 hold a tensorrt_llm model.py that imports parse_choices from
    specbuild.deploy.pbtxt; upgrading specbuild without redeploying must not make that model fail to load."""
    from specbuild.deploy import pbtxt

    assert pbtxt.parse_choices is parse_choices


def test_streamed_chunks_detokenise_to_the_whole_text(deployed: Deployed) -> None:
    from specbuild.python_models.detokenize import decode_chunk, preceding_tokens
    from specbuild.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(deployed.tokenizer_dir)
    text = "naïve café: 日本語 and ünïcode, then plain words with spaces."
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) > len(text.encode("utf-8")) // 4  # byte-level pieces: characters are split over tokens
    for size in (1, 2, 3):
        chunks = []
        for start in range(0, len(ids), size):
            final = start + size >= len(ids)
            chunks.append(decode_chunk(tokenizer, ids[start:start + size], preceding_tokens(ids, start), final))
        assert "".join(chunks) == tokenizer.decode(ids)
        assert not any("\ufffd" in c for c in chunks)
    naive = "".join(tokenizer.decode([t]) for t in ids)
    assert naive != text  # what per-chunk decoding would have streamed


def test_dry_run_cli_prints_the_plan(deployed: Deployed) -> None:
    spec = deployed.specs["medusa"]
    result = _specbuild("deploy", str(spec.path), "--dry-run")
    assert result.returncode == 0, result.stderr
    assert re.search(r"tensorrt_llm\s", result.stderr) and "planned" in result.stderr


def test_tensorrt_engines_get_the_tensorrtllm_backend(deployed: Deployed, tmp_path: Path) -> None:
    """The same spec with TensorRT-LLM engines (as `build` writes them on a GPU machine): the LLM models use the
    C++ backend with the engine directory, with no python code and no reference-only tensors."""
    import dataclasses
    import json

    from specbuild.contracts.engine_info import engine_dir, read_engine_info, write_engine_info
    from tests.deploy_fixtures import write_spec

    source = deployed.specs["draft_target"]
    data = yaml_data(source)
    data["output_dir"] = str(tmp_path / "out")
    data["name"] = "trt"
    spec = write_spec(tmp_path, data)
    for role in ("target", "draft"):
        directory = engine_dir(spec, role)
        directory.mkdir(parents=True)
        info = dataclasses.replace(read_engine_info(engine_dir(source, role)), backend="tensorrt")
        write_engine_info(directory, info)
        (directory / "config.json").write_text(json.dumps({"build_config": {"max_batch_size": 4}}))
        (directory / "rank0.engine").write_bytes(b"")
    repository = deploy_repository(spec).repository
    configs = _configs(repository)
    for name in ("tensorrt_llm", "tensorrt_llm_draft"):
        assert configs[name].backend == "tensorrtllm"
        assert not (repository / name / "1" / "model.py").exists()
        assert parameter(configs[name], "gpt_model_type") == "inflight_fused_batching"
        assert parameter(configs[name], "kv_cache_free_gpu_mem_fraction") == "0.45"  # two engines share the GPU
        assert "preceding_ids" not in {t.name for t in configs[name].output}
    assert "_PRECEDING_IDS" not in (repository / "ensemble" / "config.pbtxt").read_text()
    assert configs["tensorrt_llm_bls"].backend == "python"
    assert check_repository(repository).problems == []


def yaml_data(spec: object) -> dict:
    import yaml

    return yaml.safe_load(spec.path.read_text())  # type: ignore[attr-defined]


def test_triton_batch_above_the_engines_is_refused(deployed: Deployed, tmp_path: Path) -> None:
    from tests.deploy_fixtures import write_spec

    data = yaml_data(deployed.specs["none"])
    data["deploy"]["triton_max_batch_size"] = 8
    data["deploy"]["model_repository"] = str(tmp_path / "repo")
    with pytest.raises(SpecbuildError, match="max_batch_size"):
        deploy_repository(write_spec(tmp_path, data))


def test_server_thread_override_beats_the_repository_parameter(monkeypatch: pytest.MonkeyPatch) -> None:
    """Python models take torch threads from their `torch_threads` parameter (1 by default, so five model
    processes do not oversubscribe a small machine); SPECBUILD_SERVER_THREADS at serve time overrides it."""
    from specbuild.python_models.model_threads import set_threads

    before = torch.get_num_threads()
    try:
        monkeypatch.delenv("SPECBUILD_SERVER_THREADS", raising=False)
        set_threads({"torch_threads": "1"})
        assert torch.get_num_threads() == 1
        monkeypatch.setenv("SPECBUILD_SERVER_THREADS", "2")
        set_threads({"torch_threads": "1"})
        assert torch.get_num_threads() == 2
        assert __import__("os").environ["OMP_NUM_THREADS"] == "2"
    finally:
        torch.set_num_threads(before)
