"""Serving benchmark: the demo deployments behind a real tritonserver, measured from the client side.

Builds (or reuses, every stage is incremental) the three demo deployments through the stage functions —
draft-target (configs/demo.yaml), Medusa (configs/demo-medusa.yaml) and the same target without speculation
(configs/demo-plain.yaml) — serves all three at once with the tritonserver bundled in nvidia-pytriton (or the
one on PATH), and drives each entry model over gRPC streaming at concurrency 1, 8 and 16 with `specbuild bench`'s
load generator. Rounds interleave the deployments (so a busy neighbour on a shared machine slows all of them
alike) and the median round by tokens/s is kept. Output tokens are counted with the deployment's own tokenizer
(re-encoding each answer), the same for every deployment.

Targets, each a ratio measured side by side in the same run: plain at concurrency 8 >= 3x its own tokens/s at
concurrency 1 (in-flight batching); draft-target and Medusa >= 1.3x plain at concurrency 1 and >= 1.0x plain at
8 and 16 (speculation never makes a loaded server slower). The script exits 1 when one is missed or a deployment
could not be deployed.

Writes bench/results/serving.json (every figure, machine info), serving.md (the table), serving.png (tokens/s,
TTFT and ITL by concurrency) and serving-curve.png (tokens/s against concurrency).
Run with `.venv/bin/python bench/serving_bench.py [--help]`.
"""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from machine_info import machine_info
from rich.console import Console
from targets import Target, finish

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT))

from specbuild.bench.client import LLMClient  # noqa: E402
from specbuild.bench.load import DEFAULT_PROMPTS, Load, Summary, TokenCounter, run_load  # noqa: E402
from specbuild.bench.report import plot, speedup, table  # noqa: E402
from specbuild.errors import SpecbuildError  # noqa: E402
from specbuild.serve.server import TritonServer  # noqa: E402

DEPLOYMENTS = {"plain": "configs/demo-plain.yaml", "draft-target": "configs/demo.yaml",
               "medusa": "configs/demo-medusa.yaml"}
BASELINE = "plain"
SPEEDUP_MIN = 1.3  # each speculative deployment's tokens/s vs plain at concurrency 1
LOADED_MIN = 1.0  # ... and at every higher concurrency
BATCHING_MIN = 3.0  # plain at concurrency 8 vs plain at concurrency 1
console = Console(stderr=True)


def prepare(spec_path: Path) -> Path:
    """convert → build → deploy for one spec (each a no-op when up to date); returns the repository."""
    from specbuild.build import build_pipeline
    from specbuild.convert.pipeline import convert_checkpoint, requests_from_spec
    from specbuild.deploy.repository import deploy_repository
    from specbuild.spec import load_spec

    spec = load_spec(spec_path)
    for request in requests_from_spec(spec):
        convert_checkpoint(request, console=console)
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


