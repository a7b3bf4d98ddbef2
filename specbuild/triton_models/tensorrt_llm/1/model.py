"""tensorrt_llm / tensorrt_llm_draft for reference builds: NVIDIA's C++ `tensorrtllm` backend's contract served by
specbuild's serving engine (in-flight batching over the PyTorch runtime).

A thin adapter: Triton tensors become numpy dicts for `specbuild.python_models.llm_backend.Backend` (every
request, output and error rule lives there), which submits each row to the engine
(`specbuild.runtime.serving.ServingEngine`, running on its own thread)
and sends the responses through the requests' response senders as the engine steps.
`execute` only enqueues, decoupled or not, as the C++ backend's does: requests that arrive while others run join
the running batch, and a stop request or a cancellation reaches a request that is running.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from specbuild.python_models import triton_io as io
from specbuild.python_models.llm_backend import Backend, ModelLoadError, Response
from specbuild.python_models.llm_engine import build_engine


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        params = io.model_parameters(args)
        io.set_threads(params)
        try:
            built = build_engine(params, json.loads(args["model_config"]), io.model_dir(args),
                                 log_info=io.log_info, log_warn=io.log_warn)
        except ModelLoadError as err:
            raise RuntimeError(err.message) from None
        self.engine = built.engine
        self.engine.start()
        self.backend = Backend(built.config, self.engine, log_info=io.log_info, log_warn=io.log_warn)
        self.decoupled = built.config.decoupled

    def execute(self, requests: list[Any]) -> None:
        """Enqueue only: the engine's thread sends every response, so execute returns at once."""
        for request in requests:
            sender = request.get_response_sender()
            job = self.backend.receive(io.inputs(request), io.wanted_outputs(request), _Sender(sender, self.decoupled),
                                       request_id=io.request_id(request),
                                       client_cancelled=io.cancelled_check(sender) or io.cancelled_check(request))
            if job is not None:
                self.backend.submit(job)

    def finalize(self) -> None:
        self.engine.stop()


class _Sender:
    """Sends backend Responses on a request's response sender (a client that went away is only logged); rows
    finish on the engine's thread, one at a time. A non-decoupled model sends exactly one response, with the
    final flag: the request's final one."""

    def __init__(self, sender: Any, decoupled: bool) -> None:
        self.sender, self.decoupled = sender, decoupled
        self.closed = False
        self._lock = threading.Lock()

    def __call__(self, response: Response) -> None:
        with self._lock:
            if self.closed or not (self.decoupled or response.final):
                return
            try:
                self.sender.send(io.to_response(response.outputs, response.error),
                                 flags=io.FINAL if response.final else 0)
            except Exception as err:  # e.g. the client cancelled and the stream is gone
                io.log_warn(f"tensorrt_llm: response not sent: {err}")
            if response.final:
                self.closed = True
