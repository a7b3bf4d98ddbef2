"""What `specbuild migrate` costs or gains, measured before any GPU: the reference runtime's tokens per target
forward for the engine spec's method and the migrated spec's, greedy, on calibration text.

Everything runs through the one serving engine (specbuild.runtime.serving.ServingEngine) that serves both flows'
methods: Medusa heads and Lookahead as its built-in drafting, NGram / EAGLE-3 / a draft model as its proposers
(the way bench/runtime_bench.py measures them), so there is no second decode loop here. The checkpoints are
converted into a temporary directory (the reference runtime loads TensorRT-LLM checkpoints), so a spec need not
have been converted. Prompts are tune's (`calibration_prompts` over the held-out pydoc topics, or a given text).
"""

from __future__ import annotations

import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from specbuild.errors import SpecbuildError
from specbuild.spec import PipelineSpec


@dataclass
class Figure:
    """One method's measurement: tokens per target forward (None: not measured, `note` says why) and whether its
    greedy output equals the target's plain greedy output."""

    role: str  # "plain", "before", "after"
    method: str
    tokens_per_target_forward: float | None
    generated_tokens: int = 0
    target_forwards: int = 0
    same_as_plain_greedy: bool | None = None
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _serve(model: Any, prompts: list[list[int]], new_tokens: int, extra: int = 0,
           **engine: Any) -> tuple[list[list[int]], int, int]:
    """Each prompt alone through a fresh ServingEngine (greedy; a proposer given as a factory is made fresh per
    prompt, so NGram's pool starts empty each time): (outputs, generated tokens, target forwards), so tokens per
    target forward is a single sequence's, 1.0 for plain decoding."""
    from specbuild.runtime.serving import EngineRequest, ServingEngine

    make = engine.pop("proposer", None)
    outputs, forwards = [], 0
    for prompt in prompts:
        if make is not None:
            engine["proposer"] = make()
        served = ServingEngine(model, max_batch=1, max_seq_len=len(prompt) + new_tokens + extra + 1, **engine)
        handle = served.submit(EngineRequest(list(prompt), new_tokens))
        served.run_until_idle()
        outputs.append(handle.wait(0).tokens)
        forwards += served.stats.forwards
    return outputs, sum(map(len, outputs)), forwards


def _convert(name: str, source: Path, out: Path, dtype: str, **extra: Any) -> Path:
    from rich.console import Console

    from specbuild.convert.pipeline import convert_checkpoint
    from specbuild.convert.request import ConvertRequest

    convert_checkpoint(ConvertRequest(name, source, out, dtype, **extra), console=Console(quiet=True))
    return out


def _method(spec: PipelineSpec) -> str:
    speculative = spec.speculative
    if speculative.mode == "lookahead":
        la = speculative.lookahead_config()
        return f"lookahead (W, N, G) = ({la.window_size}, {la.ngram_size}, {la.verification_set_size})"
    if speculative.mode == "medusa" and spec.medusa is not None:
        return f"medusa ({len(spec.medusa.resolved_choices())}-node tree)"
    return f"{speculative.mode} (K {speculative.num_draft_tokens})"


def calibration_ids(spec: PipelineSpec, text: Path | None = None, prompts: int = 4,
                    prompt_tokens: int = 32) -> list[list[int]]:
    """The measurement's prompts as the target tokenizer's ids, from `text` (default: tune's held-out pydoc
    topics); `migrate` asks for them before it writes anything, so a bad --text writes nothing."""
    from specbuild.tokenizer import load_tokenizer
    from specbuild.tune.measure import calibration_prompts

    if text is None:
        from specbuild.corpus import heldout_texts

        texts = heldout_texts()
    else:
        try:
            texts = [text.read_text(encoding="utf-8")]
        except (OSError, UnicodeDecodeError) as err:
            reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
            raise SpecbuildError(f"--text {text}: cannot read the calibration text: {reason}",
                                 hint="name a UTF-8 text file, or leave --text out for tune's held-out text") from None
    try:
        tokenizer = load_tokenizer(spec.target.model)
    except SpecbuildError as err:
        raise SpecbuildError(f"measuring the migration: {err.message}",
                             hint="--no-measure writes the new spec without measuring") from None
    try:
        return calibration_prompts(lambda s: tokenizer.encode(s, add_special_tokens=False, verbose=False), texts,
                                   prompts, prompt_tokens)
    except ValueError as err:
        raise SpecbuildError(f"--text {text}: {err}" if text else str(err)) from None


