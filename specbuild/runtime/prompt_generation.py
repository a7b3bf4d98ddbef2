"""Prompts in, text and speculation statistics out: tokenizer + checkpoint(s) through the reference runtime.

What `specbuild generate` runs, kept out of the CLI so the command stays a thin argument parser, and so tests and
benchmarks can call the same code path without a subprocess.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from specbuild.errors import SpecbuildError
from specbuild.runtime.device import check_device
from specbuild.runtime.generation import generate
from specbuild.runtime.model import CausalLM
from specbuild.runtime.sampling import SamplingParams
from specbuild.runtime.sequence import GenerationResult, StopCriteria
from specbuild.tokenizer import load_tokenizer

if TYPE_CHECKING:
    from specbuild.runtime.proposers import Proposer


@dataclass
class GenerateOptions:
    checkpoint: Path
    tokenizer: Path
    prompts: list[str]
    draft: Path | None = None
    num_draft_tokens: int | None = None  # K; None: DEFAULT_K
    adaptive: bool = False
    medusa: bool = False
    medusa_choices: str | None = None  # None: DEFAULT_MEDUSA_TREE
    eagle3: Path | None = None  # an EAGLE-3 draft directory (specbuild.eagle.format)
    eagle3_choices: str | None = None  # a tree (preset name or JSON file) instead of the K chain; greedy only
    lookahead: tuple[int, int, int] | None = None  # (W, N, G)
    self_draft: int | None = None  # L: the target's first L layers draft, sharing its weights and KV cache
    self_draft_adapter: Path | None = None  # the self-draft checkpoint convert wrote with draft.adapter
    ngram: bool = False  # prompt lookup (NGramProposer), K drafts
    sa: bool = False  # suffix automaton (SAProposer), K drafts
    max_matching_ngram_size: int | None = None  # --ngram/--sa's; None: each config's default
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
        raise SpecbuildError(f"{directory}: no tokenizer files (tokenizer.json / tokenizer_config.json) here",
                             hint="give --tokenizer a directory that holds them: the Hugging Face model directory "
                                  "the checkpoint came from")
    return load_tokenizer(directory)


DEFAULT_K = 4
DEFAULT_MEDUSA_TREE = "mc_sim_7b_63"
K_METHODS = ("--draft", "--eagle3", "--self-draft", "--ngram", "--sa")
"""The methods that draft K (--num-draft-tokens) tokens a round."""
BELONGS_TO = {"--num-draft-tokens": K_METHODS, "--adaptive-k": ("--draft", "--self-draft"),
              "--medusa-choices": ("--medusa",), "--typical": ("--medusa",), "--eagle3-choices": ("--eagle3",),
              "--adapter": ("--self-draft",), "--max-matching-ngram-size": ("--ngram", "--sa")}
"""Each method's own options: given without one of its methods, an option would change nothing, so it is refused."""


def _methods(options: GenerateOptions) -> list[str]:
    """The speculative methods the options ask for (at most one may be chosen)."""
    chosen = {"--draft": options.draft is not None, "--medusa": options.medusa, "--eagle3": options.eagle3 is not None,
              "--lookahead": options.lookahead is not None, "--self-draft": options.self_draft is not None,
              "--ngram": options.ngram, "--sa": options.sa}
    return [name for name, on in chosen.items() if on]


def check_options(options: GenerateOptions) -> None:
    """One method at most, and no option of a method not chosen (it would be ignored), before anything loads."""
    methods = _methods(options)
    if len(methods) > 1:
        raise SpecbuildError(f"choose one speculative method, not {' and '.join(methods)}",
                             hint=f"keep one of {', '.join(methods)} and leave out the others")
    given = {"--num-draft-tokens": options.num_draft_tokens is not None, "--adaptive-k": options.adaptive,
             "--medusa-choices": options.medusa_choices is not None, "--typical": options.typical,
             "--eagle3-choices": options.eagle3_choices is not None,
             "--adapter": options.self_draft_adapter is not None,
             "--max-matching-ngram-size": options.max_matching_ngram_size is not None}
    for option, owners in BELONGS_TO.items():
        if given[option] and not set(methods) & set(owners):
            chosen = f"with {methods[0]}" if methods else "without a speculative method"
            raise SpecbuildError(f"{option} would change nothing {chosen}: it belongs to {', '.join(owners)}",
                                 hint=f"leave out {option}, or give {' or '.join(owners)}")


