"""Every config.pbtxt specbuild writes declares the TensorRT-LLM 1.2 Triton backend's tensors and parameters.

The expectations are generated from `specbuild.contracts.triton_backend`, the contract as data, whose rows were
taken from NVIDIA's templates (NVIDIA/TensorRT-LLM `triton_backend/all_models/inflight_batcher_llm/*/config.pbtxt`,
commits named in that module). TensorRT-LLM cannot run
here, so the tensorrt flavour (C++ `tensorrtllm` backend) is checked on rendered configs; the reference flavour
on rendered configs and on the demo repositories as `specbuild deploy` writes them.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from specbuild.contracts.engine_info import EngineInfo
from specbuild.contracts.triton_backend import (
    BLS,
    ENSEMBLE,
    ENSEMBLE_STEPS,
    MODELS,
    PERF_METRICS,
    PLACEHOLDER_TYPES,
    POSTPROCESSING,
    PREPROCESSING,
    TENSORRT_LLM,
    ModelContract,
)
from specbuild.deploy.check import check_repository, contract_of
from specbuild.deploy.layout import ModelPlan, plan_repository
from specbuild.deploy.pbtxt import parameter, parse_config, read_config
from specbuild.deploy.repository import render_config
from tests.deploy_fixtures import Deployed, pipeline_data, write_spec

MODES = ("draft_target", "medusa", "none")
SPEC_DECIDES = {
    "tensorrt_llm": {"gpt_model_path", "decoding_mode", "medusa_choices", "kv_cache_free_gpu_mem_fraction"},
    "preprocessing": {"tokenizer_dir"},
    "postprocessing": {"tokenizer_dir"},
    "tensorrt_llm_bls": {"tensorrt_llm_draft_model_name"},
}
"""Parameters whose value comes from the spec or the engines; every other one keeps NVIDIA's default."""


def test_the_table_has_every_tensor_of_nvidias_templates() -> None:
    """Counts of NVIDIA's declarations (the templates' config.pbtxt): a row dropped from the table fails here."""
    counts = {name: (len(m.nvidia_inputs()), len(m.nvidia_outputs())) for name, m in MODELS.items()}
    assert counts == {"tensorrt_llm": (62, 21), "preprocessing": (14, 20), "postprocessing": (2, 1),
                      "ensemble": (36, 19), "tensorrt_llm_bls": (43, 19)}
    for contract in MODELS.values():
        names = [t.name for t in contract.inputs] + [t.name for t in contract.outputs]
        assert len(set(names)) == len(names) - len({t.name for t in contract.inputs} & {t.name for t in
                                                                                         contract.outputs})
        assert all(t.optional for t in contract.inputs if t.extra is not None), "extras must be optional inputs"
    assert len(PERF_METRICS) == 10
    assert [t.name for t in BLS.outputs] == [t.name for t in ENSEMBLE.outputs]


def test_ensemble_steps_wire_what_nvidias_ensemble_wires() -> None:
    """ensemble/config.pbtxt L373-711: every step key is an input/output of the called model's contract, every
    value an ensemble input or an earlier step's output, and every ensemble output is produced."""
    available = {t.name for t in ENSEMBLE.inputs}
    produced = set()
    for step in ENSEMBLE_STEPS:
        called = MODELS[step.template]
        assert set(step.input_map) <= {t.name for t in called.inputs}, step.template
        assert set(step.input_map.values()) <= available, step.template
        assert set(step.output_map) <= {t.name for t in called.outputs}, step.template
        available |= set(step.output_map.values())
        produced |= set(step.output_map.values())
    assert {t.name for t in ENSEMBLE.outputs} <= produced
    llm = ENSEMBLE_STEPS[1].input_map
    assert (llm["runtime_top_k"], llm["runtime_top_p"], llm["len_penalty"], llm["streaming"]) == (
        "top_k", "top_p", "length_penalty", "stream")
    assert len([k for k, v in llm.items() if k == v]) == 22


