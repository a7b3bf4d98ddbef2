"""Conversion benchmark: `specbuild convert` vs ModelOpt's `export_tensorrt_llm_checkpoint` vs `cp -r`.

Generates (once, cached under bench/work/) a random Llama-shaped fp16 checkpoint of more than 2 GB in several
safetensors shards, then runs every contender as its own child process on a warm page cache, taking wall time
from `time.perf_counter` around the child and peak RSS from the child's `os.wait4` rusage (`ru_maxrss`).
Also checks that specbuild's rank0.safetensors equals ModelOpt's tensor for tensor.

Writes bench/results/convert.json (every figure, machine info) and bench/results/convert.md (tables), then exits
1 if a target is missed or the checkpoints differ. Run with `make bench` or
`.venv/bin/python bench/convert_bench.py [--help]`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from machine_info import machine_info
from results_files import write_results
from safetensors import safe_open
from safetensors.torch import save_file
from targets import Target, finish

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
BIN = Path(sys.executable).parent
SHARD_BYTES = 500_000_000
SEED = 20240601
RSS_ABOVE_BASELINE_MAX_MIB = 1024.0  # target: specbuild's peak RSS < 1 GiB above the interpreter baseline
MODELOPT_RSS_RATIO_MIN = 3.0  # target: ModelOpt's peak RSS at least 3x specbuild's
CP_WALL_RATIO_MAX = 2.0  # target: specbuild's wall time at most 2x `cp -r`

# Every contender is started by this tiny launcher (python -I -S, ~10 MB) rather than by the benchmark itself: on
# Linux a child's ru_maxrss starts from the RSS of the process that spawned it (the exec'ing mm's high-water
# mark), so spawning from this torch-importing, tensor-generating process would put a floor of several hundred
# MB under every figure. The launcher times the child with perf_counter and reaps it with os.wait4.
LAUNCHER = """\
import json, os, sys, time
out, cmd = sys.argv[1], sys.argv[2:]
start = time.perf_counter()
pid = os.posix_spawnp(cmd[0], cmd, os.environ)
_, status, usage = os.wait4(pid, 0)
wall = time.perf_counter() - start
with open(out, "w") as fh:
    json.dump({"wall_s": wall, "maxrss_kib": usage.ru_maxrss, "exit": os.waitstatus_to_exitcode(status)}, fh)
"""

# The ModelOpt contender, as a user would run it: load with transformers, then export (tp 1; tp 0 divides by
# zero on a CPU-only machine). It prints its own phase times on the last line.
MODELOPT_SCRIPT = """\
import json, sys, time
t0 = time.perf_counter()
import torch
from transformers import LlamaForCausalLM
from modelopt.torch.export import export_tensorrt_llm_checkpoint
t1 = time.perf_counter()
model = LlamaForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float16)
t2 = time.perf_counter()
export_tensorrt_llm_checkpoint(model, "llama", dtype=torch.float16, export_dir=sys.argv[2],
                               inference_tensor_parallel=1)
