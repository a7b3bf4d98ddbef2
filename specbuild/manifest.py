"""Stage manifests: what went in (content hashes), with which settings and tools, and what came out.

One freshness policy for every stage (`is_fresh`): a stage's output is up to date when the previous manifest
records the same settings (everything the output depends on that is not a file), the same tool versions
(`tool_versions`: specbuild, torch, safetensors, transformers, ModelOpt, and TensorRT-LLM for engines), inputs with
the same content hashes, and outputs still there with their recorded sizes. Hashes of inputs whose recorded size
and modification time are unchanged are reused from the manifest (as `make` and git trust file stats); a file
whose stat changed is hashed again, so touching a file without changing it is also a no-op.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Literal

import xxhash

from specbuild import __version__
from specbuild.atomic import MANIFEST


def comment(text: str) -> str:
    """`text` as `#` comment lines of a generated file (a shell script, a YAML manifest): a newline in it (a path may
    hold one) starts another comment line, where it would otherwise end the comment and what followed would be read
    as code or YAML."""
    return "\n".join(f"# {line}" for line in text.split("\n"))


Status = Literal["written", "up to date", "planned"]
"""What a stage did with one output, the same three words for convert, build and deploy: wrote it, found it up to
date (`is_fresh`), or only planned it (`--dry-run`)."""

_TOOLS = ("torch", "safetensors", "transformers", "nvidia-modelopt")


def tool_versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {"specbuild": __version__}
    for name in _TOOLS:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


HASH = "xxh3_128"  # a content hash, not a security one: ~9 GB/s here against SHA-256's ~1.4 GB/s
_CHUNK = 8 << 20


def content_hash(path: Path) -> str:
    digest = xxhash.xxh3_128()
    buffer = bytearray(_CHUNK)
    view = memoryview(buffer)
    with path.open("rb", buffering=0) as fh:
        while n := fh.readinto(buffer):
            digest.update(view[:n])
    return digest.hexdigest()


def bytes_hash(data: bytes) -> str:
    """The content hash of bytes that are not a file yet (e.g. packaged model code)."""
    return xxhash.xxh3_128_hexdigest(data)


def output_sizes(directory: Path) -> dict[str, int]:
    """{relative path: size} of every file under a stage's output directory: what `outputs_intact` checks."""
    return {str(p.relative_to(directory)): p.stat().st_size for p in sorted(directory.rglob("*")) if p.is_file()}


def fingerprint_files(paths: Iterable[Path], previous: dict[str, Any] | None = None) -> dict[str, Any]:
    """{path: {size, mtime_ns, xxh3_128}}, reusing `previous` hashes for files whose stat is unchanged."""
    previous = previous or {}
    result: dict[str, Any] = {}
    for path in paths:
        st = os.stat(path)
        key = str(path)
        old = previous.get(key)
        if old and old.get("size") == st.st_size and old.get("mtime_ns") == st.st_mtime_ns and HASH in old:
            digest = old[HASH]
        else:
            digest = content_hash(path)
        result[key] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, HASH: digest}
    return result


def input_name(path: Path, output: Path) -> str:
    """How an output's manifest names one of its inputs: relative to the output directory (its atomic temporary is
    a sibling, so the name is the same), so an output moved or copied with its inputs names them still, and no
    absolute path of the machine it was made on is recorded."""
    return os.path.relpath(Path(path).absolute(), Path(output).absolute())


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
    return a.keys() == b.keys() and all(a[k].get(HASH) == b[k].get(HASH) for k in a)


def changed_inputs(directory: Path) -> list[str]:
    """The inputs recorded in `directory`'s manifest that are here and whose content now differs, as the manifest
    names them; [] when unknown (an output made on another machine, whose inputs' paths do not exist here). A stage
    that reads another's output refuses a stale one: deploy an engine built from an older checkpoint, tune and
    build a checkpoint converted from an older model."""
    recorded = (read_manifest(directory) or {}).get("inputs") or {}
    paths = [Path(name) for name in recorded]
    if not paths or not all(path.is_file() for path in paths):
        return []
    current = fingerprint_files(paths, recorded)
    return [name for name in recorded if current[name].get(HASH) != recorded[name].get(HASH)]


def stale_reasons(previous: dict[str, Any] | None, *, settings: dict[str, Any], tools: dict[str, Any],
                  inputs: dict[str, Any], directory: Path) -> list[str]:
    """Why the output in `directory` (written with `previous`) is not what these settings, tools and inputs
    make; empty when it is up to date."""
    if not previous:
        return ["no manifest"]
    reasons = []
    if previous.get("settings") != settings:
        old = previous.get("settings") or {}
        changed = sorted(k for k in set(old) | set(settings) if old.get(k) != settings.get(k))
        reasons.append(f"settings changed ({', '.join(changed)})")
    if previous.get("tools") != tools:
        old = previous.get("tools") or {}
        changed = sorted(k for k in set(old) | set(tools) if old.get(k) != tools.get(k))
        reasons.append(f"tool versions changed ({', '.join(changed)})")
    if not same_inputs(inputs, previous.get("inputs") or {}):
        reasons.append("inputs changed")
    if not outputs_intact(directory, previous.get("outputs") or {}):
        reasons.append("outputs missing or changed")
    return reasons


def is_fresh(previous: dict[str, Any] | None, *, settings: dict[str, Any], tools: dict[str, Any],
             inputs: dict[str, Any], directory: Path) -> bool:
    """The one "up to date" rule every stage uses (see the module docstring)."""
    return not stale_reasons(previous, settings=settings, tools=tools, inputs=inputs, directory=directory)


def outputs_intact(directory: Path, outputs: dict[str, int]) -> bool:
    """Every recorded output file is still there with its recorded size."""
    try:
        return all((directory / name).stat().st_size == size for name, size in outputs.items())
    except OSError:
        return False
