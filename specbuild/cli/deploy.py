"""`specbuild deploy`: write the Triton model repository or the Dynamo deployment of a built pipeline, or check an
existing repository."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from specbuild.cli.errors import console, handled_errors
from specbuild.cli.options import DryRun, Force, OptionalSpec
from specbuild.errors import SpecbuildError


def deploy(
    spec_path: OptionalSpec = None,
    check: Annotated[
        Path | None,
        typer.Option("--check", help="Re-validate an existing model repository instead.", metavar="REPOSITORY"),
    ] = None,
    force: Force = False,
    dry_run: DryRun = False,
) -> None:
    """Write what serves a built pipeline, by the spec's deploy.target: the Triton model repository, or the NVIDIA
    Dynamo deployment; or check a Triton repository with `--check REPOSITORY`.

    Triton (the default target): the model repository (preprocessing, tensorrt_llm[_draft], tensorrt_llm_bls,
    postprocessing, ensemble); for TensorRT-LLM engines also `<output_dir>/k8s/tritonserver.yaml`, a Kubernetes
    Deployment and Service running the same tritonserver launch as `specbuild serve` (mpirun for tp×pp > 1) on the
    GPUs the engines need, ready on /v2/health/ready (`deploy.kubernetes`: the volume claim and the image).

    Dynamo (`deploy.target: dynamo`): `<output_dir>/dynamo/` with launch.json (what `specbuild serve` starts:
    Dynamo's frontend on deploy.http_port and the reference workers), launch.sh (the same on a GPU host), the
    engine settings, and a Kubernetes DynamoGraphDeployment."""
    from specbuild.deploy.check import check_repository

    out = Console(width=max(Console().width, 132))  # the wiring table is unreadable folded into 80 columns
    with handled_errors():
        if (spec_path is None) == (check is None):
            raise SpecbuildError("give either a pipeline spec or --check REPO (not both, not neither)",
                                 hint="`specbuild deploy pipeline.yaml` or `specbuild deploy --check REPO`")
        if check is not None:
            report = check_repository(check)
            if report.models:
                out.print(report.table())
            report.raise_for_problems()
            console.print(f"ok: {check} ({len(report.models)} models)", highlight=False, soft_wrap=True)
            return
        from specbuild.deploy.repository import DeployResult, deploy_repository
        from specbuild.spec import load_spec

        assert spec_path is not None
        spec = load_spec(spec_path)
        if spec.deploy.target == "dynamo":  # NVIDIA Dynamo's launch and DynamoGraphDeployment (specbuild.dynamo)
            from specbuild.dynamo.write import deploy_dynamo

            console.print(deploy_dynamo(spec, dry_run=dry_run, force=force, console=console).summary(),
                          highlight=False, soft_wrap=True)
            return
        result = deploy_repository(spec, dry_run=dry_run, force=force, console=console)
        # The check deploy ran on what it wrote (None for a dry run; the llmapi repository has no ensemble to check)
        if isinstance(result, DeployResult) and result.report is not None:
            out.print(result.report.table())
        console.print(result.summary(), highlight=False, soft_wrap=True)
        if isinstance(result, DeployResult) and not dry_run:  # TensorRT-LLM engines: tritonserver on Kubernetes
            from specbuild.serve.kubernetes import write_kubernetes

            try:
                written = write_kubernetes(spec, result.repository)
            except SpecbuildError as err:  # the repository stands; only its manifests could not be written
                console.print(f"[yellow]warning:[/] no Kubernetes manifests: {escape(str(err))}", highlight=False,
                              soft_wrap=True)
            else:
                if written is not None:
                    console.print(f"Kubernetes: {written} (Deployment and Service; `kubectl apply -f` it)",
                                  highlight=False, soft_wrap=True)
