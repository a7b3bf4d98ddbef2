"""tensorrt_llm / tensorrt_llm_draft for reference builds: NVIDIA's C++ `tensorrtllm` backend's contract served by
specbuild's serving engine (in-flight batching over the PyTorch runtime).

A thin adapter: Triton tensors become numpy dicts for `specbuild.python_models.llm_backend.Backend` (every
request, output and error rule lives there), which submits each row to the engine
(`specbuild.runtime.serving.ServingEngine`, running on its own thread)
and hands each response to the model's response thread (`specbuild.python_models.response_thread`, NVIDIA's
WaitForResponse thread), which sends it through its request's response sender while the engine steps on.
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
from specbuild.python_models.response_thread import ResponseThread


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        params = io.model_parameters(args)
        io.set_threads(params)
        try:
            built = build_engine(params, json.loads(args["model_config"]), io.model_dir(args),
                                 log_info=io.log_info, log_warn=io.log_warn)
        except ModelLoadError as err:
            raise RuntimeError(err.message) from None
        self.responses = ResponseThread("specbuild-responses", lambda text: io.log_warn(f"tensorrt_llm: {text}"))
        self.engine = built.engine
        self.engine.start()
        self.backend = Backend(built.config, self.engine, log_info=io.log_info, log_warn=io.log_warn)
        self.decoupled = built.config.decoupled

    def execute(self, requests: list[Any]) -> None:
        """Enqueue only: the engine's thread makes every response and the response thread sends it, so execute
        returns at once."""
        for request in requests:
            sender = request.get_response_sender()
            send = _Sender(sender, self.decoupled, self.responses)
            job = self.backend.receive(io.inputs(request), io.wanted_outputs(request), send,
                                       request_id=io.request_id(request),
                                       client_cancelled=io.cancelled_check(sender) or io.cancelled_check(request))
            if job is not None:
                self.backend.submit(job)

    def finalize(self) -> None:
        self.engine.stop()
        self.responses.close()


class _Sender:
    """Hands backend Responses for one request's response sender to the response thread (a client that went away
    is only logged there). A non-decoupled model sends exactly one response, with the final flag: the request's
    final one. The Triton response is built here, on the engine's thread: built on the response thread, it held
    the interpreter lock against the engine's next step (plain at 8 clients measured slower than building here)."""

    def __init__(self, sender: Any, decoupled: bool, responses: ResponseThread) -> None:
        self.sender, self.decoupled, self.responses = sender, decoupled, responses
        self.closed = False
        self._lock = threading.Lock()

    def __call__(self, response: Response) -> None:
        with self._lock:  # held while queueing: this request's responses are queued in the order they are made
            if self.closed or not (self.decoupled or response.final):
                return
            self.closed = response.final
            try:
                built, flags = io.to_response(response.outputs, response.error), io.FINAL if response.final else 0
            except Exception as err:  # as a failed send: logged, the request's stream left as it is
                io.log_warn(f"tensorrt_llm: response not sent: {err}")
                return
            self.responses.put(lambda: self.sender.send(built, flags=flags))
