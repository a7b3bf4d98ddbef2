"""Incremental detokenisation without state: each streamed chunk carries a few tokens that came before it.

Decoding each chunk on its own drops the spaces that a tokenizer attaches to a neighbour and cuts multi-byte
characters in half (the Triton TensorRT-LLM backend's known streaming bug, reference §3.2/§5.5). Here a
chunk's text is decode(preceding + chunk) minus decode(preceding), where a trailing incomplete character
(U+FFFD from a partial UTF-8 sequence) is held back until the chunk that completes it; the last chunk keeps
everything. Concatenated chunks then equal decoding the whole sequence at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

PRECEDING_WINDOW = 8
"""Tokens of context per chunk: enough for any held-back character (at most 3 pending bytes) and for
tokenizers that decide a leading space by their neighbour."""

_REPLACEMENT = "\ufffd"


def _complete(text: str) -> str:
    return text.rstrip(_REPLACEMENT)


def decode_chunk(tokenizer: Any, tokens: Sequence[int], preceding: Sequence[int], final: bool,
                 skip_special_tokens: bool = True) -> str:
    """The text `tokens` add after `preceding` (the generated tokens just before them; empty for the first
    chunk or a whole sequence)."""
    whole = tokenizer.decode(list(preceding) + list(tokens), skip_special_tokens=skip_special_tokens)
    if not final:
        whole = _complete(whole)
    if not preceding:
        return whole
    before = _complete(tokenizer.decode(list(preceding), skip_special_tokens=skip_special_tokens))
    if whole.startswith(before):
        return whole[len(before):]
    # A tokenizer whose decode is not prefix-stable: fall back to the chunk on its own.
    alone = tokenizer.decode(list(tokens), skip_special_tokens=skip_special_tokens)
    return alone if final else _complete(alone)


def preceding_tokens(generated: Sequence[int], start: int) -> list[int]:
    """The context for a chunk that starts at `start` in the generated tokens."""
    return list(generated[max(0, start - PRECEDING_WINDOW) : start])
