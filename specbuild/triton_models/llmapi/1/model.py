"""tensorrt_llm of a `build.flow: pytorch`, `build.backend: reference` repository: Triton's llmapi model interface
served by specbuild's reference runtime on CPU, in place of NVIDIA's llmapi model.py (which needs TensorRT-LLM).

A thin adapter: the settings come from 1/model.yaml as NVIDIA's model.py reads them (triton_config for
auto_complete_config, the rest the LLM-API settings; LLM_CONFIG_PATH names another file, as there), the checkpoints
from 1/reference.json; every request, output and error rule lives in `specbuild.python_models.llmapi_model`.
`execute` only hands requests on: responses are made on the runners' threads, as NVIDIA's event loop makes them,
and sent by the model's response thread (`specbuild.python_models.response_thread`), so the engine steps on
meanwhile.
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
from specbuild.python_models.response_thread import ResponseThread

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
        self.responses = ResponseThread("specbuild-responses", lambda text: io.log_warn(f"tensorrt_llm: {text}"))
        io.log_info(f"[trtllm] reference llmapi model: {settings.get('speculative_config') or 'no speculation'}")

    def execute(self, requests: list[Any]) -> None:
        from specbuild.python_models import triton_io as io

        for request in requests:
            sender = request.get_response_sender()
            send = _Sender(sender, self.responses, self._publish)
            self.model.receive(io.inputs(request), send, request_id=io.request_id(request),
                               client_cancelled=io.cancelled_check(request) or io.cancelled_check(sender))

    def _publish(self) -> None:
        self.metrics.publish(self.runner.stats())

    def finalize(self) -> None:
        self.runner.stop()
        self.responses.close()


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
    """Hands Answers for one request's response sender to the model's response thread, which sends them in order
    (a client that went away is only logged there); nothing after the final one."""

    def __init__(self, sender: Any, responses: ResponseThread, on_final: Any = None) -> None:
        self.sender, self.responses = sender, responses
        self.on_final = on_final  # called before the final response (the metrics' update)
        self.closed = False
        self._lock = threading.Lock()

    def __call__(self, answer: Answer) -> None:
        import triton_python_backend_utils as pb_utils

        with self._lock:  # held while queueing: this request's answers are queued in the order they are made
            if self.closed:
                return
            self.closed = answer.final
            flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if answer.final else 0
            try:
                built = None if answer.outputs is None and answer.error is None else _response(answer)
            except Exception as err:  # as a failed send: logged, the request's stream left as it is
                pb_utils.Logger.log_warn(f"tensorrt_llm: response not sent: {err}")
                return
            self.responses.put(lambda: self._deliver(built, flags, answer.final))

    def _deliver(self, built: Any, flags: int, final: bool) -> None:
        if final and self.on_final is not None:  # before the answer: a client that has it sees the counts
            self.on_final()
        if built is None:
            self.sender.send(flags=flags)
        else:
            self.sender.send(built, flags=flags)


def _response(answer: Answer) -> Any:
    """The Triton response of an Answer (built on the engine's thread, sent on the response thread)."""
    import triton_python_backend_utils as pb_utils

    tensors = [pb_utils.Tensor(name, array) for name, array in (answer.outputs or {}).items()]
    error = None
    if answer.error is not None:
        error = (pb_utils.TritonError(answer.error, pb_utils.TritonError.CANCELLED) if answer.cancelled
                 else pb_utils.TritonError(answer.error))
    return pb_utils.InferenceResponse(output_tensors=tensors, error=error)
