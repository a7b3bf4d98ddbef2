"""The PyTorch flow (`build.flow: pytorch`): LLM-API settings, the llmapi repository, trtllm-serve, and refusals.

TensorRT-LLM cannot run here (no GPU, no wheel), so what deploy writes is checked field by field against
tests/llm_api_1_2_schema.py, the schema of TensorRT-LLM 1.2's llm_args.py, trtllm-serve and the llmapi model
written down from those upstream files (sources named there); the refusals are the ones llm_args.py's
`supports_backend` makes, with its reason.
"""

from __future__ import annotations

import copy
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from specbuild.contracts import llm_api
from specbuild.errors import SpecbuildError
from specbuild.spec import load_spec, parse_spec
from tests import llm_api_1_2_schema as upstream
from tests.command_line import parse_flags

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted(path for path in (ROOT / "configs").glob("*.yaml")
                 if "flow" not in (yaml.safe_load(path.read_text()).get("build") or {}))
"""The specs that do not name build.flow (those that existed before it): they must mean what they meant."""


def _spec(tmp_path: Path, models: dict[str, Path] | None = None, **changes: Any) -> Any:
    """A PyTorch-flow draft-target spec for TensorRT-LLM 1.2 (what tests/llm_api_1_2_schema.py holds) on `models`
    (the demo pair, or paths that need not exist); tests/test_trtllm_lines.py covers the later lines."""
    target = models["target"] if models else tmp_path / "target"
    draft = models["draft"] if models else tmp_path / "draft"
    data: dict[str, Any] = {
        "name": "pt", "output_dir": str(tmp_path / "out"),
        "target": {"model": str(target)}, "draft": {"model": str(draft)},
        "speculative": {"mode": "draft_target", "num_draft_tokens": 3, "draft_len_schedule": {1: 3, 4: 0}},
        "build": {"flow": "pytorch", "trtllm": "1.2", "max_batch_size": 8, "max_input_len": 128,
                  "max_output_len": 32},
        "deploy": {"decoupled": True},
    }
    for section, values in changes.items():
        if values is None:
            data.pop(section, None)
        else:
            data[section] = {**data.get(section, {}), **values}
    return parse_spec(data, tmp_path / "pt.yaml")


def _check_type(where: str, value: Any, expected: Any) -> None:
    assert isinstance(value, expected) and not (expected is int and isinstance(value, bool)), (where, value)


def _check_speculative_config(config: dict[str, Any]) -> None:
    """Every key a field of the named 1.2 decoding config, of its type; the config runs on the PyTorch backend."""
    decoding_type = config["decoding_type"]
    fields = {**upstream.DECODING_BASE, **upstream.DECODING_CONFIGS[decoding_type]}
    for key, value in config.items():
        if key != "decoding_type":
            assert key in fields, f"{key} is not a field of the {decoding_type} config"
            _check_type(key, value, fields[key])
    assert upstream.SUPPORTS_PYTORCH[decoding_type]
    assert config["max_draft_len"] > 0
    if decoding_type in upstream.REQUIRES_DRAFT_MODEL:
        assert config.get("speculative_model")
    schedule = config.get("draft_len_schedule")
    if schedule is not None:  # DecodingBaseConfig.validate_draft_len_schedule_and_sort
        assert schedule[1] == config["max_draft_len"] and all(v <= config["max_draft_len"] for v in schedule.values())


def _check_llm_args(args: dict[str, Any]) -> None:
    for key, value in args.items():
        assert key in upstream.LLM_ARGS, f"{key} is not an LlmArgs field"
        _check_type(key, value, upstream.LLM_ARGS[key])
    assert args["backend"] == "pytorch"
    if "speculative_config" in args:
        _check_speculative_config(args["speculative_config"])


