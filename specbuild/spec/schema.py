"""The pipeline spec: one YAML file that says which checkpoints become which service.

Why so strict: every later stage (convert, build, deploy) trusts these values, and a mistake caught here costs
a second, where the same mistake caught by trtllm-build or tritonserver costs GPU minutes and an opaque log.
So unknown keys are errors, relative paths are resolved once against the spec file's directory, and every
problem is reported at once, each with its dotted field path and the file and line it comes from.

Model paths are *not* checked for existence here: `specbuild validate` (specbuild.convert.preflight) checks the
models, tokenizer, calibration text, Medusa heads and GPU against the spec without loading weights, and reports
those problems located in this file too (`PipelineSpec.problems_error`).
"""

from __future__ import annotations

import difflib
import json
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal, NoReturn, get_args

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    Strict,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails, PydanticCustomError
from rich.table import Table

from specbuild.atomic import stage_text
from specbuild.errors import SpecError
from specbuild.medusa.choices import MAX_MEDUSA_DEPTH, load_choices, medusa_tree_problems
from specbuild.runtime.schedule import schedule_problems

__all__ = [
    "MAX_DRAFT_TOKENS",
    "MAX_MEDUSA_DEPTH",
    "BuildSpec",
    "CalibSpec",
    "DeploySpec",
    "DraftSpec",
    "MedusaSpec",
    "ModelSource",
    "PipelineSpec",
    "QuantizationSpec",
    "SpecProblem",
    "SpecValidationError",
    "SpeculativeSpec",
    "TargetSpec",
    "load_spec",
    "medusa_preset_names",
    "medusa_tree_problems",
    "parse_spec",
    "starter_spec_text",
    "summarize_spec",
    "write_starter_spec",
]

Loc = tuple[str | int, ...]

MAX_DRAFT_TOKENS = 64
"""Upper bound for `speculative.num_draft_tokens` (K); TensorRT-LLM examples use 4-10."""
DEFAULT_MEDUSA_CHOICES = "mc_sim_7b_63"
"""The 63-node tree TensorRT-LLM's C++ runtime uses when none is given."""
ROLES = ("target", "draft", "medusa")

SpeculativeMode = Literal["none", "draft_target", "medusa"]
DType = Literal["auto", "float16", "bfloat16", "float32"]
Backend = Literal["auto", "tensorrt", "reference"]
QuantFormat = Literal["none", "fp8", "int8_sq", "int8_wo", "int4_awq", "w4a8_awq"]
KvCacheFormat = Literal["none", "fp8"]

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_PRESET_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_PACKAGE_DIR = Path(__file__).resolve().parents[1]  # specbuild/, above this package
_PRESET_DIRS_BUILTIN = (_PACKAGE_DIR / "data" / "medusa_choices",)  # shipped inside the package


# ----------------------------------------------------------------------------------------------------------
# Problems: how validators report several located errors through one pydantic error
# ----------------------------------------------------------------------------------------------------------

_Issue = tuple[Loc, str, Loc | None]
"""(location relative to the validated value, message, location to take the line from instead)."""


def _error(kind: str, message: str) -> PydanticCustomError:
    """A custom error whose message is taken literally (pydantic would otherwise format `{...}` in it)."""
    return PydanticCustomError(kind, "{message}", {"message": message})


def _raise_issues(issues: Sequence[_Issue]) -> NoReturn:
    """Raise several problems as one pydantic error; `_problems_from` unpacks them again with full paths."""
    summary = "; ".join(message for _, message, _ in issues)
    raise PydanticCustomError("spec_problems", "{summary}", {"summary": summary, "issues": tuple(issues)})


def _show(value: object) -> str:
    """A value as the user wrote it in YAML, short enough for a one-line message."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        text = json.dumps(value, default=str)
        return text if len(text) <= 40 else f"a list of {len(value)} items"
    return repr(value) if isinstance(value, str) else str(value)


def _format_loc(loc: Loc) -> str:
    """`("medusa", "choices", 3)` -> `medusa.choices[3]`."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


@dataclass(frozen=True)
class SpecProblem:
    """One thing wrong with a spec: where (field path, line) and what."""

    loc: Loc
    message: str
    line: int | None = None

    @property
    def field(self) -> str:
        return _format_loc(self.loc)

    def render(self, file: str) -> str:
        where = f"{file}:{self.line}" if self.line is not None else file
        return f"{where}: {self.field}: {self.message}" if self.loc else f"{where}: {self.message}"


