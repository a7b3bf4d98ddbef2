"""`specbuild tune` for a self-draft (`draft.source: target_layers`): how many of the target's layers L it keeps.

More layers agree with the target more often and cost more per draft token. Each L is measured for the two
quantities Leviathan et al.'s expected speedup needs, as K's search measures them: the per-token acceptance rate
alpha (greedy draft-target rounds of the longest K on the calibration prompts, `Acceptance.alpha`) and the cost
ratio c (one draft forward over one target forward, fastest of interleaved repeats at the mean context). Each L's
speedup is the formula's at the K best for it, with v the measured cost of verifying K + 1 tokens; the L with the
highest is chosen (ties: fewer layers), and K is then searched at that L by the draft-target K search itself.

The drafts are the reference runtime's self-drafts (`specbuild.runtime.self_draft`): they share the target's
weights, so every L costs no copy, and acceptance is counted in the target's serving engine drafting with the
served self-draft proposer (its KV cache shared), as the tensorrt_llm model serves it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rich.table import Table

from specbuild.runtime.generation import generate_proposed
from specbuild.runtime.model import CausalLM
from specbuild.runtime.self_draft import self_draft_proposers
from specbuild.runtime.sequence import GenerationStats, StopCriteria
from specbuild.runtime.speculative import expected_speedup
from specbuild.tune.measure import Acceptance, ForwardCosts, Prompts, Tick, measure_forward_seconds, sweep


@dataclass
class LayerRow:
    """One L: its acceptance at the longest K and its costs, and what the formula makes of them."""

    layers: int
    acceptance: Acceptance  # greedy draft-target at K = max(ks)
    costs: ForwardCosts
    ks: Sequence[int]

    @property
    def alpha(self) -> float:
        return self.acceptance.alpha

    def predicted_speedup(self, k: int) -> float:
        return expected_speedup(self.alpha, k, self.costs.cost_ratio, self.costs.verify_cost(k))

    @property
    def best_k(self) -> int:
        return max(self.ks, key=self.predicted_speedup)

    @property
    def speedup(self) -> float:
        """The formula's speedup at this L's best K: what L is chosen by."""
        return self.predicted_speedup(self.best_k)


@dataclass
class LayerTuning:
    rows: dict[int, LayerRow]
    drafts: dict[int, CausalLM]
    k: int  # the K acceptance was measured at

    @property
    def chosen(self) -> int:
        return max(self.rows, key=lambda layers: (self.rows[layers].speedup, -layers))


def tune_layers(target: CausalLM, make_draft: Callable[[int], CausalLM], layers: Sequence[int], prompts: Prompts,
                new_tokens: int, ks: Sequence[int], context: int,
                ticks: Callable[[str, int], Tick] | None = None) -> LayerTuning:
    """Measure every L's acceptance (K = max(ks)) and draft cost, and choose L by the module's rule."""
    ticks = ticks or (lambda _label, _total: lambda: None)
    drafts = {count: make_draft(count) for count in layers}
    k = max(ks)
    stop = StopCriteria(max_new_tokens=new_tokens)  # no end id: every prompt yields exactly new_tokens

    def run(count: int) -> Callable[[list[int]], GenerationStats]:
        proposer = self_draft_proposers(target, count)
        return lambda p: generate_proposed(target, [p], proposer(k), stop=stop).stats

    measured = sweep({count: run(count) for count in drafts}, prompts, 1,
                     ticks(f"self-draft: acceptance of L = {', '.join(map(str, layers))} at K={k}", len(prompts)))
    cost_repeats = 7
    jobs: dict[str, tuple[CausalLM, Sequence[int]]] = {"target": (target, range(1, k + 2))}
    jobs |= {f"L{count}": (draft, [1]) for count, draft in drafts.items()}
    seconds = measure_forward_seconds(jobs, prompts[0], context, repeats=cost_repeats,
                                      tick=ticks("self-draft: forward costs", cost_repeats))
    rows = {}
    for count in layers:
        acceptance = Acceptance()
        for stats in measured.outcomes[count]:
            acceptance.add(stats)
        rows[count] = LayerRow(count, acceptance, ForwardCosts(context, seconds["target"], seconds[f"L{count}"][1]),
                               list(ks))
    return LayerTuning(rows, drafts, k)


def layer_table(t: LayerTuning) -> Table:
    table = Table(title=(f"Self-draft layers L: acceptance alpha (measured at K={t.k}) and draft cost; L by "
                         "Leviathan et al.'s expected speedup at each L's best K"), title_justify="left")
    for name in ("L", "alpha", "cost ratio c", "draft ms", "tokens/step\nat K measured", "best K\npredicted",
                 "speedup\npredicted", ""):
        table.add_column(name, justify="right" if name else "left")
    for count, row in sorted(t.rows.items()):
        table.add_row(str(count), f"{row.alpha:.3f}", f"{row.costs.cost_ratio:.3f}", f"{row.costs.draft * 1e3:.2f}",
                      f"{row.acceptance.tokens_per_step:.2f}", str(row.best_k), f"{row.speedup:.2f}x",
                      "chosen" if count == t.chosen else "")
    table.caption = f"K is then searched at L={t.chosen} (the table below)"
    return table
