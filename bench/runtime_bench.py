"""Runtime benchmark: plain vs draft-target vs Medusa decoding in specbuild's PyTorch runtime, and transformers'
own assisted generation on the same Hugging Face models and prompts; beside Lookahead, the training-free methods of
TensorRT-LLM's PyTorch backend, NGram and SA (suffix automaton), served by the batching ServingEngine.

On the demo target/draft pair (built once by `specbuild.demo.models`, converted to TensorRT-LLM checkpoints under
bench/work/speculative/), in one process with a fixed torch thread count: greedy decoding of a fixed set of
held-out prompts, batch size 1 (plus a few batch-4 rows), every method warmed up once and then timed over all
prompts in rounds that interleave the methods call by call (per call the fastest round is kept). Records
tokens/s, tokens per target forward, accepted draft tokens per round, acceptance by draft position, and whether
each speculative method's output equals plain greedy decoding token for token.

Writes bench/results/speculative.json (every figure, machine info), bench/results/speculative.md (the table and
the target checks) and bench/results/acceptance.png (acceptance rate by draft position), then exits 1 if a target
is missed, a method crashed or a speculative output differs from plain greedy decoding.
Run with `.venv/bin/python bench/runtime_bench.py [--help]`.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from machine_info import machine_info
from results_files import write_results
from targets import Target, finish

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
TOKENS_PER_FORWARD_MIN = 2.0  # target: mean tokens per target forward, both speculative methods
SPEEDUP_MIN = 1.3  # target: the better speculative method's tokens/s vs plain decoding
EAGLE3_EXTRA = "eagle3-draft"  # the demo extra the EAGLE-3 trainer registers (specbuild.demo.extras)
HF_RATIO_MIN = 1.0  # target: specbuild draft-target at least as fast as transformers' assisted generation, equal K
LOOKAHEAD_SETTINGS = ((4, 3, 4), (7, 5, 7), (2, 4, 4))  # (W, N, G): TensorRT-LLM's default, a wider one, tune's
LOOKAHEAD_TOKENS_MIN = 1.5  # target (issue 14): Lookahead, tokens per target forward on the demo text
SELF_DRAFT_TOKENS_MIN = 2.0  # target (issue 14): self-draft with adapter, tokens per target forward
TRAINING_FREE_TOKENS_MIN = 1.5  # target (issue 23): NGram and SA each, tokens per target forward on the demo text
NGRAM_SETTINGS = ((4, 2), (4, 3), (6, 3))  # (max_draft_len, max_matching_ngram_size)
SA_SETTINGS = ((4, -1), (6, -1), (4, 3))  # (max_draft_len, max_matching_ngram_size; -1: the longest match)

Prompts = list[list[int]]


# -- what one method run records --------------------------------------------------------------------------------
@dataclass
class Counters:
    """Token and forward counts of one pass over all prompts (deterministic under greedy decoding)."""

    generated_tokens: int = 0
    target_forwards: int = 0
    draft_forwards: int = 0
    proposed_by_position: list[int] = field(default_factory=list)
    accepted_by_position: list[int] = field(default_factory=list)

    def add_positions(self, proposed: Sequence[int], accepted: Sequence[int]) -> None:
        while len(self.proposed_by_position) < len(proposed):
            self.proposed_by_position.append(0)
            self.accepted_by_position.append(0)
        for i, (p, a) in enumerate(zip(proposed, accepted, strict=True)):
            self.proposed_by_position[i] += p
            self.accepted_by_position[i] += a

    @property
    def rounds(self) -> int:
        """Sequence-rounds of speculation (every round proposes at least the first position)."""
        return self.proposed_by_position[0] if self.proposed_by_position else 0


Runner = Callable[[Prompts], tuple[Prompts, Counters]]


@dataclass
class Method:
    """One row of the table: a decoding method, its setting, and its measured calls (per round, per batch)."""

    key: str
    runtime: str  # "specbuild" or "transformers"
    method: str  # "plain", "draft-target", "medusa", "lookahead", "assisted"
    setting: str  # K or tree name, "" for plain
    batch: int
    run: Runner
    k: int | None = None
    calls_s: list[list[float]] = field(default_factory=list)  # [round][batch of prompts] wall seconds
    counters: Counters = field(default_factory=Counters)  # of the last round (greedy: the same every round)
    outputs: Prompts = field(default_factory=list)
    error: str | None = None  # the exception that stopped this method; it is then left out of the timing
    greedy_of: Method | None = None  # whose outputs are this method's greedy reference (Medusa-2: its own base)

    @property
    def passes_s(self) -> list[float]:
        """Each round's summed wall time over all prompts."""
        return [sum(calls) for calls in self.calls_s]

    @property
    def wall_s(self) -> float:
        """Per batch of prompts the fastest of the rounds, summed: damps bursts of other work on the machine."""
        return sum(min(times) for times in zip(*self.calls_s, strict=True))

    @property
    def tokens_per_s(self) -> float:
        return self.counters.generated_tokens / self.wall_s

    def start_round(self) -> None:
        self.calls_s.append([])
        self.counters, self.outputs = Counters(), []

    def call(self, prompts: Prompts, record: bool) -> None:
        """One generate call on a batch of prompts, timed with perf_counter; recorded unless a warm-up."""
        with torch.inference_mode():
            start = time.perf_counter()
            out, c = self.run(prompts)
            seconds = time.perf_counter() - start
        if not record:
            return
        self.calls_s[-1].append(seconds)
        self.outputs.extend(out)
        self.counters.generated_tokens += c.generated_tokens
        self.counters.target_forwards += c.target_forwards
        self.counters.draft_forwards += c.draft_forwards
        self.counters.add_positions(c.proposed_by_position, c.accepted_by_position)


