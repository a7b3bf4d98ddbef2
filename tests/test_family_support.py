"""Every speculative method on the model families users deploy, or the engine's own reason where the engine cannot
run it (issue 49, "What users get" 3).

What users rely on: a spec asking an engine for a method it does not run on the model's family is refused by
`specbuild validate` (and by `export` for vLLM/SGLang, and by the trainers before they load anything) with the
engine's reason, where that reason was read, and what to do instead, at the spec line of the model whose family
is refused; the same spec with a family the engine does run passes that check. The refusals are parametrized from
`specbuild.contracts.family_support.REFUSALS`; each assertion reads the real command's output. The engines'
reasons themselves are facts read from their sources (cited in that module): TensorRT-LLM cannot run here, vLLM
and SGLang judge exports in `make test-engines`. Inputs: tiny random checkpoints written by transformers
(tests/tiny_models.py), EAGLE-3 drafts and Medusa heads in their real formats with zero tensors.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from typer.testing import CliRunner

from specbuild import corpus
from specbuild.cli import app
from specbuild.contracts.family_support import (
    ARCHITECTURES,
    REFUSALS,
    family,
    family_problems,
    reasons_markdown,
    support_markdown,
    support_table,
)
from specbuild.eagle.format import (
    fit_problems,
    read_eagle3_header,
    target_from_config,
)
from specbuild.errors import CheckpointError
from tests import test_validate_fit as validate_fit
from tests.tiny_models import FAMILIES, make_checkpoint

REPO = Path(__file__).resolve().parents[1]
runner = CliRunner()
FAMILY_OF = {spec[1].__name__: name for name, spec in FAMILIES.items()}
"""HF architecture -> tests/tiny_models.py family name."""
LIMITS = {"max_batch_size": 2, "max_input_len": 32, "max_output_len": 16}
DEEP = {"num_hidden_layers": 4}
"""Every tiny target has 4 layers, so that an EAGLE-3 draft capturing layers 0-2 fits it (Gemma 3's layer_types
already list 4)."""
SHALLOW = {"gemma3": {"num_hidden_layers": 1, "layer_types": ["sliding_attention"]}}
"""The draft-target drafts have one layer (a draft no smaller than its target is refused)."""
VOCAB = 512
"""Targets and drafts share one tokenizer trained on the built-in corpus (validate reads real tokenizer files)."""


def cli(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, " ".join(result.output.split())


def said(text: str) -> str:
    return " ".join(text.split())


def line_of(path: Path, needle: str) -> int:
    lines = path.read_text(encoding="utf-8").splitlines()
    return next(number for number, line in enumerate(lines, start=1) if needle in line)


def _config(model: Path) -> dict[str, Any]:
    return json.loads((model / "config.json").read_text())


def _size(config: dict[str, Any], *names: str) -> int:
    return next(config[name] for name in names if name in config)


def eagle3_draft(directory: Path, target: Path) -> Path:
    """An EAGLE-3 draft sized for `target` (zero tensors, the real format; tests/test_validate_fit.py's writer)."""
    config = _config(target)
    hidden = _size(config, "hidden_size", "n_embd")
    return validate_fit.eagle3_draft(directory, hidden_size=hidden, intermediate_size=2 * hidden,
                                     vocab_size=config["vocab_size"])


def medusa_heads(directory: Path, target: Path, heads: int = 2) -> Path:
    """FasterDecoding-format heads of `target`'s width and vocabulary (tests/test_validate_fit.py's writer)."""
    config = _config(target)
    return validate_fit.medusa_heads(directory, _size(config, "hidden_size", "n_embd"), config["vocab_size"], heads)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Path]]:
    """Per HF architecture: a tiny target, an EAGLE-3 draft and Medusa heads made for it."""
    from specbuild.demo.tokenizer import save_tokenizer, train_tokenizer

    root = tmp_path_factory.mktemp("families")
    tokenizer = train_tokenizer(corpus.training_texts()[:20], VOCAB)
    made: dict[str, dict[str, Path]] = {}
    for arch in ARCHITECTURES:
        name = FAMILY_OF[arch]
        target = make_checkpoint(root / name, name, vocab_size=VOCAB,
                                 **({"n_layer": 4} if name == "gpt2" else DEEP))
        draft = make_checkpoint(root / f"{name}-draft", name, seed=1, vocab_size=VOCAB,
                                **({"n_layer": 1} if name == "gpt2" else SHALLOW.get(name, {"num_hidden_layers": 1})))
        for model in (target, draft):
            save_tokenizer(tokenizer, model, 256)
        made[arch] = {"target": target, "draft": draft, "eagle3": eagle3_draft(root / f"{name}-eagle3", target),
                      "heads": medusa_heads(root / f"{name}-heads", target)}
    return made


