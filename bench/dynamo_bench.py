"""Dynamo benchmark: the same serving engine behind NVIDIA Dynamo (one and two workers) and behind tritonserver.

configs/demo-dynamo.yaml (the demo target with EAGLE-3 speculation, K 4, on specbuild's reference serving engine) is
converted, built and deployed; its Triton llmapi repository comes from a derived copy (demo/specs/, deploy.target:
triton, decoupled so responses stream) of the same spec, so both serve the same checkpoints with the same LLM-API
settings. Three servers run at once, each idle while another is measured: Dynamo 1.6.1's frontend (KV router) with one
reference worker, the same with two, and tritonserver (bundled with nvidia-pytriton) on the llmapi repository. At
each concurrency (default 1, 8, 16) rounds interleave the three and the median round by tokens/s is kept. Dynamo is
driven over OpenAI /v1/completions streaming (acceptance from usage.completion_tokens_details), tritonserver over
gRPC streaming, both by `specbuild bench`'s load (specbuild.bench.load.run_load, with its OpenAI and Triton
clients); output tokens are counted with the target's tokenizer for both (specbuild.bench.load.TokenCounter). Each
concurrent client keeps one connection (a requests session; gRPC's stream for tritonserver), so no request pays a
connection's set-up.

Targets: Dynamo with one worker >= 0.9x tritonserver's tokens/s at concurrency 1 (the frontend costs little); two
workers >= one worker at concurrency 16. Exits 1 on a miss. Writes bench/results/dynamo.json and dynamo.md.
Run with `.venv/bin/python bench/dynamo_bench.py [--help]`.
"""

from __future__ import annotations

import argparse
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from machine_info import machine_info
from results_files import write_results
from rich.console import Console
from targets import Target, finish

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT))

from specbuild.bench.load import (  # noqa: E402
    DEFAULT_PROMPTS,
    Load,
    Summary,
    TokenCounter,
    median_round,
    run_load,
)
from specbuild.bench.report import table  # noqa: E402
from specbuild.errors import SpecbuildError  # noqa: E402

SPEC = ROOT / "configs" / "demo-dynamo.yaml"
SYSTEMS = ("tritonserver", "dynamo-1", "dynamo-2")
console = Console(stderr=True)


def triton_spec() -> Path:
    """configs/demo-dynamo.yaml as a Triton deployment: absolute paths, deploy.target triton, streaming."""
    import yaml

    data = yaml.safe_load(SPEC.read_text(encoding="utf-8"))
    name = f"{data['name']}-triton"
    data.update(name=name, output_dir=str(ROOT / "demo" / "build-dynamo-triton"))
    for key in ("target", "draft"):
        data[key]["model"] = str((SPEC.parent / data[key]["model"]).resolve())
    data["deploy"] = {"decoupled": True}
    derived = ROOT / "demo" / "specs" / f"{name}.yaml"
    derived.parent.mkdir(parents=True, exist_ok=True)
    text = "# configs/demo-dynamo.yaml on tritonserver (written by bench/dynamo_bench.py)\n" + yaml.safe_dump(
        data, sort_keys=False)
    if not derived.is_file() or derived.read_text(encoding="utf-8") != text:
        derived.write_text(text, encoding="utf-8")
    return derived


