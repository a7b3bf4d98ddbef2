"""`specbuild init`: the commented starter spec a new pipeline begins from."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from specbuild.cli.errors import console, handled_errors


def init(
    path: Annotated[
        Path, typer.Argument(help="Where to write the starter spec, e.g. pipeline.yaml.", metavar="PATH")
    ] = Path("pipeline.yaml"),
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing file.")] = False,
) -> None:
    """Write a commented starter pipeline spec that you then edit."""
    from specbuild.spec import write_starter_spec

    with handled_errors():
        write_starter_spec(path, force=force)
    console.print(f"wrote {path}; edit it, then run `specbuild validate {path}`")
