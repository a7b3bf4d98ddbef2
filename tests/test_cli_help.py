"""`specbuild --help` as a new user first reads it: one screen, one line per command, and a typical flow that names
every target specbuild serves on. Commands and targets are read from the app and the spec, not listed here."""

from __future__ import annotations

from typing import Any, get_args

import pytest
import typer.main
from typer.core import TyperGroup
from typer.testing import CliRunner

from specbuild.cli import app
from specbuild.export import ENGINES
from specbuild.spec.schema import DeploySpec

WIDTH = 100
SCREEN = 40
"""Lines of a terminal screen at WIDTH columns: `specbuild --help` fits on one."""
runner = CliRunner()


def _groups() -> list[tuple[list[str], TyperGroup]]:
    """The app and every command group under it, with the argv that reaches each."""
    found, stack = [], [([], typer.main.get_command(app))]
    while stack:
        path, command = stack.pop()
        if isinstance(command, TyperGroup):
            found.append((path, command))
            stack.extend(([*path, name], sub) for name, sub in command.commands.items())
    return found


def _help(path: list[str]) -> str:
    result = runner.invoke(app, [*path, "--help"], env={"COLUMNS": str(WIDTH), "TERMINAL_WIDTH": str(WIDTH)})
    assert result.exit_code == 0, result.output
    return result.output


def _command_lines(text: str) -> list[str]:
    """The lines of the help's commands panel, between its top and bottom borders."""
    lines = text.splitlines()
    start = next(index for index, line in enumerate(lines) if "Commands" in line and line.startswith("╭"))
    end = next(index for index in range(start, len(lines)) if lines[index].startswith("╰"))
    return lines[start + 1:end]


def test_the_overview_fits_on_a_screen() -> None:
    lines = _help([]).rstrip().splitlines()
    assert len(lines) <= SCREEN, f"`specbuild --help` is {len(lines)} lines at {WIDTH} columns"


GROUPS = _groups()


@pytest.mark.parametrize("path,group", GROUPS, ids=[" ".join(path) or "specbuild" for path, _ in GROUPS])
def test_every_command_is_listed_on_one_line(path: list[str], group: Any) -> None:
    rows = [line.strip("│ ").split()[0] for line in _command_lines(_help(path))]
    assert rows == list(group.commands), f"specbuild {' '.join(path)} --help: a command's entry spans several lines"


def test_the_typical_flow_names_every_target() -> None:
    """Every deploy target (Triton, Dynamo) and every export engine (vLLM, SGLang) is named in the overview."""
    description = " ".join(_help([]).split("╭", 1)[0].split()).lower()
    targets = [*get_args(DeploySpec.model_fields["target"].annotation), *ENGINES]
    missing = [target for target in targets if target.lower() not in description]
    assert not missing, f"`specbuild --help` does not name {missing}"