# -- specbuild's runtime --------------------------------------------------------------------------------------------
def convert_models(dirs: dict[str, Path], heads: Path | None, tree_nodes: int, work: Path) -> dict[str, Path]:
    """TensorRT-LLM checkpoints of target, draft (and target + Medusa heads), float32; reused when up to date."""
    from rich.console import Console

    from specbuild.convert.pipeline import ConvertRequest, convert_checkpoint

    quiet = Console(stderr=True, quiet=True)
    out = {name: work / name for name in ("target", "draft")}
    for name in out:
        convert_checkpoint(ConvertRequest(name, dirs[name], out[name], "float32"), console=quiet)
    if heads is not None:
        out["medusa"] = work / "medusa"
        request = ConvertRequest("medusa", dirs["target"], out["medusa"], "float32", medusa_heads=heads,
                                 medusa_tree_nodes=tree_nodes)
        convert_checkpoint(request, console=quiet)
    return out


def convert_self_draft(models: Path, work: Path) -> dict[str, Path]:
    """The demo self-draft with its adapter (demo extra self-draft-adapter, trained now unless cached) as the
    checkpoint `convert` writes for draft.adapter: the runtime takes the adapter layer from it."""
    from rich.console import Console

    from specbuild.convert.pipeline import ConvertRequest, convert_checkpoint
    from specbuild.demo.extras import build_extra

    adapter = build_extra(models, "self-draft-adapter")
    layers = json.loads((adapter / "adapter.json").read_text())["layers"]
    out = work / "self-draft-adapter"
    request = ConvertRequest("self-draft-adapter", models / "target", out, "float32", self_draft_layers=layers,
                             self_draft_adapter=adapter)
    convert_checkpoint(request, console=Console(stderr=True, quiet=True))
    return {"self_draft_adapter": out}


def convert_medusa2(models: Path, tree_nodes: int, work: Path) -> dict[str, Path]:
    """The demo's Medusa-2 base and heads (demo extra medusa2, trained now unless cached), converted as the
    Medusa-1 pair is: the new base alone (its own plain greedy is the rows' reference) and with its heads."""
    from rich.console import Console

    from specbuild.convert.pipeline import ConvertRequest, convert_checkpoint
    from specbuild.demo.extras import build_extra

    trained = build_extra(models, "medusa2")
    quiet = Console(stderr=True, quiet=True)
    out = {"medusa2_base": work / "medusa2-base", "medusa2": work / "medusa2"}
    convert_checkpoint(ConvertRequest("target", trained / "base", out["medusa2_base"], "float32"), console=quiet)
    convert_checkpoint(ConvertRequest("medusa", trained / "base", out["medusa2"], "float32",
                                      medusa_heads=trained / "heads", medusa_tree_nodes=tree_nodes), console=quiet)
    return out


def _counters(stats: Any) -> Counters:
    c = Counters(stats.generated_tokens, stats.target_forwards, stats.draft_forwards)
    c.add_positions(stats.proposed_by_position, stats.accepted_by_position)
    return c