class SpecValidationError(SpecError):
    """A spec with one or more problems; `problems` holds them for programs, the message for people."""

    def __init__(self, problems: Sequence[SpecProblem], file: str, *, hint: str | None = None) -> None:
        self.problems = list(problems)
        self.file = file
        lines = [problem.render(file) for problem in self.problems]
        if len(lines) == 1:
            message = lines[0]
        else:
            message = f"{file}: {len(lines)} problems\n" + "\n".join(f"  {line}" for line in lines)
        super().__init__(message, hint=hint)


# ----------------------------------------------------------------------------------------------------------
# Paths
# ----------------------------------------------------------------------------------------------------------


def _spec_path_from(context: object) -> Path | None:
    if isinstance(context, dict) and isinstance(context.get("spec_path"), Path):
        return context["spec_path"]
    return None


def _base_dir(context: object) -> Path:
    """Where relative paths start: the spec file's directory (the working directory for in-memory specs)."""
    spec_path = _spec_path_from(context)
    return spec_path.parent if spec_path is not None else Path.cwd()


def _resolve(value: Path, base: Path) -> Path:
    # normpath, not resolve(): keep the user's symlinks and do not touch the filesystem.
    return Path(os.path.normpath(base / value.expanduser()))


def _check_path_input(value: object) -> object:
    if isinstance(value, os.PathLike) or (isinstance(value, str) and value.strip()):
        return value
    raise _error("path_type", f"must be a non-empty path (got {_show(value)})")


def _resolve_path(value: Path, info: ValidationInfo) -> Path:
    """Anchor a relative path at the spec's directory, so the spec means the same from any working dir."""
    return _resolve(value, _base_dir(info.context))


SpecPath = Annotated[Path, BeforeValidator(_check_path_input), AfterValidator(_resolve_path)]
Count = Annotated[int, Strict(), Field(ge=1)]
Port = Annotated[int, Strict(), Field(ge=1, le=65535)]


# ----------------------------------------------------------------------------------------------------------
# Medusa trees
# ----------------------------------------------------------------------------------------------------------


def _as_paths(value: object) -> tuple[list[list[int]], list[_Issue]]:
    """Check the shape `list[list[int]]` strictly (no bools, no strings) and say where it is wrong."""
    if not isinstance(value, list):
        raise _error(
            "choices_type",
            "must be a preset name such as 'mc_sim_7b_63', a .json file, or a list of paths such as "
            f"[[0], [0, 0], [1]] (got {_show(value)})",
        )
    paths: list[list[int]] = []
    issues: list[_Issue] = []
    for index, entry in enumerate(value):
        if isinstance(entry, list) and all(type(item) is int for item in entry):
            paths.append(list(entry))
        else:
            issues.append(((index,), f"must be a list of integers such as [0, 1] (got {_show(entry)})", None))
    return paths, issues


def _preset_dirs(base_dir: Path) -> list[Path]:
    """Where preset names are looked up: next to the spec first, so a project can add or override trees."""
    dirs = [base_dir / "medusa_choices", *_PRESET_DIRS_BUILTIN]
    return list(dict.fromkeys(Path(os.path.normpath(d)) for d in dirs))


def medusa_preset_names(base_dir: Path | None = None) -> list[str]:
    """Names usable as `medusa.choices`, from the spec's `medusa_choices/` directory and the built-in ones."""
    dirs = _preset_dirs(base_dir if base_dir is not None else Path.cwd())
    return sorted({file.stem for folder in dirs if folder.is_dir() for file in folder.glob("*.json")})


def _find_preset(ref: str, base_dir: Path) -> Path:
    if ref.endswith(".json"):
        path = _resolve(Path(ref), base_dir)
        if path.is_file():
            return path
        raise _error("choices_file", f"tree file {path} does not exist")
    if _PRESET_RE.match(ref):
        for folder in _preset_dirs(base_dir):
            if (folder / f"{ref}.json").is_file():
                return folder / f"{ref}.json"
    known = ", ".join(medusa_preset_names(base_dir)) or "none found"
    raise _error(
        "choices_preset",
        f"unknown tree preset {ref!r} (known: {known}); or give a .json file or an explicit list",
    )


def _read_preset(path: Path) -> list[list[int]]:
    """A preset file, read and validated by the runtime's own loader so both accept the same files."""
    try:
        return load_choices(str(path))
    except ValueError as err:
        _raise_issues([((), str(err), None)])


def _load_choices(ref: str, base_dir: Path) -> tuple[list[list[int]], Path]:
    path = _find_preset(ref, base_dir)
    return _read_preset(path), path


