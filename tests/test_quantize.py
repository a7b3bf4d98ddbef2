"""Draft quantization with ModelOpt 0.47 (`specbuild convert`) and the reference runtime on its output.

Each format is quantized once per session (module fixtures; small calibration: 16 x 128 tokens of the built-in
text), on the demo draft, or for the int4 AWQ formats on the demo draft with its 344-wide MLP zero-padded to
384 (same function; int4 groups of 128 or 64 must divide every input size).

The agreement reference is ModelOpt's fake-quantized PyTorch model after `match_export` (ModelOpt's own
pre-export step: shared scales for the linears TensorRT-LLM fuses, FP8 KV scales of at least 1) with the
tensors the checkpoint stores in float16 (embedding, norms, lm_head, pre-quant scales) rounded to float16, as
they are stored: the runtime must then compute the same logits up to float32 summation order. Measured on
8 x 128 held-out tokens: top-1 agreement 100 % for all five formats (fp8 with its FP8 KV cache emulated);
mean |logit difference| to the fake-quantized model 5e-7 (int4_awq) to 1.1e-4 (fp8), to the unquantized
model 3.5e-3 (int8_wo) to 6.5e-2 (w4a8_awq), at least 300x apart.
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from rich.console import Console
from safetensors import safe_open

from bench.quantize_bench import zero_pad_mlp
from specbuild.convert.calibration import CalibrationError, CalibrationText, calibration_batches
from specbuild.convert.hf_checkpoint import HFCheckpoint
from specbuild.convert.pipeline import ConvertRequest, convert_checkpoint, plan_conversion, requests_from_spec
from specbuild.convert.quantize.modelopt_calls import (
    export_modelopt,
    load_model,
    match_export,
    modelopt_config,
    quantize_model,
)
from specbuild.convert.quantize.plan import QuantPlan, plan_quantization
from specbuild.convert.quantize.repair import coverage_problems, expected_tensors
from specbuild.convert.quantize.settings import FORMATS, QuantizeSettings
from specbuild.errors import SpecbuildError
from specbuild.runtime.model import CausalLM
from specbuild.spec import SpecValidationError, parse_spec
from tests.tiny_models import make_model, save_model

QUIET = Console(stderr=True, quiet=True)
CALIB = {"calib_source": "builtin", "calib_size": 16, "calib_seq_len": 128}
AWQ = tuple(name for name, fmt in FORMATS.items() if fmt.awq)
AGREEMENT_MIN = 0.99  # the bar; measured 1.000 for every format
CLEAR_LOGIT_MARGIN = 0.05
"""A top-1 lead this large survives the implementations' logit differences (at most ~0.01 on the demo models)."""
FLAT_AGREEMENT_MIN = 0.95
"""Overall top-1 agreement on the untrained (flat-logit) families; measured 0.980-1.000 across seeds."""
QUANTIZED_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
                     "c_attn", "c_proj", "c_fc")  # Llama family, GPT-2


def settings(fmt: str) -> QuantizeSettings:
    return QuantizeSettings(fmt, "fp8" if fmt == "fp8" else "none", **CALIB)


