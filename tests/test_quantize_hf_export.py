"""A quantized draft on `build.flow: pytorch`: ModelOpt 0.47's Hugging Face export (`export_hf_checkpoint`), the
checkpoint TensorRT-LLM 1.2's PyTorch backend loads as `speculative_model`.

- the export's files, hf_quant_config.json, config.json's quantization_config and every tensor (name, dtype, shape)
  are what tests/hf_quant_schema.py says ModelOpt writes and TensorRT-LLM's loader reads, for every format the
  PyTorch backend has a linear method for;
- the export and the TensorRT-LLM checkpoint written in the same run (the reference runtime's, `build.backend:
  reference`) hold one quantization: the same integer codes, and weights that dequantize to the same values;
- the PyTorch-flow pipeline with a quantized draft converts, builds and deploys on either backend, model.yaml and the
  trtllm-serve options name the export as speculative_model, and the reference llmapi model's draft-target greedy
  text is the target's own plain greedy text;
- formats the PyTorch backend cannot run, and a quantized draft of another mode, are refused at their field.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from rich.console import Console
from safetensors.torch import load_file

from bench.quantize_bench import zero_pad_mlp
from specbuild.contracts import llm_api
from specbuild.contracts.quant_formats import FORMATS, HF_QUANT_CONFIG
from specbuild.convert.pipeline import ConvertRequest, convert_requests
from specbuild.convert.quantize.settings import QuantizeSettings
from specbuild.convert.quantize.write import shared_quantization
from specbuild.convert.run import convert_spec, hf_draft_request
from specbuild.errors import SpecbuildError
from specbuild.runtime.dequantize import dequantize_weight, unpack_int4
from tests import hf_quant_schema as schema

QUIET = Console(stderr=True, quiet=True)
PYTORCH_FORMATS = [name for name, fmt in FORMATS.items() if fmt.pytorch_linear is not None]
CALIB = {"calib_source": "builtin", "calib_size": 8, "calib_seq_len": 64}
TOKENIZER = ("tokenizer.json", "tokenizer_config.json")


def _settings(fmt: str) -> QuantizeSettings:
    return QuantizeSettings(fmt, "fp8" if fmt == "fp8" else "none", **CALIB)


@pytest.fixture(scope="module")
def pairs(demo_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Path]]:
    """Per format: the source draft, and its TensorRT-LLM checkpoint and HF export from one calibration, written as
    `specbuild convert` writes them on the reference PyTorch flow (one `convert_requests` in `shared_quantization`).
    The int4 formats run on the demo draft with its 344-wide MLP zero-padded to 384 (groups of 64 must divide it)."""
    root = tmp_path_factory.mktemp("hf-export")
    padded = zero_pad_mlp(demo_models["draft"], root / "draft384")
    out = {}
    for fmt in PYTORCH_FORMATS:
        source = padded if FORMATS[fmt].awq else demo_models["draft"]
        trt = ConvertRequest("draft", source, root / f"{fmt}-trtllm", "float32", quantization=_settings(fmt))
        hf = hf_draft_request(trt, root / f"{fmt}-hf")
        with shared_quantization():
            results = convert_requests([trt, hf], console=QUIET)
        assert [r.status for r in results] == ["written", "written"]
        out[fmt] = {"source": source, "trtllm": trt.output, "hf": hf.output}
    return out


def _quant(fmt: str, directory: Path) -> tuple[str, str | None, int | None]:
    trt = json.loads((directory / "config.json").read_text())["quantization"]
    return trt["quant_algo"], trt["kv_cache_quant_algo"], trt.get("group_size")


@pytest.mark.parametrize("fmt", PYTORCH_FORMATS)
def test_export_is_modelopts_schema(fmt: str, pairs: dict[str, dict[str, Path]]) -> None:
    """Files, both quantization blocks and every tensor, field by field against tests/hf_quant_schema.py."""
    paths = pairs[fmt]
    algo, kv, group = _quant(fmt, paths["trtllm"])
    assert algo == FORMATS[fmt].quant_algo and algo in schema.TRTLLM_QUANT_ALGOS
    export = paths["hf"]
    assert sorted(p.name for p in export.iterdir()) == sorted({*schema.FILES, *TOKENIZER, "manifest.json"})
    written = json.loads((export / HF_QUANT_CONFIG).read_text())
    assert written == schema.hf_quant_config(algo, kv, group)
    assert set(schema.TRTLLM_READS) - {"group_size"} <= set(written["quantization"])
    config = json.loads((export / "config.json").read_text())
    assert config["quantization_config"] == schema.quantization_config(algo, kv)
    assert config["dtype"] == "float16"  # the export dtype of a float32 draft: what the PyTorch backend builds in
    source_config = json.loads((paths["source"] / "config.json").read_text())
    tensors = load_file(export / "model.safetensors")
    expected = schema.expected_tensors(source_config, algo, kv, group, torch.float16)
    assert sorted(set(tensors) ^ set(expected)) == []
    found = {name: (t.dtype, tuple(t.shape)) for name, t in tensors.items()}
    assert {name: found[name] for name in found if found[name] != expected[name]} == {}


def _hf_weight(tensors: dict[str, torch.Tensor], base: str, algo: str, group: int | None) -> torch.Tensor:
    """A linear's float32 weight from the export, as TensorRT-LLM's PyTorch linear methods compute with it
    (tests/hf_quant_schema.py TENSORS), times its pre_quant_scale where the export keeps one."""
    weight, scale = tensors[base + "weight"], tensors[base + "weight_scale"].float()
    if algo == "FP8":
        value = weight.float() * scale
    elif algo == "W8A16":
        value = weight.float() * scale[:, None]
    else:
        value = unpack_int4(weight).float() * scale.repeat_interleave(group or 1, dim=1)
        if algo == "W4A8_AWQ":  # int4 * scale lands on an fp8 grid of weight_scale_2 (the fp8 GEMM's input)
            scale_2 = tensors[base + "weight_scale_2"].float()
            value = (value / scale_2).to(torch.float8_e4m3fn).float() * scale_2
    prequant = tensors.get(base + "pre_quant_scale")
    return value * prequant.float() if prequant is not None else value


def _codes(weight: torch.Tensor, algo: str) -> torch.Tensor:
    """A quantized weight's integer codes, one per element (fp8 bytes as int8; int4 unpacked, rows 2j / 2j+1)."""
    return unpack_int4(weight) if algo in ("W4A16_AWQ", "W4A8_AWQ") else weight.view(torch.int8)


