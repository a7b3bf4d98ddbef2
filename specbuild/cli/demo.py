"""`specbuild demo-models`: the small offline models the demo and the tests run on."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from specbuild.cli.errors import console, handled_errors

EXTRAS_HELP = ("Which extras to train: 'all' (the default), 'none', or a comma-separated list (eagle3-draft, "
               "medusa2, self-draft-adapter: on the demo target; qwen3: a Qwen3 target and draft of their own). "
               "`make demo` needs none; each `make demo-<method>` asks for its own.")


def demo_models(
    out_dir: Annotated[Path, typer.Argument(help="Directory for the demo models (created).", metavar="DIR")],
    extras: Annotated[str, typer.Option("--extras", help=EXTRAS_HELP, metavar="LIST")] = "all",
    force: Annotated[bool, typer.Option("--force", help="Rebuild even if a complete copy is cached.")] = False,
) -> None:
    """Create small demo models offline: a tokenizer, a trained Llama target and draft with Medusa heads, and
    untrained Qwen2, Mistral and GPT-2 checkpoints, then the extras trained on the target that --extras asks for
    (specbuild.demo.extras: each cached on its own). A complete earlier build in DIR is reused."""
    from specbuild.demo.extras import build_extras, check_extra_names, known_extras
    from specbuild.demo.models import build_demo_models

    with handled_errors():
        wanted = _extra_names(extras, known_extras())
        check_extra_names(wanted)  # before the base build's minutes
        built = build_demo_models(out_dir, force=force)
        built.update(build_extras(out_dir, wanted, force=force))
    for name, path in built.items():
        console.print(f"{name:18s} {path}", highlight=False, soft_wrap=True)


def _extra_names(option: str, known: list[str]) -> list[str]:
    """--extras as a list of names ('all' and 'none' are words for every and no extra); unknown names are refused
    by `check_extra_names` before anything is trained."""
    words = [word.strip() for word in option.split(",") if word.strip()]
    if words == ["all"]:
        return known
    if words in ([], ["none"]):
        return []
    return list(dict.fromkeys(words))