@pytest.fixture(scope="module")
def sources(demo_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    padded = zero_pad_mlp(demo_models["draft"], tmp_path_factory.mktemp("draft384"))
    return {"draft": demo_models["draft"], "padded": padded, "target": demo_models["target"]}


def source_for(fmt: str, sources: dict[str, Path]) -> Path:
    return sources["padded"] if fmt in AWQ else sources["draft"]


@pytest.fixture(scope="module")
def exports(sources: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One quantized checkpoint per format, written by `convert_checkpoint` (the `specbuild convert` path)."""
    root = tmp_path_factory.mktemp("quantized")
    out = {}
    for fmt in FORMATS:
        request = ConvertRequest("draft", source_for(fmt, sources), root / fmt, "float32", quantization=settings(fmt))
        convert_checkpoint(request, console=QUIET)
        out[fmt] = root / fmt
    return out


@pytest.fixture(scope="module")
def heldout_ids(demo_models: dict[str, Path]) -> torch.Tensor:
    from transformers import AutoTokenizer

    from specbuild.demo.models import heldout_texts

    tokenizer = AutoTokenizer.from_pretrained(demo_models["tokenizer"])
    ids: list[int] = []
    for text in heldout_texts():
        ids += tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) >= 8 * 128:
            break
    return torch.tensor(ids[: 8 * 128]).view(8, 128)


def calibrate(request: ConvertRequest) -> tuple[QuantPlan, torch.nn.Module]:
    """The converter's plan for `request` and ModelOpt's fake-quantized model, calibrated exactly as the converter
    calibrates (same plan, same batches)."""
    checkpoint = HFCheckpoint(request.source)
    try:
        qplan = plan_quantization(request, plan_conversion(request, checkpoint))
    finally:
        checkpoint.close()
    return qplan, quantize_model(load_model(request.source, torch.device("cpu"), qplan.dtype), qplan)


def fake_quantized(source: Path, quantization: QuantizeSettings) -> torch.nn.Module:
    """The calibrated fake-quantized model after the export's own scale unification, with the float16-stored
    tensors rounded to float16."""
    _, model = calibrate(ConvertRequest("draft", source, source / "unused", "float32", quantization=quantization))
    match_export(model)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if not any(linear in name for linear in QUANTIZED_LINEARS) or name.endswith("bias"):
                param.copy_(param.half().float())
        for module in model.modules():
            if getattr(module, "_pre_quant_scale", None) is not None:
                module._pre_quant_scale.copy_(module._pre_quant_scale.half().float())
    return model


def rank0(checkpoint: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(checkpoint / "rank0.safetensors"), "pt") as fh:
        return {name: fh.get_tensor(name) for name in fh.keys()}  # noqa: SIM118


def runtime_logits(checkpoint: Path, ids: torch.Tensor) -> torch.Tensor:
    model = CausalLM.from_checkpoint(checkpoint)
    return model(ids, model.new_cache(ids.shape[0], ids.shape[1])).logits


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_runtime_matches_modelopt_fake_quant(fmt: str, sources: dict[str, Path], exports: dict[str, Path],
                                             heldout_ids: torch.Tensor) -> None:
    """Top-1 agreement >= 99 % (measured 100 %) between the runtime on the exported checkpoint and ModelOpt's
    fake-quantized model; and the quantized weights are really used: the runtime is at least 20x closer to the
    fake-quantized model than to the unquantized one (mean |logit difference|; measured >= 300x)."""
    from transformers import AutoModelForCausalLM

    source = source_for(fmt, sources)
    with torch.no_grad():
        reference = fake_quantized(source, settings(fmt))(heldout_ids).logits
        unquantized = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)(heldout_ids).logits
    ours = runtime_logits(exports[fmt], heldout_ids)
    agreement = (ours.argmax(-1) == reference.argmax(-1)).float().mean().item()
    to_reference = (ours - reference).abs().mean().item()
    to_unquantized = (ours - unquantized).abs().mean().item()
    assert agreement >= AGREEMENT_MIN, (fmt, agreement)
    assert to_unquantized > 20 * to_reference, (fmt, to_reference, to_unquantized)


@pytest.mark.parametrize("family", ["qwen2", "gpt2"])
def test_other_families_match_modelopt_fake_quant(family: str, demo_models: dict[str, Path], tmp_path: Path,
                                                  heldout_ids: torch.Tensor) -> None:
    """Qwen2 (qkv bias, ModelOpt decoder `qwen`) and GPT-2 (LayerNorm, ungated MLP, Conv1D linears, decoder
    `gpt`) with SmoothQuant's int8 activations. These demo models are untrained, so their logits are nearly flat:
    where the reference's best two logits are closer than the two implementations' rounding differences (about
    0.01 here), top-1 is a coin toss that changes with the random weights (GPT-2 agreed on 98.0-99.6 % of the
    positions over demo models built from four different seeds). So: every position the reference decides by a
    clear margin must agree, and nearly all positions overall."""
    quantization = settings("int8_sq")
    source = demo_models[family]
    convert_checkpoint(ConvertRequest(family, source, tmp_path / family, "float32", quantization=quantization),
                       console=QUIET)
    ids = heldout_ids[:4]
    with torch.no_grad():
        reference = fake_quantized(source, quantization)(ids).logits
    ours = runtime_logits(tmp_path / family, ids)
    agree = ours.argmax(-1) == reference.argmax(-1)
    best_two = reference.topk(2, dim=-1).values
    decided = best_two[..., 0] - best_two[..., 1] > CLEAR_LOGIT_MARGIN
    assert decided.float().mean().item() > 0.25, "too few clearly decided positions to judge"
    assert agree[decided].all(), (family, int((~agree[decided]).sum()))
    assert agree.float().mean().item() >= FLAT_AGREEMENT_MIN, (family, agree.float().mean().item())


EXPECTED_ALGOS = {"fp8": ("FP8", "FP8"), "int8_sq": ("W8A8_SQ_PER_CHANNEL", None), "int8_wo": ("W8A16", None),
                  "int4_awq": ("W4A16_AWQ", None), "w4a8_awq": ("W4A8_AWQ", None)}
SCALES = {
    "fp8": {"weights_scaling_factor", "activation_scaling_factor"},
    "int8_sq": {"weights_scaling_factor", "activation_scaling_factor", "prequant_scaling_factor"},
    "int8_wo": {"weights_scaling_factor"},
    "int4_awq": {"weights_scaling_factor", "prequant_scaling_factor"},
    "w4a8_awq": {"weights_scaling_factor", "weights_scaling_factor_2", "activation_scaling_factor",
                 "prequant_scaling_factor"},
}
WEIGHT_DTYPES = {"fp8": torch.float8_e4m3fn, "int8_sq": torch.int8, "int8_wo": torch.int8, "int4_awq": torch.int8,
                 "w4a8_awq": torch.int8}


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_checkpoint_layout(fmt: str, exports: dict[str, Path]) -> None:
    """What TensorRT-LLM reads (NVIDIA/TensorRT-LLM, docs/source/legacy/architecture/checkpoint.md): the quant_algo
    strings, quantized weight dtypes, each linear's scale tensors, float16 elsewhere, the vocabulary the target has
    (not ModelOpt's padded one), and the converter's own config fields (rotary_base) next to ModelOpt's
    quantization block."""
    config = json.loads((exports[fmt] / "config.json").read_text())
    assert (config["quantization"]["quant_algo"], config["quantization"]["kv_cache_quant_algo"]) == EXPECTED_ALGOS[fmt]
    assert config["quantization"]["group_size"] == 128
    assert config["dtype"] == "float16"
    assert config["rotary_base"] == 10000.0 and config["vocab_size"] == 2048
    assert config["intermediate_size"] == (384 if fmt in AWQ else 344)
    tensors = rank0(exports[fmt])
    for linear in ("attention.qkv", "attention.dense", "mlp.fc", "mlp.gate", "mlp.proj"):
        prefix = f"transformer.layers.1.{linear}."
        assert tensors[prefix + "weight"].dtype == WEIGHT_DTYPES[fmt]
        found = {name[len(prefix):] for name in tensors if name.startswith(prefix)} - {"weight"}
        assert found == SCALES[fmt], linear
    for scale in SCALES[fmt] & {"activation_scaling_factor", "prequant_scaling_factor"}:  # fc and gate: one input
        for layer in (0, 1):
            fc = f"transformer.layers.{layer}.mlp.fc.{scale}"
            assert torch.equal(tensors[fc], tensors[fc.replace(".fc.", ".gate.")]), fc
    assert tensors["lm_head.weight"].shape == tensors["transformer.vocab_embedding.weight"].shape == (2048, 128)
    assert tensors["lm_head.weight"].dtype == torch.float16
    if fmt in AWQ:  # two int4 rows per byte; one fp32 scale per 128 inputs
        assert tensors["transformer.layers.0.mlp.proj.weight"].shape == (64, 384)
        assert tensors["transformer.layers.0.mlp.proj.weights_scaling_factor"].shape == (128, 3)
    kv = {name for name in tensors if "cache_scaling_factor" in name}
    assert len(kv) == (3 * 2 if fmt == "fp8" else 0)  # k, v and their max, per layer


@pytest.mark.parametrize("fmt", ["int8_sq", "w4a8_awq"])
def test_coverage_check_names_what_is_wrong(fmt: str, sources: dict[str, Path], exports: dict[str, Path]) -> None:
    """The check every quantized export passes before it is written: the unquantized model definition plus the
    quant_algo's scales, with shapes and dtypes. It passes on the written checkpoint and names each defect."""
    request = ConvertRequest("draft", source_for(fmt, sources), exports[fmt], "float32", quantization=settings(fmt))
    checkpoint = HFCheckpoint(request.source)
    shapes = plan_conversion(request, checkpoint).rank_plans[0].shapes
    checkpoint.close()
    quant = json.loads((exports[fmt] / "config.json").read_text())["quantization"]
    expected = expected_tensors(shapes, quant, torch.float16)
    tensors = rank0(exports[fmt])
    assert coverage_problems(tensors, expected) == []
    prefix = "transformer.layers.1.mlp.proj."
    del tensors[prefix + "prequant_scaling_factor"]
    tensors[prefix + "activation_scaling_factor"] = torch.ones(2)
    tensors[prefix + "weight"] = tensors[prefix + "weight"].float()
    tensors["transformer.layers.1.mlp.proj.smooth"] = torch.ones(1)
    problems = "\n".join(coverage_problems(tensors, expected))
    assert f"tensor '{prefix}prequant_scaling_factor' is missing" in problems
    assert f"tensor '{prefix}activation_scaling_factor' is torch.float32 [2], expected torch.float32 [1]" in problems
    assert f"tensor '{prefix}weight' is torch.float32" in problems
    assert "unexpected tensors: 'transformer.layers.1.mlp.proj.smooth'" in problems


def test_unchanged_rerun_is_a_no_op_and_dry_run_writes_nothing(sources: dict[str, Path], tmp_path: Path) -> None:
    request = ConvertRequest("draft", sources["draft"], tmp_path / "out", "float32", quantization=settings("int8_wo"))
    dry = convert_checkpoint(request, dry_run=True, console=QUIET)
    assert dry.status == "planned" and not (tmp_path / "out").exists()
    first = convert_checkpoint(request, console=QUIET)
    assert first.status == "written" and first.dtype == "float16"
    manifest = json.loads((tmp_path / "out/manifest.json").read_text())
    assert manifest["settings"]["quantization"]["quant_algo"] == "W8A16"
    assert manifest["tools"]["nvidia-modelopt"] == "0.47.0"
    assert convert_checkpoint(request, console=QUIET).status == "up to date"
    changed = ConvertRequest("draft", sources["draft"], tmp_path / "out", "float32",
                             quantization=QuantizeSettings("int8_wo", "none", "builtin", 8, 128))
    assert convert_checkpoint(changed, console=QUIET).status == "written"


def test_calibration_from_a_directory_of_text_files(sources: dict[str, Path], tmp_path: Path) -> None:
    """A directory's .txt files are the calibration text (in name order), and editing one redoes the convert."""
    from specbuild.demo.models import training_texts

    calib = tmp_path / "calib"
    calib.mkdir()
    for i, text in enumerate(training_texts()[:6]):
        (calib / f"{i:02d}.txt").write_text(text)
    (calib / "ignored.md").write_text("not calibration text")
    quantization = QuantizeSettings("int8_sq", "none", calib, 4, 64)
    request = ConvertRequest("draft", sources["draft"], tmp_path / "out", "float32", quantization=quantization)
    convert_checkpoint(request, console=QUIET)
    manifest = json.loads((tmp_path / "out/manifest.json").read_text())
    assert sorted(Path(p).name for p in manifest["inputs"] if p.endswith(".txt")) == [f"{i:02d}.txt" for i in range(6)]
    assert manifest["settings"]["quantization"]["calib_samples"] == 4
    assert convert_checkpoint(request, console=QUIET).status == "up to date"
    (calib / "03.txt").write_text("different text entirely, " * 50)
    assert convert_checkpoint(request, console=QUIET).status == "written"


@pytest.mark.parametrize(("fmt", "tp", "pp"), [("int8_sq", 2, 1), ("fp8", 2, 2)])
def test_parallel_export_runs_like_one_rank(fmt: str, tp: int, pp: int, sources: dict[str, Path],
                                            exports: dict[str, Path], heldout_ids: torch.Tensor,
                                            tmp_path: Path) -> None:
    """tp/pp are passed to ModelOpt's export explicitly: SmoothQuant's pre-quant scales of the row-parallel
    layers are split with their inputs, the vocab-split embedding is put back whole, per-rank scales and the
    FP8 KV-cache scales are replicated, and the runtime merges the ranks into the tp=1 model (same logits up to
    float32 summation order)."""
    request = ConvertRequest("draft", sources["draft"], tmp_path / "ranks", "float32", tp_size=tp, pp_size=pp,
                             quantization=settings(fmt))
    convert_checkpoint(request, console=QUIET)
    assert len(list((tmp_path / "ranks").glob("rank*.safetensors"))) == tp * pp
    ids = heldout_ids[:2]
    assert torch.allclose(runtime_logits(tmp_path / "ranks", ids), runtime_logits(exports[fmt], ids), atol=1e-3)


def test_fp8_kv_cache_alone(sources: dict[str, Path], tmp_path: Path, heldout_ids: torch.Tensor) -> None:
    """`format: none, kv_cache: fp8`: float16 weights, an FP8 KV cache (quant_algo null, kv FP8); the runtime
    rounds keys and values to fp8, so its logits move a little from the float16 checkpoint's."""
    quantization = QuantizeSettings("none", "fp8", **CALIB)
    convert_checkpoint(ConvertRequest("draft", sources["draft"], tmp_path / "kv", "float32",
                                      quantization=quantization), console=QUIET)
    convert_checkpoint(ConvertRequest("draft", sources["draft"], tmp_path / "fp16", "float16"), console=QUIET)
    quant = json.loads((tmp_path / "kv/config.json").read_text())["quantization"]
    assert (quant["quant_algo"], quant["kv_cache_quant_algo"]) == (None, "FP8")
    ids = heldout_ids[:2]
    difference = (runtime_logits(tmp_path / "kv", ids) - runtime_logits(tmp_path / "fp16", ids)).abs()
    assert 1e-4 < difference.mean().item() < 0.1


# -- ModelOpt's gaps, each repaired and checked -------------------------------------------------------------------
LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192}


@pytest.fixture(scope="module")
def llama3_draft(demo_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama 3.1-style draft (rope_theta 500000, llama3 scaling) with the demo tokenizer."""
    model = make_model("llama", dtype=torch.float32, vocab_size=2048, hidden_size=128, intermediate_size=256,
                       num_hidden_layers=2, rope_parameters={"rope_theta": 500000.0, **LLAMA3_SCALING})
    out = save_model(model, tmp_path_factory.mktemp("llama3"))
    for file in demo_models["tokenizer"].iterdir():
        shutil.copy(file, out / file.name)
    return out


def test_rotary_settings_survive_quantized_export(llama3_draft: Path, tmp_path: Path) -> None:
    """ModelOpt 0.47's export under transformers 5 drops rotary_base and rotary_scaling (checked here on its raw
    output); the converter's checkpoint keeps both, and the runtime runs it."""
    quantization = settings("int4_awq")
    request = ConvertRequest("draft", llama3_draft, tmp_path / "ours", "float32", quantization=quantization)
    convert_checkpoint(request, console=QUIET)
    ours = json.loads((tmp_path / "ours/config.json").read_text())
    assert ours["rotary_base"] == 500000.0
    assert ours["rotary_scaling"] == LLAMA3_SCALING

    qplan, model = calibrate(request)
    raw = json.loads((export_modelopt(model, qplan, 1, 1, tmp_path / "raw") / "config.json").read_text())
    assert "rotary_base" not in raw and "rotary_scaling" not in raw  # the gap the repair closes
    assert raw["vocab_size"] == 2048 and raw["quantization"]["quant_algo"] == "W4A16_AWQ"
    CausalLM.from_checkpoint(tmp_path / "ours")


def test_configs_are_list_form_and_the_legacy_dict_trap_is_real(llama3_draft: Path) -> None:
    """Every config specbuild hands ModelOpt is the 0.44+ ordered list (KV entries appended, AWQ group set on the
    weight entries, never indexed by quantizer name). The legacy dict form with `default` last, as older
    recipes wrote it, turns every quantizer off, and 0.47 refuses it: the reason to build on the list form."""
    import modelopt.torch.quantization as mtq

    request = ConvertRequest("d", llama3_draft, llama3_draft / "unused", quantization=settings("fp8"))
    checkpoint = HFCheckpoint(llama3_draft)
    plan = plan_conversion(request, checkpoint)
    checkpoint.close()
    for fmt in FORMATS:
        config = modelopt_config(mtq, plan_quantization(
            ConvertRequest("d", llama3_draft, llama3_draft / "unused", quantization=settings(fmt)), plan))
        assert isinstance(config["quant_cfg"], list)
        assert all(isinstance(entry, dict) and "quantizer_name" in entry for entry in config["quant_cfg"])
        assert any(entry["quantizer_name"] == "*[kv]_bmm_quantizer" for entry in config["quant_cfg"]) == (fmt == "fp8")
    legacy = {"quant_cfg": {"*weight_quantizer": {"num_bits": 8, "axis": 0}, "default": {"enable": False}},
              "algorithm": "max"}
    model = make_model("llama", dtype=torch.float32)
    with warnings.catch_warnings(), pytest.raises(RuntimeError):
        warnings.simplefilter("ignore")
        mtq.quantize(model, legacy)


def test_default_inference_tensor_parallel_divides_by_zero(llama3_draft: Path, tmp_path: Path) -> None:
    """ModelOpt's default inference_tensor_parallel=0 raises ZeroDivisionError on one process; the converter
    always passes the spec's tp (and pp), as the tp=2 test above shows."""
    from modelopt.torch.export import export_tensorrt_llm_checkpoint

    _, model = calibrate(ConvertRequest("d", llama3_draft, tmp_path / "unused", quantization=settings("int8_wo")))
    with warnings.catch_warnings(), pytest.raises(ZeroDivisionError):
        warnings.simplefilter("ignore")
        export_tensorrt_llm_checkpoint(model, "llama", dtype=torch.float16, export_dir=tmp_path / "x")


# -- bad inputs: clear errors, nothing written --------------------------------------------------------------------
def _refused(request: ConvertRequest, match: str) -> None:
    with pytest.raises(SpecbuildError, match=match):
        convert_checkpoint(request, console=QUIET)
    assert not request.output.exists()
    assert not any(p.name.startswith(f".{request.output.name}.") for p in request.output.parent.iterdir())


def test_unknown_format_is_refused(sources: dict[str, Path], tmp_path: Path, demo_spec_text: str) -> None:
    _refused(ConvertRequest("draft", sources["draft"], tmp_path / "out",
                            quantization=QuantizeSettings("int3_magic", "none", **CALIB)),
             r"draft\.quantization\.format: unknown quantization format 'int3_magic'")
    with pytest.raises(SpecValidationError, match=r"draft\.quantization\.format"):
        parse_spec(yaml.safe_load(demo_spec_text.replace("format: int8_sq", "format: int3_magic")),
                   tmp_path / "spec.yaml")


def test_empty_calibration_sources_are_refused(sources: dict[str, Path], tmp_path: Path) -> None:
    empty_file = tmp_path / "empty.txt"
    empty_file.write_text("  \n\n")
    empty_dir = tmp_path / "nothing"
    empty_dir.mkdir()
    for source, match in ((empty_file, "calibration source is empty"),
                          (empty_dir, "calibration directory holds no .txt files"),
                          (tmp_path / "missing.txt", "calibration source does not exist")):
        quantization = QuantizeSettings("int8_sq", "none", source, 4, 64)
        _refused(ConvertRequest("draft", sources["draft"], tmp_path / "out", quantization=quantization), match)


def test_calibration_batches_are_whole_windows_never_repeated() -> None:
    calibration = CalibrationText(["a b c d e f g"], [], "calib.txt")

    def tokenizer(text: str, **_: Any) -> dict[str, list[int]]:
        return {"input_ids": list(range(len(text.split())))}

    assert [tuple(b.shape) for b in calibration_batches(calibration, tokenizer, 8, 3)] == [(1, 3), (1, 3)]
    assert [tuple(b.shape) for b in calibration_batches(calibration, tokenizer, 1, 3)] == [(1, 3)]
    assert [tuple(b.shape) for b in calibration_batches(calibration, tokenizer, 4, 10)] == [(1, 7)]
    with pytest.raises(CalibrationError, match=r"calib\.txt: calibration text gives no tokens"):
        calibration_batches(calibration, lambda text, **_: {"input_ids": []}, 4, 10)


def test_awq_on_a_model_whose_sizes_do_not_divide_into_groups(sources: dict[str, Path], tmp_path: Path) -> None:
    """The demo draft's MLP is 344 wide: no int4 group size TensorRT-LLM takes (128, 64) divides it."""
    _refused(ConvertRequest("draft", sources["draft"], tmp_path / "out", quantization=settings("int4_awq")),
             r"mlp\.proj\.weight is 344 wide")


# -- the spec -----------------------------------------------------------------------------------------------------
@pytest.fixture
def demo_spec_text() -> str:
    return (Path(__file__).resolve().parents[1] / "configs" / "demo.yaml").read_text()


def test_demo_spec_quantizes_the_draft(demo_spec_text: str, demo_models: dict[str, Path]) -> None:
    spec = parse_spec(yaml.safe_load(demo_spec_text), Path(__file__).resolve().parents[1] / "configs" / "demo.yaml")
    requests = {r.name: r for r in requests_from_spec(spec)}
    assert requests["target"].quantization is None
    quantization: Any = requests["draft"].quantization
    assert quantization is not None and quantization.format == "int8_sq" and quantization.calib_source == "builtin"
