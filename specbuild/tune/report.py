"""The tune report: one JSON record of what `specbuild tune` measured and chose, and the check that a spec holds
it.

The printed tables are for reading; this file is for checking. A spec that says its K, tree or schedule was
measured can then be compared with the measurement itself (`spec_differences`), so a re-tune on another machine,
or a hand edit, shows up as a difference instead of a stale comment. One writer (`write_report`) for every caller
(`make bench` through bench/run_all.py); the machine description comes from the caller, which knows what it ran
on.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from specbuild.atomic import replace_text
from specbuild.spec import PipelineSpec
from specbuild.tune.stage import SETTING_FIELDS, DraftLengthTuning, TreeTuning, TuneReport
from specbuild.tune.tree import nodes_per_depth
from specbuild.tune.vllm_engine import EngineTuning

FORMAT = 1
"""The report's layout version: a reader refuses another."""

CALIBRATION = ("prompt_tokens", "new_tokens")
"""TuneOptions fields that say what was measured on (the rest say what was searched)."""


def _r(value: float, digits: int = 4) -> float:
    return round(value, digits)


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 4)


def _calibration(report: TuneReport) -> tuple[dict[str, Any], dict[str, Any]]:
    """What the prompts were and what ran them, and the search settings (where the result goes is left out)."""
    options = asdict(report.options)
    for name in ("output", "write", "inline", "calib", "prompts", "threads", "vllm"):
        options.pop(name)
    load = options.pop("load_prompts")
    if options["engine"] == "reference":  # how vLLM is started says nothing of a reference tune
        options.pop("enforce_eager")
    calibration = {"source": report.calibration, "prompts": len(report.prompts),
                   **{name: options.pop(name) for name in CALIBRATION}, "greedy": True,
                   "torch_threads": report.torch_threads}
    if load is not None:  # sent as they are: their texts, not a token count, say what was measured
        calibration["prompt_tokens"] = None
        calibration["load_prompts"] = list(load)
    search = {name: list(value) if isinstance(value, tuple) else value for name, value in options.items()}
    return calibration, search


def _draft_length(t: DraftLengthTuning) -> dict[str, Any]:
    c = t.costs
    plain = t.sweep.tokens_per_second(0)
    return {
        "alpha": _r(t.alpha), "alpha_measured_at_k": max(t.ks), "cost_ratio": _r(c.cost_ratio),
        "context_tokens": c.context, "draft_forward_ms": _ms(c.draft),
        "target_forward_ms": {str(n): _ms(s) for n, s in sorted(c.target.items())},
        "plain_tokens_per_second_wall": _r(plain, 1), "chosen": t.chosen, "best_by_cost_model": t.best_measured,
        "best_predicted": t.best_predicted, "spec_k": t.current, "spec_k_kept": t.kept_current,
        "by_k": [{"k": k, "verify_cost": _r(c.verify_cost(k)),
                  "tokens_per_step_predicted": _r(t.predicted_tokens_per_step(k)),
                  "tokens_per_step_measured": _r(t.sweep.acceptance[k].tokens_per_step),
                  "speedup_predicted": _r(t.predicted_speedup(k)),
                  "tokens_per_second_cost_model": _r(t.model_tokens_per_second(k), 1),
                  "tokens_per_second_wall": _r(t.sweep.tokens_per_second(k), 1),
                  "wall_vs_plain": _r(t.sweep.tokens_per_second(k) / plain)} for k in t.ks],
    }


def _engine(t: EngineTuning) -> dict[str, Any]:
    """K on the real engine (`tune --engine vllm`): every server's passes and vLLM's own counters."""
    return {
        "engine": t.engine, "method": t.method, "enforce_eager": t.enforce_eager, "chosen": t.chosen,
        "best": t.best, "spec_k": t.current, "noise": _r(t.noise),
        "plain": {"tokens_per_second": _r(t.plain.tokens_per_second, 1),
                  "passes": [_r(v, 1) for v in t.plain.passes]},
        "by_k": [{"k": k, "tokens_per_second": _r(row.tokens_per_second, 1), "vs_plain": _r(t.speedup(k)),
                  "passes": [_r(v, 1) for v in row.passes], "vs_plain_passes": [_r(v) for v in row.ratios],
                  "counters": {"drafts": row.counters.drafts, "draft_tokens": row.counters.draft_tokens,
                               "accepted_tokens": row.counters.accepted_tokens,
                               "accepted_per_position": list(row.counters.accepted_per_position)},
                  "acceptance_rate": (None if row.counters.acceptance_rate is None
                                      else _r(row.counters.acceptance_rate)),
                  "greedy_equal_plain": t.greedy_equal(k)} for k, row in sorted(t.by_k.items())],
    }