TRTLLM_NAMES = {"self_attn.o_proj": "attention.dense", "mlp.gate_proj": "mlp.fc", "mlp.up_proj": "mlp.gate",
                "mlp.down_proj": "mlp.proj"}
"""HF linear -> TensorRT-LLM Llama checkpoint linear (q/k/v are row blocks of attention.qkv); norms: input_layernorm,
post_layernorm (NVIDIA/TensorRT-LLM docs model-weights-loader.md, as specbuild's converter maps them)."""


def _trtllm_linears(directory: Path, source_config: dict[str, Any], algo: str
                    ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Each HF linear's codes and float32 weight from the TensorRT-LLM checkpoint (dequantized by the reference
    runtime), the weight times its prequant_scaling_factor and the norm before it: what the layer computes from the
    normed input."""
    quant = json.loads((directory / "config.json").read_text())["quantization"]
    tensors = load_file(directory / "rank0.safetensors")
    head = source_config["head_dim"]
    q, kv = source_config["num_attention_heads"] * head, source_config["num_key_value_heads"] * head

    def effective(base: str, norm: str | None) -> tuple[torch.Tensor, torch.Tensor]:
        value = dequantize_weight(tensors, base + ".", quant, directory)
        prequant = tensors.get(base + ".prequant_scaling_factor")
        value = value * prequant.float() if prequant is not None else value
        value = value * tensors[norm + ".weight"].float() if norm else value
        return _codes(tensors[base + ".weight"], algo), value

    out = {}
    for layer in range(source_config["num_hidden_layers"]):
        t, h = f"transformer.layers.{layer}.", f"model.layers.{layer}."
        codes, value = effective(t + "attention.qkv", t + "input_layernorm")
        for name, c, v in zip(("q_proj", "k_proj", "v_proj"), codes.split([q, kv, kv]), value.split([q, kv, kv]),
                              strict=True):
            out[f"{h}self_attn.{name}"] = (c, v)
        for linear, trt in TRTLLM_NAMES.items():
            out[h + linear] = effective(t + trt, t + "post_layernorm" if linear in schema.NORM_BEFORE else None)
    return out


@pytest.mark.parametrize("fmt", PYTORCH_FORMATS)
def test_export_and_trtllm_checkpoint_hold_one_quantization(fmt: str, pairs: dict[str, dict[str, Path]]) -> None:
    """Two paths of one calibration: every linear's integer (or fp8) codes are the same in both, and its weight
    (with the pre-quant scale, and the norm it reads, into which the export folds int4 AWQ's) dequantizes alike, up
    to the float16 rounding of the norms and pre-quant scales both store."""
    paths = pairs[fmt]
    algo, _, group = _quant(fmt, paths["trtllm"])
    source_config = json.loads((paths["source"] / "config.json").read_text())
    hf = load_file(paths["hf"] / "model.safetensors")
    trtllm = _trtllm_linears(paths["trtllm"], source_config, algo)
    assert len(trtllm) == len(schema.QUANTIZED_LINEARS) * source_config["num_hidden_layers"]
    for name, (codes, expected) in trtllm.items():
        assert torch.equal(_codes(hf[name + ".weight"], algo), codes), name
        value = _hf_weight(hf, name + ".", algo, group)
        norm = schema.NORM_BEFORE.get(name.split(".", 3)[3])
        if norm is not None:
            value = value * hf[f"{name.rsplit('.', 2)[0]}.{norm}.weight"].float()
        assert torch.allclose(value, expected, rtol=2e-3, atol=1e-6), (name, (value - expected).abs().max())


# -- the pipeline -----------------------------------------------------------------------------------------------------
def _spec_file(tmp_path: Path, demo_models: dict[str, Path], backend: str, fmt: str = "int8_wo",
               mode: str = "draft_target") -> Path:
    data = {
        "name": "pt-quant", "output_dir": str(tmp_path / "out"),
        "target": {"model": str(demo_models["target"])},
        "draft": {"model": str(demo_models["draft"]),
                  "quantization": {"format": fmt, "calib": {"source": "builtin", "size": 8, "seq_len": 64}}},
        "speculative": {"mode": mode, "num_draft_tokens": 3},
        "build": {"flow": "pytorch", "backend": backend, "dtype": "float32", "max_batch_size": 4,
                  "max_input_len": 64, "max_output_len": 24},
        "deploy": {"decoupled": True},
    }
    path = tmp_path / f"{backend}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_pytorch_flow_with_a_quantized_draft(demo_models: dict[str, Path], tmp_path: Path) -> None:
    """tensorrt backend: build waits for convert, which writes only the export; model.yaml and the trtllm-serve
    options name it. reference backend, same output_dir: the target and the draft's TensorRT-LLM checkpoint join it,
    the export is rewritten from the same calibration, and the served draft-target greedy text is the target's
    plain greedy text."""
    from specbuild.build.llm_api import build_llm_api
    from specbuild.deploy.llmapi import deploy_llm_api
    from specbuild.spec import load_spec

    spec_path = _spec_file(tmp_path, demo_models, "tensorrt")
    spec = load_spec(spec_path)
    export = spec.output_dir / "checkpoints" / llm_api.QUANTIZED_DRAFT_DIR
    with pytest.raises(SpecbuildError, match="run `specbuild convert SPEC`"):
        build_llm_api(spec, console=QUIET)
    results = convert_spec(spec_path, console=QUIET)
    assert [(r.request.name, r.status) for r in results] == [("draft-hf", "written")]
    assert not spec.checkpoint_dir("target").exists() and not spec.checkpoint_dir("draft").exists()
    build_llm_api(spec, console=QUIET)
    repository = deploy_llm_api(spec, console=QUIET).repository
    model_yaml = yaml.safe_load((repository / llm_api.LLMAPI_MODEL_YAML).read_text())
    options = yaml.safe_load((repository / llm_api.SERVE_OPTIONS).read_text())
    assert model_yaml["speculative_config"]["speculative_model"] == str(export)
    assert options["speculative_config"]["speculative_model"] == str(export)
    assert [(r.request.name, r.status) for r in convert_spec(spec_path, console=QUIET)] == [("draft-hf", "up to date")]

    spec_path = _spec_file(tmp_path, demo_models, "reference")
    spec = load_spec(spec_path)
    results = convert_spec(spec_path, console=QUIET)
    # The draft's checkpoint is new and the export was up to date: the export is rewritten from this calibration.
    assert [(r.request.name, r.status) for r in results] == [("target", "written"), ("draft", "written"),
                                                            ("draft-hf", "written")]
    hf_settings = json.loads((export / "manifest.json").read_text())["settings"]["quantization"]
    trt_settings = json.loads((spec.checkpoint_dir("draft") / "manifest.json").read_text())["settings"]["quantization"]
    assert {k: v for k, v in hf_settings.items() if k != "export"} == trt_settings and hf_settings["export"] == "hf"
    build_llm_api(spec, console=QUIET)
    repository = deploy_llm_api(spec, console=QUIET).repository
    model_yaml = yaml.safe_load((repository / llm_api.LLMAPI_MODEL_YAML).read_text())
    reference = json.loads((repository / llm_api.REFERENCE_FILE).read_text())
    assert model_yaml["speculative_config"]["speculative_model"] == str(export)
    assert reference["checkpoints"]["draft"] == str(spec.checkpoint_dir("draft").resolve())
    _greedy_equals_plain(model_yaml, reference, demo_models)


def _greedy_equals_plain(settings: dict[str, Any], reference: dict[str, Any], demo_models: dict[str, Path]) -> None:
    """The reference llmapi model as model.py builds it from the repository's model.yaml and reference.json: each
    prompt's draft-target greedy text equals the target checkpoint's plain greedy text (derived here), and the
    quantized draft's proposals were checked (drafts counted)."""
    import time

    from specbuild.python_models.llmapi_model import Answer, LlmApiModel, load_runner
    from specbuild.runtime.generation import generate
    from specbuild.runtime.model import CausalLM
    from specbuild.runtime.sequence import StopCriteria
    from specbuild.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(demo_models["target"])
    target = CausalLM.from_checkpoint(Path(reference["checkpoints"]["target"]))
    model = LlmApiModel(tokenizer, load_runner(settings, reference, log_info=lambda _: None), decoupled=True)
    try:
        for prompt in ("The for statement", "Class definitions"):
            with torch.inference_mode():
                ids = generate(target, [tokenizer.encode(prompt)], stop=StopCriteria(16, tokenizer.eos_token_id))
            expected = tokenizer.decode(ids.output_ids[0], skip_special_tokens=True)
            answers: list[Answer] = []
            model.receive({"text_input": np.array([prompt.encode()], dtype=object),
                           "sampling_param_max_tokens": np.array([16]),
                           "sampling_param_exclude_input_from_output": np.array([True]),
                           "sampling_param_return_perf_metrics": np.array([True])}, answers.append)
            deadline = time.monotonic() + 120
            while not (answers and answers[-1].final):
                assert time.monotonic() < deadline, answers
                time.sleep(0.01)
            final = answers[-1]
            assert not final.error and final.outputs is not None, final
            assert final.outputs["text_output"][0].decode() == expected, prompt
            assert int(final.outputs["total_draft_tokens"][0]) > 0
    finally:
        model.runner.stop()


def test_an_export_that_is_not_the_plan_is_refused_and_nothing_written(demo_models: dict[str, Path], tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """An hf_quant_config.json that does not say what was planned (here: rewritten after ModelOpt wrote it) fails the
    conversion naming the file and field, and the output directory never appears."""
    from specbuild.convert.quantize import hf_export

    real = hf_export.export_hf

    def wrong(model: Any, out: Path) -> None:
        real(model, out)
        written = json.loads((out / HF_QUANT_CONFIG).read_text())
        written["quantization"]["quant_algo"] = "W8A8_SQ_PER_CHANNEL"
        (out / HF_QUANT_CONFIG).write_text(json.dumps(written))

    monkeypatch.setattr(hf_export, "export_hf", wrong)
    draft = ConvertRequest("draft", demo_models["draft"], tmp_path / "unused", "float32",
                           quantization=_settings("int8_wo"))
    request = hf_draft_request(draft, tmp_path / "draft-hf")
    with pytest.raises(SpecbuildError, match=r"hf_quant_config\.json: quantization\.quant_algo is "
                                             r"'W8A8_SQ_PER_CHANNEL', expected 'W8A16'"):
        convert_requests([request], console=QUIET)
    assert not request.output.exists()


# -- refusals -----------------------------------------------------------------------------------------------------
def _refused(tmp_path: Path, fmt: str, mode: str = "draft_target") -> SpecbuildError:
    models = {"target": tmp_path / "target", "draft": tmp_path / "draft"}  # never read: refused before
    with pytest.raises(SpecbuildError) as err:
        convert_spec(_spec_file(tmp_path, models, "reference", fmt, mode), console=QUIET)
    return err.value


def test_formats_the_pytorch_backend_cannot_run_are_refused(tmp_path: Path) -> None:
    """int8_sq (W8A8_SQ_PER_CHANNEL) has no PyTorch-backend linear method: convert refuses it at its field, naming
    TensorRT-LLM's reason and the formats that work, before reading any model."""
    refused = [name for name, fmt in FORMATS.items() if fmt.pytorch_linear is None]
    assert refused == ["int8_sq"]
    message = str(_refused(tmp_path, "int8_sq"))
    assert "draft.quantization.format" in message and "unsupported quant mode" in message
    assert all(name in message for name in PYTORCH_FORMATS) and "build.flow: engine" in message


def test_a_quantized_eagle3_draft_is_refused(tmp_path: Path) -> None:
    message = str(_refused(tmp_path, "fp8", mode="eagle3"))
    assert "draft.quantization" in message and "applies to a draft_target draft" in message