def spec_for(directory: Path, files: dict[str, Path], method: str, engine: str) -> Path:
    """A spec asking `engine` for `method` on the family of `files["target"]`."""
    build: dict[str, Any] = {**LIMITS, "flow": "pytorch" if engine == "pytorch" else "engine"}
    data: dict[str, Any] = {"name": "families", "output_dir": str(directory / "out"),
                            "target": {"model": str(files["target"])}}
    if method == "eagle3":
        build["backend"] = "tensorrt"  # TensorRT-LLM's own PyTorch backend, not specbuild's reference runtime
        data |= {"draft": {"model": str(files["eagle3"])}, "speculative": {"mode": "eagle3"}}
    elif method == "medusa":
        data |= {"medusa": {"heads": str(files["heads"])}, "speculative": {"mode": "medusa"}}
    elif method == "quantized_draft":
        data |= {"draft": {"model": str(files["target"]), "quantization": {"format": "fp8"}},
                 "speculative": {"mode": "draft_target"}}
    elif method == "draft_target":
        data |= {"draft": {"model": str(files["draft"])}, "speculative": {"mode": "draft_target"}}
    elif method == "model":
        data |= {"speculative": {"mode": "ngram" if engine == "pytorch" else "none"}}
    data["build"] = build
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "pipeline.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


WHERE = {"eagle3": ("target", "model"), "medusa": ("target", "model"), "model": ("target", "model"),
         "quantized_draft": ("draft", "quantization")}
"""The spec field each method's refusal is said at: the model whose family is refused."""
AT_VALIDATE = sorted(key for key in REFUSALS if key[2] in ("engine", "pytorch") and key[1] in WHERE)
AT_EXPORT = sorted(key for key in REFUSALS if key[2] in ("vllm", "sglang"))


def _refusal_said(text: str, key: tuple[str, str, str]) -> None:
    refusal = REFUSALS[key]
    assert f"is a {family(key[0])}" in text, text
    assert said(refusal.reason) in text, text
    assert said(refusal.source) in text, text
    assert said(refusal.instead) in text, text


@pytest.mark.parametrize("key", AT_VALIDATE, ids=["-".join(k) for k in AT_VALIDATE])
def test_validate_refuses_what_the_engine_cannot_run_on_the_family(
        key: tuple[str, str, str], models: dict[str, dict[str, Path]], tmp_path: Path) -> None:
    arch, method, engine = key
    spec = spec_for(tmp_path, models[arch], method, engine)
    code, text = cli("validate", str(spec))
    assert code == 1, text
    field = ".".join(WHERE[method])
    needle = {"draft.quantization": "quantization:"}.get(field, f"model: {models[arch]['target']}")
    assert f"{spec}:{line_of(spec, needle)}: {field}: " in text, text
    _refusal_said(text, key)


@pytest.mark.parametrize("command", ["convert", "build", "deploy", "tune"])
def test_each_stage_stops_on_the_family_refusal_first(
        command: str, models: dict[str, dict[str, Path]], tmp_path: Path) -> None:
    """The stages check the spec's families before any work (contracts.llm_api.flow_problems): Medusa heads on a
    Qwen3 target stop `convert` (and every later stage) with TensorRT-LLM's reason, writing nothing."""
    key = ("Qwen3ForCausalLM", "medusa", "engine")
    spec = spec_for(tmp_path, models[key[0]], "medusa", "engine")
    code, text = cli(command, str(spec))
    assert code == 1, text
    _refusal_said(text, key)
    assert not (tmp_path / "out").exists()


