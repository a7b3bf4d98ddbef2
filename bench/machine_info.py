"""What machine and software a benchmark ran on, recorded beside its figures (shared by the bench scripts)."""

from __future__ import annotations

import datetime as dt
import os
import platform
import subprocess
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]


def package_version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def machine_info(packages: Sequence[str], **extra: Any) -> dict[str, Any]:
    """Date, cores, RAM, platform, Python/torch and `packages` versions, git commit, load average now."""
    meminfo = Path("/proc/meminfo").read_text().split()
    mem_kib = int(meminfo[meminfo.index("MemTotal:") + 1])
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = None
    return {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "nproc": len(os.sched_getaffinity(0)),
        **extra,
        "ram_gib": round(mem_kib / 2**20, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        **{name: package_version(name) for name in packages},
        "git_commit": commit,
        "loadavg_end": [round(x, 2) for x in os.getloadavg()],
    }


def uncommitted(*paths: str) -> list[str]:
    """Files under `paths` that differ from the commit machine_info records (served code is imported from the work
    tree, and `prepare` deploys the work tree's BLS): figures measured on them are not that commit's."""
    try:
        out = subprocess.run(["git", "status", "--porcelain", "--", *paths], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return ["(git status failed)"]
    return [line[3:] for line in out.splitlines()]
