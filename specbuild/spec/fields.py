"""Field types the spec sections share: paths anchored at the spec file's directory, counts and ports.

Relative paths are resolved once, here, against the spec file's directory (the working directory for in-memory
specs), so a spec means the same from any working directory and no later stage resolves a path again.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, BeforeValidator, Field, Strict, ValidationInfo

from specbuild.spec.problems import custom_error, show


def spec_path_from(context: object) -> Path | None:
    """The spec file's absolute path, which the loader passes as validation context (`spec_path`)."""
    if isinstance(context, dict) and isinstance(context.get("spec_path"), Path):
        return context["spec_path"]
    return None


def base_dir(context: object) -> Path:
    """Where relative paths start: the spec file's directory (the working directory for in-memory specs)."""
    spec_path = spec_path_from(context)
    return spec_path.parent if spec_path is not None else Path.cwd()


def resolve(value: Path, base: Path) -> Path:
    # normpath, not resolve(): keep the user's symlinks and do not touch the filesystem.
    return Path(os.path.normpath(base / value.expanduser()))


def _check_path_input(value: object) -> object:
    if isinstance(value, os.PathLike) or (isinstance(value, str) and value.strip()):
        return value
    raise custom_error("path_type", f"must be a non-empty path (got {show(value)})")


def _resolve_path(value: Path, info: ValidationInfo) -> Path:
    """Anchor a relative path at the spec's directory, so the spec means the same from any working dir."""
    return resolve(value, base_dir(info.context))


SpecPath = Annotated[Path, BeforeValidator(_check_path_input), AfterValidator(_resolve_path)]
Count = Annotated[int, Strict(), Field(ge=1)]
Port = Annotated[int, Strict(), Field(ge=1, le=65535)]