SUPPORTED = [(arch, method, engine) for method, engine in (("eagle3", "pytorch"), ("medusa", "engine"))
             for arch in ("LlamaForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "MixtralForCausalLM")
             if (arch, method, engine) not in REFUSALS]


@pytest.mark.parametrize("key", SUPPORTED, ids=["-".join(k) for k in SUPPORTED])
def test_a_family_the_engine_runs_passes_the_family_check(
        key: tuple[str, str, str], models: dict[str, dict[str, Path]], tmp_path: Path) -> None:
    """The control for the refusals: the same spec on a family the engine runs the method on says nothing about
    the family (validate's other checks, e.g. a converter not written yet, are theirs)."""
    arch, method, engine = key
    _, text = cli("validate", str(spec_for(tmp_path, models[arch], method, engine)))
    assert "cannot run" not in text, text
    from specbuild.spec import load_spec

    assert family_problems(load_spec(tmp_path / "pipeline.yaml")) == []


NEW_FAMILIES = ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "MixtralForCausalLM", "Gemma2ForCausalLM",
                "Gemma3ForCausalLM", "Phi3ForCausalLM")


@pytest.mark.parametrize("arch", NEW_FAMILIES)
def test_draft_target_with_a_draft_of_the_same_family_validates_and_exports(
        arch: str, models: dict[str, dict[str, Path]], tmp_path: Path) -> None:
    """Draft-target runs on every engine for every new family: the spec validates on both TensorRT-LLM flows
    (the engine flow's converter planning and build checks included), a self-draft of the target's first layer
    validates on the engine flow, and the spec exports to vLLM and SGLang with the draft as their draft model."""
    for flow in ("engine", "pytorch"):
        spec = spec_for(tmp_path / flow, models[arch], "draft_target", flow)
        code, text = cli("validate", str(spec))
        assert code == 0, (flow, text)
    spec = spec_for(tmp_path / "self", models[arch], "draft_target", "engine")  # the target's first layer drafts
    data = yaml.safe_load(spec.read_text())
    data["draft"] = {"source": "target_layers", "layers": 1}
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    code, text = cli("validate", str(spec))
    assert code == 0, ("self-draft", text)
    draft = str(models[arch]["draft"])
    for engine, method in (("vllm", '"method": "draft_model"'), ("sglang", "STANDALONE")):
        code, text = cli("export", engine, str(tmp_path / "pytorch" / "pipeline.yaml"), "--dry-run")
        assert code == 0, (engine, text)
        assert method in text and draft in text, (engine, text)


@pytest.mark.parametrize("key", AT_EXPORT, ids=["-".join(k) for k in AT_EXPORT])
def test_export_refuses_eagle3_on_a_target_the_engine_captures_nothing_from(
        key: tuple[str, str, str], models: dict[str, dict[str, Path]], tmp_path: Path) -> None:
    arch, method, engine = key
    assert method == "eagle3"
    spec = spec_for(tmp_path, models[arch], "eagle3", "pytorch")
    code, text = cli("export", engine, str(spec), "--dry-run")
    assert code == 1, text
    _refusal_said(text, key)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("arch", "engine"), [("Gemma3ForCausalLM", "sglang"), ("Phi3ForCausalLM", "vllm"),
                                              ("Qwen3ForCausalLM", "vllm"), ("Qwen3MoeForCausalLM", "sglang")])
def test_export_writes_eagle3_for_a_target_the_engine_serves_it_on(
        arch: str, engine: str, models: dict[str, dict[str, Path]], tmp_path: Path) -> None:
    """Gemma 3 is refused by vLLM and taken by SGLang, Phi-3 the other way round: the check is per engine."""
    spec = spec_for(tmp_path, models[arch], "eagle3", "pytorch")
    code, text = cli("export", engine, str(spec), "--dry-run")
    assert code == 0, text
    assert ("EAGLE3" if engine == "sglang" else "eagle3") in text, text


@pytest.mark.parametrize(("engine", "arch", "refused"), [("vllm", "Gemma3ForCausalLM", True),
                                                         ("sglang", "Gemma3ForCausalLM", False),
                                                         ("sglang", "MixtralForCausalLM", True)])
