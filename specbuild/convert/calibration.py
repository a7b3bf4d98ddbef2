"""Calibration text for post-training quantization: where it comes from and how it becomes token batches.

ModelOpt picks activation scales (and AWQ/SmoothQuant scales) from the activations this text produces, so the
text should look like what the service will see. Three sources: `builtin` (`specbuild.corpus`: the Python
reference text the demo models are trained on, `pydoc_data.topics` minus the held-out topics, so evaluations stay
held out), one UTF-8 text file, or a directory whose `*.txt` files are read in name order. An empty or unreadable
source is an error before anything is written: calibrating on nothing would silently give useless scales.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from specbuild.errors import SpecbuildError

FIELD = "draft.quantization.calib.source"
CalibSource = Literal["builtin"] | Path


class CalibrationError(SpecbuildError):
    """The calibration source is missing, unreadable or holds no text."""


@dataclass(frozen=True)
class CalibrationText:
    """The texts of a calibration source and the files they came from (hashed into the convert manifest)."""

    texts: list[str]
    files: list[Path]
    description: str


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise CalibrationError(f"{path}: calibration file is not UTF-8 text ({FIELD})") from err
    except OSError as err:
        raise CalibrationError(f"{path}: cannot read calibration file ({err.strerror}) ({FIELD})") from err


def read_calibration(source: CalibSource) -> CalibrationText:
    """The texts of `source`; raises CalibrationError naming the path when there is no usable text."""
    if source == "builtin":
        from specbuild.corpus import training_texts

        return CalibrationText(training_texts(), [], "builtin (pydoc_data.topics, demo training split)")
    path = Path(source)
    if path.is_dir():
        files = sorted(p for p in path.glob("*.txt") if p.is_file())
        if not files:
            raise CalibrationError(
                f"{path}: calibration directory holds no .txt files ({FIELD})",
                hint="put UTF-8 .txt files there, name one text file, or use 'builtin'",
            )
        texts = [_read_text(p) for p in files]
        description = f"{path} ({len(files)} .txt files)"
    elif path.is_file():
        files, texts, description = [path], [_read_text(path)], str(path)
    else:
        raise CalibrationError(
            f"{path}: calibration source does not exist ({FIELD})",
            hint="give a UTF-8 text file, a directory of .txt files, or 'builtin'",
        )
    texts = [t for t in texts if t.strip()]
    if not texts:
        raise CalibrationError(
            f"{path}: calibration source is empty ({FIELD})",
            hint="calibration needs representative text; add some, or use 'builtin'",
        )
    return CalibrationText(texts, files, description)


def calibration_batches(calibration: CalibrationText, tokenizer: Any, size: int, seq_len: int) -> list[torch.Tensor]:
    """Up to `size` non-overlapping windows of `seq_len` tokens from the concatenated texts, each [1, seq_len].

    Fewer windows when the text is short (never repeated: repeating text would weight it twice); a text
    shorter than one window gives one shorter sample. No tokens at all is an error."""
    ids: list[int] = []
    for text in calibration.texts:
        ids.extend(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])
        if len(ids) >= size * seq_len:
            break
    if not ids:
        raise CalibrationError(
            f"{calibration.description}: calibration text gives no tokens with the draft's tokenizer ({FIELD})"
        )
    stream = torch.tensor(ids[: size * seq_len], dtype=torch.long)
    if stream.numel() < seq_len:
        return [stream[None]]
    windows = stream[: stream.numel() // seq_len * seq_len].view(-1, seq_len)
    return [w[None] for w in windows]
