"""Self-drafting (`draft.source: target_layers`): the draft is the target's first L layers, final norm and LM head.

What a user relies on: the self-draft computes exactly the target's forward cut after L layers (checked against the
HF target run by transformers in the same test, so no figure depends on trained weights); it holds no tensor the
target's own conversion does not (no new weights, same sharding); speculation with it returns the target's own
greedy output; the engine plans are those of any draft; and every impossible choice is refused before anything
runs, at the spec field to fix.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from rich.console import Console
from safetensors import safe_open
from transformers import PreTrainedModel
from typer.testing import CliRunner

from specbuild.cli import app
from specbuild.convert.pipeline import ConvertRequest, convert_checkpoint, requests_from_spec
from specbuild.errors import SpecbuildError, SpecError
from specbuild.runtime.generation import generate
from specbuild.runtime.model import CausalLM
from specbuild.runtime.sequence import StopCriteria
from specbuild.runtime.speculative import DraftTargetConfig, generate_draft_target
from specbuild.spec import PipelineSpec, load_spec
from tests.tiny_models import make_model, save_model

QUIET = Console(file=io.StringIO())
VOCAB = 1000
LAYERS = 4  # every tiny target below has 4 decoder layers
STOP = StopCriteria(max_new_tokens=20)


def convert(source: Path, output: Path, **kwargs: Any) -> Path:
    convert_checkpoint(ConvertRequest(output.name, source, output, **{"dtype": "float32", **kwargs}), console=QUIET)
    return output


def final_norm_and_head(hf: PreTrainedModel) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The HF model's own final norm and LM head (LLaMA family: model.norm; GPT-2: transformer.ln_f)."""
    body = hf.model if hasattr(hf, "model") else hf.transformer
    return (body.norm if hasattr(body, "norm") else body.ln_f), hf.get_output_embeddings()


def truncated_logits(hf: PreTrainedModel, ids: torch.Tensor, layers: int) -> torch.Tensor:
    """The HF target's forward stopped after `layers` decoder layers, then its final norm and LM head.
    hidden_states[i] is the residual stream after i layers (hidden_states[0]: the embeddings)."""
    with torch.no_grad():
        hidden = hf(ids, output_hidden_states=True).hidden_states[layers]
        norm, head = final_norm_and_head(hf)
        return head(norm(hidden))


def forward_logits(model: CausalLM, ids: torch.Tensor) -> torch.Tensor:
    return model(ids, model.new_cache(ids.shape[0], ids.shape[1] + 4)).logits


def read_ranks(directory: Path) -> dict[str, dict[str, torch.Tensor]]:
    ranks = {}
    for path in sorted(directory.glob("rank*.safetensors")):
        with safe_open(path, "pt") as fh:
            ranks[path.name] = {name: fh.get_tensor(name) for name in fh.keys()}  # noqa: SIM118 (not a dict)
    return ranks


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[PreTrainedModel, Path]]:
    """A 4-layer HF float32 target per family, saved (tied head: qwen2 and gpt2; sliding window: mistral)."""
    root = tmp_path_factory.mktemp("self-draft")
    models = {}
    for family in ("llama", "mistral", "qwen2", "gpt2"):
        layers = {"n_layer": LAYERS} if family == "gpt2" else {"num_hidden_layers": LAYERS}
        hf = make_model(family, dtype=torch.float32, **layers)
        models[family] = (hf, save_model(hf, root / family))
    return models


# -- the checkpoint -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2", "gpt2"])
@pytest.mark.parametrize("layers", [1, LAYERS - 1])
def test_self_draft_logits_equal_the_targets_forward_cut_after_l_layers(
    tiny: dict[str, tuple[PreTrainedModel, Path]], tmp_path: Path, family: str, layers: int
) -> None:
    hf, source = tiny[family]
    draft = CausalLM.from_checkpoint(convert(source, tmp_path / "draft", self_draft_layers=layers))
    assert draft.config.num_layers == layers
    ids = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(3))
    expected = truncated_logits(hf, ids, layers)
    # Same float32 math in both (the runtime's full-model logits agree with transformers to <= 1e-6,
    # test_runtime_model); the cut must not change that, and a different layer count differs by orders more.
    assert (forward_logits(draft, ids) - expected).abs().max().item() <= 1e-5
    assert (truncated_logits(hf, ids, layers + 1) - expected).abs().max().item() > 1e-2


