"""Migrate benchmark: what `specbuild migrate` moves an engine-flow demo spec to costs or gains, as tokens per target
forward on the reference runtime (greedy, CPU), before and after.

For configs/demo-medusa.yaml (Medusa -> EAGLE-3) and configs/demo-lookahead.yaml (Lookahead -> NGram, and -> SA
with `--to sa`): the spec is
migrated into bench/work/migrate/, then `specbuild.migrate.measure.measure_migration` (what `specbuild
migrate` prints) runs plain greedy, the old method and the new one on the same calibration prompts. The migrated
Medusa spec names an EAGLE-3 draft that `specbuild eagle train` would write; the bench points it at the demo's
EAGLE-3 draft (demo/models/eagle3-draft, trained on the same target) instead of training one here.

Targets: every method's output equals plain greedy (the move keeps outputs); plain greedy is 1 token per target
forward. The before/after figures themselves are for information (which method wins depends on the weights).

Writes bench/results/migrate.json (figures, settings, machine) and migrate.md (the table).
Run with `.venv/bin/python bench/migrate_bench.py [--help]`.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import yaml

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT))

from machine_info import machine_info  # noqa: E402
from results_files import write_results  # noqa: E402
from targets import Target, finish  # noqa: E402

SPECS = ("demo-medusa", "demo-lookahead")
CASES = (("demo-medusa", "ngram"), ("demo-lookahead", "ngram"), ("demo-lookahead", "sa"))
"""(spec, what Lookahead becomes: `migrate --to`); Medusa always becomes EAGLE-3."""
WORK = BENCH / "work" / "migrate"


def markdown(report: dict) -> str:
    lines = ["# specbuild migrate: tokens per target forward, before and after", "",
             f"Reference runtime, greedy, {report['settings']['prompts']} prompts of "
             f"{report['settings']['prompt_tokens']} tokens from {report['settings']['calibration']}, "
             f"{report['settings']['new_tokens']} new tokens each; `.venv/bin/python bench/migrate_bench.py`.", "",
             "| spec | role | method | tokens / target forward | == plain greedy |", "|---|---|---|---|---|"]
    for name, figures in report["specs"].items():
        for f in figures:
            value = "-" if f["tokens_per_target_forward"] is None else f"{f['tokens_per_target_forward']:.2f}"
            same = {True: "yes", False: "no", None: "-"}[f["same_as_plain_greedy"]]
            lines.append(f"| {name} | {f['role']} | {f['method']} | {value} | {same} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--out", type=Path, default=BENCH / "results")
    args = parser.parse_args(argv)

    import torch

    from specbuild.demo.models import build_demo_models
    from specbuild.migrate.measure import measure_migration
    from specbuild.migrate.rewrite import migrate_spec
    from specbuild.spec import load_spec

    start = time.perf_counter()
    models = build_demo_models(ROOT / "demo" / "models")
    WORK.mkdir(parents=True, exist_ok=True)
    specs: dict[str, list[dict]] = {}
    targets: list[Target] = []
    for spec_name, to in CASES:
        name = spec_name if spec_name == "demo-medusa" or to == "ngram" else f"{spec_name} --to {to}"
        source = ROOT / "configs" / f"{spec_name}.yaml"
        out = WORK / f"{spec_name}-{to}.yaml"
        migration = migrate_spec(source, out, to=to)
        if migration.new_mode == "eagle3":  # stands in for `specbuild eagle train`'s output
            data = yaml.safe_load(out.read_text())
            data["draft"]["model"] = str(models["target"].parent / "eagle3-draft")
            out.write_text(yaml.safe_dump(data, sort_keys=False))
        figures = measure_migration(load_spec(source), load_spec(out), prompts=args.prompts,
                                    prompt_tokens=args.prompt_tokens, new_tokens=args.new_tokens)
        specs[name] = [f.as_dict() for f in figures]
        for f in figures:
            targets.append(Target(f"{name} {f.role} ({f.method}) output == plain greedy",
                                  f.same_as_plain_greedy is True, str(f.same_as_plain_greedy)))
        plain = figures[0].tokens_per_target_forward
        targets.append(Target(f"{name} plain greedy: 1 token per target forward", plain == 1.0, str(plain)))
        for f in figures[1:]:
            targets.append(Target(f"{name} {f.role}: {f.method}", None, str(f.tokens_per_target_forward)))
    settings = {"specs": list(SPECS), "cases": [list(case) for case in CASES], "prompts": args.prompts,
                "prompt_tokens": args.prompt_tokens,
                "new_tokens": args.new_tokens, "calibration": "tune's held-out pydoc topics",
                "eagle3_draft": "demo/models/eagle3-draft (in place of `specbuild eagle train`)",
                "torch_threads": torch.get_num_threads()}
    report = {"settings": settings, "specs": specs,
              "targets": [{"target": t.name, "met": t.met, "measured": t.measured} for t in targets],
              "machine": machine_info(["transformers"], torch_threads=torch.get_num_threads()),
              "bench_runtime_s": round(time.perf_counter() - start, 1)}
    text = markdown(report)
    write_results(args.out, "migrate", report, text)
    print(text)
    return finish("migrate_bench", targets)


if __name__ == "__main__":
    sys.exit(main())
