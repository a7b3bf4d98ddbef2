"""tensorrt_llm / tensorrt_llm_draft for reference builds: NVIDIA's C++ `tensorrtllm` backend's contract served by
specbuild's PyTorch runtime.

A thin adapter: Triton tensors become numpy dicts for `specbuild.deploy.llm_backend.Backend` (every request, output
and error rule lives there), its responses go back through the requests' response senders. `execute` only
enqueues, decoupled or not: a worker thread runs the requests one at a time on the engine (`ReferenceLLM`), so a
stop request or a cancellation can arrive while another request runs, as with the C++ backend's executor.
"""

from __future__ import annotations

import json
import queue
import threading
from typing import Any

from specbuild.build.engine_info import read_engine_info, reference_checkpoint
from specbuild.deploy import triton_io as io
from specbuild.deploy.llm_backend import Backend, BackendConfig, Job, ModelLoadError, Response
from specbuild.deploy.pbtxt import parse_choices
from specbuild.deploy.reference_llm import ReferenceLLM

DEFAULT_MEDUSA_CHOICES = "mc_sim_7b_63"
"""What the C++ backend uses when medusa_choices is unset (MIS getExecutorConfigFromParams)."""


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        params = io.model_parameters(args)
        io.set_threads(params)
        model_config = json.loads(args["model_config"])
        engine = io.resolve(args, params["gpt_model_path"])
        info = read_engine_info(engine)
        try:
            config, warnings = BackendConfig.from_model(params, model_config, info)
        except ModelLoadError as err:
            raise RuntimeError(err.message) from None
        for warning in warnings:
            io.log_warn(warning)
        choices = None
        if config.medusa:
            if params.get("medusa_choices"):
                choices = parse_choices(params["medusa_choices"])
            else:
                from specbuild.medusa.tree import load_choices

                io.log_warn("medusa_choices parameter is not specified. Will be using default mc_sim_7b_63 choices "
                            "instead.")
                choices = load_choices(DEFAULT_MEDUSA_CHOICES)
        llm = ReferenceLLM(reference_checkpoint(engine), dtype=info.dtype, max_seq_len=info.max_seq_len,
                           cache_slots=int(params.get("kv_cache_slots") or 8), max_draft_len=info.max_draft_len,
                           medusa_choices=choices)
        self.backend = Backend(config, llm, log_info=io.log_info, log_warn=io.log_warn)
        self.decoupled = config.decoupled
        self.jobs: queue.Queue[Job | None] = queue.Queue()
        self.worker = threading.Thread(target=self._work, name="tensorrt_llm-engine", daemon=True)
        self.worker.start()

    def execute(self, requests: list[Any]) -> None:
        """Enqueue only (the C++ backend's execute returns at once too, decoupled or not): the worker thread runs
        the requests and sends their responses, so a stop request is seen while another request runs."""
        for request in requests:
            sender = request.get_response_sender()
            job = self.backend.receive(io.inputs(request), io.wanted_outputs(request), _Sender(sender, self.decoupled),
                                       request_id=io.request_id(request),
                                       client_cancelled=io.cancelled_check(sender) or io.cancelled_check(request))
            if job is not None:
                self.jobs.put(job)

    def finalize(self) -> None:
        self.jobs.put(None)
        self.worker.join(timeout=10)

    def _work(self) -> None:
        while (job := self.jobs.get()) is not None:
            self._run(job)

    def _run(self, job: Job) -> None:
        try:
            self.backend.run(job)
        except Exception as err:  # a bug: say so in the log and end the client's stream with it
            io.log_error(f"tensorrt_llm: request failed: {err!r}")
            job.send(Response(error=f"tensorrt_llm reference backend failure: {err!r}", final=True))


class _Sender:
    """Sends backend Responses on a request's response sender (a client that went away is only logged). A
    non-decoupled model sends exactly one response, with the final flag: the request's final one."""

    def __init__(self, sender: Any, decoupled: bool) -> None:
        self.sender, self.decoupled = sender, decoupled
        self.closed = False

    def __call__(self, response: Response) -> None:
        if self.closed or not (self.decoupled or response.final):
            return
        try:
            self.sender.send(io.to_response(response.outputs, response.error), flags=io.FINAL if response.final else 0)
        except Exception as err:  # e.g. the client cancelled and the stream is gone
            io.log_warn(f"tensorrt_llm: response not sent: {err}")
        if response.final:
            self.closed = True
