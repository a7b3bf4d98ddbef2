"""What later stages need to know about a converted checkpoint, read from its `config.json` alone.

This is the contract between `convert` and `build`/`deploy`: `convert` writes a TensorRT-LLM checkpoint
(`config.json` + `rank{N}.safetensors`), and `build` plans and validates from these facts, `deploy` checks its
engines against them. Only the config (and the rank files' sizes) is read, never tensors, so that `--dry-run` and
every check answer in well under a second even for a 70B checkpoint, and without importing torch.
Field names follow TensorRT-LLM 1.x's `PretrainedConfig` (NVIDIA/TensorRT-LLM
`tensorrt_llm/models/modeling_utils.py`: `mapping`, `quantization.quant_algo`, ...).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from specbuild import dtypes
from specbuild.manifest import changed_inputs


@dataclass(frozen=True)
class CheckpointFacts:
    """The fields of one TensorRT-LLM checkpoint that decide how it is built and what it costs."""

    role: str
    directory: Path
    architecture: str
    dtype: str
    vocab_size: int
    tp_size: int
    pp_size: int
    num_layers: int
    num_kv_heads: int
    head_size: int
    quant_algo: str | None = None
    kv_cache_quant_algo: str | None = None
    num_medusa_heads: int = 0
    max_draft_len: int = 0
    max_position_embeddings: int = 0
    """0 when the config does not say."""
    position_embedding_type: str = "learned_absolute"
    sliding_window: int | None = None
    """The attention window every layer uses (Mistral's `sliding_window`, kept by `convert`); None: full."""
    local_window: tuple[int, int] | None = None
    """Gemma's alternating attention, (window, p): layer l attends to the last `window` tokens when (l + 1) % p != 0
    and to every token otherwise (`sliding_window` and `_sliding_window_pattern` as TensorRT-LLM's Gemma checkpoint
    carries them, NVIDIA/TensorRT-LLM models/gemma/model.py @5dedf53b); then `sliding_window` is None."""
    weight_bytes: int = 0
    """Sum of the rank files' sizes: what the engine's weights occupy, spread over world_size GPUs."""

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size

    @property
    def rank_files(self) -> list[Path]:
        return [self.directory / f"rank{rank}.safetensors" for rank in range(self.world_size)]

    @property
    def files(self) -> list[Path]:
        """Every file the engine is built from: the inputs the manifest hashes."""
        return [self.directory / "config.json", *self.rank_files]

    def kv_bytes_per_token(self) -> int:
        """KV cache bytes per token over all layers and ranks (K and V, each kv_heads x head_size)."""
        if self.kv_cache_quant_algo in ("FP8", "INT8"):
            element = 1
        else:
            element = dtypes.dtype(self.dtype, where=f"{self.directory / 'config.json'}: dtype").itemsize
        return 2 * self.num_layers * self.num_kv_heads * self.head_size * element


def _int(config: dict[str, Any], name: str, default: int | None = None) -> int:
    """An integer field; a missing or null field takes `default` (an error when there is none)."""
    value = config.get(name)
    value = default if value is None else value
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"field {name!r} must be an integer (got {value!r})")
    return value


def _window(config: dict[str, Any]) -> int | None:
    value = config.get("sliding_window")
    if value is None:
        return None
    window = _int(config, "sliding_window")
    if window < 1:
        raise ValueError(f"field 'sliding_window' must be a positive number of tokens (got {window})")
    return window


def _windows(config: dict[str, Any]) -> tuple[int | None, tuple[int, int] | None]:
    """(every layer's window, Gemma's (window, pattern)): a `_sliding_window_pattern` makes the window local."""
    window = _window(config)
    if window is None or config.get("_sliding_window_pattern") is None:
        return window, None
    pattern = _int(config, "_sliding_window_pattern")
    if pattern < 1:
        raise ValueError(f"field '_sliding_window_pattern' must be a positive number of layers (got {pattern})")
    return None, (None if pattern == 1 else (window, pattern))


def facts_from_config(role: str, directory: Path, config: dict[str, Any], weight_bytes: int = 0) -> CheckpointFacts:
    """The facts of a checkpoint config that is not written yet (`specbuild validate` checks the configs `convert`
    would write); raises ValueError/KeyError like `read_checkpoint_facts` reports."""
    mapping = config.get("mapping") or {}
    quant = config.get("quantization") or {}
    hidden, heads = _int(config, "hidden_size"), _int(config, "num_attention_heads")
    sliding_window, local_window = _windows(config)
    return CheckpointFacts(
        role=role,
        directory=directory,
        architecture=str(config["architecture"]),
        dtype=str(config["dtype"]),
        vocab_size=_int(config, "vocab_size"),
        tp_size=_int(mapping, "tp_size", 1),
        pp_size=_int(mapping, "pp_size", 1),
        num_layers=_int(config, "num_hidden_layers"),
        num_kv_heads=_int(config, "num_key_value_heads", heads),
        head_size=_int(config, "head_size", hidden // heads),
        max_position_embeddings=_int(config, "max_position_embeddings", 0),
        position_embedding_type=str(config.get("position_embedding_type") or "learned_absolute"),
        quant_algo=quant.get("quant_algo"),
        kv_cache_quant_algo=quant.get("kv_cache_quant_algo"),
        num_medusa_heads=_int(config, "num_medusa_heads", 0),
        max_draft_len=_int(config, "max_draft_len", 0),
        sliding_window=sliding_window,
        local_window=local_window,
        weight_bytes=weight_bytes,
    )


def read_checkpoint_facts(role: str, directory: Path) -> tuple[CheckpointFacts | None, list[str]]:
    """The checkpoint's facts, or None and the reasons it cannot be built from (all of them)."""
    config_path = directory / "config.json"
    hint = "run `specbuild convert SPEC` first"
    if not config_path.is_file():
        return None, [f"{role} checkpoint {directory}: not converted yet (no config.json); {hint}"]
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
        if not isinstance(config, dict):
            raise ValueError("expected a JSON object")
        facts = facts_from_config(role, directory, config)
    except (OSError, UnicodeDecodeError, ValueError, KeyError) as err:
        what = f"required field {err} is missing" if isinstance(err, KeyError) else str(err)
        return None, [f"{role} checkpoint {config_path}: unreadable ({what}); {hint} again"]
    missing = [path.name for path in facts.rank_files if not path.is_file()]
    if missing:
        return None, [
            f"{role} checkpoint {directory}: {', '.join(missing)} missing (mapping says world_size "
            f"{facts.world_size}); {hint} again"
        ]
    stale = stale_conversion(role, directory)
    if stale is not None:
        return None, [f"{stale}; {hint} again"]
    size = sum(path.stat().st_size for path in facts.rank_files)
    return replace(facts, weight_bytes=size), []


def stale_conversion(role: str, directory: Path) -> str | None:
    """What says the `role` checkpoint in `directory` was converted from another model than its source holds now
    (the source changed since `convert` ran: a later stage would read the old weights), else None."""
    changed = changed_inputs(directory)
    if not changed:
        return None
    return f"{role} checkpoint {directory}: converted before {', '.join(changed)} changed"
