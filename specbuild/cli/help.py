"""How `--help` reads to a new user; every command and group of the app uses these classes.

Typer's rich help keeps a docstring's single line breaks after the first paragraph, so a docstring wrapped at the
source's 120 columns printed sentences broken mid-line. Here a paragraph's lines are joined (a paragraph that
starts with `\\b` keeps its lines, as in click), so help text reflows to the terminal. A group lists each command on
one line (`summary`): typer shows a command's whole first paragraph there, and one long paragraph (tune's was 30
lines) pushed `specbuild --help` past a screen. Flags get no type column
(`--force`, not `--force <bool>`), and the usage line spells arguments as the argument table does: `SPEC` when
required, `[SPEC]` when optional (typer writes `{SPEC}` and, for an optional metavar, `[[SPEC]]`).
"""

from __future__ import annotations

import re
from typing import Any

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption


def reflowed(text: str | None) -> str | None:
    """`text` with each paragraph's line breaks turned into spaces, except in paragraphs marked with `\\b`."""
    if not text:
        return text
    paragraphs = []
    for paragraph in text.strip().split("\n\n"):
        lines = [line.strip() for line in paragraph.strip().splitlines()]
        if lines and lines[0] == "\b":
            paragraphs.append("\n".join(lines[1:]))
        else:
            paragraphs.append(" ".join(line for line in lines if line))
    return "\n\n".join(paragraphs)


SUMMARY_CHARS = 83
"""The most characters of a command's line in its group's help: what the commands panel holds at 100 columns."""


def _clauses(sentence: str) -> list[int]:
    """Where the sentence's top-level clauses end: before a `: `, `; ` or ` (` outside parentheses and backticks."""
    ends, depth, quoted = [], 0, False
    for index, char in enumerate(sentence):
        quoted ^= char == "`"
        depth += (char == "(") - (char == ")")
        if not quoted and depth == 0 and sentence[index:index + 2] in (": ", "; ", " ("):
            ends.append(index)
    return ends


def summary(text: str | None) -> str | None:
    """A command's one line in its group's help: the first sentence of its help; when longer than SUMMARY_CHARS, its
    first leading clause of 30 characters or more (so it still says something) that fits, else the sentence cut at
    a word with "...". The command's own --help keeps the whole text."""
    first = (reflowed(text) or "").split("\n\n", 1)[0]
    sentence = re.split(r"(?<=[.!?])\s+(?=[A-Z`])", first, maxsplit=1)[0]
    if len(sentence) <= SUMMARY_CHARS:
        return sentence or None
    fitting = [end for end in _clauses(sentence) if 30 <= end <= SUMMARY_CHARS]
    if fitting:
        return sentence[:fitting[0]]
    return sentence[:SUMMARY_CHARS - 3].rsplit(" ", 1)[0].rstrip(",;:") + "..."


_VALUE_WORDS = {"<str>": "TEXT", "<int>": "INTEGER", "<int range>": "INTEGER", "<float>": "NUMBER",
                "<float range>": "NUMBER", "<path>": "PATH"}
"""Typer names an option's value by its Python type (`--host <str>`); the help says what it is in words."""


def _no_type(ctx: Any) -> None:
    return None


def _plain_flags(params: list[Any], ctx: Any) -> list[Any]:
    """A flag takes no value, so it shows no type (`--help` included, which typer creates per command); another
    option without a metavar of its own gets a word for its value instead of a Python type, and an argument
    none (its name, SPEC or URL, already says what it is)."""
    for param in params:
        if isinstance(param, TyperArgument):
            param.display_type_rich = _no_type
            continue
        if not isinstance(param, TyperOption) or param.metavar is not None:
            continue
        if param.is_flag:
            param.metavar = ""
        elif (word := _VALUE_WORDS.get(param.display_type(ctx))) is not None:
            param.metavar = word
    return params


def _usage_name(argument: TyperArgument) -> str:
    name = argument.metavar or argument.name.upper()
    name = name if argument.required else f"[{name}]"
    return name if argument.nargs == 1 else f"{name}..."


class Command(TyperCommand):
    """A command whose help reflows, listed on one line by its group, whose flags show no type and whose usage line
    names arguments plainly."""

    def __init__(self, *args: Any, help: str | None = None, short_help: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, help=reflowed(help), short_help=short_help or summary(help), **kwargs)

    def get_params(self, ctx: Any) -> list[Any]:
        return _plain_flags(super().get_params(ctx), ctx)

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        return pieces + [_usage_name(p) for p in self.get_params(ctx) if isinstance(p, TyperArgument)]


class Group(TyperGroup):
    """A command group with the same help conventions as `Command`."""

    def __init__(self, *args: Any, help: str | None = None, short_help: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, help=reflowed(help), short_help=short_help or summary(help), **kwargs)

    def get_params(self, ctx: Any) -> list[Any]:
        return _plain_flags(super().get_params(ctx), ctx)


class App(typer.Typer):
    """A Typer app whose groups and commands are `Group` and `Command` unless told otherwise."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("cls", Group)
        kwargs.setdefault("pretty_exceptions_enable", False)
        kwargs.setdefault("add_completion", False)
        kwargs.setdefault("no_args_is_help", True)
        super().__init__(**kwargs)

    def command(self, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("cls", Command)
        return super().command(*args, **kwargs)
