"""Each TensorRT-LLM line's LLM API (`build.trtllm`): what the line accepts, what it refuses, and what is written.

TensorRT-LLM cannot run here (no GPU, no wheel), so each line's cases are taken from its own
tensorrt_llm/llmapi/llm_args.py in NVIDIA/TensorRT-LLM:
- 1.2: the 1.2-line llm_args.py (commit 195839a7; tag v1.2.0): DecodingBaseConfig.from_dict keys DraftTarget,
  Eagle, NGram, Medusa, Lookahead; MedusaDecodingConfig/LookaheadDecodingConfig.supports_backend False for
  "pytorch"; acceptance_window / acceptance_length_threshold.
- 1.3: llm_args.py @0004396720054fd8e205cbf616f21f0b57c6b412: no Medusa/Lookahead configs; Draft_Target, Eagle3,
  SA, PARD, DFlash, DSpark decoding types; acceptance_rate_window_size / acceptance_rate_threshold;
  validate_draft_len_schedule_and_sort (smallest key == max_draft_len) and
  validate_max_concurrency_and_draft_len_schedule_mutually_exclusive.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from specbuild.contracts import llm_api
from specbuild.errors import SpecbuildError
from specbuild.spec import SpecValidationError, parse_spec


def _spec(tmp_path: Path, line: str | None, mode: str = "draft_target", **speculative: Any) -> Any:
    build: dict[str, Any] = {"flow": "pytorch", "max_batch_size": 8, "max_input_len": 64, "max_output_len": 16}
    if line is not None:
        build["trtllm"] = line
    data: dict[str, Any] = {"name": "lines", "output_dir": str(tmp_path / "out"),
                            "target": {"model": str(tmp_path / "target")},
                            "speculative": {"mode": mode, **speculative}, "build": build}
    if mode in ("draft_target", "eagle3"):
        data["draft"] = {"model": str(tmp_path / "draft")}
    if mode == "medusa":
        data["medusa"] = {"heads": str(tmp_path / "heads")}
    return parse_spec(data, tmp_path / "lines.yaml")


def test_the_line_defaults_by_flow_and_engines_are_1_2_only(tmp_path: Path) -> None:
    """No build.trtllm: engines mean 1.2 (the last line with trtllm-build), the PyTorch flow the newest line read;
    an engine-flow spec naming a later line is refused at the field."""
    assert _spec(tmp_path, None).build.line == llm_api.NEWEST_LINE.name == "1.3"
    engine = parse_spec({"name": "e", "target": {"model": str(tmp_path)},
                         "build": {"max_batch_size": 1, "max_input_len": 8, "max_output_len": 8}}, tmp_path / "e.yaml")
    assert engine.build.line == "1.2"
    with pytest.raises(SpecValidationError, match=r"build\.trtllm: TensorRT-LLM 1\.3 has no engine flow"):
        parse_spec({"name": "e", "target": {"model": str(tmp_path)},
                    "build": {"trtllm": "1.3", "max_batch_size": 1, "max_input_len": 8, "max_output_len": 8}},
                   tmp_path / "e.yaml")


@pytest.mark.parametrize(("line", "names"), [
    ("1.2", {"draft_target": "DraftTarget", "eagle3": "Eagle", "ngram": "NGram"}),
    ("1.3", {"draft_target": "Draft_Target", "eagle3": "Eagle3", "ngram": "NGram"}),
])
def test_each_line_writes_its_own_decoding_type(tmp_path: Path, line: str, names: dict[str, str]) -> None:
    """The same spec modes become each line's own decoding_type strings (1.2 from_dict's keys; 1.3's Literal
    decoding_type of DraftTargetDecodingConfig and Eagle3DecodingConfig), and both lines accept what they get."""
    for mode, name in names.items():
        spec = _spec(tmp_path, line, mode, num_draft_tokens=3)
        args = llm_api.llm_args(spec)
        assert args["speculative_config"]["decoding_type"] == name
        assert list(llm_api.settings_problems(args, llm_api.LINES[line])) == []
        other = next(each for each in llm_api.LINES.values() if each.name != line)
        if name not in other.decoding_types:  # DraftTarget / Draft_Target: one line's name is the other's error
            assert any("is not one of" in m for _, m in llm_api.settings_problems(args, other))


def test_1_2_accepts_its_acceptance_fields_and_1_3_the_renamed_ones(tmp_path: Path) -> None:
    """acceptance_window / acceptance_length_threshold (1.2) became acceptance_rate_window_size /
    acceptance_rate_threshold (1.3): each line accepts its own names and refuses the other's."""
    base = llm_api.llm_args(_spec(tmp_path, "1.2", num_draft_tokens=3))
    config = base["speculative_config"]
    old = {**base, "speculative_config": {**config, "acceptance_window": 8, "acceptance_length_threshold": 0.5}}
    new = {**base, "speculative_config": {**config, "decoding_type": "Draft_Target",
                                          "acceptance_rate_window_size": 8, "acceptance_rate_threshold": 0.5}}
    assert list(llm_api.settings_problems(old, llm_api.LINE_1_2)) == []
    assert list(llm_api.settings_problems(new, llm_api.LINE_1_3)) == []
    assert any("'acceptance_rate_window_size' is not a field" in m
               for _, m in llm_api.settings_problems({**new, "speculative_config": {
                   **new["speculative_config"], "decoding_type": "DraftTarget"}}, llm_api.LINE_1_2))
    assert any("'acceptance_window' is not a field of TensorRT-LLM 1.3's DraftTargetDecodingConfig" in m
               for _, m in llm_api.settings_problems({**old, "speculative_config": {
                   **old["speculative_config"], "decoding_type": "Draft_Target"}}, llm_api.LINE_1_3))
    assert llm_api.LINE_1_3.acceptance_fields == ("acceptance_rate_window_size", "acceptance_rate_threshold")


