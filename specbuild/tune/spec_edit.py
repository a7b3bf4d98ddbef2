"""Edit a pipeline spec's YAML text in place, value by value, so the user's comments and layout survive.

PyYAML's composer gives every node its character span; a change replaces one value's span (or inserts one
`key: value` line into a mapping) and leaves every other character as it was. Round-tripping through a YAML
dump instead would drop every comment, and the starter spec is mostly comments.
"""

from __future__ import annotations

import itertools
import json
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from specbuild.errors import SpecError

Loc = tuple[str, ...]
_PLAIN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_./+-]*$")


@dataclass(frozen=True)
class Edit:
    """Replace text[start:end] with `text`."""

    start: int
    end: int
    text: str


def scalar(value: str | int) -> str:
    """A YAML scalar for `value`: plain where that reads back as the same string, else double-quoted (JSON
    strings are valid YAML double-quoted scalars)."""
    if isinstance(value, int):
        return str(value)
    plain = _PLAIN.match(value) and yaml.safe_load(value) == value
    return value if plain else json.dumps(value)


def flow_list(choices: Sequence[Sequence[int]]) -> str:
    """A Medusa tree as one flow sequence: `[[0], [0, 0], [1]]`."""
    return "[" + ", ".join("[" + ", ".join(str(i) for i in path) + "]" for path in choices) + "]"


def compose(text: str, shown: str) -> yaml.MappingNode:
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as err:
        raise SpecError(f"{shown}: cannot parse the YAML: {err}") from err
    if not isinstance(root, yaml.MappingNode):
        raise SpecError(f"{shown}: the spec is not a YAML mapping")
    return root


def _entries(node: yaml.MappingNode) -> Iterator[tuple[yaml.ScalarNode, yaml.Node]]:
    for key, value in node.value:
        if isinstance(key, yaml.ScalarNode):
            yield key, value


def find(root: yaml.MappingNode, loc: Loc) -> tuple[yaml.ScalarNode, yaml.Node] | None:
    """The (key, value) nodes at `loc`, or None where any key on the way is absent."""
    node: yaml.Node = root
    found = None
    for part in loc:
        if not isinstance(node, yaml.MappingNode):
            return None
        found = next(((k, v) for k, v in _entries(node) if k.value == part), None)
        if found is None:
            return None
        node = found[1]
    return found


def _end(node: yaml.Node) -> int:
    """Where a node's own text ends. A block collection's end mark lies past trailing comments and blank lines,
    which belong to whatever follows, so its last item's end is used instead."""
    if isinstance(node, yaml.MappingNode | yaml.SequenceNode) and not node.flow_style and node.value:
        last = node.value[-1]
        return _end(last[1] if isinstance(node, yaml.MappingNode) else last)
    return node.end_mark.index


def set_value(text: str, root: yaml.MappingNode, loc: Loc, value: str) -> Edit:
    """An edit that gives `loc` the YAML `value`, replacing the old value or adding the key to its mapping
    (which must exist: a missing section is the user's to write)."""
    found = find(root, loc)
    if found is not None:
        key, old = found
        if isinstance(old, yaml.MappingNode | yaml.SequenceNode) and not old.flow_style:
            # A block collection starts on the next line: replace from the key's end, `key: value` on one line.
            return Edit(key.end_mark.index, _end(old), f": {value}")
        return Edit(old.start_mark.index, _end(old), value)
    parent = root if len(loc) == 1 else find(root, loc[:-1])
    parent_node = parent if isinstance(parent, yaml.MappingNode) else (parent[1] if parent else None)
    if not isinstance(parent_node, yaml.MappingNode):
        raise SpecError(f"the spec has no `{'.'.join(loc[:-1])}:` section to put `{loc[-1]}` in")
    return insert_key(text, parent_node, loc[-1], value)


def insert_key(text: str, mapping: yaml.MappingNode, key: str, value: str) -> Edit:
    """A new `key: value` entry at the end of `mapping`, in its style and indentation."""
    if mapping.flow_style or not mapping.value:
        close = mapping.end_mark.index - 1  # the closing brace
        if text[close] != "}":
            raise SpecError(f"cannot add `{key}` to the mapping at line {mapping.start_mark.line + 1}")
        separator = ", " if mapping.value else ""
        return Edit(close, close, f"{separator}{key}: {value}")
    indent = " " * mapping.value[0][0].start_mark.column
    end = _end(mapping.value[-1][1])
    newline = text.find("\n", end)  # after the last entry's line, trailing comment included
    at = len(text) if newline < 0 else newline
    return Edit(at, at, f"\n{indent}{key}: {value}")


def apply(text: str, edits: Sequence[Edit]) -> str:
    ordered = sorted(edits, key=lambda e: e.start)
    for before, after in itertools.pairwise(ordered):
        if after.start < before.end:
            raise ValueError("overlapping spec edits")
    for edit in reversed(ordered):
        text = text[: edit.start] + edit.text + text[edit.end :]
    return text


def _is_relative(raw: str) -> bool:
    return not os.path.isabs(os.path.expanduser(raw))


def rebase_paths(text: str, root: yaml.MappingNode, spec: Any, new_dir: Path, skip: Sequence[Loc] = ()) -> list[Edit]:
    """Edits that keep every relative path of the spec pointing at the same file from a spec in `new_dir`.

    Which scalars are paths is read off the loaded spec (any field whose value is a Path), so new path fields
    are covered without a list here; relative paths in the YAML resolve against the spec's directory.
    """
    old_dir = spec.path.parent
    edits: list[Edit] = []

    def walk(node: yaml.MappingNode, model: Any, loc: Loc) -> None:
        for key, value in _entries(node):
            here = (*loc, key.value)
            attribute = getattr(model, key.value, None) if model is not None else None
            if here in skip:
                continue
            if isinstance(value, yaml.MappingNode):
                walk(value, attribute, here)
            elif (isinstance(value, yaml.ScalarNode) and isinstance(attribute, Path) and value.tag.endswith(":str")
                  and _is_relative(value.value)):
                moved = os.path.relpath(os.path.normpath(old_dir / os.path.expanduser(value.value)), new_dir)
                edits.append(Edit(value.start_mark.index, _end(value), scalar(moved)))

    walk(root, spec, ())
    if find(root, ("output_dir",)) is None and new_dir != old_dir:
        # The default output_dir is relative to the spec: pin the old one, so the new spec finds the same
        # converted checkpoints and builds.
        edits.append(insert_key(text, root, "output_dir", scalar(os.path.relpath(spec.output_dir, new_dir))))
    return edits