def test_the_models_the_bls_calls_are_parameters_of_its_contract() -> None:
    """The BLS model and `deploy --check` check the same called-model parameters, and each is a parameter the
    BLS template (or specbuild's BLS) declares, defaulting to the model NVIDIA's repository has."""
    from specbuild.contracts.triton_backend import CALLED_MODEL_PARAMETERS

    defaults = {p.key: p.default for p in BLS.parameters}
    assert set(CALLED_MODEL_PARAMETERS) <= set(defaults)
    assert [defaults[key] for key in CALLED_MODEL_PARAMETERS] == [
        "preprocessing", "tensorrt_llm", "", "postprocessing"]


# -- rendered configs, both flavours --------------------------------------------------------------------------


def _engine(role: str, backend: str, mode: str) -> EngineInfo:
    medusa = role == "medusa"
    speculative = "medusa" if medusa else "draft_tokens_external" if role == "target" and mode == "draft_target" \
        else "none"
    return EngineInfo(role=role, backend=backend, architecture="LlamaForCausalLM", dtype="float16",  # type: ignore[arg-type]
                      vocab_size=2048, tp_size=1, pp_size=1, max_batch_size=4, max_input_len=256, max_seq_len=320,
                      max_num_tokens=1024, speculative_decoding_mode=speculative,  # type: ignore[arg-type]
                      max_draft_len=8 if medusa else 4 if speculative != "none" else 0,
                      medusa_choices=[[0], [1], [0, 0]] if medusa else None)


def _plans(tmp_path: Path, mode: str, backend: str) -> list[ModelPlan]:
    models = {name: tmp_path / name for name in ("target", "draft", "medusa-heads")}
    spec = write_spec(tmp_path / "specs", pipeline_data(f"c-{mode}", models, mode, tmp_path / "out"))
    roles = {"draft_target": ("target", "draft"), "medusa": ("medusa",), "none": ("target",)}[mode]
    engines = {role: _engine(role, backend, mode) for role in roles}
    engines.setdefault("target", engines.get("medusa"))  # type: ignore[arg-type]
    return plan_repository(spec, engines, end_id=2, pad_id=3).models


def _problems(contract: ModelContract, config: Any) -> list[str]:
    """Differences between a parsed config and the contract's NVIDIA rows: names, types, dims and flags."""
    from tritonclient.grpc import model_config_pb2

    problems = []
    for kind, expected, declared in (("input", contract.nvidia_inputs(), config.input),
                                     ("output", contract.nvidia_outputs(), config.output)):
        by_name = {t.name: t for t in declared}
        for want in expected:
            got = by_name.get(want.name)
            if got is None:
                problems.append(f"{kind} {want.name} missing")
                continue
            facts = (model_config_pb2.DataType.Name(got.data_type), tuple(got.dims))
            wanted = (PLACEHOLDER_TYPES.get(want.data_type, want.data_type), want.dims)
            if kind == "input":
                facts += (got.optional, got.HasField("reshape"), got.allow_ragged_batch)
                wanted += (want.optional, want.reshape, want.ragged)
            if facts != wanted:
                problems.append(f"{kind} {want.name}: {facts} != {wanted}")
    for key, default in ((p.key, p.default) for p in contract.parameters if p.extra is None):
        value = parameter(config, key)
        if value is None:
            problems.append(f"parameter {key} missing")
        elif key not in SPEC_DECIDES.get(contract.name, set()) and value != default:
            problems.append(f"parameter {key} = {value!r}, NVIDIA's default is {default!r}")
    return problems


