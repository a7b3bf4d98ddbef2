"""What machine and software a benchmark ran on, recorded beside its figures (shared by the bench scripts)."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import subprocess
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import torch

from specbuild.demo.recipe import cpu_description

ROOT = Path(__file__).resolve().parents[1]
DEMO_MODELS = ROOT / "demo" / "models"


def package_version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def demo_models_description(models: Path = DEMO_MODELS) -> str:
    """Which demo models the figures were measured on: the CPU that trained them and the draft's top-1 agreement
    with the target, on held-out text and (builds that record it) on the target's own greedy text (their weights,
    and so every acceptance and speedup, differ from CPU to CPU)."""
    try:
        metrics = json.loads((models / "demo-models.json").read_text(encoding="utf-8"))["metrics"]
        agreement = float(metrics["top1_agreement"])
        own = metrics.get("top1_agreement_on_target_text")
        on_own = "" if own is None else f", {float(own):.1%} on the target's own text"
    except (OSError, ValueError, KeyError, TypeError):
        return "not built"
    return (f"trained on {metrics.get('cpu', 'a CPU not recorded')}, draft/target top-1 agreement {agreement:.1%}"
            f"{on_own}")


def machine_info(packages: Sequence[str], **extra: Any) -> dict[str, Any]:
    """Date, cores, CPU, RAM, platform, Python/torch and `packages` versions, the demo models, git commit, load
    average now."""
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
        "cpu": cpu_description(),
        **extra,
        "ram_gib": round(mem_kib / 2**20, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        **{name: package_version(name) for name in packages},
        "demo_models": demo_models_description(),
        "git_commit": commit,
        "loadavg_end": [round(x, 2) for x in os.getloadavg()],
    }


def machine_line(m: dict[str, Any]) -> str:
    """The machine a report's figures came from, as its Markdown says it (callers add their load averages)."""
    return (f"Machine: {m['nproc']} cores ({m.get('cpu', 'CPU not recorded')}), {m['ram_gib']} GiB, {m['platform']}, "
            f"Python {m['python']}, torch {m['torch']}, nvidia-pytriton {m.get('nvidia-pytriton')}, demo models "
            f"{m.get('demo_models', 'not recorded')}, commit {m['git_commit']}, {m['date']}")


def uncommitted(*paths: str) -> list[str]:
    """Files under `paths` that differ from the commit machine_info records (served code is imported from the work
    tree, and `prepare` deploys the work tree's BLS): figures measured on them are not that commit's."""
    try:
        out = subprocess.run(["git", "status", "--porcelain", "--", *paths], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return ["(git status failed)"]
    return [line[3:] for line in out.splitlines()]
