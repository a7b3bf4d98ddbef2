"""config.pbtxt text: filling the packaged templates, and reading configs back as Triton's `ModelConfig`.

Why strict: Triton reports an unfilled `${...}` in a number field as an opaque protobuf error at load time, and
one left in a string parameter is silently taken literally (triton-inference-server/tensorrtllm_backend
`docs/model_config.md` @c2e65b8; issues #210, #250). So a template variable
without a value is an error here, and every written config is parsed with the protobuf message Triton uses.
"""

from __future__ import annotations

import json
import re
import string
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from specbuild.errors import SpecbuildError

# parse_choices lived here until the tensorrt_llm model's engine moved to python_models.llm_engine: the model.py
# of a repository deployed before then imports it from here, so it stays importable (re-exported).
from specbuild.medusa.choices import format_choices, parse_choices  # noqa: F401

_PLACEHOLDER = re.compile(r"\$\{[^}]*\}")


def template_text(model: str) -> str:
    """The packaged config.pbtxt template of `model` (a directory under specbuild/triton_models)."""
    return resources.files("specbuild").joinpath("triton_models", model, "config.pbtxt").read_text(encoding="utf-8")


def fill(template: str, values: Mapping[str, object], *, where: str) -> str:
    """`template` with every `${name}` replaced; a name without a value is an error naming both."""
    try:
        text = string.Template(template).substitute({k: _text(v) for k, v in values.items()})
    except KeyError as err:
        raise SpecbuildError(f"{where}: template variable ${{{err.args[0]}}} has no value") from None
    except ValueError as err:
        raise SpecbuildError(f"{where}: malformed template ({err})") from None
    left = _PLACEHOLDER.findall(text)
    if left:
        raise SpecbuildError(f"{where}: unfilled template variables {sorted(set(left))}")
    return text


def _text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def parameters_text(parameters: Mapping[str, object]) -> str:
    """`parameters { key: ... value: { string_value: ... } }` lines (string values, JSON-escaped)."""
    lines = []
    for key, value in parameters.items():
        lines.append(f'parameters {{ key: "{key}" value: {{ string_value: {json.dumps(_text(value))} }} }}')
    return "\n".join(lines) + "\n"


def parse_config(text: str, *, where: str) -> Any:
    """Parse config.pbtxt text into tritonclient's `ModelConfig` message (what tritonserver parses)."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    left = _PLACEHOLDER.findall(text)
    if left:
        raise SpecbuildError(f"{where}: unfilled template variables {sorted(set(left))}")
    config = model_config_pb2.ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as err:
        raise SpecbuildError(f"{where}: not a valid Triton ModelConfig: {err}") from None
    return config


def read_config(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise SpecbuildError(f"{path}: cannot read ({err.strerror or err})") from None
    return parse_config(text, where=str(path))


def parameters(config: Any) -> dict[str, str]:
    """Every `parameters` entry's string value by key, as a python model reads them from its model config."""
    return {key: value.string_value for key, value in config.parameters.items()}


def read_model(model_dir: Path) -> tuple[dict[str, str], dict[str, Any]]:
    """A repository model's config.pbtxt as tritonserver hands it to the model: its parameters as strings, and
    the model config as a dict with the proto's field names (what `args["model_config"]` holds as JSON)."""
    from google.protobuf.json_format import MessageToDict

    config = read_config(model_dir / "config.pbtxt")
    return parameters(config), MessageToDict(config, preserving_proto_field_name=True)


def parameter(config: Any, key: str) -> str | None:
    """A `parameters` entry's string value, or None when the config does not set it."""
    if key in config.parameters:
        return config.parameters[key].string_value
    return None
