"""The reference backend: a checked copy of the converted checkpoint plus its resolved runtime settings.

Where TensorRT-LLM cannot run (a laptop, CPU CI), `deploy` serves these bundles with specbuild's PyTorch
runtime. Building one loads the checkpoint with that runtime first, so a checkpoint it cannot run fails here
rather than when Triton loads the model.
"""

from __future__ import annotations

from pathlib import Path

from specbuild.atomic import link_or_copy
from specbuild.build.plan import BuildPlan
from specbuild.contracts.checkpoint_facts import CheckpointFacts
from specbuild.contracts.engine_info import REFERENCE_CHECKPOINT, write_engine_info
from specbuild.errors import SpecbuildError


def check_loadable(plan: BuildPlan) -> None:
    """Load every rank file with the reference runtime: shapes, names and config agree, or a clear error."""
    from specbuild.runtime.checkpoint import load_checkpoint

    try:
        load_checkpoint(plan.checkpoint_dir)
    except SpecbuildError as err:
        raise SpecbuildError(
            f"{plan.role} checkpoint: the reference runtime cannot load it: {err.message}",
            hint=err.hint or "re-run `specbuild convert SPEC`",
        ) from None


def write_reference_bundle(plan: BuildPlan, facts: CheckpointFacts, directory: Path) -> None:
    """Fill `directory` (a fresh temporary engine directory) with `checkpoint/` and `engine.json`."""
    check_loadable(plan)
    checkpoint = directory / REFERENCE_CHECKPOINT
    checkpoint.mkdir()
    for source in facts.files:
        link_or_copy(source, checkpoint / source.name)
    write_engine_info(directory, plan.engine_info(facts, "reference"))
