"""Draft quantization benchmark: every ModelOpt format on the demo draft, against the unquantized draft.

For each format: the draft checkpoint's size on disk, the quantization wall time (`specbuild convert` of the
draft: calibration + export + repair + checks, ModelOpt already imported), and the greedy draft-target
acceptance rate against the demo target in the reference runtime (K = 4, held-out prompts, both float32 at run
time: the quantized draft is dequantized at load and its activations/KV cache emulated, so the acceptance is
what the quantized draft proposes).

The demo draft's MLP is 344 wide, not a multiple of the int4 group size (128 or 64), so the AWQ rows (and, for
a like-for-like comparison, an unquantized row) use the same draft with its MLP zero-padded to 384: the extra
channels are exact zeros in gate, up and down, so the padded model computes the same function
(`zero_pad_mlp`; checked here: both unquantized drafts propose and get accepted the same tokens).

Writes bench/results/quantize.json (every figure, machine info) and bench/results/quantize.md (the table), then
exits 1 if a target is missed. Run with `.venv/bin/python bench/quantize_bench.py [--help]`.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch

from specbuild.convert.quantize.settings import FORMATS, QuantizeSettings

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
AWQ = tuple(name for name, fmt in FORMATS.items() if fmt.awq)
KEEP_MIN = 0.95  # target: int8 and fp8 drafts keep >= 95 % of the unquantized draft's acceptance rate


def zero_pad_mlp(source: Path, out: Path, multiple: int = 128) -> Path:
    """A copy of the Llama-family HF checkpoint `source` whose intermediate size is padded with zero channels to
    a multiple of `multiple` (silu(0) * 0 = 0 and zero down_proj columns: the same function), tokenizer files
    included; for int4 AWQ, whose groups must divide every linear's input size."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    inter = model.config.intermediate_size
    wide = -(-inter // multiple) * multiple
    with torch.no_grad():
        for layer in model.model.layers:
            mlp = layer.mlp
            for name in ("gate_proj", "up_proj"):
                old = getattr(mlp, name)
                new = torch.nn.Linear(old.in_features, wide, bias=False)
                new.weight.zero_()
                new.weight[:inter] = old.weight
                setattr(mlp, name, new)
            old = mlp.down_proj
            new = torch.nn.Linear(wide, old.out_features, bias=False)
            new.weight.zero_()
            new.weight[:, :inter] = old.weight
            mlp.down_proj = new
    model.config.intermediate_size = wide
    model.save_pretrained(out)
    for file in source.iterdir():
        if file.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(file, out / file.name)
    return out


def _dir_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.glob("rank*.safetensors"))


def _prompts(tokenizer_dir: Path, count: int, length: int) -> list[list[int]]:
    from specbuild.demo.models import heldout_texts
    from specbuild.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(tokenizer_dir)
    prompts: list[list[int]] = []
    for text in heldout_texts():  # consecutive windows of each held-out text
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        prompts += [ids[i:i + length] for i in range(0, len(ids) - 2 * length, 2 * length)]
        if len(prompts) >= count:
            break
    return prompts[:count]


def acceptance(target: Any, draft_dir: Path, prompts: list[list[int]], new_tokens: int, k: int) -> dict[str, Any]:
    """Greedy draft-target generation of every prompt; accepted / proposed draft tokens over all rounds."""
    from specbuild.runtime.model import CausalLM
    from specbuild.runtime.sampling import SamplingParams
    from specbuild.runtime.sequence import StopCriteria
    from specbuild.runtime.speculative import DraftTargetConfig, generate_draft_target

    draft = CausalLM.from_checkpoint(draft_dir)
    proposed = accepted = forwards = tokens = 0
    with torch.inference_mode():
        for prompt in prompts:
            result = generate_draft_target(target, draft, [prompt], SamplingParams(),
                                           StopCriteria(max_new_tokens=new_tokens), DraftTargetConfig(k))
            stats = result.stats
            proposed += sum(stats.proposed_by_position)
            accepted += sum(stats.accepted_by_position)
            forwards += stats.target_forwards
            tokens += stats.generated_tokens
    return {"acceptance": accepted / proposed, "proposed": proposed, "accepted": accepted,
            "tokens_per_target_forward": tokens / forwards}


