"""The draft quantization formats: one table read by the spec (which names it accepts), convert (which ModelOpt
preset it runs) and build/deploy (which `quant_algo` the checkpoint and engine must then carry).

Sources: the preset names are module attributes of `modelopt.torch.quantization` (ModelOpt 0.47.0,
NVIDIA/Model-Optimizer `modelopt/torch/quantization/config.py`, as in the nvidia-modelopt 0.47.0 wheel); the
`quant_algo` / `kv_cache_quant_algo` strings are what its export writes for them (same release,
`modelopt/torch/export/quant_utils.py` `process_layer_quant_config`), members of TensorRT-LLM's `QuantAlgo`
(NVIDIA/TensorRT-LLM `tensorrt_llm/quantization/mode.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

NONE = "none"
"""The spec's word for no quantization (`draft.quantization.format` / `kv_cache`)."""


@dataclass(frozen=True)
class Format:
    """One `draft.quantization.format`: its ModelOpt preset and the TensorRT-LLM quant_algo it exports as."""

    preset: str  # attribute of modelopt.torch.quantization
    quant_algo: str
    awq: bool = False  # int4 weights in groups: in_features must be a multiple of the group size
    pytorch_linear: str | None = None
    """The linear method TensorRT-LLM 1.2's PyTorch backend runs this quant_algo with (PYTORCH_LINEAR_SOURCE); None:
    it has none, so `build.flow: pytorch` refuses the format. ModelOpt's Hugging Face export (`export_hf_checkpoint`)
    names the format by the same quant_algo string as its TensorRT-LLM export (both call quant_utils.py
    `process_layer_quant_config`), written to hf_quant_config.json, which the PyTorch backend reads."""


class KvFormat(NamedTuple):
    """One `draft.quantization.kv_cache`: its ModelOpt KV preset and the TensorRT-LLM kv_cache_quant_algo."""

    preset: str
    kv_cache_quant_algo: str


# Read at NVIDIA/TensorRT-LLM commit 195839a7 (tag v1.2.0). The text reaches users in refusals, so it names the
# release, not the commit.
PYTORCH_LINEAR_SOURCE = "NVIDIA/TensorRT-LLM v1.2.0 tensorrt_llm/_torch/modules/linear.py get_quant_method"
"""Where `Format.pytorch_linear` is read: get_quant_method picks FP8QDQ, FP8Rowwise, FP8BlockScales, NVFP4, W4A8
NVFP4/MXFP4, weight-only (no per-group scaling), W4A16_AWQ or W4A8_AWQ, and raises 'unsupported quant mode' for
anything else, such as SmoothQuant's W8A8_SQ_PER_CHANNEL."""

HF_QUANT_CONFIG = "hf_quant_config.json"
"""The file of a ModelOpt Hugging Face export that names its quantization, and what TensorRT-LLM's PyTorch backend reads
it from (NVIDIA/TensorRT-LLM tensorrt_llm/_torch/model_config.py `from_pretrained` @195839a7)."""

FORMATS: dict[str, Format] = {
    "fp8": Format("FP8_DEFAULT_CFG", "FP8", pytorch_linear="FP8QDQLinearMethod"),
    "int8_sq": Format("INT8_SMOOTHQUANT_CFG", "W8A8_SQ_PER_CHANNEL"),
    "int8_wo": Format("INT8_WEIGHT_ONLY_CFG", "W8A16", pytorch_linear="WeightOnlyQuantLinearMethod"),
    "int4_awq": Format("INT4_AWQ_CFG", "W4A16_AWQ", awq=True, pytorch_linear="W4A16_AWQ_LinearMethod"),
    "w4a8_awq": Format("W4A8_AWQ_BETA_CFG", "W4A8_AWQ", awq=True, pytorch_linear="W4A8_AWQ_LinearMethod"),
}
KV_FORMATS: dict[str, KvFormat] = {"fp8": KvFormat("FP8_KV_CFG", "FP8")}
"""The PyTorch backend takes kv_cache_quant_algo FP8 from hf_quant_config.json as well (NVIDIA/TensorRT-LLM
tensorrt_llm/_torch/model_config.py `load_modelopt_quant_config` @195839a7)."""

FORMAT_NAMES = (NONE, *FORMATS)
"""Every `draft.quantization.format` the spec accepts, in the order messages list them."""
KV_FORMAT_NAMES = (NONE, *KV_FORMATS)
"""Every `draft.quantization.kv_cache` the spec accepts, in the order messages list them."""


def quant_algo(format_name: str) -> str | None:
    """The checkpoint's `quant_algo` for a `draft.quantization.format` (None for `none`)."""
    fmt = FORMATS.get(format_name)
    return fmt.quant_algo if fmt is not None else None


def kv_cache_quant_algo(kv_name: str) -> str | None:
    """The checkpoint's `kv_cache_quant_algo` for a `draft.quantization.kv_cache` (None for `none`)."""
    kv = KV_FORMATS.get(kv_name)
    return kv.kv_cache_quant_algo if kv is not None else None


def format_of(algo: str) -> str | None:
    """The `draft.quantization.format` whose checkpoints carry `quant_algo` `algo`, if specbuild offers one."""
    return next((name for name, fmt in FORMATS.items() if fmt.quant_algo == algo), None)


def kv_format_of(algo: str) -> str | None:
    """The `draft.quantization.kv_cache` whose checkpoints carry `kv_cache_quant_algo` `algo`, if any."""
    return next((name for name, kv in KV_FORMATS.items() if kv.kv_cache_quant_algo == algo), None)
