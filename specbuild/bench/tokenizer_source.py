"""Which tokenizer `specbuild bench` counts output tokens with, so that tokens/s are tokens for every endpoint.

The deployment carries its own: `specbuild deploy` copies the target's tokenizer into the repository and points
the `preprocessing` model's `tokenizer_dir` parameter at it, relative to that model's directory
(specbuild/deploy/layout.py). Triton's llmapi repository (build.flow: pytorch) has no preprocessing model: its
`tensorrt_llm/1/model.yaml` names the LLM-API `tokenizer`, or else the `model` whose tokenizer the LLM loads. So the
lookup is: `--tokenizer DIR` when given; else that parameter, read from `REPOSITORY/preprocessing/config.pbtxt`
(or model.yaml's tokenizer/model in an llmapi repository) when the repository is given, else asked of the server
(`/v2/models/preprocessing/config`, Triton's model-configuration extension) and used when it is a directory on this
machine. Without one, the bench counts whitespace-separated words and says so (`WordCounter`); a model's own
`num_output_tokens` is not used then, since a compared endpoint without it would be counted in another unit.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specbuild.bench.client import Generation, Protocol, _strip_scheme
from specbuild.bench.load import TokenCounter
from specbuild.errors import SpecbuildError
from specbuild.tokenizer import TOKENIZER_MARKERS, has_tokenizer

PREPROCESSING = "preprocessing"
TOKENIZER_PARAMETER = "tokenizer_dir"
LOOKUP_TIMEOUT_S = 10.0


class WordCounter(TokenCounter):
    """Counts whitespace-separated words for every endpoint, labelled as words."""

    def __init__(self, reason: str = "no tokenizer") -> None:
        super().__init__(None)
        self.source = "words"
        self.reason = reason

    def count(self, generation: Generation) -> tuple[int, str]:
        return len(generation.text.split()), "words"


@dataclass(frozen=True)
class TokenizerChoice:
    """The tokenizer directory to count with (None: count words) and how it was found, for the report."""

    directory: Path | None
    found_by: str

    def counter(self) -> TokenCounter:
        return TokenCounter(self.directory) if self.directory is not None else WordCounter(self.found_by)


def llmapi_tokenizer(model_yaml: Path) -> Path:
    """The tokenizer an llmapi repository's model.yaml names (`tokenizer`, else `model`, as the LLM API reads it);
    an error naming the file and key otherwise."""
    import yaml

    try:
        settings = yaml.safe_load(model_yaml.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as err:
        raise SpecbuildError(f"{model_yaml}: cannot read it ({err})", hint="give --tokenizer DIR") from None
    if not isinstance(settings, dict):
        settings = {}
    key = "tokenizer" if settings.get("tokenizer") else "model"
    value = settings.get(key)
    if not value:
        raise SpecbuildError(f"{model_yaml}: names no tokenizer or model", hint="give --tokenizer DIR")
    directory = Path(str(value))
    if not has_tokenizer(directory):
        raise SpecbuildError(f"{model_yaml}: {key} {str(value)!r} holds no tokenizer files on this machine "
                             f"({' / '.join(TOKENIZER_MARKERS)})", hint="give the tokenizer with --tokenizer DIR")
    return directory


def repository_tokenizer(repository: Path) -> Path:
    """The tokenizer directory `REPOSITORY/preprocessing/config.pbtxt` names (an llmapi repository: its model.yaml);
    an error naming the file otherwise."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    from specbuild.contracts.llm_api import LLMAPI_MODEL_YAML

    config_path = repository / PREPROCESSING / "config.pbtxt"
    if not config_path.exists() and (repository / LLMAPI_MODEL_YAML).is_file():
        return llmapi_tokenizer(repository / LLMAPI_MODEL_YAML)
    try:
        text = config_path.read_text(encoding="utf-8")
    except OSError as err:
        raise SpecbuildError(f"--repository {repository}: cannot read {config_path} ({err.strerror or err})",
                             hint="give the model repository `specbuild deploy` wrote, or --tokenizer DIR") from None
    config = model_config_pb2.ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as err:
        raise SpecbuildError(f"{config_path}: not a valid Triton ModelConfig: {err}") from None
    if TOKENIZER_PARAMETER not in config.parameters:
        raise SpecbuildError(f"{config_path}: no {TOKENIZER_PARAMETER} parameter",
                             hint="give the tokenizer with --tokenizer DIR")
    value = Path(config.parameters[TOKENIZER_PARAMETER].string_value)
    directory = value if value.is_absolute() else (config_path.parent / value).resolve()
    if not has_tokenizer(directory):
        raise SpecbuildError(f"{config_path}: {TOKENIZER_PARAMETER} {str(value)!r} ({directory}) holds no "
                             f"tokenizer files ({' / '.join(TOKENIZER_MARKERS)})",
                             hint="re-run `specbuild deploy SPEC`, or give --tokenizer DIR")
    return directory


def server_tokenizer_parameter(url: str, protocol: Protocol) -> str | None:
    """The `tokenizer_dir` of the server's preprocessing model, or None when it has none or cannot be asked."""
    try:
        config = _preprocessing_config(_strip_scheme(url), protocol)
    except Exception:  # no server, no preprocessing model: the bench itself says what is wrong with the URL
        return None
    value = (config.get("parameters") or {}).get(TOKENIZER_PARAMETER) or {}
    return value.get("string_value") or None


def _preprocessing_config(address: str, protocol: Protocol) -> dict[str, Any]:
    if protocol == "grpc":
        import tritonclient.grpc as grpcclient

        client = grpcclient.InferenceServerClient(address)
        try:
            return client.get_model_config(PREPROCESSING, as_json=True, client_timeout=LOOKUP_TIMEOUT_S)["config"]
        finally:
            client.close()
    import requests

    with requests.Session() as session:
        session.trust_env = False  # as LLMClient: talk to the server directly, not via http_proxy
        response = session.get(f"http://{address}/v2/models/{PREPROCESSING}/config", timeout=LOOKUP_TIMEOUT_S)
        response.raise_for_status()
        return response.json()


def choose_tokenizer(url: str, protocol: Protocol, *, tokenizer: Path | None = None,
                     repository: Path | None = None) -> TokenizerChoice:
    """The tokenizer to count output tokens with, found as the module docstring says."""
    if tokenizer is not None:
        return TokenizerChoice(tokenizer, f"--tokenizer {tokenizer}")
    if repository is not None:
        found = repository_tokenizer(repository)
        source = (repository / PREPROCESSING / "config.pbtxt").exists()
        return TokenizerChoice(found, f"{repository / PREPROCESSING / 'config.pbtxt'} {TOKENIZER_PARAMETER}" if source
                               else f"{repository} tensorrt_llm/1/model.yaml")
    if protocol == "openai":
        return TokenizerChoice(None, f"{url} is an OpenAI endpoint, whose tokenizer cannot be asked for")
    value = server_tokenizer_parameter(url, protocol)
    if value is None:
        return TokenizerChoice(None, f"{url} has no {PREPROCESSING} model with a {TOKENIZER_PARAMETER} parameter")
    if Path(value).is_absolute() and has_tokenizer(Path(value)):
        return TokenizerChoice(Path(value), f"{url} {PREPROCESSING} {TOKENIZER_PARAMETER}")
    return TokenizerChoice(None, f"{url}'s {PREPROCESSING} model names {TOKENIZER_PARAMETER} {value!r}, which is "
                                 "not a tokenizer directory on this machine (relative paths are relative to the "
                                 "server's repository): give --repository REPOSITORY or --tokenizer DIR")
