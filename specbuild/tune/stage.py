"""`specbuild tune SPEC`: measure speculation on calibration text and write the best settings into the spec.

draft_target: the draft's per-token acceptance rate alpha and the draft/target cost ratio c are measured with
the reference runtime, and K is the one that maximises Leviathan et al.'s expected speedup
(1 - alpha^(K+1)) / ((1 - alpha)(cK + v)), with v the measured cost of verifying K + 1 tokens relative to one
target step (the paper's v = 1); the spec's own K stays where the best K predicts more in only some of the
timing repeats (a tie within the noise). Every K up to --max-k is then also run, so the choice is printed next
to what each K measured.

medusa: each head's top-k accuracy against the target's own greedy tokens is measured, and the tree is grown
greedily under the node budget (the Medusa paper's sparse-tree construction, `tune_tree`); the tuned tree's
predicted and measured tokens per step are printed next to the spec's tree and the same-size prefix of
mc_sim_7b_63, and the one of the budget's size that decoded the most tokens per step is written (the grown tree
is only predicted best: its model assumes independent heads).

lookahead: every (W, N, G) of a small grid is run and chosen by measured tokens per step over the measured cost of
its steps' forwards (`specbuild.tune.lookahead`). A self-draft (draft.source: target_layers): each layer count L
is measured for its acceptance rate and draft cost, L is chosen by the same expected-speedup formula as K, and K
is then tuned at that L (`specbuild.tune.self_draft`). eagle3: K by the draft_target search itself, with the
EAGLE-3 draft as the drafter (`specbuild.tune.eagle3`). Each generation runs on the engine the deployment serves
(`_served_drafter`): one serving engine with a proposer for a self-draft, EAGLE-3 and the PyTorch flow's
DraftTarget, two engines for the engine flow's separate draft (the BLS).

Two speed figures per K, and why: "tokens/s" is wall-clock (batch 1, settings interleaved prompt by prompt,
fastest of --repeats per prompt), what a user sees but noisy on a shared machine; "cost-model tokens/s" is the
measured tokens per step (exact: greedy decoding) over the measured cost of one step (K draft forwards plus
one K + 1 token verification, each the fastest of interleaved repeats). The second is stable enough to compare
K against K, which is what choosing K needs; it leaves out per-round bookkeeping, so it reads higher.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from specbuild.atomic import replace_text
from specbuild.contracts.checkpoint_facts import stale_conversion
from specbuild.contracts.llm_api import PYTORCH, reference_roles, refuse_other_flow
from specbuild.contracts.lookahead import max_draft_len as lookahead_max_draft_len
from specbuild.errors import SpecbuildError
from specbuild.spec import MAX_DRAFT_TOKENS, PipelineSpec, load_spec
from specbuild.tune import spec_edit as tune_yaml
from specbuild.tune.eagle3 import eagle3_forward, load_eagle3_draft
from specbuild.tune.lookahead import LookaheadConfig, LookaheadGrid, LookaheadTuning, grid_candidates, lookahead_table
from specbuild.tune.lookahead import tune_lookahead as measure_lookahead
from specbuild.tune.measure import (
    Acceptance,
    Drafter,
    ForwardCosts,
    HeadAccuracy,
    KSweep,
    Prompts,
    Tick,
    calibration_prompts,
    draft_model,
    greedy_continuations,
    measure_forward_costs,
    measure_head_accuracy,
    medusa_acceptance,
    one_engine,
    sweep_draft_lengths,
)
from specbuild.tune.schedule import (
    ScheduleTuning,
    batch_sizes,
    carried_schedule,
    halvings,
    schedule_lengths,
    tune_schedule,
)
from specbuild.tune.self_draft import LayerTuning, layer_table, tune_layers
from specbuild.tune.served import (
    ONE_CLIENT_PASSES,
    bls_draft_limit,
    deployed_repository,
    measure_served_schedule,
)
from specbuild.tune.tree import MAX_TOP_K, GrownTree, expected_accepted_length, grow_tree, nodes_per_depth
from specbuild.tune.vllm_engine import PASSES_PER_REPEAT as ENGINE_PASSES_PER_REPEAT
from specbuild.tune.vllm_engine import WAVE_KS as ENGINE_WAVE_KS
from specbuild.tune.vllm_engine import EngineTuning

ENGINES = ("reference", "vllm")
"""What `tune --engine` measures on: specbuild's reference runtime (in-process, or behind tritonserver with
--served) or the real vLLM serving the spec's vLLM export (`specbuild.tune.vllm_engine`)."""
REFERENCE_TREE = "mc_sim_7b_63"
TREE_DIR = "medusa_choices"


@dataclass(frozen=True)
class TuneOptions:
    """What to measure on, and where the result goes."""

    calib: Path | None = None  # a UTF-8 text file; None: the held-out pydoc topics that ship with Python
    output: Path | None = None  # write a new spec here instead of editing SPEC
    prompts: int = 8
    prompt_tokens: int = 32
    new_tokens: int = 64
    max_k: int = 8
    repeats: int = 2
    nodes: int | None = None  # Medusa node budget; None: the spec's current tree size
    top_k: int = 10
    inline: bool = False  # write the tuned tree into the spec instead of a JSON file next to it
    write: bool = True
    threads: int | None = 1
    schedule: bool = True  # also measure which draft length pays at which batch size (draft_len_schedule)
    served: bool = False  # measure the schedule behind tritonserver on the deployed repository (tune.served)
    load_prompts: tuple[str, ...] | None = None  # served: the prompts sent as they are; None: the calibration prompts
    windows: tuple[int, ...] | None = None  # lookahead grid; None: specbuild.tune.lookahead's defaults
    ngrams: tuple[int, ...] | None = None
    verification_sets: tuple[int, ...] | None = None
    layers: tuple[int, ...] | None = None  # self-draft layer counts tried; None: 1 .. the target's layers - 1
    engine: str = "reference"  # what K is measured on: specbuild's reference runtime, or the real vLLM ("vllm")
    vllm: Path | None = None  # engine vllm: a virtualenv with vLLM (or its bin/vllm); None: see find_vllm
    enforce_eager: bool = True  # engine vllm: start each server with --enforce-eager (a start in ~30 s, not ~2 min)

    def __post_init__(self) -> None:
        for name in ("prompts", "prompt_tokens", "new_tokens", "max_k", "repeats", "top_k"):
            if getattr(self, name) < 1:
                raise SpecbuildError(f"--{name.replace('_', '-')} must be at least 1")
        if self.max_k > MAX_DRAFT_TOKENS:
            raise SpecbuildError(f"--max-k is at most {MAX_DRAFT_TOKENS}")
        if self.top_k > MAX_TOP_K:
            raise SpecbuildError(f"--top-k is at most {MAX_TOP_K}: TensorRT-LLM packs tree indices into 4 bits")
        if self.nodes is not None and self.nodes < 1:
            raise SpecbuildError("--nodes must be at least 1")
        if self.layers is not None and (not self.layers or min(self.layers) < 1):
            raise SpecbuildError("--layers values must be at least 1")
        if self.load_prompts is not None and not self.served:
            raise SpecbuildError("--load-prompts are the prompts --served sends; without --served they would be "
                                 "ignored", hint="add --served, or leave out --load-prompts")
        if self.load_prompts is not None:  # blank ones dropped here, once: what is sent and reported is this
            object.__setattr__(self, "load_prompts", tuple(text for text in self.load_prompts if text.strip()))
            if not self.load_prompts:
                raise SpecbuildError("--load-prompts holds no prompt", hint="one prompt per line")
        if self.engine not in ENGINES:
            raise SpecbuildError(f"--engine {self.engine}: tune measures on {' or '.join(ENGINES)}")
        if self.engine != "vllm" and (self.vllm is not None or not self.enforce_eager):
            raise SpecbuildError("--vllm and --no-enforce-eager say how to start vLLM, which only --engine vllm "
                                 "starts", hint="add --engine vllm, or leave them out")
        if self.engine == "vllm" and self.served:
            raise SpecbuildError("--served measures behind tritonserver, --engine vllm on vLLM: one at a time",
                                 hint="leave out one of them")
        if self.served and not self.schedule:
            raise SpecbuildError("--served measures the load-aware schedule, which --no-schedule leaves out",
                                 hint="leave out one of them")

    def lookahead_grid(self) -> LookaheadGrid:
        given = {name: value for name in ("windows", "ngrams", "verification_sets")
                 if (value := getattr(self, name)) is not None}
        return LookaheadGrid(**given)


