"""The calls into NVIDIA ModelOpt 0.47: the list-form config, `mtq.quantize` with calibration, the scale
unification TensorRT-LLM's fused linears need, and `export_tensorrt_llm_checkpoint`.

ModelOpt and transformers are imported inside the functions (ModelOpt costs about 7 s and 240 MB): only a
quantized conversion that runs pays for them. Sources: NVIDIA/Model-Optimizer 0.47.0 (PyPI `nvidia-modelopt`),
`modelopt/torch/quantization/model_quant.py` (`quantize`, the `forward_loop` that takes the model),
`modelopt/torch/export/model_config_export.py` (`export_tensorrt_llm_checkpoint`) and
`modelopt/torch/export/quant_utils.py` (`preprocess_linear_fusion`).
"""

from __future__ import annotations

import contextlib
import copy
import io
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from specbuild.contracts.quant_formats import KV_FORMATS
from specbuild.convert.quantize.plan import QuantPlan
from specbuild.dtypes import torch_dtype

if TYPE_CHECKING:
    from rich.progress import Progress
    from transformers import PreTrainedModel

FP8_MAX = 448.0  # amax / 448 is an FP8 scale


# -- config -------------------------------------------------------------------------------------------------------
def _check_list_form(config: dict[str, Any], where: str) -> None:
    """ModelOpt >= 0.44 configs are an ordered list of entries; the legacy dict form is converted with its
    `default` entry at its dict position, which (last, as older recipes put it) disables every quantizer."""
    entries = config.get("quant_cfg")
    if not isinstance(entries, list) or not all(isinstance(e, dict) and "quantizer_name" in e for e in entries):
        raise TypeError(f"{where}: ModelOpt config is not in the 0.44+ list form: {type(entries).__name__}")


def modelopt_config(mtq: Any, plan: QuantPlan) -> dict[str, Any]:
    """The list-form config: the format's preset (or deny-all for a KV-only run), the AWQ group size set on the
    weight quantizer entries, and the KV preset's entries appended (later entries win)."""
    if plan.format is not None:
        config = copy.deepcopy(getattr(mtq, plan.format.preset))
        _check_list_form(config, plan.format.preset)
    else:
        config = {"quant_cfg": [{"quantizer_name": "*", "enable": False}], "algorithm": "max"}
    if plan.group_size is not None:
        for entry in config["quant_cfg"]:
            cfgs = entry.get("cfg")
            for cfg in cfgs if isinstance(cfgs, list) else [cfgs]:
                if isinstance(cfg, dict) and isinstance(cfg.get("block_sizes"), dict):
                    cfg["block_sizes"][-1] = plan.group_size
    if plan.kv_algo is not None:
        preset = KV_FORMATS[plan.settings.kv_cache].preset
        kv = getattr(mtq, preset)
        _check_list_form(kv, preset)
        config["quant_cfg"] = [*config["quant_cfg"], *copy.deepcopy(kv["quant_cfg"])]
    return config


# -- calibrate ----------------------------------------------------------------------------------------------------
def default_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def load_model(source: Path, device: torch.device, dtype: str, layers: int | None = None) -> PreTrainedModel:
    """The HF model to calibrate: float32 on CPU (half-precision matmuls are slow and inexact there), the export
    dtype on CUDA. `layers` keeps only the first decoder layers (a self-draft): transformers' from_pretrained
    applies a config keyword such as num_hidden_layers before building the model and leaves the later layers'
    weights unloaded."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    load_dtype = torch.float32 if device.type == "cpu" else torch_dtype(dtype)
    bar = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # a second progress bar for a small draft's load is noise
    verbosity = hf_logging.get_verbosity()
    if layers is not None:  # the later layers' weights are left out on purpose: no "UNEXPECTED" load report
        hf_logging.set_verbosity_error()
    try:
        truncate = {"num_hidden_layers": layers} if layers is not None else {}
        model = AutoModelForCausalLM.from_pretrained(source, dtype=load_dtype, **truncate)
    finally:
        hf_logging.set_verbosity(verbosity)
        if bar:
            hf_logging.enable_progress_bar()
    return model.to(device).eval()


def quantize_model(model: PreTrainedModel, plan: QuantPlan, progress: Progress | None = None) -> PreTrainedModel:
    """Fake-quantize `model` in place with ModelOpt, calibrating on the plan's batches (one progress bar row per
    pass: AWQ runs the loop twice, once for statistics and once for its scale search)."""
    import modelopt.torch.quantization as mtq

    config = modelopt_config(mtq, plan)
    device = next(model.parameters()).device
    passes = 0

    def forward_loop(m: torch.nn.Module) -> None:  # ModelOpt >= 0.4x passes the model (model_quant.py)
        nonlocal passes
        passes += 1
        task = progress.add_task(f"calibrating (pass {passes})", total=len(plan.batches)) if progress else None
        with torch.no_grad():
            for batch in plan.batches:
                m(batch.to(device), use_cache=False)
                if progress is not None and task is not None:
                    progress.advance(task)

    # ModelOpt prints and warns per module; the progress bar and the plan say what runs.
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        mtq.quantize(model, config, forward_loop)
    return model


def match_export(model: PreTrainedModel) -> None:
    """Do to the fake-quantized model what the TensorRT-LLM export does to its scales: for linears TensorRT-LLM
    fuses (q/k/v into qkv, gate/up into fc/gate) ModelOpt's own `preprocess_linear_fusion` (one shared
    per-tensor weight and input amax, the max; one averaged AWQ/SmoothQuant pre-quant scale), and FP8 KV-cache
    scales of at least 1.0. Needed before export: ModelOpt 0.47's export alone leaves gate and up with different
    AWQ pre-quant (and W4A8 activation) scales, which one fused gate/up GEMM cannot apply (measured: int4_awq and
    w4a8_awq, tp 1 and 2). It also makes the fake-quantized model compute what the exported checkpoint encodes,
    so it is a fair reference for the runtime."""
    from modelopt.torch.export.quant_utils import preprocess_linear_fusion

    groups = (("self_attn", ("q_proj", "k_proj", "v_proj")), ("mlp", ("gate_proj", "up_proj")))
    for module in model.modules():
        for name in ("k_bmm_quantizer", "v_bmm_quantizer"):
            quantizer = getattr(module, name, None)
            if quantizer is not None and quantizer.is_enabled and quantizer.amax is not None:
                # The TensorRT-LLM export raises FP8 KV-cache scales below 1.0 to 1.0 (clamp_fp8_scales).
                quantizer.amax = torch.clamp(quantizer.amax, min=FP8_MAX)
        for parent, names in groups:
            owner = getattr(module, parent, None)
            linears = [getattr(owner, name, None) for name in names]
            if owner is not None and all(hasattr(lin, "weight_quantizer") for lin in linears):
                preprocess_linear_fusion(linears)


# -- export -------------------------------------------------------------------------------------------------------
def export_modelopt(model: PreTrainedModel, plan: QuantPlan, tp_size: int, pp_size: int, out: Path) -> Path:
    """ModelOpt's own TensorRT-LLM export, unrepaired (mutates `model`: export a model only once)."""
    from modelopt.torch.export import export_tensorrt_llm_checkpoint

    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        # The default inference_tensor_parallel=0 raises ZeroDivisionError on one process (model_config_export.py).
        export_tensorrt_llm_checkpoint(
            model, plan.decoder_type, dtype=torch_dtype(plan.dtype), export_dir=out,
            inference_tensor_parallel=tp_size, inference_pipeline_parallel=pp_size,
        )
    return out
