"""`specbuild deploy --check REPO`: is this a repository tritonserver will load and wire correctly?

Triton only finds most wiring mistakes at load time or, worse, at the first request (a misspelt model name
in a BLS parameter is just a string to Triton). So every config.pbtxt is parsed as Triton's ModelConfig, and
the cross-model facts are checked: ensemble steps and tensors, the models the BLS calls, batch sizes,
decoupled modes, end/pad ids, tokenizer and engine paths. A PyTorch-flow repository (Triton's llmapi model,
tensorrt_llm/1/model.yaml) is checked against the llmapi contract instead, once NVIDIA's code is copied in
(without it, one refusal naming what to copy).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rich.table import Table

from specbuild.contracts.engine_info import ENGINE_INFO
from specbuild.contracts.llm_api import (
    LLMAPI_INPUTS,
    LLMAPI_MODEL_SOURCE,
    LLMAPI_OUTPUTS,
    refuse_incomplete_llmapi,
    settings_problems,
)
from specbuild.contracts.llm_api import Tensor as LlmApiTensor
from specbuild.contracts.triton_backend import (
    CALLED_MODEL_PARAMETERS,
    MODELS,
    PLACEHOLDER_TYPES,
    ModelContract,
    Tensor,
)
from specbuild.deploy.pbtxt import parameter, read_config
from specbuild.errors import SpecbuildError
from specbuild.medusa.choices import parse_choices, validated


@dataclass
class ModelFacts:
    name: str
    directory: Path
    config: Any

    @property
    def backend(self) -> str:
        return self.config.platform or self.config.backend

    @property
    def decoupled(self) -> bool:
        return bool(self.config.model_transaction_policy.decoupled)

    def inputs(self) -> dict[str, Any]:
        return {tensor.name: tensor for tensor in self.config.input}

    def outputs(self) -> dict[str, Any]:
        return {tensor.name: tensor for tensor in self.config.output}


@dataclass
class RepositoryReport:
    repository: Path
    models: dict[str, ModelFacts] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    wiring: dict[str, str] = field(default_factory=dict)

    def raise_for_problems(self) -> None:
        if self.problems:
            lines = "\n".join(f"  {problem}" for problem in self.problems)
            raise SpecbuildError(f"{self.repository}: {len(self.problems)} problem(s) in the model repository:\n"
                                 f"{lines}", hint="re-run `specbuild deploy SPEC` to rewrite it")

    def moved_to(self, repository: Path) -> RepositoryReport:
        """The same report for the same files after their directory was renamed to `repository`: deploy checks
        its temporary directory before the swap and shows the check under the name it now has."""
        models = {name: replace(model, directory=repository / model.directory.relative_to(self.repository))
                  for name, model in self.models.items()}
        return replace(self, repository=repository, models=models)

    def table(self) -> Table:
        table = Table(title=f"{self.repository}", header_style="bold", title_justify="left")
        for column in ("model", "backend", "max batch", "decoupled", "instances", "wiring"):
            table.add_column(column, overflow="fold")
        for name, model in sorted(self.models.items()):
            instances = sum(group.count or 1 for group in model.config.instance_group) or "-"
            table.add_row(name, model.backend, str(model.config.max_batch_size), str(model.decoupled).lower(),
                          str(instances), self.wiring.get(name, ""))
        return table


def check_repository(repository: Path) -> RepositoryReport:
    """Parse and cross-check every model of `repository`; problems are collected, not raised (but an llmapi
    repository still without NVIDIA's model.py is refused: there is nothing to check it against)."""
    report = RepositoryReport(repository)
    if not repository.is_dir():
        report.problems.append(f"{repository} is not a directory")
        return report
    refuse_incomplete_llmapi(repository, f"deploy --check {repository}")
    for directory in sorted(p for p in repository.iterdir() if p.is_dir() and not p.name.startswith(".")):
        if not (directory / "config.pbtxt").is_file():
            continue
        try:
            config = read_config(directory / "config.pbtxt")
        except SpecbuildError as err:
            report.problems.append(err.message)
            continue
        report.models[directory.name] = ModelFacts(directory.name, directory, config)
    if not report.models:
        report.problems.append("no models (no <model>/config.pbtxt) found")
    for model in report.models.values():
        _check_model(report, model)
    sizes = {m.config.max_batch_size for m in report.models.values()}
    if len(sizes) > 1:
        listed = ", ".join(f"{m.name}={m.config.max_batch_size}" for m in report.models.values())
        report.problems.append(f"max_batch_size differs between models ({listed})")
    for key in ("end_id", "pad_id"):
        values = {m.name: parameter(m.config, key) for m in report.models.values() if parameter(m.config, key)}
        if len(set(values.values())) > 1:
            report.problems.append(f"parameter {key} differs between models ({values})")
    return report


def _check_model(report: RepositoryReport, model: ModelFacts) -> None:
    where = f"{model.name}/config.pbtxt"
    if model.config.name and model.config.name != model.name:
        report.problems.append(f"{where}: name {model.config.name!r} differs from its directory {model.name!r}")
    if model.config.backend == "python" and not (model.directory / "1" / "model.py").is_file():
        report.problems.append(f"{model.name}: python backend but no 1/model.py")
    if model.config.platform == "ensemble":
        _check_ensemble(report, model)
    if _is_llmapi(model):
        _check_llmapi(report, model)
        return
    if any(parameter(model.config, key) is not None for key in CALLED_MODEL_PARAMETERS):
        _check_bls(report, model)
    _check_paths(report, model)
    _check_contract(report, model)
    if parameter(model.config, "decoding_mode") == "medusa":
        try:
            validated(parse_choices(parameter(model.config, "medusa_choices") or ""))  # as the model's load does
        except ValueError as err:
            report.problems.append(f"{model.name}: parameter medusa_choices: {err}")


def contract_of(model: ModelFacts) -> ModelContract | None:
    """Which of the TensorRT-LLM backend's models this one is: by name, and LLM models (tensorrt_llm_draft, or
    any other name) by their engine parameter."""
    if model.name in MODELS:
        return MODELS[model.name]
    if parameter(model.config, "gpt_model_path") is not None and model.config.platform != "ensemble":
        return MODELS["tensorrt_llm"]
    return None


def _is_llmapi(model: ModelFacts) -> bool:
    return (model.directory / "1" / "model.yaml").is_file()


def _check_llmapi(report: RepositoryReport, model: ModelFacts) -> None:
    """Triton's llmapi model: every tensor of the contract (contracts.llm_api, from LLMAPI_MODEL_SOURCE) declared
    alike, and model.yaml's LLM-API settings the llm_args.py fields (what deploy writes, checked again as found)."""
    import yaml
    from tritonclient.grpc import model_config_pb2

    where = f"{model.name}/config.pbtxt"

    def compare(kind: str, expected: LlmApiTensor, declared: dict[str, Any]) -> None:
        tensor = declared.get(expected.name)
        if tensor is None:
            if not expected.optional:
                report.problems.append(f"{where}: {kind} {expected.name!r} of the llmapi model is not declared")
            return
        got = (model_config_pb2.DataType.Name(tensor.data_type), _dims(tensor))
        if got != (expected.data_type, expected.dims):
            report.problems.append(f"{where}: {kind} {expected.name!r} is {got[0]} {list(got[1])}, the llmapi "
                                   f"model's is {expected.data_type} {list(expected.dims)} ({LLMAPI_MODEL_SOURCE})")

    for expected in LLMAPI_INPUTS:
        compare("input", expected, model.inputs())
    for expected in LLMAPI_OUTPUTS:
        compare("output", expected, model.outputs())
    path = model.directory / "1" / "model.yaml"
    try:
        settings = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as err:
        report.problems.append(f"{model.name}/1/model.yaml: not readable YAML ({err})")
        return
    if not isinstance(settings, dict) or not isinstance(settings.get("model"), str):
        report.problems.append(f"{model.name}/1/model.yaml: no LLM-API settings (a mapping with `model`)")
        return
    args = {key: value for key, value in settings.items() if key != "triton_config"}
    report.problems += [f"{model.name}/1/model.yaml: {message}" for _, message in settings_problems(args)]
    method = (args.get("speculative_config") or {}).get("decoding_type", "no speculation")
    report.wiring[model.name] = f"llmapi {args['model']} ({method})"


def _dims(tensor: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in tensor.dims)


def _check_contract(report: RepositoryReport, model: ModelFacts) -> None:
    """Every tensor and parameter of NVIDIA's template is declared as NVIDIA declares it, so NVIDIA's clients
    and the C++ backend find what they expect (specbuild may declare more)."""
    from tritonclient.grpc import model_config_pb2

    contract = contract_of(model)
    if contract is None:
        return
    where = f"{model.name}/config.pbtxt"

    def compare(kind: str, expected: Tensor, declared: dict[str, Any]) -> None:
        tensor = declared.get(expected.name)
        if tensor is None:
            report.problems.append(f"{where}: {kind} {expected.name!r} of the TensorRT-LLM backend's "
                                   f"{contract.name} model is not declared")
            return
        want_type = PLACEHOLDER_TYPES.get(expected.data_type, expected.data_type)
        got_type = model_config_pb2.DataType.Name(tensor.data_type)
        if got_type != want_type or _dims(tensor) != expected.dims:
            report.problems.append(f"{where}: {kind} {expected.name!r} is {got_type} {list(_dims(tensor))}, the "
                                   f"backend's is {want_type} {list(expected.dims)}")
        if kind == "input" and bool(tensor.optional) != expected.optional:
            report.problems.append(f"{where}: input {expected.name!r} must {'' if expected.optional else 'not '}be "
                                   "optional, as in the backend's template")

    for expected in contract.nvidia_inputs():
        compare("input", expected, model.inputs())
    for expected in contract.nvidia_outputs():
        compare("output", expected, model.outputs())
    for key in (p.key for p in contract.parameters if p.extra is None):
        if parameter(model.config, key) is None:
            report.problems.append(f"{where}: parameter {key!r} of the backend's {contract.name} model is missing")


def _check_ensemble(report: RepositoryReport, model: ModelFacts) -> None:
    available = set(model.inputs())
    produced: set[str] = set()
    chain = []
    decoupled = False
    for index, step in enumerate(model.config.ensemble_scheduling.step):
        where = f"{model.name}: step {index + 1} ({step.model_name})"
        chain.append(step.model_name)
        called = report.models.get(step.model_name)
        if called is None:
            report.problems.append(f"{where}: model_name {step.model_name!r} is not in the repository")
            continue
        decoupled |= called.decoupled
        inputs, outputs = called.inputs(), called.outputs()
        for key, value in step.input_map.items():
            if key not in inputs:
                report.problems.append(f"{where}: input_map key {key!r} is not an input of {step.model_name}")
            if value not in available:
                report.problems.append(f"{where}: input_map value {value!r} is neither an ensemble input nor an "
                                       "output of an earlier step")
        for name, tensor in inputs.items():
            if not tensor.optional and name not in step.input_map:
                report.problems.append(f"{where}: required input {name!r} of {step.model_name} is not mapped")
        for key, value in step.output_map.items():
            if key not in outputs:
                report.problems.append(f"{where}: output_map key {key!r} is not an output of {step.model_name}")
            available.add(value)
            produced.add(value)
    for name in model.outputs():
        if name not in produced:
            report.problems.append(f"{model.name}: output {name!r} is produced by no step")
    report.wiring[model.name] = " -> ".join(chain) + ("  (streams)" if decoupled else "")


def _check_bls(report: RepositoryReport, model: ModelFacts) -> None:
    called = []
    for key in CALLED_MODEL_PARAMETERS:
        name = parameter(model.config, key)
        if not name:
            continue
        target = report.models.get(name)
        if target is None:
            known = ", ".join(sorted(report.models))
            report.problems.append(f"{model.name}: parameter {key} = {name!r} names no model in the repository "
                                   f"(models: {known})")
            continue
        if target.decoupled and not _streams_through(model, key):
            report.problems.append(f"{model.name}: parameter {key} = {name!r} names a decoupled model, which a "
                                   "BLS exec(decoupled=False) call cannot use")
        called.append(name)
    report.wiring[model.name] = "calls " + ", ".join(called) + ("  (streams)" if model.decoupled else "")


def _streams_through(bls: ModelFacts, key: str) -> bool:
    """Whether the BLS calls this model with exec(decoupled=True): a decoupled BLS streams its LLM's responses
    (NVIDIA's tensorrt_llm_bls does, triton_decoder.py), except around a draft model, whose speculation rounds
    call both LLM models with exec(decoupled=False) as NVIDIA's BLS does."""
    return (key == "tensorrt_llm_model_name" and bls.decoupled
            and not parameter(bls.config, "tensorrt_llm_draft_model_name"))


def _check_paths(report: RepositoryReport, model: ModelFacts) -> None:
    tokenizer = parameter(model.config, "tokenizer_dir")
    if tokenizer:
        path = _resolve(model, tokenizer)
        if not (path / "tokenizer.json").is_file() and not (path / "tokenizer_config.json").is_file():
            report.problems.append(f"{model.name}: parameter tokenizer_dir = {tokenizer!r} ({path}) holds no "
                                   "tokenizer files")
        shown = path.relative_to(report.repository.resolve()) if path.is_relative_to(report.repository.resolve()) \
            else path
        report.wiring.setdefault(model.name, f"tokenizer {shown}")
    engine = parameter(model.config, "gpt_model_path")
    if engine:
        path = _resolve(model, engine)
        marker = ENGINE_INFO if model.config.backend == "python" else "config.json"
        if not (path / marker).is_file():
            report.problems.append(f"{model.name}: parameter gpt_model_path = {engine!r} has no {marker} (engine "
                                   "not built, or moved)")
        mode = parameter(model.config, "decoding_mode") or "default"
        short = Path(*path.parts[-2:]) if len(path.parts) > 2 else path
        report.wiring.setdefault(model.name, f"engine .../{short} ({mode})")


def _resolve(model: ModelFacts, value: str) -> Path:
    path = Path(value)
    return path if path.is_absolute() else (model.directory / path).resolve()
