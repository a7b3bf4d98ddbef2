"""One LLM request against a deployed repository, over gRPC streaming or HTTP generate, timed per response.

Two interfaces, told apart by the inputs the model's config declares (`REQUEST_NAMES`): the TensorRT-LLM Triton
backend's (specbuild.contracts.triton_backend: `text_input`, `max_tokens`, `stream`, `num_draft_tokens`,
`exclude_input_in_output`, `return_perf_metrics`) and Triton's llmapi model's (specbuild.contracts.llm_api:
`text_input`, `sampling_param_max_tokens`, `streaming`, `sampling_param_exclude_input_from_output`,
`sampling_param_return_perf_metrics`); both answer in `text_output` (the llmapi model streams the whole text so
far in each response) and the acceptance statistics `acceptance_rate`, `total_accepted_draft_tokens`,
`total_draft_tokens`. Optional inputs are sent only when the model's config declares them, so the same client
drives the ensemble, the BLS, the llmapi model and any python model with those names. gRPC uses the bidirectional
stream with `enable_empty_final_response=True` and waits for `triton_final_response` (the only RPC that works for
decoupled models); HTTP uses `/v2/models/<m>/generate` (one response) or `/generate_stream` (server-sent events).
"""

from __future__ import annotations

import itertools
import json
import queue
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from specbuild.contracts.llm_api import SAMPLING_PARAM_INPUTS, STREAMING_INPUT
from specbuild.errors import SpecbuildError

Protocol = Literal["grpc", "http", "openai"]
"""Triton's gRPC streaming, Triton's HTTP generate, or an OpenAI server's /v1/completions (specbuild.bench.openai)."""
ACCEPTANCE_OUTPUTS = ("acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens")
COUNT_OUTPUT = "num_output_tokens"
_TRITON_TYPES = {"TYPE_STRING": "BYTES", "TYPE_BOOL": "BOOL", "TYPE_INT32": "INT32", "TYPE_INT64": "INT64",
                 "TYPE_UINT64": "UINT64", "TYPE_FP32": "FP32", "TYPE_FP16": "FP16"}
_NUMPY = {"BYTES": object, "BOOL": np.bool_, "INT32": np.int32, "INT64": np.int64, "UINT64": np.uint64,
          "FP32": np.float32, "FP16": np.float16}
_ids = itertools.count()


@dataclass
class Generation:
    """What one request produced and when: response times are seconds after the request was sent."""

    text: str = ""
    response_times: list[float] = field(default_factory=list)
    latency_s: float = 0.0
    reported_tokens: int | None = None
    """Sum of the model's `num_output_tokens` outputs, when it returns them (an OpenAI server: its usage's count)."""
    reported_as: str = COUNT_OUTPUT
    """Where `reported_tokens` came from, for the report."""
    acceptance_rate: float | None = None
    accepted_draft_tokens: int | None = None
    draft_tokens: int | None = None

    @property
    def ttft_s(self) -> float:
        """Time to the first response that carried text (the whole answer, when not streaming)."""
        return self.response_times[0] if self.response_times else self.latency_s

    def acceptance_line(self) -> str:
        """The acceptance the answer reported, in the TensorRT-LLM backend's output names, as `specbuild serve
        --prompt` prints it for every deployment (Triton's outputs, an OpenAI server's usage details)."""
        if not self.draft_tokens:
            return ("total_draft_tokens 0 (the model reported no speculation)" if self.draft_tokens == 0
                    else "the model returned no acceptance outputs")
        rate = self.acceptance_rate if self.acceptance_rate is not None else (
            (self.accepted_draft_tokens or 0) / self.draft_tokens)
        return (f"acceptance_rate {rate:.3f}, total_accepted_draft_tokens {self.accepted_draft_tokens}, "
                f"total_draft_tokens {self.draft_tokens}")


@dataclass(frozen=True)
class RequestNames:
    """The input names one serving interface gives what the client sends (None: the interface has no such input)."""

    interface: str
    max_tokens: str
    stream: str
    exclude_input: str
    perf_metrics: str
    num_draft_tokens: str | None


def _llmapi_input(key: str) -> str:
    """The llmapi input that helpers.py reads into SamplingParams(`key`) (the contract's table)."""
    return next(entry.name for entry in SAMPLING_PARAM_INPUTS if entry.key == key)


