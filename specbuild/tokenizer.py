"""The tokenizer inside a model repository: which files make it up, and loading it without the network.

The repository carries its own copy (`<repo>/tokenizer/`), referenced relative to each model directory, so
the repository works after being moved or copied to another machine.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from specbuild.errors import SpecbuildError

TOKENIZER_DIR = "tokenizer"
TOKENIZER_OWN_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "tokenizer.model", "vocab.json", "merges.txt", "vocab.txt", "spiece.model", "sentencepiece.bpe.model",
    "chat_template.jinja", "chat_template.json",
)
"""The files of a tokenizer itself: what travels with it (the repository's copy, the Medusa heads directory)."""
TOKENIZER_FILES = (*TOKENIZER_OWN_FILES, "generation_config.json", "config.json")
"""What AutoTokenizer may read; config.json (no weights) lets it pick the tokenizer class when
tokenizer_config.json does not name one."""
TOKENIZER_MARKERS = ("tokenizer.json", "tokenizer_config.json")
"""A directory is a tokenizer `deploy` copies and `bench` counts with when it has one of these (`has_tokenizer`).
Not VOCABULARY_FILES, which convert's draft/target check asks for: that set refuses a tokenizer_config.json alone
and accepts a bare vocab.txt, and merging the two would accept or refuse other directories than each stage does."""
VOCABULARY_FILES = ("tokenizer.json", "tokenizer.model", "spiece.model", "sentencepiece.bpe.model", "vocab.json",
                    "vocab.txt")
"""A tokenizer needs one of these (the vocabulary); tokenizer_config.json alone makes AutoTokenizer fall back to a
slow sentencepiece tokenizer that then fails on the missing model file."""


def has_tokenizer(directory: Path) -> bool:
    """Whether `directory` holds a tokenizer by TOKENIZER_MARKERS (files only, no transformers import)."""
    return any((directory / name).is_file() for name in TOKENIZER_MARKERS)


def copy_tokenizer(source: Path, destination: Path, *, trust_remote_code: bool) -> list[str]:
    """Copy the tokenizer files of HF directory `source`; remote-code tokenizers also bring their .py files."""
    if not has_tokenizer(source):
        raise SpecbuildError(
            f"{source}: no tokenizer here ({' / '.join(TOKENIZER_MARKERS)})",
            hint="target.model must be a Hugging Face directory with its tokenizer files",
        )
    destination.mkdir(parents=True, exist_ok=True)
    names = [name for name in TOKENIZER_FILES if (source / name).is_file()]
    if trust_remote_code:
        names += sorted(p.name for p in source.glob("*.py"))
    for name in names:
        shutil.copyfile(source / name, destination / name)
    return names


def load_tokenizer(directory: Path, *, trust_remote_code: bool = False) -> Any:
    """An HF tokenizer from local files only; remote code only where the spec allowed it."""
    if not Path(directory).is_dir():  # transformers would take the path for a Hub repo id and say that instead
        raise SpecbuildError(f"{directory}: cannot load the tokenizer: no such directory",
                             hint="check the path; a spec's relative paths are read from the spec's directory "
                                  "(the demo specs' models are built by `make demo` or `specbuild demo-models`)")
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(directory, trust_remote_code=trust_remote_code, local_files_only=True)
    except (OSError, ValueError) as err:
        raise SpecbuildError(f"{directory}: cannot load the tokenizer ({err})") from None


def special_ids(tokenizer: Any) -> tuple[int, int]:
    """(end id, pad id): the tokenizer's EOS, and its pad token or else EOS (as the TensorRT-LLM backend)."""
    end = tokenizer.eos_token_id
    if end is None:
        raise SpecbuildError("the tokenizer has no EOS token: generation would never stop at an end token")
    pad = tokenizer.pad_token_id
    return int(end), int(end if pad is None else pad)
