"""A safetensors writer that streams one tensor at a time.

The safetensors header (names, dtypes, shapes, offsets) comes before the data, so the writer is given the
whole layout up front (the conversion plan knows every output shape before it reads any weight) and then
receives tensors in that order. Nothing but the tensor being written is held in memory, unlike
`safetensors.torch.save_file`, which needs every tensor at once.
"""

from __future__ import annotations

import errno
import json
import os
import struct
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

import torch

from specbuild.convert.safetensors_format import DTYPE_CODES, FileSpan

_NO_KERNEL_COPY = {errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL}
_CHUNK = 16 << 20
_ALIGN = 8  # header padded so the data section starts 8-byte aligned, as safetensors itself does


class StreamingSafetensorsWriter:
    """Write `layout` (name -> (dtype, shape), in write order) to `path`, one `write()` per tensor."""

    def __init__(
        self,
        path: Path,
        layout: Sequence[tuple[str, torch.dtype, tuple[int, ...]]],
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        self.path = path
        self._order = [name for name, _, _ in layout]
        self._expect: dict[str, tuple[torch.dtype, tuple[int, ...]]] = {}
        header: dict[str, object] = {}
        if metadata:
            header["__metadata__"] = dict(metadata)
        offset = 0
        for name, dtype, shape in layout:
            if name in self._expect:
                raise ValueError(f"tensor {name!r} appears twice in the layout of {path}")
            nbytes = dtype.itemsize
            for d in shape:
                nbytes *= d
            header[name] = {
                "dtype": DTYPE_CODES[dtype],
                "shape": list(shape),
                "data_offsets": [offset, offset + nbytes],
            }
            self._expect[name] = (dtype, tuple(shape))
            offset += nbytes
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % _ALIGN)
        self._file = path.open("wb", buffering=0)  # unbuffered: copy_from shares the file position
        self._file.write(struct.pack("<Q", len(raw)))
        self._file.write(raw)
        self._next = 0

    def _check_next(self, name: str, dtype: torch.dtype, shape: tuple[int, ...]) -> None:
        if self._next >= len(self._order) or self._order[self._next] != name:
            want = self._order[self._next] if self._next < len(self._order) else "nothing"
            raise ValueError(f"{self.path}: expected tensor {want!r} next, got {name!r}")
        want_dtype, want_shape = self._expect[name]
        if dtype != want_dtype or tuple(shape) != want_shape:
            raise ValueError(
                f"{self.path}: tensor {name!r} is {dtype} {list(shape)}, "
                f"the layout says {want_dtype} {list(want_shape)}"
            )

    def write(self, name: str, tensor: torch.Tensor) -> None:
        """Append the next tensor; it must be the one the layout names next, with its dtype and shape."""
        self.write_pieces(name, tensor.dtype, tuple(tensor.shape), [tensor])

    def write_pieces(
        self, name: str, dtype: torch.dtype, shape: tuple[int, ...], pieces: Sequence[torch.Tensor | FileSpan]
    ) -> None:
        """Append the next tensor as consecutive byte pieces: tensors (written) or spans of another file
        (copied inside the kernel with `copy_file_range`, as `cp` does, never entering this process)."""
        self._check_next(name, dtype, shape)
        expected = dtype.itemsize * torch.Size(shape).numel()
        written = 0
        for piece in pieces:
            if isinstance(piece, FileSpan):
                self._copy(piece)
                written += piece.nbytes
            else:
                data = piece.detach().contiguous().reshape(-1)
                if data.numel():
                    self._file.write(memoryview(data.view(torch.uint8).numpy()))
                written += data.numel() * data.dtype.itemsize
        if written != expected:
            raise ValueError(f"{self.path}: tensor {name!r} got {written} bytes, its layout needs {expected}")
        self._next += 1

    def _copy(self, span: FileSpan) -> None:
        offset, remaining = span.offset, span.nbytes
        while remaining:
            try:
                copied = os.copy_file_range(span.fd, self._file.fileno(), remaining, offset)
            except OSError as err:
                if err.errno not in _NO_KERNEL_COPY:
                    raise
                copied = self._file.write(os.pread(span.fd, min(remaining, _CHUNK), offset))  # no kernel support
            if copied == 0:
                raise OSError(f"{self.path}: source file ended early while copying")
            offset += copied
            remaining -= copied

    def close(self) -> None:
        """Finish the file; fails if tensors of the layout were never written."""
        self._file.close()
        if self._next != len(self._order):
            raise ValueError(f"{self.path}: {len(self._order) - self._next} tensors of the layout were not written")

    def __enter__(self) -> StreamingSafetensorsWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self._file.close()