def test_a_dynamo_deployment_is_judged_by_its_workers_engine(
        engine: str, arch: str, refused: bool, models: dict[str, dict[str, Path]], tmp_path: Path) -> None:
    """deploy.target: dynamo with vLLM or SGLang workers: those engines' reasons apply, not TensorRT-LLM's (which
    refuses EAGLE-3 on Gemma 3 whatever the worker)."""
    spec = spec_for(tmp_path, models[arch], "eagle3", "pytorch")
    data = yaml.safe_load(spec.read_text())
    data["deploy"] = {"target": "dynamo", "dynamo": {"engine": engine}}
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    _, text = cli("validate", str(spec))
    key = (arch, "eagle3", engine)
    if refused:
        _refusal_said(text, key)
    else:
        assert "cannot run" not in text, text


# -- the trainers refuse before loading anything ---------------------------------------------------------------------
@pytest.mark.parametrize("arch", sorted(a for a, m, _ in REFUSALS if m == "eagle3_training"))
def test_eagle_train_refuses_a_target_no_engine_serves_eagle3_on(
        arch: str, models: dict[str, dict[str, Path]], tmp_path: Path) -> None:
    code, text = cli("eagle", "train", str(models[arch]["target"]), str(tmp_path / "draft"))
    assert code == 1, text
    refusal = REFUSALS[(arch, "eagle3_training", "specbuild")]
    assert f"a {family(arch)} target: no engine serves an EAGLE-3 draft on this target" in text, text
    assert said(refusal.instead) in text
    assert not (tmp_path / "draft").exists()


@pytest.mark.parametrize("arch", sorted(a for a, m, _ in REFUSALS if m == "medusa_training"))
def test_medusa_train_refuses_a_base_no_engine_serves_medusa_on(
        arch: str, models: dict[str, dict[str, Path]], tmp_path: Path) -> None:
    from specbuild.medusa.train import train_medusa_heads

    with pytest.raises(CheckpointError, match=re.escape(f"a {family(arch)} base: no engine serves Medusa heads")):
        train_medusa_heads(models[arch]["target"], tmp_path / "heads", steps=1, progress=False)
    code, text = cli("medusa", "train", "--joint", "--base", str(models[arch]["target"]), "--output",
                     str(tmp_path / "joint"), "--steps", "1")
    assert code == 1 and f"a {family(arch)} base: no engine serves Medusa heads" in text, text
    assert not (tmp_path / "heads").exists() and not (tmp_path / "joint").exists()


@pytest.mark.parametrize("arch", sorted(a for a, m, _ in REFUSALS if m == "self_draft_adapter"))
def test_draft_train_refuses_a_target_it_cannot_train_an_adapter_for(
        arch: str, models: dict[str, dict[str, Path]], tmp_path: Path) -> None:
    code, text = cli("draft", "train", "--target", str(models[arch]["target"]), "--layers", "1", "--output",
                     str(tmp_path / "adapter"))
    assert code == 1, text
    refusal = REFUSALS[(arch, "self_draft_adapter", "specbuild")]
    assert f"a {family(arch)} target: {said(refusal.reason)}" in text, text
    assert not (tmp_path / "adapter").exists()


@pytest.mark.parametrize("name", ["qwen3", "phi3"])
def test_a_self_draft_adapter_trains_and_converts_for_qwen3_and_phi3(name: str, tmp_path: Path) -> None:
    """The adapter trainer's new families: distillation lowers the held-out KL of the adapter draft below its
    start (a copy of the target's own layer L; both measured in the same run), a spec using the adapter validates
    (convert's planning reads the adapter's tensors as the target's layer L: Phi-3's fused projections too), and
    the converted self-draft decodes losslessly on the reference runtime."""
    from specbuild.self_draft.train import train_adapter

    target = _quantizable(tmp_path / "target", name, num_hidden_layers=4)  # the draft: 2 of its 4 layers

    metrics = train_adapter(target, tmp_path / "adapter", layers=1, steps=30, seq_len=32, batch_size=4, lr=3e-3,
                            texts=corpus.training_texts()[:40], eval_texts=corpus.heldout_texts()[:6],
                            progress=False)
    assert metrics["kl"] < metrics["init_kl"], metrics
    data = {"name": "adapter", "output_dir": str(tmp_path / "out"), "target": {"model": str(target)},
            "draft": {"source": "target_layers", "layers": 1, "adapter": str(tmp_path / "adapter")},
            "speculative": {"mode": "draft_target"}, "build": LIMITS}
    spec = tmp_path / "pipeline.yaml"
    spec.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    code, text = cli("validate", str(spec))
    assert code == 0, text
    _self_draft_serves_losslessly(target, tmp_path / "adapter", tmp_path)