REQUEST_NAMES = (
    RequestNames("llmapi", _llmapi_input("max_tokens"), STREAMING_INPUT, _llmapi_input("exclude_input_from_output"),
                 _llmapi_input("return_perf_metrics"), None),
    RequestNames("tensorrtllm_backend", "max_tokens", "stream", "exclude_input_in_output", "return_perf_metrics",
                 "num_draft_tokens"),
)
"""Each interface's names, the one a model declares the max-tokens input of first; the last is the default."""


DEPLOY_DRAFT_LENGTH = ("deploy the draft length you want (speculative.num_draft_tokens; speculative.mode: none "
                       "decodes plainly)")
"""What to do when a model cannot take a request's draft length."""


@dataclass(frozen=True)
class ModelInterface:
    """What a deployed model accepts: input name → Triton datatype, batching, decoupled."""

    name: str
    inputs: dict[str, str]
    batched: bool
    decoupled: bool

    @property
    def names(self) -> RequestNames:
        """The interface this model speaks, by the max-tokens input it declares."""
        return next((n for n in REQUEST_NAMES if n.max_tokens in self.inputs), REQUEST_NAMES[-1])

    def draft_length_problem(self, num_draft_tokens: int | None) -> str | None:
        """Why a request's draft length cannot reach this model (None: it can, or none is asked): a model without
        the `num_draft_tokens` input (Triton's llmapi model, whose LLM API drafts its speculative_config's length;
        an ensemble) drafts as deployed whatever the request says."""
        if num_draft_tokens is None or self.names.num_draft_tokens in self.inputs:
            return None
        return (f"--num-draft-tokens {num_draft_tokens}: model {self.name} ({self.names.interface} interface) has no "
                "num_draft_tokens input, so its requests would draft as deployed")

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> ModelInterface:
        inputs = {i["name"]: _TRITON_TYPES.get(i.get("data_type", ""), "BYTES") for i in config.get("input", [])}
        policy = config.get("model_transaction_policy") or {}
        return cls(config["name"], inputs, int(config.get("max_batch_size", 0)) > 0, bool(policy.get("decoupled")))


def entry_model(names: list[str]) -> str:
    """The model clients should call: the BLS when the repository has a draft model, else the ensemble."""
    if "tensorrt_llm_bls" in names and "tensorrt_llm_draft" in names:
        return "tensorrt_llm_bls"
    for name in ("ensemble", "tensorrt_llm_bls"):
        if name in names:
            return name
    if len(names) == 1:
        return names[0]
    raise SpecbuildError(
        f"cannot tell which model to call among {sorted(names)}", hint="name it with --model-name"
    )


