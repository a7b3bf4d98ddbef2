"""`specbuild generate`: text from a TensorRT-LLM checkpoint with the reference runtime, optionally speculating."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from specbuild.cli.errors import console, handled_errors
from specbuild.cli.options import JsonOutput


def generate(
    checkpoint: Annotated[
        Path, typer.Argument(help="TensorRT-LLM checkpoint directory (the target).", metavar="CHECKPOINT")
    ],
    tokenizer: Annotated[Path, typer.Option("--tokenizer", metavar="DIR", help="Hugging Face tokenizer directory.")],
    prompt: Annotated[list[str], typer.Option("--prompt", metavar="TEXT", help="Prompt text; repeat for a batch.")],
    draft: Annotated[
        Path | None,
        typer.Option("--draft", metavar="CHECKPOINT", help="Draft checkpoint: draft-target speculative decoding."),
    ] = None,
    num_draft_tokens: Annotated[
        int | None, typer.Option("--num-draft-tokens", min=1, metavar="K", help="Tokens per draft round of --draft, "
                                 "--eagle3, --self-draft, --ngram or --sa (default 4).")
    ] = None,
    adaptive: Annotated[
        bool, typer.Option("--adaptive-k", help="Choose K per request from its running acceptance rate.")
    ] = False,
    medusa: Annotated[bool, typer.Option("--medusa", help="Medusa decoding with the checkpoint's heads.")] = False,
    medusa_choices: Annotated[
        str | None, typer.Option("--medusa-choices", metavar="TREE", help="With --medusa: the tree, a preset name or "
                                 "a JSON file (default mc_sim_7b_63).")
    ] = None,
    typical: Annotated[
        bool, typer.Option("--typical", help="Medusa typical acceptance (needs --temperature > 0).")
    ] = False,
    eagle3: Annotated[
        Path | None,
        typer.Option("--eagle3", metavar="DIR", help="EAGLE-3 draft directory (`specbuild eagle train` writes one): "
                     "a K-token chain per round from the target's own features."),
    ] = None,
    eagle3_choices: Annotated[
        str | None,
        typer.Option("--eagle3-choices", metavar="TREE", help="EAGLE-3 drafts this tree instead of a chain (preset "
                     "name or JSON file, Medusa's format; greedy only)."),
    ] = None,
    lookahead: Annotated[
        str | None,
        typer.Option("--lookahead", metavar="W,N,G", help="Lookahead decoding, no draft: window W, n-gram size N, "
                     "verification set G (e.g. 4,3,4; greedy only)."),
    ] = None,
    self_draft: Annotated[
        int | None,
        typer.Option("--self-draft", metavar="L", min=1, help="The target's first L layers draft K tokens, sharing "
                     "its weights and KV cache."),
    ] = None,
    adapter: Annotated[
        Path | None,
        typer.Option("--adapter", metavar="CHECKPOINT", help="With --self-draft: the self-draft checkpoint convert "
                     "wrote with draft.adapter (its adapter layer is used)."),
    ] = None,
    ngram: Annotated[
        bool, typer.Option("--ngram", help="Prompt-lookup (n-gram) drafting of K tokens, no draft model "
                           "(TensorRT-LLM's NGram).")
    ] = False,
    sa: Annotated[
        bool, typer.Option("--sa", help="Suffix-automaton drafting of K tokens, no draft model (TensorRT-LLM's SA).")
    ] = False,
    max_matching_ngram_size: Annotated[
        int | None,
        typer.Option("--max-matching-ngram-size", metavar="N", help="With --ngram or --sa: the longest suffix "
                     "matched (default: --ngram 2, --sa -1, the longest match).")
    ] = None,
    max_tokens: Annotated[int, typer.Option("--max-tokens", min=1, help="New tokens per prompt at most.")] = 64,
    temperature: Annotated[float, typer.Option("--temperature", min=0.0, help="0 = greedy.")] = 0.0,
    top_k: Annotated[int, typer.Option("--top-k", min=0, help="0 = no top-k cut.")] = 0,
    top_p: Annotated[float, typer.Option("--top-p", help="1.0 = no nucleus cut.")] = 1.0,
    seed: Annotated[int | None, typer.Option("--seed", help="Random seed for sampling.")] = None,
    stop: Annotated[list[str] | None, typer.Option("--stop", metavar="TEXT", help="Stop word; repeatable.")] = None,
    device: Annotated[str, typer.Option("--device", help="cpu or cuda.")] = "cpu",
    threads: Annotated[
        int | None,
        typer.Option("--threads", min=1, help="CPU threads for torch (small models decode fastest on 1)."),
    ] = None,
    json_output: JsonOutput = False,
) -> None:
    """Generate text from a TensorRT-LLM checkpoint with the reference runtime.

    Prints the text and the statistics: tokens per target forward, acceptance rate per draft position and
    tokens/s. Greedy speculative output is identical to plain greedy output; only the speed differs.
    """
    from specbuild.runtime.prompt_generation import GenerateOptions, run_generate

    with handled_errors():
        window = _lookahead(lookahead)
    options = GenerateOptions(
        checkpoint=checkpoint, tokenizer=tokenizer, prompts=prompt, draft=draft, num_draft_tokens=num_draft_tokens,
        adaptive=adaptive, medusa=medusa, medusa_choices=medusa_choices, typical=typical, max_tokens=max_tokens,
        temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, stop=stop or [], device=device,
        threads=threads, eagle3=eagle3, eagle3_choices=eagle3_choices, lookahead=window, self_draft=self_draft,
        self_draft_adapter=adapter, ngram=ngram, sa=sa, max_matching_ngram_size=max_matching_ngram_size,
    )
    with handled_errors():
        report = run_generate(options)
    if json_output:
        print(json.dumps(report if len(prompt) > 1 else {**report, **report["results"][0]}, indent=None))
        return
    out = Console()
    for result in report["results"]:
        out.print(result["text"], highlight=False, markup=False)
    console.print(
        f"target forwards {report['target_forwards']}, tokens/forward {report['tokens_per_target_forward']:.2f}, "
        f"acceptance by position {[round(a, 2) for a in report['acceptance_by_position']]}, "
        f"{report['tokens_per_second']:.1f} tokens/s",
        highlight=False, soft_wrap=True,
    )


def _lookahead(text: str | None) -> tuple[int, int, int] | None:
    """`--lookahead W,N,G` as three integers (the runtime checks the values against TensorRT-LLM's rules)."""
    if text is None:
        return None
    from specbuild.errors import SpecbuildError

    parts = text.replace(" ", "").split(",")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise SpecbuildError(f"--lookahead {text!r}: give three integers W,N,G, e.g. 4,3,4")
    w, n, g = (int(p) for p in parts)
    return w, n, g