# ---------------------------------------------------------------------------------------------- draft length


@dataclass
class DraftLengthTuning:
    costs: ForwardCosts
    sweep: KSweep
    alpha: float
    current: int | None = None  # the spec's own K, kept where no K predicts better beyond the noise (chosen)

    @property
    def ks(self) -> list[int]:
        return sorted(self.sweep.acceptance)

    @property
    def best_predicted(self) -> int:
        """The K with the highest predicted speedup from the fastest repeat's costs."""
        return max(self.ks, key=self.predicted_speedup)

    @property
    def chosen(self) -> int:
        """What tune writes into the spec: the best predicted K, unless the spec's own K is one of those tried and
        the best predicts more than it in some repeats' costs only (each repeat times every forward, interleaved).
        Neighbouring Ks often predict within a percent of each other, and the fastest-repeat costs then decide
        between them by the machine's noise: measured on demo-pytorch, K 4 and K 5 swapped places between three
        runs within an hour, each swap an edit to the spec. Keeping the spec's K at such a tie makes a re-run
        leave the spec as it is (as the tree tune keeps the spec's tree at a tie)."""
        best = self.best_predicted
        if self.current in self.ks and self.current != best and not self.beats_in_every_repeat(best, self.current):
            return self.current
        return best

    @property
    def kept_current(self) -> bool:
        """Whether the spec's K was kept over a better predicted one (chosen)."""
        return self.chosen != self.best_predicted

    def repeat_wins(self, k: int, other: int) -> int:
        """In how many repeats' costs K predicts a higher speedup than `other`."""
        return sum(self.predicted_speedup(k, costs) > self.predicted_speedup(other, costs) for costs in self._repeats)

    def beats_in_every_repeat(self, k: int, other: int) -> bool:
        return self.repeat_wins(k, other) == len(self._repeats)

    @property
    def _repeats(self) -> list[ForwardCosts]:
        return self.costs.repeats or [self.costs]

    def predicted_tokens_per_step(self, k: int) -> float:
        from specbuild.runtime.speculative import expected_tokens_per_step

        return expected_tokens_per_step(self.alpha, k)

    def predicted_speedup(self, k: int, costs: ForwardCosts | None = None) -> float:
        """Leviathan et al.'s expected speedup at K with the measured costs (the fastest repeat's by default)."""
        from specbuild.runtime.speculative import expected_speedup

        costs = costs or self.costs
        return expected_speedup(self.alpha, k, costs.cost_ratio, costs.verify_cost(k))

    def model_tokens_per_second(self, k: int) -> float:
        """Measured tokens per step over the measured seconds of one step (see the module docstring)."""
        return self.sweep.acceptance[k].tokens_per_step / self.costs.step_seconds(k)

    @property
    def best_measured(self) -> int:
        return max(self.ks, key=self.model_tokens_per_second)


def tune_draft_length(target: Any, drafter: Drafter, prompts: Prompts, options: TuneOptions, ks: Sequence[int],
                      ticks: Callable[[str, int], Tick] | None = None, current: int | None = None) -> DraftLengthTuning:
    """Measure costs and acceptance, pick K by the expected-speedup formula, and sweep every K in `ks`: the one
    K search of every drafting method (a draft model, a self-draft, an EAGLE-3 draft). `current` is the spec's
    own K (see DraftLengthTuning.chosen)."""
    ticks = ticks or (lambda _label, _total: lambda: None)
    context = _mean_context(options)
    cost_repeats = 7
    costs = measure_forward_costs(target, drafter, prompts[0], context, max(ks) + 1, repeats=cost_repeats,
                                  tick=ticks("forward costs", cost_repeats))
    sweep = sweep_draft_lengths(target, drafter, prompts, options.new_tokens, ks, repeats=options.repeats,
                                tick=ticks(f"K sweep 1..{max(ks)}", options.repeats * len(prompts)))
    alpha = sweep.acceptance[max(ks)].alpha  # the longest rounds see the most positions
    return DraftLengthTuning(costs, sweep, alpha, current)


def _mean_context(options: TuneOptions) -> int:
    """The mean context of a generated token: where per-forward costs are timed."""
    return options.prompt_tokens + options.new_tokens // 2


# ---------------------------------------------------------------------------------------------- self-draft


def _layer_counts(target: Any, options: TuneOptions) -> list[int]:
    """The L tried: --layers, or every L a self-draft may have (1 .. the target's layers - 1)."""
    return sorted(set(options.layers)) if options.layers else list(range(1, target.config.num_layers))


def _self_draft_maker(target: Any) -> Callable[[int], Any]:
    """L -> the reference runtime's self-draft of the target's first L layers (sharing the target's weights, so
    every L tried costs no copy); an L it cannot make is refused with its rule, naming --layers."""
    from specbuild.runtime.self_draft import self_draft_model

    def make(layers: int) -> Any:
        try:
            return self_draft_model(target, layers)
        except ValueError as err:
            raise SpecbuildError(f"--layers {layers}: {err}", hint="give --layers values the target has room for") \
                from err

    return make


