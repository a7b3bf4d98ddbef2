"""Read a TensorRT-LLM checkpoint's rank files back into full (unsharded) tensors, written from the format's
documentation.

The rules come from NVIDIA/TensorRT-LLM 1.x (the checkpoint layout of tensorrt_llm/models/modeling_utils.py and
docs/source/legacy/architecture/checkpoint.md, commit 28a1217a; the splits of tensorrt_llm/models/llama/convert.py,
commit 04a2cacb, and models/convert_utils.py; the Medusa heads of models/medusa/weight.py), not from
`specbuild.convert` (nothing is imported from it), so that loading a converted checkpoint is an independent check of
the converter: rank = pp_rank * tp_size + tp_rank; PP stages hold contiguous layer ranges (`torch.tensor_split`)
under local indices; per rank the fused QKV is `[q_r; k_r; v_r]`, with KV heads repeated tp/num_kv times when there
are fewer KV heads than ranks; `attention.dense` and `mlp.proj` are split on dim 1, `mlp.fc`/`mlp.gate` (weight
and bias), `lm_head` and the Medusa heads on dim 0; the lm_head is zero-padded to a multiple of tp. The config
is parsed by `specbuild.runtime.config`.

The families of issue 49: q/k norms (`attention.q_layernorm`/`k_layernorm`, [head_size]) and Gemma's
`pre_feedforward_layernorm`/`post_feedforward_layernorm` are replicated on every rank; an MoE layer's router is
replicated (its RowLinear has tp_size 1), its experts split as `_merge_experts` says (tensorrt_llm/layers/moe.py
@03961722, mapping.py). A fused gated fc (hidden_act swiglu/geglu: Phi-3's `mlp.fc` [up; gate], TensorRT-LLM's
models/phi3/convert.py @89fd9b74 "swap the halves") is held by each rank as [up_r; gate_r], so that each rank's
swiglu pairs its own rows: specbuild's converter writes that (TensorRT-LLM 1.2's split_weights_tp @7dfda15a would
cut [up; gate] in contiguous pieces, which a per-rank swiglu cannot use; see the Phi-3 converter).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from specbuild.runtime.config import FUSED_GATED, ModelConfig, RuntimeCheckpointError, read_config
from specbuild.runtime.dequantize import QuantizedCheckpointError, dequantize_rank


# -- expected tensors ----------------------------------------------------------------------------------------------
def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every full (merged, unpadded) tensor the model needs, with its shape."""
    h, q_rows, kv_rows = cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    inter, gpt2 = cfg.intermediate_size, cfg.family == "gpt2"
    fused_gated = cfg.hidden_act in FUSED_GATED  # one fc holding [x; gate] (Phi-3, MoE experts)
    shapes: dict[str, tuple[int, ...]] = {"transformer.vocab_embedding.weight": (cfg.vocab_size, h)}
    if gpt2:
        shapes["transformer.position_embedding.weight"] = (cfg.max_position_embeddings, h)
    for layer in range(cfg.num_layers):
        p = f"transformer.layers.{layer}."
        for norm in ("input_layernorm", "post_layernorm"):
            shapes[p + f"{norm}.weight"] = (h,)
            if gpt2:
                shapes[p + f"{norm}.bias"] = (h,)
        shapes[p + "attention.qkv.weight"] = (q_rows + 2 * kv_rows, h)
        if cfg.qkv_bias:
            shapes[p + "attention.qkv.bias"] = (q_rows + 2 * kv_rows,)
        shapes[p + "attention.dense.weight"] = (h, q_rows)
        if cfg.dense_bias:
            shapes[p + "attention.dense.bias"] = (h,)
        if cfg.qk_norm:
            shapes[p + "attention.q_layernorm.weight"] = (cfg.head_dim,)
            shapes[p + "attention.k_layernorm.weight"] = (cfg.head_dim,)
        if cfg.inter_layernorms:
            shapes[p + "pre_feedforward_layernorm.weight"] = (h,)
            shapes[p + "post_feedforward_layernorm.weight"] = (h,)
        if cfg.moe_num_experts:
            # MixtureOfExperts (tensorrt_llm/layers/moe.py @03961722): a float32 router [experts, hidden], every
            # expert's fc [up; gate] as one [experts, 2 * inter, hidden] tensor, proj [experts, hidden, inter].
            experts, moe_inter = cfg.moe_num_experts, cfg.moe_intermediate_size
            shapes[p + "mlp.router.weight"] = (experts, h)
            shapes[p + "mlp.fc.weight"] = (experts, (2 if fused_gated else 1) * moe_inter, h)
            shapes[p + "mlp.proj.weight"] = (experts, h, moe_inter)
            continue
        mlp = (("fc", (inter, h)), ("proj", (h, inter))) if gpt2 else (
            ("fc", (2 * inter, h)), ("proj", (h, inter))) if fused_gated else (
            ("fc", (inter, h)), ("gate", (inter, h)), ("proj", (h, inter)))
        for name, shape in mlp:
            shapes[p + f"mlp.{name}.weight"] = shape
            if cfg.mlp_bias:
                shapes[p + f"mlp.{name}.bias"] = shape[:1]
    shapes["transformer.ln_f.weight"] = (h,)
    if gpt2:
        shapes["transformer.ln_f.bias"] = (h,)
    shapes["lm_head.weight"] = (cfg.vocab_size, h)
    for head in range(cfg.num_medusa_heads):
        p = f"medusa_heads.{head}."
        for layer in range(cfg.num_medusa_layers):
            shapes[p + f"medusa_layers.{layer}.linear.weight"] = (h, h)
            shapes[p + f"medusa_layers.{layer}.linear.bias"] = (h,)
        shapes[p + "lm_head.weight"] = (cfg.vocab_size, h)
    return shapes