def _tree(t: TreeTuning) -> dict[str, Any]:
    chosen = t.chosen
    return {
        "budget": len(t.tree.paths),
        "head_accuracy_top_k": [[_r(t.accuracy.top_k(h, k)) for k in range(1, len(t.accuracy.hits[h]) + 1)]
                                for h in range(len(t.accuracy.hits))],
        "head_positions": list(t.accuracy.positions),
        "trees": [{"name": row.name, "nodes": len(row.choices), "depth": row.depth,
                   "nodes_per_depth": nodes_per_depth(row.choices),
                   "tokens_per_step_predicted": _r(1 + row.predicted_accepted),
                   "tokens_per_step_measured": _r(row.measured.tokens_per_step), "chosen": row is chosen,
                   "choices": row.choices} for row in t.rows],
    }


def _run(report: TuneReport) -> dict[str, Any]:
    """One tune: its settings, the values it chose, and every table it printed, as numbers."""
    calibration, search = _calibration(report)
    record: dict[str, Any] = {"mode": report.spec.speculative.mode, "calibration": calibration, "search": search,
                              "settings": _json_settings(report.settings)}
    if report.layers is not None:
        t = report.layers
        record["layers"] = {"measured_at_k": t.k, "chosen": t.chosen, "rows": [
            {"layers": n, "alpha": _r(row.alpha), "cost_ratio": _r(row.costs.cost_ratio),
             "draft_forward_ms": _ms(row.costs.draft), "tokens_per_step_measured": _r(row.acceptance.tokens_per_step),
             "best_k_predicted": row.best_k, "speedup_predicted": _r(row.speedup)}
            for n, row in sorted(t.rows.items())]}
    if report.draft_length is not None:
        record["draft_length"] = _draft_length(report.draft_length)
    if report.tree is not None:
        record["tree"] = _tree(report.tree)
    if report.engine is not None:
        record["engine"] = _engine(report.engine)
    if report.lookahead is not None:
        la = report.lookahead
        record["lookahead"] = {
            "context_tokens": la.context, "target_forward_ms": {str(n): _ms(s) for n, s in la.seconds_at.items()},
            "batch": la.batch,
            "target_forward_ms_at_batch": {str(n): _ms(s) for n, s in la.loaded_seconds_at.items()},
            "spec": list(la.current), "chosen": list(la.chosen),
            "excluded": {",".join(map(str, c)): why for c, why in la.excluded.items()},
            "rows": [{"config": list(c), "block_tokens": _r(run.mean_block, 2),
                      "tokens_per_step_measured": _r(run.tokens_per_step),
                      "tokens_per_second_cost_model": _r(la.model_tokens_per_second(c), 1),
                      "vs_plain_cost_model": _r(la.speedup(c)),
                      "vs_plain_cost_model_at_batch": _r(la.loaded_speedup(c)),
                      "tokens_per_second_wall": _r(run.wall_tokens_per_second, 1)} for c, run in la.runs.items()]}
    if report.schedule is not None:
        s = report.schedule
        record["schedule"] = {
            "unit": "tree paths" if report.tree is not None else "K", "full_length": s.full_length,
            "measured": "behind tritonserver (tune --served)" if s.served else "in-process",
            "tokens_per_second_by_batch": [
                {"batch": batch, "tokens_per_second": {str(k): _r(v, 1) for k, v in sorted(rates.items())},
                 "best": s.best(batch)} for batch, rates in sorted(s.tokens_per_second.items())],
            "passes_by_batch": [
                {"batch": batch,
                 "tokens_per_second": {str(k): [_r(v, 1) for v in runs] for k, runs in sorted(by.items())}}
                for batch, by in sorted(s.passes.items())],
            "noise_by_batch": {str(b): _r(s.noise(b)) for b in sorted(s.tokens_per_second) if b > 1},
            "schedule": {str(k): v for k, v in s.schedule.items()},
            "measured_schedule": {str(k): v for k, v in s.measured_schedule.items()},
            "spec_schedule": None if s.current is None else {str(k): v for k, v in s.current.items()},
            "spec_schedule_kept": s.kept_current,
        }
        if s.one_client:  # the BLS's K, served at batch size 1: every pass, and the noise K was chosen within
            record["schedule"]["one_client_passes"] = {str(k): [_r(r, 1) for r in rates]
                                                       for k, rates in sorted(s.one_client.items())}
            record["schedule"]["one_client_noise"] = _r(s.one_client_noise)
    return record