def specbuild_methods(ckpts: dict[str, Path], ks: Sequence[int], trees: Sequence[str], new_tokens: int,
                      batch_sizes: Sequence[int], batch_k: int,
                      eagle3_draft: Path | None = None) -> tuple[list[Method], dict[str, Any]]:
    """Rows for specbuild's runtime: plain, draft-target per K, Medusa per tree (batch 1; a few at larger batch),
    EAGLE-3 per K (batch 1) when an EAGLE-3 draft is given."""
    from specbuild.medusa.tree import MedusaTree, load_choices
    from specbuild.runtime.generation import generate
    from specbuild.runtime.medusa_decoding import MedusaConfig, generate_medusa
    from specbuild.runtime.model import CausalLM
    from specbuild.runtime.sampling import SamplingParams
    from specbuild.runtime.sequence import StopCriteria
    from specbuild.runtime.speculative import DraftTargetConfig, generate_draft_target

    target, draft = CausalLM.from_checkpoint(ckpts["target"]), CausalLM.from_checkpoint(ckpts["draft"])
    medusa = CausalLM.from_checkpoint(ckpts["medusa"]) if "medusa" in ckpts else None
    params, stop = SamplingParams(), StopCriteria(max_new_tokens=new_tokens)  # greedy; no end id: exactly N tokens
    info: dict[str, Any] = {
        "target_params": sum(p.numel() for p in target.buffers()),
        "draft_params": sum(p.numel() for p in draft.buffers()),
    }

    def plain(p: Prompts) -> tuple[Prompts, Counters]:
        r = generate(target, p, params, stop)
        return r.output_ids, _counters(r.stats)

    def draft_target(k: int) -> Runner:
        config = DraftTargetConfig(num_draft_tokens=k)

        def run(p: Prompts) -> tuple[Prompts, Counters]:
            r = generate_draft_target(target, draft, p, params, stop, config)
            return r.output_ids, _counters(r.stats)

        return run

    def medusa_tree(name: str) -> Runner:
        config = MedusaConfig(choices=tuple(tuple(c) for c in load_choices(name)))

        def run(p: Prompts) -> tuple[Prompts, Counters]:
            assert medusa is not None
            r = generate_medusa(medusa, p, config, params, stop)
            return r.output_ids, _counters(r.stats)

        return run

    def eagle3(k: int, choices: tuple[tuple[int, ...], ...] | None = None) -> Runner:
        from specbuild.runtime.eagle3 import Eagle3Draft
        from specbuild.runtime.eagle3_decoding import Eagle3Config, generate_eagle3

        assert eagle3_draft is not None
        drafter, config = Eagle3Draft.from_directory(eagle3_draft, target), Eagle3Config(k, choices)

        def run(p: Prompts) -> tuple[Prompts, Counters]:
            r = generate_eagle3(target, drafter, p, config, params, stop)
            return r.output_ids, _counters(r.stats)

        return run

    def lookahead(config: tuple[int, int, int]) -> Runner:
        from specbuild.runtime.lookahead_decoding import LookaheadConfig, generate_lookahead

        def run(p: Prompts) -> tuple[Prompts, Counters]:
            r = generate_lookahead(target, p, LookaheadConfig(*config), params, stop)
            return r.output_ids, _counters(r.stats)

        return run

    methods: list[Method] = []
    for batch in batch_sizes:
        suffix = "" if batch == 1 else f"_b{batch}"
        methods.append(Method(f"specbuild_plain{suffix}", "specbuild", "plain", "", batch, plain))
        for k in ks if batch == 1 else [batch_k]:
            methods.append(Method(f"specbuild_dt_k{k}{suffix}", "specbuild", "draft-target", f"K={k}", batch,
                                  draft_target(k), k=k))
        if medusa is not None:
            for name in trees:
                methods.append(Method(f"specbuild_medusa_{name}{suffix}", "specbuild", "medusa", name, batch,
                                      medusa_tree(name)))
    if "medusa2" in ckpts:  # batch 1: the new base plainly (the reference of its rows), then per tree
        base2 = CausalLM.from_checkpoint(ckpts["medusa2_base"])
        medusa2 = CausalLM.from_checkpoint(ckpts["medusa2"])

        def plain2(p: Prompts) -> tuple[Prompts, Counters]:
            r = generate(base2, p, params, stop)
            return r.output_ids, _counters(r.stats)

        def medusa2_tree(name: str) -> Runner:
            config = MedusaConfig(choices=tuple(tuple(c) for c in load_choices(name)))

            def run(p: Prompts) -> tuple[Prompts, Counters]:
                r = generate_medusa(medusa2, p, config, params, stop)
                return r.output_ids, _counters(r.stats)

            return run

        reference = Method("specbuild_plain_medusa2_base", "specbuild", "plain (medusa-2 base)", "", 1, plain2)
        reference.greedy_of = reference
        methods.append(reference)
        for name in trees:
            methods.append(Method(f"specbuild_medusa2_{name}", "specbuild", "medusa-2", name, 1, medusa2_tree(name),
                                  greedy_of=reference))
    for k in ks if eagle3_draft is not None else []:  # batch 1 only; the setting says the tokens each verify reads
        methods.append(Method(f"specbuild_eagle3_k{k}", "specbuild", "eagle3", f"K={k} ({k + 1} verified)", 1,
                              eagle3(k), k=k))
    for name, choices in eagle3_trees(trees, ks) if eagle3_draft is not None else []:  # greedy trees, batch 1
        tree = MedusaTree.from_choices(choices)
        methods.append(Method(f"specbuild_eagle3_{name}", "specbuild", "eagle3",
                              f"tree {name} ({tree.num_nodes + 1} verified)", 1, eagle3(tree.max_depth, choices)))
    if "self_draft_adapter" in ckpts:  # batch 1: the target's first L layers, bare and with the demo adapter
        from specbuild.runtime.self_draft import generate_self_draft, self_draft_model, shared_memory

        layers = json.loads((ckpts["self_draft_adapter"] / "config.json").read_text())["num_hidden_layers"] - 1

        def self_draft(k: int, adapter: Path | None) -> Runner:
            def run(p: Prompts) -> tuple[Prompts, Counters]:
                r = generate_self_draft(target, layers, p, DraftTargetConfig(num_draft_tokens=k), params, stop,
                                        adapter=adapter)
                return r.output_ids, _counters(r.stats)

            return run

        for adapter, method, tag in ((None, "self-draft", "selfdraft"),
                                     (ckpts["self_draft_adapter"], "self-draft+adapter", "selfdraft_adapter")):
            for k in ks:
                methods.append(Method(f"specbuild_{tag}_l{layers}_k{k}", "specbuild", method, f"L={layers} K={k}", 1,
                                      self_draft(k, adapter), k=k))
        info["self_draft"] = {"layers": layers, "memory_bare": shared_memory(target, self_draft_model(target, layers)),
                              "memory_adapter": shared_memory(target, self_draft_model(target, layers,
                                                                                       ckpts["self_draft_adapter"]))}
    for config in LOOKAHEAD_SETTINGS:  # batch 1 only
        methods.append(Method(f"specbuild_lookahead_w{config[0]}n{config[1]}g{config[2]}", "specbuild", "lookahead",
                              "W,N,G={},{},{}".format(*config), 1, lookahead(config)))
    methods += training_free_methods(target, new_tokens, batch_sizes)
    info["memory"] = method_memory(target, draft, medusa, eagle3_draft)
    if medusa is not None:
        info["medusa_heads"] = medusa.config.num_medusa_heads
        info["medusa_trees"] = {
            name: {"nodes": (t := MedusaTree.from_choices(load_choices(name))).num_nodes, "depth": t.max_depth}
            for name in trees
        }
    return methods, info


def serve(target: Any, proposer: Callable[[], Any], new_tokens: int) -> Runner:
    """One prompt batch through a fresh ServingEngine with the proposer (a fresh one: NGram's public pool and SA's
    automata start empty each call, so every round counts the same), the prompts submitted together."""
    from specbuild.runtime.serving import EngineRequest, ServingEngine

    def run(p: Prompts) -> tuple[Prompts, Counters]:
        drafting = proposer()
        engine = ServingEngine(target, max_batch=len(p), max_seq_len=max(map(len, p)) + new_tokens + 1,
                               proposer=drafting)
        handles = [engine.submit(EngineRequest(list(prompt), new_tokens)) for prompt in p]
        engine.run_until_idle()
        out = [h.wait(0).tokens for h in handles]
        stats = engine.stats
        c = Counters(sum(map(len, out)), stats.forwards, stats.draft_forwards)
        c.add_positions(stats.acceptance.proposed_by_position, stats.acceptance.accepted_by_position)
        return out, c

    return run


def training_free_methods(target: Any, new_tokens: int, batch_sizes: Sequence[int]) -> list[Method]:
    """NGram (NGramDecodingConfig's settings, the other fields at their defaults) and SA rows, the engine's
    proposers; batch 1 per setting, and the first setting of each at the larger batch."""
    from specbuild.runtime.proposers import NGramConfig, NGramProposer, SAConfig, SAProposer

    methods = []
    for batch in batch_sizes:
        suffix = "" if batch == 1 else f"_b{batch}"
        for k, n in NGRAM_SETTINGS if batch == 1 else NGRAM_SETTINGS[:1]:
            methods.append(Method(f"specbuild_ngram_k{k}n{n}{suffix}", "specbuild", "ngram", f"K={k} ngram<={n}",
                                  batch, serve(target, lambda k=k, n=n: NGramProposer(NGramConfig(k, n)), new_tokens),
                                  k=k))
        for k, n in SA_SETTINGS if batch == 1 else SA_SETTINGS[:1]:
            setting = f"K={k} " + ("longest" if n == -1 else f"ngram<={n}")
            methods.append(Method(f"specbuild_sa_k{k}{'' if n == -1 else f'n{n}'}{suffix}", "specbuild", "sa",
                                  setting, batch,
                                  serve(target, lambda k=k, n=n, b=batch: SAProposer(SAConfig(k, n), b), new_tokens),
                                  k=k))
    return methods