@pytest.mark.parametrize("mode", ["draft_target", "ngram", "eagle3"])
def test_llm_args_are_llm_args_py_fields(tmp_path: Path, mode: str) -> None:
    """Each PyTorch-flow mode's settings name only 1.2 LlmArgs / decoding-config fields, with their types."""
    speculative: dict[str, Any] = {"mode": mode, "num_draft_tokens": 3, "draft_len_schedule": {1: 3, 4: 0}}
    draft: dict[str, Any] | None = {}
    if mode == "ngram":
        speculative["ngram"] = {"max_matching_ngram_size": 3, "is_public_pool": False}
        draft = None
    if mode == "eagle3":
        speculative["eagle3"] = {"eagle3_one_model": False, "eagle3_layers_to_capture": [1, 5, -1]}
    spec = _spec(tmp_path, speculative=speculative, draft=draft)
    args = llm_api.llm_args(spec)
    _check_llm_args(args)
    assert args["speculative_config"]["decoding_type"] == {"draft_target": "DraftTarget", "ngram": "NGram",
                                                           "eagle3": "Eagle"}[mode]
    assert args["speculative_config"]["max_draft_len"] == 3
    assert args["max_seq_len"] == 160 and args["max_batch_size"] == 8
    if mode == "ngram":
        assert args["speculative_config"]["max_matching_ngram_size"] == 3
        assert args["speculative_config"]["is_public_pool"] is False
    if mode == "eagle3":
        assert args["speculative_config"]["eagle3_one_model"] is False
        assert args["speculative_config"]["speculative_model"] == str(tmp_path / "draft")
    assert llm_api.pytorch_flow_problems(spec) == []


def test_settings_check_is_the_table(tmp_path: Path) -> None:
    """A key outside llm_args.py's tables, or a config the PyTorch backend refuses, is reported with the source."""
    args = llm_api.llm_args(_spec(tmp_path))
    bad = copy.deepcopy(args)
    bad["max_tokens_in_paged_kv_cache"] = 1
    bad["speculative_config"]["num_eagle_layers"] = 2
    messages = [message for _, message in llm_api.settings_problems(bad, llm_api.LINE_1_2)]
    assert any("'max_tokens_in_paged_kv_cache' is not an LlmArgs field" in m for m in messages)
    assert any("'num_eagle_layers' is not a field of TensorRT-LLM 1.2's DraftTargetDecodingConfig" in m
               for m in messages)
    for decoding_type, supported in upstream.SUPPORTS_PYTORCH.items():
        assert llm_api.LINE_1_2.decoding_types[decoding_type].supports("pytorch") is supported
        assert set(upstream.DECODING_CONFIGS[decoding_type]) == llm_api.LINE_1_2.decoding_types[decoding_type].fields
    lookahead = {**args, "speculative_config": {"decoding_type": "Lookahead", "max_draft_len": 3}}
    messages = [message for _, message in llm_api.settings_problems(lookahead, llm_api.LINE_1_2)]
    assert any("Speculation type Lookahead does not support backend pytorch" in m for m in messages)


def test_medusa_refused_on_pytorch(tmp_path: Path) -> None:
    """Medusa is engine-only in 1.2 (MedusaDecodingConfig.supports_backend): refused with that reason and the fix."""
    data = {"name": "m", "target": {"model": str(tmp_path)}, "medusa": {"heads": str(tmp_path / "heads")},
            "speculative": {"mode": "medusa"},
            "build": {"flow": "pytorch", "trtllm": "1.2", "max_batch_size": 1, "max_input_len": 8,
                      "max_output_len": 8}}
    spec = parse_spec(data, tmp_path / "m.yaml")
    [(loc, message)] = llm_api.pytorch_flow_problems(spec)
    assert loc == ("speculative", "mode")
    assert "MedusaDecodingConfig.supports_backend is False for 'pytorch'" in message
    assert "set build.flow: engine" in message
    with pytest.raises(SpecbuildError, match="Medusa runs only on the engine flow"):
        llm_api.refuse_pytorch_flow_problems(spec, "build")


@pytest.mark.parametrize("mode", ["eagle3", "ngram"])
def test_pytorch_only_modes_refused_on_the_engine_flow(tmp_path: Path, mode: str) -> None:
    """eagle3 and ngram have no engine: build, deploy and convert refuse them with the reason, before any work."""
    from specbuild.build.stage import build_pipeline
    from specbuild.deploy.repository import deploy_repository

    spec = _spec(tmp_path, build={"flow": "engine"}, speculative={"mode": mode, "draft_len_schedule": None},
                 draft={} if mode == "eagle3" else None)
    [(loc, message)] = llm_api.flow_problems(spec)
    assert loc == ("speculative", "mode") and "runs only on the PyTorch backend" in message
    assert message.endswith("set build.flow: pytorch")
    for run in (lambda: build_pipeline(spec), lambda: deploy_repository(spec)):
        with pytest.raises(SpecbuildError, match=f"{mode} runs only on the PyTorch backend"):
            run()


