"""Medusa step cost: where the time of one Medusa step goes at one request, and whether the tree's width caps it.

bench/serving_bench.py judges the Medusa deployment (configs/demo-medusa.yaml) at concurrency 1 by >= 1.3x plain,
or by a measured account of why it cannot reach that. This script measures that account, in-process (no Triton), on
the deployed repository's own `tensorrt_llm` model as its Triton adapter builds it: the engine's checkpoint, the
config's `medusa_choices`, its `draft_len_schedule` (the tree it serves at one request) and its torch threads.

The serving bench's prompts, tokenized by the repository's preprocessing tokenizer, are decoded one request at a
time, 48 new tokens each, on two serving engines over the same model: `plain` (no tree: the target's own steps)
and `medusa` (the tree, verified in the target's step). Passes interleave the two request by request, and each
request is kept at its fastest pass. Timers around the model's forward and its Medusa heads split every step into
the target's forward (over the tree's tokens, or one token), the heads (their top-k at the last accepted
position) and the engine's own work (building the tree's block, verifying, compacting the cache, the rest).

The account: Medusa's tokens/s over plain's in-process, and the same figure were the tree's forward as cheap as
plain's one-token forward (the step's time less the difference of the two forwards: the tree's width, what a wider
forward costs on this machine; the heads and the engine's tree work stay). It holds when Medusa stays below
serving_bench's SPEEDUP_MIN while the same steps without the width's cost reach it: the heads' guesses pay, and
this machine's cost of verifying the tree's width eats it. Both paths must make the same tokens (greedy).

Targets (sanity checks): plain and Medusa make the same tokens; the timed parts (forward, heads) fit in the steps
they were timed in. The account is reported, for serving_bench to judge by. Writes bench/results/medusa-cost.json
(every figure, settings, machine info) and medusa-cost.md. Run with `.venv/bin/python bench/medusa_cost_bench.py`.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from machine_info import machine_info, uncommitted
from results_files import write_results
from serving_bench import SPEEDUP_MIN, existing, prepare
from targets import Target, finish

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT))

SPEC = ROOT / "configs" / "demo-medusa.yaml"
ENGINES = ("plain", "medusa")


@dataclass
class RequestRun:
    """One request decoded on one engine, stepped here: its tokens, its wall time (prefill included), the engine
    steps it took and the time inside the target's forward and inside the Medusa heads."""

    tokens: list[int]
    total_s: float
    steps: int
    forward_s: float
    heads_s: float


