"""The self-draft in the reference runtime: weights and the first L layers' KV cache shared with the target.

What a user relies on: the shared draft holds no copy of a target tensor (data_ptr), computes what the converted
self-draft checkpoint computes, and decoding with it returns the target's own greedy output for a batch of
different prompts under every stop rule, or, sampling, the target's distribution; an adapter is refused, naming
the file and tensor, when it does not fit the target. Expectations come from the same run (plain decoding, the
converted checkpoint, the exact marginal), never from figures only some weights produce.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch
from rich.console import Console
from safetensors.torch import save_file

from specbuild.convert.pipeline import ConvertRequest, convert_checkpoint
from specbuild.errors import SpecbuildError
from specbuild.runtime.acceptance import accept_rejection_sampling
from specbuild.runtime.generation import generate
from specbuild.runtime.model import CausalLM
from specbuild.runtime.self_draft import generate_self_draft, self_draft_model, shared_memory
from specbuild.runtime.sequence import StopCriteria
from specbuild.runtime.speculative import DraftTargetConfig
from specbuild.self_draft.adapter_format import CONFIG_NAME, FORMAT, WEIGHTS_NAME
from tests.test_runtime_decoding import PARAMS, VOCAB, accept_everything, marginal_p_value
from tests.tiny_models import make_checkpoint, make_model

QUIET = Console(file=io.StringIO())
LAYERS = 4  # the tiny target's decoder layers
L = 2  # the self-draft's


def write_adapter(directory: Path, layers: int, seed: int, **changes: object) -> Path:
    """An adapter directory holding layer `layers` of another tiny Llama (a valid adapter, other weights)."""
    donor = make_model("llama", seed=seed, dtype=torch.float32, num_hidden_layers=LAYERS)
    prefix = f"model.layers.{layers}."
    tensors = {k: v.contiguous() for k, v in donor.state_dict().items() if k.startswith(prefix)}
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / WEIGHTS_NAME))
    config = {"format": FORMAT, "layers": layers, "hidden_size": donor.config.hidden_size,
              "num_hidden_layers": LAYERS, "model_type": "llama", **changes}
    (directory / CONFIG_NAME).write_text(json.dumps(config))
    return directory


def convert(source: Path, output: Path, **kwargs: object) -> Path:
    convert_checkpoint(ConvertRequest(output.name, source, output, "float32", **kwargs), console=QUIET)  # type: ignore[arg-type]
    return output


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("self-draft-runtime")
    hf = make_checkpoint(root / "hf", "llama", seed=0, dtype=torch.float32, num_hidden_layers=LAYERS)
    adapter = write_adapter(root / "adapter", L, seed=7)
    return {"hf": hf, "adapter": adapter, "target": convert(hf, root / "target"),
            "draft": convert(hf, root / "draft", self_draft_layers=L),
            "adapted": convert(hf, root / "adapted", self_draft_layers=L, self_draft_adapter=adapter)}


@pytest.fixture(scope="module")
def target(tiny: dict[str, Path]) -> CausalLM:
    return CausalLM.from_checkpoint(tiny["target"])


def test_the_draft_holds_no_copy_of_a_target_tensor(target: CausalLM, tiny: dict[str, Path]) -> None:
    owned = {t.data_ptr() for t in target.buffers()}
    draft = self_draft_model(target, L)
    assert all(t.data_ptr() in owned for t in draft.buffers())
    assert all(mine is theirs for mine, theirs in zip(draft.layers, target.layers[:L], strict=False))
    adapted = self_draft_model(target, L, tiny["adapted"])
    own = [t for t in adapted.buffers() if t.data_ptr() not in owned]
    assert own and all(any(t is b for b in adapted.layers[L].buffers()) for t in own)  # the adapter's only
    memory = shared_memory(target, adapted)
    assert memory["shared_extra_params"] == sum(t.numel() for t in adapted.layers[L].buffers())
    layer_kv = 2 * target.config.num_kv_heads * target.config.head_dim * 4
    assert memory["shared_extra_kv_bytes_per_token"] == layer_kv
    assert memory["copied_extra_kv_bytes_per_token"] == (L + 1) * layer_kv
    assert shared_memory(target, draft)["shared_extra_params"] == 0


@pytest.mark.parametrize("with_adapter", [False, True])
def test_the_shared_draft_computes_the_converted_self_draft(target: CausalLM, tiny: dict[str, Path],
                                                            with_adapter: bool) -> None:
    converted = CausalLM.from_checkpoint(tiny["adapted" if with_adapter else "draft"])
    shared = self_draft_model(target, L, tiny["adapted"] if with_adapter else None)
    ids = torch.randint(0, target.config.vocab_size, (2, 17), generator=torch.Generator().manual_seed(1))
    got = shared(ids, shared.new_cache(2, 20)).logits
    assert (got - converted(ids, converted.new_cache(2, 20)).logits).abs().max().item() <= 1e-6


def prompts_of_different_lengths(vocab: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(5)
    return [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in (7, 1, 19, 3)]


@pytest.mark.parametrize("with_adapter", [False, True])
@pytest.mark.parametrize("config", [DraftTargetConfig(1), DraftTargetConfig(4), DraftTargetConfig(3, adaptive=True)])
def test_shared_cache_greedy_equals_plain_greedy_under_every_stop_rule(
    target: CausalLM, tiny: dict[str, Path], with_adapter: bool, config: DraftTargetConfig
) -> None:
    prompts = prompts_of_different_lengths(target.config.vocab_size)
    adapter = tiny["adapted"] if with_adapter else None
    free = generate(target, prompts, stop=StopCriteria(max_new_tokens=24)).output_ids
    # Stop rules that fire in this run: an end id the first row emits, a stop word from the third row's output.
    stops = [StopCriteria(max_new_tokens=24), StopCriteria(max_new_tokens=24, end_id=free[0][6]),
             StopCriteria(max_new_tokens=24, stop_words=(tuple(free[2][9:11]),)),
             StopCriteria(max_new_tokens=24, stop_words=(tuple(free[2][9:11]),), include_stop_words=True)]
    for stop in stops:
        plain = generate(target, prompts, stop=stop)
        spec = generate_self_draft(target, L, prompts, config, stop=stop, adapter=adapter)
        assert spec.output_ids == plain.output_ids, stop
        assert 0 < spec.stats.target_forwards <= plain.stats.target_forwards
        assert spec.stats.draft_forwards > 0
        assert spec.stats.generated_tokens == sum(len(o) for o in plain.output_ids)
    assert any(len(o) < 24 for o in generate(target, prompts, stop=stops[1]).output_ids)  # the stop rule fired


@pytest.fixture(scope="module")
def tiny_vocab_target(tmp_path_factory: pytest.TempPathFactory) -> CausalLM:
    """An 8-token vocabulary (exact marginals in a handful of forwards), logits sharpened so that the one-layer
    draft's q differs clearly from the target's p."""
    root = tmp_path_factory.mktemp("self-draft-sampling")
    hf = make_checkpoint(root / "hf", "llama", seed=0, vocab_size=VOCAB, num_hidden_layers=2)
    model = CausalLM.from_checkpoint(convert(hf, root / "target"))
    model.lm_head.mul_(40.0)
    return model


@pytest.mark.parametrize(("rule", "should_match"), [(accept_rejection_sampling, True), (accept_everything, False)])
def test_sampling_keeps_the_targets_distribution(tiny_vocab_target: CausalLM, rule: object,
                                                 should_match: bool) -> None:
    prompt, trials = [1, 2, 3], 3000
    result = generate_self_draft(tiny_vocab_target, 1, [prompt] * trials, DraftTargetConfig(3), PARAMS,
                                 StopCriteria(max_new_tokens=3), accept=rule)  # type: ignore[arg-type]
    for position in (0, 1):  # K = 2 in the first round: positions 0 and 1 are drafts accepted or resampled
        p_value = marginal_p_value(tiny_vocab_target, prompt, position, result.output_ids)
        assert (p_value > 0.01) == should_match, f"position {position}: p={p_value:.2e}"


# -- bad adapters ---------------------------------------------------------------------------------------------------
def broken(directory: Path, how: str) -> Path:
    write_adapter(directory, L, seed=7)
    weights = directory / WEIGHTS_NAME
    from safetensors.torch import load_file

    tensors = load_file(str(weights))
    if how == "missing tensor":
        del tensors[f"model.layers.{L}.mlp.down_proj.weight"]
    elif how == "wrong shape":
        tensors[f"model.layers.{L}.mlp.down_proj.weight"] = tensors[f"model.layers.{L}.mlp.down_proj.weight"][:, :8]
    elif how == "other layer":
        down = tensors[f"model.layers.{L}.mlp.down_proj.weight"]
        tensors[f"model.layers.{L + 1}.mlp.down_proj.weight"] = down.clone()
    if how in ("missing tensor", "wrong shape", "other layer"):
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(weights))
    if how == "corrupt":
        weights.write_bytes(weights.read_bytes()[:40])
    if how == "no config":
        (directory / CONFIG_NAME).unlink()
    if how == "layers":
        config = json.loads((directory / CONFIG_NAME).read_text())
        (directory / CONFIG_NAME).write_text(json.dumps({**config, "layers": L + 1}))
    return directory


@pytest.mark.parametrize(("how", "names"), [
    ("missing tensor", (WEIGHTS_NAME, f"model.layers.{L}.mlp.down_proj.weight", "is missing")),
    ("wrong shape", (WEIGHTS_NAME, f"model.layers.{L}.mlp.down_proj.weight", "has shape")),
    ("other layer", (WEIGHTS_NAME, f"model.layers.{L + 1}.mlp.down_proj.weight")),
    ("corrupt", (WEIGHTS_NAME, "cannot read safetensors")),
    ("no config", (CONFIG_NAME, "not found")),
    ("layers", (CONFIG_NAME, f"says layers: {L + 1}")),
])
def test_bad_adapters_are_refused_naming_file_and_tensor(tiny: dict[str, Path], tmp_path: Path, how: str,
                                                         names: tuple[str, ...]) -> None:
    adapter = broken(tmp_path / "adapter", how)
    with pytest.raises(SpecbuildError) as info:
        convert(tiny["hf"], tmp_path / "out", self_draft_layers=L, self_draft_adapter=adapter)
    for name in names:
        assert name in info.value.message
    assert str(adapter) in info.value.message
    assert not (tmp_path / "out").exists()


def test_a_checkpoint_of_another_target_is_refused(target: CausalLM, tmp_path: Path) -> None:
    other = make_checkpoint(tmp_path / "hf", "llama", seed=3, dtype=torch.float32, num_hidden_layers=LAYERS)
    adapted = convert(other, tmp_path / "adapted", self_draft_layers=L,
                      self_draft_adapter=write_adapter(tmp_path / "adapter", L, seed=7))
    with pytest.raises(SpecbuildError, match="is not the target's"):
        self_draft_model(target, L, adapted)


def test_an_adapter_directory_is_pointed_to_its_converted_checkpoint(target: CausalLM, tiny: dict[str, Path]) -> None:
    with pytest.raises(SpecbuildError, match="this is an adapter directory"):
        self_draft_model(target, L, tiny["adapter"])
