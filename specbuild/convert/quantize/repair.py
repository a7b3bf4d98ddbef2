"""Repairing what ModelOpt 0.47's `export_tensorrt_llm_checkpoint` writes its own way, and checking the result.

* Under transformers 5 the export drops `rotary_base` and `rotary_scaling`, and it writes a few fields its own
  way (GPT-2's activation and positions, a vocab padded to 64 for AWQ, a vocab-split embedding): the
  checkpoint's config.json is specbuild's own converter config for the same model, with ModelOpt's
  `quantization` block over the converter's defaults, after checking that both agree on every shape field
  (`repair_config`).
* The padded/split `vocab_embedding` and `lm_head` are put back into the unquantized converter's layout
  (`_relayout_vocab`), so draft and target keep the same vocabulary size.

The result passes the same coverage check as an unquantized conversion, extended by the scale tensors the
quant_algo needs, with exact dtypes (`expected_tensors`). Tensor names and layouts: ModelOpt 0.47.0
(NVIDIA/Model-Optimizer, `modelopt/torch/export/quant_utils.py`) and TensorRT-LLM's checkpoint format
(NVIDIA/TensorRT-LLM, `docs/source/legacy/architecture/checkpoint.md`).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save

from specbuild.convert.quantize.plan import LINEAR, QuantPlan
from specbuild.convert.request import ConversionPlan
from specbuild.convert.sharding import padded_vocab
from specbuild.dtypes import torch_dtype
from specbuild.errors import CheckpointError

# Shape fields on which ModelOpt's config and specbuild's must agree before specbuild's replaces it.
_SHAPE_FIELDS = ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "hidden_size", "head_size",
                 "intermediate_size")


def repair_config(modelopt_cfg: dict[str, Any], ours: dict[str, Any], where: str) -> dict[str, Any]:
    """specbuild's converter config (rotary fields, architecture, activation and positions as TensorRT-LLM's own
    converter writes them) with ModelOpt's quantization block over its defaults; refuses if the two disagree on
    a shape."""
    problems = [f"{key}: ModelOpt {modelopt_cfg.get(key)!r}, specbuild {ours.get(key)!r}"
                for key in _SHAPE_FIELDS if key in ours and modelopt_cfg.get(key) != ours[key]]
    if int(modelopt_cfg.get("vocab_size", 0)) < int(ours["vocab_size"]):
        problems.append(f"vocab_size: ModelOpt {modelopt_cfg.get('vocab_size')}, specbuild {ours['vocab_size']}")
    if problems:
        raise CheckpointError(f"{where}: ModelOpt's export disagrees with the model's config: " + "; ".join(problems))
    config = copy.deepcopy(ours)
    config["quantization"] = {**ours["quantization"], **(modelopt_cfg.get("quantization") or {})}
    return config


def _read(path: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(path), framework="pt") as fh:
        return {name: fh.get_tensor(name) for name in fh.keys()}  # noqa: SIM118 (not a dict)


def _relayout_vocab(stage: list[dict[str, torch.Tensor]], vocab: int, ours: list[dict[str, tuple[int, ...]]]) -> None:
    """ModelOpt pads the vocab to a multiple of 64 for AWQ and splits the embedding over TP ranks; put both
    tensors back as the unquantized converter writes them (full embedding; lm_head zero-padded to tp, split)."""
    tp = len(stage)
    for name in ("transformer.vocab_embedding.weight", "lm_head.weight"):
        if name not in stage[0] or all(tuple(r[name].shape) == s[name] for r, s in zip(stage, ours, strict=True)):
            continue
        pieces = [r[name] for r in stage]
        # A piece holding the whole vocab is a replica; smaller ones are TP splits along the vocab.
        full = (pieces[0] if pieces[0].shape[0] >= vocab else torch.cat(pieces))[:vocab]
        if name == "lm_head.weight":
            padded = torch.zeros(padded_vocab(vocab, tp), full.shape[1], dtype=full.dtype)
            padded[:vocab] = full
            parts = list(torch.chunk(padded, tp))
        else:
            parts = [full] * tp
        for r, part in zip(stage, parts, strict=True):
            r[name] = part.contiguous()


def expected_tensors(shapes: dict[str, tuple[int, ...]], quant: dict[str, Any], dtype: torch.dtype
                     ) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """The unquantized model definition of one rank, with each quantized linear weight's stored shape/dtype and
    the scale tensors its quant_algo needs (names and layout as ModelOpt 0.47.0's TensorRT-LLM export writes
    them, see the module docstring)."""
    f32 = torch.float32
    algo, kv, group = quant.get("quant_algo"), quant.get("kv_cache_quant_algo"), quant.get("group_size") or 128
    expected: dict[str, tuple[tuple[int, ...], torch.dtype]] = {}
    for name, shape in shapes.items():
        if not (algo and LINEAR.fullmatch(name)):
            expected[name] = (shape, dtype)
            continue
        base, (out, inp) = name[: -len("weight")], shape
        if algo == "FP8":
            expected[name] = (shape, torch.float8_e4m3fn)
            expected[base + "weights_scaling_factor"] = ((1,), f32)
            expected[base + "activation_scaling_factor"] = ((1,), f32)
        elif algo in ("W8A8_SQ_PER_CHANNEL", "W8A16"):
            expected[name] = (shape, torch.int8)
            expected[base + "weights_scaling_factor"] = ((out,), f32)
            if algo == "W8A8_SQ_PER_CHANNEL":
                expected[base + "activation_scaling_factor"] = ((1,), f32)
                expected[base + "prequant_scaling_factor"] = ((inp,), dtype)
        elif algo in ("W4A16_AWQ", "W4A8_AWQ"):
            expected[name] = ((out // 2, inp), torch.int8)  # two int4 rows per byte
            expected[base + "weights_scaling_factor"] = ((out, inp // group), f32)
            expected[base + "prequant_scaling_factor"] = ((inp,), dtype)
            if algo == "W4A8_AWQ":
                expected[base + "weights_scaling_factor_2"] = ((1,), f32)
                expected[base + "activation_scaling_factor"] = ((1,), f32)
        else:
            raise CheckpointError(f"quant_algo {algo!r} is not one specbuild writes")
    if kv:
        for name in shapes:
            if name.endswith(".attention.qkv.weight"):
                base = name[: -len("qkv.weight")]
                for scale in ("k_cache_scaling_factor", "v_cache_scaling_factor", "kv_cache_scaling_factor"):
                    expected[base + scale] = ((1,), f32)
    return expected


def coverage_problems(tensors: dict[str, torch.Tensor], expected: dict[str, tuple[tuple[int, ...], torch.dtype]]
                      ) -> list[str]:
    """Every expected tensor present with its shape and dtype, nothing else."""
    problems = []
    for name, (shape, dtype) in expected.items():
        tensor = tensors.get(name)
        if tensor is None:
            problems.append(f"tensor {name!r} is missing")
        elif tuple(tensor.shape) != shape or tensor.dtype != dtype:
            problems.append(f"tensor {name!r} is {tensor.dtype} {list(tensor.shape)}, expected {dtype} {list(shape)}")
    extra = sorted(set(tensors) - set(expected))
    if extra:
        problems.append(f"unexpected tensors: {', '.join(map(repr, extra[:5]))}" + (" ..." if len(extra) > 5 else ""))
    return problems


def repair_export(export_dir: Path, out: Path, plan: ConversionPlan, qplan: QuantPlan, tp: int, pp: int,
                  where: str) -> dict[str, Any]:
    """Rewrite ModelOpt's export in `export_dir` as the final checkpoint in `out`, checked; returns the config."""
    modelopt_cfg = json.loads((export_dir / "config.json").read_text())
    config = repair_config(modelopt_cfg, plan.arch.trtllm_config(qplan.dtype, tp, pp), where)
    quant = config["quantization"]
    if quant.get("quant_algo") != qplan.quant_algo or quant.get("kv_cache_quant_algo") != qplan.kv_algo:
        raise CheckpointError(
            f"{where}: ModelOpt exported quant_algo {quant.get('quant_algo')!r} / kv "
            f"{quant.get('kv_cache_quant_algo')!r}, expected {qplan.quant_algo!r} / {qplan.kv_algo!r}"
        )
    dtype = torch_dtype(qplan.dtype)
    for stage in range(pp):
        rank_plans = plan.rank_plans[stage * tp:(stage + 1) * tp]
        files = [export_dir / rp.filename for rp in rank_plans]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise CheckpointError(f"{where}: ModelOpt's export lacks {', '.join(missing)}")
        ranks = [_read(f) for f in files]
        _relayout_vocab(ranks, int(config["vocab_size"]), [rp.shapes for rp in rank_plans])
        for rp, tensors in zip(rank_plans, ranks, strict=True):
            problems = coverage_problems(tensors, expected_tensors(rp.shapes, quant, dtype))
            if problems:
                raise CheckpointError(
                    f"{where}: quantized {rp.filename} does not pass the coverage check for "
                    f"{quant.get('quant_algo')}:\n  - " + "\n  - ".join(problems)
                )
            # save() + write_bytes, not save_file: the file gets the umask's mode like every other output.
            (out / rp.filename).write_bytes(save(tensors, metadata={"format": "pt"}))
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return config