def _json_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    return {name: {str(k): v for k, v in value.items()} if name == "draft_len_schedule" else value
            for name, value in settings.items()}


def write_report(path: Path, reports: Sequence[TuneReport], machine: Mapping[str, Any],
                 root: Path | None = None, for_spec: str | None = None) -> dict[str, Any]:
    """Write the tunes of one spec to `path` (atomically): `settings` are the first tune's, the values the spec
    should hold, with the schedule of a served tune (`tune --served`, which measures only that); other later tunes
    (other budgets, say) are kept as comparisons. The spec is named relative to `root`
    (default: the working directory) where it lies inside. `for_spec`: the spec the settings are for where the
    tunes ran on a copy of it (build.backend: reference, which tune can measure), named as `spec`, the copy as
    `tuned_copy`. Returns what was written."""
    if not reports:
        raise ValueError("a tune report needs at least one tune")
    spec = reports[0].spec.path
    if any(r.spec.path != spec for r in reports):
        raise ValueError("a tune report holds the tunes of one spec")
    try:
        shown = spec.resolve().relative_to((root or Path.cwd()).resolve()).as_posix()
    except ValueError:
        shown = str(spec)
    runs = [_run(r) for r in reports]
    settings = dict(runs[0]["settings"])
    for report, run in zip(reports, runs, strict=True):
        if report.options.served:  # `tune --served` measures the schedule alone, for the spec's own K and tree
            settings.update(run["settings"])
    data = {"format": FORMAT, "spec": for_spec or shown, **({"tuned_copy": shown} if for_spec else {}),
            "settings": settings, "machine": dict(machine), "runs": runs}
    replace_text(path, _dumps(data) + "\n")
    return data


def _dumps(value: Any, indent: str = "") -> str:
    """JSON with one key per line, but lists of numbers (a tree's paths, a row of accuracies) and mappings of
    scalars (a schedule, a row's rates) on one line each."""
    inner = indent + " "
    if isinstance(value, dict) and value and not all(_flat(item) and not isinstance(item, list)
                                                     for item in value.values()):
        items = [f"{inner}{json.dumps(key)}: {_dumps(item, inner)}" for key, item in value.items()]
        return "{\n" + ",\n".join(items) + f"\n{indent}}}"
    if isinstance(value, list) and value and not all(_flat(item) for item in value):
        return "[\n" + ",\n".join(f"{inner}{_dumps(item, inner)}" for item in value) + f"\n{indent}]"
    return json.dumps(value)


def _flat(value: Any) -> bool:
    """A scalar, or a list of scalars."""
    scalar = (str, int, float, bool, type(None))
    return isinstance(value, scalar) or (isinstance(value, list) and all(isinstance(v, scalar) for v in value))


def read_report(path: Path) -> dict[str, Any]:
    """A report as written, its `settings` in TuneReport.settings' form (schedule keys back to ints)."""
    data = json.loads(path.read_text(encoding="utf-8"))
    if data.get("format") != FORMAT:
        raise ValueError(f"{path}: not a tune report of format {FORMAT}")
    settings = data["settings"]
    if "draft_len_schedule" in settings:
        settings["draft_len_schedule"] = {int(k): v for k, v in settings["draft_len_schedule"].items()}
    return data


def spec_value(spec: PipelineSpec, name: str) -> Any:
    """The spec's value of one setting, in TuneReport.settings' form."""
    speculative = spec.speculative
    if name == "num_draft_tokens":
        return speculative.num_draft_tokens
    if name == "draft_layers":
        return spec.draft.layers if spec.draft is not None else None
    if name == "medusa_choices":
        return spec.medusa.resolved_choices() if spec.medusa is not None else None
    if name == "lookahead":
        return speculative.lookahead_config().config._asdict()
    if name == "draft_len_schedule":
        return speculative.draft_len_schedule
    raise ValueError(f"unknown tune setting {name!r}")


def spec_differences(spec: PipelineSpec, settings: Mapping[str, Any]) -> list[str]:
    """Where the spec does not hold what the tune chose, one line each ([] when it holds all of it)."""
    problems = []
    for name, chosen in settings.items():
        held = spec_value(spec, name)
        if held == chosen:
            continue
        if name == "medusa_choices":
            held, chosen = f"a {len(held or [])}-node tree", f"another, of {len(chosen)} nodes: {chosen}"
        problems.append(f"{SETTING_FIELDS[name]} is {held}, tune chose {chosen}")
    return problems
