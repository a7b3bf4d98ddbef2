"""What every python model of the repository does with Triton's python backend: read its parameters, set
torch's threads, read optional inputs, build responses.

Imported only inside tritonserver's python stub, where `triton_python_backend_utils` exists.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

from specbuild.python_models.model_paths import parameter_path
from specbuild.python_models.model_threads import set_threads as set_threads  # re-exported for the models

TRUE = {"1", "true", "yes", "t", "y", "on"}


def model_parameters(args: dict[str, str]) -> dict[str, str]:
    config = json.loads(args["model_config"])
    return {key: value.get("string_value", "") for key, value in config.get("parameters", {}).items()}


def is_decoupled(args: dict[str, str]) -> bool:
    config = json.loads(args["model_config"])
    return bool(config.get("model_transaction_policy", {}).get("decoupled", False))


def flag(params: dict[str, str], key: str, default: bool = False) -> bool:
    value = params.get(key, "").strip().lower()
    return default if not value else value in TRUE


def model_dir(args: dict[str, str]) -> Path:
    """This model's directory in the repository (`<repo>/<model>`)."""
    return Path(args["model_repository"])


def resolve(args: dict[str, str], value: str) -> Path:
    """A path parameter, relative ones taken from the model's directory (so the repository can move)."""
    return parameter_path(model_dir(args), value)


def setup_tokenizer_model(args: dict[str, str]) -> tuple[dict[str, str], Any]:
    """What preprocessing and postprocessing both do first: parameters, threads, and the repository's own
    tokenizer (remote code only where the spec allowed it)."""
    from specbuild.tokenizer import load_tokenizer

    params = model_parameters(args)
    set_threads(params)
    tokenizer = load_tokenizer(resolve(args, params["tokenizer_dir"]),
                               trust_remote_code=flag(params, "trust_remote_code"))
    return params, tokenizer


def inputs(request: Any) -> dict[str, np.ndarray]:
    """Every input of a request at once, by name (one pass instead of a lookup per optional input)."""
    return {tensor.name(): tensor.as_numpy() for tensor in request.inputs()}


def wanted_outputs(request: Any) -> set[str] | None:
    """The outputs the caller asked for (a BLS names a few; an ensemble all it maps); None means all."""
    names = set(request.requested_output_names())
    return names or None


def get(request: Any, name: str) -> np.ndarray | None:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


def text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def output(name: str, array: np.ndarray) -> Any:
    return pb_utils.Tensor(name, array)


def error(message: str) -> Any:
    return pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(message))


def padded(rows: Sequence[Sequence[int]], fill: int) -> np.ndarray:
    """[len(rows), longest (at least 1)] int32: each row left-aligned, the rest `fill`."""
    out = np.full((len(rows), max([1, *map(len, rows)])), fill, dtype=np.int32)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return out


FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


# -- the reference LLM model's response plumbing ---------------------------------------------------------------


def request_id(request: Any) -> str:
    """The Triton request id ("" when the client sent none)."""
    try:
        return str(request.request_id() or "")
    except AttributeError:
        return ""


def cancelled_check(obj: Any) -> Any:
    """`obj.is_cancelled` (a request or a response sender) where this Triton has it, else None."""
    check = getattr(obj, "is_cancelled", None)
    return check if callable(check) else None


def to_response(outputs: dict[str, np.ndarray] | None, error_message: str | None) -> Any:
    """A pb_utils response: the outputs, an error, or neither (an empty response, as the C++ backend sends to
    acknowledge a stop command)."""
    if error_message is not None:
        return error(error_message)
    return pb_utils.InferenceResponse(output_tensors=[output(name, array) for name, array in (outputs or {}).items()])


def log_info(message: str) -> None:
    pb_utils.Logger.log_info(message)


def log_warn(message: str) -> None:
    pb_utils.Logger.log_warn(message)


def log_error(message: str) -> None:
    pb_utils.Logger.log_error(message)