# -- transformers -------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def record_assisted_acceptance(counters: Counters) -> Iterator[None]:
    """Count transformers' accepted candidates per position: every assisted round ends in
    `update_candidate_strategy(input_ids, scores, num_matches)`, scores holding candidates + 1 positions."""
    from transformers.generation.candidate_generator import AssistedCandidateGenerator

    original = AssistedCandidateGenerator.update_candidate_strategy

    def update(self: Any, input_ids: torch.Tensor, scores: torch.Tensor, num_matches: int) -> None:
        proposed, accepted = scores.shape[1] - 1, int(num_matches)
        counters.add_positions([1] * proposed, [int(i < accepted) for i in range(proposed)])
        original(self, input_ids, scores, num_matches)

    AssistedCandidateGenerator.update_candidate_strategy = update  # type: ignore[method-assign]
    try:
        yield
    finally:
        AssistedCandidateGenerator.update_candidate_strategy = original  # type: ignore[method-assign]


def transformers_methods(dirs: dict[str, Path], ks: Sequence[int], new_tokens: int) -> tuple[list[Method], dict]:
    """Rows for transformers' `generate`: plain greedy and assisted generation with the draft, batch 1.

    transformers 5.14 reads the assistant's settings from the *assistant's* generation_config (generate's own
    `num_assistant_tokens` keyword is not passed on), so they are set there: K tokens per round, constant
    schedule, confidence threshold 0 (no ConfidenceCriteria, so no round stops before K). `min_new_tokens`
    suppresses EOS, so every prompt gets exactly `new_tokens` tokens, as in specbuild's rows (no end id).
    """
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(dirs["target"], dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(dirs["draft"], dtype=torch.float32).eval()
    calls = {"target": 0, "draft": 0}

    def counting(name: str) -> Callable[..., None]:
        def hook(module: Any, args: Any) -> None:
            calls[name] += 1

        return hook

    target.register_forward_pre_hook(counting("target"))
    draft.register_forward_pre_hook(counting("draft"))

    def runner(k: int | None) -> Runner:
        def run(p: Prompts) -> tuple[Prompts, Counters]:
            assert len(p) == 1, "transformers' assisted generation supports batch size 1 only"
            counters = Counters()
            calls.update(target=0, draft=0)
            ids = torch.tensor(p, dtype=torch.long)
            kwargs: dict[str, Any] = {}
            if k is not None:
                draft.generation_config.num_assistant_tokens = k
                draft.generation_config.num_assistant_tokens_schedule = "constant"
                draft.generation_config.assistant_confidence_threshold = 0.0
                kwargs["assistant_model"] = draft
            with record_assisted_acceptance(counters) if k is not None else contextlib.nullcontext():
                out = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                                      min_new_tokens=new_tokens, do_sample=False, **kwargs)
            outputs = [row[len(prompt):] for row, prompt in zip(out.tolist(), p, strict=True)]
            counters.generated_tokens = sum(len(o) for o in outputs)
            counters.target_forwards, counters.draft_forwards = calls["target"], calls["draft"]
            return outputs, counters

        return run

    methods = [Method("transformers_plain", "transformers", "plain", "", 1, runner(None))]
    for k in ks:
        methods.append(Method(f"transformers_assisted_k{k}", "transformers", "assisted", f"K={k}", 1, runner(k),
                              k=k))
    settings = {
        "assistant_generation_config": {"num_assistant_tokens": "K", "num_assistant_tokens_schedule": "constant",
                                        "assistant_confidence_threshold": 0.0},
        "generate_kwargs": {"do_sample": False, "max_new_tokens": new_tokens, "min_new_tokens": new_tokens},
    }
    return methods, settings


# -- report ---------------------------------------------------------------------------------------------------------
def _relative(path: Path) -> str:
    path = path.absolute()
    return str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)


def row(method: Method, plain: dict[tuple[str, int], Method], greedy: Prompts) -> dict[str, Any]:
    """A table row: figures normalised per sequence (batch rows divide forwards by the batch size)."""
    c = method.counters
    assert c is not None
    base = plain[(method.runtime, method.batch)]
    reference = greedy if method.runtime == "specbuild" else plain[("transformers", 1)].outputs
    if method.greedy_of is not None:  # a method serving another base (Medusa-2) answers that base's greedy output
        reference = method.greedy_of.outputs
    return {
        "key": method.key,
        "runtime": method.runtime,
        "method": method.method,
        "setting": method.setting,
        "batch": method.batch,
        "tokens_per_s": round(method.tokens_per_s, 1),
        "speedup_vs_plain": round(method.tokens_per_s / base.tokens_per_s, 3),
        "tokens_per_target_forward": round(c.generated_tokens / (method.batch * c.target_forwards), 3),
        "accepted_per_round": round(sum(c.accepted_by_position) / c.rounds, 3) if c.rounds else None,
        "acceptance_by_position": [round(a / p, 4) if p else None
                                   for a, p in zip(c.accepted_by_position, c.proposed_by_position, strict=True)],
        "output_equals_greedy": method.outputs == reference,
        "generated_tokens": c.generated_tokens,
        "target_forwards": c.target_forwards,
        "draft_forwards": c.draft_forwards,
        "rounds": c.rounds,
        "proposed_by_position": c.proposed_by_position,
        "accepted_by_position": c.accepted_by_position,
        "wall_s": round(method.wall_s, 4),
        "passes_s": [round(s, 4) for s in method.passes_s],
        "calls_s": [[round(s, 5) for s in calls] for calls in method.calls_s],
    }