# -- merging TP shards ---------------------------------------------------------------------------------------------
_LAYER = re.compile(r"transformer\.layers\.(\d+)\.(.+)")
# A row-parallel linear's pre-quant scale multiplies its (split) input, so it is split like the input.
_ROW_PARALLEL = ("attention.dense.weight", "mlp.proj.weight")
_ROW_PARALLEL_INPUT = ("attention.dense.prequant_scaling_factor", "mlp.proj.prequant_scaling_factor")
_COLUMN_PARALLEL = ("mlp.fc.weight", "mlp.fc.bias", "mlp.gate.weight", "mlp.gate.bias")
_MEDUSA = re.compile(r"medusa_heads\.\d+\.(medusa_layers\.\d+\.linear\.(weight|bias)|lm_head\.weight)")


def _split_dim(name: str, cfg: ModelConfig) -> int | None:
    """The dim a tensor is TP-split on (None: replicated on every rank). QKV is handled separately."""
    match = _LAYER.fullmatch(name)
    suffix = match.group(2) if match else name
    if suffix in _ROW_PARALLEL:
        return 1
    if suffix in _ROW_PARALLEL_INPUT:
        return 0
    if suffix in _COLUMN_PARALLEL or name == "lm_head.weight" or _MEDUSA.fullmatch(name):
        return 0
    if name == "transformer.vocab_embedding.weight" and cfg.use_parallel_embedding:
        return cfg.embedding_sharding_dim
    return None


