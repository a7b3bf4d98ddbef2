"""Facts of the safetensors format shared by the reader and the writer."""

from __future__ import annotations

from dataclasses import dataclass

import torch

# safetensors dtype codes <-> torch dtypes (https://github.com/huggingface/safetensors, format spec).
DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}
DTYPE_CODES: dict[torch.dtype, str] = {v: k for k, v in DTYPES.items()}


@dataclass(frozen=True)
class FileSpan:
    """Bytes of another open file: the writer copies them without reading them into memory."""

    fd: int
    offset: int
    nbytes: int