def prepare(path: Path) -> Any:
    """convert -> build -> deploy as the CLI runs them; the spec."""
    from specbuild.build import build_pipeline
    from specbuild.convert.run import convert_spec
    from specbuild.deploy.repository import deploy_repository
    from specbuild.dynamo.write import deploy_dynamo
    from specbuild.spec import load_spec

    convert_spec(path, console=console)
    spec = load_spec(path)
    build_pipeline(spec, console=console)
    deploy = deploy_dynamo if spec.deploy.target == "dynamo" else deploy_repository
    console.print(f"{path.name}: {deploy(spec, console=console).summary()}", highlight=False, soft_wrap=True)
    return spec


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 16])
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the median is kept")
    parser.add_argument("--requests", type=int, default=None, help="per run (default: 8, or 2 per client)")
    parser.add_argument("--out", type=Path, default=BENCH / "results")
    args = parser.parse_args()

    from specbuild.demo.models import build_demo_models
    from specbuild.dynamo.launch import DynamoServer
    from specbuild.dynamo.write import deployment_dir
    from specbuild.serve.server import TritonServer

    models = build_demo_models(ROOT / "demo" / "models")
    dynamo_spec = prepare(SPEC)
    triton = prepare(triton_spec())
    counter = TokenCounter(models["target"])
    work = BENCH / "work"
    results: dict[str, dict[int, Summary]] = {name: {} for name in SYSTEMS}
    with ExitStack() as stack:
        with console.status("starting tritonserver and two Dynamo deployments…"):
            server = stack.enter_context(TritonServer(triton.deploy.model_repository,
                                                      log_file=work / "dynamo-bench-triton.log"))
            dynamos = {}
            for workers in (1, 2):
                dynamo = DynamoServer(deployment_dir(dynamo_spec), workers=workers,
                                      log_dir=work / f"dynamo-bench-{workers}")
                stack.callback(dynamo.stop)
                dynamo.start()
                dynamos[f"dynamo-{workers}"] = dynamo
        for concurrency in args.concurrency:
            load = Load(prompts=DEFAULT_PROMPTS, max_tokens=args.max_tokens, concurrency=concurrency,
                        requests=args.requests)
            rounds: dict[str, list[Summary]] = {name: [] for name in SYSTEMS}
            for index in range(args.rounds):
                for name in SYSTEMS:
                    with console.status(f"round {index + 1}/{args.rounds}: {name}, concurrency {concurrency}…"):
                        try:
                            if name == "tritonserver":
                                rounds[name].append(run_load(server.grpc_url, load, counter=counter))
                            else:
                                rounds[name].append(run_load(dynamos[name].url, load, model=dynamos[name].model,
                                                             protocol="openai", counter=counter))
                        except SpecbuildError as err:
                            console.print(f"[red]{name} at concurrency {concurrency}:[/] {err}", highlight=False)
            for name in SYSTEMS:
                if rounds[name]:
                    results[name][concurrency] = median_round(rounds[name])
            Console().print(table({n: results[n][concurrency] for n in SYSTEMS if concurrency in results[n]},
                                  baseline="tritonserver",
                                  title=f"concurrency {concurrency}, streaming, {args.max_tokens} new tokens"))

    report = to_report(results, args)
    write_results(args.out, "dynamo", report, markdown(report))
    console.print(f"wrote {args.out / 'dynamo.json'} and dynamo.md", highlight=False)
    for target in report["targets"]:
        console.print(f"{'PASS' if target['met'] else 'FAIL'}: {target['target']} (measured {target['measured']})",
                      highlight=False)
    return finish("dynamo_bench", [Target(t["target"], t["met"], str(t["measured"])) for t in report["targets"]])


def _ratio(results: dict[str, dict[int, Summary]], a: str, b: str, concurrency: int) -> float | None:
    if concurrency not in results[a] or concurrency not in results[b]:
        return None
    base = results[b][concurrency].output_tokens_per_s
    return results[a][concurrency].output_tokens_per_s / base if base else None


def to_report(results: dict[str, dict[int, Summary]], args: argparse.Namespace) -> dict[str, Any]:
    targets = []
    for a, b, c, floor, what in (("dynamo-1", "tritonserver", 1, 0.9,
                                  "Dynamo 1 worker >= 0.9x tritonserver tokens/s at concurrency 1"),
                                 ("dynamo-2", "dynamo-1", 16, 1.0,
                                  "Dynamo 2 workers >= 1 worker tokens/s at concurrency 16")):
        ratio = _ratio(results, a, b, c)
        targets.append({"target": what, "measured": None if ratio is None else round(ratio, 3),
                        "met": ratio is not None and ratio >= floor})
    return {
        "machine": machine_info(["ai-dynamo", "ai-dynamo-runtime", "nvidia-pytriton", "torch"]),
        "spec": str(SPEC.relative_to(ROOT)), "max_tokens": args.max_tokens, "rounds": args.rounds,
        "results": {name: {str(c): s.to_json() for c, s in by_c.items()} for name, by_c in results.items()},
        "targets": targets,
    }


def markdown(report: dict[str, Any]) -> str:
    lines = [f"# Dynamo vs tritonserver, one serving engine ({report['spec']}, EAGLE-3, reference engine on CPU)", "",
             f"{report['machine'].get('date', '')}; {report['machine'].get('nproc', '')} CPUs; "
             f"{report['max_tokens']} new tokens per request, streamed; median of {report['rounds']} interleaved "
             "rounds. Written by bench/dynamo_bench.py.", "",
             "| server | concurrency | tokens/s | TTFT p50 ms | TTFT p99 ms | acceptance | errors |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, by_c in report["results"].items():
        for c, s in by_c.items():
            rate = s["acceptance_rate"]
            lines.append(f"| {name} | {c} | {s['output_tokens_per_s']:.1f} | {s['ttft_ms']['p50']:.0f} | "
                         f"{s['ttft_ms']['p99']:.0f} | {'n/a' if rate is None else f'{rate:.3f}'} | {s['errors']} |")
    lines += ["", "| target | measured | met |", "| --- | ---: | --- |"]
    for t in report["targets"]:
        lines.append(f"| {t['target']} | {t['measured']}x | {'yes' if t['met'] else 'NO'} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