def _dedup_kv(x: torch.Tensor, cfg: ModelConfig, name: str, files: list[Path]) -> torch.Tensor:
    """Undo the converter's KV-head repetition (kv < tp): the tp/kv consecutive copies must be identical."""
    kv, tp, hd = cfg.num_kv_heads, cfg.tp_size, cfg.head_dim
    if kv >= tp:
        return x
    copies = x.reshape(kv, tp // kv, hd, *x.shape[1:])
    if not all(torch.equal(copies[:, 0], copies[:, r]) for r in range(1, tp // kv)):
        raise RuntimeCheckpointError(
            f"{files[0].parent}: {name}: the repeated copies of KV heads differ across ranks "
            f"{', '.join(f.name for f in files)} (num_key_value_heads {kv} < tp_size {tp})"
        )
    return copies[:, 0].reshape(kv * hd, *x.shape[1:])


def _merge_qkv(name: str, parts: list[torch.Tensor], cfg: ModelConfig, files: list[Path]) -> torch.Tensor:
    tp = cfg.tp_size
    q_rows = cfg.num_heads // tp * cfg.head_dim
    kv_rows = max(cfg.num_kv_heads, tp) // tp * cfg.head_dim
    for part, file in zip(parts, files, strict=True):
        if part.shape[0] != q_rows + 2 * kv_rows:
            raise RuntimeCheckpointError(
                f"{file}: tensor {name!r} has {part.shape[0]} rows, expected {q_rows + 2 * kv_rows} "
                f"(({cfg.num_heads} + 2 * {max(cfg.num_kv_heads, tp)}) heads * head_size {cfg.head_dim} / tp {tp})"
            )
    qs, ks, vs = zip(*(torch.split(p, [q_rows, kv_rows, kv_rows]) for p in parts), strict=True)
    k = _dedup_kv(torch.cat(ks), cfg, name, files)
    v = _dedup_kv(torch.cat(vs), cfg, name, files)
    return torch.cat([torch.cat(qs), k, v])


def _merge_halves(parts: list[torch.Tensor], dim: int) -> torch.Tensor:
    """A fused gated fc whose every rank holds [x_r; gate_r]: [x; gate] again."""
    xs, gates = zip(*(p.chunk(2, dim=dim) for p in parts), strict=True)
    return torch.cat([*xs, *gates], dim=dim)


def _merge_experts(name: str, parts: list[torch.Tensor], cfg: ModelConfig) -> torch.Tensor:
    """An MoE layer's fc or proj from its ranks. TensorRT-LLM's Mapping numbers rank t's expert shard
    moe_tp_rank = t // moe_ep_size, moe_ep_rank = t % moe_ep_size (tensorrt_llm/mapping.py); each EP rank holds
    num_experts / moe_ep_size whole experts, each TP rank the rows of every one of them: fc's up and gate halves
    each split over moe_tp_size ([up_r; gate_r] per rank), proj split on its input (dim 2)."""
    ep, tp = cfg.moe_ep_size, cfg.moe_tp_size
    groups = []
    for ep_rank in range(ep):
        shards = [parts[tp_rank * ep + ep_rank] for tp_rank in range(tp)]
        if name.endswith("mlp.proj.weight"):
            groups.append(torch.cat(shards, dim=2))
        else:
            groups.append(_merge_halves(shards, 1) if cfg.hidden_act in FUSED_GATED else torch.cat(shards, dim=1))
    return torch.cat(groups, dim=0)


def _merge_tp(name: str, parts: list[torch.Tensor], cfg: ModelConfig, files: list[Path]) -> torch.Tensor:
    """One tensor of one PP stage from its TP ranks."""
    if len(parts) == 1:
        return parts[0]
    if ".attention.qkv." in name and name.endswith((".weight", ".bias")):  # not its (replicated) scales
        return _merge_qkv(name, parts, cfg, files)
    if cfg.moe_num_experts and name.endswith(("mlp.fc.weight", "mlp.proj.weight")) and parts[0].dim() == 3:
        return _merge_experts(name, parts, cfg)
    if cfg.hidden_act in FUSED_GATED and name.endswith(("mlp.fc.weight", "mlp.fc.bias")):
        return _merge_halves(parts, 0)  # Phi-3: each rank's [up_r; gate_r] (see the module docstring)
    dim = _split_dim(name, cfg)
    shapes = {tuple(p.shape) for p in parts}
    if len(shapes) != 1:
        found = ", ".join(f"{f.name}: {tuple(p.shape)}" for f, p in zip(files, parts, strict=True))
        raise RuntimeCheckpointError(f"{files[0].parent}: tensor {name!r} has different shapes across ranks ({found})")
    if dim is not None:
        return torch.cat(parts, dim=dim)
    for part, file in zip(parts[1:], files[1:], strict=True):
        if not torch.equal(parts[0], part):
            raise RuntimeCheckpointError(
                f"{file}: tensor {name!r} should be replicated on every TP rank but differs from {files[0].name}"
            )
    return parts[0]


def _drop_vocab_padding(tensors: dict[str, torch.Tensor], cfg: ModelConfig) -> None:
    """The lm_head (and a vocab-sharded embedding) are zero-padded to a multiple of tp before splitting."""
    names = ["lm_head.weight", *(f"medusa_heads.{h}.lm_head.weight" for h in range(cfg.num_medusa_heads))]
    if cfg.use_parallel_embedding and cfg.embedding_sharding_dim == 0:
        names.append("transformer.vocab_embedding.weight")
    padded = -(-cfg.vocab_size // cfg.tp_size) * cfg.tp_size
    for name in names:
        tensor = tensors.get(name)
        if tensor is not None and tensor.dim() == 2 and tensor.shape[0] == padded:
            tensors[name] = tensor[: cfg.vocab_size]


# -- reading rank files --------------------------------------------------------------------------------------------
RankHook = Callable[[dict[str, torch.Tensor], Path], dict[str, torch.Tensor]]


def _no_quantization(tensors: dict[str, torch.Tensor], path: Path) -> dict[str, torch.Tensor]:
    return tensors


def dequantize_hook(config: dict[str, Any]) -> RankHook:
    """What turns one rank's stored tensors into plain weights before merging (scales are per rank, so this
    runs per rank file). Unquantized checkpoints pass through; `_check_supported` already refused what
    `runtime.dequantize` cannot read."""
    quant = config.get("quantization") or {}
    if quant.get("quant_algo") is None and quant.get("kv_cache_quant_algo") is None:
        return _no_quantization

    def hook(tensors: dict[str, torch.Tensor], path: Path) -> dict[str, torch.Tensor]:
        try:
            return dequantize_rank(tensors, path, quant)
        except QuantizedCheckpointError as err:
            raise RuntimeCheckpointError(err.message, hint=err.hint) from err

    return hook


def _read_rank(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise RuntimeCheckpointError(
            f"{path}: rank file is missing",
            hint="config.json's mapping says how many rank files there are (world_size = tp_size * pp_size)",
        )
    try:
        with safe_open(str(path), framework="pt") as fh:
            return {name: fh.get_tensor(name) for name in fh.keys()}  # noqa: SIM118
    except (OSError, SafetensorError) as err:
        raise RuntimeCheckpointError(f"{path}: cannot read safetensors file: {err}") from err


def stage_layers(num_layers: int, pp_size: int) -> list[list[int]]:
    """Global layer indices held by each PP stage (the first `num_layers % pp` stages get one more)."""
    return [chunk.tolist() for chunk in torch.tensor_split(torch.arange(num_layers), pp_size)]


def _globalize(name: str, layers: list[int], file: Path) -> str:
    match = _LAYER.fullmatch(name)
    if not match:
        return name
    local = int(match.group(1))
    if local >= len(layers):
        raise RuntimeCheckpointError(
            f"{file}: tensor {name!r} has local layer index {local}, but this pipeline stage holds "
            f"{len(layers)} layers"
        )
    return f"transformer.layers.{layers[local]}.{match.group(2)}"


def _load_stage(directory: Path, stage: int, layers: list[int], cfg: ModelConfig, hook: RankHook
                ) -> dict[str, torch.Tensor]:
    files = [directory / f"rank{stage * cfg.tp_size + t}.safetensors" for t in range(cfg.tp_size)]
    ranks = [hook(_read_rank(f), f) for f in files]
    for file, tensors in zip(files[1:], ranks[1:], strict=True):
        if set(tensors) != set(ranks[0]):
            diff = sorted(set(tensors) ^ set(ranks[0]))
            raise RuntimeCheckpointError(
                f"{file}: holds different tensor names than {files[0].name} (e.g. {diff[0]!r})"
            )
    return {
        _globalize(name, layers, files[0]): _merge_tp(name, [r[name] for r in ranks], cfg, files)
        for name in ranks[0]
    }


def _check_complete(tensors: dict[str, torch.Tensor], cfg: ModelConfig, directory: Path) -> None:
    expected = expected_shapes(cfg)
    if "lm_head.weight" not in tensors and "transformer.vocab_embedding.weight" in tensors:
        # TensorRT-LLM accepts a missing lm_head when the embedding is shared (`PretrainedModel.load`,
        # NVIDIA/TensorRT-LLM 1.x tensorrt_llm/models/modeling_utils.py).
        tensors["lm_head.weight"] = tensors["transformer.vocab_embedding.weight"]
    missing = [name for name in expected if name not in tensors]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise RuntimeCheckpointError(
            f"{directory}: tensor {missing[0]!r} is missing from the rank files{more}",
            hint=f"config.json describes {cfg.architecture} with {cfg.num_layers} layers, "
            f"tp_size {cfg.tp_size}, pp_size {cfg.pp_size}",
        )
    for name, shape in expected.items():
        if tuple(tensors[name].shape) != shape:
            raise RuntimeCheckpointError(
                f"{directory}: tensor {name!r} has merged shape {tuple(tensors[name].shape)}, but config.json "
                f"implies {shape}"
            )


# -- public API ----------------------------------------------------------------------------------------------------
@dataclass
class LoadedCheckpoint:
    """A checkpoint's config and its full tensors (TP merged, PP merged, global layer indices, unpadded)."""

    directory: Path
    config: dict[str, Any]
    tensors: dict[str, torch.Tensor]

    @property
    def model_config(self) -> ModelConfig:
        return ModelConfig.from_dict(self.config, self.directory / "config.json")


def load_checkpoint(directory: Path, *, dtype: torch.dtype | None = None) -> LoadedCheckpoint:
    """Load every rank file of a TensorRT-LLM checkpoint and merge it into the tp=1, pp=1 tensor set.

    `dtype` casts every tensor (None keeps the stored dtype)."""
    directory = Path(directory)
    config = read_config(directory)
    cfg = ModelConfig.from_dict(config, directory / "config.json")
    hook = dequantize_hook(config)
    tensors: dict[str, torch.Tensor] = {}
    for stage, layers in enumerate(stage_layers(cfg.num_layers, cfg.pp_size)):
        for name, tensor in _load_stage(directory, stage, layers, cfg, hook).items():
            if name in tensors and not torch.equal(tensors[name], tensor):
                raise RuntimeCheckpointError(f"{directory}: tensor {name!r} differs between pipeline stages")
            tensors[name] = tensor
    _drop_vocab_padding(tensors, cfg)
    _check_complete(tensors, cfg, directory)
    if dtype is not None:
        tensors = {name: t.to(dtype) for name, t in tensors.items()}
    return LoadedCheckpoint(directory, config, tensors)