# ----------------------------------------------------------------------------------------------------------
# The schema
# ----------------------------------------------------------------------------------------------------------


class _Section(BaseModel):
    """Every spec section rejects unknown keys: a misspelt key must not silently fall back to a default."""

    model_config = ConfigDict(extra="forbid")


class ModelSource(_Section):
    """A Hugging Face checkpoint directory."""

    model: SpecPath
    trust_remote_code: Annotated[bool, Strict()] = False
    """Off by default: it runs Python code shipped with the checkpoint. Turn on only for sources you trust."""


class TargetSpec(ModelSource):
    """The model whose output the service returns; the draft or Medusa heads only speed it up."""


class CalibSpec(_Section):
    """Calibration data for post-training quantization (ModelOpt needs activations to pick scales)."""

    source: Literal["builtin"] | Path = "builtin"
    """`builtin` (text shipped with Python), a UTF-8 text file, or a directory whose `*.txt` files are read in
    name order. Existence and content are checked by `convert`, which reads it."""
    size: Count = 64
    """Number of calibration samples."""
    seq_len: Count = 256
    """Tokens per sample."""

    @field_validator("source", mode="plain")
    @classmethod
    def _check_source(cls, value: object, info: ValidationInfo) -> Literal["builtin"] | Path:
        if value == "builtin":
            return "builtin"
        if isinstance(value, os.PathLike) or (isinstance(value, str) and value.strip()):
            return _resolve(Path(value), _base_dir(info.context))
        raise _error(
            "calib_source", f"must be 'builtin', a text file or a directory of .txt files (got {_show(value)})"
        )


class QuantizationSpec(_Section):
    """How the draft is quantized with ModelOpt before conversion; `none` keeps it in `build.dtype`."""

    format: QuantFormat = "none"
    kv_cache: KvCacheFormat = "none"
    calib: CalibSpec = Field(default_factory=CalibSpec)

    @property
    def enabled(self) -> bool:
        return self.format != "none" or self.kv_cache != "none"


class DraftSpec(ModelSource):
    """The small model that proposes tokens in `draft_target` mode; it must share the target's tokenizer."""

    quantization: QuantizationSpec = Field(default_factory=QuantizationSpec)


class MedusaSpec(_Section):
    """Medusa heads (FasterDecoding format) trained on top of the target, and the token tree they fill."""

    heads: SpecPath
    """Directory with `medusa_lm_head.safetensors` (or `.pt`) and its config.json."""
    choices: str | list[list[int]] = DEFAULT_MEDUSA_CHOICES
    """A preset name (built in: `specbuild/data/medusa_choices/<name>.json`, or `medusa_choices/` next to the
    spec), a path to a .json file, or an explicit list of top-k index paths."""

    _resolved: list[list[int]] = PrivateAttr(default_factory=list)
    _choices_file: Path | None = PrivateAttr(default=None)

    @field_validator("choices", mode="plain")
    @classmethod
    def _check_choices(cls, value: object, info: ValidationInfo) -> str | list[list[int]]:
        if isinstance(value, str):
            _load_choices(value, _base_dir(info.context))
            return value
        paths, issues = _as_paths(value)
        if not issues:  # the tree checks are only meaningful once every entry is a list of integers
            issues = [((), message, None) if index is None else ((index,), message, None)
                      for index, message in medusa_tree_problems(paths)]
        if issues:
            _raise_issues(issues)
        return paths

    @model_validator(mode="after")
    def _resolve_choices(self, info: ValidationInfo) -> MedusaSpec:
        if isinstance(self.choices, str):
            self._resolved, self._choices_file = _load_choices(self.choices, _base_dir(info.context))
        else:
            self._resolved, self._choices_file = [list(path) for path in self.choices], None
        return self

    def resolved_choices(self) -> list[list[int]]:
        """The tree as explicit paths (a fresh copy), whichever way `choices` named it."""
        return [list(path) for path in self._resolved]

    @property
    def choices_file(self) -> Path | None:
        """The preset file the tree came from, or None for an inline list."""
        return self._choices_file

    @property
    def depth(self) -> int:
        """Longest path: the engine needs at least this many Medusa heads."""
        return max((len(path) for path in self._resolved), default=0)