def test_library_entry_points_choose_the_flow(tmp_path: Path) -> None:
    """build_pipeline and deploy_repository, called directly as the CLI and bench do, take a PyTorch-flow spec down
    the LLM-API path (settings recorded, llmapi repository written) instead of looking for converted checkpoints;
    an engine backend asked of that flow is refused, not ignored."""
    from specbuild.build.llm_api import LlmApiResult
    from specbuild.build.stage import build_pipeline
    from specbuild.deploy.llmapi import LlmApiDeployResult
    from specbuild.deploy.repository import deploy_repository

    for role in ("target", "draft"):  # the LLM API reads config.json first; nothing else is opened here
        (tmp_path / role).mkdir()
        (tmp_path / role / "config.json").write_text("{}")
    spec = _spec(tmp_path)
    [built] = build_pipeline(spec)
    assert isinstance(built, LlmApiResult) and built.status == "written"
    assert (tmp_path / "out" / "llm_api" / "llm_api.json").is_file()
    assert not (tmp_path / "out" / "engines").exists()
    deployed = deploy_repository(spec)
    assert isinstance(deployed, LlmApiDeployResult) and deployed.status == "written"
    assert (deployed.repository / "tensorrt_llm" / "1" / "model.yaml").is_file()
    assert deploy_repository(spec).status == "up to date"
    with pytest.raises(SpecbuildError, match=r"--backend reference: build\.flow is pytorch, which builds no engine"):
        build_pipeline(spec, backend="reference")


def _deployed(tmp_path: Path) -> Path:
    """A PyTorch-flow repository as build + deploy write it, on checkpoints that are a config.json each."""
    from specbuild.build.llm_api import build_llm_api
    from specbuild.deploy.llmapi import deploy_llm_api

    for role in ("target", "draft"):
        (tmp_path / role).mkdir()
        (tmp_path / role / "config.json").write_text("{}")
    spec = _spec(tmp_path)
    build_llm_api(spec)
    return deploy_llm_api(spec).repository


def test_deploy_check_knows_the_llmapi_layout(tmp_path: Path) -> None:
    """`deploy --check` on a PyTorch-flow repository: before NVIDIA's model.py and helpers.py are copied in, one
    refusal naming them and where they come from (not the ensemble's problems); once copied, it is checked against
    the llmapi contract and passes; a model.yaml setting outside llm_args.py's fields is then a problem."""
    from typer.testing import CliRunner

    from specbuild.cli import app

    repository = _deployed(tmp_path)
    result = CliRunner().invoke(app, ["deploy", "--check", str(repository)])
    output = " ".join(result.output.split())
    assert result.exit_code == 1, output
    assert "tensorrt_llm/1/model.py, tensorrt_llm/1/helpers.py missing" in output
    assert "triton_backend/all_models/llmapi/tensorrt_llm/1/" in output
    assert "ensemble" not in output and "problem(s)" not in output and "Traceback" not in output
    for name in llm_api.LLMAPI_CODE:  # stand-ins for NVIDIA's files: the check reads no python
        (repository / llm_api.LLMAPI_MODEL / name).write_text("# NVIDIA's\n")
    result = CliRunner().invoke(app, ["deploy", "--check", str(repository)])
    assert result.exit_code == 0, result.output
    assert f"ok: {repository} (1 models)" in " ".join(result.output.split())
    model_yaml = repository / llm_api.LLMAPI_MODEL_YAML
    model_yaml.write_text(model_yaml.read_text() + "max_tokens_in_paged_kv_cache: 1\n")
    result = CliRunner().invoke(app, ["deploy", "--check", str(repository)])
    assert result.exit_code == 1
    assert "'max_tokens_in_paged_kv_cache' is not an LlmArgs field" in " ".join(result.output.split())