def _self_draft_serves_losslessly(hf_target: Path, adapter: Path, root: Path) -> None:
    """The adapter's self-draft, converted as `convert` writes it, on the reference runtime: greedy draft-target
    output (as a separate draft checkpoint, and sharing the target's layers) is the target's plain greedy output."""
    from specbuild.convert.pipeline import ConvertRequest, convert_checkpoint
    from specbuild.runtime.generation import generate
    from specbuild.runtime.model import CausalLM
    from specbuild.runtime.self_draft import generate_self_draft
    from specbuild.runtime.sequence import StopCriteria
    from specbuild.runtime.speculative import generate_draft_target

    convert_checkpoint(ConvertRequest("target", hf_target, root / "trt-target", "float32"))
    convert_checkpoint(ConvertRequest("draft", hf_target, root / "trt-draft", "float32", self_draft_layers=1,
                                      self_draft_adapter=adapter))
    target = CausalLM.from_checkpoint(root / "trt-target")
    prompts, stop = [[5, 9, 30, 41, 7, 12], [11, 12]], StopCriteria(max_new_tokens=16)
    plain = generate(target, prompts, stop=stop).output_ids
    separate = generate_draft_target(target, CausalLM.from_checkpoint(root / "trt-draft"), prompts, stop=stop)
    shared = generate_self_draft(target, 1, prompts, stop=stop, adapter=root / "trt-draft")
    assert separate.output_ids == plain and shared.output_ids == plain
    assert sum(shared.stats.accepted_by_position) > 0, shared.stats


def test_medusa_heads_on_a_mixtral_base_train_convert_and_decode_losslessly(tmp_path: Path) -> None:
    """Mixtral is a base TensorRT-LLM's Medusa takes (--model_type mixtral): `medusa train` trains heads on it,
    convert joins them with the MoE base as one MedusaForCausalLM checkpoint, and the reference runtime's Medusa
    greedy output is the base's plain greedy output."""
    from specbuild.convert.pipeline import ConvertRequest, convert_checkpoint
    from specbuild.medusa.train import train_medusa_heads
    from specbuild.runtime.generation import generate
    from specbuild.runtime.medusa_decoding import MedusaConfig, generate_medusa
    from specbuild.runtime.model import CausalLM
    from specbuild.runtime.sequence import StopCriteria

    base = _quantizable(tmp_path / "base", "mixtral")
    train_medusa_heads(base, tmp_path / "heads", num_heads=2, steps=20, seq_len=32, batch_size=4,
                       texts=corpus.training_texts()[:40], eval_texts=corpus.heldout_texts()[:4], progress=False)
    choices = ((0,), (1,), (0, 0))
    convert_checkpoint(ConvertRequest("medusa", base, tmp_path / "trt", "float32", medusa_heads=tmp_path / "heads",
                                      medusa_tree_nodes=len(choices)))
    assert _config(tmp_path / "trt")["architecture"] == "MedusaForCausalLM"
    model = CausalLM.from_checkpoint(tmp_path / "trt")
    prompts, stop = [[5, 9, 30, 41, 7], [11, 12]], StopCriteria(max_new_tokens=16)
    medusa = generate_medusa(model, prompts, MedusaConfig(choices), stop=stop)
    assert medusa.output_ids == generate(model, prompts, stop=stop).output_ids
    assert medusa.stats.proposed_by_position  # the heads proposed and were verified


