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
AllowPickle = Annotated[
    bool, typer.Option("--allow-pickle", help="Read Medusa heads from a pickled .pt file (runs code; trusted only).")
]


def _export(engine: str, spec_path: Path, output: Path | None, dry_run: bool, allow_pickle: bool) -> None:
    from specbuild.atomic import refuse_overlap
    from specbuild.export import default_directory, export_spec
    from specbuild.export.write import export_inputs
    from specbuild.spec import load_spec

    with handled_errors():
        spec = load_spec(spec_path)
        directory, name = (output, "--output") if output is not None else (default_directory(spec, engine),
                                                                           "output_dir's export directory")
        refuse_overlap(directory, export_inputs(spec), output_name=name)  # before the heads are read or converted
        result = export_spec(spec, engine, output, dry_run=dry_run, allow_pickle=allow_pickle)
        plan = result.plan
        for note in plan.notes:
            console.print(f"[yellow]note:[/] {note}", highlight=False, soft_wrap=True)
        if dry_run:
            typer.echo(plan.command())
            for name, text in plan.files.items():
                typer.echo(f"\n# {name}\n{text}", nl=False)
            if plan.medusa is not None:
                typer.echo(f"\n# medusa/ ({len(plan.medusa.tensors)} tensors from {plan.medusa.source})")
            return
        console.print(f"{engine}: wrote {result.directory} (run {result.directory / 'serve.sh'})", highlight=False,
                      soft_wrap=True)


@export_app.command("vllm")
def export_vllm(spec_path: Spec, output: Output = None, dry_run: DryRun = False,
                allow_pickle: AllowPickle = False) -> None:
    """Write `vllm serve TARGET --speculative-config JSON` (draft_model, eagle3, ngram, or medusa with the heads
    converted to vLLM's Medusa checkpoint) with tp, max model length and max sequences from the spec."""
    _export("vllm", spec_path, output, dry_run, allow_pickle)


@export_app.command("sglang")
def export_sglang(spec_path: Spec, output: Output = None, dry_run: DryRun = False) -> None:
    """Write `python -m sglang.launch_server` with `--speculative-algorithm` (STANDALONE for a draft, EAGLE3,
    NGRAM) and the same flags as the YAML `--config` reads; a Medusa spec is refused, SGLang has no Medusa."""
    _export("sglang", spec_path, output, dry_run, False)