def measure_migration(old: PipelineSpec, new: PipelineSpec, *, text: Path | None = None, prompts: int = 4,
                      prompt_tokens: int = 32, new_tokens: int = 32,
                      ids: list[list[int]] | None = None) -> list[Figure]:
    """Plain greedy, then `old`'s method and `new`'s, on the same prompts (`ids`, else `calibration_ids`); a
    method that cannot run yet (an EAGLE-3 draft not trained) is reported with None and why."""
    import torch

    from specbuild.runtime.model import CausalLM
    from specbuild.runtime.proposers import (
        Eagle3Proposer,
        ModelProposer,
        NGramConfig,
        NGramProposer,
        SAConfig,
        SAProposer,
    )

    if ids is None:
        ids = calibration_ids(old, text, prompts, prompt_tokens)
    dtype = old.build.dtype
    figures: list[Figure] = []
    with tempfile.TemporaryDirectory(prefix="specbuild-migrate-") as work, torch.inference_mode():
        root = Path(work)
        target = CausalLM.from_checkpoint(_convert("target", old.target.model, root / "target", dtype))
        plain, generated, forwards = _serve(target, ids, new_tokens)
        figures.append(Figure("plain", "none", generated / forwards, generated, forwards, True))

        def record(role: str, spec: PipelineSpec) -> None:
            speculative = spec.speculative
            mode, k = speculative.mode, speculative.num_draft_tokens
            name = _method(spec)
            if mode == "medusa" and spec.medusa is not None:
                choices = spec.medusa.resolved_choices()
                model = CausalLM.from_checkpoint(_convert("medusa", spec.target.model, root / "medusa", dtype,
                                                          medusa_heads=spec.medusa.heads,
                                                          medusa_tree_nodes=len(choices)))
                run = _serve(model, ids, new_tokens, len(choices) + 1, medusa_choices=choices)
            elif mode == "lookahead":
                from specbuild.runtime.lookahead import max_block_tokens

                config = speculative.lookahead_config().config
                run = _serve(target, ids, new_tokens, max_block_tokens(config), lookahead=config)
            elif mode == "ngram":
                ngram = speculative.ngram
                settings = ngram.model_dump() if ngram is not None else {}
                run = _serve(target, ids, new_tokens, proposer=lambda: NGramProposer(NGramConfig(k, **settings)))
            elif mode == "sa":
                sa = speculative.sa
                sa_settings = sa.model_dump(exclude_none=True) if sa is not None else {}
                run = _serve(target, ids, new_tokens, proposer=lambda: SAProposer(SAConfig(k, **sa_settings)))
            elif mode == "eagle3" and spec.draft is not None and spec.draft.model is not None:
                if not (Path(spec.draft.model) / "config.json").is_file():
                    figures.append(Figure(role, name, None, note=f"no EAGLE-3 draft at {spec.draft.model} yet: "
                                          "train it (`specbuild eagle train`), then measure again"))
                    return
                from specbuild.runtime.eagle3 import Eagle3Draft

                draft = Eagle3Draft.from_directory(Path(spec.draft.model), target, dtype=target.dtype)
                run = _serve(target, ids, new_tokens, proposer=lambda: Eagle3Proposer(draft, k))
            elif mode == "draft_target" and spec.draft is not None and spec.draft.model is not None:
                draft = CausalLM.from_checkpoint(_convert("draft", spec.draft.model, root / f"draft-{role}", dtype))
                run = _serve(target, ids, new_tokens, proposer=lambda: ModelProposer(draft, k))
                name += " (unquantized draft: the reference runtime measures the method, not the format)"
            else:
                figures.append(Figure(role, name, None, note="not measured by migrate"))
                return
            outputs, generated, forwards = run
            figures.append(Figure(role, name, generated / forwards, generated, forwards, outputs == plain))

        record("before", old)
        record("after", new)
    return figures


def figures_table(figures: list[Figure]) -> list[str]:
    """One line per figure, for the terminal and the bench's markdown."""
    lines = []
    for figure in figures:
        value = "-" if figure.tokens_per_target_forward is None else f"{figure.tokens_per_target_forward:.2f}"
        same = {True: "yes", False: "NO", None: "-"}[figure.same_as_plain_greedy]
        lines.append(f"{figure.role:<7} {figure.method:<58} {value:>6} tokens/target forward, "
                     f"== plain greedy: {same}{'  ' + figure.note if figure.note else ''}")
    return lines