def _served_drafter(spec: PipelineSpec, models: dict[str, Any], searched_layers: int | None,
                    draft_checkpoint: Path | None) -> Drafter:
    """The drafting the deployment serves, so that K and its schedule are timed on the engine that runs them:
    a self-draft in the target's engine and cache (the tensorrt_llm model's `self_draft_proposer`, with the
    adapter from the converted self-draft checkpoint, or the L just searched), EAGLE-3 and the PyTorch flow's
    DraftTarget in the llmapi model's one engine, and the engine flow's separate draft through the BLS's two
    engines."""
    from specbuild.runtime.proposers import Eagle3Proposer, ModelProposer
    from specbuild.runtime.self_draft import self_draft_proposers

    target = models["target"]
    assert spec.draft is not None
    if spec.speculative.mode == "eagle3":
        assert spec.draft.model is not None
        draft = load_eagle3_draft(spec.draft.model, target)
        return one_engine("EAGLE-3", target, lambda k: Eagle3Proposer(draft, k), eagle3_forward(draft))
    if spec.draft.is_self_draft:
        layers = searched_layers if searched_layers is not None else spec.draft.layers
        adapter = draft_checkpoint if spec.draft.adapter is not None else None
        return one_engine("self-draft", target, self_draft_proposers(target, layers, adapter), models["draft"])
    if spec.build.flow == PYTORCH:
        return one_engine("draft-target", target, lambda k: ModelProposer(models["draft"], k), models["draft"])
    return draft_model(target, models["draft"])


# ---------------------------------------------------------------------------------------------- Medusa tree


@dataclass
class TreeRow:
    name: str
    choices: list[list[int]]
    predicted_accepted: float
    measured: Acceptance

    @property
    def depth(self) -> int:
        return max(len(p) for p in self.choices)


@dataclass
class TreeTuning:
    accuracy: HeadAccuracy
    tree: GrownTree
    rows: list[TreeRow] = field(default_factory=list)  # tuned first, then the spec's tree and the reference
    current: list[list[int]] | None = None  # the spec's own tree, kept where nothing measured better

    @property
    def tuned(self) -> TreeRow:
        return self.rows[0]

    @property
    def chosen(self) -> TreeRow:
        """The tree tune writes: of the measured trees with the budget's node count (one verification costs the
        same for each), the one with the most measured tokens per step. The grown tree is only predicted best
        (independent heads assumed), so a preset that decodes better on the calibration prompts wins; on a tie
        the spec keeps its own tree, then the grown tree goes before the presets."""
        size = len(self.tree.paths)
        same_size = [row for row in self.rows if len(row.choices) == size]
        return max(same_size, key=lambda row: (row.measured.tokens_per_step, row.choices == self.current))


def reference_prefix(budget: int, heads: int) -> list[list[int]]:
    """The first `budget` nodes of mc_sim_7b_63 that the checkpoint's heads can fill (its list puts every node
    after its parent, so a prefix is a tree)."""
    from specbuild.medusa.choices import load_choices

    return [p for p in load_choices(REFERENCE_TREE) if len(p) <= heads][:budget]