def test_engine_flow_settings_refused_on_pytorch(tmp_path: Path) -> None:
    """Engine-flow settings the PyTorch flow would silently ignore, and a draft format the PyTorch backend has no
    linear method for (SmoothQuant), are errors at their fields."""
    spec = _spec(tmp_path, build={"backend": "reference", "gather_context_logits": False},
                 speculative={"max_draft_len": 5}, draft={"quantization": {"format": "int8_sq"}})
    located = {loc: message for loc, message in llm_api.pytorch_flow_problems(spec)}
    assert set(located) == {("speculative", "max_draft_len"), ("draft", "quantization", "format")}  # backend: who
    assert "unsupported quant mode" in located[("draft", "quantization", "format")]  # serves it, no problem


def test_existing_specs_unchanged() -> None:
    """Every shipped spec stays on the engine flow with nothing new to say: the new fields take their defaults."""
    for path in CONFIGS:
        spec = load_spec(path)
        assert spec.build.flow == "engine" and spec.build.line == "1.2", path  # engines: the 1.2 line
        assert spec.speculative.ngram is None and spec.speculative.eagle3 is None
        assert llm_api.flow_problems(spec) == [] and llm_api.pytorch_flow_problems(spec) == []


def test_demo_pytorch_config_has_no_problem() -> None:
    """configs/demo-pytorch.yaml: the demo pair on the PyTorch flow, valid as shipped, on the line it names."""
    spec = load_spec(ROOT / "configs" / "demo-pytorch.yaml")
    assert spec.build.flow == "pytorch" and llm_api.pytorch_flow_problems(spec) == []
    assert spec.build.trtllm == llm_api.NEWEST_LINE.name  # pinned in the file, the newest line read
    args = llm_api.llm_args(spec)
    assert list(llm_api.settings_problems(args, llm_api.line_of(spec))) == []
    assert args["speculative_config"]["decoding_type"] == "Draft_Target"




def _conforms(kind: type | None, value: str | bool) -> bool:
    """A value as trtllm-serve's click option of that type takes it (None: a flag that takes no value)."""
    if kind is None:
        return value is True
    if not isinstance(value, str) or not value:
        return False
    if kind is int:
        return value.isdigit()
    if kind is float:
        try:
            float(value)
        except ValueError:
            return False
        return True
    return kind is str


def _serve_script_flags(script: str, model: str) -> dict[str, str | bool]:
    """The trtllm-serve.sh `exec` line's options, each a 1.2 trtllm-serve option with a value of its type."""
    [line] = [line for line in script.splitlines() if line.startswith("exec ")]
    words = shlex.split(line)[1:]
    assert words[:2] == ["trtllm-serve", model] and words[-1] == "$@", words
    flags = parse_flags(words[2:-1])
    for flag, value in flags.items():
        assert flag in upstream.SERVE_OPTIONS, flag
        assert _conforms(upstream.SERVE_OPTIONS[flag], value), (flag, value, upstream.SERVE_OPTIONS[flag])
    assert flags["--backend"] in upstream.SERVE_BACKENDS and flags["--backend"] == "pytorch"
    options = flags["--extra_llm_api_options"]
    assert isinstance(options, str) and options.endswith("/trtllm-serve.yaml")
    return flags


def test_serve_script_flags_with_a_value_less_flag(tmp_path: Path) -> None:
    """trust_remote_code is trtllm-serve's value-less --trust_remote_code: the options after it still pair with
    their values, and every value has its option's type (1.2 serve.py, tests/llm_api_1_2_schema.py)."""
    from specbuild.deploy.llmapi import repository_files

    spec = _spec(tmp_path, target={"trust_remote_code": True})
    script = repository_files(spec, llm_api.llm_args(spec))[llm_api.SERVE_SCRIPT]
    flags = _serve_script_flags(script, str(tmp_path / "target"))
    assert flags["--trust_remote_code"] is True
    assert flags["--max_batch_size"] == "8" and flags["--port"] == str(spec.deploy.http_port)
    with pytest.raises(AssertionError):  # a value where the option takes none, and a word where it takes a number
        _serve_script_flags(script.replace("--trust_remote_code", "--trust_remote_code yes"), str(tmp_path / "target"))
    with pytest.raises(AssertionError):
        _serve_script_flags(script.replace("--max_batch_size 8", "--max_batch_size eight"), str(tmp_path / "target"))


