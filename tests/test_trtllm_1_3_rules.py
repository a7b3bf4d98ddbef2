"""TensorRT-LLM 1.3's LLM-API rules, checked at validate for `build.trtllm: "1.3"` PyTorch-flow specs and on a
model.yaml read back (`contracts.llm_api.settings_problems`), one test per rule.

TensorRT-LLM cannot run here (no GPU, no wheel), so each case is taken from the 1.3 line's own
NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/llm_args.py @0004396720054fd8e205cbf616f21f0b57c6b412:
- AutoDecodingConfig.supports_backend: `backend == "pytorch"`;
- DecodingBaseConfig.speculative_model: validation_alias AliasChoices("speculative_model", "speculative_model_dir");
- TorchLlmArgs.validate_speculative_config: an SADecodingConfig's global_pool_size < max_batch_size raises;
  an explicit use_rejection_sampling=True raises for a spec mode outside its rejection-sampling whitelist (NGram,
  SA) or with sa_config;
- MTPDecodingConfig._remap_deprecated_num_nextn_predict_layers: the key moves into max_draft_len when that is
  absent and is dropped when it is given.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from specbuild.contracts import llm_api
from specbuild.spec import parse_spec


def _spec(tmp_path: Path, mode: str, line: str = "1.3", max_batch_size: int = 8, **speculative: Any) -> Any:
    data: dict[str, Any] = {
        "name": "rules", "output_dir": str(tmp_path / "out"), "target": {"model": str(tmp_path / "target")},
        "speculative": {"mode": mode, **speculative},
        "build": {"flow": "pytorch", "trtllm": line, "max_batch_size": max_batch_size, "max_input_len": 64,
                  "max_output_len": 16}}
    if mode in ("draft_target", "eagle3"):
        data["draft"] = {"model": str(tmp_path / "draft")}
    return parse_spec(data, tmp_path / "rules.yaml")


def _problems(args: dict[str, Any], line: llm_api.Line = llm_api.LINE_1_3) -> list[str]:
    return [message for _, message in llm_api.settings_problems(args, line)]


def _args(**config: Any) -> dict[str, Any]:
    return {"model": "/m", "backend": "pytorch", "max_batch_size": 8, "speculative_config": config}


def test_auto_decoding_is_pytorch_only_on_1_3() -> None:
    """AUTO (AutoDecodingConfig) runs on the PyTorch backend only; any other backend is refused with the LLM API's
    own words, and pytorch is accepted."""
    assert _problems(_args(decoding_type="AUTO")) == []
    refused = _problems({**_args(decoding_type="AUTO"), "backend": "_autodeploy"})
    assert any("Speculation type AUTO does not support backend _autodeploy" in m for m in refused)


def test_speculative_model_dir_is_read_as_speculative_model(tmp_path: Path) -> None:
    """A model.yaml naming the draft by the alias `speculative_model_dir` is what 1.3 reads as speculative_model:
    accepted (not 'not a field'), and the draft-target rules see the draft; both spellings with different paths
    is a problem naming both (1.3 keeps speculative_model)."""
    written = llm_api.llm_args(_spec(tmp_path, "draft_target", num_draft_tokens=3))
    config = dict(written["speculative_config"])
    config["speculative_model_dir"] = config.pop("speculative_model")
    assert _problems({**written, "speculative_config": config}) == []
    both = {**config, "speculative_model": "/elsewhere"}
    assert any("'speculative_model_dir'" in m and "'speculative_model'" in m and "both given" in m
               for m in _problems({**written, "speculative_config": both}))


def test_sa_global_pool_must_hold_every_active_request(tmp_path: Path) -> None:
    """SA's explicit global_pool_size below build.max_batch_size is refused at validate, located at
    speculative.sa.global_pool_size; equal is accepted; the same spec on 1.2 stops earlier (1.2 has no SA)."""
    small = _spec(tmp_path, "sa", max_batch_size=8, sa={"enable_global_pool": True, "global_pool_size": 4})
    problems = llm_api.pytorch_flow_problems(small)
    assert [loc for loc, m in problems if "global_pool_size (4) must be >= max_batch_size (8)" in m] == [
        ("speculative", "sa", "global_pool_size")]
    equal = _spec(tmp_path, "sa", max_batch_size=8, sa={"enable_global_pool": True, "global_pool_size": 8})
    assert llm_api.pytorch_flow_problems(equal) == []


def test_mtp_num_nextn_predict_layers_is_deprecated_into_max_draft_len() -> None:
    """1.3 remaps an MTP config's num_nextn_predict_layers into max_draft_len: alone it stands for max_draft_len
    (the schedule rule then holds it to the same value), beside a different max_draft_len it is dropped, which is
    reported; for another decoding type it is no field at all."""
    alone = _args(decoding_type="MTP", num_nextn_predict_layers=2, draft_len_schedule={4: 2})
    assert _problems(alone) == []
    mismatched = _args(decoding_type="MTP", num_nextn_predict_layers=2, draft_len_schedule={4: 3})
    assert any("draft_len_schedule[4] must equal max_draft_len" in m for m in _problems(mismatched))
    both = _args(decoding_type="MTP", num_nextn_predict_layers=2, max_draft_len=3)
    assert any("'num_nextn_predict_layers' (2) and 'max_draft_len' (3) both given" in m for m in _problems(both))
    assert any("'num_nextn_predict_layers' is not a field" in m
               for m in _problems(_args(decoding_type="NGram", max_draft_len=3, num_nextn_predict_layers=2)))


@pytest.mark.parametrize("kind", ["NGram", "SA"])
def test_rejection_sampling_is_refused_with_ngram_and_sa(kind: str) -> None:
    """An explicit use_rejection_sampling: true is refused for NGram and SA (no proposal distribution to accept
    by), accepted for Draft_Target and MTP (on the whitelist), and false is accepted for all."""
    refused = _problems(_args(decoding_type=kind, max_draft_len=3, use_rejection_sampling=True))
    assert any(f"use_rejection_sampling: true is refused for {kind}" in m for m in refused)
    assert _problems(_args(decoding_type=kind, max_draft_len=3, use_rejection_sampling=False)) == []
    for allowed in ("Draft_Target", "MTP"):
        assert _problems(_args(decoding_type=allowed, max_draft_len=3, use_rejection_sampling=True)) == []
    with_sa = _args(decoding_type="MTP", max_draft_len=3, use_rejection_sampling=True, sa_config={"threshold": 4})
    assert any("refused with sa_config" in m for m in _problems(with_sa))

