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

from specbuild.contracts.engine_info import ENGINE_INFO, read_engine_info, reference_checkpoint
from specbuild.deploy.pbtxt import parse_choices
from specbuild.python_models import triton_io as io
from specbuild.python_models.llm_backend import Backend, BackendConfig, ModelLoadError, Response


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        from specbuild.dtypes import torch_dtype
        from specbuild.runtime.model import CausalLM
        from specbuild.runtime.schedule import DraftSchedule, served_steps
        from specbuild.runtime.serving import ServingEngine

        params = io.model_parameters(args)
        io.set_threads(params)
        model_config = json.loads(args["model_config"])
        engine_dir = io.resolve(args, params["gpt_model_path"])
        info = read_engine_info(engine_dir)
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
                from specbuild.spec.presets import DEFAULT_MEDUSA_CHOICES  # the C++ backend's default too

                io.log_warn("medusa_choices parameter is not specified. Will be using default "
                            f"{DEFAULT_MEDUSA_CHOICES} choices instead.")
                choices = load_choices(DEFAULT_MEDUSA_CHOICES)
        schedule = None
        # Only a model that speculates on its own (a Medusa tree, a self-draft) runs a schedule; the BLS's target
        # and draft engines are plain tensorrt_llm models and leave the BLS's to it.
        speculates = bool(choices) or bool(params.get("self_draft_layers"))
        steps = served_steps(params.get("draft_len_schedule"), io.log_info) if speculates else {}
        if steps or params.get("max_concurrency"):
            schedule = DraftSchedule(steps, len(choices) if choices else info.max_draft_len,
                                     int(params["max_concurrency"]) if params.get("max_concurrency") else None)
        dtype = torch_dtype(info.dtype, where=f"{engine_dir / ENGINE_INFO}: dtype")  # unknown: an error, not float32
        model = CausalLM.from_checkpoint(reference_checkpoint(engine_dir), dtype=dtype)
        proposer = None
        if params.get("self_draft_layers"):  # a self-draft: this model drafts with its own layers and KV cache
            from specbuild.runtime.self_draft import self_draft_proposer, shared_memory

            k = int(params["self_draft_len"])
            proposer = self_draft_proposer(model, int(params["self_draft_layers"]), k,
                                           params.get("self_draft_checkpoint") or None)
            if schedule is not None:
                schedule = DraftSchedule(schedule.steps, k, schedule.max_concurrency)
            memory = shared_memory(model, proposer.draft)
            io.log_info(f"[TensorRT-LLM] self-draft of {params['self_draft_layers']} layers, K {k}: shares the "
                        f"target's weights and KV cache ({memory['shared_extra_params']} parameters of its own, "
                        f"{memory['shared_extra_kv_bytes_per_token']} KV bytes per token of its own)")
        self.engine = ServingEngine(model, max_batch=info.max_batch_size, max_seq_len=info.max_seq_len,
                                    max_draft_len=info.max_draft_len, medusa_choices=choices,
                                    kv_rows=int(params.get("kv_cache_slots") or 0), schedule=schedule,
                                    lookahead=config.lookahead_config, proposer=proposer)
        self.engine.start()
        self.backend = Backend(config, self.engine, log_info=io.log_info, log_warn=io.log_warn)
        self.decoupled = config.decoupled

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
