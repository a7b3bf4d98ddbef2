"""`specbuild deploy`: engines + tokenizer -> a complete, self-contained Triton model repository.

Written into a temporary directory and swapped into place whole (`atomic_directory`); every config.pbtxt is
parsed as Triton's ModelConfig and the whole repository is checked (`check_repository`) before the swap, so a
repository that exists is one tritonserver can load. Unchanged inputs, settings and tool versions make a re-run a
no-op; engines that are not what the spec says now (a setting changed, or the checkpoint re-converted, without a
rebuild) are refused, naming each setting.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from specbuild.atomic import Inputs, atomic_directory, link_or_copy, output_lock, refuse_overlap
from specbuild.contracts.checkpoint_facts import read_checkpoint_facts, stale_conversion
from specbuild.contracts.engine_info import ENGINE_INFO, EngineInfo, engine_dir, engine_roles
from specbuild.contracts.engine_limits import stale_engine_problems
from specbuild.contracts.llm_api import PYTORCH, refuse_other_flow
from specbuild.deploy.check import RepositoryReport, check_repository
from specbuild.deploy.layout import (
    POSTPROCESSING,
    PREPROCESSING,
    ModelPlan,
    RepositoryPlan,
    plan_repository,
    read_engines,
)
from specbuild.deploy.llmapi import REPOSITORY_NAME, LlmApiDeployResult, deploy_llm_api, spec_file
from specbuild.deploy.model_code import MODEL_VERSION, code_hashes, package_files
from specbuild.deploy.pbtxt import fill, parameters_text, parse_config, template_text
from specbuild.errors import SpecbuildError
from specbuild.manifest import (
    Status,
    changed_inputs,
    fingerprint_files,
    is_fresh,
    output_sizes,
    read_manifest,
    tool_versions,
    write_manifest,
)
from specbuild.spec import PipelineSpec
from specbuild.tokenizer import TOKENIZER_DIR, TOKENIZER_FILES, copy_tokenizer, load_tokenizer, special_ids


@dataclass
class DeployResult:
    repository: Path
    status: Status
    plan: RepositoryPlan
    report: RepositoryReport | None = None
    """The check of the repository as written (or as found, when up to date), so no caller checks it again;
    None for a dry run."""

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


def _inputs(spec: PipelineSpec, plan: RepositoryPlan, known: dict[str, Any] | None) -> dict[str, Any]:
    """Hashes of what the repository is made from; files whose stat the last manifest recorded are not re-read."""
    paths = [engine_dir(spec, role) / ENGINE_INFO for role in plan.engines]
    paths += [spec.target.model / name for name in TOKENIZER_FILES if (spec.target.model / name).is_file()]
    return fingerprint_files(paths, known)


def _settings(plan: RepositoryPlan, configs: dict[str, str]) -> dict[str, Any]:
    code = code_hashes([m.template for m in plan.models if m.python])
    return {"configs": configs, "code": code, "trust_remote_code": plan.spec.target.trust_remote_code}


def repository_inputs(spec: PipelineSpec) -> Inputs:
    """What the repository is made from: the engines build wrote, the target's tokenizer, and the spec."""
    engines = {f"output_dir's {role} engine": engine_dir(spec, role) for role in engine_roles(spec)}
    return {**engines, "target.model": spec.target.model, "SPEC": spec_file(spec)}


def deploy_repository(spec: PipelineSpec, *, dry_run: bool = False, force: bool = False,
                      console: Console | None = None) -> DeployResult | LlmApiDeployResult:
    """Write `spec.deploy.model_repository` for the engines `build` left in `spec.output_dir/engines`.

    A `build.flow: pytorch` spec has no engines: its repository is Triton's llmapi model (`deploy_llm_api`), whose
    result carries no ensemble check (`DeployResult.report`), so callers tell the two apart by type."""
    console = console or Console(stderr=True)
    if spec.build.flow == PYTORCH:
        return deploy_llm_api(spec, dry_run=dry_run, force=force, console=console)
    refuse_other_flow(spec, "deploy")  # eagle3/ngram have no engine to serve: the reason and `build.flow: pytorch`
    repository = spec.deploy.model_repository
    assert repository is not None
    inputs = repository_inputs(spec)
    refuse_overlap(repository, inputs, output_name=REPOSITORY_NAME)
    engines = read_engines(spec)
    check_engines_current(spec, engines)
    tokenizer = load_tokenizer(spec.target.model, trust_remote_code=spec.target.trust_remote_code)
    end_id, pad_id = special_ids(tokenizer)
    plan = plan_repository(spec, engines, end_id, pad_id)
    configs = {model.name: render_config(model) for model in plan.models}
    if dry_run:
        console.print(plan_table(plan, repository))
        return DeployResult(repository, "planned", plan)
    with output_lock(repository):
        return _write_repository(spec, plan, configs, repository, force, inputs)


