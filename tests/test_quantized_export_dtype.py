"""A quantized checkpoint of a float32 pipeline is half precision by design, not a stale convert.

ModelOpt 0.47.0's `export_tensorrt_llm_checkpoint` (NVIDIA/Model-Optimizer
modelopt/torch/export/model_config_export.py) writes quantized checkpoints in float16 or bfloat16 only
(`dtypes.EXPORT_DTYPES`), so convert exports a float32 pipeline's quantized draft in float16. Build's checkpoint
check and deploy's stale-engine check share one rule for it (`dtypes.quantized_export_dtype`); this checks the rule
on the dtype table and on the engine check (the build side is tests/test_build_validate.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from specbuild.contracts.engine_info import EngineInfo
from specbuild.contracts.engine_limits import stale_engine_problems
from specbuild.dtypes import DTYPES, EXPORT_DTYPES, quantized_export_dtype
from tests.deploy_fixtures import pipeline_data, write_spec


@pytest.mark.parametrize("requested", list(DTYPES))
@pytest.mark.parametrize("written", list(DTYPES))
def test_only_a_quantized_half_checkpoint_of_a_non_export_dtype_is_expected(requested: str, written: str) -> None:
    expected = requested not in EXPORT_DTYPES and written in EXPORT_DTYPES
    assert quantized_export_dtype(requested, written, quantized=True) == expected
    assert not quantized_export_dtype(requested, written, quantized=False)


def _draft_engine(dtype: str, quant_algo: str | None) -> EngineInfo:
    return EngineInfo(role="draft", backend="reference", architecture="LlamaForCausalLM", dtype=dtype,  # type: ignore[arg-type]
                      vocab_size=2048, tp_size=1, pp_size=1, max_batch_size=4, max_input_len=256, max_seq_len=320,
                      max_num_tokens=1024, speculative_decoding_mode="none", max_draft_len=0, quant_algo=quant_algo)


@pytest.mark.parametrize(("quant_algo", "stale"), [("FP8", False), (None, True)])
def test_deploy_names_a_float16_draft_engine_of_a_float32_spec_only_when_unquantized(
        tmp_path: Path, quant_algo: str | None, stale: bool) -> None:
    models = {name: tmp_path / name for name in ("target", "draft", "medusa-heads")}
    data = pipeline_data("q", models, "draft_target", tmp_path / "out")
    if quant_algo is not None:
        data["draft"]["quantization"] = {"format": "fp8"}
    spec = write_spec(tmp_path / "specs", data)
    assert spec.build.dtype == "float32"
    problems = stale_engine_problems(spec, "draft", _draft_engine("float16", quant_algo), None)
    assert any(problem.startswith("build.dtype:") for problem in problems) == stale