def check_targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's targets, judged on batch-1 rows: tokens per forward for every setting of a method (the lowest
    is judged), speed for each method's fastest setting."""
    ours = [r for r in rows if r["runtime"] == "specbuild" and r["batch"] == 1]
    targets: list[dict[str, Any]] = []
    best: dict[str, dict[str, Any]] = {}
    for method in ("draft-target", "medusa"):
        candidates = [r for r in ours if r["method"] == method]
        if not candidates:
            targets.append({"target": f"{method}: mean tokens per target forward >= {TOKENS_PER_FORWARD_MIN}",
                            "value": None, "unit": "", "pass": False, "note": "not measured"})
            continue
        best[method] = max(candidates, key=lambda r: r["tokens_per_s"])
        targets.append(lowest_tokens_target(candidates, method, TOKENS_PER_FORWARD_MIN))
    for method, name, minimum in (("lookahead", "lookahead", LOOKAHEAD_TOKENS_MIN),
                                  ("self-draft+adapter", "self-draft with adapter", SELF_DRAFT_TOKENS_MIN),
                                  ("ngram", "ngram", TRAINING_FREE_TOKENS_MIN),
                                  ("sa", "SA (suffix automaton)", TRAINING_FREE_TOKENS_MIN)):
        candidates = [r for r in ours if r["method"] == method]
        if candidates:
            targets.append(lowest_tokens_target(candidates, name, minimum))
    medusa1 = {r["setting"]: r for r in ours if r["method"] == "medusa"}
    for r in ours:  # Medusa-2 heads on their fine-tuned base against Medusa-1's on the original, tree by tree
        if r["method"] == "medusa-2" and r["setting"] in medusa1:
            m1 = medusa1[r["setting"]]["tokens_per_target_forward"]
            targets.append({
                "target": f"medusa-2 {r['setting']}: tokens per target forward >= medusa-1's ({m1:.2f})",
                "value": r["tokens_per_target_forward"], "unit": "tokens",
                "pass": r["tokens_per_target_forward"] >= m1,
            })
    if best:
        winner = max(best.values(), key=lambda r: r["speedup_vs_plain"])
        targets.append({
            "target": f"better speculative method ({winner['method']} {winner['setting']}) tokens/s / plain "
            f">= {SPEEDUP_MIN}",
            "value": winner["speedup_vs_plain"], "unit": "x", "pass": winner["speedup_vs_plain"] >= SPEEDUP_MIN,
        })
    targets.append(eagle3_target(ours))
    hf = {r["setting"]: r for r in rows if r["runtime"] == "transformers" and r["method"] == "assisted"}
    for r in ours:
        if r["method"] == "draft-target" and r["setting"] in hf:
            ratio = r["tokens_per_s"] / hf[r["setting"]]["tokens_per_s"]
            targets.append({
                "target": f"specbuild draft-target {r['setting']} tokens/s / transformers assisted {r['setting']} "
                f">= {HF_RATIO_MIN}",
                "value": round(ratio, 2), "unit": "x", "pass": ratio >= HF_RATIO_MIN,
            })
    return targets


def lowest_tokens_target(candidates: list[dict[str, Any]], name: str, minimum: float) -> dict[str, Any]:
    """A method's tokens-per-target-forward target, judged at its lowest setting (every setting must reach it)."""
    low = min(candidates, key=lambda r: r["tokens_per_target_forward"])
    high = max(candidates, key=lambda r: r["tokens_per_target_forward"])
    return {"target": f"{name}: mean tokens per target forward >= {minimum} at every setting (lowest: "
                      f"{low['setting']}; highest: {high['tokens_per_target_forward']:.2f} at {high['setting']})",
            "value": low["tokens_per_target_forward"], "unit": "tokens",
            "pass": low["tokens_per_target_forward"] >= minimum}


def eagle3_target(ours: list[dict[str, Any]]) -> dict[str, Any]:
    """Issue 15's target: EAGLE-3's best tokens per target forward at least the best of draft-target and Medusa
    in the same run (batch 1)."""
    eagle = [r for r in ours if r["method"] == "eagle3"]
    others = [r for r in ours if r["method"] in ("draft-target", "medusa")]
    name = "EAGLE-3: best tokens per target forward >= the best of draft-target and Medusa"
    if not eagle or not others:
        return {"target": name, "value": None, "unit": "", "pass": False,
                "note": "not measured" + ("" if eagle else f" (no EAGLE-3 draft: demo extra {EAGLE3_EXTRA!r})")}
    best, rival = (max(rs, key=lambda r: r["tokens_per_target_forward"]) for rs in (eagle, others))
    rival_setting = rival["setting"]
    if rival["method"] == "draft-target" and rival["setting"].startswith("K="):  # K drafts + the pending token
        rival_setting += f" ({int(rival['setting'][2:]) + 1} verified)"
    return {"target": f"{name} ({rival['method']} {rival_setting}: {rival['tokens_per_target_forward']:.2f}, "
                      f"{rival['tokens_per_s']} tok/s; EAGLE-3 {best['tokens_per_s']} tok/s)",
            "value": best["tokens_per_target_forward"], "unit": f"tokens at {best['setting']}",
            "pass": best["tokens_per_target_forward"] >= rival["tokens_per_target_forward"]}


def eagle3_trees(trees: Sequence[str], ks: Sequence[int]) -> list[tuple[str, tuple[tuple[int, ...], ...]]]:
    """EAGLE-3 tree rows: every Medusa preset the run measures (the same trees, now expanded by the draft node by
    node), and one tree verifying as many tokens as the largest draft-target K does (K + 1): the top-1 chain K - 2
    deep with the second guesses at depths 1 and 2 (`budget_K`)."""
    from specbuild.medusa.tree import load_choices

    out = [(name, tuple(tuple(c) for c in load_choices(name))) for name in trees]
    k = max(ks, default=0)
    if k >= 3:
        chain = tuple((0,) * d for d in range(1, k - 1))
        out.append((f"budget_{k}", tuple(sorted({*chain, (1,), (0, 1)}, key=lambda c: (len(c), c)))))
    return out


