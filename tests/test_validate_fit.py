"""`specbuild validate` knows, before anything is converted or served, whether the models beside the target fit it
and are the kind the mode needs, and `specbuild export` refuses what its engine would: each refusal is one message
at the spec's file:line and field saying what is wrong (issue 21, "What users get" 3).

The faults are the ones a fault round found passing validate and failing late: an EAGLE-3 spec whose draft is a
plain model, made for another target or missing; capture layers outside the target; Medusa heads of another width
or vocabulary; a self-draft adapter of another target (said at draft.adapter); an export of a draft that is missing
or not the mode's kind. Inputs are tiny: a random Llama target (tests/tiny_models.py), EAGLE-3 drafts and heads
written in their real formats with zero tensors, configs edited by hand. No weight is loaded by validate.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from specbuild.cli import app
from specbuild.eagle.format import Eagle3DraftConfig, expected_shapes, write_eagle3_draft
from specbuild.self_draft.adapter_format import CONFIG_NAME as ADAPTER_CONFIG
from specbuild.self_draft.adapter_format import FORMAT as ADAPTER_FORMAT
from specbuild.self_draft.adapter_format import WEIGHTS_NAME as ADAPTER_WEIGHTS
from tests.tiny_models import FAMILIES, make_checkpoint

REPO = Path(__file__).resolve().parents[1]
HIDDEN, VOCAB, LAYERS = (FAMILIES["llama"][2][key] for key in ("hidden_size", "vocab_size", "num_hidden_layers"))
"""The tiny Llama target's sizes (tests/tiny_models.py)."""
CAPTURED = (0, 1, 2)
"""The layers the fitting EAGLE-3 draft says it was trained on (explicit: the tiny target is too shallow for
TensorRT-LLM's default)."""
L = 2
"""The self-draft's draft.layers."""
LIMITS = {"max_batch_size": 2, "max_input_len": 32, "max_output_len": 16}
runner = CliRunner()


