"""The build stage: checkpoints -> plans -> every check -> engines (or reference bundles), incrementally.

Order matters for the user: all problems are found and reported together before any engine directory is
touched or any GPU time is spent; an engine whose inputs (checkpoint hashes), plan and tools are unchanged is
not rebuilt; each engine directory appears whole or not at all, with `engine.json` and `manifest.json`.
`build_pipeline` is every caller's entry point on both flows: a `build.flow: pytorch` spec has no engine and goes
to `build.llm_api.build_llm_api` (the LLM-API settings checked and recorded).
"""

from __future__ import annotations

import queue
import shlex
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from specbuild.atomic import Inputs, atomic_directory, check_replaceable, output_lock, refuse_overlap
from specbuild.build.backend import TensorrtStatus, resolve_backend
from specbuild.build.gpu import Gpu, parse_gpu
from specbuild.build.llm_api import LlmApiResult, build_llm_api, spec_file
from specbuild.build.plan import BuildPlan, plan_pipeline
from specbuild.build.reference import write_reference_bundle
from specbuild.build.script import script_path, write_build_script
from specbuild.build.tensorrt import build_engine, gpu_slices
from specbuild.build.trtllm_flags import TRTLLM_VERSION
from specbuild.build.validate import BuildProblem, BuildValidationError, build_problems
from specbuild.contracts.checkpoint_facts import CheckpointFacts, read_checkpoint_facts
from specbuild.contracts.engine_info import EngineInfo, engine_dir, engine_roles, write_engine_info
from specbuild.contracts.engine_limits import attention_window
from specbuild.contracts.llm_api import PYTORCH, refuse_other_flow
from specbuild.errors import SpecbuildError
from specbuild.manifest import (
    Status,
    fingerprint_files,
    is_fresh,
    output_sizes,
    read_manifest,
    tool_versions,
    write_manifest,
)
from specbuild.spec import PipelineSpec

_WORDS: dict[Status, str] = {"written": "built", "up to date": "up to date", "planned": "planned"}
"""How the progress line says what happened to an engine (an engine is built, not written)."""


@dataclass
class EngineResult:
    """What happened to one engine."""

    role: str
    backend: str
    directory: Path
    plan: BuildPlan
    info: EngineInfo
    status: Status
    seconds: float = 0.0
    script: Path | None = None

    def summary(self) -> str:
        what = f"{self.role}: {self.backend} engine {self.directory}"
        if self.status == "up to date":
            return f"{what} is up to date (checkpoint, plan and tool versions unchanged; --force rebuilds it)"
        if self.status == "planned":
            return f"{self.role}: dry run, nothing built; {self.script} builds it in the TensorRT-LLM container"
        return f"{what} built in {self.seconds:.1f} s"


@dataclass(frozen=True)
class _Job:
    plan: BuildPlan
    facts: CheckpointFacts
    info: EngineInfo
    settings: dict[str, Any]
    inputs: Inputs


def build_inputs(spec: PipelineSpec) -> Inputs:
    """What the engine flow's build reads: the checkpoints convert wrote, and the spec."""
    checkpoints = {f"output_dir's {role} checkpoint": spec.checkpoint_dir(role) for role in engine_roles(spec)}
    return {**checkpoints, "SPEC": spec_file(spec)}


def refuse_overlapping_engines(spec: PipelineSpec) -> Inputs:
    """Refuse, before anything is read, an engine directory that is, contains or lies inside what build reads
    (a checkpoint, the spec; a symlinked output_dir can put one inside another); returns those inputs."""
    inputs = build_inputs(spec)
    for role in engine_roles(spec):
        refuse_overlap(engine_dir(spec, role), inputs, output_name=f"output_dir's {role} engine")
    return inputs


def _read_facts(spec: PipelineSpec) -> tuple[dict[str, CheckpointFacts], list[BuildProblem]]:
    facts: dict[str, CheckpointFacts] = {}
    problems: list[BuildProblem] = []
    for role in engine_roles(spec):
        fact, messages = read_checkpoint_facts(role, spec.checkpoint_dir(role))
        if fact is not None:
            facts[role] = fact
        problems += [BuildProblem("error", message) for message in messages]
    return facts, problems


def _target_gpu(spec: PipelineSpec, status: TensorrtStatus | None) -> tuple[Gpu | None, list[BuildProblem]]:
    """The spec's `build.gpu`, else (building with TensorRT-LLM) the first visible GPU."""
    if spec.build.gpu is not None:
        gpu = parse_gpu(spec.build.gpu, spec.build.gpu_memory_gb)
        if gpu is None:
            return None, [BuildProblem(
                "error", f"build.gpu: unknown GPU {spec.build.gpu!r}; give its compute capability instead, e.g. '8.9'"
            )]
        return gpu, []
    if status is not None and status.available and status.gpus:
        return status.gpus[0], []
    return None, []