class LLMClient:
    """A connection to one model; not thread-safe: give each concurrent worker its own."""

    def __init__(self, url: str, model: str | None = None, protocol: Protocol = "grpc", timeout_s: float = 300.0):
        self.url, self.protocol, self.timeout_s = _strip_scheme(url), protocol, timeout_s
        self._grpc: Any = None
        self._responses: queue.Queue[tuple[float, Any, Any]] = queue.Queue()
        self._http: Any = None
        try:
            if protocol == "grpc":
                import tritonclient.grpc as grpcclient

                self._grpc = grpcclient.InferenceServerClient(self.url)
                names = [m.name for m in self._grpc.get_model_repository_index().models]
                model = model or entry_model(names)
                config = self._grpc.get_model_config(model, as_json=True)["config"]
            else:
                import requests

                self._http = requests.Session()
                self._http.trust_env = False  # like tritonclient: talk to the server directly, not via http_proxy
                if model is None:
                    model = entry_model(self._repository_index())
                response = self._http.get(f"http://{self.url}/v2/models/{model}/config", timeout=30)
                if response.status_code != 200:
                    raise SpecbuildError(f"{self.url}: model {model!r}: {_http_error(response)}")
                config = response.json()
        except SpecbuildError:
            self.close()
            raise
        except Exception as err:  # connection refused, unknown model: one clear line, not a gRPC traceback
            self.close()
            raise SpecbuildError(f"cannot reach model {model or '(entry model)'} at {url} over {protocol}: {err}",
                                 hint="is the server running (`specbuild serve REPO`) and is this its "
                                      f"{protocol} address?") from None
        self.model = ModelInterface.from_config(config)
        self._stream_open = False

    def _repository_index(self) -> list[str]:
        """The model names Triton's repository index lists; an error saying what answered when it is no Triton."""
        index = self._http.post(f"http://{self.url}/v2/repository/index", json={}, timeout=30)
        try:
            listed = index.json()
            return [str(entry["name"]) for entry in listed]
        except (ValueError, TypeError, KeyError):
            raise SpecbuildError(f"{self.url} is not a Triton HTTP endpoint: /v2/repository/index answered "
                                 f"{_http_error(index)}",
                                 hint="for an OpenAI endpoint (Dynamo's frontend, trtllm-serve, vLLM, SGLang) "
                                      "give --protocol openai, or leave --protocol out to detect it") from None

    def close(self, cancel: bool = False) -> None:
        """Close the connection; `cancel`: cancel the requests in flight on the gRPC stream instead of awaiting
        them (a run cut short)."""
        if self._grpc is not None:
            if getattr(self, "_stream_open", False):
                self._grpc.stop_stream(cancel_requests=cancel)
            self._grpc.close()
            self._grpc = None
        if self._http is not None:
            self._http.close()
            self._http = None

    def __enter__(self) -> LLMClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request_fields(self, prompt: str, max_tokens: int, stream: bool, num_draft_tokens: int | None) -> dict:
        """The inputs to send, under the names of the model's interface: the prompt and max tokens, plus the
        optional ones this model declares."""
        names, declared = self.model.names, self.model.inputs
        fields: dict[str, Any] = {"text_input": prompt, names.max_tokens: max_tokens}
        if names.stream in declared:
            fields[names.stream] = stream
        if num_draft_tokens is not None and self.model.draft_length_problem(num_draft_tokens) is None:
            fields[names.num_draft_tokens] = num_draft_tokens  # bench and serve refuse it up front otherwise
        if names.exclude_input in declared:
            fields[names.exclude_input] = True  # the completion only: both interfaces' defaults add the prompt
        if names.perf_metrics in declared:
            fields[names.perf_metrics] = True  # the acceptance outputs are perf metrics in both
        return fields

    def generate(
        self, prompt: str, max_tokens: int, *, stream: bool | None = None, num_draft_tokens: int | None = None
    ) -> Generation:
        """Send one request and collect every response; raises SpecbuildError with the server's message.

        `stream=None` streams exactly when the model is decoupled: the TensorRT-LLM backend refuses `stream`
        on a non-decoupled model, and a decoupled one answers token by token only when asked to.
        """
        stream = self.model.decoupled if stream is None else stream
        fields = self.request_fields(prompt, max_tokens, stream, num_draft_tokens)
        if self.protocol == "grpc":
            return self._generate_grpc(fields)
        return self._generate_http(fields, stream)

    # -- gRPC ---------------------------------------------------------------------------------------------

    def _generate_grpc(self, fields: dict[str, Any]) -> Generation:
        import tritonclient.grpc as grpcclient

        if not self._stream_open:
            self._grpc.start_stream(callback=lambda result, error: self._responses.put((time.perf_counter(), result,
                                                                                        error)))
            self._stream_open = True
        inputs = []
        for name, value in fields.items():
            dtype = self.model.inputs.get(name, "BYTES")
            array = np.array([value.encode() if isinstance(value, str) else value], dtype=_NUMPY[dtype])
            if self.model.batched:
                array = array.reshape(1, 1)
            tensor = grpcclient.InferInput(name, list(array.shape), dtype)
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        result = Generation()
        last_counts: tuple[Any, set[str]] | None = None
        start = time.perf_counter()
        self._grpc.async_stream_infer(self.model.name, inputs, request_id=str(next(_ids)),
                                      enable_empty_final_response=True)
        while True:
            try:
                when, response, error = self._responses.get(timeout=self.timeout_s)
            except queue.Empty:
                # Cancel it and start the next request on a new stream: its late responses must not be read
                # as the next request's.
                self._grpc.stop_stream(cancel_requests=True)
                self._stream_open = False
                self._responses = queue.Queue()
                raise SpecbuildError(f"{self.model.name}: no response within {self.timeout_s:.0f}s") from None
            if error is not None:
                raise SpecbuildError(f"{self.model.name} (gRPC): {_grpc_message(error)}")
            message = response.get_response()
            names = {out.name for out in message.outputs}
            if names:
                # Per response only what `_absorb` adds up; the cumulative counters from the last response
                # holding them, once; the other outputs (the rest of the perf metrics) not at all: decoding a
                # dozen tensors per streamed token cost this client, on the server's cores, about a sixth of its
                # time at 8 clients.
                _absorb(result, {name: response.as_numpy(name) for name in names & _PER_RESPONSE}, when - start)
                if names & _CUMULATIVE:
                    last_counts = response, names & _CUMULATIVE
            if message.parameters["triton_final_response"].bool_param:
                result.latency_s = when - start
                if last_counts is not None:
                    counted, held = last_counts
                    _absorb(result, {name: counted.as_numpy(name) for name in held}, when - start)
                return result

    # -- HTTP ---------------------------------------------------------------------------------------------

    def _generate_http(self, fields: dict[str, Any], stream: bool) -> Generation:
        endpoint = "generate_stream" if stream else "generate"
        url = f"http://{self.url}/v2/models/{self.model.name}/{endpoint}"
        result = Generation()
        start = time.perf_counter()
        # `with`: a stream abandoned on an error event goes back to the session's pool closed, not half read
        with self._http.post(url, json=fields, stream=stream, timeout=self.timeout_s) as response:
            if response.status_code != 200:
                raise SpecbuildError(f"{self.model.name} (HTTP {endpoint}): {_http_error(response)}")
            if not stream:
                _absorb(result, response.json(), time.perf_counter() - start)
            else:
                for line in response.iter_lines():
                    if not line.startswith(b"data:"):
                        continue
                    event = json.loads(line[5:])
                    if "error" in event:  # the status code is fixed by the first event; later ones carry errors
                        raise SpecbuildError(f"{self.model.name} (HTTP {endpoint}): {event['error']}")
                    _absorb(result, event, time.perf_counter() - start)
        result.latency_s = time.perf_counter() - start
        return result