@pytest.mark.parametrize(("tp", "pp"), [(1, 1), (2, 1), (2, 2)])
def test_self_draft_holds_only_the_targets_own_tensors(
    tiny: dict[str, tuple[PreTrainedModel, Path]], tmp_path: Path, tp: int, pp: int
) -> None:
    """No new weights: every tensor of every rank file is the target conversion's tensor of the same name and
    shard (the first L layers, the embedding, the final norm, the padded and split LM head), sharded the same way
    over the draft's L layers; config.json is the target's but for num_hidden_layers."""
    _, source = tiny["llama"]
    layers = 2
    draft_dir = convert(source, tmp_path / "draft", self_draft_layers=layers, tp_size=tp, pp_size=pp)
    target_dir = convert(source, tmp_path / "target", tp_size=tp)  # pp 1: one rank per tp slot holds every layer
    target = read_ranks(target_dir)
    draft = read_ranks(draft_dir)
    assert len(draft) == tp * pp
    per_stage = layers // pp
    for name, tensors in draft.items():
        rank = int(name.removeprefix("rank").removesuffix(".safetensors"))
        stage, tp_rank = divmod(rank, tp)
        reference = target[f"rank{tp_rank}.safetensors"]
        for key, tensor in tensors.items():
            global_key = key
            if key.startswith("transformer.layers."):
                local = int(key.split(".")[2])
                global_key = key.replace(f"layers.{local}.", f"layers.{stage * per_stage + local}.", 1)
            assert torch.equal(tensor, reference[global_key]), (name, key)
    kept = {k for tensors in draft.values() for k in tensors if k.startswith("transformer.layers.")}
    assert max(int(k.split(".")[2]) for k in kept) == per_stage - 1
    draft_config = json.loads((draft_dir / "config.json").read_text())
    target_config = json.loads(convert(source, tmp_path / "target-pp", tp_size=tp, pp_size=pp)
                               .joinpath("config.json").read_text())
    assert draft_config["num_hidden_layers"] == layers
    assert {**draft_config, "num_hidden_layers": LAYERS} == target_config


def test_self_draft_greedy_speculation_equals_plain_greedy(
    tiny: dict[str, tuple[PreTrainedModel, Path]], tmp_path: Path
) -> None:
    """In-process through the runtime's draft-target path: prompts of different lengths in one batch."""
    _, source = tiny["llama"]
    target = CausalLM.from_checkpoint(convert(source, tmp_path / "target"))
    draft = CausalLM.from_checkpoint(convert(source, tmp_path / "draft", self_draft_layers=2))
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, VOCAB, (n,), generator=gen).tolist() for n in (7, 19, 3)]
    plain = generate(target, prompts, stop=STOP)
    for k in (1, 4):
        spec = generate_draft_target(target, draft, prompts, stop=STOP, config=DraftTargetConfig(k))
        assert spec.output_ids == plain.output_ids
        assert spec.stats.target_forwards <= plain.stats.target_forwards


# -- the pipeline: spec -> convert -> build -> deploy ---------------------------------------------------------------
def write_spec(directory: Path, draft: dict[str, Any], **sections: Any) -> Path:
    data = {
        "name": "self-draft",
        "output_dir": str(directory / "build"),
        "target": {"model": str(sections.pop("target", directory / "target"))},
        "draft": draft,
        "speculative": {"mode": "draft_target", "num_draft_tokens": 3, **sections.pop("speculative", {})},
        "build": {"backend": "reference", "dtype": "float32", "max_batch_size": 4, "max_input_len": 64,
                  "max_output_len": 32, **sections.pop("build", {})},
        **sections,
    }
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "pipeline.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_engine_plans_are_those_of_any_draft(tmp_path: Path) -> None:
    """The trtllm-build commands of a self-draft spec are the separate-draft spec's, role for role: the draft is
    built as any draft (no speculative mode), the target with draft_tokens_external."""
    from specbuild.build.plan import plan_pipeline

    self_draft = load_spec(write_spec(tmp_path / "a", {"source": "target_layers", "layers": 2}))
    separate = load_spec(write_spec(tmp_path / "b", {"model": str(tmp_path / "b" / "draft")}))

    def commands(spec: PipelineSpec) -> dict[str, list[str]]:
        return {p.role: [a.replace(str(spec.output_dir), "OUT") for a in p.command()]
                for p in plan_pipeline(spec, {})}

    assert commands(self_draft) == commands(separate)
    assert set(commands(self_draft)) == {"target", "draft"}


