"""ModelOpt's Hugging Face export of a quantized draft, the checkpoint TensorRT-LLM's PyTorch backend loads.

`build.flow: pytorch` has no TensorRT-LLM checkpoint: the LLM API loads Hugging Face directories, and reads a
ModelOpt quantization from the directory's `hf_quant_config.json` (NVIDIA/TensorRT-LLM
tensorrt_llm/_torch/model_config.py @195839a7, `ModelConfig.from_pretrained` -> `load_modelopt_quant_config`:
quantization.quant_algo, kv_cache_quant_algo, group_size, exclude_modules; config.json's `quantization_config` is
read only when that file is absent, and only for quant_method fp8 block scales or mxfp4). ModelOpt 0.47.0 writes
that file with `export_hf_checkpoint` (NVIDIA/Model-Optimizer modelopt/torch/export/unified_export_hf.py,
`_export_transformers_checkpoint` and `_write_hf_export_config`): the model's own tensor names, each quantized
linear's `weight` in the format's storage dtype beside `weight_scale` (and `input_scale`, `weight_scale_2`,
`pre_quant_scale` as the format needs), `k_proj.k_scale` / `v_proj.v_scale` for an FP8 KV cache, config.json with a
`quantization_config` (quant_method "modelopt"), and hf_quant_config.json `{"producer": {"name": "modelopt", ...},
"quantization": {...}}`. It runs on CPU for each format the PyTorch backend loads (fp8 with an FP8 KV cache, int8_wo,
int4_awq, w4a8_awq; measured with ModelOpt 0.47.0 on torch CPU on the demo Llama draft, int8_wo also on Qwen2 and
GPT-2), in a few seconds for the demo draft.

The export's unquantized tensors are put in the export dtype (`cast_unquantized`), and it is checked before it is
swapped in: the quantization block against the plan, every quantized linear stored quantized with its scale. tests/
hf_quant_schema.py holds the whole schema (files, fields, tensors) and checks exports against it.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import shutil
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save

from specbuild.contracts.quant_formats import HF_QUANT_CONFIG
from specbuild.convert.quantize.plan import QuantPlan
from specbuild.convert.request import ConversionPlan, ConvertRequest
from specbuild.dtypes import torch_dtype
from specbuild.errors import CheckpointError
from specbuild.tokenizer import TOKENIZER_OWN_FILES

if TYPE_CHECKING:
    from transformers import PreTrainedModel

PRODUCER = "modelopt"
STORED_DTYPES: dict[str, torch.dtype] = {
    "FP8": torch.float8_e4m3fn, "W8A16": torch.int8, "W4A16_AWQ": torch.uint8, "W4A8_AWQ": torch.uint8,
}
"""quant_algo -> the dtype export_hf_checkpoint stores a quantized linear's weight in (quant_utils.py
`to_quantized_weight`: fp8, int8 rounded, int4 packed two per byte by `pack_int4_in_uint8`), for the formats
TensorRT-LLM's PyTorch backend loads (contracts.quant_formats `Format.pytorch_linear`)."""


def quantized_linears(model: PreTrainedModel) -> list[str]:
    """The modules whose weight ModelOpt quantizes (an enabled weight quantizer): each must leave the export
    quantized."""
    names = []
    for name, module in model.named_modules():
        quantizer = getattr(module, "weight_quantizer", None)
        if quantizer is not None and getattr(quantizer, "is_enabled", False):
            names.append(name)
    return names


def export_hf(model: PreTrainedModel, out: Path) -> None:
    """ModelOpt's own Hugging Face export (mutates `model`: export a model only once).

    `dtype` is the model's own (float32 when calibrated on CPU, the export dtype on CUDA): ModelOpt rounds a weight
    to `dtype` before quantizing it, and its TensorRT-LLM export quantizes the weight as calibrated, so only then do
    both exports hold the same codes (measured on the demo draft: identical for fp8, int8_wo and int4 AWQ; with
    dtype=float16 from a float32 model 0.03-0.5 % of the codes land one step away). `cast_unquantized` then puts
    the rest in the export dtype."""
    from modelopt.torch.export import export_hf_checkpoint
    from transformers.utils import logging as hf_logging

    # ModelOpt prints, logs and warns per module, and save_pretrained shows a progress bar: the stage's own summary
    # says what was written.
    bar, verbosity = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    modelopt_log = logging.getLogger("modelopt")
    level = modelopt_log.level
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    modelopt_log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            export_hf_checkpoint(model, dtype=next(model.parameters()).dtype, export_dir=out)
    finally:
        modelopt_log.setLevel(level)
        hf_logging.set_verbosity(verbosity)
        if bar:
            hf_logging.enable_progress_bar()


_SAFETENSORS_DTYPES = {"F8_E4M3": torch.float8_e4m3fn, "I8": torch.int8, "U8": torch.uint8, "F16": torch.float16,
                       "BF16": torch.bfloat16, "F32": torch.float32}
"""safetensors' dtype names (its format specification) for the dtypes an export holds."""


