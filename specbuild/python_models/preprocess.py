"""What the `preprocessing` model computes, free of Triton: NVIDIA's preprocessing outputs for text-only
repositories (NVIDIA/TensorRT-LLM `triton_backend/all_models/inflight_batcher_llm/preprocessing/1/model.py`
@01259b15: `initialize`, `execute`, `_create_request`, `_to_word_list_format`, `_get_embedding_bias`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

_NVIDIA_TRUE = ("true", "1", "t", "y", "yes")
_NVIDIA_BOOLEANS = (*_NVIDIA_TRUE, "false", "0", "f", "n", "no")


def nvidia_flag(value: str | None) -> bool:
    """add_special_tokens / skip_special_tokens as NVIDIA's tokenizer models read them: one of true/false, 1/0,
    t/f, y/n, yes/no (any case); anything else, or no value, is True."""
    text = (value or "").lower()
    return text in _NVIDIA_TRUE if text in _NVIDIA_BOOLEANS else True


def default_ids(tokenizer: Any) -> tuple[int, int]:
    """(end id, pad id) for rows without END_ID / PAD_ID: the first id of the eos (pad) token encoded without
    special tokens; a tokenizer without a pad token pads with eos (`initialize`)."""
    eos = tokenizer.eos_token
    if eos is None:
        raise ValueError("the tokenizer has no eos token: preprocessing needs one for the default end id")
    pad = tokenizer.pad_token or eos

    def first_id(token: str, fallback: int | None) -> int:
        ids = tokenizer.encode(token, add_special_tokens=False)
        if ids:
            return int(ids[0])
        if fallback is None:
            raise ValueError(f"the tokenizer encodes its special token {token!r} to no ids")
        return int(fallback)

    pad_fallback = tokenizer.pad_token_id if tokenizer.pad_token else tokenizer.eos_token_id
    return first_id(eos, tokenizer.eos_token_id), first_id(pad, pad_fallback)


def texts(array: np.ndarray) -> list[str]:
    """A [B, 1] (or [B]) BYTES tensor as one string per row."""
    return [_text(v) for v in array.reshape(array.shape[0], -1)[:, 0]] if array.size else []


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def encode_prompts(tokenizer: Any, prompts: Sequence[str], *, add_special_tokens: bool,
                   pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """INPUT_ID [B, longest] right-padded with the tokenizer's pad id, and REQUEST_INPUT_LEN [B, 1]
    (`_create_request`)."""
    rows = [tokenizer.encode(p, add_special_tokens=add_special_tokens) for p in prompts]
    ids = np.full((len(rows), max((len(r) for r in rows), default=0)), pad_id, dtype=np.int32)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
    return ids, np.array([[len(r)] for r in rows], dtype=np.int32).reshape(len(rows), 1)


def word_list(tokenizer: Any, words: np.ndarray | None, batch: int) -> np.ndarray:
    """BAD/STOP_WORDS_IDS [B, 2, L] int32: each row's phrases encoded without special tokens, flat ids padded
    with 0 and cumulative end offsets padded with -1; phrases that encode to nothing are skipped; L >= 1 when
    the input was sent, [B, 2, 0] when it was not (`_to_word_list_format`)."""
    if words is None:
        return np.zeros((batch, 2, 0), dtype=np.int32)
    grid = words.reshape(words.shape[0], -1) if words.ndim else words.reshape(1, 1)
    flat_rows, end_rows = [], []
    for b in range(batch):
        flat: list[int] = []
        ends: list[int] = []
        for word in grid[b if grid.shape[0] > b else 0] if grid.shape[0] else ():
            ids = tokenizer.encode(_text(word), add_special_tokens=False)
            if ids:
                flat += ids
                ends.append(len(flat))
        flat_rows.append(flat)
        end_rows.append(ends)
    width = max(1, *(len(f) for f in flat_rows))
    out = np.zeros((batch, 2, width), dtype=np.int32)
    out[:, 1, :] = -1
    for b, (flat, ends) in enumerate(zip(flat_rows, end_rows, strict=True)):
        out[b, 0, : len(flat)] = flat
        out[b, 1, : len(ends)] = ends
    return out


def embedding_bias(tokenizer: Any, words: np.ndarray | None, weights: np.ndarray | None, batch: int,
                   dtype: Any = np.float32) -> np.ndarray:
    """EMBEDDING_BIAS: [B, 0] unless both words and weights were sent; else [B, len(tokenizer.vocab)], each
    word's ids (encoded with the default special tokens) getting the word's weight (`_get_embedding_bias`)."""
    if words is None or weights is None:
        return np.zeros((batch, 0), dtype=dtype)
    vocab = len(tokenizer.vocab)
    word_rows = words.reshape(words.shape[0], -1) if words.ndim else words.reshape(1, 1)
    weight_rows = weights.reshape(weights.shape[0], -1) if weights.ndim else weights.reshape(1, 1)
    out = np.zeros((batch, vocab), dtype=np.float64)
    for b in range(batch):
        row_words = word_rows[b if word_rows.shape[0] > b else 0] if word_rows.shape[0] else ()
        row_weights = weight_rows[b if weight_rows.shape[0] > b else 0] if weight_rows.shape[0] else ()
        if len(row_words) != len(row_weights):
            raise ValueError("Embedding bias words must have same dimension as embedding bias weights")
        for word, weight in zip(row_words, row_weights, strict=True):
            for token in tokenizer.encode(_text(word)):
                if 0 <= token < vocab:
                    out[b, token] += float(weight)
    return out.astype(dtype)


def prompt_table_extra_ids(input_ids: np.ndarray, extra: np.ndarray, vocab_size: int) -> np.ndarray:
    """OUT_PROMPT_TABLE_EXTRA_IDS: per row, the row's PROMPT_TABLE_EXTRA_ID where an input id is a prompt-table
    id (>= vocab_size), else 0; PROMPT_TABLE_EXTRA_ID must be [B, 1] (`execute`)."""
    extra = extra.reshape(-1, 1) if extra.ndim == 1 else extra
    if extra.shape[0] != input_ids.shape[0]:
        raise ValueError("Prompt table extra id must have the same batch size as Query")
    if extra.ndim != 2 or extra.shape[1] != 1:
        raise ValueError("Multiple IDs cannot be provided for a single image")
    return np.where(input_ids >= vocab_size, extra.astype(np.uint64), np.uint64(0)).astype(np.uint64)


MULTIMODAL_INPUTS = ("IMAGE_BYTES", "IMAGE_URL", "IMAGE_SIZES", "VIDEO_BYTES")


def refuse_multimodal(tensors: dict[str, np.ndarray]) -> None:
    """The repository is text-only (multimodal_model_path unset): image or video data is refused by name;
    an input sent empty is accepted (NVIDIA's text-only preprocessing ignores them all)."""
    sent = []
    for name in MULTIMODAL_INPUTS:
        value = tensors.get(name)
        if value is None or value.size == 0:
            continue
        if value.dtype == object and not any(len(v) for v in value.reshape(-1)):
            continue
        sent.append(name)
    if sent:
        raise ValueError(f"{', '.join(sent)}: this repository serves text only (preprocessing has no "
                         "multimodal_model_path)")