def tune_medusa_tree(model: Any, prompts: Prompts, options: TuneOptions, budget: int,
                     compare: Sequence[tuple[str, list[list[int]]]] = (),
                     ticks: Callable[[str, int], Tick] | None = None,
                     current: list[list[int]] | None = None) -> TreeTuning:
    """Measure head accuracies, grow the tree, and measure it (and each tree in `compare`) by decoding;
    `current` is the spec's own tree (see TreeTuning.chosen)."""
    ticks = ticks or (lambda _label, _total: lambda: None)
    continuations = greedy_continuations(model, prompts, options.new_tokens)
    accuracy = measure_head_accuracy(model, prompts, continuations, options.top_k,
                                     tick=ticks("head accuracy", len(prompts)))
    try:
        tree = grow_tree(accuracy.accuracies, budget)
    except ValueError as err:
        raise SpecbuildError(f"cannot grow a {budget}-node tree: {err}",
                             hint="lower --nodes, or raise --top-k to measure more ranks per head") from err
    tuning = TreeTuning(accuracy, tree, current=current)
    batches = -(-len(prompts) // 4)
    for name, choices in [("tuned", tree.choices), *compare]:
        measured = medusa_acceptance(model, prompts, options.new_tokens, choices,
                                     tick=ticks(f"decode with {name}", batches))
        predicted = expected_accepted_length(choices, accuracy.accuracies)
        tuning.rows.append(TreeRow(name, [list(p) for p in choices], predicted, measured))
    return tuning


# ---------------------------------------------------------------------------------------------- the spec

MEASURED_MODES = ("draft_target", "medusa", "lookahead", "eagle3")
"""What tune measures: modes specbuild's reference runtime decodes (runtime/speculative.py, medusa_decoding.py,
lookahead_decoding.py, eagle3_decoding.py) and tune has a search for."""

UNMEASURED_MODE_REASON = {
    mode: f"tune has no search for {what} settings yet; set speculative.num_draft_tokens and speculative.{mode} by "
          f"hand, comparing settings by the tokens per target forward `specbuild generate CKPT --{mode}` prints "
          "on the target's TensorRT-LLM checkpoint (the llmapi model also reports acceptance_rate per request)"
          + ("; or measure K on the real vLLM with `specbuild tune --engine vllm`" if mode == "ngram" else "")
    for mode, what in (("ngram", "n-gram"), ("sa", "suffix-automaton"))
}
"""Why tune refuses a mode it cannot measure, and what to do instead (one message: no stage to run first)."""

PYTORCH_FLOW_REASON = (
    "tune measures the checkpoints `specbuild convert` writes for specbuild's reference runtime, and on build.flow: "
    "pytorch it writes them only for build.backend: reference; tune a copy of the spec with build.backend: reference "
    "(`specbuild convert COPY`, then `specbuild tune COPY`) and carry speculative.num_draft_tokens and "
    "draft_len_schedule over, or set them by hand")


def refuse_unmeasurable(spec: PipelineSpec, spec_path: Path) -> None:
    """Refuse, before any model is loaded, a spec tune cannot measure, with the one thing to do instead.

    The order keeps every message final: a mode no runtime here decodes is said first (whatever the flow), then
    the flow checks every stage makes (Medusa on the PyTorch flow: set build.flow: engine, which tune measures),
    then the PyTorch flow, which has no converted checkpoint to measure (`specbuild convert` has nothing to do
    there, so "run convert first" would send the user in a loop)."""
    mode = spec.speculative.mode
    if mode == "none":
        raise SpecbuildError(f"{spec_path}: speculative.mode is 'none'; there is nothing to tune",
                             hint="set speculative.mode to draft_target or medusa")
    if mode not in MEASURED_MODES:
        raise SpecbuildError(f"{spec_path}: speculative.mode is {mode!r}, which `specbuild tune` cannot measure",
                             hint=UNMEASURED_MODE_REASON.get(mode, f"set {mode}'s settings by hand"))
    refuse_other_flow(spec, "tune")
    if spec.build.flow == PYTORCH and not reference_roles(spec):
        raise SpecbuildError(f"{spec_path}: build.flow is pytorch with build.backend {spec.build.backend}, which "
                             "`specbuild tune` cannot measure", hint=PYTORCH_FLOW_REASON)



KIND_OPTIONS = {"nodes": ("--nodes", "medusa"), "inline": ("--inline", "medusa"), "windows": ("--window", "lookahead"),
                "ngrams": ("--ngram", "lookahead"), "verification_sets": ("--verification-set", "lookahead"),
                "layers": ("--layers", "self-draft")}
"""The search options of one kind of speculation (TuneOptions field -> option, kind)."""


def refuse_unused_options(spec: PipelineSpec, spec_path: Path, options: TuneOptions) -> None:
    """A search option of another kind of speculation than SPEC's, or any with --served (which measures only the
    schedule), would change nothing: refused by name before any model loads, not ignored."""
    draft = spec.draft
    kind = ("self-draft" if spec.speculative.mode == "draft_target" and draft is not None and draft.is_self_draft
            else spec.speculative.mode)
    for name, (option, owner) in KIND_OPTIONS.items():
        if getattr(options, name) in (None, False):
            continue
        if options.served:
            raise SpecbuildError(f"{option} would change nothing with --served, which measures only the schedule",
                                 hint=f"give {option} to a tune without --served, or leave it out")
        if owner != kind:
            raise SpecbuildError(f"{option} would change nothing on {spec_path}: it is for {owner} specs, and this "
                                 f"spec's speculation is {kind}", hint=f"leave out {option}")


def _checkpoint(spec: PipelineSpec, role: str) -> Path:
    directory = spec.checkpoint_dir(role)
    if not (directory / "config.json").is_file():
        raise SpecbuildError(
            f"no converted {role} checkpoint at {directory} (tune measures the converted checkpoints)",
            hint=f"run `specbuild convert {spec.path}` first",
        )
    stale = stale_conversion(role, directory)
    if stale is not None:
        raise SpecbuildError(f"{stale} (tune would measure the old weights)",
                             hint=f"run `specbuild convert {spec.path}` first")
    return directory


def _calibration_texts(options: TuneOptions) -> list[str]:
    if options.calib is None:
        from specbuild.corpus import heldout_texts

        return heldout_texts()
    try:
        return [options.calib.read_text(encoding="utf-8")]
    except (OSError, UnicodeDecodeError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise SpecbuildError(f"cannot read calibration text {options.calib}: {reason}") from err


@dataclass
class SpecUpdate:
    """The values tune writes: K, or a Medusa tree (and its provenance for the tree file), and the load-aware
    schedule."""

    num_draft_tokens: int | None = None
    max_draft_len: int | None = None  # kept where a served K is written below it (the engine then stays as built)
    choices: list[list[int]] | None = None
    tree_source: str = ""
    draft_len_schedule: dict[int, int] | None = None
    lookahead: LookaheadConfig | None = None
    draft_layers: int | None = None


def write_spec(spec: PipelineSpec, update: SpecUpdate, output: Path | None, inline: bool) -> list[Path]:
    """Change only the tuned values in the spec's YAML text, keeping comments and layout; with `output`, write a
    new spec there (relative paths rebased so it names the same models). The result is re-loaded and checked
    before it replaces anything. Returns the files written."""
    source = spec.path
    check_output(output)
    final = (output if output is not None else source).absolute()
    text = source.read_text(encoding="utf-8")
    root = tune_yaml.compose(text, str(source))
    edits: list[tune_yaml.Edit] = []
    tree_path: Path | None = None
    tree_text = ""
    if update.num_draft_tokens is not None:
        edits.append(tune_yaml.set_value(text, root, ("speculative", "num_draft_tokens"),
                                         tune_yaml.scalar(update.num_draft_tokens)))
    if update.max_draft_len is not None:
        edits.append(tune_yaml.set_value(text, root, ("speculative", "max_draft_len"),
                                         tune_yaml.scalar(update.max_draft_len)))
    if update.lookahead is not None:
        edits += _lookahead_edits(text, root, update.lookahead)
    if update.draft_layers is not None:
        edits.append(tune_yaml.set_value(text, root, ("draft", "layers"), tune_yaml.scalar(update.draft_layers)))
    if update.draft_len_schedule is not None:
        flow = "{" + ", ".join(f"{size}: {length}" for size, length in sorted(update.draft_len_schedule.items())) + "}"
        edits.append(tune_yaml.set_value(text, root, ("speculative", "draft_len_schedule"), flow))
    if update.choices is not None:
        if inline:
            value = tune_yaml.flow_list(update.choices)
        else:
            tree_path = final.parent / TREE_DIR / f"{spec.name}-tuned.json"
            paths = ",\n".join(f"    {json.dumps(path)}" for path in update.choices)
            tree_text = f'{{\n  "source": {json.dumps(update.tree_source)},\n  "choices": [\n{paths}\n  ]\n}}'
            value = tune_yaml.scalar(f"{TREE_DIR}/{tree_path.name}")
        edits.append(tune_yaml.set_value(text, root, ("medusa", "choices"), value))
    if final.parent != source.parent.absolute():
        edits += tune_yaml.rebase_paths(text, root, spec, final.parent, skip=[("medusa", "choices")])
    new_text = tune_yaml.apply(text, edits)
    if tree_path is None:
        _replace_checked(final, new_text, update)
        return [final]
    # The edited spec can only be checked with its tree file in place: put it there, and put back what was there
    # before (an earlier tune's tree, which the old spec may name) if the check fails.
    previous = tree_path.read_bytes() if tree_path.is_file() else None
    replace_text(tree_path, tree_text + "\n")
    try:
        _replace_checked(final, new_text, update)
    except BaseException:
        if previous is None:
            tree_path.unlink(missing_ok=True)
        else:
            replace_text(tree_path, previous.decode("utf-8"))
        raise
    return [tree_path, final]


def check_output(output: Path | None) -> None:
    """Refuse an --output no spec can be written to (a directory, or a path under a file), before tune measures
    for minutes and then fails to write."""
    if output is None:
        return
    final = output.absolute()
    if final.is_dir():
        raise SpecbuildError(f"--output {output} is a directory", hint="give the new spec's file name")
    existing = next(parent for parent in final.parents if parent.exists())  # the root always exists
    if not existing.is_dir():
        raise SpecbuildError(f"--output {output}: {existing} is a file, so nothing can be written under it",
                             hint="give a path under a directory")


def _lookahead_edits(text: str, root: Any, config: LookaheadConfig) -> list[tune_yaml.Edit]:
    """(W, N, G) value by value into an existing speculative.lookahead section (its comments stay), or the
    section as one flow mapping where the spec leaves it out."""
    values = dict(zip(LookaheadConfig._fields, config, strict=True))
    if tune_yaml.find(root, ("speculative", "lookahead")) is None:
        flow = "{" + ", ".join(f"{name}: {value}" for name, value in values.items()) + "}"
        return [tune_yaml.set_value(text, root, ("speculative", "lookahead"), flow)]
    return [tune_yaml.set_value(text, root, ("speculative", "lookahead", name), tune_yaml.scalar(value))
            for name, value in values.items()]


def _replace_checked(final: Path, text: str, update: SpecUpdate) -> None:
    replace_text(final, text, check=lambda staged: _check_written(staged, update))


def _check_written(path: Path, update: SpecUpdate) -> None:
    """The edited spec must load and hold the tuned values; a bug here must not replace a working spec."""
    try:
        reloaded = load_spec(path)
    except SpecbuildError as err:
        raise SpecbuildError(f"the tuned spec does not validate, so nothing was replaced: {err.message}") from err
    if update.num_draft_tokens is not None and reloaded.speculative.num_draft_tokens != update.num_draft_tokens:
        raise SpecbuildError("internal error: the edited spec does not hold the tuned K; nothing was replaced")
    if update.choices is not None and (reloaded.medusa is None
                                       or reloaded.medusa.resolved_choices() != update.choices):
        raise SpecbuildError("internal error: the edited spec does not hold the tuned tree; nothing was replaced")
    if update.draft_len_schedule is not None and reloaded.speculative.draft_len_schedule != update.draft_len_schedule:
        raise SpecbuildError("internal error: the edited spec does not hold the tuned schedule; nothing was replaced")
    if update.lookahead is not None and tuple(reloaded.speculative.lookahead_config().config) != update.lookahead:
        raise SpecbuildError("internal error: the edited spec does not hold the tuned (W, N, G); nothing was replaced")
    if update.draft_layers is not None and (reloaded.draft is None or reloaded.draft.layers != update.draft_layers):
        raise SpecbuildError("internal error: the edited spec does not hold the tuned draft.layers; nothing was "
                             "replaced")


# ---------------------------------------------------------------------------------------------- the command


SETTING_FIELDS = {
    "draft_layers": "draft.layers",
    "num_draft_tokens": "speculative.num_draft_tokens",
    "medusa_choices": "medusa.choices",
    "lookahead": "speculative.lookahead",
    "draft_len_schedule": "speculative.draft_len_schedule",
}
"""TuneReport.settings' keys and the spec fields they stand for."""


LOAD_PROMPTS = "load prompts (--load-prompts)"
"""TuneReport.calibration where a served tune sent the load's own prompts (TuneOptions.load_prompts)."""


@dataclass
class TuneReport:
    """What one tune measured, on what, and what it chose (specbuild.tune.report writes it out as JSON)."""

    spec: PipelineSpec
    prompts: Prompts
    options: TuneOptions = field(default_factory=TuneOptions)
    calibration: str = "held-out pydoc topics"  # where the prompts came from
    torch_threads: int = 1  # what the measurements ran with
    draft_length: DraftLengthTuning | None = None
    tree: TreeTuning | None = None
    schedule: ScheduleTuning | None = None
    lookahead: LookaheadTuning | None = None
    layers: LayerTuning | None = None
    engine: EngineTuning | None = None  # --engine vllm: K measured on the real engine
    update: SpecUpdate | None = None  # what tune writes (or, in a dry run, would write) into the spec
    written: list[Path] = field(default_factory=list)

    @property
    def settings(self) -> dict[str, Any]:
        """The tuned values, as the spec holds them once tune has written them (a Medusa tree the spec keeps
        included): speculative.num_draft_tokens, draft.layers, medusa.choices, speculative.lookahead and
        speculative.draft_len_schedule, each only where this tune chose it."""
        chosen: dict[str, Any] = {}
        if self.layers is not None:
            chosen["draft_layers"] = self.layers.chosen
        if self.draft_length is not None:
            chosen["num_draft_tokens"] = self.draft_length.chosen
        if self.engine is not None:
            chosen["num_draft_tokens"] = self.engine.chosen
        if self.tree is not None:
            chosen["medusa_choices"] = self.tree.chosen.choices
        if self.lookahead is not None:
            chosen["lookahead"] = self.lookahead.chosen._asdict()
        if self.schedule is not None and self.schedule.measured_full_length:
            chosen["num_draft_tokens"] = self.schedule.full_length  # served: the BLS's K at batch size 1
        if self.schedule is not None:
            chosen["draft_len_schedule"] = self.schedule.schedule
        return chosen

    def summary(self) -> str:
        """One line naming every choice, the tables' conclusion."""
        parts = []
        for name, value in self.settings.items():
            if name == "medusa_choices":
                assert self.tree is not None
                row = self.tree.chosen
                value = f"{row.name} ({len(row.choices)} nodes, {row.measured.tokens_per_step:.3f} tokens/step)"
            elif name == "lookahead":
                value = "(W, N, G) = " + ", ".join(map(str, value.values()))
            parts.append(f"{SETTING_FIELDS[name]} {value}")
        return "tune chose: " + "; ".join(parts)


@contextmanager
def _progress(console: Console) -> Iterator[Callable[[str, int], Tick]]:
    """Hands out one progress task per measurement phase; each returns its `tick`."""
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:

        def phase(label: str, total: int) -> Tick:
            task = progress.add_task(label, total=total)
            return lambda: progress.advance(task)

        yield phase


def run_tune(spec_path: Path, options: TuneOptions, console: Console | None = None,
             out: Console | None = None) -> TuneReport:
    """Load SPEC's converted checkpoints, measure, print the tables to `out`, and write the choices."""
    console = console or Console(stderr=True)
    out = out or Console()
    spec = load_spec(spec_path)
    if options.engine == "vllm":  # the export says what vLLM cannot serve, n-gram included in what it can
        return _run_vllm(spec, spec_path, options, console, out)
    refuse_unmeasurable(spec, spec_path)
    refuse_unused_options(spec, spec_path, options)
    check_output(options.output if options.write else None)
    mode = spec.speculative.mode
    if options.served:  # before any model is loaded: nothing to serve, or no schedule to measure
        deployed_repository(spec)
        return _run_served(spec, options, console, out)
    self_draft = mode == "draft_target" and spec.draft is not None and spec.draft.is_self_draft
    if self_draft and spec.draft is not None and spec.draft.adapter is not None:
        # The adapter was trained after layer L: another L has no adapter, so only K is searched, with the
        # converted self-draft (its L layers and the adapter) as any draft.
        if options.layers:
            raise SpecbuildError(f"--layers: draft.adapter {spec.draft.adapter} was trained after the target's first "
                                 f"{spec.draft.layers} layers, so tune keeps draft.layers {spec.draft.layers}",
                                 hint="leave out --layers, or remove draft.adapter to search L without one")
        self_draft = False
    candidates = grid_candidates(options.lookahead_grid(), spec) if mode == "lookahead" else None

    import torch

    from specbuild.runtime.model import CausalLM

    if options.threads is not None:
        torch.set_num_threads(options.threads)
    # A self-draft is made from the target for every L tried, so only the target's conversion is read.
    # An EAGLE-3 draft is read from its own directory, as the PyTorch flow's reference backend reads it.
    roles = {"draft_target": ("target",) if self_draft else ("target", "draft"), "lookahead": ("target",),
             "eagle3": ("target",)}.get(mode, ("medusa",))
    directories = {role: _checkpoint(spec, role) for role in roles}
    _, prompts, calib = _calibration(spec, options)
    models = {role: CausalLM.from_checkpoint(path) for role, path in directories.items()}
    report = TuneReport(spec, prompts, options, calib, torch.get_num_threads())
    out.print(f"calibration: {len(prompts)} prompts of {options.prompt_tokens} tokens from {calib}, "
              f"{options.new_tokens} new tokens each, greedy, torch threads {torch.get_num_threads()}",
              highlight=False)
    update = SpecUpdate()
    drafter: Drafter | None = None
    with _progress(console) as phase:
        if mode == "lookahead":
            assert candidates is not None
            report.lookahead = measure_lookahead(models["target"], prompts, candidates,
                                                 spec.speculative.lookahead_config().config, options.new_tokens,
                                                 _mean_context(options), options.repeats, phase,
                                                 batch=spec.build.max_batch_size)
            update.lookahead = report.lookahead.chosen
        elif mode in ("draft_target", "eagle3"):
            ks = list(range(1, min(options.max_k, spec.speculative.max_draft_len or options.max_k) + 1))
            if self_draft:
                report.layers = tune_layers(models["target"], _self_draft_maker(models["target"]),
                                            _layer_counts(models["target"], options), prompts, options.new_tokens,
                                            ks, _mean_context(options), phase)
                update.draft_layers = report.layers.chosen
                models["draft"] = report.layers.drafts[report.layers.chosen]
            drafter = _served_drafter(spec, models, report.layers.chosen if report.layers else None,
                                      directories.get("draft"))
            # The spec's K was set for its own draft: a self-draft whose layer count changed has no K to keep.
            same_draft = report.layers is None or spec.draft is None or report.layers.chosen == spec.draft.layers
            report.draft_length = tune_draft_length(models["target"], drafter, prompts, options, ks, phase,
                                                    spec.speculative.num_draft_tokens if same_draft else None)
            update.num_draft_tokens = report.draft_length.chosen
        else:
            assert spec.medusa is not None
            current = spec.medusa.resolved_choices()
            budget = options.nodes or len(current)
            heads = models["medusa"].config.num_medusa_heads
            compare = [(f"spec: {_tree_name(spec)}", current),
                       (f"{REFERENCE_TREE}[:{budget}]", reference_prefix(budget, heads))]
            report.tree = tune_medusa_tree(models["medusa"], prompts, options, budget, compare, phase, current)
            chosen = report.tree.chosen
            if chosen.choices != current:  # the spec keeps its own tree where nothing measured better
                update.choices = chosen.choices
                grown = (f"greedy sparse tree ({budget} nodes) from head top-{options.top_k} accuracies"
                         if chosen is report.tree.tuned else
                         f"{chosen.name}, which decoded more tokens per step than the greedy sparse tree")
                update.tree_source = f"specbuild tune: {grown} on {calib} ({len(prompts)} prompts)"
        if options.schedule and mode != "lookahead":  # in-process a response costs nothing: Lookahead's is served
            report.schedule = _tune_schedule(spec, models, drafter, report.tree, prompts, options, update, phase)
            update.draft_len_schedule = report.schedule.schedule
    return _finish(report, update, options, console, out)


def _run_vllm(spec: PipelineSpec, spec_path: Path, options: TuneOptions, console: Console,
              out: Console) -> TuneReport:
    """`tune --engine vllm`: K on the real vLLM engine serving the spec's vLLM export (`specbuild.tune.vllm_engine`);
    every refusal of `specbuild export vllm` (Medusa, Lookahead, a self-draft, a draft format vLLM cannot load) is
    this command's too, said before any server starts."""
    from specbuild.export import build_plan
    from specbuild.tune.vllm_engine import SCHEDULE_LEVER, default_log_dir, find_vllm, measure_engine

    if spec.speculative.mode == "none":
        raise SpecbuildError(f"{spec_path}: speculative.mode is 'none'; there is nothing to tune",
                             hint="set speculative.mode to draft_target, eagle3 or ngram")
    for name, (option, _owner) in KIND_OPTIONS.items():
        if getattr(options, name) not in (None, False):
            raise SpecbuildError(f"{option} would change nothing with --engine vllm, which measures K alone",
                                 hint=f"leave out {option}")
    check_output(options.output if options.write else None)
    plan = build_plan(spec, "vllm", spec.output_dir)  # the directory is unused: vLLM needs only the command
    method = next((json.loads(plan.argv[i + 1])["method"] for i, word in enumerate(plan.argv)
                   if word == "--speculative-config"), spec.speculative.mode)
    install = find_vllm(options.vllm)
    log_dir = default_log_dir(spec.output_dir)
    tokenizer, prompts, calib = _calibration(spec, options)
    texts = [tokenizer.decode(p) for p in prompts]
    ks = list(range(1, min(options.max_k, spec.speculative.max_draft_len or options.max_k) + 1))
    passes = options.repeats * ENGINE_PASSES_PER_REPEAT
    report = TuneReport(spec, prompts, options, calib)
    out.print(f"calibration: {len(prompts)} prompts of {options.prompt_tokens} tokens from {calib}, "
              f"{options.new_tokens} new tokens each, greedy, one client; vLLM ({install.executable}) serving the "
              f"spec's vLLM export with K 1..{max(ks)} and plain, {passes} passes, logs in {log_dir}",
              highlight=False)
    if options.schedule:
        out.print(f"draft_len_schedule is not measured on vLLM: {SCHEDULE_LEVER}", highlight=False)
    servers = len(ks) + -(-len(ks) // ENGINE_WAVE_KS)
    with _progress(console) as phase:
        report.engine = measure_engine(install, plan.argv, texts, ks, options.new_tokens, passes, log_dir,
                                       options.enforce_eager, phase(f"vLLM: plain and K 1..{max(ks)}",
                                                                    servers * passes),
                                       current=spec.speculative.num_draft_tokens, method=method)
    return _finish(report, SpecUpdate(num_draft_tokens=report.engine.chosen), options, console, out)


def _carried_schedule(spec: PipelineSpec, update: SpecUpdate, out: Console) -> dict[int, int] | None:
    """The spec's own schedule carried to the full length this tune chose where it did not measure a schedule
    (--no-schedule, or Lookahead, whose schedule is measured served) and the length changed: else the spec would
    keep a schedule of the old length, which it refuses. None where nothing needs carrying. Said on `out`, with
    how to measure it."""
    schedule = spec.speculative.draft_len_schedule
    if update.num_draft_tokens is not None:
        full = update.num_draft_tokens
    elif update.choices is not None:
        full = len(update.choices)
    elif update.lookahead is not None:
        full = lookahead_max_draft_len(*update.lookahead)
    else:
        return None
    if not schedule or full == spec.full_draft_len:
        return None
    carried = carried_schedule(schedule, spec.full_draft_len, full)
    out.print(f"draft_len_schedule {carried}: the spec's {schedule} carried to the new full length {full}, not "
              "measured; `specbuild tune --served` measures it on the deployed spec", highlight=False)
    return carried


def _finish(report: TuneReport, update: SpecUpdate, options: TuneOptions, console: Console,
            out: Console) -> TuneReport:
    """Print the tables and the choices; write them into the spec unless this is a dry run."""
    spec = report.spec
    report.update = update
    if report.lookahead is not None:
        out.print(lookahead_table(report.lookahead))
    if report.layers is not None:
        out.print(layer_table(report.layers))
    if report.draft_length is not None:
        out.print(draft_length_table(report.draft_length))
    if report.engine is not None:
        out.print(engine_table(report.engine))
    if report.tree is not None:
        out.print(head_accuracy_table(report.tree.accuracy))
        out.print(tree_table(report.tree))
    if report.schedule is not None:
        out.print(schedule_table(report.schedule, "tree paths" if spec.speculative.mode == "medusa" else "K"))
    out.print(report.summary(), highlight=False)
    if update.draft_len_schedule is None:
        update.draft_len_schedule = _carried_schedule(spec, update, out)
    if options.write:
        report.written = write_spec(spec, update, options.output, options.inline)  # a refused write says why
        for path in report.written:
            console.print(f"wrote {path}", highlight=False, soft_wrap=True)
        if update.choices is not None and len(update.choices) != spec.full_draft_len:
            console.print(f"the tree now has {len(update.choices)} nodes, not {spec.full_draft_len}: the Medusa "
                          f"checkpoint's max_draft_len follows it, so run `specbuild convert {report.written[-1]}` "
                          "again", highlight=False, soft_wrap=True)
    return report


def _calibration(spec: PipelineSpec, options: TuneOptions) -> tuple[Any, Prompts, str]:
    """The target's tokenizer, the calibration prompts (token ids) and where their text came from."""
    from specbuild.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(spec.target.model)
    try:
        prompts = calibration_prompts(lambda s: tokenizer.encode(s, add_special_tokens=False, verbose=False),
                                      _calibration_texts(options), options.prompts, options.prompt_tokens)
    except ValueError as err:
        raise SpecbuildError(str(err)) from err
    return tokenizer, prompts, str(options.calib) if options.calib else "held-out pydoc topics"


def _run_served(spec: PipelineSpec, options: TuneOptions, console: Console, out: Console) -> TuneReport:
    """`tune --served`: only the schedule, measured behind tritonserver for what is deployed (the spec's K, L and
    tree: tune those first, in-process, and deploy them), on the calibration prompts as text, or on the load's own
    prompts (`load_prompts`): which length pays under load depends on the traffic (a Lookahead window's n-grams
    pay on repetitive text and long answers), so a schedule is measured on the prompts the deployment serves."""
    from specbuild.serve.triton_env import DEFAULT_THREADS

    threads = int(os.environ.get("SPECBUILD_SERVER_THREADS") or DEFAULT_THREADS)  # the served models' torch threads
    if options.load_prompts is None:
        tokenizer, prompts, calib = _calibration(spec, options)
        texts = [tokenizer.decode(p) for p in prompts]
        measured_on = f"{len(prompts)} prompts of {options.prompt_tokens} tokens from {calib}"
    else:
        from specbuild.tokenizer import load_tokenizer

        texts = list(options.load_prompts)
        tokenizer = load_tokenizer(spec.target.model)
        prompts = [tokenizer.encode(text, add_special_tokens=False, verbose=False) for text in texts]
        calib = LOAD_PROMPTS
        measured_on = f"{len(texts)} {calib}"
    report = TuneReport(spec, prompts, options, calib, threads)
    out.print(f"calibration: {measured_on}, {options.new_tokens} new tokens each, served by tritonserver from "
              f"{spec.deploy.model_repository}", highlight=False)
    with _progress(console) as phase:
        report.schedule = _served_schedule(spec, texts, options, phase)
    settings = report.settings
    k = settings.get("num_draft_tokens")
    # The engine verifies up to the K the spec had (its max_draft_len): kept, so a smaller K needs no rebuild and
    # the next served tune measures the same Ks.
    engine = spec.speculative.max_draft_len or spec.speculative.num_draft_tokens
    update = SpecUpdate(num_draft_tokens=k, draft_len_schedule=settings["draft_len_schedule"],
                        max_draft_len=engine if k is not None and k != engine and
                        spec.speculative.max_draft_len is None else None)
    return _finish(report, update, options, console, out)


def _tune_schedule(spec: PipelineSpec, models: dict[str, Any], drafter: Drafter | None, tree: TreeTuning | None,
                   prompts: Prompts, options: TuneOptions, update: SpecUpdate,
                   phase: Callable[[str, int], Tick]) -> ScheduleTuning:
    """Plain against the tuned length (K, or the chosen tree's paths) and its halvings down to 1 at every batch size
    up to the engines' (see tune_schedule)."""
    from specbuild.runtime.generation import generate
    from specbuild.runtime.medusa_decoding import MedusaConfig, generate_medusa
    from specbuild.runtime.sequence import StopCriteria

    stop = StopCriteria(options.new_tokens)
    if tree is None:
        assert drafter is not None and update.num_draft_tokens is not None
        target, full = models["target"], update.num_draft_tokens

        def run(batch: list[list[int]], k: int) -> int:
            stats = drafter.generate(batch, k, stop) if k else generate(target, batch, stop=stop).stats
            return stats.generated_tokens
    else:
        model, choices = models["medusa"], tree.chosen.choices
        full = len(choices)

        def run(batch: list[list[int]], k: int) -> int:
            result = (generate_medusa(model, batch, MedusaConfig(tuple(map(tuple, choices[:k]))), stop=stop) if k
                      else generate(model, batch, stop=stop))
            return result.stats.generated_tokens

    sizes = batch_sizes(spec.build.max_batch_size)
    return tune_schedule(run, prompts, sizes, halvings(full), full, options.repeats,
                         tick=phase(f"schedule at batch {', '.join(map(str, sizes))}", options.repeats * len(sizes)),
                         current=spec.speculative.draft_len_schedule)


def _served_schedule(spec: PipelineSpec, texts: list[str], options: TuneOptions,
                     phase: Callable[[str, int], Tick]) -> ScheduleTuning:
    """Plain against the deployed length and its halvings at every batch size from 2 up to the engines', behind
    tritonserver (`specbuild.tune.served`), after K itself at batch size 1 where the BLS drafts; Lookahead, whose
    schedule only turns its windows on or off, against its full length alone."""
    sizes = [size for size in batch_sizes(spec.build.max_batch_size) if size > 1]
    lookahead = spec.speculative.mode == "lookahead"
    limit = bls_draft_limit(deployed_repository(spec))
    between = (lambda full: []) if lookahead else halvings
    # the BLS's K is chosen at batch 1 first: the count assumes the spec's, the likeliest choice
    lengths = len(schedule_lengths(spec.full_draft_len, between(spec.full_draft_len)))
    cells = options.repeats * ((limit or 0) * ONE_CLIENT_PASSES + lengths * len(sizes))
    label = f"served {'K at batch 1, then the ' if limit else ''}schedule at batch {', '.join(map(str, sizes))}"
    return measure_served_schedule(spec, texts, sizes, between,
                                   spec.full_draft_len, options.new_tokens, options.repeats, phase(label, cells),
                                   limit)


def _tree_name(spec: PipelineSpec) -> str:
    assert spec.medusa is not None
    choices = spec.medusa.choices
    return "inline" if not isinstance(choices, str) else Path(choices).stem if choices.endswith(".json") else choices


# ---------------------------------------------------------------------------------------------- tables


def draft_length_table(t: DraftLengthTuning) -> Table:
    c = t.costs
    table = Table(title=(f"Draft length K: alpha {t.alpha:.3f} (measured at K={max(t.ks)}), cost ratio c "
                         f"{c.cost_ratio:.3f} (draft {c.draft * 1e3:.2f} ms / target {c.target[1] * 1e3:.2f} ms "
                         f"per forward at {c.context} tokens of context)"), title_justify="left")
    for name in ("K", "verify\ncost v", "tokens/step\npredicted", "tokens/step\nmeasured", "speedup\npredicted",
                 "tokens/s\ncost model", "tokens/s\nwall", "wall vs\nplain", ""):
        table.add_column(name, justify="right" if name else "left")
    plain = t.sweep.tokens_per_second(0)
    best = t.best_measured
    for k in t.ks:
        marks = ", ".join(m for m, on in (("chosen", k == t.chosen), ("best", k == best)) if on)
        table.add_row(str(k), f"{c.verify_cost(k):.2f}", f"{t.predicted_tokens_per_step(k):.2f}",
                      f"{t.sweep.acceptance[k].tokens_per_step:.2f}", f"{t.predicted_speedup(k):.2f}x",
                      f"{t.model_tokens_per_second(k):.0f}", f"{t.sweep.tokens_per_second(k):.0f}",
                      f"{t.sweep.tokens_per_second(k) / plain:.2f}x", marks)
    share = t.model_tokens_per_second(t.chosen) / t.model_tokens_per_second(best)
    table.caption = (f"plain decoding {plain:.0f} tokens/s (wall). Chosen K={t.chosen}: cost-model speed "
                     f"{share:.1%} of the best K={best}.")
    if t.kept_current:
        top = t.best_predicted
        table.caption += (f" The spec's K={t.chosen} is kept: K={top} predicts {t.predicted_speedup(top):.3f}x "
                          f"against its {t.predicted_speedup(t.chosen):.3f}x, but more in only "
                          f"{t.repeat_wins(top, t.chosen)} of the {len(t.costs.repeats)} timing repeats: "
                          f"within the noise.")
    return table


def engine_table(t: EngineTuning) -> Table:
    """K on the real engine: each server's median pass, its speedup over plain, and vLLM's own counters."""
    table = Table(title=f"Draft length K on {t.engine} ({t.method}{', --enforce-eager' if t.enforce_eager else ''}):"
                        " one client, greedy", title_justify="left")
    for name in ("K", "tokens/s\n(median)", "vs plain\n(median)", "drafts", "draft\ntokens", "accepted",
                 "acceptance\nrate", "accepted\nper round", "output\n= plain", ""):
        table.add_column(name, justify="right" if name else "left")
    chosen, best = t.chosen, t.best
    for k in t.ks:
        row = t.by_k[k]
        marks = ", ".join(m for m, on in (("chosen", k == chosen), ("best", k == best), ("spec", k == t.current))
                          if on)
        c = row.counters
        rate, per_round = c.acceptance_rate, row.mean_accepted
        table.add_row(str(k), f"{row.tokens_per_second:.0f}", f"{t.speedup(k):.2f}x",
                      str(c.drafts), str(c.draft_tokens), str(c.accepted_tokens),
                      "–" if rate is None else f"{rate:.3f}", "–" if per_round is None else f"{per_round:.2f}",
                      "yes" if t.greedy_equal(k) else "NO", marks)
    table.caption = (f"plain {t.plain.tokens_per_second:.0f} tokens/s (median pass). Counters: vLLM's "
                     f"spec_decode_num_drafts / _num_draft_tokens / _num_accepted_tokens over the passes. Chosen: the "
                     f"shortest K whose median speedup lies within this run's noise ({t.noise:.1%}, the median "
                     f"spread of each K's passes) of the best K's.")
    return table


def head_accuracy_table(accuracy: HeadAccuracy) -> Table:
    ks = [k for k in (1, 2, 3, 5, 10, 16) if k <= len(accuracy.hits[0])]
    table = Table(title="Medusa heads: top-k accuracy against the target's greedy tokens", title_justify="left")
    table.add_column("head (predicts)", justify="left")
    for k in ks:
        table.add_column(f"top-{k}", justify="right")
    table.add_column("positions", justify="right")
    for h in range(len(accuracy.hits)):
        table.add_row(f"{h} (t+{h + 2})", *(f"{accuracy.top_k(h, k):.3f}" for k in ks), str(accuracy.positions[h]))
    return table


def schedule_table(t: ScheduleTuning, unit: str) -> Group:
    """The table between its title and the schedule, each on lines of their own (the table is narrower)."""
    lengths = sorted({k for rates in t.tokens_per_second.values() for k in rates})
    table = Table()
    table.add_column("batch", justify="right")
    for k in lengths:
        table.add_column(f"{unit} {k}", justify="right")
    table.add_column("best", justify="right")
    for batch, rates in sorted(t.tokens_per_second.items()):
        table.add_row(str(batch), *(f"{rates[k]:.0f}" if k in rates else "–" for k in lengths), str(t.best(batch)))
    where = ("served: output tokens/s of the deployment behind tritonserver, that many streaming clients"
             if t.served else "in-process: the serving engine's tokens/s with that many sequences")
    full = "the full length at batch 1 (TensorRT-LLM's rule)"
    if t.one_client_noise is not None:
        medians = t.one_client_medians
        full = (f"the full length {t.full_length} at batch 1 (TensorRT-LLM's rule): of the Ks one client asked with "
                f"num_draft_tokens, the shortest whose median pass lies within this run's noise "
                f"({t.one_client_noise:.1%}: the median spread of each K's passes) of the best median (K "
                f"{t.full_length} {medians[t.full_length]:.0f} tok/s, K {t.one_client_best} "
                f"{medians[t.one_client_best]:.0f}; the batch-1 row shows each K's fastest pass)")
    noise = ", ".join(f"{b}: {t.noise(b):.1%}" for b in sorted(t.tokens_per_second) if b > 1)
    rule = ("then lengths that never grow with load, closest to each batch size's fastest together, each length "
            f"above 0 charged its batch size's noise (the median spread of the lengths' passes: {noise})")
    chosen = f"draft_len_schedule {t.schedule}: {full}, {rule}"
    if t.kept_current:
        chosen = (f"draft_len_schedule {t.schedule}, the spec's own: the measured {t.measured_schedule} ({full}, "
                  f"{rule}) came "
                  f"closer in only {t.repeat_wins(t.measured_schedule, t.schedule)} of the {t.repeats} repeats: "
                  "within the noise")
    return Group(Text(f"Load-aware speculation: tokens/s by active sequences (batch) and {unit} (0: plain); {where}"),
                 table, Text(chosen))


def tree_table(t: TreeTuning) -> Table:
    table = Table(title="Medusa tree: tokens per step (accepted tree tokens + the target's own)", title_justify="left")
    for name, justify in (("tree", "left"), ("nodes", "right"), ("depth", "right"), ("nodes per depth", "left"),
                          ("predicted", "right"), ("measured", "right"), ("", "left")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    chosen = t.chosen
    for row in t.rows:
        table.add_row(row.name, str(len(row.choices)), str(row.depth), str(nodes_per_depth(row.choices)),
                      f"{1 + row.predicted_accepted:.3f}", f"{row.measured.tokens_per_step:.3f}",
                      "chosen" if row is chosen else "")
    table.caption = ("predicted: 1 + the sum over nodes of the product of the path's per-head accuracies (the "
                     "paper's independence model); measured: greedy Medusa decoding of the calibration prompts; "
                     "chosen: the most measured tokens per step of the trees of the budget's size (a tie keeps the "
                     "spec's tree)")
    return table