def _headers(out: Path) -> dict[str, tuple[torch.dtype | str, tuple[int, ...]]]:
    """Every tensor's dtype and shape in the export's safetensors files (headers only, nothing loaded)."""
    found: dict[str, tuple[torch.dtype | str, tuple[int, ...]]] = {}
    for path in sorted(out.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as fh:
            for name in fh.keys():  # noqa: SIM118 (not a dict)
                piece = fh.get_slice(name)
                dtype = piece.get_dtype()
                found[name] = (_SAFETENSORS_DTYPES.get(dtype, dtype), tuple(piece.get_shape()))
    return found


def check_export(out: Path, qplan: QuantPlan, linears: list[str], where: str) -> dict[str, Any]:
    """One CheckpointError naming the file and field (or tensor) where the export is not what the plan asked for;
    returns config.json."""
    path = out / HF_QUANT_CONFIG
    try:
        written = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise CheckpointError(f"{where}: ModelOpt's export has no readable {HF_QUANT_CONFIG} ({err})") from None
    quant = written.get("quantization") or {}
    expected = {"quant_algo": qplan.quant_algo, "kv_cache_quant_algo": qplan.kv_algo}
    if qplan.group_size is not None:
        expected["group_size"] = qplan.group_size
    problems = [f"quantization.{key} is {quant.get(key)!r}, expected {value!r}"
                for key, value in expected.items() if quant.get(key) != value]
    if (written.get("producer") or {}).get("name") != PRODUCER:
        problems.append(f"producer.name is {(written.get('producer') or {}).get('name')!r}, expected {PRODUCER!r}")
    if problems:
        raise CheckpointError(f"{path}: " + "; ".join(problems))
    tensors = {name: dtype for name, (dtype, _) in _headers(out).items()}
    stored = STORED_DTYPES.get(qplan.quant_algo or "")
    bad = []
    for name in linears if stored is not None else ():
        dtype = tensors.get(f"{name}.weight")
        if dtype != stored or f"{name}.weight_scale" not in tensors:
            bad.append(f"{name}.weight is {dtype}" + ("" if f"{name}.weight_scale" in tensors else ", no weight_scale"))
    if bad:
        raise CheckpointError(f"{where}: ModelOpt's Hugging Face export left linears unquantized for "
                              f"{qplan.quant_algo} (expected {stored} with a weight_scale): " + "; ".join(bad[:5]))
    return json.loads((out / "config.json").read_text())


SCALE_SUFFIXES = ("weight_scale", "weight_scale_2", "input_scale", "k_scale", "v_scale")
"""Tensors ModelOpt writes in float32 whatever the model's dtype (unified_export_hf.py `_export_quantized_weight`,
quant_utils.py `postprocess_state_dict`), and TensorRT-LLM's linear methods read as such."""


def cast_unquantized(out: Path, dtype: str) -> None:
    """The export's unquantized tensors (embedding, norms, lm_head, AWQ's pre_quant_scale) and config.json's dtype in
    the export dtype, as a model loaded in that dtype exports them: ModelOpt writes them in the model's own dtype
    (measured, 0.47.0: even with dtype=float16 a float32 model keeps float32 norms and `"dtype": "float32"`), and
    specbuild calibrates in float32 on CPU (modelopt_calls.load_model). TensorRT-LLM's PyTorch backend builds the
    draft in config.json's dtype (half precision for its int4 GEMMs), and W4A8_AWQ_LinearMethod asserts that
    pre_quant_scale has it (linear.py @195839a7). Scales stay float32, as ModelOpt writes them."""
    target = torch_dtype(dtype)
    total = 0
    for path in sorted(out.glob("*.safetensors")):
        cast = {name: (t.to(target) if t.dtype == torch.float32 and not name.endswith(SCALE_SUFFIXES) else t)
                for name, t in load_file(path).items()}
        total += sum(t.numel() * t.element_size() for t in cast.values())
        # save() + write_bytes, not save_file: the file gets the umask's mode like every other output.
        path.write_bytes(save(cast, metadata={"format": "pt"}))
    index = out / "model.safetensors.index.json"  # a model over max_shard_size: the index's total_size follows
    if index.is_file():
        data = json.loads(index.read_text())
        data.setdefault("metadata", {})["total_size"] = total
        index.write_text(json.dumps(data, indent=2) + "\n")
    config_path = out / "config.json"
    config = json.loads(config_path.read_text())
    config["dtype"] = dtype
    config_path.write_text(json.dumps(config, indent=4) + "\n")


def write_hf_export(model: PreTrainedModel, request: ConvertRequest, plan: ConversionPlan, qplan: QuantPlan,
                    out: Path) -> dict[str, Any]:
    """Export the fake-quantized `model` into `out` (the atomic temporary directory), with the source's tokenizer
    files beside it, and check it; returns the written config.json."""
    del plan  # the Hugging Face export keeps the model's own layout: nothing of the TensorRT-LLM plan applies
    linears = quantized_linears(model)
    export_hf(model, out)
    del model  # the export mutated it
    cast_unquantized(out, qplan.dtype)
    for name in TOKENIZER_OWN_FILES:  # not config.json / generation_config.json: the export wrote its own
        if (request.source / name).is_file():
            shutil.copyfile(request.source / name, out / name)
    return check_export(out, qplan, linears, str(request.source))
