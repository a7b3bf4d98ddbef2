"""What `build` leaves in an engine directory and how later stages read it back.

This is the contract between `build` and `deploy`: `deploy` never looks at build plans, only at the
`engine.json` each engine directory carries, so a repository can be written for engines built elsewhere
(e.g. on a GPU machine) as long as this file is there.

Layout of `<output_dir>/engines/<role>/` (role: target, draft or medusa):
- tensorrt backend: what `trtllm-build` writes (`config.json`, `rank{N}.engine`), plus `build.log`.
- reference backend: `checkpoint/` (the converted TensorRT-LLM checkpoint: `config.json`,
  `rank{N}.safetensors`), loaded by the reference runtime (`specbuild.runtime.CausalLM.from_checkpoint`).
- both: `engine.json` (the `EngineInfo` below) and `manifest.json` (inputs' hashes, plan, tool versions).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from specbuild.errors import SpecbuildError
from specbuild.spec import PipelineSpec

ENGINE_INFO = "engine.json"
REFERENCE_CHECKPOINT = "checkpoint"

EngineBackend = Literal["tensorrt", "reference"]
EngineRole = Literal["target", "draft", "medusa"]
SpeculativeDecodingMode = Literal["none", "draft_tokens_external", "medusa", "lookahead_decoding"]

ENGINE_ROLES: dict[str, tuple[str, ...]] = {
    "none": ("target",),
    "draft_target": ("target", "draft"),
    "medusa": ("medusa",),
    "lookahead": ("target",),
}
"""Which engines a spec's `speculative.mode` needs; Medusa is one engine (base model + heads); Lookahead is the
target engine alone, built with room for the drafts it makes itself."""


def engine_roles(spec: PipelineSpec) -> tuple[str, ...]:
    return ENGINE_ROLES[spec.speculative.mode]


def engine_dir(spec: PipelineSpec, role: str) -> Path:
    """Where `build` writes the engine (or reference bundle) for `role`."""
    if role not in ("target", "draft", "medusa"):
        raise ValueError(f"unknown engine role {role!r}")
    return spec.output_dir / "engines" / role


@dataclass(frozen=True)
class EngineInfo:
    """The resolved limits and speculative settings of one built engine, as deploy and the runtime need them."""

    role: EngineRole
    backend: EngineBackend
    architecture: str
    dtype: str
    vocab_size: int
    tp_size: int
    pp_size: int
    max_batch_size: int
    max_input_len: int
    max_seq_len: int
    """Prompt + generated tokens (+ the draft length on a draft-target target engine)."""
    max_num_tokens: int
    speculative_decoding_mode: SpeculativeDecodingMode = "none"
    max_draft_len: int = 0
    medusa_choices: list[list[int]] | None = field(default=None, hash=False)
    lookahead_config: list[int] | None = field(default=None, hash=False)
    """[W, N, G] of a lookahead_decoding engine: the executor configuration its max_draft_len was computed from
    (`specbuild.contracts.lookahead`), which deploy writes as the tensorrt_llm model's lookahead parameters."""
    gather_generation_logits: bool = False
    gather_context_logits: bool = False
    quant_algo: str | None = None
    """The checkpoint's `quantization.quant_algo` (e.g. FP8, W4A16_AWQ); None when unquantized."""
    kv_cache_quant_algo: str | None = None
    """FP8 or INT8 when the KV cache is quantized."""
    max_attention_window_size: int | list[int] | None = field(default=None, hash=False)
    """The checkpoint's attention window (Mistral's sliding_window) where it is shorter than max_seq_len, or one
    period of Gemma's per-layer windows: what the runtime must be told (the tensorrt_llm model's
    `max_attention_window_size`); None: full attention."""

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any], path: Path) -> EngineInfo:
        try:
            return cls(**data)
        except TypeError as err:
            raise SpecbuildError(
                f"{path}: not an engine description this specbuild understands ({err})",
                hint="rebuild the engine with `specbuild build`",
            ) from None


def write_engine_info(directory: Path, info: EngineInfo) -> None:
    (directory / ENGINE_INFO).write_text(json.dumps(info.to_json(), indent=2) + "\n", encoding="utf-8")


def read_engine_info(directory: Path) -> EngineInfo:
    """The `engine.json` of a built engine directory; a clear error when the build never ran or failed."""
    path = directory / ENGINE_INFO
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SpecbuildError(
            f"{directory}: no built engine here ({ENGINE_INFO} is missing)",
            hint="run `specbuild build SPEC` first",
        ) from None
    except (OSError, json.JSONDecodeError) as err:
        raise SpecbuildError(f"{path}: unreadable ({err})", hint="rebuild it with `specbuild build SPEC`") from None
    if not isinstance(data, dict):
        raise SpecbuildError(f"{path}: expected a JSON object", hint="rebuild it with `specbuild build SPEC`")
    return EngineInfo.from_json(data, path)


def reference_checkpoint(directory: Path) -> Path:
    """The TensorRT-LLM checkpoint inside a reference bundle (what `CausalLM.from_checkpoint` loads)."""
    return directory / REFERENCE_CHECKPOINT