def _tensors(entries: Any) -> dict[str, tuple[str, tuple[int, ...], bool]]:
    from tritonclient.grpc import model_config_pb2

    return {t.name: (model_config_pb2.DataType.Name(t.data_type), tuple(t.dims), getattr(t, "optional", False))
            for t in entries}  # a ModelOutput has no `optional`


def test_deploy_demo_pytorch_flow(tmp_path: Path, demo_models: dict[str, Path]) -> None:
    """convert (nothing), build (the settings) and deploy (llmapi repository + trtllm-serve) a draft-target spec on
    the demo pair; every written field checked against the 1.2 schema table; reruns are no-ops; a spec edited
    after build is refused by deploy until build runs again."""
    from specbuild.build.llm_api import build_llm_api
    from specbuild.deploy.llmapi import deploy_llm_api
    from specbuild.deploy.pbtxt import read_config

    spec = _spec(tmp_path, demo_models, build={"dtype": "float32"})
    assert build_llm_api(spec).status == "written"
    assert build_llm_api(spec).status == "up to date"
    result = deploy_llm_api(spec)
    assert result.status == "written" and "model.py" in result.summary() and "all_models/llmapi" in result.summary()
    repository = spec.deploy.model_repository
    assert deploy_llm_api(spec).status == "up to date"

    model_yaml = yaml.safe_load((repository / "tensorrt_llm/1/model.yaml").read_text())
    triton = model_yaml.pop("triton_config")
    assert set(triton) == set(upstream.MODEL_YAML_TRITON_CONFIG)
    assert triton == {"max_batch_size": upstream.MODEL_YAML_TRITON_MAX_BATCH_SIZE, "decoupled": True}
    _check_llm_args(model_yaml)
    assert model_yaml["model"] == str(demo_models["target"])
    assert model_yaml["dtype"] == "float32"  # the spec's dtype reaches the LLM API (its default is the checkpoint's)
    assert model_yaml["speculative_config"]["speculative_model"] == str(demo_models["draft"])
    assert not (repository / "tensorrt_llm/1/model.py").exists()  # NVIDIA's, from the container

    config = read_config(repository / "tensorrt_llm/config.pbtxt")
    assert (config.name, config.backend) == (upstream.LLMAPI_CONFIG["name"], upstream.LLMAPI_CONFIG["backend"])
    assert config.max_batch_size == 0 and not config.HasField("model_transaction_policy")
    inputs, outputs = _tensors(config.input), _tensors(config.output)
    for name, entry in inputs.items():
        assert upstream.LLMAPI_INPUTS[name] == entry, name
    assert {n for n, (_, _, optional) in upstream.LLMAPI_INPUTS.items() if not optional} <= set(inputs)
    assert {name: (dtype, dims) for name, (dtype, dims, _) in outputs.items()} == upstream.LLMAPI_OUTPUTS

    options = yaml.safe_load((repository / "trtllm-serve.yaml").read_text())
    for key in options:
        assert key in upstream.LLM_ARGS
    _check_speculative_config(options["speculative_config"])
    flags = _serve_script_flags((repository / "trtllm-serve.sh").read_text(), str(demo_models["target"]))
    assert "--trust_remote_code" not in flags
    served = {"tensor_parallel_size": int(flags["--tp_size"]), "pipeline_parallel_size": int(flags["--pp_size"]),
              "max_batch_size": int(flags["--max_batch_size"]), "max_num_tokens": int(flags["--max_num_tokens"]),
              "max_seq_len": int(flags["--max_seq_len"])}
    assert served == {key: model_yaml[key] for key in served}  # trtllm-serve and Triton serve the same settings

    edited = _spec(tmp_path, demo_models, build={"dtype": "float32", "max_batch_size": 4})
    with pytest.raises(SpecbuildError, match=r"not what the spec says now \(max_batch_size, "):
        deploy_llm_api(edited)
    assert (repository / "tensorrt_llm/1/model.yaml").read_text().count("max_batch_size: 8") == 1
