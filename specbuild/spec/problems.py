"""What a spec problem is, and how validators report several located problems through one pydantic error.

The bottom of the package: the schema's validators raise these, the loader locates and renders them. Every
problem carries its dotted field path, so the loader can put the file's line next to it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NoReturn

from pydantic_core import PydanticCustomError

from specbuild.errors import SpecError

Loc = tuple[str | int, ...]
"""A field path as pydantic writes it: `("medusa", "choices", 3)`."""

Issue = tuple[Loc, str, Loc | None]
"""(location relative to the validated value, message, location to take the line from instead)."""


def custom_error(kind: str, message: str) -> PydanticCustomError:
    """A custom error whose message is taken literally (pydantic would otherwise format `{...}` in it)."""
    return PydanticCustomError(kind, "{message}", {"message": message})


def raise_issues(issues: Sequence[Issue]) -> NoReturn:
    """Raise several problems as one pydantic error; the loader unpacks them again with full paths."""
    summary = "; ".join(message for _, message, _ in issues)
    raise PydanticCustomError("spec_problems", "{summary}", {"summary": summary, "issues": tuple(issues)})


def show(value: object) -> str:
    """A value as the user wrote it in YAML, short enough for a one-line message."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        text = json.dumps(value, default=str)
        return text if len(text) <= 40 else f"a list of {len(value)} items"
    return repr(value) if isinstance(value, str) else str(value)


def format_loc(loc: Loc) -> str:
    """`("medusa", "choices", 3)` -> `medusa.choices[3]`."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


@dataclass(frozen=True)
class SpecProblem:
    """One thing wrong with a spec: where (field path, line) and what."""

    loc: Loc
    message: str
    line: int | None = None

    @property
    def field(self) -> str:
        return format_loc(self.loc)

    def render(self, file: str) -> str:
        where = f"{file}:{self.line}" if self.line is not None else file
        return f"{where}: {self.field}: {self.message}" if self.loc else f"{where}: {self.message}"


def sorted_problems(problems: list[SpecProblem]) -> list[SpecProblem]:
    """File order (problems without a line last), so the report reads top to bottom like the spec."""
    return sorted(problems, key=lambda p: (p.line is None, p.line or 0, format_loc(p.loc)))


class SpecValidationError(SpecError):
    """A spec with one or more problems; `problems` holds them for programs, the message for people."""

    def __init__(self, problems: Sequence[SpecProblem], file: str, *, hint: str | None = None) -> None:
        self.problems = list(problems)
        self.file = file
        lines = [problem.render(file) for problem in self.problems]
        if len(lines) == 1:
            message = lines[0]
        else:
            message = f"{file}: {len(lines)} problems\n" + "\n".join(f"  {line}" for line in lines)
        super().__init__(message, hint=hint)