_PER_RESPONSE = frozenset({"text_output", COUNT_OUTPUT})
"""Outputs each response adds to the request's figures."""
_CUMULATIVE = frozenset({"acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens"})
"""Outputs that hold the request's totals so far: the last response's count, the earlier ones' need no reading."""


def _absorb(result: Generation, outputs: dict[str, Any], when: float) -> None:
    """Fold one response into the result: text chunks (deltas, or the whole text so far), counts, acceptance."""
    if "text_output" in outputs:
        chunk = _text(outputs["text_output"])
        if result.text and chunk.startswith(result.text):
            result.text = chunk  # cumulative responses (e.g. a BLS with accumulate_tokens)
        else:
            result.text += chunk
        if chunk:
            result.response_times.append(when)
    if COUNT_OUTPUT in outputs:
        result.reported_tokens = (result.reported_tokens or 0) + int(_number(outputs[COUNT_OUTPUT]))
    if "acceptance_rate" in outputs:
        result.acceptance_rate = float(_number(outputs["acceptance_rate"]))
    if "total_accepted_draft_tokens" in outputs:
        result.accepted_draft_tokens = int(_number(outputs["total_accepted_draft_tokens"]))
    if "total_draft_tokens" in outputs:
        result.draft_tokens = int(_number(outputs["total_draft_tokens"]))


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(_text(v) for v in value)
    items = np.asarray(value, dtype=object).reshape(-1)
    return "".join(v.decode("utf-8", errors="replace") if isinstance(v, bytes) else str(v) for v in items)


def _number(value: Any) -> float:
    while isinstance(value, list):
        value = value[0]
    return float(np.asarray(value).reshape(-1)[0])


def _strip_scheme(url: str) -> str:
    for scheme in ("http://", "https://", "grpc://"):
        if url.startswith(scheme):
            return url[len(scheme):].rstrip("/")
    return url.rstrip("/")


def _http_error(response: Any) -> str:
    """The server's message: Triton's `{"error": ...}`, OpenAI's `{"error": {"message": ...}}`, else the body."""
    try:
        body = response.json()
    except ValueError:
        return f"HTTP {response.status_code}: {response.text.strip()[:500]}"
    error = body.get("error", body) if isinstance(body, dict) else body
    return str(error.get("message", error) if isinstance(error, dict) else error)


def _grpc_message(error: Any) -> str:
    message = getattr(error, "message", None)
    return str(message() if callable(message) else error)