def find_eagle3_draft(models: Path) -> Path | None:
    """The demo EAGLE-3 draft (demo extra `EAGLE3_EXTRA`, trained on first use), or None with a message when no
    module registers one."""
    from specbuild.demo.extras import build_extra
    from specbuild.errors import SpecbuildError

    try:
        return build_extra(models, EAGLE3_EXTRA)
    except SpecbuildError as err:
        print(f"warning: no EAGLE-3 draft ({err.message}): EAGLE-3 rows skipped", flush=True)
        return None


def _verdict(flag: bool | None) -> str:
    return "info" if flag is None else ("PASS" if flag else "**FAIL**")


def _own_params(target: Any, module: Any) -> int:
    """Parameters of `module` that are not the target's own tensors (shared ones cost nothing more)."""
    shared = {t.data_ptr() for t in target.buffers()}
    return sum(t.numel() for t in module.buffers() if t.data_ptr() not in shared)


def _kv_bytes(layers: int, kv_heads: int, head_dim: int, itemsize: int) -> int:
    return 2 * layers * kv_heads * head_dim * itemsize  # K and V, per token of one sequence


def method_memory(target: Any, draft: Any, medusa: Any, eagle3_draft: Path | None) -> dict[str, dict[str, Any]]:
    """What each method keeps in memory beyond plain decoding with the target: parameters, and K/V bytes per
    token of one sequence (the self-draft's own table adds the shared/copied split)."""
    c = target.config
    out: dict[str, dict[str, Any]] = {
        "draft-target": {"params": _own_params(target, draft), "kv": _kv_bytes(
            draft.config.num_layers, draft.config.num_kv_heads, draft.config.head_dim, draft.dtype.itemsize),
            "note": "a second model with its own cache"},
        "lookahead": {"params": 0, "kv": 0, "note": "no draft: the window and the n-gram pool are per-step "
                      "inputs and a few token lists; only accepted tokens' K/V are kept"},
    }
    if medusa is not None:
        heads = sum(t.numel() for t in medusa.medusa_heads.buffers())  # medusa is a copy of the target + heads
        out["medusa"] = {"params": heads, "kv": 0, "note": "heads on the final hidden state; no cache of their own"}
        out["medusa-2"] = {"params": heads, "kv": 0, "note": "as Medusa-1: the fine-tuned base replaces the target"}
    if eagle3_draft is not None:
        from specbuild.runtime.eagle3 import Eagle3Draft

        eagle = Eagle3Draft.from_directory(eagle3_draft, target)
        dc = eagle.model_config
        out["eagle3"] = {"params": _own_params(target, eagle), "kv": _kv_bytes(1, dc.num_kv_heads, dc.head_dim,
                                                                               eagle.dtype.itemsize),
                         "note": "one decoder layer + fc + LM head; shares the target's embedding"}
    out["plain"] = {"params": 0, "kv": 0, "note": f"the target: {sum(t.numel() for t in target.buffers()):,} "
                    f"params, {_kv_bytes(c.num_layers, c.num_kv_heads, c.head_dim, target.dtype.itemsize):,} B/token"}
    return out


def _memory_table(models: dict[str, Any]) -> list[str]:
    memory = models.get("memory")
    if not memory:
        return []
    lines = ["Memory beyond plain decoding (float32; KV bytes per token of one sequence; self-draft below):", "",
             "| method | extra params | extra KV B/token | why |", "|---|---:|---:|---|"]
    for name, m in memory.items():
        lines.append(f"| {name} | {m['params']:,} | {m['kv']:,} | {m['note']} |")
    return [*lines, ""]