@pytest.mark.parametrize(("mode", "instead"), [("medusa", "specbuild eagle train"), ("lookahead", "mode: ngram")])
def test_1_3_refuses_medusa_and_lookahead_with_what_to_use(tmp_path: Path, mode: str, instead: str) -> None:
    """1.3's llm_args.py has no MedusaDecodingConfig or LookaheadDecodingConfig: refused by name with the
    replacement; on 1.2 the refusal is supports_backend's (engine only)."""
    spec = _spec(tmp_path, "1.3", mode)
    [(loc, message)] = llm_api.flow_problems(spec)
    assert loc == ("speculative", "mode") and "TensorRT-LLM 1.3 has no" in message and instead in message
    with pytest.raises(SpecbuildError, match=r"TensorRT-LLM 1\.3 has no"):
        llm_api.refuse_pytorch_flow_problems(spec, "build")
    [(_, old)] = llm_api.flow_problems(_spec(tmp_path, "1.2", mode))
    assert "supports_backend is False for 'pytorch'" in old


def test_1_3_schedule_is_written_up_to_and_never_beside_max_concurrency(tmp_path: Path) -> None:
    """The spec's schedule (each key the batch size a length applies from, 1.2's meaning) is written as 1.3
    spells it (each key the largest batch size a length applies to, 0 above the largest: llm_args.py's
    "{4:4, 8:2, 32:1} - Batch sizes 1-4: use draft_len=4"), and max_concurrency, exclusive with a schedule
    there, becomes its last bound; 1.3's validators then accept it. On 1.2 the schedule is written as given."""
    spec = _spec(tmp_path, "1.3", num_draft_tokens=4, draft_len_schedule={1: 4, 4: 2, 8: 0}, max_concurrency=6)
    config = llm_api.llm_args(spec)["speculative_config"]
    assert config["draft_len_schedule"] == {3: 4, 6: 2} and "max_concurrency" not in config
    assert list(llm_api.settings_problems(llm_api.llm_args(spec), llm_api.LINE_1_3)) == []
    refused = {**config, "max_concurrency": 6, "draft_len_schedule": {1: 2, 4: 4}}
    messages = [m for _, m in llm_api.settings_problems({"backend": "pytorch", "speculative_config": refused},
                                                         llm_api.LINE_1_3)]
    assert any("mutually exclusive" in m for m in messages)
    assert any("draft_len_schedule[1] must equal max_draft_len" in m for m in messages)
    old = llm_api.llm_args(_spec(tmp_path, "1.2", num_draft_tokens=4, draft_len_schedule={1: 4, 4: 2, 8: 0}))
    assert old["speculative_config"]["draft_len_schedule"] == {1: 4, 4: 2, 8: 0}