class SpeculativeSpec(_Section):
    """Which speculative-decoding algorithm the service runs."""

    mode: SpeculativeMode = "none"
    num_draft_tokens: Annotated[int, Strict(), Field(ge=1, le=MAX_DRAFT_TOKENS)] = 4
    """K, the tokens the draft proposes per step (draft_target only; the target engine's max_draft_len)."""
    max_draft_len: Annotated[int, Strict(), Field(ge=1, le=MAX_DRAFT_TOKENS)] | None = None
    """Draft tokens the engine can verify per step (trtllm-build --max_draft_len). Default: K (draft_target)
    or the tree's node count (medusa). More than that lets the service raise K later without a rebuild, at
    the cost of a bigger engine and KV cache; less is a build error."""
    use_draft_logits: Annotated[bool, Strict()] = False
    """draft_target: accept draft tokens by rejection sampling on the draft's and the target's logits instead
    of by token match; both engines are then built with --gather_generation_logits (TensorRT-LLM#2798)."""
    draft_len_schedule: dict[int, int] | None = None
    """Load-aware speculation, as TensorRT-LLM's `draft_len_schedule`: active sequences -> draft length, each
    entry from that many on ({1: 4, 4: 2, 8: 0}: K=4 alone, 2 from 4 sequences, none from 8). Must map 1 to the
    full length (num_draft_tokens; the tree's node count for medusa, whose tree then shrinks to its first K
    paths). `specbuild tune` measures and writes it. Default: the full length at any load."""
    max_concurrency: Annotated[int, Strict(), Field(ge=1)] | None = None
    """Speculation off above this many active sequences (TensorRT-LLM's `max_concurrency`). Default: never off."""

    @model_validator(mode="after")
    def _check_draft_settings(self) -> SpeculativeSpec:
        issues: list[_Issue] = []
        given = self.model_fields_set
        if self.use_draft_logits and self.mode != "draft_target":
            issues.append((("use_draft_logits",), f"only used in draft_target mode (mode is {self.mode!r})", None))
        if self.max_draft_len is not None and self.mode == "none":
            issues.append((("max_draft_len",), "only used with speculative decoding (mode is 'none')", None))
        elif self.max_draft_len is not None and self.mode == "draft_target" and (
            self.num_draft_tokens > self.max_draft_len
        ):
            line = ("num_draft_tokens",) if "num_draft_tokens" in given else ("max_draft_len",)
            issues.append((
                ("max_draft_len",),
                f"{self.max_draft_len} is less than num_draft_tokens ({self.num_draft_tokens}); the target engine "
                "would refuse every draft ('Number of draft tokens is larger than maximum number of draft tokens')",
                line,
            ))
        if self.draft_len_schedule is not None and self.mode == "none":
            issues.append((("draft_len_schedule",), "only used with speculative decoding (mode is 'none')", None))
        elif self.draft_len_schedule is not None and self.mode == "draft_target":
            issues += [(("draft_len_schedule",), problem, None)
                       for problem in schedule_problems(self.draft_len_schedule, self.num_draft_tokens)]
        if issues:
            _raise_issues(issues)
        return self


class BuildSpec(_Section):
    """Engine limits. They fix memory use, so the three max_* have no default (trtllm-build's batch 2048 is
    a trap)."""

    backend: Backend = "auto"
    """`tensorrt` runs trtllm-build (NVIDIA GPU + TensorRT-LLM); `reference` packages checkpoints for
    specbuild's PyTorch runtime; `auto` picks tensorrt where TensorRT-LLM is importable."""
    dtype: DType = "auto"
    tp_size: Count = 1
    pp_size: Count = 1
    max_batch_size: Count
    max_input_len: Count
    max_output_len: Count
    max_num_tokens: Count | None = None
    """Tokens one engine step processes across the batch (trtllm-build --max_num_tokens). Default: enough for a
    whole prompt and for batch x (draft length + 1) verification tokens, at most 8192 unless those need more."""
    gather_context_logits: Annotated[bool, Strict()] = False
    """Return prompt logits too (trtllm-build --gather_context_logits); TensorRT-LLM refuses it on an engine with
    a draft length, so only the plain target or a draft may use it."""
    gpu: Annotated[str, Strict(), Field(min_length=1)] | None = None
    """The GPU the engines are built for, e.g. H100, L40S, A100, or a compute capability such as '8.9'; checks
    that it runs the checkpoints' quantization (fp8 needs Ada/Hopper or newer). Default: the GPU nvidia-smi
    shows, when there is one."""
    gpu_memory_gb: Annotated[float, Field(gt=0)] | None = None
    """Memory of that GPU in GiB, the unit of NVIDIA's product names and nvidia-smi (80 for an "H100 80GB");
    `build` warns when weights + KV cache for the limits above would not fit.
    Default: the named GPU's memory, or what nvidia-smi shows."""

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size

    @property
    def max_seq_len(self) -> int:
        return self.max_input_len + self.max_output_len


