"""Lazy, memory-mapped reading of safetensors files.

The header is parsed and checked against the file size up front, so a truncated or corrupt file is reported
before any output is written. Tensor data is read zero-copy from a private memory map; `release` hands the
pages back to the kernel afterwards, so reading a whole model keeps only the tensors in flight resident
instead of growing the process's RSS towards the model size.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

from specbuild.convert.safetensors_format import DTYPES, FileSpan
from specbuild.errors import CheckpointError

_MAX_HEADER = 100 * 1024 * 1024  # the format's own limit
_PAGE = mmap.PAGESIZE


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lives: its file, dtype, shape and byte range in the data section."""

    name: str
    path: Path
    dtype: torch.dtype
    shape: tuple[int, ...]
    begin: int  # absolute file offset
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


def read_header(path: Path) -> dict[str, TensorInfo]:
    """Parse and validate a safetensors header; raise CheckpointError naming the file if it is damaged."""
    try:
        size = path.stat().st_size
        with path.open("rb") as fh:
            prefix = fh.read(8)
            if len(prefix) < 8:
                raise CheckpointError(
                    f"{path}: not a safetensors file (only {size} bytes)", hint="re-download or re-save it"
                )
            (header_len,) = struct.unpack("<Q", prefix)
            if header_len > min(_MAX_HEADER, size - 8):
                raise CheckpointError(
                    f"{path}: corrupt or truncated safetensors header (declares {header_len} header bytes, "
                    f"file has {size})",
                    hint="re-download or re-save the file",
                )
            raw = fh.read(header_len)
    except PermissionError as err:
        raise CheckpointError(f"{path}: cannot read weights file ({err.strerror})") from err
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(
            f"{path}: corrupt safetensors header ({err})", hint="re-download or re-save the file"
        ) from err
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: corrupt safetensors header (not a JSON object)")
    data_start = 8 + header_len
    infos: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        infos[name] = _tensor_info(path, name, entry, data_start, size)
    return infos


def _tensor_info(path: Path, name: str, entry: object, data_start: int, size: int) -> TensorInfo:
    try:
        assert isinstance(entry, dict)
        dtype = DTYPES[entry["dtype"]]
        shape = tuple(int(d) for d in entry["shape"])
        begin, end = (int(x) for x in entry["data_offsets"])
    except (AssertionError, KeyError, TypeError, ValueError) as err:
        raise CheckpointError(f"{path}: corrupt header entry for tensor {name!r}") from err
    numel = 1
    for d in shape:
        numel *= d
    expected = numel * dtype.itemsize
    if end - begin != expected or begin < 0:
        raise CheckpointError(
            f"{path}: tensor {name!r} declares {end - begin} bytes but shape {list(shape)} of "
            f"{entry['dtype']} needs {expected}",
            hint="the file is corrupt; re-download or re-save it",
        )
    if data_start + end > size:
        raise CheckpointError(
            f"{path}: file is truncated: tensor {name!r} needs bytes up to {data_start + end}, "
            f"the file has {size}",
            hint="the download or copy was interrupted; fetch the file again",
        )
    return TensorInfo(name, path, dtype, shape, data_start + begin, data_start + end)


class MappedFile:
    """One safetensors file mapped copy-on-write, handing out zero-copy tensor views."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDONLY)  # kept open for kernel-side copies (see the writer)
        size = os.fstat(self.fd).st_size
        # ACCESS_COPY gives a writable (private) buffer, which torch.frombuffer wants, without ever
        # writing to the file; pages stay file-backed until touched.
        self._map = mmap.mmap(self.fd, size, access=mmap.ACCESS_COPY) if size else None
        self._base: int | None = None

    def tensor(self, info: TensorInfo) -> torch.Tensor:
        if info.nbytes == 0 or self._map is None:
            return torch.empty(info.shape, dtype=info.dtype)
        flat = torch.frombuffer(self._map, dtype=torch.uint8, count=info.nbytes, offset=info.begin)
        return flat.view(info.dtype).reshape(info.shape)

    def release(self, info: TensorInfo) -> None:
        """Drop the pages of one tensor from this process (they stay in the page cache)."""
        if self._map is None or info.nbytes == 0:
            return
        start = info.begin - info.begin % _PAGE
        self._map.madvise(mmap.MADV_DONTNEED, start, info.end - start)

    def span_of(self, tensor: torch.Tensor) -> FileSpan | None:
        """Where `tensor`'s bytes lie in this file, if it is an untouched contiguous view of the map."""
        if self._map is None or tensor.device.type != "cpu" or not tensor.is_contiguous():
            return None
        if self._base is None:
            self._base = torch.frombuffer(self._map, dtype=torch.uint8, count=1).data_ptr()
        offset = tensor.data_ptr() - self._base
        nbytes = tensor.numel() * tensor.dtype.itemsize
        if offset < 0 or offset + nbytes > len(self._map):
            return None
        return FileSpan(self.fd, offset, nbytes)

    def close(self) -> None:
        if self._map is not None:
            with contextlib.suppress(BufferError):  # a caller still holds a view; freed with it
                self._map.close()
            self._map = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
