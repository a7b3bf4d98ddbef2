"""`medusa.choices` -> a Medusa tree: a preset name, a .json file, or an inline list of paths.

Preset names are looked up next to the spec first (`medusa_choices/`), then in the package, so a project can add
or override trees. Files are read by the runtime's own loader (`specbuild.medusa.choices`), so the spec and the
runtime accept the same files.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from specbuild.medusa.choices import load_choices
from specbuild.spec.fields import resolve
from specbuild.spec.problems import Issue, custom_error, raise_issues, show

DEFAULT_MEDUSA_CHOICES = "mc_sim_7b_63"
"""The 63-node tree TensorRT-LLM uses when none is given: the spec's default, and what the reference tensorrt_llm
model loads when `medusa_choices` is unset, as the C++ `tensorrtllm` backend does (NVIDIA/TensorRT-LLM
`triton_backend/inflight_batcher_llm/src/model_instance_state.cc` @0c8de69a `getExecutorConfigFromParams`:
"Will be using default mc_sim_7b_63 choices instead")."""

_PRESET_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_PACKAGE_DIR = Path(__file__).resolve().parents[1]  # specbuild/, above this package
_PRESET_DIRS_BUILTIN = (_PACKAGE_DIR / "data" / "medusa_choices",)  # shipped inside the package


def as_paths(value: object) -> tuple[list[list[int]], list[Issue]]:
    """Check the shape `list[list[int]]` strictly (no bools, no strings) and say where it is wrong."""
    if not isinstance(value, list):
        raise custom_error(
            "choices_type",
            "must be a preset name such as 'mc_sim_7b_63', a .json file, or a list of paths such as "
            f"[[0], [0, 0], [1]] (got {show(value)})",
        )
    paths: list[list[int]] = []
    issues: list[Issue] = []
    for index, entry in enumerate(value):
        if isinstance(entry, list) and all(type(item) is int for item in entry):
            paths.append(list(entry))
        else:
            issues.append(((index,), f"must be a list of integers such as [0, 1] (got {show(entry)})", None))
    return paths, issues


def _preset_dirs(base_dir: Path) -> list[Path]:
    """Where preset names are looked up: next to the spec first, so a project can add or override trees."""
    dirs = [base_dir / "medusa_choices", *_PRESET_DIRS_BUILTIN]
    return list(dict.fromkeys(Path(os.path.normpath(d)) for d in dirs))


def medusa_preset_names(base_dir: Path | None = None) -> list[str]:
    """Names usable as `medusa.choices`, from the spec's `medusa_choices/` directory and the built-in ones."""
    dirs = _preset_dirs(base_dir if base_dir is not None else Path.cwd())
    return sorted({file.stem for folder in dirs if folder.is_dir() for file in folder.glob("*.json")})


def _find_preset(ref: str, base_dir: Path) -> Path:
    if ref.endswith(".json"):
        path = resolve(Path(ref), base_dir)
        if path.is_file():
            return path
        raise custom_error("choices_file", f"tree file {path} does not exist")
    if _PRESET_RE.match(ref):
        for folder in _preset_dirs(base_dir):
            if (folder / f"{ref}.json").is_file():
                return folder / f"{ref}.json"
    known = ", ".join(medusa_preset_names(base_dir)) or "none found"
    raise custom_error(
        "choices_preset",
        f"unknown tree preset {ref!r} (known: {known}); or give a .json file or an explicit list",
    )


def _read_preset(path: Path) -> list[list[int]]:
    """A preset file, read and validated by the runtime's own loader so both accept the same files."""
    try:
        return load_choices(str(path))
    except ValueError as err:
        raise_issues([((), str(err), None)])


def load_preset(ref: str, base_dir: Path) -> tuple[list[list[int]], Path]:
    """The tree a preset name or .json path names, and the file it came from."""
    path = _find_preset(ref, base_dir)
    return _read_preset(path), path