def median_round(rounds: list[Summary]) -> Summary:
    ordered = sorted(rounds, key=lambda s: s.output_tokens_per_s)
    chosen = ordered[(len(ordered) - 1) // 2]
    chosen.extra["rounds_tokens_per_s"] = [round(s.output_tokens_per_s, 2) for s in rounds]
    return chosen


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 16])
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the median is kept")
    parser.add_argument("--requests", type=int, default=None, help="per run (default: 8, or 2 per client)")
    parser.add_argument("--out", type=Path, default=BENCH / "results")
    parser.add_argument("--no-prepare", action="store_true",
                        help="serve the deployments as they are, without convert/build/deploy")
    parser.add_argument("--note", default="", help="recorded with the figures (e.g. why --no-prepare was used)")
    args = parser.parse_args()

    from specbuild.demo.models import build_demo_models

    build_demo_models(ROOT / "demo" / "models")
    repositories, failed = {}, {}
    for name, path in DEPLOYMENTS.items():
        try:
            repositories[name] = existing(ROOT / path) if args.no_prepare else prepare(ROOT / path)
        except SpecbuildError as err:  # report the others; the failure is recorded beside them
            console.print(f"[red]{name} ({path}) could not be deployed:[/] {err}", highlight=False, soft_wrap=True)
            failed[name] = str(err)
    if BASELINE not in repositories or len(repositories) < 2:
        console.print("nothing to compare: the plain deployment and at least one speculative one are needed")
        nothing = Target("plain and a speculative deployment served", False)
        return finish("serving_bench", [*undeployed(failed), nothing])
    tokenizer = repositories[BASELINE] / "preprocessing" / "tokenizer"
    counter = TokenCounter(tokenizer if tokenizer.is_dir() else None)

    names = list(repositories)
    results: dict[str, dict[int, Summary]] = {name: {} for name in names}
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
                        requests=args.requests)
            rounds: dict[str, list[Summary]] = {name: [] for name in names}
            for index in range(args.rounds):
                for name, server in servers.items():
                    with console.status(f"round {index + 1}/{args.rounds}: {name}, concurrency {concurrency}…"):
                        rounds[name].append(run_load(server.grpc_url, load, counter=counter))
            for name in names:
                results[name][concurrency] = median_round(rounds[name])
            Console().print(table({n: results[n][concurrency] for n in names}, baseline=BASELINE,
                                  title=f"concurrency {concurrency}, gRPC streaming, {args.max_tokens} new tokens"))

    report = to_report(results, entry, args, counter)
    report["not_deployed"] = failed
    report["prepared"] = not args.no_prepare
    report["note"] = args.note
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "serving.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / "serving.md").write_text(markdown(report))
    series = {name: list(by_c.values()) for name, by_c in results.items()}
    title = f"demo deployments on tritonserver, gRPC streaming, {args.max_tokens} new tokens"
    plot(series, args.out / "serving.png", title)
    curve(series, args.out / "serving-curve.png", title)
    console.print(f"wrote {args.out / 'serving.json'}, serving.md, serving.png, serving-curve.png", highlight=False)
    for target in report["targets"]:
        console.print(f"{'PASS' if target['met'] else 'FAIL'}: {target['target']} "
                      f"(measured {target['measured']})", highlight=False)
    return finish("serving_bench", judged(report, failed))


def undeployed(failed: dict[str, str]) -> list[Target]:
    """A missed target per deployment that could not be deployed (its error's first line as the figure)."""
    return [Target(f"{name} deployed", False, error.splitlines()[0] if error else "") for name, error in failed.items()]


def judged(report: dict[str, Any], failed: dict[str, str]) -> list[Target]:
    """The report's targets (one not measured is missed) and every deployment that could not be deployed."""
    targets = [Target(t["target"], bool(t["met"]), "not measured" if t["measured"] is None else str(t["measured"]))
               for t in report["targets"]]
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
              counter: TokenCounter) -> dict[str, Any]:
    ratios = {
        name: {str(c): {"output_tokens_per_s": speedup(s, results[BASELINE][c], "output_tokens_per_s"),
                        "ttft_mean": speedup(s, results[BASELINE][c], "ttft_ms.mean"),
                        "itl_mean": speedup(s, results[BASELINE][c], "itl_ms.mean")}
               for c, s in by_c.items()}
        for name, by_c in results.items() if name != BASELINE
    }
    return {
        "what": "demo deployments served by tritonserver; client-side figures over gRPC streaming",
        "deployments": {name: {"spec": DEPLOYMENTS[name], "entry_model": entry[name]} for name in results},
        "load": {"prompts": list(DEFAULT_PROMPTS), "max_tokens": args.max_tokens, "rounds": args.rounds,
                 "concurrency": args.concurrency, "tokens_counted_by": counter.source},
        "results": {name: {str(c): s.to_json() for c, s in by_c.items()} for name, by_c in results.items()},
        "ratios_vs_plain": ratios,
        "targets": targets(results, ratios),
        "machine": machine_info(["nvidia-pytriton", "tritonclient", "transformers"]),
    }