class Clock:
    """Times every call of `model.forward` and `model.medusa_logits` (instance attributes shadow the methods, so the
    engine's own calls are the ones timed); `take` returns and resets the totals."""

    def __init__(self, model: Any) -> None:
        self.seconds = {"forward": 0.0, "heads": 0.0}
        for part, name in (("forward", "forward"), ("heads", "medusa_logits")):
            setattr(model, name, self._timed(part, getattr(model, name)))

    def _timed(self, part: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.seconds[part] += time.perf_counter() - start
        return timed

    def take(self) -> dict[str, float]:
        taken, self.seconds = self.seconds, {part: 0.0 for part in self.seconds}
        return taken


class MedusaModel:
    """The repository's tensorrt_llm model as triton_models/tensorrt_llm/1/model.py builds it for Medusa, without
    Triton, as two engines over one model: `medusa` (its tree and schedule) and `plain` (no tree)."""

    def __init__(self, repository: Path) -> None:
        from specbuild.deploy.pbtxt import read_model
        from specbuild.python_models import preprocess as pre
        from specbuild.python_models.llm_engine import build_engine
        from specbuild.runtime.serving import ServingEngine
        from specbuild.tokenizer import load_tokenizer

        model_dir = repository / "tensorrt_llm"
        llm, model_config = read_model(model_dir)
        prep, _ = read_model(repository / "preprocessing")
        if not llm.get("medusa_choices"):
            raise SystemExit(f"{model_dir}: no medusa_choices; this script measures a Medusa model")
        self.threads = int(llm.get("torch_threads") or 0)  # main() sets it: process-wide, so not here
        built = build_engine(llm, model_config, model_dir)
        self.model, self.choices = built.model, built.engine.choices
        plain = ServingEngine(self.model, max_batch=built.info.max_batch_size, max_seq_len=built.info.max_seq_len)
        self.engines = {"plain": plain, "medusa": built.engine}
        tree = self.engines["medusa"].tree_for(1)
        self.tree_nodes = 0 if tree is None else tree.num_nodes
        self.clock = Clock(self.model)
        self.tokenizer = load_tokenizer(repository / "preprocessing" / prep.get("tokenizer_dir", "tokenizer"))
        self.add_special_tokens = pre.nvidia_flag(prep.get("add_special_tokens"))
        self.end_id, _ = pre.default_ids(self.tokenizer)

    def prompt(self, text: str) -> list[int]:
        """The prompt tokens the ensemble's preprocessing sends for `text`."""
        from specbuild.python_models import preprocess as pre

        ids, lengths = pre.encode_prompts(self.tokenizer, [text], add_special_tokens=self.add_special_tokens,
                                          pad_id=0)
        return ids[0, : int(lengths.reshape(-1)[0])].tolist()

    def request(self, name: str, prompt: list[int], new_tokens: int) -> RequestRun:
        """One request alone on engine `name`, stepped here to its end."""
        from specbuild.runtime.serving import EngineRequest

        engine = self.engines[name]
        self.clock.take()
        start = time.perf_counter()
        handle = engine.submit(EngineRequest(list(prompt), new_tokens, end_id=self.end_id))
        steps = 0
        while not handle.done and engine.step():
            steps += 1
        total = time.perf_counter() - start
        timed = self.clock.take()
        return RequestRun(list(handle.wait(0).tokens), total, steps, timed["forward"], timed["heads"])


def fastest(passes: Sequence[Sequence[RequestRun]]) -> list[RequestRun]:
    """Each request (position in a pass) at its fastest pass: damps bursts of other work on a shared machine."""
    return [min(column, key=lambda run: run.total_s) for column in zip(*passes, strict=True)]


def per_step(runs: Sequence[RequestRun]) -> dict[str, float]:
    """Milliseconds per engine step of each part, summed over `runs`, and tokens per step."""
    steps, tokens = sum(r.steps for r in runs), sum(len(r.tokens) for r in runs)
    total, forward, heads = (sum(getattr(r, f) for r in runs) for f in ("total_s", "forward_s", "heads_s"))
    return {"step_ms": 1e3 * total / steps, "forward_ms": 1e3 * forward / steps, "heads_ms": 1e3 * heads / steps,
            "engine_ms": 1e3 * (total - forward - heads) / steps, "tokens_per_step": tokens / steps, "steps": steps,
            "tokens": tokens, "total_s": total}


def account(runs: Mapping[str, Sequence[RequestRun]], floor: float = SPEEDUP_MIN) -> dict[str, Any]:
    """Medusa over plain in-process, and with the tree's width free: Medusa's requests less, at each of its steps,
    the difference between its forward and plain's one-token forward. Holds when the first stays below `floor`
    while the second reaches it, on requests that decode the same tokens."""
    plain, medusa = per_step(runs["plain"]), per_step(runs["medusa"])
    same = sum(a.tokens == b.tokens for a, b in zip(runs["plain"], runs["medusa"], strict=True))
    width_ms = medusa["forward_ms"] - plain["forward_ms"]
    width_free_s = medusa["total_s"] - medusa["steps"] * width_ms / 1e3
    x = {"medusa": plain["total_s"] / medusa["total_s"], "width free": plain["total_s"] / width_free_s}
    holds = same == len(runs["plain"]) and x["medusa"] < floor <= x["width free"]
    return {
        "floor": floor,
        "per_step": {"plain": plain, "medusa": medusa},
        "width_ms_per_step": width_ms,
        "x_plain": x,
        "same_tokens": {"requests": len(runs["plain"]), "same": same},
        "holds": bool(holds),
        "summary": f"in-process, Medusa {x['medusa']:.2f}x plain, {x['width free']:.2f}x with the tree's forward at "
                   f"a one-token forward's cost",
    }


def claim(floor: float) -> str:
    return (f"the tree's width on this machine caps Medusa below {floor}x plain at one request (in-process: Medusa "
            f"< {floor}x <= Medusa with the tree's forward at a one-token forward's cost)")


def judged(report: Mapping[str, Any]) -> list[Target]:
    acc = report["account"]
    same = acc["same_tokens"]
    fits = max(step["forward_ms"] + step["heads_ms"] - step["step_ms"] for step in acc["per_step"].values())
    return [
        Target("plain and Medusa make the same tokens (greedy)", same["same"] == same["requests"],
               f"{same['same']} of {same['requests']} requests"),
        Target("the timed forward and heads fit in the steps they were timed in", fits <= 0,
               f"largest excess {fits:.3f} ms per step"),
        Target(claim(acc["floor"]), None,
               f"{'holds' if acc['holds'] else 'does not hold'}: {acc['summary']}"),
    ]


def markdown(report: Mapping[str, Any]) -> str:
    s, acc = report["settings"], report["account"]
    rows = [f"| {name} | {p['step_ms']:.2f} | {p['forward_ms']:.2f} | {p['heads_ms']:.2f} | {p['engine_ms']:.2f} | "
            f"{p['tokens_per_step']:.2f} | {1e3 * p['total_s'] / p['tokens']:.2f} |"
            for name, p in acc["per_step"].items()]
    x = acc["x_plain"]
    lines = [
        "# Medusa step cost: one request, in-process",
        "",
        f"{s['spec']}: the deployed `tensorrt_llm` model's checkpoint and tree ({s['tree_nodes']} nodes at one "
        f"request, medusa_choices {s['medusa_choices']}), {s['new_tokens']} new tokens per request, "
        f"{len(s['prompts'])} prompts one at a time, each request at its fastest of {s['passes']} passes, plain and "
        f"Medusa interleaved; torch threads {s['torch_threads']} (the repository's torch_threads). A step is one "
        "engine step (the first one prefills).",
        "",
        "| engine | ms per step | target forward ms | heads ms | engine work ms | tokens per step | ms per token |",
        "|---|---:|---:|---:|---:|---:|---:|",
        *rows,
        "",
        f"The tree's width (Medusa's forward less plain's, per step): {acc['width_ms_per_step']:.2f} ms.",
        "",
        "## The account: why Medusa stays below "
        f"{acc['floor']}x plain at one request",
        "",
        "| in-process | × plain |",
        "|---|---:|",
        f"| Medusa | {x['medusa']:.2f}x |",
        f"| Medusa with the tree's forward at a one-token forward's cost | {x['width free']:.2f}x |",
        "",
        f"**{claim(acc['floor'])}: {'holds' if acc['holds'] else 'does not hold'}: {acc['summary']}.** "
        "`bench/serving_bench.py` judges the served Medusa at concurrency 1 by "
        f"{acc['floor']}x plain, or by this account where it holds on the same commit and machine.",
        "",
        "| target | measured | verdict |",
        "|---|---|---|",
        *(f"| {t['target']} | {t['measured']} | {'reported' if t['met'] is None else 'PASS' if t['met'] else 'FAIL'} |"
          for t in report["targets"]),
    ]
    dirty = s.get("uncommitted_specbuild_files")
    if dirty:
        lines += ["", f"Measured with uncommitted changes to {', '.join(f'`{f}`' for f in dirty)}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--passes", type=int, default=5, help="passes over the prompts; each request keeps its fastest")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--out", type=Path, default=BENCH / "results")
    parser.add_argument("--no-prepare", action="store_true", help="use the deployed repository as it is")
    args = parser.parse_args(argv)

    from specbuild.bench.load import DEFAULT_PROMPTS
    from specbuild.demo.models import build_demo_models

    build_demo_models(ROOT / "demo" / "models")
    repository = existing(SPEC) if args.no_prepare else prepare(SPEC)
    served = MedusaModel(repository)
    if served.threads:
        import torch

        torch.set_num_threads(served.threads)
    prompts = [served.prompt(text) for text in DEFAULT_PROMPTS]
    for name in ENGINES:  # warm-up: first calls allocate
        served.request(name, prompts[0], args.max_tokens)
    passes: dict[str, list[list[RequestRun]]] = {name: [] for name in ENGINES}
    for index in range(args.passes):
        print(f"pass {index + 1}/{args.passes}", flush=True)
        runs: dict[str, list[RequestRun]] = {name: [] for name in ENGINES}
        for prompt in prompts:
            for name in ENGINES:
                runs[name].append(served.request(name, prompt, args.max_tokens))
        for name in ENGINES:
            passes[name].append(runs[name])
    acc = account({name: fastest(passes[name]) for name in ENGINES})
    settings = {"spec": str(SPEC.relative_to(ROOT)), "repository": str(repository), "prompts": list(DEFAULT_PROMPTS),
                "new_tokens": args.max_tokens, "passes": args.passes, "torch_threads": served.threads,
                "medusa_choices": served.choices, "tree_nodes": served.tree_nodes,
                "uncommitted_specbuild_files": uncommitted("specbuild/runtime", "specbuild/triton_models",
                                                           "specbuild/python_models")}
    report: dict[str, Any] = {"settings": settings, "account": acc,
                              "runs": {name: [asdict(r) for r in fastest(passes[name])] for name in ENGINES},
                              "machine": machine_info(["transformers"], torch_threads=served.threads)}
    targets = judged(report)
    report["targets"] = [{"target": t.name, "met": t.met, "measured": t.measured} for t in targets]
    text = markdown(report)
    write_results(args.out, "medusa-cost", report, text)
    print(text)
    return finish("medusa_cost_bench", targets)


if __name__ == "__main__":
    sys.exit(main())
