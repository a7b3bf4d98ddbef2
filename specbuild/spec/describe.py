"""pydantic's validation errors -> located SpecProblems, in the spec's own words.

pydantic names a problem by its error type ("int_parsing", "extra_forbidden", ...) and its own phrasing; users
get one short sentence per problem, with a did-you-mean for misspelt keys, and the spec file's line taken from
the YAML line map. Validators that report several problems at once ("spec_problems", see `problems.raise_issues`)
are unpacked into one problem each.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import get_args

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from specbuild.spec.problems import Issue, Loc, SpecProblem, show
from specbuild.spec.schema import PipelineSpec
from specbuild.spec.yaml_lines import LineMap


def _model_at(loc: Loc) -> type[BaseModel] | None:
    """The schema class that validates the mapping at `loc`, for did-you-mean suggestions."""
    model: type[BaseModel] | None = PipelineSpec
    for part in loc:
        field = model.model_fields.get(part) if model is not None and isinstance(part, str) else None
        if field is None:
            return None
        candidates = [field.annotation, *get_args(field.annotation)]
        model = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
    return model


def _unknown_key(loc: Loc) -> str:
    model = _model_at(loc[:-1])
    known = list(model.model_fields) if model is not None else []
    close = difflib.get_close_matches(str(loc[-1]), known, n=1)
    if close:
        return f"unknown key (did you mean {close[0]!r}?)"
    return f"unknown key (expected one of: {', '.join(known)})" if known else "unknown key"


_TYPE_NAMES = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "string_type": "a string (quote it)",
    "model_type": "a mapping of keys to values",
    "model_attributes_type": "a mapping of keys to values",
    "dict_type": "a mapping of keys to values",
}
_OWN_MESSAGES = {  # `custom_error` kinds raised by the spec's own validators: already worded for users
    "path_type", "choices_type", "choices_file", "choices_preset", "calib_source", "name_pattern"
}


def _describe(error: ErrorDetails) -> str:
    """A pydantic error as a short sentence in the spec's own terms."""
    kind, ctx, got = error["type"], error.get("ctx", {}), show(error.get("input"))
    if kind in _OWN_MESSAGES:
        return error["msg"]
    if kind == "missing":
        return "required, but missing"
    if kind == "extra_forbidden":
        return _unknown_key(tuple(error["loc"]))
    if kind == "greater_than_equal":
        return f"must be >= {ctx['ge']} (got {got})"
    if kind == "less_than_equal":
        return f"must be <= {ctx['le']} (got {got})"
    if kind == "literal_error":
        return f"must be one of {ctx['expected']} (got {got})"
    if kind in _TYPE_NAMES:
        return f"must be {_TYPE_NAMES[kind]} (got {got})"
    message = error["msg"]
    return f"{message[:1].lower()}{message[1:]} (got {got})"


def problems_from_issues(loc: Loc, issues: Sequence[Issue], lines: LineMap) -> list[SpecProblem]:
    """Issues reported relative to `loc`, with full paths and their lines."""
    return [
        SpecProblem((*loc, *rel), message, lines.line_of((*loc, *(rel if line_rel is None else line_rel))))
        for rel, message, line_rel in issues
    ]


def problems_from(err: ValidationError, lines: LineMap) -> list[SpecProblem]:
    """Every problem in a pydantic ValidationError, worded and located."""
    problems = []
    for error in err.errors():
        loc = tuple(error["loc"])
        if error["type"] == "spec_problems":
            problems += problems_from_issues(loc, error["ctx"]["issues"], lines)
        else:
            problems.append(SpecProblem(loc, _describe(error), lines.line_of(loc)))
    return problems