def targets(results: dict[str, dict[int, Summary]], ratios: dict[str, Any]) -> list[dict[str, Any]]:
    """Every target with its measured ratio (None: not measured in this run, which is a miss)."""
    out = []
    plain = results.get(BASELINE, {})
    if 1 in plain and 8 in plain:
        measured = plain[8].output_tokens_per_s / plain[1].output_tokens_per_s
        out.append({"target": f"plain at concurrency 8 >= {BATCHING_MIN}x plain at concurrency 1",
                    "measured": round(measured, 3), "met": measured >= BATCHING_MIN})
    for name in DEPLOYMENTS:
        if name == BASELINE:
            continue
        for c in sorted({c for by_c in results.values() for c in by_c}):
            floor = SPEEDUP_MIN if c == 1 else LOADED_MIN
            measured = ratios.get(name, {}).get(str(c), {}).get("output_tokens_per_s")
            out.append({"target": f"{name} >= {floor}x plain tokens/s at concurrency {c}",
                        "measured": None if measured is None else round(measured, 3),
                        "met": measured is not None and measured >= floor})
    return out


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "# Serving benchmark: demo deployments on tritonserver",
        "",
        f"{report['what']}. Tokens counted by {report['load']['tokens_counted_by']}; "
        f"{report['load']['max_tokens']} new tokens per request over {len(report['load']['prompts'])} prompts; "
        f"median of {report['load']['rounds']} interleaved rounds. ITL = (latency − TTFT) / (tokens − 1). "
        "Acceptance = total_accepted_draft_tokens / total_draft_tokens from the model outputs (– : none reported).",
        "",
        "| deployment | entry model | concurrency | output tok/s | × plain | TTFT p50 ms | TTFT p99 ms "
        "| ITL mean ms | latency mean ms | acceptance | tok/s of each round |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, by_c in report["results"].items():
        for c, s in by_c.items():
            ratio = report["ratios_vs_plain"].get(name, {}).get(c, {}).get("output_tokens_per_s")
            acc = s["acceptance_rate"]
            lines.append(
                f"| {name} | {report['deployments'][name]['entry_model']} | {c} | {s['output_tokens_per_s']:.1f} | "
                f"{f'{ratio:.2f}×' if ratio else '–'} | {s['ttft_ms']['p50']:.1f} | {s['ttft_ms']['p99']:.1f} | "
                f"{s['itl_ms']['mean']:.2f} | "
                f"{s['latency_ms']['mean']:.0f} | {f'{acc:.3f}' if acc is not None else '–'} | "
                f"{', '.join(f'{x:.0f}' for x in s['extra'].get('rounds_tokens_per_s', []))} |"
            )
    if not report.get("prepared", True):
        lines += ["", "The deployments were served as found (`--no-prepare`), not rebuilt for this run."]
    if report.get("note"):
        lines += ["", f"Note: {report['note']}"]
    for name, error in report.get("not_deployed", {}).items():
        lines += ["", f"**{name} was not deployed** ({DEPLOYMENTS[name]}): `{error.splitlines()[0]}`"]
    m = report["machine"]
    lines += ["", "| target | measured | verdict |", "|---|---:|---|"]
    lines += [f"| {t['target']} | {t['measured'] if t['measured'] is not None else 'not measured'} | "
              f"{'PASS' if t['met'] else 'FAIL'} |" for t in report["targets"]]
    lines += [
        "",
        f"Machine: {m['nproc']} cores, {m['ram_gib']} GiB, {m['platform']}, Python {m['python']}, torch {m['torch']}, "
        f"nvidia-pytriton {m.get('nvidia-pytriton')}, commit {m['git_commit']}, {m['date']}, "
        f"load average at the end {m['loadavg_end']}.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
