"""Can this draft speculate for this target? Checked before any conversion work starts.

Draft-target decoding compares token ids, so the two models must share the vocabulary and the tokenizer
(NVIDIA/TensorRT-LLM issue #2789: a Qwen2.5 pair with different vocabulary sizes fails at run time with buffer
errors; `examples/draft_target_model/README.md` of the 1.x line), and a draft that is not smaller than its target
cannot make decoding faster.
"""

from __future__ import annotations

from pathlib import Path

from specbuild.convert.architectures import REFUSED, REGISTRY
from specbuild.convert.hf_checkpoint import HFCheckpoint
from specbuild.errors import CheckpointError, SpecbuildError
from specbuild.tokenizer import TOKENIZER_OWN_FILES, VOCABULARY_FILES, load_tokenizer

# Words, digits, punctuation, accents and CJK: tokenizers that differ anywhere common tend to differ here.
PROBE_TEXT = "Speculative decoding, 2024: naïve café — 東京 tokens {x: [1, 2.5]} // end."


def tokenizer_problem(directory: Path, role: str = "target") -> tuple[str, str] | None:
    """(message, hint) when `directory` has no tokenizer `deploy` could copy into the repository, else None.
    Looks for files only (no transformers import): the tokenizer files `deploy` copies (`TOKENIZER_OWN_FILES`)."""
    if any((directory / name).is_file() for name in VOCABULARY_FILES):
        return None
    looked = list(TOKENIZER_OWN_FILES)
    present = [name for name in looked if (directory / name).is_file()]
    found = f" (only {', '.join(present)})" if present else ""
    return (
        f"{directory}: {role}.model has no tokenizer files{found}; looked for {', '.join(looked)}. `deploy` copies "
        "the target's tokenizer into the model repository, whose preprocessing and postprocessing models cannot "
        "run without one",
        "copy the tokenizer files that came with the model (e.g. tokenizer.json and tokenizer_config.json) into "
        f"{directory}, then run again",
    )


def _parameters(checkpoint: HFCheckpoint) -> int:
    return sum(_numel(info.shape) for info in checkpoint.infos.values())


def _numel(shape: tuple[int, ...]) -> int:
    total = 1
    for dim in shape:
        total *= dim
    return total


def _probe_ids(directory: Path) -> list[int] | None:
    """The probe text's token ids, or None when the directory has no tokenizer files (no vocabulary and no
    tokenizer_config.json)."""
    if not any((directory / name).is_file() for name in (*VOCABULARY_FILES, "tokenizer_config.json")):
        return None
    try:
        tokenizer = load_tokenizer(directory)
    except SpecbuildError as err:
        raise CheckpointError(err.message, hint=err.hint) from None
    except Exception as err:  # transformers raises many types for unreadable tokenizers
        raise CheckpointError(f"{directory}: cannot load the tokenizer ({err})") from err
    return list(tokenizer.encode(PROBE_TEXT, add_special_tokens=False))


def check_draft_target(target: Path, draft: Path, *, allow_pickle: bool = False) -> None:
    """Raise one CheckpointError listing every reason `draft` cannot serve as `target`'s draft model."""
    problems: list[str] = []
    target_ckpt = HFCheckpoint(target, allow_pickle=allow_pickle)
    draft_ckpt = HFCheckpoint(draft, allow_pickle=allow_pickle)
    try:
        for role, ckpt in (("target", target_ckpt), ("draft", draft_ckpt)):
            arch = (ckpt.config.get("architectures") or [None])[0]
            if arch in REFUSED:
                problems.append(f"{role} architecture {arch!r} is not supported: {REFUSED[arch][0]}")
            elif arch not in REGISTRY:
                problems.append(f"{role} architecture {arch!r} is not supported (supported: {', '.join(REGISTRY)})")
        vocab_t, vocab_d = target_ckpt.config.get("vocab_size"), draft_ckpt.config.get("vocab_size")
        if vocab_t != vocab_d:
            problems.append(
                f"vocab_size differs: target {vocab_t} ({target / 'config.json'}), draft {vocab_d} "
                f"({draft / 'config.json'})"
            )
        params_t, params_d = _parameters(target_ckpt), _parameters(draft_ckpt)
        if params_d >= params_t:
            problems.append(
                f"the draft ({params_d / 1e6:.1f} M parameters) is not smaller than the target "
                f"({params_t / 1e6:.1f} M): it cannot make decoding faster"
            )
    finally:
        target_ckpt.close()
        draft_ckpt.close()
    ids_t, ids_d = _probe_ids(target), _probe_ids(draft)
    if ids_t is None or ids_d is None:
        missing = target if ids_t is None else draft
        problems.append(f"{missing}: no tokenizer files, so the shared tokenizer cannot be checked")
    elif ids_t != ids_d:
        pairs = enumerate(zip(ids_t, ids_d, strict=False))
        first = next((i for i, (a, b) in pairs if a != b), min(len(ids_t), len(ids_d)))
        problems.append(
            f"the tokenizers differ: the probe text {PROBE_TEXT!r} becomes different token ids (first difference at "
            f"token {first}: target {ids_t[first:first + 3]}, draft {ids_d[first:first + 3]})"
        )
    if problems:
        raise CheckpointError(
            f"draft {draft} cannot speculate for target {target}:\n  - " + "\n  - ".join(problems),
            hint="draft and target must share tokenizer and vocabulary; pick a smaller model of the same family",
        )