def run(args: argparse.Namespace) -> dict[str, Any]:
    from rich.console import Console

    from specbuild.convert.pipeline import ConvertRequest, convert_checkpoint
    from specbuild.demo.models import build_demo_models
    from specbuild.runtime.model import CausalLM

    torch.set_num_threads(args.threads)
    quiet = Console(stderr=True, quiet=True)
    models = build_demo_models(ROOT / "demo" / "models", progress=False)
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    padded = work / "draft-mlp384"
    if not (padded / "config.json").is_file():
        zero_pad_mlp(models["draft"], padded)
    target_ckpt = work / "target"
    convert_checkpoint(ConvertRequest("target", models["target"], target_ckpt, "float32"), console=quiet)
    target = CausalLM.from_checkpoint(target_ckpt)
    prompts = _prompts(models["tokenizer"], args.prompts, args.prompt_len)
    import modelopt.torch.quantization  # noqa: F401  (imported once, outside the timings)

    rows: list[dict[str, Any]] = []
    for source_name, source in (("draft", models["draft"]), ("draft-mlp384", padded)):
        formats = ("none", "none-fp16", *(f for f in FORMATS if (f in AWQ) == (source_name != "draft")))
        for fmt in formats:
            kv = args.kv_cache if fmt == "fp8" else "none"
            settings = QuantizeSettings(fmt, kv, "builtin", args.calib_size, args.calib_seq_len)
            out = work / f"{source_name}-{fmt}"
            dtype = "float16" if fmt == "none-fp16" else "float32"
            request = ConvertRequest("draft", source, out, dtype,
                                     quantization=settings if fmt in FORMATS else None)
            start = time.perf_counter()
            result = convert_checkpoint(request, console=quiet, force=True)
            seconds = time.perf_counter() - start
            row = {"draft": source_name, "format": fmt, "kv_cache": kv, "dtype": result.dtype,
                   "size_bytes": _dir_size(out), "convert_s": seconds,
                   **acceptance(target, out, prompts, args.new_tokens, args.k)}
            rows.append(row)
            print(f"{source_name:13s} {fmt:9s} kv {kv:4s} {row['size_bytes'] / 1e6:6.2f} MB {seconds:6.2f} s "
                  f"acceptance {row['acceptance']:.3f}", file=sys.stderr)
    for row in rows:
        base = next(r for r in rows if r["draft"] == row["draft"] and r["format"] == "none")
        row["acceptance_vs_unquantized"] = row["acceptance"] / base["acceptance"]
        row["size_vs_unquantized"] = row["size_bytes"] / base["size_bytes"]
    checks = {
        f"{r['format']} keeps >= {KEEP_MIN:.0%} of the unquantized acceptance":
            r["acceptance_vs_unquantized"] >= KEEP_MIN
        for r in rows if r["format"] in ("fp8", "int8_sq", "int8_wo")
    }
    plain = [(r["proposed"], r["accepted"]) for r in rows if r["format"] == "none"]
    checks["the zero-padded draft proposes what the draft proposes"] = len(set(plain)) == 1
    return {"rows": rows, "checks": checks, "settings": {
        "k": args.k, "prompts": len(prompts), "prompt_len": args.prompt_len, "new_tokens": args.new_tokens,
        "calib_size": args.calib_size, "calib_seq_len": args.calib_seq_len, "calib_source": "builtin",
        "threads": args.threads, "fp8_kv_cache": args.kv_cache}}


def markdown(results: dict[str, Any]) -> str:
    s = results["settings"]
    lines = [
        "# Draft quantization (ModelOpt 0.47) on the demo draft",
        "",
        f"Greedy draft-target decoding against the demo target in specbuild's reference runtime, K = {s['k']}, "
        f"{s['prompts']} held-out prompts of {s['prompt_len']} tokens, {s['new_tokens']} new tokens each. "
        f"Calibration: built-in text, {s['calib_size']} x {s['calib_seq_len']} tokens. fp8 runs with an FP8 KV "
        f"cache ({s['fp8_kv_cache']}). Size: the rank files. Convert time: the whole `convert` of the draft "
        "(ModelOpt already imported; its import costs about 7 s once).",
        "",
        "`none` is the unquantized draft in float32 (the demo spec's dtype), `none-fp16` the same in float16. "
        "AWQ rows use the demo draft with its 344-wide MLP zero-padded to 384 (same function; int4 groups must "
        "divide every input size), and are compared with that padded draft unquantized.",
        "",
        "| draft | format | stored dtype | size (MB) | size vs unquantized | convert (s) | acceptance | vs unquantized "
        "| tokens / target forward |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results["rows"]:
        lines.append(
            f"| {r['draft']} | {r['format']}{' + fp8 KV' if r['kv_cache'] == 'fp8' else ''} | {r['dtype']} "
            f"| {r['size_bytes'] / 1e6:.2f} | {r['size_vs_unquantized']:.2f} | {r['convert_s']:.2f} "
            f"| {r['acceptance']:.3f} | {r['acceptance_vs_unquantized']:.3f} | {r['tokens_per_target_forward']:.2f} |"
        )
    lines += ["", "Targets:", ""]
    lines += [f"- {name}: {'met' if ok else 'NOT met'}" for name, ok in results["checks"].items()]
    lines += ["", "ModelOpt exports float16 for the tensors it does not quantize (embedding, norms, lm_head); in "
              "this tiny draft (2 layers, vocab 2048 x 128) they are most of the size, so quantization saves "
              "far less than on a real draft, where the layers dominate.", ""]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=48)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--calib-size", type=int, default=64)
    parser.add_argument("--calib-seq-len", type=int, default=256)
    parser.add_argument("--kv-cache", choices=("none", "fp8"), default="fp8", help="KV cache of the fp8 row")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--work", type=Path, default=BENCH / "work" / "quantize")
    parser.add_argument("--results", type=Path, default=BENCH / "results")
    args = parser.parse_args()
    sys.path.insert(0, str(BENCH))
    from machine_info import machine_info
    from results_files import write_results
    from targets import Target, finish

    results = run(args)
    results["machine"] = machine_info(["torch", "transformers", "nvidia-modelopt"])
    write_results(args.results, "quantize", results, markdown(results))
    print(markdown(results))
    return finish("quantize_bench", [Target(name, ok) for name, ok in results["checks"].items()])


if __name__ == "__main__":
    sys.exit(main())
