"""`specbuild migrate SPEC OUT.yaml`: the engine-flow demo specs become PyTorch-flow specs that validate, keep their
comments, and refuse what they cannot be (the line's reasons: specbuild.contracts.llm_api LINES)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from specbuild.cli.app import app
from specbuild.contracts import llm_api
from specbuild.errors import SpecbuildError
from specbuild.migrate.rewrite import migrate_spec
from specbuild.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
runner = CliRunner()


def _validate(path: Path) -> Any:
    result = runner.invoke(app, ["validate", str(path)], env={"COLUMNS": "200"})
    return result


def test_lookahead_becomes_ngram_and_validates(tmp_path: Path, demo_models: dict[str, Path]) -> None:
    """demo-lookahead (engine, 1.2) -> ngram on the newest line: K = N, matching on N - 1 tokens, its own
    output_dir, comments kept, and `specbuild validate` passes on it."""
    out = tmp_path / "la.yaml"
    result = runner.invoke(app, ["migrate", str(CONFIGS / "demo-lookahead.yaml"), str(out), "--no-measure"],
                           env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "lookahead -> ngram" in result.output and f"TensorRT-LLM {llm_api.NEWEST_LINE.name}" in result.output
    old, new = load_spec(CONFIGS / "demo-lookahead.yaml"), load_spec(out)
    assert (new.build.flow, new.build.line, new.speculative.mode) == ("pytorch", llm_api.NEWEST_LINE.name, "ngram")
    assert new.speculative.num_draft_tokens == old.speculative.lookahead.ngram_size
    assert new.speculative.ngram.max_matching_ngram_size == old.speculative.lookahead.ngram_size - 1
    assert new.target.model == old.target.model and new.output_dir != old.output_dir
    assert "# Demo pipeline with Lookahead decoding" in out.read_text()
    assert llm_api.pytorch_flow_problems(new) == []
    assert _validate(out).exit_code == 0


def test_medusa_becomes_eagle3_with_the_train_command(tmp_path: Path, demo_models: dict[str, Path]) -> None:
    """demo-medusa -> eagle3 with K the tree's depth and the schedule carried (speculation still off from the
    same number of sequences); the draft it names does not exist until `specbuild eagle train` (printed) writes it,
    and validate says so; with an EAGLE-3 draft there (the demo's, the format eagle train writes) it validates."""
    out = tmp_path / "medusa.yaml"
    result = runner.invoke(app, ["migrate", str(CONFIGS / "demo-medusa.yaml"), str(out), "--no-measure"],
                           env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    old, new = load_spec(CONFIGS / "demo-medusa.yaml"), load_spec(out)
    assert new.speculative.mode == "eagle3" and new.medusa is None
    assert new.speculative.num_draft_tokens == old.medusa.depth
    schedule = new.speculative.draft_len_schedule
    carried = old.speculative.draft_len_schedule
    assert 0 in carried.values()  # the demo's schedule turns speculation off at some load: that is carried
    assert schedule[1] == new.speculative.num_draft_tokens and set(schedule) == set(carried)
    assert all((schedule[size] == 0) == (carried[size] == 0) for size in carried), (carried, schedule)
    [command] = re.findall(r"next: (specbuild eagle train \S+ \S+)", result.output)
    assert command.split()[3:] == [str(old.target.model), str(new.draft.model)]
    refused = _validate(out)
    assert refused.exit_code != 0 and "EAGLE-3 draft directory does not exist" in refused.output
    data = yaml.safe_load(out.read_text())
    data["draft"]["model"] = str(demo_models["target"].parent / "eagle3-draft")
    out.write_text(yaml.safe_dump(data))
    assert _validate(out).exit_code == 0, _validate(out).output


def test_an_int8_sq_draft_becomes_fp8(tmp_path: Path, demo_models: dict[str, Path]) -> None:
    """demo.yaml's int8_sq draft: the PyTorch backend has no linear method for it (quant_formats), so the migrated
    spec quantizes to fp8; mode and schedule stay, and it validates."""
    out = tmp_path / "demo.yaml"
    migration = migrate_spec(CONFIGS / "demo.yaml", out)
    assert any("int8_sq -> fp8" in note for note in migration.notes)
    # the kept comments still speak of int8 SmoothQuant: the header the new spec starts with lists what changed
    text = out.read_text()
    header = text[:text.index("\nname:")]
    assert header.startswith("# Written by `specbuild migrate` from demo.yaml")
    assert all(note in header for note in migration.notes) and "int8 SmoothQuant" in text
    old, new = load_spec(CONFIGS / "demo.yaml"), load_spec(out)
    assert new.draft.quantization.format == "fp8" and new.speculative.mode == "draft_target"
    assert new.speculative.draft_len_schedule == old.speculative.draft_len_schedule
    assert _validate(out).exit_code == 0, _validate(out).output


def test_the_bls_plain_round_setting_is_dropped_with_a_note(tmp_path: Path, demo_models: dict[str, Path]) -> None:
    """speculative.plain_round_tokens sizes the engine flow's BLS rounds; the PyTorch flow has no BLS (the spec's
    checks refuse the field there), so migrate removes it, says so, and the result validates."""
    source = tmp_path / "configs" / "demo.yaml"
    source.parent.mkdir()
    text = (CONFIGS / "demo.yaml").read_text().replace("../demo/", f"{ROOT}/demo/")
    source.write_text(text.replace("\nspeculative:\n", "\nspeculative:\n  plain_round_tokens: 2\n", 1))
    assert load_spec(source).speculative.plain_round_tokens == 2
    out = tmp_path / "migrated.yaml"
    migration = migrate_spec(source, out)
    assert "speculative.plain_round_tokens removed: an engine-flow setting" in migration.notes
    assert load_spec(out).speculative.plain_round_tokens is None
    assert _validate(out).exit_code == 0, _validate(out).output


def test_refusals_leave_out_untouched(tmp_path: Path) -> None:
    """OUT == SPEC, a spec already on the PyTorch flow, --line 1.2 and a self-draft (no PyTorch-flow form) are
    refused with why; OUT is not written."""
    with pytest.raises(SpecbuildError, match="never overwrites its input"):
        migrate_spec(CONFIGS / "demo-lookahead.yaml", CONFIGS / "demo-lookahead.yaml")
    out = tmp_path / "out.yaml"
    out.write_text("kept\n")
    with pytest.raises(SpecbuildError, match="already pytorch"):
        migrate_spec(CONFIGS / "demo-pytorch.yaml", out)
    with pytest.raises(SpecbuildError, match=r"a line after 1\.2"):
        migrate_spec(CONFIGS / "demo-lookahead.yaml", out, line="1.2")
    with pytest.raises(SpecbuildError, match="no PyTorch-flow form"):
        migrate_spec(CONFIGS / "demo-self-draft.yaml", out)
    assert out.read_text() == "kept\n"


@pytest.mark.parametrize("to", ["ngram", "sa"])
def test_the_move_is_measured_on_the_reference_runtime(tmp_path: Path, demo_models: dict[str, Path], to: str) -> None:
    """migrate's measurement: plain greedy is one token per target forward, Lookahead (before) and NGram or SA
    (after) each output exactly the plain greedy tokens, and each speculative figure is its counted tokens /
    forwards."""
    from specbuild.migrate.measure import measure_migration

    out = tmp_path / "la.yaml"
    migrate_spec(CONFIGS / "demo-lookahead.yaml", out, to=to)
    figures = measure_migration(load_spec(CONFIGS / "demo-lookahead.yaml"), load_spec(out), prompts=2,
                                prompt_tokens=24, new_tokens=16)
    plain, before, after = figures
    assert (plain.role, before.role, after.role) == ("plain", "before", "after")
    assert plain.tokens_per_target_forward == 1.0
    assert before.method.startswith("lookahead") and after.method.startswith(to)
    for figure in (before, after):
        assert figure.same_as_plain_greedy is True and figure.generated_tokens == 2 * 16
        assert figure.tokens_per_target_forward == figure.generated_tokens / figure.target_forwards >= 1.0


ENGINE_DEMOS = {"demo-lookahead": ("sa", "SA"), "demo": ("ngram", "Draft_Target"), "demo-medusa": ("ngram", "Eagle3"),
                "demo-plain": ("ngram", None)}
"""Every engine-flow demo spec migrate can move (`--to` and the decoding_type its model.yaml must then hold; None:
no speculation). demo-self-draft is refused (test_refusals_leave_out_untouched); demo-medusa2's base needs an
EAGLE-3 draft of its own, which no demo extra trains."""


@pytest.mark.tritonserver
@pytest.mark.parametrize("name", sorted(ENGINE_DEMOS))
def test_a_migrated_spec_serves_the_targets_greedy_text(tmp_path: Path, demo_models: dict[str, Path],
                                                        demo_extra: Any, name: str) -> None:
    """An engine-flow demo spec migrated to the newest line, on the reference backend: it validates, convert,
    build and deploy write the llmapi repository with the line's decoding_type, and a real tritonserver answers
    every prompt with the target's plain greedy completion (the reference runtime's, outside Triton, on the
    checkpoint convert wrote). demo-medusa's EAGLE-3 draft is the demo extra `specbuild eagle train` made on the
    demo target, put where the migrated spec names it (migrate's `--train` would train it there). (NGram is
    served in test_llmapi_batched_served.)"""
    import json
    import shutil

    import torch

    from specbuild.build.llm_api import build_llm_api
    from specbuild.convert.run import convert_spec
    from specbuild.deploy.llmapi import deploy_llm_api
    from specbuild.runtime.generation import generate
    from specbuild.runtime.model import CausalLM
    from specbuild.runtime.sequence import StopCriteria
    from specbuild.serve.server import TritonServer
    from specbuild.tokenizer import load_tokenizer
    from tests.deploy_fixtures import MAX_TOKENS, PROMPTS, http_post

    to, decoding_type = ENGINE_DEMOS[name]
    out = tmp_path / f"{name}.yaml"
    migration = migrate_spec(CONFIGS / f"{name}.yaml", out, to=to)
    data = yaml.safe_load(out.read_text())
    data["output_dir"] = str(tmp_path / "build")
    data["target"]["model"] = str(demo_models["target"])
    if data.get("draft"):
        if migration.train_command is not None:  # Medusa -> EAGLE-3: the trained draft where the spec expects it
            data["draft"]["model"] = str(tmp_path / "build" / "eagle3-draft")
            shutil.copytree(demo_extra("eagle3-draft"), data["draft"]["model"])
        else:
            data["draft"]["model"] = str(demo_models["draft"])
    data["build"]["backend"] = "reference"  # served on CPU by specbuild's llmapi model.py
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    assert _validate(out).exit_code == 0, _validate(out).output
    spec = load_spec(out)
    convert_spec(spec.path)
    build_llm_api(spec)
    repository = deploy_llm_api(spec).repository
    written = yaml.safe_load((repository / llm_api.LLMAPI_MODEL_YAML).read_text())
    assert (written.get("speculative_config") or {}).get("decoding_type") == decoding_type

    tokenizer = load_tokenizer(demo_models["target"])
    model = CausalLM.from_checkpoint(spec.checkpoint_dir("target"))
    with torch.inference_mode():
        greedy = {}
        for prompt in PROMPTS:
            ids = tokenizer.encode(prompt, add_special_tokens=True)
            new = generate(model, [ids], stop=StopCriteria(MAX_TOKENS, tokenizer.eos_token_id)).output_ids[0]
            greedy[prompt] = tokenizer.decode(new, skip_special_tokens=True)
    with TritonServer(repository, log_file=tmp_path / "server.log", ready_timeout_s=420) as server:
        for prompt in PROMPTS:
            status, body = http_post(server.http_url, "/v2/models/tensorrt_llm/generate",
                                     {"text_input": prompt, "sampling_param_max_tokens": MAX_TOKENS,
                                      "sampling_param_exclude_input_from_output": True})
            assert status == 200, body
            assert json.loads(body)["text_output"] == greedy[prompt], prompt
