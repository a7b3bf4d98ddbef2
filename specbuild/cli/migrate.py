"""`specbuild migrate`: an engine-flow spec rewritten for a PyTorch-flow TensorRT-LLM line (specbuild.migrate)."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer

from specbuild.cli.errors import console, handled_errors
from specbuild.cli.options import Spec
from specbuild.spec.schema import NEWEST_TRTLLM_LINE


def migrate(
    spec_path: Spec,
    out: Annotated[Path, typer.Argument(metavar="OUT", help="Where to write the new spec, a .yaml file (never SPEC).")],
    line: Annotated[str, typer.Option("--line", help="TensorRT-LLM line of the new spec.")] = NEWEST_TRTLLM_LINE,
    to: Annotated[str, typer.Option("--to", help="What Lookahead becomes: ngram (prompt lookup) or sa "
                                    "(suffix automaton).")] = "ngram",
    train: Annotated[bool, typer.Option("--train", help="Medusa -> EAGLE-3: run `specbuild eagle train` on the "
                                        "target now, into the directory the new spec names.")] = False,
    measure: Annotated[bool, typer.Option("--measure/--no-measure", help="Measure tokens per target forward of the "
                                          "old and new method on the reference runtime (CPU; converts into a "
                                          "temporary directory).")] = True,
    text: Annotated[Path | None, typer.Option("--text", metavar="FILE", help="Calibration text for the measurement "
                                              "(default: tune's held-out pydoc topics).")] = None,
) -> None:
    """Rewrite a TensorRT-LLM 1.2 engine-flow spec for the PyTorch flow of a later line.

    As a `build.flow: pytorch` spec: Medusa -> EAGLE-3 (its draft trained by `specbuild eagle train`), Lookahead ->
    NGram, an int8_sq draft -> fp8, the load-aware schedule carried over, engine-only settings dropped. Only the
    keys named at the top of OUT change; comments, layout and anchors are kept. Nothing is written if any input is
    bad. Then run `specbuild validate OUT.yaml`."""
    from specbuild.migrate.measure import calibration_ids, figures_table, measure_migration
    from specbuild.migrate.rewrite import migrate_spec
    from specbuild.spec import load_spec

    with handled_errors():
        # The measurement's prompts first: a bad --text (or a target without a tokenizer) writes nothing.
        prompts = calibration_ids(load_spec(spec_path), text) if measure else None
        migration = migrate_spec(spec_path, out, line=line, to=to)
    console.print(f"wrote {out}: speculative.mode {migration.old_mode} -> {migration.new_mode}, build.flow: pytorch, "
                  f"TensorRT-LLM {migration.line}")
    for note in migration.notes:
        console.print(f"  - {note}")
    if migration.train_command is not None:
        if train:
            console.print(f"running: {shlex.join(migration.train_command)}")
            # this interpreter's specbuild, whether or not its script is on PATH
            status = subprocess.call([sys.executable, "-m", "specbuild.cli", *migration.train_command[1:]])
            if status:
                raise typer.Exit(status)
        else:
            console.print(f"next: {shlex.join(migration.train_command)}  (or rerun with --train)")
    if prompts is not None:
        with handled_errors():
            figures = measure_migration(load_spec(spec_path), load_spec(out), ids=prompts)
        console.print("reference runtime, greedy, on " + (str(text) if text else "tune's held-out pydoc topics") + ":")
        for line_text in figures_table(figures):
            console.print(f"  {line_text}", markup=False, soft_wrap=True)
