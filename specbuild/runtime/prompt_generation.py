"""Prompts in, text and speculation statistics out: tokenizer + checkpoint(s) through the reference runtime.

What `specbuild generate` runs, kept out of the CLI so the command stays a thin argument parser, and so tests and
benchmarks can call the same code path without a subprocess.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from specbuild.errors import SpecbuildError
from specbuild.runtime.device import check_device
from specbuild.runtime.generation import generate
from specbuild.runtime.model import CausalLM
from specbuild.runtime.sampling import SamplingParams
from specbuild.runtime.sequence import GenerationResult, StopCriteria
from specbuild.tokenizer import load_tokenizer


@dataclass
class GenerateOptions:
    checkpoint: Path
    tokenizer: Path
    prompts: list[str]
    draft: Path | None = None
    num_draft_tokens: int = 4
    adaptive: bool = False
    medusa: bool = False
    medusa_choices: str = "mc_sim_7b_63"
    eagle3: Path | None = None  # an EAGLE-3 draft directory (specbuild.eagle.format)
    eagle3_choices: str | None = None  # a tree (preset name or JSON file) instead of the K chain; greedy only
    lookahead: tuple[int, int, int] | None = None  # (W, N, G)
    self_draft: int | None = None  # L: the target's first L layers draft, sharing its weights and KV cache
    self_draft_adapter: Path | None = None  # the self-draft checkpoint convert wrote with draft.adapter
    typical: bool = False
    max_tokens: int = 64
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    device: str = "cpu"
    threads: int | None = None  # torch CPU threads; None keeps torch's default


def _tokenizer(directory: Path) -> Any:
    """The checkpoint's tokenizer (local files only); a directory without tokenizer files is said as such, not as a
    transformers error."""
    if not (directory / "tokenizer_config.json").is_file() and not (directory / "tokenizer.json").is_file():
        raise SpecbuildError(f"{directory}: no tokenizer files (tokenizer.json / tokenizer_config.json) here")
    return load_tokenizer(directory)


def _methods(options: GenerateOptions) -> list[str]:
    """The speculative methods the options ask for (at most one may be chosen)."""
    chosen = {"--draft": options.draft is not None, "--medusa": options.medusa, "--eagle3": options.eagle3 is not None,
              "--lookahead": options.lookahead is not None, "--self-draft": options.self_draft is not None}
    return [name for name, on in chosen.items() if on]


def _run(options: GenerateOptions, model: CausalLM, ids: list[list[int]], params: SamplingParams,
         stop: StopCriteria) -> GenerationResult:
    methods = _methods(options)
    if len(methods) > 1:
        raise SpecbuildError(f"choose one speculative method, not {' and '.join(methods)}")
    if options.self_draft_adapter is not None and options.self_draft is None:
        raise SpecbuildError("--adapter is the self-draft's: give --self-draft L too")
    if options.eagle3_choices is not None and options.eagle3 is None:
        raise SpecbuildError("--eagle3-choices is EAGLE-3's tree: give --eagle3 DIR too")
    if options.eagle3 is not None:
        from specbuild.runtime.eagle3 import Eagle3Draft
        from specbuild.runtime.eagle3_decoding import Eagle3Config, generate_eagle3

        choices = None
        if options.eagle3_choices is not None:
            from specbuild.medusa.tree import load_choices

            choices = tuple(tuple(c) for c in load_choices(options.eagle3_choices))
        drafter = Eagle3Draft.from_directory(options.eagle3, model, dtype=model.dtype)
        k = max([options.num_draft_tokens, *(len(c) for c in choices or ())])
        return generate_eagle3(model, drafter, ids, Eagle3Config(k, choices), params, stop)
    if options.lookahead is not None:
        from specbuild.runtime.lookahead_decoding import LookaheadConfig, generate_lookahead

        return generate_lookahead(model, ids, LookaheadConfig(*options.lookahead), params, stop)
    if options.self_draft is not None:
        from specbuild.runtime.self_draft import generate_self_draft
        from specbuild.runtime.speculative import DraftTargetConfig

        config = DraftTargetConfig(num_draft_tokens=options.num_draft_tokens, adaptive=options.adaptive)
        return generate_self_draft(model, options.self_draft, ids, config, params, stop,
                                   adapter=options.self_draft_adapter)
    if options.draft is not None:
        from specbuild.runtime.speculative import DraftTargetConfig, generate_draft_target

        draft = CausalLM.from_checkpoint(options.draft, device=options.device)
        config = DraftTargetConfig(num_draft_tokens=options.num_draft_tokens, adaptive=options.adaptive)
        return generate_draft_target(model, draft, ids, params, stop, config)
    if options.medusa:
        from specbuild.medusa.tree import load_choices
        from specbuild.runtime.medusa_decoding import MedusaConfig, generate_medusa

        choices = tuple(tuple(c) for c in load_choices(options.medusa_choices))
        return generate_medusa(model, ids, MedusaConfig(choices, typical=options.typical), params, stop)
    return generate(model, ids, params, stop)


def run_generate(options: GenerateOptions) -> dict[str, Any]:
    """Generate for every prompt; the report has `results` [{text, output_ids}] and the statistics."""
    check_device(options.device)  # before loading anything: one message, not an assertion from deep in torch
    if options.threads is not None:
        torch.set_num_threads(options.threads)
    tokenizer = _tokenizer(options.tokenizer)
    try:
        params = SamplingParams(options.temperature, options.top_k, options.top_p, options.seed)
        model = CausalLM.from_checkpoint(options.checkpoint, device=options.device)
        ids = [tokenizer.encode(p, add_special_tokens=False) for p in options.prompts]
        stop_words = tuple(tuple(tokenizer.encode(w, add_special_tokens=False)) for w in options.stop)
        stop = StopCriteria(options.max_tokens, tokenizer.eos_token_id, stop_words)
        with torch.inference_mode():
            result = _run(options, model, ids, params, stop)
    except ValueError as err:
        raise SpecbuildError(str(err)) from err
    stats = result.stats
    return {
        "results": [
            {"text": tokenizer.decode(out, skip_special_tokens=True), "output_ids": out} for out in result.output_ids
        ],
        "target_forwards": stats.target_forwards,
        "draft_forwards": stats.draft_forwards,
        "generated_tokens": stats.generated_tokens,
        "tokens_per_target_forward": stats.tokens_per_target_forward,
        "acceptance_by_position": stats.acceptance_by_position,
        "tokens_per_second": stats.tokens_per_second,
    }
