"""Serving until Ctrl-C or SIGTERM, for `specbuild serve` on a Triton repository and on a Dynamo deployment alike.

Both handlers are installed explicitly (a background job starts with SIGINT ignored) and restored afterwards. The
first signal raises KeyboardInterrupt, which stops the server; a later one arrives while it stops and must not cut
the stop half-way (leaving orphaned processes): it kills the server's processes at once where the server can, and is
otherwise ignored.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

from rich.console import Console

WATCH_INTERVAL_S = 0.5
"""How often a server left serving is checked for health."""


class _Signals:
    def __init__(self, kill: Callable[[], None] | None) -> None:
        self.kill, self.stopping = kill, False

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self.stopping:
            if self.kill is not None:
                self.kill()
            return
        self.stopping = True
        raise KeyboardInterrupt


@contextmanager
def stopped_on_signal(what: str, stop: Callable[[], None], console: Console, *,
                      kill: Callable[[], None] | None = None) -> Iterator[None]:
    """Run the body with SIGTERM/SIGINT handled as the module says; whatever ends it (a signal, an error, the body
    returning), `stop` runs once, then the previous handlers are back."""
    handler = _Signals(kill)
    previous = {signum: signal.signal(signum, handler) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    except KeyboardInterrupt:
        console.print(f"stopping {what}…", highlight=False)
    finally:
        handler.stopping = True
        try:
            stop()
        finally:
            for signum, old in previous.items():
                signal.signal(signum, old)


def serve_until_stopped(check: Callable[[], None], console: Console) -> None:
    """Keep serving until a signal interrupts, checking health every WATCH_INTERVAL_S; `check` raises, and so ends
    the serving, when the server is no longer healthy."""
    console.print("serving until Ctrl-C", highlight=False)
    while True:
        time.sleep(WATCH_INTERVAL_S)
        check()