def _fmt(value: float | None, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def _self_draft_memory(models: dict[str, Any]) -> list[str]:
    """What the self-draft rows cost in memory beyond plain decoding: shared (these rows) and as a copy (the
    TensorRT path's second engine)."""
    if "self_draft" not in models:
        return []
    sd = models["self_draft"]
    lines = [f"Self-draft memory beyond plain decoding (L={sd['layers']}, float32; KV bytes per token of one "
             "sequence):", "", "| draft | extra params, shared | extra KV B/token, shared | extra params, copied "
             "(two engines) | extra KV B/token, copied |", "|---|---:|---:|---:|---:|"]
    for name, key in (("bare", "memory_bare"), ("with adapter", "memory_adapter")):
        m = sd[key]
        lines.append(f"| {name} | {m['shared_extra_params']:,} | {m['shared_extra_kv_bytes_per_token']:,} "
                     f"| {m['copied_extra_params']:,} | {m['copied_extra_kv_bytes_per_token']:,} |")
    return [*lines, ""]


def render_markdown(report: dict[str, Any]) -> str:
    m, cfg = report["machine"], report["config"]
    mi = report["models"]
    medusa = (f"Medusa: the target plus {mi['medusa_heads']} demo heads ({cfg['medusa_heads']})."
              if "medusa_heads" in mi else "Medusa: not run (no heads found).")
    lines = [
        "# Speculative decoding benchmark",
        "",
        f"Demo target ({mi['target_params'] / 1e6:.1f} M params) and distilled draft ({mi['draft_params'] / 1e6:.1f} "
        f"M params), float32. {medusa} {cfg['prompts']} held-out prompts of {cfg['prompt_tokens']} tokens, "
        f"{cfg['max_new_tokens']} new tokens each (no end id / EOS suppressed), greedy. Machine: {m['nproc']} CPUs, "
        f"torch threads {m['torch_threads']}, "
        f"Python {m['python']}, torch {m['torch']}, transformers {m['transformers']}; {m['date']}, commit "
        f"{m['git_commit']}.",
        "",
        f"Every method warmed up with one call, then timed over all prompts in {cfg['rounds']} rounds, the methods "
        "interleaved call by call; tokens/s = generated tokens / wall time, where wall time is, per generate call, "
        "the fastest of the rounds, summed over the calls. Speedup is against plain decoding "
        "of the same runtime and batch size. Tokens per target forward and accepted per round are per sequence "
        "(the prefill forward counts; transformers' assisted generation has none of its own).",
        "",
        f"Load average (1/5/15 min) at start {m['loadavg_start']}, at end {m['loadavg_end']}: other work on the "
        "machine lowers tokens/s; compare rows of one run only.",
        "",
        "| runtime | method | K / tree | batch | tokens/s | speedup vs plain | tokens / target forward "
        "| accepted / round | output == greedy |",
        "|---|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in report["rows"]:
        lines.append(
            f"| {r['runtime']} | {r['method']} | {r['setting'] or '—'} | {r['batch']} | {r['tokens_per_s']:.0f} "
            f"| {r['speedup_vs_plain']:.2f}x | {r['tokens_per_target_forward']:.2f} "
            f"| {_fmt(r['accepted_per_round'], '.2f')} | {'yes' if r['output_equals_greedy'] else '**no**'} |"
        )
    if report["failed"]:
        lines.append("")
    for f in report["failed"]:
        lines.append(f"**Failed**: {f['runtime']} {f['method']} {f['setting']} batch {f['batch']}: `{f['error']}`")
    lines += ["", "| target | measured | verdict |", "|---|---:|---|"]
    for t in report["targets"]:
        value = "not measured" if t["value"] is None else f"{t['value']} {t['unit']}"
        lines.append(f"| {t['target']} | {value} | {_verdict(t['pass'])} |")
    c = report["correctness"]
    lines += [
        "",
        "Output == greedy: specbuild rows against specbuild's plain greedy at batch 1 (medusa-2 rows against "
        "their fine-tuned base's plain greedy: that is the model they serve), transformers rows against "
        f"transformers' plain greedy. transformers' plain greedy equals specbuild's: "
        f"**{str(c['transformers_plain_equals_specbuild_plain']).lower()}**.",
        "",
        "Acceptance by draft position (fraction of rounds whose accepted prefix reaches the position): "
        "`acceptance.png`.",
        "",
        *_memory_table(mi),
        *_self_draft_memory(mi),
        f"Whole benchmark: {report['bench_runtime_s']:.0f} s.",
        "",
    ]
    return "\n".join(lines)


def plot_acceptance(rows: list[dict[str, Any]], path: Path) -> None:
    """Acceptance rate by draft position: reached (cumulative) and conditional on the previous position."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), constrained_layout=True)
    chosen = [r for r in rows if r["batch"] == 1 and r["method"] in ("draft-target", "medusa")]
    chosen += [r for r in rows if r["method"] == "assisted" and r["setting"] == "K=4"]
    for r in chosen:
        rates = [x for x in r["acceptance_by_position"] if x is not None]
        positions = range(1, len(rates) + 1)
        conditional = [rates[0]] + [b / a if a else 0.0 for a, b in itertools.pairwise(rates)]
        label = f"{r['method']} {r['setting']}"
        if r["runtime"] == "transformers":
            label = f"transformers {label}"
        style: dict[str, Any] = {"linestyle": "--", "marker": "x", "color": "black"}
        if r["runtime"] == "specbuild":
            style = {"linestyle": "-", "marker": "o" if r["method"] == "draft-target" else "s"}
        axes[0].plot(positions, rates, label=label, **style)
        axes[1].plot(positions, conditional, label=label, **style)
    axes[0].set_title("P(accepted prefix reaches position i)")
    axes[1].set_title("P(position i accepted | position i-1 accepted)")
    for ax in axes:
        ax.set_xlabel("draft position i (Medusa: tree depth)")
        ax.set_ylabel("acceptance rate")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7, loc="lower left")
    fig.suptitle("Greedy acceptance by draft position, demo target/draft pair (batch 1)", fontsize=10)
    fig.savefig(path, dpi=120)
    plt.close(fig)


# -- main -----------------------------------------------------------------------------------------------------------
def load_prompts(tokenizer_dir: Path, count: int, length: int) -> Prompts:
    """The first `length` tokens of the first `count` held-out texts that are long enough."""
    from specbuild.demo.models import heldout_texts
    from specbuild.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(tokenizer_dir)
    prompts = []
    for text in heldout_texts():
        ids = tokenizer(text[: 16 * length])["input_ids"][:length]
        if len(ids) == length:
            prompts.append(ids)
        if len(prompts) == count:
            break
    if len(prompts) < count:
        raise SystemExit(f"error: only {len(prompts)} held-out texts have {length} tokens")
    return prompts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=8, help="held-out prompts (batch rows need a multiple of 4)")
    parser.add_argument("--prompt-tokens", type=int, default=24, help="tokens per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="tokens generated per prompt")
    parser.add_argument("--ks", default="2,3,4,5,6", help="draft lengths K for draft-target and assisted generation")
    parser.add_argument("--trees", default="mc_sim_7b_top24,mc_sim_7b_63", help="Medusa tree presets")
    parser.add_argument("--batch", type=int, default=4, help="extra rows at this batch size (0: none)")
    parser.add_argument("--batch-k", type=int, default=4, help="K of the draft-target batch row")
    parser.add_argument("--rounds", type=int, default=5,
                        help="timed passes over all prompts; per call the fastest round is kept")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    parser.add_argument("--no-transformers", action="store_true", help="skip transformers' rows")
    parser.add_argument("--medusa-heads", type=Path, default=None,
                        help="Medusa heads directory (default: the demo build's medusa-heads)")
    parser.add_argument("--models", type=Path, default=ROOT / "demo" / "models", help="demo models directory")
    parser.add_argument("--work", type=Path, default=BENCH / "work" / "speculative", help="converted checkpoints")
    parser.add_argument("--results", type=Path, default=BENCH / "results", help="where the figures go")
    args = parser.parse_args(argv)

    bench_start = time.perf_counter()
    load_start = [round(x, 2) for x in os.getloadavg()]
    torch.set_num_threads(args.threads)
    import transformers

    transformers.logging.set_verbosity_error()
    from specbuild.demo.models import build_demo_models
    from specbuild.medusa.tree import MedusaTree, load_choices

    ks = [int(k) for k in args.ks.split(",") if k]
    trees = [t for t in args.trees.split(",") if t]
    dirs = build_demo_models(args.models, progress=False)
    heads = args.medusa_heads or dirs.get("medusa-heads") or args.models / "medusa-heads"
    if not (heads / "medusa_lm_head.safetensors").is_file() and not (heads / "medusa_lm_head.pt").is_file():
        print(f"warning: no Medusa heads in {heads}: Medusa rows skipped", flush=True)
        heads = None
    tree_nodes = max((MedusaTree.from_choices(load_choices(t)).num_nodes for t in trees), default=63)
    ckpts = convert_models(dirs, heads, tree_nodes, args.work)
    ckpts.update(convert_self_draft(args.models, args.work))
    if heads is not None:
        ckpts.update(convert_medusa2(args.models, tree_nodes, args.work))
    prompts = load_prompts(dirs["target"], args.prompts, args.prompt_tokens)
    batch_sizes = [1] + ([args.batch] if args.batch > 1 else [])
    eagle3_draft = find_eagle3_draft(args.models)
    methods, model_info = specbuild_methods(ckpts, ks, trees, args.max_new_tokens, batch_sizes, args.batch_k,
                                            eagle3_draft)
    hf_settings: dict[str, Any] = {}
    if not args.no_transformers:
        hf_methods, hf_settings = transformers_methods(dirs, ks, args.max_new_tokens)
        methods += hf_methods
    print(f"{len(methods)} methods, {len(prompts)} prompts x {args.max_new_tokens} tokens, "
          f"{args.rounds} rounds, torch threads {args.threads}", flush=True)

    # Round 0 warms every method up with one call; each timed round then interleaves the methods call by call
    # (prompt batch by prompt batch), so that a burst of other work on the machine hits them all alike.
    for round_no in range(args.rounds + 1):
        for m in methods if round_no else []:
            m.start_round()
        for start in range(len(prompts) if round_no else 1):
            for m in methods:
                if m.error is not None or start % m.batch:
                    continue
                try:
                    m.call(prompts[start : start + m.batch], record=round_no > 0)
                except Exception as err:  # a runtime bug must not cost the other rows; it is reported as a failure
                    if m.method == "plain":
                        raise
                    m.error = f"{type(err).__name__}: {err}"
                    print(f"error: {m.key}: {m.error}", flush=True)
        if round_no:
            print(f"round {round_no} tokens/s: " + ", ".join(
                f"{m.key} {m.counters.generated_tokens / m.passes_s[-1]:.0f}" for m in methods if m.error is None),
                flush=True)

    plain = {(m.runtime, m.batch): m for m in methods if m.method == "plain"}
    greedy = plain[("specbuild", 1)].outputs
    rows = [row(m, plain, greedy) for m in methods if m.error is None]
    failed = [{"key": m.key, "runtime": m.runtime, "method": m.method, "setting": m.setting, "batch": m.batch,
               "error": m.error} for m in methods if m.error is not None]
    targets = check_targets(rows)
    hf_plain = plain.get(("transformers", 1))
    correctness = {
        "all_specbuild_equal_greedy": all(r["output_equals_greedy"] for r in rows if r["runtime"] == "specbuild"),
        "all_transformers_equal_their_greedy": all(r["output_equals_greedy"] for r in rows
                                                   if r["runtime"] == "transformers"),
        "transformers_plain_equals_specbuild_plain": None if hf_plain is None else hf_plain.outputs == greedy,
    }
    machine = machine_info(("transformers", "specbuild"), torch_threads=args.threads, loadavg_start=load_start)
    report = {
        "config": {"prompts": len(prompts), "prompt_tokens": args.prompt_tokens,
                   "max_new_tokens": args.max_new_tokens, "ks": ks, "trees": trees, "rounds": args.rounds,
                   "batch_sizes": batch_sizes, "batch_k": args.batch_k, "sampling": "greedy",
                   "medusa_heads": None if heads is None else _relative(heads)},
        "models": model_info,
        "machine": machine,
        "method": {
            "tokens_per_s": "generated tokens / wall time; wall time = per generate call (one prompt, or one batch) "
            "the fastest of the rounds by perf_counter, summed over the calls; methods interleaved call by call; "
            "every method warmed up with one call first; torch.inference_mode",
            "speedup_vs_plain": "tokens/s / tokens/s of plain decoding of the same runtime and batch size",
            "tokens_per_target_forward": "generated tokens / target forwards, per sequence (batch rows: forwards "
            "are shared by the batch); specbuild counts its prefill forward",
            "accepted_per_round": "accepted draft tokens (or Medusa tree depth) per sequence-round",
            "acceptance_by_position": "fraction of rounds whose accepted prefix reaches position i",
            "transformers": hf_settings,
        },
        "rows": rows,
        "failed": failed,
        "targets": targets,
        "correctness": correctness,
        "prompts": prompts,
    }
    args.results.mkdir(parents=True, exist_ok=True)
    plot_acceptance(rows, args.results / "acceptance.png")
    report["bench_runtime_s"] = round(time.perf_counter() - bench_start, 1)
    markdown = render_markdown(report)
    write_results(args.results, "speculative", report, markdown)
    print()
    print(markdown)
    for t in targets:
        print(f"{'PASS' if t['pass'] else 'FAIL'}: {t['target']}: "
              + ("not measured" if t["value"] is None else f"{t['value']} {t['unit']}"))
    for f in failed:
        print(f"FAIL: {f['key']} crashed: {f['error']}")
    if not correctness["all_specbuild_equal_greedy"]:
        print("FAIL: a speculative method's output differs from plain greedy decoding")
    return finish("runtime_bench", judged(report))


def judged(report: dict[str, Any]) -> list[Target]:
    """The report's targets, one per crashed method, and the greedy equality of specbuild's speculative rows."""
    targets = [Target(t["target"], t["pass"], "not measured" if t["value"] is None else f"{t['value']} {t['unit']}")
               for t in report["targets"]]
    targets += [Target(f"{f['key']} runs", False, f["error"]) for f in report["failed"]]
    equal = bool(report["correctness"]["all_specbuild_equal_greedy"])
    return [*targets, Target("every speculative output equals plain greedy decoding", equal)]


if __name__ == "__main__":
    sys.exit(main())