def _write_repository(spec: PipelineSpec, plan: RepositoryPlan, configs: dict[str, str], repository: Path,
                      force: bool, named: Inputs) -> DeployResult:
    known = read_manifest(repository)
    inputs, settings = _inputs(spec, plan, (known or {}).get("inputs")), _settings(plan, configs)
    tools = tool_versions()
    if not force and is_fresh(known, settings=settings, tools=tools, inputs=inputs, directory=repository):
        return DeployResult(repository, "up to date", plan, check_repository(repository))
    tokenizer_bytes = sum((spec.target.model / name).stat().st_size for name in TOKENIZER_FILES
                          if (spec.target.model / name).is_file())
    # tokenizer_bytes: the second copy is a hard link
    with atomic_directory(repository, needed_bytes=tokenizer_bytes, inputs=named) as tmp:
        for model in plan.models:
            directory = tmp / model.name
            (directory / MODEL_VERSION).mkdir(parents=True)
            (directory / "config.pbtxt").write_text(configs[model.name], encoding="utf-8")
            if model.python:
                for name, data in package_files(model.template).items():
                    (directory / name).write_bytes(data)
        _place_tokenizer(spec, tmp)
        report = check_repository(tmp)
        report.raise_for_problems()
        outputs = output_sizes(tmp)
        write_manifest(tmp, {
            "stage": "deploy", "spec": spec.where, "inputs": inputs, "settings": settings,
            "tools": tools, "outputs": outputs,
            "engines": {role: str(engine_dir(spec, role).resolve()) for role in plan.engines},
        })
    return DeployResult(repository, "written", plan, report.moved_to(repository))


def check_engines_current(spec: PipelineSpec, engines: dict[str, EngineInfo]) -> None:
    """Refuse engines that are not what the spec asks for now (a setting changed without a rebuild), that were
    built from another checkpoint than the one convert left there (a convert without a rebuild), or from a checkpoint
    converted before its model changed (a retrain without a convert): serving them would silently serve the old
    model. Every stale engine and setting is named together."""
    problems = []
    for role, info in engines.items():
        directory, checkpoint = engine_dir(spec, role), spec.checkpoint_dir(role)
        stale = stale_conversion(role, checkpoint)
        if stale is not None:  # the engine may match its checkpoint, which holds the old model
            problems.append(f"{stale}, so {directory} holds the old model: run `specbuild convert SPEC` first")
        # no facts where convert ran elsewhere, or where the conversion is stale (named above; not hashed again)
        facts = None if stale is not None else read_checkpoint_facts(role, checkpoint)[0]
        problems += [f"{directory / ENGINE_INFO}: {problem}"
                     for problem in stale_engine_problems(spec, role, info, facts)]
        changed = [Path(name).name for name in changed_inputs(directory)]
        if changed:
            problems.append(f"{directory}: built from a checkpoint that has changed since ({', '.join(changed)})")
    if problems:
        raise SpecbuildError(
            f"{spec.where}: the built engines are not what the spec and its checkpoints say now ({len(problems)} "
            "problem(s)); deploying would serve them anyway:\n" + "\n".join(f"  - {problem}" for problem in problems),
            hint="run `specbuild build SPEC` (it rebuilds what changed), then deploy again",
        )


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
        files = ["config.pbtxt", *(package_files(model.template) if model.python else [f"{MODEL_VERSION}/"])]
        source = str(model.engine) if model.engine else str(model.parameters.get("tokenizer_dir", ""))
        table.add_row(model.name, backend, str(model.values.get("decoupled_mode", "-")).lower(), ", ".join(files),
                      source)
    names = [n for n in TOKENIZER_FILES if (plan.spec.target.model / n).is_file()]
    table.add_row(f"{PREPROCESSING}, {POSTPROCESSING}", "-", "-", ", ".join(f"{TOKENIZER_DIR}/{n}" for n in names),
                  str(plan.spec.target.model))
    return table

