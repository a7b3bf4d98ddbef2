"""User-facing errors.

Every failure a user can cause (bad spec, bad checkpoint, bad flag) is raised as a `SpecbuildError` whose
message names the file, field or tensor and says what to do. The CLI prints it without a traceback and
exits non-zero; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class SpecbuildError(Exception):
    """An error caused by the user's input, with a message that says what to fix."""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        self.message = message
        self.hint = hint
        super().__init__(message)

    def __str__(self) -> str:
        # Read at print time: a caller may add context to `message` (e.g. which of a spec's models failed).
        return self.message if self.hint is None else f"{self.message}\n  hint: {self.hint}"


class SpecError(SpecbuildError):
    """The pipeline spec is invalid."""


MISSING_MODEL = ("point the field at a Hugging Face checkpoint directory; a Hugging Face Hub id (owner/name) is "
                 "read from the Hugging Face cache, which `specbuild convert SPEC` fills (or `hf download owner/name`"
                 " where the Hub is reachable)")
"""The hint of a model directory that does not exist: the value may have been meant as a Hub id not yet cached."""


class CheckpointError(SpecbuildError):
    """An input checkpoint is missing, unreadable, or contradicts its own config."""