class DeploySpec(_Section):
    """The Triton model repository and the server that serves it."""

    model_repository: SpecPath | None = None
    """Default `<output_dir>/model_repository`; always set after loading."""
    triton_max_batch_size: Count | None = None
    """Triton-side batch limit (`max_batch_size` in every config.pbtxt). Default `build.max_batch_size`."""
    decoupled: Annotated[bool, Strict()] = False
    """true: responses stream token by token (gRPC stream, /generate_stream); plain HTTP /infer and unary
    gRPC then refuse the model. TensorRT-LLM's own recipes keep draft-target models non-decoupled."""
    exclude_input_in_output: Annotated[bool, Strict()] = False
    """The LLM models' `exclude_input_in_output` parameter: false (the TensorRT-LLM backend's default) puts the
    prompt at the head of output_ids and of the ensemble's text_output; true returns the completion only. A
    request's own exclude_input_in_output input overrides it."""
    http_port: Port = 8000
    grpc_port: Port = 8001
    metrics_port: Port = 8002

    @model_validator(mode="after")
    def _distinct_ports(self) -> DeploySpec:
        ports = {"http_port": self.http_port, "grpc_port": self.grpc_port, "metrics_port": self.metrics_port}
        names = list(ports)
        issues: list[_Issue] = []
        for index, name in enumerate(names):
            for other in names[:index]:
                if ports[name] != ports[other]:
                    continue
                # Blame the port the user wrote, not the default it collides with.
                blamed, partner = (other, name) if name not in self.model_fields_set else (name, other)
                message = f"port {ports[name]} is also {partner}; tritonserver needs three distinct ports"
                issues.append(((blamed,), message, None))
        if issues:
            _raise_issues(issues)
        return self


class PipelineSpec(_Section):
    """A whole pipeline: sources, algorithm, engine limits and deployment, from one YAML file."""

    name: Annotated[str, Strict()]
    """Names the pipeline's directories; letters, digits, `.`, `_`, `-`."""
    output_dir: SpecPath = Path("build")
    """Where the stages write; default `build/<name>` next to the spec."""
    target: TargetSpec
    draft: DraftSpec | None = None
    medusa: MedusaSpec | None = None
    speculative: SpeculativeSpec = Field(default_factory=SpeculativeSpec)
    build: BuildSpec
    deploy: DeploySpec = Field(default_factory=DeploySpec)

    _path: Path | None = PrivateAttr(default=None)
    _lines: Any = PrivateAttr(default=None)  # the YAML's field -> line map (`line_of`)

    @model_validator(mode="before")
    @classmethod
    def _default_output_dir(cls, data: Any) -> Any:
        if isinstance(data, dict) and "output_dir" not in data and isinstance(data.get("name"), str):
            return {**data, "output_dir": str(Path("build") / data["name"])}
        return data

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if not _NAME_RE.match(value):
            raise _error(
                "name_pattern",
                f"must be 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit "
                f"(got {_show(value)})",
            )
        return value

    @model_validator(mode="after")
    def _check_pipeline(self, info: ValidationInfo) -> PipelineSpec:
        self._path = _spec_path_from(info.context)
        issues = _spec_mode_issues(self)
        if issues:
            _raise_issues(issues)
        if self.deploy.model_repository is None:
            self.deploy.model_repository = self.output_dir / "model_repository"
        if self.deploy.triton_max_batch_size is None:
            self.deploy.triton_max_batch_size = self.build.max_batch_size
        return self

    @property
    def path(self) -> Path:
        """The spec file this was loaded from (absolute)."""
        if self._path is None:
            # Not AttributeError: pydantic's __getattr__ would replace this message with a generic one.
            raise RuntimeError("this PipelineSpec was not loaded from a file; use load_spec or parse_spec")
        return self._path

    def line_of(self, loc: Loc) -> int | None:
        """The spec file's line for a field path (its nearest written parent when the key is not written)."""
        return self._lines.line_of(loc) if self._lines is not None else None

    def problems_error(self, problems: Sequence[tuple[Loc, str]], *, hint: str | None = None) -> SpecValidationError:
        """Problems found beyond the schema (by `specbuild validate`), located and rendered as the schema's are."""
        try:
            file = str(self.path)
        except RuntimeError:
            file = self.name
        located = [SpecProblem(loc, message, self.line_of(loc)) for loc, message in problems]
        return SpecValidationError(_sorted(located), file, hint=hint)

    def checkpoint_dir(self, role: str) -> Path:
        """Where `convert` writes the TensorRT-LLM checkpoint for `role` (target, draft or medusa)."""
        if role not in ROLES:
            raise ValueError(f"unknown checkpoint role {role!r}; expected one of {', '.join(ROLES)}")
        return self.output_dir / "checkpoints" / role

    @property
    def max_draft_len(self) -> int:
        """Draft tokens verified per step: K for draft_target, tree size for medusa, 0 without speculation."""
        if self.speculative.mode == "draft_target":
            return self.speculative.num_draft_tokens
        if self.speculative.mode == "medusa" and self.medusa is not None:
            return len(self.medusa.resolved_choices())
        return 0


