"""`specbuild demo-models`: the small offline models the demo and the tests run on."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from specbuild.cli.errors import console, handled_errors


def demo_models(
    out_dir: Annotated[Path, typer.Argument(help="Directory for the demo models (created).", metavar="DIR")],
    force: Annotated[bool, typer.Option("--force", help="Rebuild even if a complete copy is cached.")] = False,
) -> None:
    """Create small demo models offline: a tokenizer, a trained Llama target and draft, and untrained Qwen2,
    Mistral and GPT-2 checkpoints, then the artifacts trained on the target (specbuild.demo.extras: each cached on
    its own). A complete earlier build in DIR is reused."""
    from specbuild.demo.extras import build_all_extras
    from specbuild.demo.models import build_demo_models

    with handled_errors():
        built = build_demo_models(out_dir, force=force)
        built.update(build_all_extras(out_dir, force=force))
    for name, path in built.items():
        console.print(f"{name:13s} {path}", highlight=False, soft_wrap=True)