# -- helpers --------------------------------------------------------------------------------------------------------
def cli(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, " ".join(result.output.split())


def line_of(path: Path, needle: str) -> int:
    lines = path.read_text(encoding="utf-8").splitlines()
    return next(number for number, line in enumerate(lines, start=1) if needle in line)


def at(spec: Path, needle: str, field: str) -> str:
    """How a problem of `field`, written on the line holding `needle`, begins: `<spec>:<line>: <field>: `."""
    return f"{spec}:{line_of(spec, needle)}: {field}: "


def write_spec(directory: Path, target: Path, mode: str, **sections: Any) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    build = {**LIMITS, **({"flow": "pytorch", "backend": "reference"} if mode == "eagle3" else {}),
             **sections.pop("build", {})}
    data = {"name": "fit", "output_dir": str(directory / "out"), "target": {"model": str(target)}, **sections,
            "speculative": {"mode": mode, **sections.pop("speculative", {})}, "build": build}
    path = directory / "pipeline.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def eagle3_draft(directory: Path, **changes: Any) -> Path:
    """An EAGLE-3 draft for the tiny target (zero tensors, the real format), with `changes` to its config."""
    config = Eagle3DraftConfig(**{"hidden_size": HIDDEN, "intermediate_size": 2 * HIDDEN, "num_attention_heads": 4,
                                  "num_key_value_heads": 2, "vocab_size": VOCAB, "target_layer_ids": CAPTURED,
                                  **changes})
    tensors = {name: torch.zeros(shape) for name, shape in expected_shapes(config).items()
               if name not in ("d2t", "t2d", "embed_tokens.weight")}
    return write_eagle3_draft(directory, config, tensors)


def medusa_heads(directory: Path, hidden: int = HIDDEN, vocab: int = VOCAB, heads: int = 3) -> Path:
    """FasterDecoding-format heads (one ResBlock each) of this width and vocabulary."""
    directory.mkdir(parents=True)
    state: dict[str, torch.Tensor] = {}
    for h in range(heads):
        state[f"{h}.0.linear.weight"] = torch.zeros(hidden, hidden, dtype=torch.float16)
        state[f"{h}.0.linear.bias"] = torch.zeros(hidden, dtype=torch.float16)
        state[f"{h}.1.weight"] = torch.zeros(vocab, hidden, dtype=torch.float16)
    save_file(state, directory / "medusa_lm_head.safetensors")
    (directory / "config.json").write_text(json.dumps({"medusa_num_heads": heads, "medusa_num_layers": 1}))
    return directory


def adapter_of(model: Path, directory: Path) -> Path:
    """A self-draft adapter cut from `model`'s own layer L, as `specbuild draft train` lays one out."""
    config = json.loads((model / "config.json").read_text())
    prefix = f"model.layers.{L}."
    weights = {k: v for k, v in load_file(model / "model.safetensors").items() if k.startswith(prefix)}
    directory.mkdir(parents=True)
    save_file(weights, directory / ADAPTER_WEIGHTS)
    (directory / ADAPTER_CONFIG).write_text(json.dumps({
        "format": ADAPTER_FORMAT, "layers": L, "hidden_size": config["hidden_size"],
        "num_hidden_layers": config["num_hidden_layers"], "model_type": config["model_type"]}))
    return directory


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    root = tmp_path_factory.mktemp("fit")
    target = make_checkpoint(root / "target", "llama")
    Tokenizer(WordLevel({"[UNK]": 0}, unk_token="[UNK]")).save(str(target / "tokenizer.json"))  # deploy copies one
    narrow = make_checkpoint(root / "narrow", "llama", hidden_size=HIDDEN // 2, intermediate_size=HIDDEN)
    return {
        "target": target,
        "plain": make_checkpoint(root / "plain", "llama", seed=1, num_hidden_layers=2),
        "eagle3": eagle3_draft(root / "eagle3"),
        "heads": medusa_heads(root / "heads"),
        "adapter": adapter_of(target, root / "adapter"),
        "narrow-adapter": adapter_of(narrow, root / "narrow-adapter"),
        "missing": root / "missing",
    }


# -- EAGLE-3 --------------------------------------------------------------------------------------------------------
def test_a_fitting_eagle3_draft_validates(tmp_path: Path, models: dict[str, Path]) -> None:
    """The control for the refusals below: the same spec with a draft made for this target passes."""
    code, text = cli("validate", str(write_spec(tmp_path, models["target"], "eagle3",
                                                draft={"model": str(models["eagle3"])})))
    assert code == 0, text
    assert "error" not in text and "warning" not in text


def test_an_eagle3_spec_with_a_plain_draft_model_is_refused(tmp_path: Path, models: dict[str, Path]) -> None:
    spec = write_spec(tmp_path, models["target"], "eagle3", draft={"model": str(models["plain"])})
    code, text = cli("validate", str(spec))
    assert code == 1
    assert at(spec, f"model: {models['plain']}", "draft.model") + f"{models['plain'] / 'config.json'}: " \
        "architectures is ['LlamaForCausalLM'], not an EAGLE-3 draft" in text


def test_a_missing_eagle3_draft_directory_is_refused(tmp_path: Path, models: dict[str, Path]) -> None:
    spec = write_spec(tmp_path, models["target"], "eagle3", draft={"model": str(models["missing"])})
    code, text = cli("validate", str(spec))
    assert code == 1
    assert at(spec, f"model: {models['missing']}", "draft.model") + \
        f"{models['missing']}: EAGLE-3 draft directory does not exist" in text


@pytest.mark.parametrize(("made_for", "changes", "said"), [
    ("another vocabulary", {"vocab_size": VOCAB // 2}, "vocab_size"),
    ("another width", {"hidden_size": HIDDEN // 2, "intermediate_size": HIDDEN}, "hidden_size"),
    ("a deeper target", {"target_layer_ids": (0, LAYERS + 1, 2 * LAYERS)}, "eagle_aux_hidden_state_layer_ids"),
])
def test_an_eagle3_draft_made_for_another_target_is_refused(tmp_path: Path, models: dict[str, Path], made_for: str,
                                                             changes: dict[str, Any], said: str) -> None:
    draft = eagle3_draft(tmp_path / "draft", **changes)
    spec = write_spec(tmp_path, models["target"], "eagle3", draft={"model": str(draft)})
    code, text = cli("validate", str(spec))
    assert code == 1
    begins = at(spec, f"model: {draft}", "draft.model") + f"{draft}: this EAGLE-3 draft does not fit target.model"
    assert begins in text
    assert said in text.split(begins)[1]


@pytest.mark.parametrize(("layers", "said"), [
    ([0, 1, 99], "[99] is not a layer of the target's"),
    ([0, 1], "2 layers, but the draft's fc reads 3"),
    ([0, 0, 1], "names a layer twice"),
])
def test_capture_layers_the_target_or_the_draft_cannot_have_are_refused(tmp_path: Path, models: dict[str, Path],
                                                                        layers: list[int], said: str) -> None:
    spec = write_spec(tmp_path, models["target"], "eagle3", draft={"model": str(models["eagle3"])},
                      speculative={"eagle3": {"eagle3_layers_to_capture": layers}})
    code, text = cli("validate", str(spec))
    assert code == 1
    field = "speculative.eagle3.eagle3_layers_to_capture"
    assert at(spec, "eagle3_layers_to_capture", field) + f"{json.dumps(layers)}: " in text
    assert said in text


def test_capture_layers_the_reference_runtime_would_ignore_are_refused(tmp_path: Path,
                                                                       models: dict[str, Path]) -> None:
    """The reference runtime serves the draft with the layers it was trained on: other (valid) layers in the spec
    would be deployed as written and not served so; the same layers in another order are the same capture."""
    other = [i + 1 for i in CAPTURED]
    spec = write_spec(tmp_path, models["target"], "eagle3", draft={"model": str(models["eagle3"])},
                      speculative={"eagle3": {"eagle3_layers_to_capture": other}})
    code, text = cli("validate", str(spec))
    assert code == 1
    assert at(spec, "eagle3_layers_to_capture", "speculative.eagle3.eagle3_layers_to_capture") in text
    assert f"trained on the target's layers {list(CAPTURED)}" in text and "build.backend reference" in text
    same = write_spec(tmp_path / "same", models["target"], "eagle3", draft={"model": str(models["eagle3"])},
                      speculative={"eagle3": {"eagle3_layers_to_capture": sorted(CAPTURED, reverse=True)}})
    code, text = cli("validate", str(same))
    assert code == 0, text


def test_capture_layers_other_than_the_drafts_only_warn_on_tensorrt(tmp_path: Path, models: dict[str, Path]) -> None:
    """TensorRT-LLM captures the layers the spec names: a draft trained on others runs, badly; said, not refused."""
    spec = write_spec(tmp_path, models["target"], "eagle3", draft={"model": str(models["eagle3"])},
                      speculative={"eagle3": {"eagle3_layers_to_capture": [i + 1 for i in CAPTURED]}},
                      build={"backend": "tensorrt"})
    code, text = cli("validate", str(spec))
    assert code == 0, text
    assert "warning: " + at(spec, "eagle3_layers_to_capture", "speculative.eagle3.eagle3_layers_to_capture") in text


# -- Medusa ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("wrong", ["hidden_size", "vocab_size"])
def test_medusa_heads_of_another_width_are_refused(tmp_path: Path, models: dict[str, Path], wrong: str) -> None:
    """validate says what convert would: one rule (the heads' shapes against the target's config), one message."""
    sizes = {"hidden": HIDDEN // 2} if wrong == "hidden_size" else {"vocab": VOCAB // 2}
    heads = medusa_heads(tmp_path / "heads", **sizes)
    choices = [[0], [0, 0], [1]]
    good = write_spec(tmp_path / "good", models["target"], "medusa",
                      medusa={"heads": str(models["heads"]), "choices": choices})
    assert cli("validate", str(good))[0] == 0
    spec = write_spec(tmp_path, models["target"], "medusa", medusa={"heads": str(heads), "choices": choices})
    code, text = cli("validate", str(spec))
    assert code == 1
    begins = at(spec, f"heads: {heads}", "medusa.heads") + f"{heads / 'medusa_lm_head.safetensors'}: tensor "
    assert begins in text
    problem = text.split(begins)[1].split(" hint:")[0]
    assert "has shape" in problem and f"the target ({models['target']}) needs" in problem and wrong in problem
    code, converted = cli("convert", str(spec))
    assert code == 1 and problem in converted
    assert not (tmp_path / "out").exists()


# -- self-draft adapters --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("adapter", ["narrow-adapter", "missing"])
def test_a_self_draft_adapter_that_does_not_fit_is_said_at_draft_adapter(tmp_path: Path, models: dict[str, Path],
                                                                         adapter: str) -> None:
    draft = {"source": "target_layers", "layers": L}
    good = write_spec(tmp_path / "good", models["target"], "draft_target",
                      draft={**draft, "adapter": str(models["adapter"])})
    assert cli("validate", str(good))[0] == 0
    spec = write_spec(tmp_path, models["target"], "draft_target", draft={**draft, "adapter": str(models[adapter])})
    code, text = cli("validate", str(spec))
    assert code == 1
    assert at(spec, "adapter:", "draft.adapter") + str(models[adapter]) in text
    assert ("trained on another model" if adapter == "narrow-adapter" else "adapter directory does not exist") in text


# -- export ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@pytest.mark.parametrize(("mode", "draft", "said"), [
    ("eagle3", "missing", "EAGLE-3 draft directory does not exist"),
    ("eagle3", "plain", "not an EAGLE-3 draft"),
    ("eagle3", "other-target", "this EAGLE-3 draft does not fit target.model"),
    ("draft_target", "missing", "model directory does not exist"),
    ("draft_target", "eagle3", "is an EAGLE-3 draft"),
])
def test_export_refuses_a_draft_its_engine_would_refuse(tmp_path: Path, models: dict[str, Path], engine: str,
                                                        mode: str, draft: str, said: str) -> None:
    directory = eagle3_draft(tmp_path / "other", vocab_size=VOCAB // 2) if draft == "other-target" else models[draft]
    spec = write_spec(tmp_path, models["target"], mode, draft={"model": str(directory)}, build={"flow": "pytorch"})
    out = tmp_path / "export"
    code, text = cli("export", engine, str(spec), "--output", str(out))
    assert code == 1
    assert at(spec, f"model: {directory}", "draft.model") in text and said in text
    assert not out.exists()


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@pytest.mark.parametrize(("mode", "draft"), [("eagle3", "eagle3"), ("draft_target", "plain")])
def test_export_writes_a_draft_that_fits(tmp_path: Path, models: dict[str, Path], engine: str, mode: str,
                                         draft: str) -> None:
    """The control for the refusals above."""
    spec = write_spec(tmp_path, models["target"], mode, draft={"model": str(models[draft])}, build={"flow": "pytorch"})
    code, text = cli("export", engine, str(spec), "--output", str(tmp_path / "export"))
    assert code == 0, text
    assert (tmp_path / "export" / "serve.sh").is_file()


# -- the shipped demo specs -----------------------------------------------------------------------------------------
DEMO_SPECS = sorted((REPO / "configs").glob("demo*.yaml"))


@pytest.mark.parametrize("path", DEMO_SPECS, ids=lambda path: path.name)
def test_every_demo_spec_validates(tmp_path: Path, demo_models: dict[str, Path], demo_extra: Any,
                                   path: Path) -> None:
    """Each configs/demo*.yaml, on this session's demo models and extras (its paths pointed at them, its lines
    kept), passes every check without a warning."""
    from specbuild.demo.extras import EXTRAS

    for name in EXTRAS:  # the demo specs name every extra
        demo_extra(name)
    models_dir = demo_models["target"].parent
    text = path.read_text(encoding="utf-8").replace("../demo/models", str(models_dir))
    spec = tmp_path / path.name
    spec.write_text(text.replace("../demo/", f"{tmp_path}/"), encoding="utf-8")
    code, output = cli("validate", str(spec))
    assert code == 0, output
    assert "warning" not in output
