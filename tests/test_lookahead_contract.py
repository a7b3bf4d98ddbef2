"""Lookahead decoding's build -> deploy contract: the spec's (W, N, G), trtllm-build's flags, engine.json, the
tensorrt_llm model's parameters and the per-request limits.

No TensorRT-LLM runs here (no GPU, nothing installed), so the generated plans and configs are checked against
TensorRT-LLM 1.2's own definitions, named per test: the draft-token formula of
NVIDIA/TensorRT-LLM `cpp/tensorrt_llm/executor/decodingConfig.cpp` @97e36d0b
(`LookaheadDecodingConfig::calculateSpeculativeResourceTuple`) and `examples/lookahead/README.md` @7ed07f06
(`max_draft_len(W, N, G)`, 83 for (7, 7, 7)); trtllm-build's flags from tests/trtllm_1_2_flags.py; the template's
parameters from specbuild.contracts.triton_backend (NVIDIA's tensorrt_llm/config.pbtxt @2a9abd95).
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from rich.console import Console

from specbuild.build.plan import plan_pipeline
from specbuild.contracts import lookahead as la
from specbuild.contracts.engine_info import EngineInfo, engine_dir, read_engine_info
from specbuild.contracts.engine_limits import stale_engine_problems
from specbuild.contracts.llm_api import flow_problems
from specbuild.contracts.triton_backend import TENSORRT_LLM
from specbuild.deploy.layout import plan_repository
from specbuild.errors import SpecbuildError
from specbuild.export.plan import ExportRefused
from specbuild.python_models.llm_backend import (
    AdmissionError,
    BackendConfig,
    EnqueueError,
    ModelLoadError,
    _row,
    admit,
)
from specbuild.spec import parse_spec
from specbuild.spec.problems import SpecValidationError
from tests.tiny_models import make_checkpoint
from tests.trtllm_1_2_flags import FLAGS


def readme_max_draft_len(w: int, n: int, g: int) -> int:
    """examples/lookahead/README.md @7ed07f06, written out independently of specbuild's copy."""
    return (0 if n == 1 else n - 2) + (w - 1 + g) * (n - 1)


def spec(tmp_path: Path, lookahead: dict[str, Any] | None = None, **speculative: Any) -> Any:
    data: dict[str, Any] = {
        "name": "la", "target": {"model": str(tmp_path)},
        "build": {"max_batch_size": 2, "max_input_len": 16, "max_output_len": 16},
        "speculative": {"mode": "lookahead", **speculative},
    }
    if lookahead is not None:
        data["speculative"]["lookahead"] = lookahead
    return parse_spec(data, tmp_path / "spec.yaml")


@pytest.mark.parametrize(("w", "n", "g", "expected"), [
    (7, 7, 7, 83),  # the README's example build: --max_draft_len=83 with --lookahead_config=[7,7,7]
    (2, 2, 1, 2),  # the smallest meaningful configuration
    (4, 3, 4, 15),  # TensorRT-LLM's defaults (executor.h kDefaultLookaheadDecoding*)
    (1, 1, 0, 0),  # plain decoding: no draft tokens
    (5, 4, 3, 23),
    (8, 2, 8, 15),
])
def test_max_draft_len_is_tensorrt_llms_formula(w: int, n: int, g: int, expected: int) -> None:
    """decodingConfig.cpp calculateSpeculativeResourceTuple @97e36d0b: (N-2 if N > 1 else 0) + (W-1+G)(N-1) draft
    tokens, one more decoding token (the golden token), paths of N (draft paths N-1)."""
    assert la.max_draft_len(w, n, g) == readme_max_draft_len(w, n, g) == expected
    assert la.speculative_resource(w, n, g) == (expected + 1, n, expected, n - 1)


def test_spec_defaults_and_full_draft_len(tmp_path: Path) -> None:
    """Left out, speculative.lookahead is TensorRT-LLM's default (4, 3, 4); the draft length is the formula's."""
    loaded = spec(tmp_path)
    assert loaded.speculative.lookahead_config().config == (4, 3, 4)
    assert loaded.full_draft_len == 15


@pytest.mark.parametrize(("sizes", "field"), [
    ({"window_size": 1}, "window_size"),
    ({"ngram_size": 1}, "ngram_size"),
    ({"verification_set_size": 0}, "verification_set_size"),
    ({"window_size": 0, "ngram_size": 1, "verification_set_size": 0}, "window_size"),
])
def test_below_the_smallest_meaningful_configuration_is_refused(tmp_path: Path, sizes: dict[str, int],
                                                                 field: str) -> None:
    """examples/lookahead/README.md: (2, 2, 1) is the meaningful minimum; the refusal names the field and rule."""
    with pytest.raises(SpecValidationError) as caught:
        spec(tmp_path, {"window_size": 3, "ngram_size": 3, "verification_set_size": 2, **sizes})
    text = str(caught.value)
    assert f"speculative.lookahead.{field}" in text
    assert "(2, 2, 1) is the smallest meaningful" in text