def _mode_issues(mode: str, present: dict[str, bool], k_given: bool) -> Iterator[_Issue]:
    """Sections must match the mode: a missing one cannot work; an unused one would be silently ignored."""
    owner = {"draft": "draft_target", "medusa": "medusa"}
    for section, needed_by in owner.items():
        if mode == needed_by and not present[section]:
            yield (section,), f"required when speculative.mode is {mode!r}", ("speculative", "mode")
        elif present[section] and mode != needed_by:
            yield (
                (section,),
                f"given, but speculative.mode is {mode!r}, which does not use it "
                f"(remove it, or set speculative.mode: {needed_by})",
                None,
            )
    if mode != "draft_target" and k_given:
        yield (
            ("speculative", "num_draft_tokens"),
            f"only used in draft_target mode (mode is {mode!r}; a Medusa tree sets its own length)",
            None,
        )


def _spec_mode_issues(spec: PipelineSpec) -> list[_Issue]:
    present = {"draft": spec.draft is not None, "medusa": spec.medusa is not None}
    k_given = "num_draft_tokens" in spec.speculative.model_fields_set
    issues = list(_mode_issues(spec.speculative.mode, present, k_given))
    schedule = spec.speculative.draft_len_schedule
    if schedule is not None and spec.speculative.mode == "medusa" and spec.medusa is not None:
        choices = spec.medusa.resolved_choices()
        issues += [(("speculative", "draft_len_schedule"), f"{problem} (the Medusa tree's node count)", None)
                   for problem in schedule_problems(schedule, len(choices))]
        for length in sorted(set(schedule.values()) - {0}):
            if medusa_tree_problems(choices[:length]):
                issues.append((("speculative", "draft_len_schedule"),
                               f"the tree's first {length} paths are not a tree (a path before its prefix): order "
                               "medusa.choices so every leading slice is a tree, as the presets and tuned trees "
                               "are", None))
    return issues


def _raw_mode_issues(data: dict[str, Any]) -> list[_Issue]:
    """The mode checks on unvalidated data, so they are reported along with type errors elsewhere."""
    speculative = data.get("speculative")
    speculative = speculative if isinstance(speculative, dict) else {}
    mode = speculative.get("mode", "none")
    if mode not in get_args(SpeculativeMode):
        return []
    present = {section: data.get(section) is not None for section in ("draft", "medusa")}
    return list(_mode_issues(mode, present, "num_draft_tokens" in speculative))


# ----------------------------------------------------------------------------------------------------------
# Loading: YAML -> lines + data -> PipelineSpec, with located errors
# ----------------------------------------------------------------------------------------------------------


class _LineMap:
    """Field path -> 1-based line, from yaml's composed nodes; also finds duplicate keys."""

    def __init__(self, root: yaml.Node | None) -> None:
        self._lines: dict[Loc, int] = {}
        self.duplicates: list[SpecProblem] = []
        if root is not None:
            self._walk(root, ())

    def _walk(self, node: yaml.Node, loc: Loc) -> None:
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                if not isinstance(key_node, yaml.ScalarNode):
                    continue
                child = (*loc, key_node.value)
                line = key_node.start_mark.line + 1
                if child in self._lines:
                    self.duplicates.append(
                        SpecProblem(child, f"duplicate key (first on line {self._lines[child]})", line)
                    )
                self._lines[child] = line
                self._walk(value_node, child)
        elif isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                self._lines[(*loc, index)] = item.start_mark.line + 1
                self._walk(item, (*loc, index))

    def line_of(self, loc: Loc) -> int | None:
        """The line of the deepest part of `loc` the file has (a missing key points at its parent)."""
        for end in range(len(loc), 0, -1):
            if loc[:end] in self._lines:
                return self._lines[loc[:end]]
        return None


