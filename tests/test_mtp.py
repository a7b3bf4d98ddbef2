"""`speculative.mode: mtp`: drafting with the multi-token-prediction layers a target checkpoint ships itself.

The MTP layers are found in config.json as the engines find them (`contracts.family_support.MTP_LAYER_FIELDS`:
vLLM 0.33.0 SpeculativeConfig.hf_config_override, TensorRT-LLM 1.3 MTPDecodingConfig.num_nextn_predict_layers);
here the count is compared with what transformers 5.14's own config classes read from the same file (DeepSeek-V3
and GLM-4.5 map `num_mtp_layers` to num_nextn_predict_layers), so no weights are needed. TensorRT-LLM cannot run
here, so what the PyTorch flow writes is checked against the 1.3 line's llm_args.py
(@0004396720054fd8e205cbf616f21f0b57c6b412: decoding_type MTP, max_draft_len, supports_backend pytorch and
_autodeploy, speculative_model unset meaning the target's embedded MTP weights).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoConfig, DeepseekV3Config, Glm4MoeConfig, LlamaConfig

from specbuild.contracts import family_support, llm_api
from specbuild.spec import parse_spec

_TINY = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 4}


def _checkpoint(directory: Path, config: Any) -> Path:
    config.save_pretrained(directory)
    return directory


def _spec(tmp_path: Path, target: Path, *, flow: str = "pytorch", line: str | None = "1.3",
          backend: str = "tensorrt", **speculative: Any) -> Any:
    build: dict[str, Any] = {"flow": flow, "backend": backend, "max_batch_size": 8, "max_input_len": 64,
                             "max_output_len": 16}
    if line is not None:
        build["trtllm"] = line
    return parse_spec({"name": "mtp", "output_dir": str(tmp_path / "out"), "target": {"model": str(target)},
                       "speculative": {"mode": "mtp", **speculative}, "build": build}, tmp_path / "mtp.yaml")


@pytest.mark.parametrize(("config_class", "layers"), [(DeepseekV3Config, 1), (DeepseekV3Config, 2),
                                                      (Glm4MoeConfig, 1)])
def test_mtp_layers_are_read_as_transformers_reads_them(tmp_path: Path, config_class: type, layers: int) -> None:
    """DeepSeek-V3/R1 and GLM-4.5 checkpoints declare their MTP layers in config.json; specbuild counts what
    transformers' own config class reads back from the same file (its num_mtp_layers)."""
    directory = _checkpoint(tmp_path / "target", config_class(**_TINY, num_nextn_predict_layers=layers))
    assert family_support.mtp_layers(directory) == AutoConfig.from_pretrained(directory).num_mtp_layers == layers


def test_mtp_layers_in_a_text_config_count_too(tmp_path: Path) -> None:
    """A multimodal checkpoint (Qwen3.5's layout) keeps mtp_num_hidden_layers in text_config, where vLLM's
    hf_config_override also looks."""
    directory = tmp_path / "target"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps({"architectures": ["X"], "text_config": {
        "mtp_num_hidden_layers": 1}}), encoding="utf-8")
    assert family_support.mtp_layers(directory) == 1


def test_a_checkpoint_with_mtp_layers_gets_1_3_mtp_decoding(tmp_path: Path) -> None:
    """A DeepSeek-V3-style target: validate finds nothing, and the LLM API settings are 1.3's MTPDecodingConfig
    with K as max_draft_len and no speculative_model (1.3: unset means the target's own MTP weights), accepted by
    the 1.3 tables."""
    target = _checkpoint(tmp_path / "target", DeepseekV3Config(**_TINY, num_nextn_predict_layers=1))
    spec = _spec(tmp_path, target, num_draft_tokens=3)
    assert llm_api.pytorch_flow_problems(spec) == []
    config = llm_api.llm_args(spec)["speculative_config"]
    assert config == {"decoding_type": "MTP", "max_draft_len": 3}
    assert llm_api.LINE_1_3.decoding_types["MTP"].config_class == "MTPDecodingConfig"
    assert list(llm_api.settings_problems(llm_api.llm_args(spec), llm_api.LINE_1_3)) == []


def test_a_checkpoint_without_mtp_layers_is_refused_with_the_fields_read(tmp_path: Path) -> None:
    """A Llama target has no MTP layers: refused at target.model, naming the config.json fields read and what to
    use instead; nothing else is asked of it."""
    target = _checkpoint(tmp_path / "target", LlamaConfig(**_TINY))
    problems = llm_api.pytorch_flow_problems(_spec(tmp_path, target))
    assert [loc for loc, _ in problems] == [("target", "model")]
    message = problems[0][1]
    assert all(name in message for name in family_support.MTP_LAYER_FIELDS)
    assert "use eagle3, draft_target, ngram or sa" in message


def test_the_engine_flow_and_1_2_have_no_mtp(tmp_path: Path) -> None:
    """TensorRT-LLM 1.2's engine flow builds no MTP layers (MTPDecodingConfig is PyTorch-only there): refused
    with that reason and the fix; on the PyTorch flow specbuild writes 1.3's spelling only, so 1.2 is refused
    naming build.trtllm; the reference backend, which has no MTP drafter, is refused naming build.backend."""
    target = _checkpoint(tmp_path / "target", DeepseekV3Config(**_TINY, num_nextn_predict_layers=1))
    engine = _spec(tmp_path, target, flow="engine", line=None)
    assert [(loc, "set build.flow: pytorch" in m) for loc, m in llm_api.flow_problems(engine)] == [
        (("speculative", "mode"), True)]
    old = llm_api.pytorch_flow_problems(_spec(tmp_path, target, line="1.2"))
    assert [loc for loc, _ in old] == [("speculative", "mode")] and "build.trtllm: '1.3'" in old[0][1]
    reference = llm_api.pytorch_flow_problems(_spec(tmp_path, target, backend="reference"))
    assert [loc for loc, _ in reference] == [("build", "backend")]


def test_the_exports_name_each_engines_mtp_method(tmp_path: Path) -> None:
    """vLLM gets `method: mtp` and SGLang `--speculative-algorithm NEXTN`, K as their step count and no draft path
    (both point the draft at the target themselves); a target without MTP layers is refused by both exports with
    validate's words (tests/test_engines_mtp.py has the engines' own parsers judge these lines)."""
    from specbuild.export import ExportRefused, export_spec

    target = _checkpoint(tmp_path / "target", DeepseekV3Config(**_TINY, num_nextn_predict_layers=1))
    spec = _spec(tmp_path, target, num_draft_tokens=2)
    vllm = export_spec(spec, "vllm", tmp_path / "vllm").plan.argv
    config = json.loads(vllm[vllm.index("--speculative-config") + 1])
    assert config == {"method": "mtp", "num_speculative_tokens": 2}
    sglang = export_spec(spec, "sglang", tmp_path / "sglang").plan.argv
    flags = dict(zip(sglang[3::2], sglang[4::2], strict=False))
    assert flags["--speculative-algorithm"] == "NEXTN" and flags["--speculative-num-steps"] == "2"
    assert "--speculative-draft-model-path" not in sglang
    plain = _spec(tmp_path, _checkpoint(tmp_path / "llama", LlamaConfig(**_TINY)))
    for engine in ("vllm", "sglang"):
        with pytest.raises(ExportRefused, match="carries no multi-token-prediction layers"):
            export_spec(plain, engine, tmp_path / f"refused-{engine}")