@pytest.mark.parametrize(("speculative", "field", "words"), [
    ({"max_draft_len": 7}, "max_draft_len", "needs exactly 15"),
    ({"draft_len_schedule": {1: 15, 8: 7}}, "draft_len_schedule", "on (15, the draft length (W, N, G) gives) or off"),
    ({"draft_len_schedule": {1: 7, 8: 0}}, "draft_len_schedule", "must draft the full length 15"),
    ({"num_draft_tokens": 3}, "num_draft_tokens", "only used in"),
])
def test_settings_lookahead_cannot_hold_are_refused(tmp_path: Path, speculative: dict[str, Any], field: str,
                                                     words: str) -> None:
    with pytest.raises(SpecValidationError) as caught:
        spec(tmp_path, **speculative)
    assert f"speculative.{field}" in str(caught.value) and words in str(caught.value)


def test_lookahead_section_needs_lookahead_mode(tmp_path: Path) -> None:
    with pytest.raises(SpecValidationError, match=r"speculative\.lookahead: given, but mode is 'ngram'"):
        parse_spec({"name": "x", "target": {"model": str(tmp_path)},
                    "build": {"max_batch_size": 1, "max_input_len": 8, "max_output_len": 8},
                    "speculative": {"mode": "ngram", "lookahead": {}}}, tmp_path / "spec.yaml")


def test_pytorch_flow_refuses_with_supports_backend(tmp_path: Path) -> None:
    """llm_args.py (1.2) LookaheadDecodingConfig.supports_backend is False for 'pytorch'."""
    loaded = parse_spec({"name": "x", "target": {"model": str(tmp_path)},
                         "build": {"flow": "pytorch", "trtllm": "1.2", "max_batch_size": 1, "max_input_len": 8,
                                   "max_output_len": 8},
                         "speculative": {"mode": "lookahead"}}, tmp_path / "spec.yaml")
    [(loc, message)] = flow_problems(loaded)
    assert loc == ("speculative", "mode") and "supports_backend is False for 'pytorch'" in message


def test_plan_renders_lookahead_flags(tmp_path: Path) -> None:
    """trtllm-build gets --speculative_decoding_mode lookahead_decoding (a 1.2 choice) and the formula's
    --max_draft_len; engine.json records [W, N, G] next to it."""
    loaded = spec(tmp_path, {"window_size": 7, "ngram_size": 7, "verification_set_size": 7})
    [plan] = plan_pipeline(loaded, {"target": None})
    args = plan.args()
    mode = args[args.index("--speculative_decoding_mode") + 1]
    assert mode == "lookahead_decoding" and mode in FLAGS["--speculative_decoding_mode"]  # type: ignore[operator]
    assert args[args.index("--max_draft_len") + 1] == "83"
    assert plan.lookahead_config == [7, 7, 7] and plan.to_json()["lookahead_config"] == [7, 7, 7]
    assert plan.max_num_tokens >= plan.max_batch_size * (83 + 1)  # one verification step fits
    facts = SimpleNamespace(architecture="LlamaForCausalLM", dtype="float16", vocab_size=32, tp_size=1, pp_size=1,
                            quant_algo=None, kv_cache_quant_algo=None, sliding_window=None,
                            local_window=None)
    info = plan.engine_info(facts, "tensorrt")  # type: ignore[arg-type]
    data = info.to_json()
    assert data["speculative_decoding_mode"] == "lookahead_decoding" and data["max_draft_len"] == 83
    assert data["lookahead_config"] == [7, 7, 7]
    assert EngineInfo.from_json(data, tmp_path / "engine.json") == info


def test_plans_of_other_modes_keep_their_records(tmp_path: Path) -> None:
    """Only lookahead plans carry lookahead_config, so existing manifests and build.sh do not change."""
    loaded = parse_spec({"name": "x", "target": {"model": str(tmp_path)},
                         "build": {"max_batch_size": 1, "max_input_len": 8, "max_output_len": 8}}, tmp_path / "s.yaml")
    [plan] = plan_pipeline(loaded, {"target": None})
    assert "lookahead_config" not in plan.to_json() and "lookahead" not in " ".join(plan.args())


def _engine(loaded: Any, **changes: Any) -> EngineInfo:
    [plan] = plan_pipeline(loaded, {"target": None})
    facts = SimpleNamespace(architecture="LlamaForCausalLM", dtype="float16", vocab_size=32, tp_size=1, pp_size=1,
                            quant_algo=None, kv_cache_quant_algo=None, sliding_window=None,
                            local_window=None)
    info = plan.engine_info(facts, "tensorrt")  # type: ignore[arg-type]
    return EngineInfo(**{**info.to_json(), **changes})


