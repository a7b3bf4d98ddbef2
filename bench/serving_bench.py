"""Serving benchmark: the demo deployments behind a real tritonserver, measured from the client side.

Builds (or reuses, every stage is incremental) the demo deployments through the stage functions — draft-target
(configs/demo.yaml), Medusa (configs/demo-medusa.yaml) and the same target without speculation
(configs/demo-plain.yaml), and next to them Lookahead (configs/demo-lookahead.yaml), the self-draft with its adapter
(configs/demo-self-draft.yaml), Medusa-2 (configs/demo-medusa2.yaml) with its own plain baseline (`medusa2-base`:
Medusa-2 fine-tunes the base, so the served model is a new one and is compared with itself decoded plainly) and
EAGLE-3 and Draft_Target (configs/demo-eagle3.yaml, configs/demo-pytorch.yaml: the PyTorch flow's llmapi repository
on the reference backend) — serves them all at once with the tritonserver bundled in nvidia-pytriton (or the one on
PATH), and drives each entry model over gRPC streaming with `specbuild bench`'s load generator (the llmapi model
through its own input names). Rounds interleave the deployments (so a busy neighbour on a shared machine slows all
of them alike), each round in another order (specbuild.bench.load.rotations: no deployment always runs first), and
the median round by tokens/s is kept; a run sends every prompt once and at least 4 requests per client
(specbuild.bench.load.STEADY_PER_CLIENT), so the burst at its start and the tail at its end are not most of it.
Output tokens are counted with the deployment's own tokenizer (re-encoding each answer), the same for every
deployment.

Every deployment is measured at every --concurrency (default 1, 8, 16). Targets, each a ratio measured side by side
in the same run: plain at concurrency 8 >= 3x its own tokens/s at concurrency 1 (in-flight batching); draft-target
(BLS), Medusa, and EAGLE-3 and Draft_Target through the llmapi repository (configs/demo-eagle3.yaml,
configs/demo-pytorch.yaml) >= 1.3x plain at concurrency 1 (where the BLS or Medusa misses, by a measured account
instead, on the same commit and machine, so run those scripts first: bench/round_cost_bench.py's, its rounds stay
below 1.3x plain in-process at every K the engine verifies while one engine with the same models and K reaches
it; bench/medusa_cost_bench.py's, Medusa stays below 1.3x plain in-process while its steps with the tree's forward
at a one-token forward's cost reach it); and every speculative
deployment, at every higher concurrency, >= 1.0x its baseline's tokens/s **and** TTFT p50 <= 1.5x its baseline's
(speculation never makes a loaded server slower, and never trades streaming away: an answer sent whole at the end
has TTFT = latency). The other deployments' concurrency-1 ratios are reported, not judged, and so are
`medusa2-base`'s at every concurrency (a baseline decodes without speculation; the loaded targets judge
speculation), and so are those of `medusa-kept-on`, configs/demo-medusa.yaml with its schedule's K = 0 thresholds
removed: a probe of the schedule's K = 0 thresholds in this run, and those of
`plain-again`, the A/A control (plain's repository behind a second server, in the same rounds). The script exits 1
when a target is missed or a deployment could not be deployed.

Writes bench/results/serving.json (every figure, machine info), serving.md (the table), serving.png (tokens/s,
TTFT and ITL by concurrency) and serving-curve.png (tokens/s against concurrency).
Run with `.venv/bin/python bench/serving_bench.py [--help]`.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from machine_info import machine_info, machine_line
from results_files import write_results
from rich.console import Console
from targets import Target, finish

ROUNDS = 5
"""Interleaved rounds per deployment and concurrency (the median kept). With 3, the A/A control (the same repository
behind two servers) measured up to 11% apart at one concurrency and 0.89x-1.19x across runs, about the margin of
several targets; with 7 it stayed within 1% (`--only plain-again --concurrency 8 16 --rounds 7`, run by hand on
the 2-core machine of the committed figures). 5 take 5/3 of 3's measuring time: the serving run of the figures
committed from 55b4c5d took about 10 minutes."""

MAX_TOKENS = 48
"""New tokens per request of the serving load (with DEFAULT_PROMPTS, the load the demo deployments are judged on; the
tune step of `make bench` measures the demo schedules on the same load: run_all.SERVED)."""

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT))

from specbuild.bench.client import LLMClient  # noqa: E402
from specbuild.bench.load import (  # noqa: E402
    DEFAULT_PROMPTS,
    STEADY_PER_CLIENT,
    Load,
    Summary,
    TokenCounter,
    median_round,
    rotations,
    run_load,
)
from specbuild.bench.report import plot, speedup, table  # noqa: E402
from specbuild.errors import SpecbuildError  # noqa: E402
from specbuild.serve.server import TritonServer  # noqa: E402

BASELINE = "plain"


@dataclass(frozen=True)
class Deployment:
    """One served demo pipeline: its spec (`plain_of`: that spec's target without speculation, a spec written
    under demo/specs/), the deployment its ratios are against, and whether the speed-up targets judge it (the
    judged ones are measured at every --concurrency, the others at --new-concurrency)."""

    spec: str
    baseline: str = BASELINE
    judged: bool = False
    plain_of: bool = False
    reference_of: bool = False  # that spec on build.backend: reference (an llmapi repository served on CPU)
    kept_on: bool = False  # a probe: that spec with its schedule's K = 0 thresholds removed, reported, not judged
    control: bool = False  # the A/A control: the baseline's own repository behind a second server, reported
    account: str | None = None  # the results file whose measured account may explain a miss at concurrency 1

    @property
    def loaded_targets(self) -> bool:
        """Whether the loaded targets, which judge speculation against the baseline, apply: not to a plain baseline
        (plain_of decodes without speculation), a probe (kept_on) or the A/A control; their ratios are reported
        instead."""
        return not (self.plain_of or self.kept_on or self.control)


DEPLOYMENTS = {
    "plain": Deployment("configs/demo-plain.yaml", judged=True),
    "draft-target": Deployment("configs/demo.yaml", judged=True, account="round-cost.json"),
    "medusa": Deployment("configs/demo-medusa.yaml", judged=True, account="medusa-cost.json"),
    "lookahead": Deployment("configs/demo-lookahead.yaml"),
    "self-draft": Deployment("configs/demo-self-draft.yaml"),
    "medusa2-base": Deployment("configs/demo-medusa2.yaml", plain_of=True),
    "medusa2": Deployment("configs/demo-medusa2.yaml", baseline="medusa2-base"),
    "eagle3": Deployment("configs/demo-eagle3.yaml", judged=True),
    "draft-target-llmapi": Deployment("configs/demo-pytorch.yaml", judged=True, reference_of=True),
    "medusa-kept-on": Deployment("configs/demo-medusa.yaml", kept_on=True),
    "plain-again": Deployment("configs/demo-plain.yaml", control=True),
}
"""`medusa-kept-on` checks the K = 0 thresholds of the Medusa schedule (which `tune --served` measured behind the
server, where they were near ties): the tree that the schedule turns off under load is served here kept on (its
smaller trees stay).
`draft-target` (the BLS) is judged at concurrency 1 by SPEEDUP_MIN or, as issue 22 allows, by the measured account
of bench/round_cost_bench.py: its rounds against plain decoding and against one engine with the same models and K,
in-process on the same commit and machine; `medusa` likewise by bench/medusa_cost_bench.py's account of the cost of
its tree's width on this machine.
`plain-again` is the A/A control: plain's own repository behind a second tritonserver, measured in the same
interleaved rounds. Its tokens/s over plain's is 1.0 but for this machine's noise, so it shows how far apart two
identical deployments land in the run, which the ratios of a deployment that decodes plainly at some load (a schedule's
K = 0) are to be read against."""
SPEEDUP_MIN = 1.3  # each judged speculative deployment's tokens/s vs plain at concurrency 1
LOADED_MIN = 1.0  # every speculative deployment's tokens/s vs its baseline at every higher concurrency ...
TTFT_MAX = 1.5  # ... with its TTFT p50 at most this times its baseline's (a non-streamed answer fails it)
BATCHING_MIN = 3.0  # plain at concurrency 8 vs plain at concurrency 1
COARSER_STREAM = 1.5  # tokens per response over the baseline's from which a tokens/s figure says it streamed coarser
console = Console(stderr=True)


def spec_path(deployment: Deployment) -> Path:
    """The spec to deploy: the config, or a copy of it written under demo/specs/ with absolute paths and its own
    output_dir: without speculation (plain_of), on build.backend: reference (reference_of), or with the schedule's
    K = 0 thresholds removed (kept_on)."""
    path = ROOT / deployment.spec
    if not (deployment.plain_of or deployment.reference_of or deployment.kept_on):
        return path
    import yaml

    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    variant = "plain" if deployment.plain_of else "kept-on" if deployment.kept_on else "reference"
    name = f"{data['name']}-{variant}"
    data.update(name=name, output_dir=str(ROOT / "demo" / f"build-{name.removeprefix('demo-')}"))
    for key, field in (("target", "model"), ("draft", "model"), ("medusa", "heads")):
        if key in data and isinstance(data[key].get(field), str):
            data[key][field] = str((path.parent / data[key][field]).resolve())
    if deployment.plain_of:
        data["speculative"] = {"mode": "none"}
        for key in ("draft", "medusa"):
            data.pop(key, None)
    elif deployment.kept_on:
        schedule = data["speculative"].get("draft_len_schedule") or {}
        data["speculative"]["draft_len_schedule"] = {size: k for size, k in schedule.items() if k > 0}
    else:
        data["build"]["backend"] = "reference"
    derived = ROOT / "demo" / "specs" / f"{name}.yaml"
    derived.parent.mkdir(parents=True, exist_ok=True)
    how = {"plain": "without speculation", "kept-on": "with its schedule's K = 0 thresholds removed",
           "reference": "on build.backend: reference"}[variant]
    text = f"# {deployment.spec} {how} (written by bench/serving_bench.py)\n" + yaml.safe_dump(
        data, sort_keys=False)
    if not derived.is_file() or derived.read_text(encoding="utf-8") != text:  # unchanged: stages stay up to date
        derived.write_text(text, encoding="utf-8")
    return derived


def prepare(spec_path: Path) -> Path:
    """convert → build → deploy for one spec (each a no-op when up to date), as `specbuild convert/build/deploy`
    run them (the PyTorch flow included); returns the repository."""
    from specbuild.build import build_pipeline
    from specbuild.convert.run import convert_spec
    from specbuild.deploy.repository import deploy_repository
    from specbuild.spec import load_spec

    convert_spec(spec_path, console=console)
    spec = load_spec(spec_path)
    build_pipeline(spec, console=console)
    result = deploy_repository(spec, console=console)
    console.print(f"{spec_path.name}: {result.summary()}", highlight=False, soft_wrap=True)
    return result.repository


def existing(spec_path: Path) -> Path:
    from specbuild.spec import load_spec

    repository = load_spec(spec_path).deploy.model_repository
    if repository is None or not (repository / "manifest.json").is_file():
        raise SpecbuildError(f"{spec_path.name}: no deployed repository at {repository}",
                             hint="run without --no-prepare")
    return repository


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 16],
                        help="concurrent clients; every deployment is measured at each")
    parser.add_argument("--only", nargs="+", choices=list(DEPLOYMENTS), default=None,
                        help="serve only these deployments (plain is always served: it is the baseline)")
    parser.add_argument("--max-tokens", type=int, default=MAX_TOKENS)
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="interleaved rounds; the median is kept")
    parser.add_argument("--requests", type=int, default=None,
                        help=f"per run (default: every prompt once, and at least {STEADY_PER_CLIENT} per client)")
    parser.add_argument("--out", type=Path, default=BENCH / "results")
    parser.add_argument("--no-prepare", action="store_true",
                        help="serve the deployments as they are, without convert/build/deploy")
    parser.add_argument("--note", default="", help="recorded with the figures (e.g. why --no-prepare was used)")
    args = parser.parse_args()

    from specbuild.demo.models import build_demo_models

    build_demo_models(ROOT / "demo" / "models")
    repositories, failed = {}, {}
    chosen = {name: d for name, d in DEPLOYMENTS.items()
              if args.only is None or name in args.only or name == BASELINE or name == d.baseline
              or any(DEPLOYMENTS[o].baseline == name for o in args.only or ())}
    plain: dict[str, list[int]] = {}
    for name, deployment in chosen.items():
        try:
            path = spec_path(deployment)
            plain[name] = plain_at(path, args.concurrency)
            repositories[name] = existing(path) if args.no_prepare else prepare(path)
        except SpecbuildError as err:  # report the others; the failure is recorded beside them
            console.print(f"[red]{name} ({deployment.spec}) could not be deployed:[/] {err}", highlight=False,
                          soft_wrap=True)
            failed[name] = str(err)
    if BASELINE not in repositories or len(repositories) < 2:
        console.print("nothing to compare: the plain deployment and at least one speculative one are needed")
        nothing = Target("plain and a speculative deployment served", False)
        return finish("serving_bench", [*undeployed(failed), nothing])
    tokenizer = repositories[BASELINE] / "preprocessing" / "tokenizer"
    counter = TokenCounter(tokenizer if tokenizer.is_dir() else None)

    names = list(repositories)
    results: dict[str, dict[int, Summary]] = {name: {} for name in names}
    unserved: dict[str, str] = {}
    entry: dict[str, str] = {}
    with ExitStack() as stack:
        servers = {}
        for name, repo in repositories.items():
            with console.status(f"starting tritonserver for {name}…"):
                servers[name] = stack.enter_context(TritonServer(repo, log_file=args.out.parent / "work" /
                                                                 f"serving-{name}.log"))
            with LLMClient(servers[name].grpc_url) as client:
                entry[name] = client.model.name
        for concurrency in args.concurrency:
            load = Load(prompts=DEFAULT_PROMPTS, max_tokens=args.max_tokens, concurrency=concurrency,
                        requests=args.requests, per_client=STEADY_PER_CLIENT)
            measured = names
            rounds: dict[str, list[Summary]] = {name: [] for name in measured}
            for index, order in enumerate(rotations(measured, args.rounds)):
                for name in order:
                    with console.status(f"round {index + 1}/{args.rounds}: {name}, concurrency {concurrency}…"):
                        try:
                            rounds[name].append(run_load(servers[name].grpc_url, load, counter=counter))
                        except SpecbuildError as err:  # every request failed: a miss, the others still run
                            console.print(f"[red]{name} at concurrency {concurrency}:[/] {err}", highlight=False,
                                          soft_wrap=True)
                            unserved.setdefault(name, str(err))
            for name in measured:
                if rounds[name]:
                    results[name][concurrency] = median_round(rounds[name])
            Console().print(table({n: results[n][concurrency] for n in measured if concurrency in results[n]},
                                  baseline=BASELINE,
                                  title=f"concurrency {concurrency}, gRPC streaming, {args.max_tokens} new tokens"))

    results = {name: by_c for name, by_c in results.items() if by_c}
    report = to_report(results, entry, args, counter, plain)
    report["not_deployed"] = failed
    report["not_served"] = unserved
    report["prepared"] = not args.no_prepare
    report["note"] = args.note
    write_results(args.out, "serving", report, markdown(report))
    series = {name: list(by_c.values()) for name, by_c in results.items()}
    title = f"demo deployments on tritonserver, gRPC streaming, {args.max_tokens} new tokens"
    plot(series, args.out / "serving.png", title)
    curve(series, args.out / "serving-curve.png", title)
    console.print(f"wrote {args.out / 'serving.json'}, serving.md, serving.png, serving-curve.png", highlight=False)
    for target in report["targets"]:
        console.print(f"{'PASS' if target['met'] else 'FAIL'}: {target['target']} (measured {target['measured']})",
                      highlight=False)
    for figure in report["reported"]:
        console.print(f"reported: {figure['figure']} {figure['measured']}x", highlight=False)
    return finish("serving_bench", judged(report, {**failed, **unserved}))


def undeployed(failed: dict[str, str]) -> list[Target]:
    """A missed target per deployment that could not be deployed (its error's first line as the figure)."""
    return [Target(f"{name} deployed", False, error.splitlines()[0] if error else "") for name, error in failed.items()]


def measured_text(target: dict[str, Any]) -> str:
    """A target's figure as the table and the verdict show it, with the account that judged it, if one did, and
    whether the deployment had speculation switched off at that load."""
    text = "not measured" if target["measured"] is None else str(target["measured"])
    if target.get("speculation_off"):
        text += (" (speculation off at this load: the schedule's length is 0 at this many sequences, so a full batch"
                 " decodes plainly and this is mostly plain decoding's figure)")
    if target.get("streamed"):
        mine, base, theirs = target["streamed"]
        text += (f" (streamed in coarser chunks: {mine:.1f} tokens per response, {base} {theirs:.1f}; fewer responses"
                 " cost the server less, and the client waits longer between them)")
    if target.get("control") is not None:
        text += f" (A/A control at this load, plain's repository behind two servers: {target['control']}x)"
    return f"{text} ({target['accounted']})" if target.get("accounted") else text


def judged(report: dict[str, Any], failed: dict[str, str]) -> list[Target]:
    """The report's targets (one not measured is missed) and every deployment that could not be deployed."""
    targets = [Target(t["target"], bool(t["met"]), measured_text(t)) for t in report["targets"]]
    targets += [Target(f["figure"], None, "not measured" if f["measured"] is None else str(f["measured"]))
                for f in report.get("reported", [])]
    return [*targets, *undeployed(failed)]


def curve(series: dict[str, list[Summary]], path: Path, title: str) -> Path:
    """Output tokens/s against concurrency, one line per deployment."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6.5, 4))
    for name, runs in series.items():
        runs = sorted(runs, key=lambda s: s.concurrency)
        axis.plot([s.concurrency for s in runs], [s.output_tokens_per_s for s in runs], marker="o", label=name)
    axis.set_xlabel("concurrent clients")
    axis.set_ylabel("output tokens/s (repository tokenizer)")
    axis.set_xscale("log", base=2)
    axis.grid(alpha=0.3)
    axis.legend()
    axis.set_title(title, fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def to_report(results: dict[str, dict[int, Summary]], entry: dict[str, str], args: argparse.Namespace,
              counter: TokenCounter, plain: Mapping[str, Sequence[int]]) -> dict[str, Any]:
    machine = machine_info(["nvidia-pytriton", "tritonclient", "transformers"])
    ratios: dict[str, dict[str, dict[str, float | None]]] = {}
    for name, by_c in results.items():
        base = results.get(DEPLOYMENTS[name].baseline, {})
        if name == BASELINE:
            continue
        ratios[name] = {str(c): {"output_tokens_per_s": speedup(s, base[c], "output_tokens_per_s"),
                                 "ttft_mean": speedup(s, base[c], "ttft_ms.mean"),
                                 "ttft_p50": ttft_ratio(s, base[c]),
                                 "itl_mean": speedup(s, base[c], "itl_ms.mean")}
                        for c, s in by_c.items() if c in base}
    return {
        "what": "demo deployments served by tritonserver; client-side figures over gRPC streaming",
        "deployments": {name: {"spec": DEPLOYMENTS[name].spec, "entry_model": entry[name],
                               "baseline": DEPLOYMENTS[name].baseline, "judged": DEPLOYMENTS[name].judged,
                               "plain_of_spec": DEPLOYMENTS[name].plain_of,
                               "speculation_off_at": list(plain.get(name, []))} for name in results},
        "load": {"prompts": list(DEFAULT_PROMPTS), "max_tokens": args.max_tokens, "rounds": args.rounds,
                 "concurrency": args.concurrency, "tokens_counted_by": counter.source,
                 "requests": args.requests, "requests_per_client": None if args.requests else STEADY_PER_CLIENT},
        "results": {name: {str(c): s.to_json() for c, s in by_c.items()} for name, by_c in results.items()},
        "ratios_vs_baseline": ratios,
        "targets": targets(results, ratios, accounts(args.out, machine), plain),
        "reported": reported(ratios),
        "machine": machine,
    }


SAME_MACHINE = ("git_commit", "platform", "nproc", "cpu", "demo_models")
"""The machine_info fields that must agree for one results file's figures to explain another's."""


def accounts(out: Path, machine: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per deployment with an `account`, that results file's account when it was measured on this commit and
    machine with no uncommitted served code (a stale or foreign account explains nothing), else nothing. The
    machine is also its CPU and the demo models' training: the same platform string covered two CPUs 1.5x apart,
    whose demo weights made acceptances of 0.83 and 0.56 on the same draft-target repository."""
    found = {}
    for name, deployment in DEPLOYMENTS.items():
        path = out / deployment.account if deployment.account else None
        if path is None or not path.is_file():
            continue
        report = json.loads(path.read_text(encoding="utf-8"))
        theirs = report.get("machine", {})
        if (report.get("account") and not report.get("settings", {}).get("uncommitted_specbuild_files")
                and all(theirs.get(key) == machine.get(key) for key in SAME_MACHINE)):
            found[name] = {**report["account"], "file": deployment.account}
    return found


def plain_at(spec_file: Path, concurrency: Sequence[int]) -> list[int]:
    """The concurrencies at which the spec's load rules decode plainly (draft_len_schedule's K or tree 0, or above
    max_concurrency): there a loaded target measures plain decoding, with speculation switched off, not speculation
    that pays. A spec's schedule reads "from" each threshold whatever the line; deploy rewrites it for the lines
    that read "up to" (contracts.llm_api.up_to_schedule). Where this process has SCHEDULE_ENV set, the servers it
    starts run that schedule instead (an ad hoc probe of another one), and so does this (served_steps)."""
    from specbuild.runtime.schedule import DraftSchedule, served_steps
    from specbuild.spec import load_spec

    spec = load_spec(spec_file)
    rules = spec.speculative
    if rules.mode == "none":
        return []
    steps = served_steps(rules.draft_len_schedule)
    if not (steps or rules.max_concurrency):
        return []
    schedule = DraftSchedule(steps, steps.get(1, 1), rules.max_concurrency)
    return [c for c in concurrency if schedule.draft_len(c) == 0]


def ttft_ratio(summary: Summary, baseline: Summary) -> float | None:
    """TTFT p50 over the baseline's at the same concurrency (> 1: the first token comes later)."""
    mine, theirs = summary.ttft_ms.get("p50"), baseline.ttft_ms.get("p50")
    return mine / theirs if mine and theirs else None


def targets(results: dict[str, dict[int, Summary]], ratios: dict[str, Any],
            found: dict[str, dict[str, Any]] | None = None,
            speculation_off: Mapping[str, Sequence[int]] | None = None) -> list[dict[str, Any]]:
    """Every target with its measured ratio (None: not measured in this run, which is a miss). A deployment with
    an account in `found` (see `accounts`) that misses SPEEDUP_MIN at concurrency 1 meets it where that account
    holds: the flow it is served by, not its speculation, caps it; the target then names the account. A loaded
    target at a concurrency in `speculation_off[name]` (see `plain_at`) says that the deployment decodes plainly
    there. A tokens/s target carries the A/A control's ratio at its concurrency (`control`), the run's own measure
    of how far apart two identical deployments land: said beside the figure, the verdict unchanged."""
    out = []
    plain = results.get(BASELINE, {})
    control_name = next((name for name, d in DEPLOYMENTS.items() if d.control), None)
    if 1 in plain and 8 in plain:
        measured = plain[8].output_tokens_per_s / plain[1].output_tokens_per_s
        out.append({"target": f"plain at concurrency 8 >= {BATCHING_MIN}x plain at concurrency 1",
                    "measured": round(measured, 3), "met": measured >= BATCHING_MIN})
    levels = sorted({c for by_c in results.values() for c in by_c})
    for name, deployment in DEPLOYMENTS.items():
        if name == BASELINE or name not in results or not deployment.loaded_targets:
            continue
        base = deployment.baseline
        for c in levels:
            if c == 1 and not deployment.judged:
                continue  # reported
            figures = ratios.get(name, {}).get(str(c), {})
            floor = SPEEDUP_MIN if c == 1 else LOADED_MIN
            measured = figures.get("output_tokens_per_s")
            target = {"target": f"{name} >= {floor}x {base} tokens/s at concurrency {c}",
                      "measured": None if measured is None else round(measured, 3),
                      "met": measured is not None and measured >= floor}
            acc = (found or {}).get(name) if c == 1 else None
            if acc is not None and measured is not None and not target["met"]:
                target.update(target=f"{target['target']}, or the measured account ({acc['file']}) holds",
                              met=bool(acc["holds"]), accounted=f"{acc['file']}: {acc['summary']}")
            coarser = _coarser_stream(results[name].get(c), results.get(base, {}).get(c))
            if coarser is not None:
                target["streamed"] = (coarser[0], base, coarser[1])
            control = ratios.get(control_name, {}).get(str(c), {}).get("output_tokens_per_s")
            if control is not None:
                target["control"] = round(control, 3)
            off = c > 1 and c in (speculation_off or {}).get(name, ())
            out.append({**target, "speculation_off": True} if off else target)
            if c > 1:
                ttft = figures.get("ttft_p50")
                out.append({"target": f"{name} TTFT p50 <= {TTFT_MAX}x {base}'s at concurrency {c}",
                            "measured": None if ttft is None else round(ttft, 3),
                            "met": ttft is not None and ttft <= TTFT_MAX,
                            **({"speculation_off": True} if off else {})})
    return out


def _coarser_stream(mine: Summary | None, theirs: Summary | None) -> tuple[float, float] | None:
    """(tokens per response, the baseline's) where a deployment streamed in chunks COARSER_STREAM times its
    baseline's or more: part of its tokens/s is then fewer responses, which its verdict says (not a target)."""
    a = getattr(mine, "tokens_per_response", None)
    b = getattr(theirs, "tokens_per_response", None)
    return (a, b) if a and b and a >= COARSER_STREAM * b else None


def reported(ratios: dict[str, Any]) -> list[dict[str, Any]]:
    """The figures no target judges, each deployment's tokens/s over its baseline's: at concurrency 1 for the
    deployments judged only under load, at every concurrency for a plain baseline and a probe."""
    return [{"figure": f"{name} tokens/s vs {DEPLOYMENTS[name].baseline} at concurrency {c}",
             "measured": None if figures["output_tokens_per_s"] is None else round(figures["output_tokens_per_s"], 3)}
            for name, by_c in ratios.items() if not DEPLOYMENTS[name].judged for c, figures in by_c.items()
            if c == "1" or not DEPLOYMENTS[name].loaded_targets]


def _requests(load: dict[str, Any]) -> str:
    """How many requests a run sent, as the report's load says (older reports: the load generator's default)."""
    if load.get("requests"):
        return f"{load['requests']} requests"
    return f"every prompt once and at least {load.get('requests_per_client') or 2} requests per client"


def _figure(value: float | None, spec: str) -> str:
    """A figure of the table, or – where the run has none (older results, or no second response)."""
    return "–" if value is None or math.isnan(value) else format(value, spec)


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "# Serving benchmark: demo deployments on tritonserver",
        "",
        f"{report['what']}. Tokens counted by {report['load']['tokens_counted_by']}; "
        f"{report['load']['max_tokens']} new tokens per request over {len(report['load']['prompts'])} prompts, "
        f"{_requests(report['load'])} a run; "
        f"median of {report['load']['rounds']} interleaved rounds, each in another order (the first starting at the "
        "first deployment listed, each next one further down the list). ITL = (latency − TTFT) / (tokens − 1). "
        "Tokens per response: output tokens / responses that carried text (1: every token streamed alone); longest "
        "gap: each request's longest wait between two such responses, the median over requests. "
        "Acceptance = total_accepted_draft_tokens / total_draft_tokens from the model outputs (– : none reported).",
        "",
        "| deployment | entry model | concurrency | output tok/s | × baseline | TTFT p50 ms | TTFT p99 ms "
        "| ITL mean ms | tokens per response | longest gap p50 ms | latency mean ms | acceptance "
        "| tok/s of each round |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, by_c in report["results"].items():
        for c, s in by_c.items():
            ratio = report["ratios_vs_baseline"].get(name, {}).get(c, {}).get("output_tokens_per_s")
            baseline = report["deployments"][name]["baseline"]
            acc = s["acceptance_rate"]
            lines.append(
                f"| {name} | {report['deployments'][name]['entry_model']} | {c} | {s['output_tokens_per_s']:.1f} | "
                f"{f'{ratio:.2f}× {baseline}' if ratio else '–'} | {s['ttft_ms']['p50']:.1f} | "
                f"{s['ttft_ms']['p99']:.1f} | "
                f"{s['itl_ms']['mean']:.2f} | {_figure(s.get('tokens_per_response'), '.1f')} | "
                f"{_figure(s.get('longest_gap_ms', {}).get('p50'), '.0f')} | "
                f"{s['latency_ms']['mean']:.0f} | {f'{acc:.3f}' if acc is not None else '–'} | "
                f"{', '.join(f'{x:.0f}' for x in s['extra'].get('rounds_tokens_per_s', []))} |"
            )
    if not report.get("prepared", True):
        lines += ["", "The deployments were served as found (`--no-prepare`), not rebuilt for this run."]
    if report.get("note"):
        lines += ["", f"Note: {report['note']}"]
    lines += ["", "Baselines: every deployment is compared with `plain` (the demo target decoded without speculation) "
              "except `medusa2`, whose base Medusa-2 fine-tuned: it is compared with `medusa2-base`, that new base "
              "served without speculation (configs/demo-medusa2.yaml's target, speculative.mode none). At "
              "concurrency 1 plain, draft-target, Medusa, EAGLE-3 and Draft_Target through llmapi are judged, the "
              "others' ratios reported; at 8 and 16 every speculative deployment is judged on tokens/s and TTFT "
              "p50 against its baseline. `medusa2-base` decodes without speculation: its ratios to plain (another "
              "model, so another speed) are reported, not judged. `plain-again` is the A/A control: plain's own "
              "repository behind a second tritonserver, in the same rounds; its ratios to plain (1.0 but for the "
              "machine's noise) are reported, and show how far apart two identical deployments land in this run."]
    for name, error in report.get("not_deployed", {}).items():
        lines += ["", f"**{name} was not deployed** ({DEPLOYMENTS[name].spec}): `{error.splitlines()[0]}`"]
    for name, error in report.get("not_served", {}).items():
        lines += ["", f"**{name} failed every request of a run** ({DEPLOYMENTS[name].spec}): "
                      f"`{error.splitlines()[0]}`"]
    m = report["machine"]
    lines += ["", "| target | measured | verdict |", "|---|---:|---|"]
    lines += [f"| {t['target']} | {measured_text(t)} | {'PASS' if t['met'] else 'FAIL'} |" for t in report["targets"]]
    lines += [f"| {f['figure']} | {f['measured'] if f['measured'] is not None else 'not measured'} | reported |"
              for f in report.get("reported", [])]
    lines += [
        "",
        f"{machine_line(m)}, load average at the end {m['loadavg_end']}.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