def _read_spec_text(path: Path, shown: str) -> str:
    hint = f"`specbuild init {shown}` writes a commented starter spec"
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(f"{shown}: no such file", hint=hint) from None
    except IsADirectoryError:
        raise SpecError(f"{shown}: is a directory, not a spec file") from None
    except UnicodeDecodeError as err:
        raise SpecError(f"{shown}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    except OSError as err:
        raise SpecError(f"{shown}: cannot read ({err.strerror})") from None


def _parse_yaml(text: str, shown: str) -> tuple[Any, _LineMap]:
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = f"{shown}:{mark.line + 1}" if mark is not None else shown
        what = " ".join(part for part in (err.context, err.problem) if part)
        raise SpecError(f"{where}: invalid YAML: {what}") from None
    except yaml.YAMLError as err:
        raise SpecError(f"{shown}: invalid YAML: {err}") from None
    finally:
        loader.dispose()
    return data, _LineMap(node)


def _model_at(loc: Loc) -> type[BaseModel] | None:
    """The schema class that validates the mapping at `loc`, for did-you-mean suggestions."""
    model: type[BaseModel] | None = PipelineSpec
    for part in loc:
        field = model.model_fields.get(part) if model is not None and isinstance(part, str) else None
        if field is None:
            return None
        candidates = [field.annotation, *get_args(field.annotation)]
        model = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
    return model


def _unknown_key(loc: Loc) -> str:
    model = _model_at(loc[:-1])
    known = list(model.model_fields) if model is not None else []
    close = difflib.get_close_matches(str(loc[-1]), known, n=1)
    if close:
        return f"unknown key (did you mean {close[0]!r}?)"
    return f"unknown key (expected one of: {', '.join(known)})" if known else "unknown key"


_TYPE_NAMES = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "string_type": "a string (quote it)",
    "model_type": "a mapping of keys to values",
    "model_attributes_type": "a mapping of keys to values",
    "dict_type": "a mapping of keys to values",
}
_OWN_MESSAGES = {
    "path_type", "choices_type", "choices_file", "choices_preset", "calib_source", "name_pattern"
}


def _describe(error: ErrorDetails) -> str:
    """A pydantic error as a short sentence in the spec's own terms."""
    kind, ctx, got = error["type"], error.get("ctx", {}), _show(error.get("input"))
    if kind in _OWN_MESSAGES:
        return error["msg"]
    if kind == "missing":
        return "required, but missing"
    if kind == "extra_forbidden":
        return _unknown_key(tuple(error["loc"]))
    if kind == "greater_than_equal":
        return f"must be >= {ctx['ge']} (got {got})"
    if kind == "less_than_equal":
        return f"must be <= {ctx['le']} (got {got})"
    if kind == "literal_error":
        return f"must be one of {ctx['expected']} (got {got})"
    if kind in _TYPE_NAMES:
        return f"must be {_TYPE_NAMES[kind]} (got {got})"
    message = error["msg"]
    return f"{message[:1].lower()}{message[1:]} (got {got})"


def _problems_from_issues(loc: Loc, issues: Sequence[_Issue], lines: _LineMap) -> list[SpecProblem]:
    return [
        SpecProblem((*loc, *rel), message, lines.line_of((*loc, *(rel if line_rel is None else line_rel))))
        for rel, message, line_rel in issues
    ]


def _problems_from(err: ValidationError, lines: _LineMap) -> list[SpecProblem]:
    problems = []
    for error in err.errors():
        loc = tuple(error["loc"])
        if error["type"] == "spec_problems":
            problems += _problems_from_issues(loc, error["ctx"]["issues"], lines)
        else:
            problems.append(SpecProblem(loc, _describe(error), lines.line_of(loc)))
    return problems


def _sorted(problems: list[SpecProblem]) -> list[SpecProblem]:
    return sorted(problems, key=lambda p: (p.line is None, p.line or 0, _format_loc(p.loc)))