def test_1_3_drops_the_deprecated_eagle3_one_model(tmp_path: Path) -> None:
    """1.3's EagleDecodingConfig ignores eagle3_one_model=False ("falls back to True"), so it is not written there;
    1.2 writes it."""
    assert "eagle3_one_model" not in llm_api.llm_args(_spec(tmp_path, "1.3", "eagle3"))["speculative_config"]
    assert llm_api.llm_args(_spec(tmp_path, "1.2", "eagle3"))["speculative_config"]["eagle3_one_model"] is True


def test_written_files_carry_the_lines_names(tmp_path: Path, demo_models: dict[str, Path]) -> None:
    """build's llm_api.json, Triton's model.yaml and the trtllm-serve options carry the spec's line's names, and
    build tells the user the line as a version, not a commit."""
    from specbuild.build.llm_api import build_llm_api
    from specbuild.contracts.llm_api import LLM_API_PLAN, llm_api_dir
    from specbuild.deploy.llmapi import deploy_llm_api

    for line, name in (("1.2", "DraftTarget"), ("1.3", "Draft_Target")):
        data = {"name": f"l{line}", "output_dir": str(tmp_path / line), "target": {"model": str(demo_models["target"])},
                "draft": {"model": str(demo_models["draft"])},
                "speculative": {"mode": "draft_target", "num_draft_tokens": 3, "draft_len_schedule": {1: 3, 4: 0}},
                "build": {"flow": "pytorch", "trtllm": line, "dtype": "float32", "max_batch_size": 8,
                          "max_input_len": 64, "max_output_len": 16}}
        spec = parse_spec(data, tmp_path / f"{line}.yaml")
        result = build_llm_api(spec)
        assert f"checked against TensorRT-LLM {line} (LLM API settings)" in result.summary()
        assert "195839a7" not in result.summary() and "0004396" not in result.summary()
        plan = yaml.safe_load((llm_api_dir(spec) / LLM_API_PLAN).read_text())
        deploy_llm_api(spec)
        repository = spec.deploy.model_repository
        model_yaml = yaml.safe_load((repository / llm_api.LLMAPI_MODEL_YAML).read_text())
        options = yaml.safe_load((repository / llm_api.SERVE_OPTIONS).read_text())
        for written in (plan, model_yaml, options):
            assert written["speculative_config"]["decoding_type"] == name
            assert list(llm_api.settings_problems({k: v for k, v in written.items() if k != "triton_config"},
                                                  llm_api.LINES[line])) == []
        expected = {3: 3} if line == "1.3" else {1: 3, 4: 0}
        assert {int(k): v for k, v in model_yaml["speculative_config"]["draft_len_schedule"].items()} == expected


def test_sa_is_a_1_3_mode_with_its_own_settings(tmp_path: Path) -> None:
    """speculative.mode sa is 1.3's SADecodingConfig (decoding_type "SA", its fields max_matching_ngram_size,
    enable_global_pool, global_pool_size; validate_sa_config's refusals of a 0 n-gram size and of a pool size
    without the pool); 1.2's llm_args.py has no SA, so it is refused there with what to use; the engine flow
    refuses it with supports_backend's reason."""
    spec = _spec(tmp_path, "1.3", "sa", num_draft_tokens=4, sa={"max_matching_ngram_size": 3})
    args = llm_api.llm_args(spec)
    assert args["speculative_config"] == {"decoding_type": "SA", "max_draft_len": 4, "max_matching_ngram_size": 3,
                                          "enable_global_pool": False}
    assert list(llm_api.settings_problems(args, llm_api.LINE_1_3)) == []
    [(_, old)] = llm_api.flow_problems(_spec(tmp_path, "1.2", "sa"))
    assert "TensorRT-LLM 1.2 has no SA" in old and "mode: ngram" in old
    for bad, says in (({"max_matching_ngram_size": 0}, "must be > 0"),
                      ({"global_pool_size": 8}, "only used with enable_global_pool")):
        with pytest.raises(SpecValidationError, match=says):
            _spec(tmp_path, "1.3", "sa", sa=bad)
    with pytest.raises(SpecValidationError, match="given, but mode is 'ngram'"):
        _spec(tmp_path, "1.3", "ngram", sa={})
    engine = parse_spec({"name": "e", "target": {"model": str(tmp_path)}, "speculative": {"mode": "sa"},
                         "build": {"max_batch_size": 1, "max_input_len": 8, "max_output_len": 8}}, tmp_path / "e.yaml")
    [(_, message)] = llm_api.flow_problems(engine)
    assert "sa runs only on the PyTorch backend" in message
