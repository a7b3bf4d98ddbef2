"""A spec file -> a validated PipelineSpec, or one SpecValidationError listing every problem with its line.

Reads the file, parses the YAML with its line map, validates against the schema and turns pydantic's errors
into located problems. The mode checks also run on the raw data when validation fails elsewhere, so a missing
`draft:` is reported together with a type error in `build:`, not one run later.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from specbuild.errors import SpecError
from specbuild.spec.describe import problems_from, problems_from_issues
from specbuild.spec.problems import SpecProblem, SpecValidationError, sorted_problems
from specbuild.spec.schema import PipelineSpec, raw_mode_issues
from specbuild.spec.yaml_lines import LineMap, parse_yaml


def _read_spec_text(path: Path, shown: str) -> str:
    hint = f"`specbuild init {shown}` writes a commented starter spec"
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(f"{shown}: no such file", hint=hint) from None
    except IsADirectoryError:
        raise SpecError(f"{shown}: is a directory, not a spec file") from None
    except UnicodeDecodeError as err:
        raise SpecError(f"{shown}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    except OSError as err:
        raise SpecError(f"{shown}: cannot read ({err.strerror})") from None


def parse_spec(
    data: Any, spec_path: str | os.PathLike[str], *, _lines: LineMap | None = None
) -> PipelineSpec:
    """Validate already-parsed spec data as if it came from `spec_path` (paths resolve against its dir)."""
    shown = os.fspath(spec_path)
    lines = _lines if _lines is not None else LineMap(None)
    if not isinstance(data, dict):
        what = "empty" if data is None else f"a {type(data).__name__}"
        raise SpecValidationError(
            [SpecProblem((), f"the spec must be a mapping (name:, target:, build:, ...); it is {what}", 1)],
            shown,
            hint=f"`specbuild init {shown}` writes a commented starter spec",
        )
    problems = list(lines.duplicates)
    spec = None
    try:
        spec = PipelineSpec.model_validate(data, context={"spec_path": Path(os.path.abspath(spec_path))})
    except ValidationError as err:
        problems += problems_from(err, lines)
        raw = problems_from_issues((), raw_mode_issues(data), lines)
        problems += [problem for problem in raw if problem not in problems]
    if problems or spec is None:
        unknown = any(p.message.startswith("unknown key") for p in problems)
        hint = "`specbuild init starter.yaml` writes a spec that explains every key" if unknown else None
        raise SpecValidationError(sorted_problems(problems), shown, hint=hint)
    spec._lines = lines
    return spec


def load_spec(path: str | os.PathLike[str]) -> PipelineSpec:
    """Read, validate and resolve a pipeline spec; raises SpecError listing every problem with its line."""
    shown = os.fspath(path)
    data, lines = parse_yaml(_read_spec_text(Path(path), shown), shown)
    return parse_spec(data, path, _lines=lines)
