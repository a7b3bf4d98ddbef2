"""Stage manifests: what went in (content hashes), with which settings and tools, and what came out.

A stage re-run with the same settings on inputs whose recorded size and modification time are unchanged
is a no-op (the content hash of such a file is reused from the manifest, as `make` and git trust file
stats); a file whose stat changed is hashed again, so touching a file without changing it is also a no-op.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from specbuild import __version__
from specbuild.atomic import MANIFEST

_TOOLS = ("torch", "safetensors", "transformers", "nvidia-modelopt")


def tool_versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {"specbuild": __version__}
    for name in _TOOLS:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


def sha256_file(path: Path) -> str:
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def fingerprint_files(paths: Iterable[Path], previous: dict[str, Any] | None = None) -> dict[str, Any]:
    """{path: {size, mtime_ns, sha256}}, reusing `previous` hashes for files whose stat is unchanged."""
    previous = previous or {}
    result: dict[str, Any] = {}
    for path in paths:
        st = os.stat(path)
        key = str(path)
        old = previous.get(key)
        if old and old.get("size") == st.st_size and old.get("mtime_ns") == st.st_mtime_ns:
            digest = old["sha256"]
        else:
            digest = sha256_file(path)
        result[key] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": digest}
    return result


def read_manifest(directory: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((directory / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_manifest(directory: Path, data: dict[str, Any]) -> None:
    (directory / MANIFEST).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def same_inputs(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Equal file sets with equal content hashes (stat fields may differ)."""
    return a.keys() == b.keys() and all(a[k]["sha256"] == b[k]["sha256"] for k in a)


def outputs_intact(directory: Path, outputs: dict[str, int]) -> bool:
    """Every recorded output file is still there with its recorded size."""
    try:
        return all((directory / name).stat().st_size == size for name, size in outputs.items())
    except OSError:
        return False
