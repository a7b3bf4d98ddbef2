"""The reference runtime's reading of quantized TensorRT-LLM checkpoints, checked without ModelOpt's export.

Checkpoints here are quantized by hand from the layout ModelOpt 0.47.0's `export_tensorrt_llm_checkpoint` writes
(NVIDIA/Model-Optimizer, modelopt/torch/export/model_config_export.py),
so a bug shared by ModelOpt's export and the runtime's reader could not hide; the low-level grids are compared
with ModelOpt's own kernels (its CPU fallbacks), which TensorRT-LLM's checkpoints are made with.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from specbuild.convert.pipeline import ConvertRequest, convert_checkpoint
from specbuild.errors import SpecbuildError
from specbuild.runtime.dequantize import fp8_qdq, int8_qdq, unpack_int4
from specbuild.runtime.model import CausalLM
from tests.tiny_models import make_checkpoint

LINEARS = ("attention.qkv", "attention.dense", "mlp.fc", "mlp.gate", "mlp.proj")


def test_int4_unpacking_inverts_modelopts_packing() -> None:
    from modelopt.torch.export.quant_utils import pack_int4_in_uint8

    torch.manual_seed(0)
    weight, scale = torch.randn(64, 256), torch.rand(64, 2) + 0.1
    values = (weight / scale.repeat_interleave(128, dim=1)).round().clamp(-8, 7)
    packed = pack_int4_in_uint8(weight, scale, 128)
    assert packed.shape == (32, 256)
    assert torch.equal(unpack_int4(packed.view(torch.int8)).float(), values)


def test_activation_grids_match_modelopt() -> None:
    """fp8: ModelOpt's fp8_eager with amax = 448 * scale; int8: its fake quant with 8 bits, not narrow (the
    [-128, 127] range TensorRT-LLM uses). Equal up to one float32 ulp of the scale product."""
    from modelopt.torch.quantization.tensor_quant import _tensor_quant, fp8_eager

    torch.manual_seed(0)
    x = torch.randn(4096) * 3
    scale = torch.tensor([0.0123])
    # A different grid point would differ by a whole step (>= 0.0123 / 8 here), far above these tolerances.
    assert torch.allclose(fp8_qdq(x, scale), fp8_eager(x, scale * 448.0), rtol=1e-6, atol=1e-6)
    theirs = _tensor_quant(x, scale * 127.0, num_bits=8, narrow_range=False)
    assert torch.allclose(int8_qdq(x, scale), theirs, rtol=1e-6, atol=1e-6)


@pytest.fixture(scope="module")
def float_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("float")
    hf = make_checkpoint(root / "hf", "llama", dtype=torch.float32, hidden_size=128, intermediate_size=256)
    convert_checkpoint(ConvertRequest("float", hf, root / "trt", "float32"))
    return root / "trt"


def _read(directory: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(directory / "rank0.safetensors"), "pt") as fh:
        return {name: fh.get_tensor(name) for name in fh.keys()}  # noqa: SIM118


def _write(directory: Path, tensors: dict[str, torch.Tensor], config: dict, quant: dict) -> Path:
    directory.mkdir()
    save_file(tensors, str(directory / "rank0.safetensors"))
    (directory / "config.json").write_text(json.dumps({**config, "quantization": {**config["quantization"], **quant}}))
    return directory


def _quantize_by_hand(source: Path, out: Path, algo: str) -> tuple[Path, Path]:
    """(quantized checkpoint, float checkpoint holding exactly its dequantized weights)."""
    tensors, config = _read(source), json.loads((source / "config.json").read_text())
    quantized, dequantized = dict(tensors), dict(tensors)
    for layer in range(config["num_hidden_layers"]):
        for linear in LINEARS:
            base = f"transformer.layers.{layer}.{linear}."
            w = tensors[base + "weight"].float()
            if algo == "W8A16":
                scale = w.abs().amax(dim=1) / 127
                q = (w / scale[:, None]).round().clamp(-128, 127)
                quantized[base + "weight"] = q.to(torch.int8)
                dequantized[base + "weight"] = q * scale[:, None]
            else:  # W4A16_AWQ, groups of 128; AWQ smoothing: the stored weight is W / s, its input x * s
                smooth = torch.rand(w.shape[1]) + 0.5
                w = w / smooth
                scale = w.view(w.shape[0], -1, 128).abs().amax(dim=2) / 7
                q = (w / scale.repeat_interleave(128, dim=1)).round().clamp(-8, 7).to(torch.int16)
                pairs = q.view(-1, 2, q.shape[1])
                quantized[base + "weight"] = ((pairs[:, 0] & 0xF) | ((pairs[:, 1] & 0xF) << 4)).to(torch.uint8).view(
                    torch.int8)
                quantized[base + "prequant_scaling_factor"] = smooth
                dequantized[base + "weight"] = q.float() * scale.repeat_interleave(128, dim=1) * smooth
            quantized[base + "weights_scaling_factor"] = scale
    quant = {"quant_algo": algo, "group_size": 128}
    return (_write(out / algo, quantized, config, quant), _write(out / f"{algo}-float", dequantized, config, {}))


@pytest.mark.parametrize("algo", ["W8A16", "W4A16_AWQ"])
def test_hand_quantized_weights_load_exactly(algo: str, float_checkpoint: Path, tmp_path: Path) -> None:
    """Weight-only formats: the runtime on the quantized checkpoint computes the same logits as on a float
    checkpoint of the same dequantized weights (tolerance: float32 rounding only)."""
    quantized, reference = _quantize_by_hand(float_checkpoint, tmp_path, algo)
    ids = torch.randint(0, 1000, (2, 24))
    ours, theirs = CausalLM.from_checkpoint(quantized), CausalLM.from_checkpoint(reference)
    a = ours(ids, ours.new_cache(2, 24)).logits
    b = theirs(ids, theirs.new_cache(2, 24)).logits
    assert torch.allclose(a, b, atol=1e-5)
    plain = CausalLM.from_checkpoint(float_checkpoint)
    assert not torch.allclose(a, plain(ids, plain.new_cache(2, 24)).logits, atol=1e-3)  # the quantized weights


@pytest.mark.parametrize(("quant", "match"), [
    ({"quant_algo": "NVFP4"}, r"quantization\.quant_algo 'NVFP4' is not supported"),
    ({"kv_cache_quant_algo": "INT8"}, r"quantization\.kv_cache_quant_algo 'INT8' is not supported"),
    ({"quant_algo": "W4A16_AWQ", "has_zero_point": True}, r"has_zero_point"),
])
def test_unsupported_quantization_is_refused(quant: dict, match: str, float_checkpoint: Path, tmp_path: Path) -> None:
    config = json.loads((float_checkpoint / "config.json").read_text())
    directory = _write(tmp_path / "ckpt", _read(float_checkpoint), config, quant)
    with pytest.raises(SpecbuildError, match=match):
        CausalLM.from_checkpoint(directory)


def test_missing_or_malformed_scales_name_the_tensor(float_checkpoint: Path, tmp_path: Path) -> None:
    quantized, _ = _quantize_by_hand(float_checkpoint, tmp_path, "W8A16")
    tensors, config = _read(quantized), json.loads((quantized / "config.json").read_text())
    name = "transformer.layers.1.mlp.proj.weights_scaling_factor"
    del tensors[name]
    broken = _write(tmp_path / "no-scale", tensors, config, {})
    with pytest.raises(SpecbuildError, match=r"mlp\.proj\.weight' is torch\.int8 without a weights_scaling_factor"):
        CausalLM.from_checkpoint(broken)
    tensors[name] = torch.ones(3)
    with pytest.raises(SpecbuildError, match=r"mlp\.proj\.weights_scaling_factor' has shape \[3\], expected \[128\]"):
        CausalLM.from_checkpoint(_write(tmp_path / "bad-scale", tensors, config, {}))
    float_tensors = _read(float_checkpoint)
    with pytest.raises(SpecbuildError, match=r"'transformer\.layers\.0\.attention\.\w+\.weight' is torch\.float32 "
                       r"without a weights_scaling_factor, but quantization\.quant_algo is 'W8A16'"):
        CausalLM.from_checkpoint(_write(tmp_path / "float-weights", float_tensors, config, {}))
    tensors[name] = torch.ones(128)  # valid SmoothQuant weights, but no activation scales
    with pytest.raises(SpecbuildError, match=r"activation_scaling_factor' is missing \(W8A8_SQ_PER_CHANNEL"):
        CausalLM.from_checkpoint(_write(tmp_path / "sq", tensors, config, {"quant_algo": "W8A8_SQ_PER_CHANNEL"}))
    for layer in range(config["num_hidden_layers"]):
        for linear in LINEARS:
            tensors[f"transformer.layers.{layer}.{linear}.activation_scaling_factor"] = torch.ones(1)
    tensors["transformer.layers.1.mlp.gate.activation_scaling_factor"] = torch.full((1,), 2.0)
    with pytest.raises(SpecbuildError, match=r"layers\.1\.mlp\.fc and transformer\.layers\.1\.mlp\.gate read the "
                       "same input but have different activation or pre-quant scales"):
        CausalLM.from_checkpoint(_write(tmp_path / "sq-gate", tensors, config, {"quant_algo": "W8A8_SQ_PER_CHANNEL"}))


def test_runtime_reads_quantized_checkpoints_without_modelopt_or_the_converter(tmp_path: Path,
                                                                               float_checkpoint: Path) -> None:
    quantized, _ = _quantize_by_hand(float_checkpoint, tmp_path, "W4A16_AWQ")
    code = (f"import sys; from specbuild.runtime.model import CausalLM; CausalLM.from_checkpoint({str(quantized)!r}); "
            "print(sorted({m.split('.')[0] + '.' + m.split('.')[1] for m in sys.modules "
            "if m.startswith(('modelopt', 'specbuild.convert')) and '.' in m}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
