"""tensorrt_llm of a `build.flow: pytorch`, `build.backend: reference` repository: Triton's llmapi model interface
served by specbuild's reference runtime on CPU, in place of NVIDIA's llmapi model.py (which needs TensorRT-LLM).

A thin adapter: the settings come from 1/model.yaml as NVIDIA's model.py reads them (triton_config for
auto_complete_config, the rest the LLM-API settings; LLM_CONFIG_PATH names another file, as there), the checkpoints
from 1/reference.json; every request, output and error rule lives in `specbuild.python_models.llmapi_model`.
`execute` only hands requests on: responses are sent from the runners' threads, as NVIDIA's event loop does.
The serving engine's counters (`EngineStats`: target forwards, how many ran more than one request, draft
forwards) are published as Triton custom metrics `specbuild_engine{counter=...}` on the metrics endpoint, after
every finished request, so a client can see requests batched without timing them.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import yaml

from specbuild.python_models.llmapi_model import Answer

CONFIG_FILE = "model.yaml"
REFERENCE_FILE = "reference.json"


def _version_dir() -> Path:
    return Path(__file__).resolve().parent


def _model_config() -> dict[str, Any]:
    path = _version_dir() / os.environ.get("LLM_CONFIG_PATH", CONFIG_FILE)
    settings = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(settings, dict):
        raise RuntimeError(f"'{path.name}' containing TRT-LLM engine args not found in '{path.parent}'")
    return settings


class TritonPythonModel:
    @classmethod
    def auto_complete_config(cls, auto_complete_model_config: Any) -> Any:
        """As NVIDIA's: decoupled and max_batch_size from model.yaml triton_config."""
        triton = _model_config()["triton_config"]
        auto_complete_model_config.set_model_transaction_policy({"decoupled": bool(triton["decoupled"])})
        auto_complete_model_config.set_max_batch_size(int(triton["max_batch_size"]))
        return auto_complete_model_config

    def initialize(self, args: dict[str, str]) -> None:
        from specbuild.python_models import triton_io as io
        from specbuild.python_models.llmapi_model import LlmApiModel, load_runner
        from specbuild.tokenizer import load_tokenizer

        io.set_threads(io.model_parameters(args))
        settings = _model_config()
        reference = json.loads((_version_dir() / REFERENCE_FILE).read_text(encoding="utf-8"))
        triton = settings.pop("triton_config")
        self.decoupled = bool(triton["decoupled"])
        tokenizer = load_tokenizer(Path(reference["tokenizer"]),
                                   trust_remote_code=bool(reference.get("trust_remote_code")))
        self.runner = load_runner(settings, reference, log_info=io.log_info)
        self.model = LlmApiModel(tokenizer, self.runner, decoupled=self.decoupled)
        self.metrics = _EngineMetrics(args.get("model_name", "tensorrt_llm"))
        io.log_info(f"[trtllm] reference llmapi model: {settings.get('speculative_config') or 'no speculation'}")

    def execute(self, requests: list[Any]) -> None:
        from specbuild.python_models import triton_io as io

        for request in requests:
            sender = request.get_response_sender()
            self.model.receive(io.inputs(request), _Sender(sender, self._publish), request_id=io.request_id(request),
                               client_cancelled=io.cancelled_check(request) or io.cancelled_check(sender))

    def _publish(self) -> None:
        self.metrics.publish(self.runner.stats())

    def finalize(self) -> None:
        self.runner.stop()


class _EngineMetrics:
    """The engine's counters as one Triton gauge family, a metric per counter (set to the running total)."""

    NAME = "specbuild_engine"

    def __init__(self, model: str) -> None:
        import triton_python_backend_utils as pb_utils

        self.model = model
        self.family = pb_utils.MetricFamily(name=self.NAME, kind=pb_utils.MetricFamily.GAUGE,
                                            description="specbuild serving engine counters (EngineStats)")
        self.metrics: dict[str, Any] = {}
        self._lock = threading.Lock()

    def publish(self, stats: dict[str, int]) -> None:
        with self._lock:
            for name, value in stats.items():
                if name not in self.metrics:
                    self.metrics[name] = self.family.Metric(labels={"model": self.model, "counter": name})
                self.metrics[name].set(float(value))


class _Sender:
    """Sends Answers on one request's response sender; nothing after the final one."""

    def __init__(self, sender: Any, on_final: Any = None) -> None:
        self.sender = sender
        self.on_final = on_final  # called before the final response (the metrics' update)
        self.closed = False
        self._lock = threading.Lock()

    def __call__(self, answer: Answer) -> None:
        import triton_python_backend_utils as pb_utils

        if answer.final and self.on_final is not None:  # before the answer: a client that has it sees the counts
            self.on_final()
        with self._lock:
            if self.closed:
                return
            flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if answer.final else 0
            try:
                if answer.outputs is None and answer.error is None:
                    self.sender.send(flags=flags)
                else:
                    tensors = [pb_utils.Tensor(name, array) for name, array in (answer.outputs or {}).items()]
                    error = None
                    if answer.error is not None:
                        error = (pb_utils.TritonError(answer.error, pb_utils.TritonError.CANCELLED) if answer.cancelled
                                 else pb_utils.TritonError(answer.error))
                    self.sender.send(pb_utils.InferenceResponse(output_tensors=tensors, error=error), flags=flags)
            except Exception as err:  # the client went away
                pb_utils.Logger.log_warn(f"tensorrt_llm: response not sent: {err}")
            if answer.final:
                self.closed = True
