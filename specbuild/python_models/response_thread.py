"""The thread that sends a model's responses, apart from the engine's thread that makes them.

NVIDIA's C++ backend sends on a thread of its own: `ModelInstanceState::WaitForResponse`, started as
`mWaitForResponseThread` beside the executor, awaits the executor's responses and calls `TRITONBACKEND_ResponseSend`
(NVIDIA/TensorRT-LLM `triton_backend/inflight_batcher_llm/src/model_instance_state.cc` @0c8de69a), so the executor
steps on while the responses go out. The python backend's `send` waits for tritonserver to take each response; made
on the engine's thread, those waits held up the whole batch's next step, one per sequence and step (at 8 streaming
requests a fifth of the engine thread's time, by py-spy on the demo's plain repository).

One thread per model process, first in first out, so a request's responses leave in the order they were made.
Imported without Triton: the tests drive it with plain callables.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

__all__ = ["ResponseThread"]

_CLOSE = object()


class ResponseThread:
    """Runs each `put` delivery (a callable that sends one response) on one thread, in order. A delivery that
    raises is reported to `on_error` and the next one runs: one client's broken stream never stops the others'."""

    def __init__(self, name: str, on_error: Callable[[str], None]) -> None:
        self.on_error = on_error
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def put(self, deliver: Callable[[], None]) -> None:
        self._queue.put(deliver)

    def close(self, timeout: float = 10.0) -> None:
        """Deliver what was put before, then end the thread (model finalize)."""
        self._queue.put(_CLOSE)
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            deliver = self._queue.get()
            if deliver is _CLOSE:
                return
            try:
                deliver()  # type: ignore[operator]
            except Exception as err:  # e.g. the client cancelled and its stream is gone
                self.on_error(f"response not sent: {type(err).__name__}: {err}")
