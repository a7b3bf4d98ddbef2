"""The convert driver: plan and check everything, then stream tensors rank file by rank file.

Order matters for the user: every check that can fail (directory, config, headers, shapes, parallelism,
mapping coverage, a tied LM head against its embedding, the target's tokenizer files, the quantization plan and
its calibration text) runs before the output directory is touched, and for a spec (`convert_requests`) for every
model before any is written; the output is written to a temporary directory and swapped in whole, with
`manifest.json` last, under the output's lock (specbuild.atomic).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from specbuild.atomic import Inputs, atomic_directory, check_replaceable, output_lock, refuse_overlap
from specbuild.contracts.family_support import refusal_message
from specbuild.convert.architectures import Architecture, architecture_for
from specbuild.convert.compatibility import check_draft_target, tokenizer_problem
from specbuild.convert.hf_checkpoint import HFCheckpoint
from specbuild.convert.mapping import RankPlan, check_all_used, check_sources, plan_rank
from specbuild.convert.medusa import MedusaArchitecture, attach_heads
from specbuild.convert.quantize.plan import QuantPlan, plan_quantization
from specbuild.convert.quantize.settings import QuantizeSettings
from specbuild.convert.quantize.write import write_quantized
from specbuild.convert.request import ConversionPlan, ConvertRequest
from specbuild.convert.safetensors_writer import StreamingSafetensorsWriter
from specbuild.convert.self_draft import self_draft_architecture
from specbuild.convert.sharding import RowBlocks, ranks
from specbuild.dtypes import DTYPES, dtype_name, torch_dtype
from specbuild.errors import CheckpointError, SpecbuildError
from specbuild.manifest import (
    Status,
    fingerprint_files,
    is_fresh,
    output_sizes,
    read_manifest,
    tool_versions,
    write_manifest,
)
from specbuild.spec.fields import snapshot_commit

if TYPE_CHECKING:
    from specbuild.spec import PipelineSpec


@dataclass
class ConvertResult:
    """What one conversion did: `status` says whether it wrote the output, found it up to date, or only
    planned it (`--dry-run`)."""

    request: ConvertRequest
    architecture: str
    dtype: str
    status: Status = "written"
    seconds: float = 0.0
    files: dict[str, int] = field(default_factory=dict)

    def summary(self) -> str:
        r = self.request
        what = f"{r.name}: {self.architecture} {self.dtype} tp={r.tp_size} pp={r.pp_size}"
        if r.self_draft_layers is not None:
            what += f", self-draft: the first {r.self_draft_layers} layers of {r.source}"
        if r.quantization is not None and r.quantization.enabled:
            what += f" quantized {r.quantization.format}, kv cache {r.quantization.kv_cache}"
        if self.status == "up to date":
            return (f"{what} -> {r.output} is up to date (inputs, settings and tool versions unchanged; --force "
                    "redoes it)")
        if self.status == "planned":
            return f"{what} -> {r.output} (dry run: nothing written)"
        size = sum(self.files.values()) / 1e6
        return f"{what} -> wrote {r.output} ({len(self.files)} files, {size:.1f} MB) in {self.seconds:.1f} s"


def resolve_dtype(requested: str, arch: Architecture, checkpoint: HFCheckpoint) -> str:
    """`auto` keeps the checkpoint's dtype, float32 becoming float16 (TensorRT-LLM converters' default)."""
    if requested != "auto":
        if requested not in DTYPES:  # the spec's schema allows only known names; --dtype is checked here
            raise SpecbuildError(f"unknown dtype {requested!r}", hint=f"use auto or one of {', '.join(DTYPES)}")
        return requested
    declared = arch.source_dtype_name()
    if declared not in DTYPES:
        first = next(iter(checkpoint.infos.values()))
        declared = dtype_name(first.dtype) or "float16"
    return "float16" if declared == "float32" else declared


def plan_conversion(request: ConvertRequest, checkpoint: HFCheckpoint, *, read_values: bool = True) -> ConversionPlan:
    """All checks before anything is written; raises SpecbuildError naming what is wrong. Only headers and the
    config are read, except for the checks that need tensor data (a tied LM head against its embedding), which
    `read_values=False` skips (`specbuild validate` reads no weights)."""
    arch = architecture_for(checkpoint.config, checkpoint.directory / "config.json")
    if request.medusa_heads is not None:
        arch = with_medusa_heads(arch, checkpoint, request)
    if request.self_draft_layers is not None:
        arch = self_draft_architecture(arch, checkpoint, request)
    arch.bind_sources(set(checkpoint.infos))
    problems = arch.parallelism_problems(request.tp_size, request.pp_size)
    if problems:
        raise SpecbuildError(
            f"{request.source}: cannot shard this model as tp={request.tp_size} pp={request.pp_size}: "
            + "; ".join(problems),
            hint="pick tp/pp that divide the model's head counts and sizes",
        )
    expected_sources = arch.source_shapes()
    check_sources(str(request.source), checkpoint.infos, expected_sources, arch.is_ignored, "config.json")
    plans = []
    for rank in ranks(request.tp_size, request.pp_size, arch.num_layers):
        plans.append(plan_rank(rank, arch.mapping(rank), checkpoint.infos))
    check_all_used(plans, expected_sources)
    if read_values:
        arch.check_source_values(checkpoint)
    dtype = resolve_dtype(request.dtype, arch, checkpoint)
    return ConversionPlan(arch, dtype, arch.trtllm_config(dtype, request.tp_size, request.pp_size), plans)


def with_medusa_heads(arch: Architecture, checkpoint: HFCheckpoint, request: ConvertRequest) -> Architecture:
    """Wrap a base with the heads of `request.medusa_heads`; the bases TensorRT-LLM 1.2's MedusaForCausalLM
    takes are `specbuild.contracts.family_support`'s, which refuses the others with the engine's reason."""
    assert request.medusa_heads is not None
    refused = refusal_message(arch.hf_architecture, "medusa", "engine", request.source)
    if refused is not None:
        raise SpecbuildError(refused)
    heads, layers = attach_heads(checkpoint, request.medusa_heads, allow_pickle=request.allow_pickle)
    return MedusaArchitecture(arch, heads, layers, request.medusa_tree_nodes)


def _settings(request: ConvertRequest, plan: ConversionPlan) -> dict[str, Any]:
    settings = _base_settings(request, plan)
    hub = snapshot_commit(request.source)
    if hub is not None:  # a Hub id's snapshot: its commit, so a moved branch makes the output stale
        settings["hub"] = hub
    if request.self_draft_layers is not None:  # only then, so other conversions' manifests stay as they were
        settings["self_draft_layers"] = request.self_draft_layers
    if request.self_draft_adapter is not None:
        settings["self_draft_adapter"] = str(request.self_draft_adapter.resolve())
    return settings


def _base_settings(request: ConvertRequest, plan: ConversionPlan) -> dict[str, Any]:
    return {
        "architecture": plan.config["architecture"],
        "dtype": plan.dtype,
        "tp_size": request.tp_size,
        "pp_size": request.pp_size,
        "source": str(request.source.resolve()),
        "medusa_heads": str(request.medusa_heads.resolve()) if request.medusa_heads else None,
        "max_draft_len": request.medusa_tree_nodes if request.medusa_heads else None,  # the manifest's key
    }


def _write_rank(
    checkpoint: HFCheckpoint, plan: RankPlan, dtype: torch.dtype, path: Path, progress: Progress
) -> None:
    layout = [(name, plan.dtype_of(name, dtype), shape) for name, shape in plan.shapes.items()]
    task = progress.add_task(plan.filename, total=plan.nbytes(dtype))
    with StreamingSafetensorsWriter(path, layout, metadata={"format": "pt"}) as writer:
        for name, rule in plan.rules.items():
            sources = [checkpoint.tensor(s) for s in rule.sources]
            tensor_dtype = plan.dtype_of(name, dtype)
            out = rule.combine(*sources).to(tensor_dtype)
            blocks = out.blocks if isinstance(out, RowBlocks) else [out]
            # A block that is still a slice of a source file is copied file to file; the rest is written.
            pieces = [checkpoint.span_of(block) or block for block in blocks]
            writer.write_pieces(name, tensor_dtype, plan.shapes[name], pieces)
            progress.advance(task, out.shape.numel() * tensor_dtype.itemsize)
            del out, blocks, pieces, sources
            for source in rule.sources:
                checkpoint.release(source)


def _plan_table(request: ConvertRequest, plan: ConversionPlan) -> Table:
    table = Table(title=f"{request.name}: {plan.arch.hf_architecture} -> {request.output}")
    for column in ("file", "tensors", "MB", "layers"):
        table.add_column(column)
    for rp in plan.rank_plans:
        mb = rp.nbytes(DTYPES[plan.dtype]) / 1e6
        layers = f"{rp.rank.layers.start}-{rp.rank.layers.stop - 1}" if len(rp.rank.layers) else "-"
        table.add_row(rp.filename, str(len(rp.shapes)), f"{mb:.1f}", layers)
    return table


@dataclass
class PreparedConversion:
    """One conversion with every check done and nothing written yet (the checkpoint stays open)."""

    request: ConvertRequest
    checkpoint: HFCheckpoint
    plan: ConversionPlan
    qplan: QuantPlan | None
    settings: dict[str, Any]
    input_files: list[Path]
    result: ConvertResult

    @property
    def output_bytes(self) -> int | None:
        """What the unquantized rank files take (None for a quantized draft, whose size ModelOpt decides)."""
        if self.qplan is not None:
            return None
        return sum(rp.nbytes(DTYPES[self.plan.dtype]) for rp in self.plan.rank_plans)

    def close(self) -> None:
        self.checkpoint.close()


def prepare_conversion(request: ConvertRequest) -> PreparedConversion:
    """Open the checkpoint and run every check a conversion makes (headers, shapes, mapping coverage, tied head,
    tokenizer where the request needs one, the quantization plan and its calibration text, the output). An output
    that is, contains or lies inside one of the inputs is refused first, before anything is read."""
    refuse_overlap(request.output, request.named_inputs(), output_name=request.output_name)
    checkpoint = HFCheckpoint(request.source, allow_pickle=request.allow_pickle)
    try:
        plan = plan_conversion(request, checkpoint)
        if request.needs_tokenizer:
            problem = tokenizer_problem(request.source)
            if problem is not None:
                raise CheckpointError(problem[0], hint=problem[1])
        quantized = request.quantization is not None and request.quantization.enabled
        # Everything a quantized conversion needs is checked here; ModelOpt is imported only when it runs.
        qplan = plan_quantization(request, plan) if quantized else None
        result = ConvertResult(request, plan.config["architecture"], qplan.dtype if qplan else plan.dtype)
        check_replaceable(request.output)
        settings = _settings(request, plan)
        input_files = list(checkpoint.input_files)
        if qplan is not None:
            settings.update(dtype=qplan.dtype, quantization=qplan.manifest_settings())
            input_files += qplan.calibration.files
    except BaseException:
        checkpoint.close()
        raise
    return PreparedConversion(request, checkpoint, plan, qplan, settings, input_files, result)


def write_conversion(prepared: PreparedConversion, *, force: bool = False, dry_run: bool = False,
                     console: Console | None = None) -> ConvertResult:
    """Write one prepared conversion (or print its plan), under its output's lock; skipped when the manifest
    says the output is what these inputs, settings and tools make."""
    console = console or Console(stderr=True)
    request, plan, qplan, result = prepared.request, prepared.plan, prepared.qplan, prepared.result
    if dry_run:
        console.print(_plan_table(request, plan))
        if qplan is not None:
            console.print(f"{request.name}: quantize with ModelOpt: {qplan.describe()}")
        result.status = "planned"
        return result
    tools = tool_versions()
    with output_lock(request.output):
        previous = read_manifest(request.output)
        known = (previous or {}).get("inputs")  # hashes to reuse for files whose stat is unchanged
        if previous and not force and previous.get("settings") == prepared.settings and previous.get("tools") == tools:
            inputs = fingerprint_files(prepared.input_files, known)
            if is_fresh(previous, settings=prepared.settings, tools=tools, inputs=inputs, directory=request.output):
                result.status = "up to date"
                return result
            known = inputs  # already hashed: the write below must not hash them again
        start = time.perf_counter()
        # Hash the inputs on a second thread while the main thread converts (hashlib releases the GIL).
        with ThreadPoolExecutor(max_workers=1) as pool:
            hashing = pool.submit(fingerprint_files, prepared.input_files, known)
            with atomic_directory(request.output, needed_bytes=prepared.output_bytes,
                                  inputs=request.named_inputs()) as tmp:
                if qplan is not None:
                    write_quantized(request, plan, qplan, tmp, console)
                else:
                    (tmp / "config.json").write_text(json.dumps(plan.config, indent=2) + "\n")
                    with Progress(
                        TextColumn("[bold]{task.description}"), BarColumn(), DownloadColumn(),
                        TimeRemainingColumn(), console=console, transient=True,
                    ) as progress:
                        for rank_plan in plan.rank_plans:
                            _write_rank(prepared.checkpoint, rank_plan, torch_dtype(plan.dtype),
                                        tmp / rank_plan.filename, progress)
                result.files = output_sizes(tmp)
                write_manifest(
                    tmp,
                    {
                        "stage": "convert",
                        "settings": prepared.settings,
                        "tools": tools,
                        "inputs": hashing.result(),
                        "outputs": result.files,
                    },
                )
    result.seconds = time.perf_counter() - start
    return result


def convert_checkpoint(
    request: ConvertRequest,
    *,
    force: bool = False,
    dry_run: bool = False,
    console: Console | None = None,
) -> ConvertResult:
    """Convert one HF checkpoint directory into a TensorRT-LLM checkpoint directory."""
    prepared = prepare_conversion(request)
    try:
        return write_conversion(prepared, force=force, dry_run=dry_run, console=console)
    finally:
        prepared.close()


def convert_requests(
    requests: list[ConvertRequest],
    *,
    where: str | None = None,
    pair_problems: list[tuple[str, str | None]] | None = None,
    force: bool = False,
    dry_run: bool = False,
    console: Console | None = None,
    on_result: Callable[[ConvertResult], None] | None = None,
) -> list[ConvertResult]:
    """Convert several checkpoints (a spec's target, draft and Medusa checkpoint): every one is checked before
    any is written, and every problem of every model (and `pair_problems`, the draft/target pair's) is reported
    together, headed by `where` (the spec file); the outputs are locked together before the first write, so a
    concurrent run on any of them stops this one before it has written anything."""
    prepared: list[PreparedConversion] = []
    problems: list[tuple[str, str | None]] = list(pair_problems or [])
    try:
        for request in requests:
            try:
                prepared.append(prepare_conversion(request))
            except SpecbuildError as err:
                problems.append((f"the {request.name} model: {err.message}", err.hint))
        if problems:
            hints = list(dict.fromkeys(hint for _, hint in problems if hint))
            head = f"{where}: " if where else ""
            if len(problems) == 1:
                text = problems[0][0]
                raise SpecbuildError(f"{head}converting {text}" if where else text.split(": ", 1)[1],
                                     hint=hints[0] if hints else None)
            raise SpecbuildError(
                f"{head}{len(problems)} problems found before converting anything:\n"
                + "\n".join(f"  - {text}" for text, _ in problems),
                hint="; ".join(hints) if hints else None,
            )
        results = []
        with ExitStack() as locks:
            if not dry_run:
                for item in prepared:
                    locks.enter_context(output_lock(item.request.output))
            for item in prepared:
                try:
                    result = write_conversion(item, force=force, dry_run=dry_run, console=console)
                except SpecbuildError as err:
                    if where is not None:
                        err.message = f"{where}: converting the {item.request.name} model: {err.message}"
                    raise
                results.append(result)
                if on_result is not None:
                    on_result(result)
        return results
    finally:
        for item in prepared:
            item.close()


def spec_requests(spec: PipelineSpec, *, allow_pickle: bool = False
                  ) -> tuple[list[ConvertRequest], list[tuple[str, str | None]]]:
    """The spec's requests and the problems of the draft/target pair as (message, hint), to be reported with every
    model's problems."""
    pair: list[tuple[str, str | None]] = []
    if spec.draft is not None and spec.draft.model is not None:  # a self-draft shares the target's by construction
        try:
            check_draft_target(spec.target.model, spec.draft.model, allow_pickle=allow_pickle)
        except SpecbuildError as err:
            pair.append((err.message, err.hint))
    return _requests(spec, allow_pickle=allow_pickle), pair


def requests_from_spec(spec: PipelineSpec, *, allow_pickle: bool = False) -> list[ConvertRequest]:
    """The target and (when the spec has them) the draft and the Medusa checkpoint, with the spec's dtype and
    parallelism. A draft is first checked against the target: a bad pair would only fail at serving time."""
    if spec.draft is not None and spec.draft.model is not None:  # a self-draft shares the target's by construction
        check_draft_target(spec.target.model, spec.draft.model, allow_pickle=allow_pickle)
    return _requests(spec, allow_pickle=allow_pickle)


def spec_inputs(spec: PipelineSpec) -> Inputs:
    """Every file and directory the spec names for convert to read, by its field: no checkpoint convert writes may
    be, contain or lie inside one of them (the atomic swap would delete or change it)."""
    draft, medusa = spec.draft, spec.medusa
    calibration = draft.quantization.calib.source if draft is not None else None
    return {
        "target.model": spec.target.model,
        "draft.model": draft.model if draft is not None else None,
        "draft.adapter": draft.adapter if draft is not None else None,
        "draft.quantization.calib.source": calibration if isinstance(calibration, Path) else None,
        "medusa.heads": medusa.heads if medusa is not None else None,
        "medusa.choices": medusa.choices_file if medusa is not None else None,
        "SPEC": _spec_file(spec),
    }


def _spec_file(spec: PipelineSpec) -> Path | None:
    try:
        return spec.path
    except RuntimeError:  # a spec made in memory has no file
        return None


def checkpoint_output_name(role: str) -> str:
    """How a refusal names the checkpoint convert writes for `role` (output_dir is the field the user changes)."""
    return f"output_dir's {role} checkpoint"


def _requests(spec: PipelineSpec, *, allow_pickle: bool = False) -> list[ConvertRequest]:
    build = spec.build
    common: dict[str, Any] = {"dtype": build.dtype, "tp_size": build.tp_size, "pp_size": build.pp_size,
                              "allow_pickle": allow_pickle, "inputs": tuple(spec_inputs(spec).items())}
    # The target's tokenizer is what deploy puts into the repository: a target without one is refused here.
    requests = [ConvertRequest("target", spec.target.model, spec.checkpoint_dir("target"), needs_tokenizer=True,
                               output_name=checkpoint_output_name("target"), **common)]
    if spec.draft is not None:
        quantization = QuantizeSettings.from_spec(spec.draft.quantization)
        # A self-draft is read from the target's HF directory, keeping its first draft.layers layers.
        self_draft = spec.draft.is_self_draft
        source = spec.target.model if self_draft else spec.draft.model
        assert source is not None  # the schema requires draft.model unless draft.source is target_layers
        requests.append(
            ConvertRequest(
                "draft", source, spec.checkpoint_dir("draft"),
                quantization=quantization if quantization.enabled else None,
                self_draft_layers=spec.draft.layers if self_draft else None,
                self_draft_adapter=spec.draft.adapter if self_draft else None,
                output_name=checkpoint_output_name("draft"), **common,
            )
        )
    if spec.medusa is not None:
        requests.append(
            ConvertRequest(
                "medusa", spec.target.model, spec.checkpoint_dir("medusa"), medusa_heads=spec.medusa.heads,
                medusa_tree_nodes=len(spec.medusa.resolved_choices()), needs_tokenizer=True,
                output_name=checkpoint_output_name("medusa"), **common,
            )
        )
    return requests
