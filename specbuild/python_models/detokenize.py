"""Incremental detokenisation without state: each streamed chunk carries a few tokens that came before it.

Decoding each chunk on its own drops the spaces that a tokenizer attaches to a neighbour and cuts multi-byte
characters in half (the Triton TensorRT-LLM backend's known streaming bug: triton-inference-server/
tensorrtllm_backend issues #34, #112, #332, #606). Here a
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


def decode_outputs(tokenizer: Any, tokens: Any, lengths: Any, preceding: Any = None, final: Any = None,
                   skip_special_tokens: bool = True) -> list[str]:
    """postprocessing's OUTPUT for one request: one string per (row, beam), row-major, each row's beam tokens
    cut to SEQUENCE_LENGTH (NVIDIA/TensorRT-LLM `triton_backend/all_models/inflight_batcher_llm/postprocessing/
    1/model.py` @2e2327b9, `execute`). specbuild's optional PRECEDING_IDS ([B, W], -1 padded) and IS_FINAL
    ([B]) make a row a streamed chunk decoded incrementally (`decode_chunk`); without them a row decodes on its
    own, as NVIDIA's does."""
    import numpy as np

    tokens = np.asarray(tokens)
    if tokens.ndim == 2:  # [B, T]: one beam per row
        tokens = tokens[:, None, :]
    lengths = np.asarray(lengths).reshape(tokens.shape[0], -1)
    texts = []
    for b in range(tokens.shape[0]):
        context: list[int] = []
        if preceding is not None:
            row = np.asarray(preceding)[b if np.asarray(preceding).shape[0] > b else 0].reshape(-1)
            context = [int(t) for t in row if t >= 0]
        is_final = True
        if final is not None and np.asarray(final).size:
            flat = np.asarray(final).reshape(np.asarray(final).shape[0], -1)
            is_final = bool(flat[b if flat.shape[0] > b else 0, 0])
        for beam in range(tokens.shape[1]):
            n = int(lengths[b, beam if lengths.shape[1] > beam else 0])
            texts.append(decode_chunk(tokenizer, tokens[b, beam, :n].tolist(), context, is_final,
                                      skip_special_tokens))
    return texts


class StreamedText:
    """The text of one streamed sequence, chunk by chunk, as postprocessing answers the chunks: each chunk
    decoded after the tokens before it (`decode_chunk` with PRECEDING_IDS), or, with the BLS parameter
    accumulate_tokens, every response re-decoding all tokens so far (NVIDIA's tensorrt_llm_bls/1/lib/decode.py
    @4db68284 `Decoder.postprocess`: the accumulated tokens go to postprocessing without context)."""

    def __init__(self, tokenizer: Any, skip_special_tokens: bool = True, accumulate: bool = False) -> None:
        self.tokenizer, self.skip, self.accumulate = tokenizer, skip_special_tokens, accumulate
        self.tokens: list[int] = []

    def add(self, tokens: Sequence[int], final: bool) -> str:
        start = len(self.tokens)
        self.tokens.extend(tokens)
        if self.accumulate:
            return decode_chunk(self.tokenizer, self.tokens, [], True, self.skip)
        return decode_chunk(self.tokenizer, self.tokens[start:], preceding_tokens(self.tokens, start), final,
                            self.skip)
