"""The tensorrt backend: run `trtllm-build` for each plan, in parallel where GPUs allow, and check the result.

Each engine is built into a temporary directory with its own `build.log`; afterwards the engine's
`config.json` must say what the plan asked for (a mismatch means a different TensorRT-LLM than planned for),
and only then is the directory swapped into place.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

from specbuild.build.plan import BuildPlan
from specbuild.errors import SpecbuildError

LOG_NAME = "build.log"


def gpu_slices(plans: list[BuildPlan], gpu_count: int, jobs: int) -> tuple[int, list[list[int]]]:
    """(parallel builds, GPU indices per slot): each build gets `workers` GPUs of its own."""
    width = max(plan.workers for plan in plans) if plans else 1
    slots = max(1, min(jobs, gpu_count // width if gpu_count else 1, len(plans) or 1))
    return slots, [list(range(slot * width, (slot + 1) * width)) for slot in range(slots)]


def run_trtllm_build(plan: BuildPlan, directory: Path, gpus: list[int] | None) -> None:
    """Run trtllm-build into `directory` (its log goes there too); raise with the log's tail on failure."""
    env = dict(os.environ)
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(gpu) for gpu in gpus)
    log, command = directory / LOG_NAME, plan.command(output_dir=directory)
    with log.open("w", encoding="utf-8") as handle:
        handle.write(f"$ {shlex.join(command)}\n")
        handle.flush()
        code = subprocess.call(command, stdout=handle, stderr=subprocess.STDOUT, env=env)
    if code != 0:
        kept = plan.output_dir.parent / f"{plan.role}.failed.log"  # the temporary directory goes away
        shutil.copyfile(log, kept)
        tail = "\n".join(log.read_text(encoding="utf-8", errors="replace").splitlines()[-20:])
        raise SpecbuildError(
            f"{plan.role} engine: trtllm-build exited with status {code}; last lines of its log:\n{tail}",
            hint=f"the full log is at {kept}",
        )


def engine_config_problems(plan: BuildPlan, directory: Path) -> list[str]:
    """What the built engine's config.json contradicts in the plan (empty when it matches)."""
    path = directory / "config.json"
    try:
        config: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        build, pretrained = config["build_config"], config["pretrained_config"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        return [f"{path}: not a TensorRT-LLM engine config ({err})"]
    expected = {
        "max_batch_size": plan.max_batch_size,
        "max_input_len": plan.max_input_len,
        "max_seq_len": plan.engine_max_seq_len,
        "max_draft_len": plan.max_draft_len,
    }
    problems = [
        f"{path}: build_config.{key} is {build.get(key)!r}, the plan says {value}"
        for key, value in expected.items()
        if build.get(key) != value
    ]
    if int(build.get("max_num_tokens") or 0) < plan.max_num_tokens:
        problems.append(f"{path}: build_config.max_num_tokens {build.get('max_num_tokens')!r} < {plan.max_num_tokens}")
    mapping = pretrained.get("mapping") or {}
    world = int(mapping.get("tp_size", 1)) * int(mapping.get("pp_size", 1))
    problems += [f"{directory}: rank{rank}.engine is missing" for rank in range(world)
                 if not (directory / f"rank{rank}.engine").is_file()]
    return problems


def build_engine(plan: BuildPlan, directory: Path, gpus: list[int] | None) -> None:
    """Build, then check the engine against its plan; the caller swaps `directory` in on success."""
    run_trtllm_build(plan, directory, gpus)
    problems = engine_config_problems(plan, directory)
    if problems:
        raise SpecbuildError(
            f"{plan.role} engine was built but does not match its plan:\n  " + "\n  ".join(problems),
            hint="build with TensorRT-LLM 1.2.x (the NGC release container) so that plan and engine agree",
        )
