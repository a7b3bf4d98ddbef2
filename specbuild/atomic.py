"""Outputs that appear whole or not at all.

A stage writes into a hidden temporary sibling of its output directory and swaps it into place only when
everything is written, so an interrupted or failed run leaves the previous output exactly as it was.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from specbuild.errors import SpecbuildError

MANIFEST = "manifest.json"


def check_replaceable(final: Path) -> None:
    """Refuse to replace anything specbuild did not write: a file, or a non-empty foreign directory."""
    if not final.exists():
        return
    if not final.is_dir():
        raise SpecbuildError(f"{final}: output path exists and is not a directory", hint="choose another output")
    if any(final.iterdir()) and not (final / MANIFEST).is_file():
        raise SpecbuildError(
            f"{final}: output directory exists, is not empty and was not written by specbuild "
            f"(no {MANIFEST}); refusing to replace it",
            hint="choose another output directory, or remove this one yourself",
        )


@contextmanager
def atomic_directory(final: Path) -> Iterator[Path]:
    """Yield a temporary directory that replaces `final` when the block finishes without error."""
    check_replaceable(final)
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    except OSError as err:
        raise SpecbuildError(f"{final.parent}: cannot create the output directory ({err.strerror})") from err
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    tmp.chmod(_directory_mode())  # mkdtemp makes 0700; the output should be readable like any other directory
    old = final.parent / f".{final.name}.old-{uuid.uuid4().hex[:8]}"
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    shutil.rmtree(old, ignore_errors=True)


def stage_text(path: Path, text: str) -> Path:
    """Write `text` to a temporary sibling of `path`, with the mode `path` has (or a new file would get), and
    return it; the caller renames it over `path` (`os.replace`) once it is happy with it, so readers see the old
    file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=path.parent, prefix=f".{path.name}.",
                                     suffix=".tmp", delete=False) as handle:
        temporary = Path(handle.name)
        try:
            handle.write(text)
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise
    # NamedTemporaryFile creates 0600; the result should be readable like any file the user writes.
    temporary.chmod(path.stat().st_mode & 0o777 if path.exists() else 0o666 & ~_umask())
    return temporary


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _directory_mode() -> int:
    """The mode `mkdir` would give a new directory under the process's umask."""
    return 0o777 & ~_umask()
