"""The one place a command's failure becomes what the user reads: one message (and hint), exit code 1.

A SpecbuildError is printed as it is; a full filesystem, wherever it surfaces, is said as such (the stages' own
writes already turn it into a SpecbuildError naming the output directory; this catches the rest, e.g. a build
script or a spec rewritten in place). Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from specbuild.errors import SpecbuildError

console = Console(stderr=True)
"""Where commands report progress, warnings and errors; results a script would read go to stdout."""


def _fail(err: SpecbuildError) -> typer.Exit:
    console.print(f"[bold red]error:[/] {escape(err.message)}", highlight=False, soft_wrap=True)
    if err.hint:
        console.print(f"[yellow]hint:[/] {escape(err.hint)}", highlight=False, soft_wrap=True)
    return typer.Exit(code=1)


@contextmanager
def handled_errors() -> Iterator[None]:
    """Run a command's body: a SpecbuildError or a full disk is one message and exit code 1."""
    from specbuild.atomic import is_no_space, no_space_error

    try:
        yield
    except SpecbuildError as err:
        raise _fail(err) from None
    except Exception as err:
        if not is_no_space(err):
            raise
        filename = getattr(err, "filename", None)
        directory = Path(filename).parent if filename else Path.cwd()
        raise _fail(no_space_error(directory)) from None


@contextmanager
def unreadable_model(what: str) -> Iterator[None]:
    """Inside `handled_errors`: an OSError from a model directory transformers cannot read becomes one line
    ("cannot <what>: ..."), not a traceback; a full disk is left for `handled_errors` to say as such."""
    from specbuild.atomic import is_no_space

    try:
        yield
    except OSError as err:
        if is_no_space(err):
            raise
        raise SpecbuildError(f"cannot {what}: {err}") from None

