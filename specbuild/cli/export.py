"""`specbuild export vllm|sglang SPEC`: the serve command and config of another engine for the same pipeline."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from specbuild.cli.errors import console, handled_errors
from specbuild.cli.help import App
from specbuild.cli.options import DryRun, Spec

export_app = App(help="Serve the same pipeline with vLLM or SGLang: write that engine's serve command and config.")

Output = Annotated[
    Path | None,
    typer.Option("--output", metavar="DIR", help="Export directory (default: <output_dir>/export/<engine>)."),
]


def _export(engine: str, spec_path: Path, output: Path | None, dry_run: bool) -> None:
    from specbuild.export import export_spec
    from specbuild.spec import load_spec

    with handled_errors():
        spec = load_spec(spec_path)
        result = export_spec(spec, engine, output, dry_run=dry_run)
        plan = result.plan
        for note in plan.notes:
            console.print(f"[yellow]note:[/] {note}", highlight=False, soft_wrap=True)
        if dry_run:
            typer.echo(plan.command())
            for name, text in plan.files.items():
                typer.echo(f"\n# {name}\n{text}", nl=False)
            return
        console.print(f"{engine}: wrote {result.directory} (run {result.directory / 'serve.sh'})", highlight=False,
                      soft_wrap=True)


@export_app.command("vllm")
def export_vllm(spec_path: Spec, output: Output = None, dry_run: DryRun = False) -> None:
    """Write `vllm serve TARGET --speculative-config JSON` (draft_model, eagle3 or ngram) with tp, max model length
    and max sequences from the spec; Medusa and Lookahead are refused (vLLM 0.33 has neither) with what to use
    instead."""
    _export("vllm", spec_path, output, dry_run)


@export_app.command("sglang")
def export_sglang(spec_path: Spec, output: Output = None, dry_run: DryRun = False) -> None:
    """Write `python -m sglang.launch_server` with `--speculative-algorithm` (STANDALONE for a draft, EAGLE3,
    NGRAM) and the same flags as the YAML `--config` reads; a Medusa spec is refused, SGLang has no Medusa."""
    _export("sglang", spec_path, output, dry_run)