# -- EAGLE-3 training on the new families ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["qwen3", "gemma3"])
def test_eagle_train_trains_a_draft_for_qwen3_and_gemma3_targets(name: str, tmp_path: Path) -> None:
    """The families users pair with EAGLE-3 drafts today: training lowers the draft's held-out loss against the
    target's own distribution and raises its agreement with the target's next token (both measured in the same
    run against the untrained draft), and the draft written fits its target as the
    engines' loaders read the pair (specbuild.eagle.format.fit_problems); on Qwen3 the reference runtime serves it
    losslessly."""
    from specbuild.demo.tokenizer import save_tokenizer, train_tokenizer
    from specbuild.eagle.train import Eagle3TrainSettings, train_eagle3

    texts, held = corpus.training_texts()[:40], corpus.heldout_texts()[:6]
    layers = {"layer_types": ["sliding_attention"] * 5 + ["full_attention"] + ["sliding_attention"] * 2} \
        if name == "gemma3" else {}
    target = make_checkpoint(tmp_path / "target", name, seed=3, dtype=torch.float32, num_hidden_layers=8,
                             vocab_size=512, bos_token_id=1, eos_token_id=2, pad_token_id=3, **layers)
    save_tokenizer(train_tokenizer(texts, 512), target, 256)
    settings = Eagle3TrainSettings(steps=40, lr=5e-3, seq_len=32, batch_size=4, seed=1)
    metrics = train_eagle3(target, tmp_path / "draft", settings, texts=texts, eval_texts=held, progress=False)
    assert metrics["loss"] < metrics["init_loss"], metrics
    assert metrics["step1_top1"] > metrics["init_step1_top1"], metrics
    config, shapes = read_eagle3_header(tmp_path / "draft")
    fitted = target_from_config(_config(target), target / "config.json")
    assert fit_problems(config, fitted, own_embedding="embed_tokens.weight" in shapes, llama_only=False) == []
    if name == "qwen3":  # the reference runtime serves a Qwen3 target's EAGLE-3 draft (Gemma: only SGLang does)
        _eagle3_serves_losslessly(target, tmp_path / "draft", tmp_path / "trt")


def _eagle3_serves_losslessly(hf_target: Path, draft_dir: Path, checkpoint: Path) -> None:
    """The trained draft on the reference runtime: EAGLE-3 greedy output is the target's plain greedy output
    token for token, with some of the draft's tokens accepted (a 40-step draft on a random target accepts few)."""
    from specbuild.convert.pipeline import ConvertRequest, convert_checkpoint
    from specbuild.runtime.eagle3 import Eagle3Draft
    from specbuild.runtime.eagle3_decoding import Eagle3Config, generate_eagle3
    from specbuild.runtime.generation import generate
    from specbuild.runtime.model import CausalLM
    from specbuild.runtime.sequence import StopCriteria
    from specbuild.tokenizer import load_tokenizer

    convert_checkpoint(ConvertRequest("target", hf_target, checkpoint, "float32"))
    target = CausalLM.from_checkpoint(checkpoint)
    draft = Eagle3Draft.from_directory(draft_dir, target)
    tokenizer = load_tokenizer(hf_target)
    prompts = [tokenizer.encode(text, add_special_tokens=False)[:length]
               for text, length in zip(corpus.heldout_texts()[:2], (12, 5), strict=True)]
    stop = StopCriteria(max_new_tokens=24)
    plain = generate(target, prompts, stop=stop)
    speculative = generate_eagle3(target, draft, prompts, Eagle3Config(3), stop=stop)
    assert speculative.output_ids == plain.output_ids
    assert sum(speculative.stats.accepted_by_position) > 0, speculative.stats  # the draft ran and was verified


# -- draft quantization (ModelOpt) ------------------------------------------------------------------------------------
def _quantizable(directory: Path, name: str, **overrides: Any) -> Path:
    """A tiny float32 model of family `name` with a tokenizer (calibration tokenizes with the draft's own)."""
    from specbuild.demo.tokenizer import save_tokenizer, train_tokenizer

    source = make_checkpoint(directory, name, seed=3, dtype=torch.float32, vocab_size=512, bos_token_id=1,
                             eos_token_id=2, pad_token_id=3, **overrides)
    save_tokenizer(train_tokenizer(corpus.training_texts()[:40], 512), source, 256)
    return source


def _fp8(**changes: Any) -> Any:
    from dataclasses import replace

    from specbuild.convert.quantize.settings import QuantizeSettings

    return replace(QuantizeSettings("fp8", "none", calib_source="builtin", calib_size=8, calib_seq_len=64),
                   **changes)