def _print_plans(plans: list[BuildPlan], backend: str, console: Console) -> None:
    """Each engine's full trtllm-build command on one line, ready to copy."""
    console.print(f"[bold]build plans[/] (TensorRT-LLM {TRTLLM_VERSION} trtllm-build; {backend} backend here)")
    for plan in plans:
        console.print(f"[cyan]{plan.role}[/]: {escape(shlex.join(plan.command()))}", highlight=False, soft_wrap=True)


def _up_to_date(job: _Job, tools: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
    """(skip?, input fingerprints) from the previous manifest (manifest.is_fresh: same settings, same tool versions,
    same hashes, outputs intact). Hashes of files whose size and mtime are unchanged are reused from it."""
    previous = read_manifest(job.plan.output_dir) or {}
    inputs = fingerprint_files(job.facts.files, previous.get("inputs"))
    fresh = is_fresh(previous, settings=job.settings, tools=tools, inputs=inputs, directory=job.plan.output_dir)
    return fresh, inputs


def _build_one(job: _Job, backend: str, gpus: list[int] | None, force: bool, tools: dict[str, Any]) -> EngineResult:
    plan = job.plan
    with output_lock(plan.output_dir):  # the decision and the write, by one run at a time
        return _build_locked(job, backend, gpus, force, tools)


def _build_locked(job: _Job, backend: str, gpus: list[int] | None, force: bool, tools: dict[str, Any]
                  ) -> EngineResult:
    plan = job.plan
    fresh, inputs = _up_to_date(job, tools)
    if fresh and not force:
        return EngineResult(plan.role, backend, plan.output_dir, plan, job.info, "up to date")
    start = time.perf_counter()
    with atomic_directory(plan.output_dir, inputs=job.inputs) as tmp:
        if backend == "tensorrt":
            build_engine(plan, tmp, gpus)
            write_engine_info(tmp, job.info)
        else:
            write_reference_bundle(plan, job.facts, tmp)
        write_manifest(tmp, {
            "stage": "build", "role": plan.role, "settings": job.settings, "tools": tools,
            "inputs": inputs, "outputs": output_sizes(tmp),
        })
    return EngineResult(plan.role, backend, plan.output_dir, plan, job.info, "written", time.perf_counter() - start)


def _run_tensorrt(jobs: list[_Job], status: TensorrtStatus, parallel: int, force: bool, tools: dict[str, Any],
                  console: Console) -> list[EngineResult]:
    slots, gpu_sets = gpu_slices([job.plan for job in jobs], len(status.gpus), parallel)
    with Progress(SpinnerColumn(), TextColumn("[bold]{task.description}"), TimeElapsedColumn(),
                  console=console) as progress:
        tasks = {job.plan.role: progress.add_task(f"{job.plan.role} engine (queued)", total=1) for job in jobs}
        free: queue.SimpleQueue[int] = queue.SimpleQueue()  # GPU slots not in use
        for slot in range(slots):
            free.put(slot)

        def run(job: _Job) -> EngineResult:
            slot, task = free.get(), tasks[job.plan.role]
            try:
                gpus = ",".join(map(str, gpu_sets[slot]))
                progress.reset(task, description=f"{job.plan.role} engine building on GPU {gpus}")
                result = _build_one(job, "tensorrt", gpu_sets[slot], force, tools)
                progress.update(task, completed=1, description=f"{job.plan.role} engine {_WORDS[result.status]}")
                return result
            finally:
                free.put(slot)

        with ThreadPoolExecutor(max_workers=slots) as pool:
            return list(pool.map(run, jobs))  # in the jobs' order; the first failure is raised


def _checked_plans(spec: PipelineSpec, backend: str, status: TensorrtStatus | None, console: Console
                   ) -> tuple[dict[str, CheckpointFacts], list[BuildPlan]]:
    """Checkpoints read, plans made, every check run: warnings printed, all errors raised together."""
    facts, problems = _read_facts(spec)
    gpu, gpu_issues = _target_gpu(spec, status)
    problems += gpu_issues
    plans = plan_pipeline(spec, {role: facts.get(role) for role in engine_roles(spec)})
    memory = spec.build.gpu_memory_gb or (gpu.memory_gib if gpu is not None else None)
    problems += build_problems(spec, plans, facts, gpu, memory)
    if backend == "tensorrt":
        problems += window_warnings(plans, facts)
    if backend == "tensorrt" and status is not None and 0 < len(status.gpus) < spec.build.world_size:
        problems.append(BuildProblem("warning", f"the engines need tp_size x pp_size = {spec.build.world_size} "
                                     f"GPUs to serve; this machine shows {len(status.gpus)}"))
    for problem in problems:
        if problem.severity == "warning":
            console.print(f"[yellow]warning:[/] {escape(problem.message)}", highlight=False, soft_wrap=True)
    if any(problem.severity == "error" for problem in problems):
        raise BuildValidationError(spec.where, problems)
    for plan in plans:
        check_replaceable(plan.output_dir)
    return facts, plans


def window_warnings(plans: list[BuildPlan], facts: dict[str, CheckpointFacts]) -> list[BuildProblem]:
    """A sliding window shorter than a speculating engine's sequences: TensorRT-LLM keeps the last `window` tokens
    in a rolling KV buffer, and whether draft or tree verification (whose rejected tokens are written into that
    buffer too) keeps every key of the window is not something specbuild could check in TensorRT-LLM 1.2's sources;
    the reference runtime masks by position (tested against transformers)."""
    found = []
    for plan in plans:
        fact = facts.get(plan.role)
        window = attention_window(plan.engine_max_seq_len, fact) if fact is not None else None
        if window is not None and plan.max_draft_len:
            found.append(BuildProblem("warning", (
                f"{plan.role} engine: attention window {_windows(window)} (sliding_window) is shorter than its "
                f"sequences ({plan.engine_max_seq_len} tokens) and it verifies {plan.max_draft_len} draft tokens per "
                "step; "
                "TensorRT-LLM serves the window as a rolling KV cache (deploy sets max_attention_window_size), with "
                "speculative verification unverified by specbuild: compare its output on prompts longer than the "
                "window with the reference backend's before serving"), ("build", "max_input_len")))
    return found


def _windows(window: int | list[int]) -> str:
    """One window as a number, Gemma's per-layer period as TensorRT-LLM's README writes it ("8 8 8 8 8 320")."""
    return " ".join(map(str, window)) if isinstance(window, list) else str(window)


def build_pipeline(
    spec: PipelineSpec,
    *,
    backend: str | None = None,
    dry_run: bool = False,
    jobs: int = 1,
    force: bool = False,
    console: Console | None = None,
) -> list[EngineResult] | list[LlmApiResult]:
    """Build every engine `spec` needs into `engine_dir(spec, role)`; `backend` overrides `build.backend`.

    On `build.flow: pytorch` there is no engine: the one result is the LLM-API settings record (`build_llm_api`),
    and a `backend` is refused rather than ignored. Either list, never a mix: one flow per spec."""
    console = console or Console(stderr=True)
    if spec.build.flow == PYTORCH:
        if backend is not None:
            raise SpecbuildError(f"--backend {backend}: build.flow is pytorch, which builds no engine",
                                 hint="leave --backend out (the LLM API's backend is 'pytorch')")
        return [build_llm_api(spec, dry_run=dry_run, force=force, console=console)]
    refuse_other_flow(spec, "build")  # eagle3/ngram have no engine: the reason and `build.flow: pytorch`
    inputs = refuse_overlapping_engines(spec)
    requested = backend or spec.build.backend
    status: TensorrtStatus | None = None
    chosen = "reference"
    if requested != "reference" and not (dry_run and requested == "tensorrt"):
        chosen, status = resolve_backend(requested)
    elif requested == "tensorrt":
        chosen = "tensorrt"  # a dry run only writes the scripts for it; it needs no TensorRT-LLM here
    facts, plans = _checked_plans(spec, chosen, status, console)
    if dry_run:
        _print_plans(plans, chosen, console)
        results = []
        for plan in plans:
            info = plan.engine_info(facts[plan.role], "tensorrt")
            path = write_build_script(plan, info, spec.name, script_path(spec.output_dir, plan.role))
            results.append(EngineResult(plan.role, chosen, plan.output_dir, plan, info, "planned", script=path))
        return results
    tools = {**tool_versions(), "tensorrt_llm": status.version if status else None}
    work = []
    for plan in plans:
        info = plan.engine_info(facts[plan.role], chosen)
        settings: dict[str, Any] = {"backend": chosen, "plan": plan.to_json(), "engine": info.to_json()}
        if chosen == "tensorrt":
            settings["tensorrt_llm"] = tools["tensorrt_llm"]  # an engine only loads in the TRT-LLM that built it
        work.append(_Job(plan, facts[plan.role], info, settings, inputs))
    with ExitStack() as locks:  # every engine's lock before the first is written: a concurrent run stops this one
        for job in work:
            locks.enter_context(output_lock(job.plan.output_dir))
        if chosen == "tensorrt":
            assert status is not None
            return _run_tensorrt(work, status, jobs, force, tools, console)
        return [_build_one(job, "reference", None, force, tools) for job in work]