def test_demo_pipeline_with_a_self_draft(demo_models: dict[str, Path], tmp_path: Path) -> None:
    """The demo target with a self-draft of its first half, quantized int8 weight-only as a user might: convert
    (ModelOpt calibrates the target cut to L layers), build (reference), deploy and the repository check as with
    a separate draft; the built engines speculate to the target's own greedy output."""
    from specbuild.build import build_pipeline
    from specbuild.contracts.engine_info import engine_dir, reference_checkpoint
    from specbuild.convert.run import convert_spec
    from specbuild.deploy.check import check_repository
    from specbuild.deploy.repository import deploy_repository

    layers = json.loads((demo_models["target"] / "config.json").read_text())["num_hidden_layers"] // 2
    path = write_spec(tmp_path, {"source": "target_layers", "layers": layers,
                                 "quantization": {"format": "int8_wo", "calib": {"size": 4, "seq_len": 32}}},
                      target=demo_models["target"])
    results = {r.request.name: r for r in convert_spec(path, console=QUIET)}
    assert results["draft"].request.source == demo_models["target"]
    spec = load_spec(path)
    config = json.loads((spec.checkpoint_dir("draft") / "config.json").read_text())
    assert config["num_hidden_layers"] == layers and config["quantization"]["quant_algo"] == "W8A16"
    build_pipeline(spec, backend="reference", console=QUIET)
    deploy_repository(spec, console=QUIET)
    assert spec.deploy.model_repository is not None
    report = check_repository(spec.deploy.model_repository)
    assert not report.problems, report.problems
    target, draft = (CausalLM.from_checkpoint(reference_checkpoint(engine_dir(spec, role)))
                     for role in ("target", "draft"))
    assert draft.config.num_layers == layers
    prompts = [[5, 9, 11, 2, 40, 41], [7, 7, 1], [300, 12, 9, 8, 1, 4, 6, 2, 77]]
    plain = generate(target, prompts, stop=STOP)
    assert generate_draft_target(target, draft, prompts, stop=STOP,
                                 config=DraftTargetConfig(3)).output_ids == plain.output_ids


# -- refusals -------------------------------------------------------------------------------------------------------
def spec_error(path: Path) -> str:
    with pytest.raises(SpecError) as info:
        load_spec(path)
    return info.value.message


@pytest.mark.parametrize(("draft", "sections", "expected"), [
    ({"source": "target_layers"}, {}, "draft.layers: required when source is 'target_layers'"),
    ({"source": "target_layers", "layers": 0}, {}, "draft.layers: "),
    ({"source": "target_layers", "layers": 2, "model": "d"}, {}, "draft.model: given, but source is 'target_layers'"),
    ({"source": "target_layers", "layers": 2, "trust_remote_code": True}, {},
     "draft.trust_remote_code: given, but source is 'target_layers'"),
    ({"model": "d", "layers": 2}, {}, "draft.layers: only used with source: target_layers"),
    ({"layers": 2}, {}, "draft.model: required (or set source: target_layers"),
    ({"source": "target_layers", "layers": 2}, {"speculative": {"mode": "eagle3"}, "build": {"flow": "pytorch"}},
     "draft.source: target_layers makes a draft-target draft"),
    ({"source": "target_layers", "layers": 2}, {"build": {"flow": "pytorch", "backend": "auto"}},
     "draft.source: target_layers needs build.flow: engine"),
    ({"model": "d", "adapter": "a"}, {}, "draft.adapter: only used with source: target_layers"),
    ({"source": "target_layers", "layers": 2, "adapter": "a", "quantization": {"format": "int8_wo"}}, {},
     "draft.adapter: cannot be combined with draft.quantization"),
])
def test_spec_refuses_what_cannot_make_a_self_draft(tmp_path: Path, draft: dict[str, Any],
                                                    sections: dict[str, Any], expected: str) -> None:
    assert expected in spec_error(write_spec(tmp_path, draft, **sections))