@pytest.mark.parametrize("fmt", ["int8_sq", "fp8"])
def test_a_qwen3_draft_quantizes_for_the_engine_flow_and_runs_as_modelopt_computes(fmt: str, tmp_path: Path) -> None:
    """ModelOpt's TensorRT-LLM export takes Qwen3 (decoder type "qwen", q/k norms included): `specbuild convert`
    writes the quantized checkpoint (repaired and coverage-checked as for Llama), and the reference runtime's
    logits on it are ModelOpt's own fake-quantized model's (the agreement reference tests/test_quantize.py uses)."""
    from rich.console import Console

    from specbuild.convert.pipeline import ConvertRequest, convert_checkpoint
    from specbuild.convert.quantize.settings import QuantizeSettings
    from tests.test_quantize import fake_quantized, runtime_logits

    source = _quantizable(tmp_path / "source", "qwen3")
    quantization = QuantizeSettings(fmt, "none", calib_source="builtin", calib_size=8, calib_seq_len=64)
    convert_checkpoint(ConvertRequest("draft", source, tmp_path / "out", "float32", quantization=quantization),
                       console=Console(stderr=True, quiet=True))
    written = _config(tmp_path / "out")
    assert written["architecture"] == "Qwen3ForCausalLM" and written["quantization"]["quant_algo"] is not None
    ids = torch.randint(4, 500, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        reference = fake_quantized(source, quantization)(ids).logits
    torch.testing.assert_close(runtime_logits(tmp_path / "out", ids), reference, atol=1e-3, rtol=0)


@pytest.mark.parametrize("name", ["gemma2", "qwen3_moe"])
def test_convert_refuses_the_engine_flow_quantization_before_calibrating(name: str, tmp_path: Path) -> None:
    """`convert` on its own (a request, not a spec validate has seen) says ModelOpt's reason before loading the
    model, and writes nothing."""
    from rich.console import Console

    from specbuild.convert.pipeline import ConvertRequest, convert_checkpoint
    from specbuild.errors import SpecbuildError

    arch = FAMILIES[name][1].__name__
    source = _quantizable(tmp_path / "source", name)
    with pytest.raises(SpecbuildError) as caught:
        convert_checkpoint(ConvertRequest("draft", source, tmp_path / "out", "float32", quantization=_fp8()),
                           console=Console(stderr=True, quiet=True))
    refusal = REFUSALS[(arch, "quantized_draft", "engine")]
    assert f"is a {family(arch)}: {refusal.reason}" in caught.value.message
    assert caught.value.hint == refusal.instead
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["gemma3", "phi3", "mixtral"])
def test_a_draft_refused_for_the_engine_flow_quantizes_on_the_pytorch_flow(name: str, tmp_path: Path) -> None:
    """What the engine flow's refusal tells the user to do instead works: ModelOpt's Hugging Face export (what
    build.flow: pytorch loads) quantizes these families' linears to FP8 through specbuild's convert path."""
    from rich.console import Console
    from safetensors import safe_open

    from specbuild.convert.pipeline import ConvertRequest, convert_checkpoint
    from specbuild.convert.quantize.settings import HF

    arch = FAMILIES[name][1].__name__
    assert (arch, "quantized_draft", "engine") in REFUSALS
    assert "build.flow: pytorch" in REFUSALS[(arch, "quantized_draft", "engine")].instead
    source = _quantizable(tmp_path / "source", name)
    request = ConvertRequest("draft-hf", source, tmp_path / "out", "float32", quantization=_fp8(export=HF))
    convert_checkpoint(request, console=Console(stderr=True, quiet=True))
    with safe_open(str(tmp_path / "out" / "model.safetensors"), "pt") as fh:
        fp8 = [key for key in fh.keys() if fh.get_slice(key).get_dtype() == "F8_E4M3"]  # noqa: SIM118
    assert fp8 and all(key.endswith("weight") for key in fp8), fp8


# -- the docs -------------------------------------------------------------------------------------------------------
def test_the_docs_table_is_the_contract_table() -> None:
    """docs/methods/families.md's table and its list of the engines' reasons are the contract's, rendered: a change
    to the table without the docs (or the other way round) fails here."""
    page = (REPO / "docs" / "methods" / "families.md").read_text(encoding="utf-8")
    assert support_markdown() in page
    assert reasons_markdown() in page
    rows = support_table()
    assert len(rows) == len(ARCHITECTURES) + 1 and all(cell in ("yes", "no") for row in rows[1:] for cell in row[1:])