def _run(options: GenerateOptions, model: CausalLM, ids: list[list[int]], params: SamplingParams,
         stop: StopCriteria) -> GenerationResult:
    k = options.num_draft_tokens or DEFAULT_K
    if options.ngram or options.sa:
        from specbuild.runtime.generation import generate_proposed

        return generate_proposed(model, ids, _lookup_proposer(options, k, len(ids)), params, stop)
    if options.eagle3 is not None:
        from specbuild.runtime.eagle3 import Eagle3Draft
        from specbuild.runtime.eagle3_decoding import Eagle3Config, generate_eagle3

        choices = None
        if options.eagle3_choices is not None:
            from specbuild.medusa.tree import load_choices

            choices = tuple(tuple(c) for c in load_choices(options.eagle3_choices))
        drafter = Eagle3Draft.from_directory(options.eagle3, model, dtype=model.dtype)
        k = max([k, *(len(c) for c in choices or ())])
        return generate_eagle3(model, drafter, ids, Eagle3Config(k, choices), params, stop)
    if options.lookahead is not None:
        from specbuild.runtime.lookahead_decoding import LookaheadConfig, generate_lookahead

        return generate_lookahead(model, ids, LookaheadConfig(*options.lookahead), params, stop)
    if options.self_draft is not None:
        from specbuild.runtime.self_draft import generate_self_draft
        from specbuild.runtime.speculative import DraftTargetConfig

        config = DraftTargetConfig(num_draft_tokens=k, adaptive=options.adaptive)
        return generate_self_draft(model, options.self_draft, ids, config, params, stop,
                                   adapter=options.self_draft_adapter)
    if options.draft is not None:
        from specbuild.runtime.speculative import DraftTargetConfig, generate_draft_target

        draft = CausalLM.from_checkpoint(options.draft, device=options.device)
        config = DraftTargetConfig(num_draft_tokens=k, adaptive=options.adaptive)
        return generate_draft_target(model, draft, ids, params, stop, config)
    if options.medusa:
        from specbuild.medusa.tree import load_choices
        from specbuild.runtime.medusa_decoding import MedusaConfig, generate_medusa

        choices = tuple(tuple(c) for c in load_choices(options.medusa_choices or DEFAULT_MEDUSA_TREE))
        return generate_medusa(model, ids, MedusaConfig(choices, typical=options.typical), params, stop)
    return generate(model, ids, params, stop)


def _lookup_proposer(options: GenerateOptions, k: int, batch: int) -> Proposer:
    """The serving engine's n-gram or SA proposer at K = --num-draft-tokens: generate drafts as the server does.
    A bad --max-matching-ngram-size is the config's ValueError, in TensorRT-LLM's words."""
    from specbuild.runtime.proposers import NGramConfig, NGramProposer, SAConfig, SAProposer

    n = options.max_matching_ngram_size
    size = {} if n is None else {"max_matching_ngram_size": n}
    try:
        if options.ngram:
            return NGramProposer(NGramConfig(k, **size))
        return SAProposer(SAConfig(k, **size), max_batch=batch)
    except ValueError as err:
        raise SpecbuildError(f"--max-matching-ngram-size {n}: {err}",
                             hint="give a size of at least 1 (--sa also takes -1, the longest match)") from err


def run_generate(options: GenerateOptions) -> dict[str, Any]:
    """Generate for every prompt; the report has `results` [{text, output_ids}] and the statistics."""
    check_options(options)
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
