"""YAML text -> data, plus the map from each field path to its line in the file (and the duplicate keys).

yaml's composed nodes keep their marks, so one compose gives both the data and the lines; a problem found by the
schema later is located by looking its field path up here. Duplicate keys are found here because the
constructed data has already dropped all but the last.
"""

from __future__ import annotations

from typing import Any

import yaml

from specbuild.errors import SpecError
from specbuild.spec.problems import Loc, SpecProblem


class LineMap:
    """Field path -> 1-based line, from yaml's composed nodes; also finds duplicate keys."""

    def __init__(self, root: yaml.Node | None) -> None:
        self._lines: dict[Loc, int] = {}
        self.duplicates: list[SpecProblem] = []
        if root is not None:
            self._walk(root, ())

    def _walk(self, node: yaml.Node, loc: Loc) -> None:
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                if not isinstance(key_node, yaml.ScalarNode):
                    continue
                child = (*loc, key_node.value)
                line = key_node.start_mark.line + 1
                if child in self._lines:
                    self.duplicates.append(
                        SpecProblem(child, f"duplicate key (first on line {self._lines[child]})", line)
                    )
                self._lines[child] = line
                self._walk(value_node, child)
        elif isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                self._lines[(*loc, index)] = item.start_mark.line + 1
                self._walk(item, (*loc, index))

    def line_of(self, loc: Loc) -> int | None:
        """The line of the deepest part of `loc` the file has (a missing key points at its parent)."""
        for end in range(len(loc), 0, -1):
            if loc[:end] in self._lines:
                return self._lines[loc[:end]]
        return None


def parse_yaml(text: str, shown: str) -> tuple[Any, LineMap]:
    """The document's data and its line map; invalid YAML is a SpecError at the line yaml blames."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = f"{shown}:{mark.line + 1}" if mark is not None else shown
        what = " ".join(part for part in (err.context, err.problem) if part)
        raise SpecError(f"{where}: invalid YAML: {what}") from None
    except yaml.YAMLError as err:
        raise SpecError(f"{shown}: invalid YAML: {err}") from None
    finally:
        loader.dispose()
    return data, LineMap(node)
