"""The commented starter spec `specbuild init` writes: every key, its default and why (templates/starter.yaml)."""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

from specbuild.atomic import replace_text
from specbuild.errors import SpecError


def starter_spec_text() -> str:
    """The commented starter spec shipped in the package (templates/starter.yaml)."""
    template = resources.files("specbuild").joinpath("templates").joinpath("starter.yaml")
    return template.read_text(encoding="utf-8")


def write_starter_spec(path: str | os.PathLike[str], force: bool = False) -> Path:
    """Write the starter spec to `path`; never replaces an existing file unless `force`."""
    target = Path(path)
    if target.is_dir():
        raise SpecError(f"{target}: is a directory", hint=f"give a file, e.g. {target / 'pipeline.yaml'}")
    if target.exists() and not force:
        raise SpecError(f"{target}: already exists; not overwriting it", hint="pass --force to replace it")
    replace_text(target, starter_spec_text())  # never a truncated spec; a link is written through
    return target
