"""`specbuild validate` and `specbuild build`: every build check without writing, then the engines."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from specbuild.cli.errors import console, handled_errors
from specbuild.cli.options import Force, Spec
from specbuild.errors import SpecbuildError

BACKENDS = ("auto", "tensorrt", "reference")


def validate(spec_path: Spec) -> None:
    """Check a spec and everything it names, without loading weights or writing anything. Checked: the schema;
    every model's directory, config.json, weight headers and shapes, tp/pp, the draft/target pair, the target's
    tokenizer files, the Medusa heads and tree, the draft's quantization (format vs build.gpu, int4 alignment,
    calibration text); that the draft is the kind the mode needs and fits the target (an EAGLE-3 draft's width,
    vocabulary and capture layers, Medusa heads' and a self-draft adapter's shapes); then every build check on
    the checkpoints convert would write.

    All problems are reported together, each at its spec file:line; then what the spec resolves to is printed.
    """
    from specbuild.build.validate import planned_problems, with_fit_findings
    from specbuild.contracts.llm_api import flow_problems, pytorch_flow_problems
    from specbuild.contracts.model_fit import draft_findings
    from specbuild.convert.preflight import check_models
    from specbuild.spec import load_spec, summarize_spec

    with handled_errors():
        spec = load_spec(spec_path)
        findings = [("error", loc, message) for loc, message in flow_problems(spec)]
        if spec.build.flow == "pytorch":  # no engine: the LLM-API checks; the models as convert reads them
            findings = [("error", loc, message) for loc, message in pytorch_flow_problems(spec)]
            models = [] if spec.speculative.mode == "eagle3" else check_models(spec)[0]  # (an EAGLE-3 draft: never)
            findings += with_fit_findings(spec, models, draft_findings(spec))
        elif not findings:
            models, configs = check_models(spec)
            findings = with_fit_findings(spec, models, draft_findings(spec))
            for problem in planned_problems(spec, configs):
                findings.append((problem.severity, problem.field or ("build",), problem.message))
        unique = list(dict.fromkeys(findings))  # a Medusa checkpoint's base is the target: said once
        warnings = [(loc, message) for severity, loc, message in unique if severity == "warning"]
        errors = [(loc, message) for severity, loc, message in unique if severity == "error"]
        if warnings:
            located = spec.problems_error(warnings)
            for problem in located.problems:
                console.print(f"[yellow]warning:[/] {escape(problem.render(located.file))}", highlight=False,
                              soft_wrap=True)
        if errors:
            raise spec.problems_error(errors, hint="fix these, then validate again; `convert` and `build` would "
                                      "stop on each of them")
    Console().print(summarize_spec(spec))


def build(
    spec_path: Spec,
    backend: Annotated[
        str | None,
        typer.Option(
            "--backend",
            help="auto|tensorrt|reference (default: the spec's build.backend). auto = tensorrt where tensorrt_llm "
            "imports and a GPU is visible, else reference.",
        ),
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="Check everything, print the trtllm-build plans and write a build.sh per "
                     "engine (runs unchanged in the TensorRT-LLM 1.2 container); build nothing."),
    ] = False,
    jobs: Annotated[int, typer.Option("--jobs", min=1, help="Engines built at once (tensorrt; GPUs permitting).")] = 1,
    force: Force = False,
) -> None:
    """Build the engines a spec needs from its converted checkpoints: TensorRT-LLM engines (trtllm-build) on a
    GPU machine with TensorRT-LLM 1.2, reference bundles for specbuild's PyTorch runtime elsewhere.

    Every check (checkpoint vs spec, Medusa tree, limits, GPU generation vs quantization, memory) runs first,
    and all problems are reported together before any build starts.
    """
    from specbuild.build import build_pipeline
    from specbuild.spec import load_spec

    with handled_errors():
        if backend is not None and backend not in BACKENDS:
            raise SpecbuildError(f"--backend {backend}: expected auto, tensorrt or reference")
        spec = load_spec(spec_path)
        results = build_pipeline(spec, backend=backend, dry_run=dry_run, jobs=jobs, force=force, console=console)
    for result in results:
        console.print(result.summary(), highlight=False, soft_wrap=True)