t3 = time.perf_counter()
print("BENCH " + json.dumps({"import_s": t1 - t0, "load_s": t2 - t1, "export_s": t3 - t2}))
"""


# -- the generated checkpoint ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelShape:
    """A Llama-shaped model (GQA, untied lm_head)."""

    hidden: int = 2048
    intermediate: int = 5632
    heads: int = 16
    kv_heads: int = 4
    vocab: int = 32000
    layers: int = 22

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def hf_config(self) -> dict[str, Any]:
        """A transformers-5 style config.json."""
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "attention_bias": False,
            "attention_dropout": 0.0,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "dtype": "float16",
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "hidden_size": self.hidden,
            "initializer_range": 0.02,
            "intermediate_size": self.intermediate,
            "max_position_embeddings": 4096,
            "mlp_bias": False,
            "num_attention_heads": self.heads,
            "num_hidden_layers": self.layers,
            "num_key_value_heads": self.kv_heads,
            "pretraining_tp": 1,
            "rms_norm_eps": 1e-5,
            "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
            "tie_word_embeddings": False,
            "transformers_version": "5.14.1",
            "use_cache": True,
            "vocab_size": self.vocab,
        }

    def tensors(self) -> dict[str, tuple[int, ...]]:
        """HF tensor names and shapes, in file order."""
        h, q, kv, inter = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim, self.intermediate
        shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (self.vocab, h)}
        for layer in range(self.layers):
            p = f"model.layers.{layer}."
            shapes[p + "input_layernorm.weight"] = (h,)
            shapes[p + "self_attn.q_proj.weight"] = (q, h)
            shapes[p + "self_attn.k_proj.weight"] = (kv, h)
            shapes[p + "self_attn.v_proj.weight"] = (kv, h)
            shapes[p + "self_attn.o_proj.weight"] = (h, q)
            shapes[p + "post_attention_layernorm.weight"] = (h,)
            shapes[p + "mlp.gate_proj.weight"] = (inter, h)
            shapes[p + "mlp.up_proj.weight"] = (inter, h)
            shapes[p + "mlp.down_proj.weight"] = (h, inter)
        shapes["model.norm.weight"] = (h,)
        shapes["lm_head.weight"] = (self.vocab, h)
        return shapes

    def nbytes(self) -> int:
        return sum(2 * torch.Size(s).numel() for s in self.tensors().values())

    def shards(self) -> list[list[str]]:
        """Tensor names grouped into consecutive shards of about SHARD_BYTES."""
        groups: list[list[str]] = [[]]
        size = 0
        for name, shape in self.tensors().items():
            nbytes = 2 * torch.Size(shape).numel()
            if groups[-1] and size + nbytes > SHARD_BYTES:
                groups.append([])
                size = 0
            groups[-1].append(name)
            size += nbytes
        return groups


def _random_tensor(name: str, shape: tuple[int, ...], index: int) -> torch.Tensor:
    """Small seeded random fp16 values (norm weights around 1), reproducible per tensor."""
    gen = torch.Generator().manual_seed(SEED + index)
    values = torch.randn(shape, generator=gen, dtype=torch.float16).mul_(0.02)
    return values.add_(1.0) if name.endswith("norm.weight") else values


def _marker(model_dir: Path) -> Path:
    return model_dir.with_name(model_dir.name + ".complete.json")


def model_is_complete(model_dir: Path, shape: ModelShape) -> bool:
    """True when a previous run finished writing exactly this model (marker written last)."""
    try:
        marker = json.loads(_marker(model_dir).read_text())
    except (OSError, ValueError):
        return False
    if marker.get("shape") != asdict(shape) or marker.get("seed") != SEED:
        return False
    files: dict[str, int] = marker.get("files", {})
    return bool(files) and all(
        (model_dir / name).is_file() and (model_dir / name).stat().st_size == size for name, size in files.items()
    )


def generate_model(model_dir: Path, shape: ModelShape) -> None:
    """Write config, shards and index, holding only one shard's tensors in memory at a time."""
    shutil.rmtree(model_dir, ignore_errors=True)
    _marker(model_dir).unlink(missing_ok=True)
    model_dir.mkdir(parents=True)
    (model_dir / "config.json").write_text(json.dumps(shape.hf_config(), indent=2) + "\n")
    shapes = shape.tensors()
    order = {name: i for i, name in enumerate(shapes)}
    groups = shape.shards()
    weight_map: dict[str, str] = {}
    for number, names in enumerate(groups, start=1):
        filename = f"model-{number:05d}-of-{len(groups):05d}.safetensors"
        tensors = {name: _random_tensor(name, shapes[name], order[name]) for name in names}
        save_file(tensors, model_dir / filename, metadata={"format": "pt"})
        del tensors
        weight_map.update(dict.fromkeys(names, filename))
        print(f"  wrote {filename}", flush=True)
    index = {"metadata": {"total_size": shape.nbytes()}, "weight_map": weight_map}
    (model_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    files = {p.name: p.stat().st_size for p in sorted(model_dir.iterdir())}
    _marker(model_dir).write_text(json.dumps({"shape": asdict(shape), "seed": SEED, "files": files}, indent=2))


def warm_cache(directory: Path) -> float:
    """Read every file once so that all contenders start from a warm page cache; returns seconds."""
    start = time.perf_counter()
    for path in sorted(directory.rglob("*")):
        if path.is_file():
            with path.open("rb", buffering=0) as fh:
                while fh.read(16 << 20):
                    pass
    return time.perf_counter() - start


# -- measuring ---------------------------------------------------------------------------------------------------
@dataclass
class Run:
    wall_s: float
    peak_rss_mib: float
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Contender:
    """One row of the table: a command, the baseline it is compared with, and its measured runs."""

    key: str
    label: str
    command: list[str]
    output: Path | None = None
    baseline: str | None = None
    runs: list[Run] = field(default_factory=list)

    @property
    def wall_s(self) -> float:
        return min(r.wall_s for r in self.runs)

    @property
    def peak_rss_mib(self) -> float:
        return max(r.peak_rss_mib for r in self.runs)


def measure(contender: Contender, logs: Path) -> Run:
    """Run one child to completion under LAUNCHER; wall time around it, peak RSS from its rusage."""
    if contender.output is not None:
        shutil.rmtree(contender.output, ignore_errors=True)
    os.sync()  # no dirty pages left over from the previous contender's writes
    log, figures = logs / f"{contender.key}.log", logs / f"{contender.key}.rusage.json"
    figures.unlink(missing_ok=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    with log.open("w") as out:
        launcher = [sys.executable, "-I", "-S", "-c", LAUNCHER, str(figures), *contender.command]
        subprocess.run(launcher, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT, check=True)
    measured = json.loads(figures.read_text())
    if measured["exit"] != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        raise RuntimeError(f"{contender.label} failed with exit code {measured['exit']}; log {log}:\n{tail}")
    extra: dict[str, Any] = {}
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("BENCH "):
            extra = json.loads(line[len("BENCH ") :])
        elif found := re.search(r"\) in ([0-9.]+) s$", line):  # specbuild's summary: time after planning
            extra["convert_s"] = float(found.group(1))
    return Run(measured["wall_s"], measured["maxrss_kib"] / 1024, extra)  # ru_maxrss is in KiB on Linux


# -- correctness ------------------------------------------------------------------------------------------------
def compare_checkpoints(ours: Path, theirs: Path) -> dict[str, Any]:
    """Names, dtypes, shapes and values of two safetensors files, one tensor at a time."""
    result: dict[str, Any] = {"identical": False}
    with safe_open(ours, "pt") as a, safe_open(theirs, "pt") as b:
        names_a, names_b = set(a.keys()), set(b.keys())
        result["only_specbuild"] = sorted(names_a - names_b)[:10]
        result["only_modelopt"] = sorted(names_b - names_a)[:10]
        result["tensors"] = len(names_a)
        differing = []
        for name in sorted(names_a & names_b):
            x, y = a.get_tensor(name), b.get_tensor(name)
            if x.dtype != y.dtype or x.shape != y.shape or not torch.equal(x, y):
                differing.append(f"{name}: {x.dtype}{list(x.shape)} vs {y.dtype}{list(y.shape)}")
            del x, y
    result["differing"] = differing[:10]
    result["differing_count"] = len(differing)
    result["identical"] = names_a == names_b and not differing
    return result


def config_differences(ours: Path, theirs: Path) -> dict[str, Any]:
    """TRT-LLM config.json keys whose values differ (informational; ModelOpt writes a different key set)."""
    a = json.loads(ours.read_text())
    b = json.loads(theirs.read_text())
    return {
        "only_specbuild": sorted(set(a) - set(b)),
        "only_modelopt": sorted(set(b) - set(a)),
        "different_values": {k: [a[k], b[k]] for k in sorted(set(a) & set(b)) if a[k] != b[k]},
    }


# -- report ------------------------------------------------------------------------------------------------------
def _display(command: list[str]) -> str:
    """The command as a shell line, paths relative to the repository, the ModelOpt script abbreviated."""
    words = ["MODELOPT_SCRIPT" if w == MODELOPT_SCRIPT else w.replace(f"{ROOT}/", "") for w in command]
    return shlex.join(words)


def build_report(
    contenders: dict[str, Contender], model: dict[str, Any], check: dict[str, Any], machine: dict[str, Any],
    floor_mib: float, bench_s: float,
) -> dict[str, Any]:
    rows = []
    for c in contenders.values():
        base = contenders[c.baseline].peak_rss_mib if c.baseline else None
        rows.append({
            "key": c.key,
            "contender": c.label,
            "command": _display(c.command),
            "wall_s": round(c.wall_s, 2),
            "peak_rss_mib": round(c.peak_rss_mib, 1),
            "baseline": c.baseline,
            "rss_above_baseline_mib": None if base is None else round(c.peak_rss_mib - base, 1),
            "runs": [asdict(r) for r in c.runs],
        })
    sb, mo, cp = contenders["specbuild"], contenders["modelopt"], contenders["cp"]
    above = sb.peak_rss_mib - contenders[sb.baseline or ""].peak_rss_mib
    mo_above = mo.peak_rss_mib - contenders[mo.baseline or ""].peak_rss_mib
    ratio_abs = mo.peak_rss_mib / sb.peak_rss_mib
    ratio_above = mo_above / above if above > 0 else float("inf")
    wall_ratio = sb.wall_s / cp.wall_s
    targets = [
        {
            "target": "specbuild peak RSS above its baseline < 1024 MiB",
            "value": round(above, 1), "unit": "MiB", "pass": above < RSS_ABOVE_BASELINE_MAX_MIB,
        },
        {
            "target": "ModelOpt peak RSS / specbuild peak RSS >= 3 (absolute peaks; judged)",
            "value": round(ratio_abs, 2), "unit": "x", "pass": ratio_abs >= MODELOPT_RSS_RATIO_MIN,
        },
        {
            "target": "ModelOpt RSS above baseline / specbuild RSS above baseline (informational)",
            "value": round(ratio_above, 2), "unit": "x", "pass": None,
        },
        {
            "target": "specbuild wall / cp -r wall <= 2",
            "value": round(wall_ratio, 2), "unit": "x", "pass": wall_ratio <= CP_WALL_RATIO_MAX,
        },
    ]
    return {
        "model": model,
        "machine": machine,
        "method": {
            "wall_s": "best (minimum) of the runs, perf_counter around the child process",
            "peak_rss_mib": "largest ru_maxrss (KiB / 1024) of the child over the runs, from os.wait4 in a "
            "minimal launcher process",
            "rss_floor_mib": round(floor_mib, 1),
            "rss_floor": "peak RSS reported for `true` started the same way (the launcher's own RSS, inherited at "
            "exec): no figure can be lower",
            "cache": "model files read once before timing (warm page cache for every contender); os.sync() and "
            "output removed before each run",
        },
        "rows": rows,
        "targets": targets,
        "correctness": check,
        "bench_runtime_s": round(bench_s, 1),
    }


def _verdict(flag: bool | None) -> str:
    return "info" if flag is None else ("PASS" if flag else "**FAIL**")


def render_markdown(report: dict[str, Any]) -> str:
    m, mach = report["model"], report["machine"]
    runs = len(report["rows"][0]["runs"])
    lines = [
        "# Conversion benchmark",
        "",
        f"Model: random Llama, {m['params'] / 1e9:.2f} B params, {m['layers']} layers, hidden {m['hidden']}, "
        f"{m['heads']} heads / {m['kv_heads']} KV heads, vocab {m['vocab']}, fp16, {m['size_gb']:.2f} GB "
        f"in {m['shards']} safetensors shards. Machine: {mach['nproc']} CPUs, {mach['ram_gib']} GiB RAM, "
        f"Python {mach['python']}, torch {mach['torch']}, transformers {mach['transformers']}, "
        f"ModelOpt {mach['nvidia-modelopt']}; {mach['date']}, commit {mach['git_commit']}.",
        "",
        f"Each contender is a separate process, run {runs}x on a warm page cache; wall = best run, "
        "peak RSS = largest `ru_maxrss` over the runs.",
        "",
        f"Load average (1/5/15 min) at start {mach['loadavg_start']}, at end {mach['loadavg_end']}: other work "
        "on the machine inflates wall times.",
        "",
        "| contender | wall s | all runs s | peak RSS MiB | RSS above baseline MiB |",
        "|---|---:|---|---:|---:|",
    ]
    for r in report["rows"]:
        above = "—" if r["rss_above_baseline_mib"] is None else f"{r['rss_above_baseline_mib']:.0f}"
        walls = ", ".join(f"{run['wall_s']:.2f}" for run in r["runs"])
        lines.append(f"| {r['contender']} | {r['wall_s']:.2f} | {walls} | {r['peak_rss_mib']:.0f} | {above} |")
    lines += ["", "| target | measured | verdict |", "|---|---:|---|"]
    for t in report["targets"]:
        lines.append(f"| {t['target']} | {t['value']} {t['unit']} | {_verdict(t['pass'])} |")
    c = report["correctness"]
    lines += [
        "",
        f"specbuild rank0.safetensors identical to ModelOpt's (names, dtypes, shapes, `torch.equal` values, "
        f"{c.get('tensors', 0)} tensors): **{str(c.get('identical')).lower()}**.",
        "",
        f"Whole benchmark: {report['bench_runtime_s']:.0f} s.",
        "",
    ]
    return "\n".join(lines)


# -- main -------------------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=22, help="decoder layers (22 gives 2.25 GB fp16)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per contender (best wall, largest RSS)")
    parser.add_argument("--no-tp2", action="store_true", help="skip the extra specbuild tp=2 row")
    parser.add_argument("--work", type=Path, default=BENCH / "work", help="cache and scratch directory")
    parser.add_argument("--results", type=Path, default=BENCH / "results", help="where the figures go")
    parser.add_argument("--keep-outputs", action="store_true", help="keep the converted checkpoints")
    args = parser.parse_args(argv)

    bench_start = time.perf_counter()
    load_start = [round(x, 2) for x in os.getloadavg()]
    shape = ModelShape(layers=args.layers)
    model_dir = args.work / f"llama-h{shape.hidden}-l{shape.layers}-fp16"
    outputs, logs = args.work / "outputs", args.work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    args.results.mkdir(parents=True, exist_ok=True)

    if model_is_complete(model_dir, shape):
        print(f"reusing {model_dir}", flush=True)
    else:
        free = shutil.disk_usage(args.work).free
        if free < 5 * shape.nbytes():
            print(f"error: {args.work} has {free / 1e9:.1f} GB free, need {5 * shape.nbytes() / 1e9:.1f}")
            return 2
        print(f"generating {model_dir} ({shape.nbytes() / 1e9:.2f} GB)", flush=True)
        start = time.perf_counter()
        generate_model(model_dir, shape)
        print(f"  generated in {time.perf_counter() - start:.1f} s", flush=True)
    print(f"warming the page cache: {warm_cache(model_dir):.1f} s", flush=True)

    py = str(BIN / "python")
    contenders = {
        c.key: c
        for c in [
            Contender("baseline", "baseline: python -c 'import torch, specbuild.convert.pipeline'",
                      [py, "-c", "import torch, specbuild.convert.pipeline"]),
            Contender("modelopt_baseline", "baseline: python -c 'import torch, transformers, modelopt.torch.export'",
                      [py, "-c", "import torch, transformers, modelopt.torch.export"]),
            Contender("cp", "cp -r", ["cp", "-r", str(model_dir), str(outputs / "cp")], outputs / "cp"),
            Contender("specbuild", "specbuild convert (tp 1)",
                      [str(BIN / "specbuild"), "convert", "--model", str(model_dir), "--output",
                       str(outputs / "specbuild"), "--dtype", "float16"],
                      outputs / "specbuild", "baseline"),
            Contender("modelopt", "ModelOpt: from_pretrained + export_tensorrt_llm_checkpoint (tp 1)",
                      [py, "-c", MODELOPT_SCRIPT, str(model_dir), str(outputs / "modelopt")],
                      outputs / "modelopt", "modelopt_baseline"),
        ]
    }
    if not args.no_tp2:
        contenders["specbuild_tp2"] = Contender(
            "specbuild_tp2", "specbuild convert (tp 2, extra)",
            [str(BIN / "specbuild"), "convert", "--model", str(model_dir), "--output",
             str(outputs / "specbuild_tp2"), "--dtype", "float16", "--tp-size", "2"],
            outputs / "specbuild_tp2", "baseline",
        )
    outputs.mkdir(parents=True, exist_ok=True)

    # Untimed warm-up of the interpreters' own files (imports), then rounds that interleave the contenders.
    for key in ("baseline", "modelopt_baseline"):
        measure(contenders[key], logs)
    floor = measure(Contender("floor", "true", ["true"]), logs).peak_rss_mib
    for round_no in range(1, args.repeats + 1):
        for c in contenders.values():
            run = measure(c, logs)
            c.runs.append(run)
            # Outputs go at once (no writeback between runs), except the last round's pair that is compared.
            if c.output is not None and not (round_no == args.repeats and c.key in ("specbuild", "modelopt")):
                shutil.rmtree(c.output, ignore_errors=True)
            print(f"round {round_no}: {c.label}: {run.wall_s:.2f} s, peak RSS {run.peak_rss_mib:.0f} MiB"
                  + (f" {run.extra}" if run.extra else ""), flush=True)

    check = compare_checkpoints(outputs / "specbuild" / "rank0.safetensors", outputs / "modelopt" / "rank0.safetensors")
    check["config"] = config_differences(outputs / "specbuild" / "config.json", outputs / "modelopt" / "config.json")
    print(f"rank0 identical: {check['identical']}", flush=True)
    if not args.keep_outputs:
        shutil.rmtree(outputs, ignore_errors=True)

    model = {
        **asdict(shape),
        "params": sum(torch.Size(s).numel() for s in shape.tensors().values()),
        "size_gb": shape.nbytes() / 1e9,
        "shards": len(shape.shards()),
        "path": str(model_dir.relative_to(ROOT) if model_dir.is_relative_to(ROOT) else model_dir),
    }
    machine = machine_info(("transformers", "nvidia-modelopt", "safetensors", "specbuild"), loadavg_start=load_start)
    report = build_report(contenders, model, check, machine, floor, time.perf_counter() - bench_start)
    markdown = render_markdown(report)
    write_results(args.results, "convert", report, markdown)
    print()
    print(markdown)
    for t in report["targets"]:
        if t["pass"] is False:
            print(f"FAIL: {t['target']}: {t['value']} {t['unit']}")
    if not check["identical"]:
        print("FAIL: specbuild's rank0.safetensors differs from ModelOpt's")
    return finish("convert_bench", judged(report))


def judged(report: dict[str, Any]) -> list[Target]:
    """The report's targets (informational ones included, never missed) and the rank0 equality check."""
    targets = [Target(t["target"], t["pass"], f"{t['value']} {t['unit']}") for t in report["targets"]]
    identical = bool(report["correctness"]["identical"])
    return [*targets, Target("specbuild's rank0.safetensors equals ModelOpt's", identical)]


if __name__ == "__main__":
    sys.exit(main())