@pytest.mark.parametrize("backend", ["reference", "tensorrt"])
@pytest.mark.parametrize("mode", MODES)
def test_every_rendered_config_follows_the_contract(tmp_path: Path, mode: str, backend: str) -> None:
    plans = _plans(tmp_path, mode, backend)
    assert {p.name for p in plans} >= {"preprocessing", "postprocessing", "tensorrt_llm", "tensorrt_llm_bls",
                                       "ensemble"}, "every repository has NVIDIA's five models, the BLS too"
    for plan in plans:
        config = parse_config(render_config(plan), where=plan.name)
        assert _problems(MODELS[plan.template], config) == [], plan.name
        llm = plan.template == "tensorrt_llm"
        if llm:
            assert config.backend == ("python" if backend == "reference" else "tensorrtllm")
            assert parameter(config, "exclude_input_in_output") == "false", "the backend's default, not the demo's"
            assert parameter(config, "decoding_mode") == ("medusa" if mode == "medusa" else "top_k_top_p")
        extras = {t.name for t in config.output} - {t.name for t in MODELS[plan.template].nvidia_outputs()}
        assert not extras or backend == "reference", (plan.name, extras)  # engines get NVIDIA's configs only


def test_tensorrt_flavour_names_the_tensorrtllm_backend_and_its_required_keys(tmp_path: Path) -> None:
    """model_state.cc reads tokenizer_dir, guided_decoding_backend and xgrammar_tokenizer_info_path outside its
    try/catch: a config without the keys fails to load ("Cannot find parameter with name")."""
    target = next(p for p in _plans(tmp_path, "draft_target", "tensorrt") if p.name == "tensorrt_llm")
    config = parse_config(render_config(target), where="tensorrt_llm")
    for key in ("tokenizer_dir", "guided_decoding_backend", "xgrammar_tokenizer_info_path"):
        assert parameter(config, key) == ""
    assert parameter(config, "FORCE_CPU_ONLY_INPUT_TENSORS") == "no"
    assert parameter(config, "gpt_model_type") == "inflight_fused_batching"
    assert parameter(config, "kv_cache_free_gpu_mem_fraction") == "0.45", "target and draft share the GPU"
    assert {t.name for t in config.output} == {t.name for t in TENSORRT_LLM.nvidia_outputs()}


def test_an_unknown_parameter_override_is_a_bug_not_a_config(tmp_path: Path) -> None:
    plan = next(p for p in _plans(tmp_path, "none", "reference") if p.name == "preprocessing")
    plan.parameters["tokeniser_dir"] = "x"
    with pytest.raises(AssertionError, match="tokeniser_dir"):
        plan.all_parameters()


# -- the demo repositories as deploy writes them ----------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_demo_repositories_follow_the_contract(deployed: Deployed, mode: str) -> None:
    repository = deployed.repository(mode)
    report = check_repository(repository)
    assert report.problems == []
    for facts in report.models.values():
        contract = contract_of(facts)
        assert contract is not None, facts.name
        assert _problems(contract, read_config(facts.directory / "config.pbtxt")) == [], facts.name
    for name in (PREPROCESSING.name, POSTPROCESSING.name):
        assert parameter(report.models[name].config, "tokenizer_dir") == "tokenizer"


def test_check_names_a_tensor_declared_otherwise(deployed: Deployed, tmp_path: Path) -> None:
    """`deploy --check` holds a repository to the contract too: a hand-edited config is named with the fix."""
    broken = tmp_path / "repo"
    shutil.copytree(deployed.repository("none"), broken)
    config = broken / "tensorrt_llm" / "config.pbtxt"
    text = config.read_text()
    text = text.replace('{ name: "return_perf_metrics" data_type: TYPE_BOOL', '{ name: "return_perf_metricz" '
                        'data_type: TYPE_BOOL')
    text = text.replace('name: "sequence_length" data_type: TYPE_INT32 dims: [ -1 ]',
                        'name: "sequence_length" data_type: TYPE_INT64 dims: [ -1 ]')
    config.write_text(text)
    problems = "\n".join(check_repository(broken).problems)
    assert "input 'return_perf_metrics' of the TensorRT-LLM backend's tensorrt_llm model is not declared" in problems
    assert "output 'sequence_length' is TYPE_INT64 [-1], the backend's is TYPE_INT32 [-1]" in problems