@pytest.mark.parametrize("layers", [LAYERS, LAYERS + 3])
def test_validate_refuses_as_many_layers_as_the_target_has(
    tiny: dict[str, tuple[PreTrainedModel, Path]], tmp_path: Path, layers: int
) -> None:
    """Only the target's config.json knows its layer count: validate reads it and names draft.layers's line;
    convert refuses the same before writing anything."""
    _, source = tiny["llama"]
    path = write_spec(tmp_path, {"source": "target_layers", "layers": layers}, target=source)
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exit_code == 1
    line = next(n for n, text in enumerate(path.read_text().splitlines(), 1) if text.strip().startswith("layers:"))
    assert f"{path}:{line}: draft.layers:" in result.output
    assert f"draft.layers {layers} is not less than the target's num_hidden_layers {LAYERS}" in result.output
    with pytest.raises(SpecbuildError, match="not less than the target's num_hidden_layers"):
        convert(source, tmp_path / "draft", self_draft_layers=layers)
    assert not (tmp_path / "draft").exists()


def test_pipeline_parallelism_counts_the_draft_layers(
    tiny: dict[str, tuple[PreTrainedModel, Path]], tmp_path: Path
) -> None:
    _, source = tiny["llama"]
    with pytest.raises(SpecbuildError, match="pp_size 2 exceeds the self-draft's 1 layers"):
        convert(source, tmp_path / "draft", self_draft_layers=1, pp_size=2)


def test_requests_read_the_target_for_a_self_draft(tmp_path: Path) -> None:
    spec = load_spec(write_spec(tmp_path, {"source": "target_layers", "layers": 3}))
    requests = {r.name: r for r in requests_from_spec(spec)}
    assert requests["draft"].source == spec.target.model
    assert requests["draft"].self_draft_layers == 3 and requests["target"].self_draft_layers is None


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_export_refuses_a_self_draft(tmp_path: Path, engine: str) -> None:
    path = write_spec(tmp_path, {"source": "target_layers", "layers": 2})
    result = CliRunner().invoke(app, ["export", engine, str(path), "--output", str(tmp_path / "out")])
    assert result.exit_code == 1
    assert "draft.source target_layers (layers 2)" in result.output
    assert not (tmp_path / "out").exists()


def test_changing_the_layer_count_reconverts(tiny: dict[str, tuple[PreTrainedModel, Path]], tmp_path: Path) -> None:
    """The layer count is a setting in manifest.json: the same L is up to date, another L is written anew."""
    _, source = tiny["llama"]
    out = tmp_path / "draft"

    def run(layers: int) -> str:
        request = ConvertRequest("draft", source, out, "float32", self_draft_layers=layers)
        return convert_checkpoint(request, console=QUIET).status

    assert run(2) == "written"
    assert run(2) == "up to date"
    assert run(3) == "written"
    assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == 3


# -- the adapter (`specbuild draft train`) on the demo target ---------------------------------------------------------
def test_adapter_training_lowers_the_distillation_loss_and_raises_acceptance(
    demo_models: dict[str, Path], demo_extra: Any, tmp_path: Path
) -> None:
    """The demo extra's own held-out figures (same run as its training): the trained adapter's KL to the target
    is below its starting point's and the bare cut's, and its draft agrees with the target more often; then, in
    the runtime on held-out prompts, the adapter accepts more draft tokens per round than the bare L-layer cut,
    and both return the target's own greedy output."""
    from specbuild.demo.models import heldout_texts
    from specbuild.runtime.self_draft import generate_self_draft
    from specbuild.self_draft.adapter_format import read_adapter
    from specbuild.tokenizer import load_tokenizer

    adapter_dir = demo_extra("self-draft-adapter")
    info = read_adapter(adapter_dir)
    metrics = json.loads((adapter_dir / "adapter.json").read_text())["metrics"]
    assert metrics["kl"] < metrics["init_kl"] and metrics["kl"] < metrics["no_adapter_kl"]
    assert metrics["agree"] > metrics["no_adapter_agree"]
    target_ckpt = convert(demo_models["target"], tmp_path / "target")
    adapted = convert(demo_models["target"], tmp_path / "draft", self_draft_layers=info.layers,
                      self_draft_adapter=adapter_dir)
    target = CausalLM.from_checkpoint(target_ckpt)
    tokenizer = load_tokenizer(demo_models["target"])
    prompts = [tokenizer(text)["input_ids"][:24] for text in heldout_texts()[:3]]
    stop = StopCriteria(max_new_tokens=32)
    plain = generate(target, prompts, stop=stop)
    accepted = {}
    for adapter in (None, adapted):
        result = generate_self_draft(target, info.layers, prompts, DraftTargetConfig(4), stop=stop, adapter=adapter)
        assert result.output_ids == plain.output_ids
        stats = result.stats
        accepted[adapter is not None] = sum(stats.accepted_by_position) / stats.proposed_by_position[0]
    assert accepted[True] > accepted[False]