def test_deploy_sees_a_changed_window_as_a_stale_engine(tmp_path: Path) -> None:
    """(4, 3, 4) and (2, 5, 2) both make 15 draft tokens: only the recorded [W, N, G] tells the engine apart."""
    built = _engine(spec(tmp_path))
    assert stale_engine_problems(spec(tmp_path), "target", built) == []
    changed = spec(tmp_path, {"window_size": 2, "ngram_size": 5, "verification_set_size": 2})
    assert changed.full_draft_len == 15
    [problem] = stale_engine_problems(changed, "target", built)
    assert problem.startswith("speculative.lookahead [W, N, G]: the engine was built with [4, 3, 4]")


def test_deployed_config_has_the_backends_lookahead_parameters(tmp_path: Path) -> None:
    """The tensorrt_llm model: decoding_mode lookahead and the three parameters, each a parameter of NVIDIA's
    template (the contract, not a specbuild extra), with the spec's (W, N, G)."""
    loaded = spec(tmp_path, {"window_size": 5, "ngram_size": 4, "verification_set_size": 3})
    plan = plan_repository(loaded, {"target": _engine(loaded)}, end_id=2, pad_id=0)
    [llm] = [model for model in plan.models if model.template == "tensorrt_llm"]
    nvidia = {p.key: p for p in TENSORRT_LLM.parameters if p.extra is None}
    assert llm.parameters["decoding_mode"] == "lookahead" and "lookahead" in nvidia["decoding_mode"].meaning
    assert {name: llm.parameters[name] for name in la.PARAMETERS} == {
        "lookahead_window_size": 5, "lookahead_ngram_size": 4, "lookahead_verification_set_size": 3}
    assert all(name in nvidia for name in la.PARAMETERS)
    inputs = {t.name: t for t in TENSORRT_LLM.inputs}
    assert all(inputs[name].data_type == "TYPE_INT32" and inputs[name].optional for name in la.PARAMETERS)


def test_a_lookahead_schedule_reaches_the_reference_model_only(tmp_path: Path) -> None:
    """draft_len_schedule turns the reference engine's windows on or off by load; NVIDIA's C++ backend has no such
    parameter for Lookahead, so a repository for it gets none (the README's load-aware table says so)."""
    loaded = spec(tmp_path, draft_len_schedule={1: 15, 8: 0})
    assert loaded.speculative.draft_len_schedule == {1: 15, 8: 0}
    cpp = plan_repository(loaded, {"target": _engine(loaded)}, end_id=2, pad_id=0)
    [llm] = [model for model in cpp.models if model.template == "tensorrt_llm"]
    assert "draft_len_schedule" not in llm.parameters
    reference = plan_repository(loaded, {"target": _engine(loaded, backend="reference")}, end_id=2, pad_id=0)
    [llm] = [model for model in reference.models if model.template == "tensorrt_llm"]
    assert json.loads(str(llm.parameters["draft_len_schedule"])) == {"1": 15, "8": 0}
    limited = spec(tmp_path, max_concurrency=4)  # TensorRT-LLM's simpler cutoff: off above 4 sequences
    reference = plan_repository(limited, {"target": _engine(limited, backend="reference")}, end_id=2, pad_id=0)
    [llm] = [model for model in reference.models if model.template == "tensorrt_llm"]
    assert llm.parameters["max_concurrency"] == 4


def test_deploy_refuses_an_engine_whose_draft_len_is_not_the_executors(tmp_path: Path) -> None:
    loaded = spec(tmp_path)
    with pytest.raises(SpecbuildError, match="needs max_draft_len 15"):
        plan_repository(loaded, {"target": _engine(loaded, max_draft_len=14)}, end_id=2, pad_id=0)


def test_reference_backend_builds_lookahead(tmp_path: Path) -> None:
    """The reference runtime decodes Lookahead (runtime/lookahead.py), so `build` on the reference backend writes
    an engine deploy takes: engine.json with the formula's max_draft_len and the spec's [W, N, G]."""
    from specbuild.build import build_pipeline
    from specbuild.convert.pipeline import ConvertRequest, convert_checkpoint

    make_checkpoint(tmp_path / "hf", "llama")  # no tokenizer: converted directly, not by `convert`, which needs one
    data = {"name": "la", "output_dir": str(tmp_path / "out"), "target": {"model": str(tmp_path / "hf")},
            "build": {"backend": "reference", "max_batch_size": 2, "max_input_len": 16, "max_output_len": 16},
            "speculative": {"mode": "lookahead",
                            "lookahead": {"window_size": 3, "ngram_size": 3, "verification_set_size": 2}}}
    loaded = parse_spec(data, tmp_path / "spec.yaml")
    convert_checkpoint(ConvertRequest("target", tmp_path / "hf", loaded.checkpoint_dir("target")))
    build_pipeline(loaded, console=Console(file=io.StringIO()))
    info = read_engine_info(engine_dir(loaded, "target"))
    assert (info.backend, info.speculative_decoding_mode) == ("reference", la.BUILD_MODE)
    assert info.max_draft_len == la.max_draft_len(3, 3, 2) == 9 and info.lookahead_config == [3, 3, 2]
    assert stale_engine_problems(loaded, "target", info) == []
    plan = plan_repository(loaded, {"target": info}, end_id=2, pad_id=0)
    [llm] = [model for model in plan.models if model.template == "tensorrt_llm"]
    assert llm.parameters["decoding_mode"] == la.DECODING_MODE


