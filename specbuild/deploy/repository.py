"""`specbuild deploy`: engines + tokenizer -> a complete, self-contained Triton model repository.

Written into a temporary directory and swapped into place whole (`atomic_directory`); every config.pbtxt is
parsed as Triton's ModelConfig and the whole repository is checked (`check_repository`) before the swap, so a
repository that exists is one tritonserver can load. Unchanged inputs and settings make a re-run a no-op.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from specbuild.atomic import atomic_directory
from specbuild.build.engine_info import ENGINE_INFO, engine_dir
from specbuild.build.reference import link_or_copy
from specbuild.deploy.check import check_repository
from specbuild.deploy.layout import (
    POSTPROCESSING,
    PREPROCESSING,
    ModelPlan,
    RepositoryPlan,
    plan_repository,
    read_engines,
)
from specbuild.deploy.pbtxt import fill, parameters_text, parse_config, template_text
from specbuild.deploy.tokenizer_files import TOKENIZER_DIR, TOKENIZER_FILES, copy_tokenizer, load_tokenizer, special_ids
from specbuild.manifest import (
    bytes_hash,
    fingerprint_files,
    output_sizes,
    outputs_intact,
    read_manifest,
    same_inputs,
    tool_versions,
    write_manifest,
)
from specbuild.spec import PipelineSpec

MODEL_VERSION = "1"


@dataclass
class DeployResult:
    repository: Path
    status: str  # written | up to date | planned
    plan: RepositoryPlan

    def summary(self) -> str:
        names = ", ".join(m.name for m in self.plan.models)
        entry = " and ".join(self.plan.entry_points)
        return f"{self.status}: {self.repository} ({names}); clients call {entry}"


def render_config(model: ModelPlan) -> str:
    """The template's header, the contract's tensors and every contract parameter (spec value or NVIDIA's
    default), parsed as Triton's ModelConfig."""
    text = fill(template_text(model.template), model.template_values(), where=f"{model.name}/config.pbtxt")
    parameters = model.all_parameters()
    text = text + parameters_text(parameters) if parameters else text
    parse_config(text, where=f"{model.name}/config.pbtxt")
    return text


def _package_files(template: str) -> dict[str, bytes]:
    """The python model code of a packaged model directory (`1/model.py`)."""
    root = resources.files("specbuild").joinpath("triton_models", template, MODEL_VERSION)
    return {f"{MODEL_VERSION}/{entry.name}": entry.read_bytes() for entry in root.iterdir()
            if entry.name.endswith(".py")}


def _inputs(spec: PipelineSpec, plan: RepositoryPlan, known: dict[str, Any] | None) -> dict[str, Any]:
    """Hashes of what the repository is made from; files whose stat the last manifest recorded are not re-read."""
    paths = [engine_dir(spec, role) / ENGINE_INFO for role in plan.engines]
    paths += [spec.target.model / name for name in TOKENIZER_FILES if (spec.target.model / name).is_file()]
    return fingerprint_files(paths, known)


def _settings(plan: RepositoryPlan, configs: dict[str, str]) -> dict[str, Any]:
    code = {f"{m.template}/{name}": bytes_hash(data) for m in plan.models if m.python
            for name, data in _package_files(m.template).items()}
    return {"configs": configs, "code": code, "trust_remote_code": plan.spec.target.trust_remote_code}


def deploy_repository(spec: PipelineSpec, *, dry_run: bool = False, force: bool = False,
                      console: Console | None = None) -> DeployResult:
    """Write `spec.deploy.model_repository` for the engines `build` left in `spec.output_dir/engines`."""
    console = console or Console(stderr=True)
    repository = spec.deploy.model_repository
    assert repository is not None
    engines = read_engines(spec)
    tokenizer = load_tokenizer(spec.target.model, trust_remote_code=spec.target.trust_remote_code)
    end_id, pad_id = special_ids(tokenizer)
    plan = plan_repository(spec, engines, end_id, pad_id)
    configs = {model.name: render_config(model) for model in plan.models}
    if dry_run:
        console.print(plan_table(plan, repository))
        return DeployResult(repository, "planned", plan)
    known = read_manifest(repository)
    inputs, settings = _inputs(spec, plan, (known or {}).get("inputs")), _settings(plan, configs)
    if (not force and known is not None and known.get("settings") == settings
            and same_inputs(known.get("inputs", {}), inputs) and known.get("tools") == tool_versions()
            and outputs_intact(repository, known.get("outputs", {}))):
        return DeployResult(repository, "up to date", plan)
    with atomic_directory(repository) as tmp:
        for model in plan.models:
            directory = tmp / model.name
            (directory / MODEL_VERSION).mkdir(parents=True)
            (directory / "config.pbtxt").write_text(configs[model.name], encoding="utf-8")
            if model.python:
                for name, data in _package_files(model.template).items():
                    (directory / name).write_bytes(data)
        _place_tokenizer(spec, tmp)
        check_repository(tmp).raise_for_problems()
        outputs = output_sizes(tmp)
        write_manifest(tmp, {
            "stage": "deploy", "spec": str(spec.path), "inputs": inputs, "settings": settings,
            "tools": tool_versions(), "outputs": outputs,
            "engines": {role: str(engine_dir(spec, role).resolve()) for role in plan.engines},
        })
    return DeployResult(repository, "written", plan)


def _place_tokenizer(spec: PipelineSpec, repository: Path) -> None:
    """A copy in `preprocessing/tokenizer/`, hard-linked into `postprocessing/tokenizer/`: inside the model
    directories because tritonserver takes every top-level directory for a model."""
    first = repository / PREPROCESSING / TOKENIZER_DIR
    names = copy_tokenizer(spec.target.model, first, trust_remote_code=spec.target.trust_remote_code)
    second = repository / POSTPROCESSING / TOKENIZER_DIR
    second.mkdir()
    for name in names:
        link_or_copy(first / name, second / name)


def plan_table(plan: RepositoryPlan, repository: Path) -> Table:
    """What `deploy --dry-run` would write: each model, its backend and the files it gets."""
    table = Table(title=f"would write {repository}", header_style="bold", title_justify="left")
    for column in ("model", "backend", "decoupled", "files", "engine / tokenizer"):
        table.add_column(column, overflow="fold")
    for model in plan.models:
        backend = str(model.values.get("triton_backend", "ensemble" if model.name == "ensemble" else "python"))
        files = ["config.pbtxt", *(_package_files(model.template) if model.python else [f"{MODEL_VERSION}/"])]
        source = str(model.engine) if model.engine else str(model.parameters.get("tokenizer_dir", ""))
        table.add_row(model.name, backend, str(model.values.get("decoupled_mode", "-")).lower(), ", ".join(files),
                      source)
    names = [n for n in TOKENIZER_FILES if (plan.spec.target.model / n).is_file()]
    table.add_row(f"{PREPROCESSING}, {POSTPROCESSING}", "-", "-", ", ".join(f"{TOKENIZER_DIR}/{n}" for n in names),
                  str(plan.spec.target.model))
    return table