def parse_spec(
    data: Any, spec_path: str | os.PathLike[str], *, _lines: _LineMap | None = None
) -> PipelineSpec:
    """Validate already-parsed spec data as if it came from `spec_path` (paths resolve against its dir)."""
    shown = os.fspath(spec_path)
    lines = _lines if _lines is not None else _LineMap(None)
    if not isinstance(data, dict):
        what = "empty" if data is None else f"a {type(data).__name__}"
        raise SpecValidationError(
            [SpecProblem((), f"the spec must be a mapping (name:, target:, build:, ...); it is {what}", 1)],
            shown,
            hint=f"`specbuild init {shown}` writes a commented starter spec",
        )
    problems = list(lines.duplicates)
    spec = None
    try:
        spec = PipelineSpec.model_validate(data, context={"spec_path": Path(os.path.abspath(spec_path))})
    except ValidationError as err:
        problems += _problems_from(err, lines)
        raw = _problems_from_issues((), _raw_mode_issues(data), lines)
        problems += [problem for problem in raw if problem not in problems]
    if problems or spec is None:
        unknown = any(p.message.startswith("unknown key") for p in problems)
        hint = "`specbuild init starter.yaml` writes a spec that explains every key" if unknown else None
        raise SpecValidationError(_sorted(problems), shown, hint=hint)
    spec._lines = lines
    return spec


def load_spec(path: str | os.PathLike[str]) -> PipelineSpec:
    """Read, validate and resolve a pipeline spec; raises SpecError listing every problem with its line."""
    shown = os.fspath(path)
    data, lines = _parse_yaml(_read_spec_text(Path(path), shown), shown)
    return parse_spec(data, path, _lines=lines)


# ----------------------------------------------------------------------------------------------------------
# Starter spec and summary
# ----------------------------------------------------------------------------------------------------------


def starter_spec_text() -> str:
    """The commented starter spec shipped in the package (templates/starter.yaml)."""
    template = resources.files("specbuild").joinpath("templates").joinpath("starter.yaml")
    return template.read_text(encoding="utf-8")


def write_starter_spec(path: str | os.PathLike[str], force: bool = False) -> Path:
    """Write the starter spec to `path`; never replaces an existing file unless `force`."""
    target = Path(path)
    if target.is_dir():
        raise SpecError(f"{target}: is a directory", hint=f"give a file, e.g. {target / 'pipeline.yaml'}")
    if target.exists() and not force:
        raise SpecError(f"{target}: already exists; not overwriting it", hint="pass --force to replace it")
    os.replace(stage_text(target, starter_spec_text()), target)  # never a truncated spec
    return target


def _model_row(source: ModelSource) -> str:
    return f"{source.model}" + ("  (trust_remote_code)" if source.trust_remote_code else "")


def _speculation_rows(spec: PipelineSpec) -> Iterator[tuple[str, str]]:
    if spec.draft is not None:
        quant = spec.draft.quantization
        yield "draft", _model_row(spec.draft)
        if quant.enabled:
            calib = quant.calib
            yield "draft quantization", (
                f"{quant.format}, kv cache {quant.kv_cache}; calib {calib.source} "
                f"({calib.size} x {calib.seq_len} tokens)"
            )
        yield "draft tokens (K)", str(spec.speculative.num_draft_tokens)
    if spec.medusa is not None:
        tree = spec.medusa.resolved_choices()
        origin = spec.medusa.choices if isinstance(spec.medusa.choices, str) else "inline list"
        yield "medusa heads", str(spec.medusa.heads)
        yield "medusa tree", f"{origin}: {len(tree)} nodes, depth {spec.medusa.depth}"


def summarize_spec(spec: PipelineSpec) -> Table:
    """What a spec resolves to (absolute paths, filled-in defaults), for `specbuild validate`."""
    build, deploy = spec.build, spec.deploy
    table = Table(title=f"{spec.name}  ({spec.path})", header_style="bold", title_justify="left")
    table.add_column("setting", style="cyan", no_wrap=True)
    table.add_column("value", overflow="fold")
    rows: list[tuple[str, str]] = [
        ("mode", spec.speculative.mode),
        ("target", _model_row(spec.target)),
        *_speculation_rows(spec),
        ("backend", build.backend),
        ("dtype", build.dtype),
        ("parallelism", f"tp {build.tp_size} x pp {build.pp_size} = {build.world_size} rank(s)"),
        ("max batch", str(build.max_batch_size)),
        ("max tokens", f"input {build.max_input_len}, output {build.max_output_len}"),
        ("output_dir", str(spec.output_dir)),
        ("model repository", str(deploy.model_repository)),
        ("triton batch", str(deploy.triton_max_batch_size)),
        ("responses", "streamed (decoupled)" if deploy.decoupled else "one per request"),
        ("ports", f"http {deploy.http_port}, grpc {deploy.grpc_port}, metrics {deploy.metrics_port}"),
    ]
    for key, value in rows:
        table.add_row(key, value)
    return table