def test_tune_takes_lookahead(tmp_path: Path) -> None:
    """tune searches (W, N, G) now (tests/test_tune_lookahead.py): a lookahead spec passes its up-front refusals."""
    from specbuild.tune.stage import refuse_unmeasurable

    refuse_unmeasurable(spec(tmp_path), tmp_path / "spec.yaml")


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_export_refuses_lookahead(tmp_path: Path, engine: str) -> None:
    """Neither vLLM (SpeculativeConfig.method) nor SGLang (--speculative-algorithm) has Lookahead decoding."""
    module = __import__(f"specbuild.export.{engine}", fromlist=["build_plan"])
    with pytest.raises(ExportRefused, match="no Lookahead decoding"):
        module.build_plan(spec(tmp_path), tmp_path / "out")


# -- the reference backend's per-request rules ------------------------------------------------------------------

SERVER = {"decoding_mode": "lookahead", "lookahead_window_size": "4", "lookahead_ngram_size": "3",
          "lookahead_verification_set_size": "4"}
ENGINE = SimpleNamespace(max_input_len=64, max_seq_len=128, max_draft_len=15, vocab_size=32,
                         gather_context_logits=False, gather_generation_logits=False)


def lookahead_row(w: int, n: int, g: int) -> dict[str, np.ndarray]:
    one = {"input_ids": np.array([1, 2, 3], dtype=np.int32), "request_output_len": np.array([4], dtype=np.int32)}
    for name, value in zip(la.PARAMETERS, (w, n, g), strict=True):
        one[name] = np.array([value], dtype=np.int32)
    return one


def server_config() -> BackendConfig:
    config, _ = BackendConfig.from_model(SERVER, {"name": "tensorrt_llm"}, ENGINE)
    return config


def test_backend_reads_the_instances_lookahead_config() -> None:
    assert server_config().lookahead_config == (4, 3, 4)
    with pytest.raises(ModelLoadError, match="ngramSize=1 requires verificationSetSize=0"):
        BackendConfig.from_model({**SERVER, "lookahead_ngram_size": "1"}, {}, ENGINE)


@pytest.mark.parametrize("sizes", [(4, 3, 4), (2, 2, 1), (1, 1, 0), (3, 3, 2)])
def test_requests_within_the_servers_config_are_admitted(sizes: tuple[int, int, int]) -> None:
    config = server_config()
    row = _row(0, lookahead_row(*sizes), False, config, None)
    assert row.lookahead == sizes
    admitted, _ = admit(row, config)
    assert admitted.lookahead == sizes


@pytest.mark.parametrize(("sizes", "text"), [
    ((5, 3, 4), "runtime w(5) n(3) g(4) exceeds maxTokensPerStep(16)"),
    ((6, 2, 4), "lookahead requires setup w (6) <= max_w (4)"),  # 10 draft tokens fit, but w > W
    ((1, 4, 1), "lookahead requires setup n (4) <= max_n (3)"),
    ((2, 2, 5), "lookahead requires setup g (5) <= max_g (4)"),
])
def test_requests_beyond_the_servers_config_are_refused(sizes: tuple[int, int, int], text: str) -> None:
    """lookaheadDecodingLayer.cpp @7ed07f06 (tokens per step) then lookaheadAlgorithm.cpp @2a9abd95 (each of
    w, n, g against the server's), TLLM_CHECK texts."""
    config = server_config()
    with pytest.raises(AdmissionError) as caught:
        admit(_row(0, lookahead_row(*sizes), False, config, None), config)
    assert caught.value.message == la.ASSERT + text


def test_illegal_request_config_is_refused_at_enqueue() -> None:
    """utils.cc getLookaheadDecodingFromTensors constructs the request's LookaheadDecodingConfig first."""
    with pytest.raises(EnqueueError) as caught:
        _row(0, lookahead_row(2, 1, 0), False, server_config(), None)
    assert caught.value.message == la.ASSERT + "ngramSize=1 requires windowSize=1"