def test_demo_pipeline_with_an_adapter(demo_models: dict[str, Path], demo_extra: Any, tmp_path: Path) -> None:
    """draft.adapter end to end, as a separate draft: convert writes an L + 1 layer draft, the reference build and
    deploy take it, the repository check passes, the built draft speculates to the target's greedy output, and
    the built draft checkpoint serves as the shared runtime's adapter."""
    from specbuild.build import build_pipeline
    from specbuild.contracts.engine_info import engine_dir, reference_checkpoint
    from specbuild.convert.run import convert_spec
    from specbuild.deploy.check import check_repository
    from specbuild.deploy.repository import deploy_repository
    from specbuild.runtime.self_draft import generate_self_draft

    adapter_dir = demo_extra("self-draft-adapter")
    layers = json.loads((adapter_dir / "adapter.json").read_text())["layers"]
    path = write_spec(tmp_path, {"source": "target_layers", "layers": layers, "adapter": str(adapter_dir)},
                      target=demo_models["target"])
    convert_spec(path, console=QUIET)
    spec = load_spec(path)
    assert json.loads((spec.checkpoint_dir("draft") / "config.json").read_text())["num_hidden_layers"] == layers + 1
    build_pipeline(spec, backend="reference", console=QUIET)
    deploy_repository(spec, console=QUIET)
    assert spec.deploy.model_repository is not None
    report = check_repository(spec.deploy.model_repository)
    assert not report.problems, report.problems
    target_dir, draft_dir = (reference_checkpoint(engine_dir(spec, role)) for role in ("target", "draft"))
    target, draft = CausalLM.from_checkpoint(target_dir), CausalLM.from_checkpoint(draft_dir)
    prompts = [[5, 9, 11, 2, 40, 41], [7, 7, 1], [300, 12, 9, 8, 1, 4, 6, 2, 77]]
    plain = generate(target, prompts, stop=STOP)
    separate = generate_draft_target(target, draft, prompts, stop=STOP, config=DraftTargetConfig(3))
    shared = generate_self_draft(target, layers, prompts, DraftTargetConfig(3), stop=STOP, adapter=draft_dir)
    assert separate.output_ids == plain.output_ids == shared.output_ids
    assert shared.stats.acceptance_by_position == separate.stats.acceptance_by_position


def test_draft_train_command_writes_an_adapter_convert_takes(demo_models: dict[str, Path], tmp_path: Path) -> None:
    """`specbuild draft train` writes an adapter directory that read_adapter accepts for the given L; an L the
    target cannot take is refused naming its config.json, and nothing is written."""
    from specbuild.self_draft.adapter_format import read_adapter

    out = tmp_path / "adapter"
    args = ["draft", "train", "--target", str(demo_models["target"]), "--output", str(out), "--steps", "2",
            "--seq-len", "16", "--batch-size", "2"]
    result = CliRunner().invoke(app, [*args, "--layers", "2"])
    assert result.exit_code == 0, result.output
    assert read_adapter(out).layers == 2 and f"wrote {out}" in result.output
    layers = json.loads((demo_models["target"] / "config.json").read_text())["num_hidden_layers"]
    refused = CliRunner().invoke(app, [*args, "--layers", str(layers), "--output", str(tmp_path / "no")])
    assert refused.exit_code == 1
    assert "config.json" in refused.output and f"--layers {layers} must be 1 to {layers - 1}" in refused.output
    assert not (tmp_path / "no").exists()
