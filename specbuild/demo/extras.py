"""Demo artifacts trained on top of the built demo models, each cached on its own.

The base build (`specbuild.demo.models`) takes minutes; methods added later (an EAGLE-3 draft, a self-draft
adapter, Medusa-2 heads) each train something small on its frozen target, and a second demo pair of another family
(a Qwen3 target and draft) is trained on its tokenizer and text. Were they part of the base recipe,
every change to one of them would retrain everything. Instead each is an `Extra`: a directory inside the demo
models directory, built by its own function, cached under its own key (the base build's recipe hash, the extra's
name and its settings), written atomically under its own lock. A rebuilt base replaces the whole directory, so
an extra trained on an older target can never be served beside a newer one.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specbuild.atomic import atomic_directory, output_lock
from specbuild.demo.models import MANIFEST_NAME as BASE_MANIFEST
from specbuild.errors import SpecbuildError

if TYPE_CHECKING:
    from rich.progress import Progress

EXTRA_MANIFEST = "demo-extra.json"

BuildFn = Callable[[Path, Path, dict[str, Any], "Progress | None"], dict[str, Any]]
"""(demo models directory, output directory, settings, progress bars or None) -> metrics to record."""


@dataclass(frozen=True)
class Extra:
    """One cached demo artifact: `build` writes it into a fresh directory; `settings` decide its bytes."""

    name: str
    build: BuildFn
    settings: dict[str, Any] = field(default_factory=dict)
    summary: str = ""  # one line for `specbuild demo-models`


EXTRAS: dict[str, Extra] = {}
"""name -> Extra; each method registers its artifact with `register` from the module that trains it."""


def register(extra: Extra) -> Extra:
    if extra.name in EXTRAS and EXTRAS[extra.name] is not extra:
        raise ValueError(f"demo extra {extra.name!r} registered twice")
    EXTRAS[extra.name] = extra
    return extra


def _base_hash(models_dir: Path) -> str:
    try:
        return str(json.loads((models_dir / BASE_MANIFEST).read_text())["recipe_hash"])
    except (OSError, ValueError, KeyError):
        raise SpecbuildError(f"{models_dir}: no complete demo-models build here",
                             hint=f"run `specbuild demo-models {models_dir}` first") from None


def extra_key(models_dir: Path, extra: Extra) -> str:
    payload = {"base": _base_hash(models_dir), "name": extra.name, "settings": extra.settings}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def is_built(directory: Path, key: str) -> bool:
    try:
        manifest = json.loads((directory / EXTRA_MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    if manifest.get("key") != key:
        return False
    return all((directory / rel).is_file() and (directory / rel).stat().st_size == size
               for rel, size in manifest.get("files", {}).items())


def build_extra(models_dir: Path, name: str, *, force: bool = False,
                progress: Progress | None = None) -> Path:
    """The directory of demo extra `name` inside `models_dir`, trained now unless a current copy is cached."""
    _register_known()
    if name not in EXTRAS:
        raise SpecbuildError(f"unknown demo extra {name!r}", hint=f"known: {', '.join(sorted(EXTRAS))}")
    extra = EXTRAS[name]
    models_dir = Path(models_dir).absolute()
    directory = models_dir / name
    key = extra_key(models_dir, extra)
    if not force and is_built(directory, key):
        return directory
    with output_lock(directory, wait=True):  # one trainer per extra; the others wait and reuse its result
        if not force and is_built(directory, key):
            return directory
        with atomic_directory(directory, replaceable=_check_replaceable) as tmp:
            started = time.perf_counter()
            metrics = extra.build(models_dir, tmp, dict(extra.settings), progress)
            files = {p.relative_to(tmp).as_posix(): p.stat().st_size for p in sorted(tmp.rglob("*")) if p.is_file()}
            record = {"key": key, "name": name, "settings": extra.settings, "metrics": metrics,
                      "build_seconds": round(time.perf_counter() - started, 1), "files": files}
            (tmp / EXTRA_MANIFEST).write_text(json.dumps(record, indent=2, sort_keys=True, default=str) + "\n")
    return directory


def _check_replaceable(directory: Path) -> None:
    """An earlier build of this extra (its manifest) may be replaced; anything else in its place is refused."""
    if directory.exists() and any(directory.iterdir()) and not (directory / EXTRA_MANIFEST).is_file():
        raise SpecbuildError(f"{directory}: exists and holds no {EXTRA_MANIFEST}: not a demo extra; refusing to "
                             "replace it", hint="move it away, or build the demo models in another directory")


def build_all_extras(models_dir: Path, *, force: bool = False, progress: Progress | None = None) -> dict[str, Path]:
    return build_extras(models_dir, known_extras(), force=force, progress=progress)


def known_extras() -> list[str]:
    """Every registered extra's name, sorted."""
    _register_known()
    return sorted(EXTRAS)


def check_extra_names(names: list[str]) -> None:
    """Refuse names that are no registered extra, naming the known ones."""
    unknown = sorted(set(names) - set(known_extras()))
    if unknown:
        raise SpecbuildError(f"--extras: unknown demo extra {', '.join(map(repr, unknown))}",
                             hint=f"known: {', '.join(known_extras())} (or 'all', 'none')")


def build_extras(models_dir: Path, names: list[str], *, force: bool = False,
                 progress: Progress | None = None) -> dict[str, Path]:
    """Build (or reuse) the extras `names`, refusing an unknown name before any is trained: a demo that needs
    one method's extra should not wait for every other method's training (`specbuild demo-models --extras`)."""
    check_extra_names(names)
    return {name: build_extra(models_dir, name, force=force, progress=progress) for name in names}


def _register_known() -> None:
    """Import the modules that register the extras (kept here, so a reader finds every demo artifact in one
    list). Each registers itself at import time with `register`."""
    for module in KNOWN_EXTRA_MODULES:
        __import__(module)


KNOWN_EXTRA_MODULES: tuple[str, ...] = ("specbuild.demo.self_draft_extra", "specbuild.demo.medusa2_extra",
                                        "specbuild.demo.eagle3_extra", "specbuild.demo.qwen3_extra")
"""The modules that train demo extras (each calls `register` when imported)."""
