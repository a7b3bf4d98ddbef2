"""Medusa trees (`medusa_choices`) as plain data: the rules a tree must follow, the shipped presets, and the
C++ backend's `medusa_choices` parameter text.

Torch-free on purpose: the pipeline spec validates trees with these rules without importing torch, and the
runtime's `MedusaTree` builds its tensors on top of them, so both check the same things.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

MAX_MEDUSA_DEPTH = 16
"""TensorRT-LLM packs a tree path into 16 levels (NVIDIA/TensorRT-LLM
`cpp/tensorrt_llm/runtime/utils/speculativeChoicesUtils.cpp` @b4f2086d)."""

_PRESET_PACKAGE = "specbuild"
_PRESET_DIR = ("data", "medusa_choices")


def medusa_tree_problems(choices: Sequence[Sequence[int]]) -> list[tuple[int | None, str]]:
    """What makes `choices` unusable as a TensorRT-LLM medusa_choices tree, as (entry index, message).

    The C++ runtime needs every prefix of every path listed explicitly (only the Python runtime expands
    leaf-only lists), no duplicates, non-negative top-k indices and depth <= 16.
    """
    if not choices:
        return [(None, "the tree is empty; list at least one path such as [0]")]
    problems: list[tuple[int | None, str]] = []
    first_seen: dict[tuple[int, ...], int] = {}
    for index, path in enumerate(choices):
        key = tuple(path)
        if not key:
            problems.append((index, "[] is not a path: the root (the verified token) is implicit"))
        elif min(key) < 0:
            problems.append((index, f"{list(key)}: top-k indices must be >= 0"))
        elif len(key) > MAX_MEDUSA_DEPTH:
            problems.append((index, f"{list(key)}: depth {len(key)} is more than {MAX_MEDUSA_DEPTH}"))
        elif key in first_seen:
            problems.append((index, f"{list(key)} is listed twice (first as entry {first_seen[key]})"))
        else:
            first_seen[key] = index
    for key, index in first_seen.items():
        missing = next((key[:cut] for cut in range(1, len(key)) if key[:cut] not in first_seen), None)
        if missing is not None:
            problems.append((index, f"{list(key)}: prefix {list(missing)} is not listed (all must be)"))
    return sorted(problems, key=lambda item: -1 if item[0] is None else item[0])


def validated(choices: Sequence[Sequence[int]]) -> tuple[tuple[int, ...], ...]:
    """The paths sorted by (depth, path), or ValueError listing everything wrong with them."""
    if isinstance(choices, str | bytes) or not isinstance(choices, Sequence):
        raise ValueError(f"medusa choices must be a list of paths such as [[0], [0, 0], [1]], got {choices!r}")
    paths = []
    for index, path in enumerate(choices):
        if isinstance(path, str | bytes) or not isinstance(path, Sequence) or any(
            isinstance(item, bool) or not isinstance(item, int) for item in path
        ):
            raise ValueError(f"medusa choices entry {index}: must be a list of integers such as [0, 1], got {path!r}")
        paths.append(tuple(int(item) for item in path))
    problems = medusa_tree_problems(paths)
    if problems:
        messages = [message if index is None else f"entry {index}: {message}" for index, message in problems]
        raise ValueError("invalid medusa choices: " + "; ".join(messages))
    return tuple(sorted(paths, key=lambda path: (len(path), path)))


# ---------------------------------------------------------------------------------------------------- presets


def preset_names() -> list[str]:
    """Tree presets shipped inside the package (`specbuild/data/medusa_choices/*.json`)."""
    folder = resources.files(_PRESET_PACKAGE).joinpath(*_PRESET_DIR)
    return sorted(entry.name.removesuffix(".json") for entry in folder.iterdir() if entry.name.endswith(".json"))


def load_choices(name_or_path: str) -> list[list[int]]:
    """A validated tree from a shipped preset name (e.g. `mc_sim_7b_63`) or a JSON file.

    A file holds either a bare list of paths or `{"source": ..., "choices": [...]}`. Read via importlib.resources
    so that presets work from an installed wheel, not only from a source checkout.
    """
    path = Path(name_or_path)
    if path.suffix == ".json" or path.is_file():
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as err:
            raise ValueError(f"cannot read medusa choices file {path}: {err.strerror or err}") from err
        origin = str(path)
    else:
        preset = resources.files(_PRESET_PACKAGE).joinpath(*_PRESET_DIR, f"{name_or_path}.json")
        if "/" in name_or_path or not preset.is_file():
            known = ", ".join(preset_names())
            raise ValueError(f"unknown medusa choices preset {name_or_path!r} (known: {known}); or give a .json file")
        text = preset.read_text(encoding="utf-8")
        origin = f"preset {name_or_path!r}"
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"medusa choices {origin}: not valid JSON ({err})") from err
    raw = data.get("choices") if isinstance(data, dict) else data
    if not isinstance(raw, list):
        raise ValueError(f'medusa choices {origin}: expected a JSON list of paths or {{"choices": [...]}}')
    try:
        validated(raw)
    except ValueError as err:
        raise ValueError(f"medusa choices {origin}: {err}") from err
    return [list(path) for path in raw]


def format_choices(choices: list[list[int]]) -> str:
    """A Medusa tree in the TensorRT-LLM parameter format: `{0}, {0, 0}, {1}`."""
    return ", ".join("{" + ", ".join(str(i) for i in path) + "}" for path in choices)


def parse_choices(text: str) -> list[list[int]]:
    """The `medusa_choices` parameter back as paths, read the way the backend does (braces -> JSON lists)."""
    try:
        data = json.loads("[" + text.replace("{", "[").replace("}", "]") + "]")
    except json.JSONDecodeError as err:
        raise ValueError(f"medusa_choices {text!r} is not a list of brace groups such as '{{0}}, {{0, 1}}'") from err
    if not data or not all(isinstance(p, list) and all(type(i) is int for i in p) for p in data):
        raise ValueError(f"medusa_choices {text!r} must be a non-empty list of integer paths")
    return data
