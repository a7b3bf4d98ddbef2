"""Qwen3, Qwen3-MoE and Mixtral checkpoints written by transformers, converted by `specbuild convert`, checked tensor
by tensor against TensorRT-LLM 1.2's layout (the real engine cannot run here, so the expectations are derived in
each test from the Hugging Face tensors by NVIDIA's rules):

- tensorrt_llm/models/qwen/convert.py @0428c188 and models/qwen/model.py (1.2 line): `attention.q_layernorm` /
  `k_layernorm` are `self_attn.q_norm` / `k_norm`, unsplit; experts: `mlp.router` <- `mlp.gate` in float32,
  `mlp.fc` = cat(up_proj, gate_proj) per expert, `mlp.proj` = stacked down_proj; no attention biases for qwen3.
- tensorrt_llm/layers/moe.py @03961722 (MixtureOfExperts, MOEWeightWrapper) and models/llama/config.py @04100fd0:
  Mixtral's `fc` sources are every expert's w3 then every expert's w1 (cat on dim -2), `proj` stacks w2, the router
  is float32 `block_sparse_moe.gate`; `hidden_act` swiglu, normalisation RENORMALIZE (1).
- tensorrt_llm/mapping.py (1.x): moe_tp_size defaults to tp, moe_ep_size to 1, so each rank holds every expert with
  its intermediate dim split contiguously: `fc` rows [0, r) up, [r, 2r) gate of this rank's part, `proj` split on
  its last dim.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from safetensors import safe_open
from safetensors.torch import save_file
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from typer.testing import CliRunner

from specbuild.cli import app
from specbuild.convert.pipeline import ConvertRequest, convert_checkpoint, prepare_conversion, write_conversion
from tests.test_convert_modelopt_peer import modelopt_export
from tests.test_convert_sharding import load_rank, merge_checkpoint, stage_layers
from tests.tiny_models import FAMILIES, edit_config, make_checkpoint, make_model, save_model

runner = CliRunner()

# family -> (HF MoE module, up, gate, down names)
MOE = {"qwen3_moe": ("mlp", "up_proj", "gate_proj", "down_proj"), "mixtral": ("block_sparse_moe", "w3", "w1", "w2")}


def hf_tensors(src: Path) -> dict[str, torch.Tensor]:
    return load_rank(src / "model.safetensors")


def convert(src: Path, out: Path, tp: int = 1, pp: int = 1) -> Path:
    convert_checkpoint(ConvertRequest("m", src, out, dtype="float16", tp_size=tp, pp_size=pp))
    return out


def trt_config(out: Path) -> dict[str, Any]:
    return json.loads((out / "config.json").read_text())


def test_qwen3_layout(tmp_path: Path) -> None:
    """Qwen3 dense: LLaMA's tensors without q/k/v biases, plus each layer's q/k RMSNorm weights (head_dim values,
    whole on every rank); tied head; config as QWenConfig writes it for qwen_type qwen3."""
    src = make_checkpoint(tmp_path / "hf", "qwen3")
    hf, hf_cfg = hf_tensors(src), json.loads((src / "config.json").read_text())
    out = convert(src, tmp_path / "out")
    trt, cfg = load_rank(out / "rank0.safetensors"), trt_config(out)
    for layer in range(hf_cfg["num_hidden_layers"]):
        s, d = f"model.layers.{layer}.", f"transformer.layers.{layer}."
        assert torch.equal(trt[d + "attention.q_layernorm.weight"], hf[s + "self_attn.q_norm.weight"])
        assert torch.equal(trt[d + "attention.k_layernorm.weight"], hf[s + "self_attn.k_norm.weight"])
        qkv = torch.cat([hf[s + f"self_attn.{p}_proj.weight"] for p in "qkv"])
        assert torch.equal(trt[d + "attention.qkv.weight"], qkv)
        assert torch.equal(trt[d + "mlp.fc.weight"], hf[s + "mlp.gate_proj.weight"])
        assert torch.equal(trt[d + "mlp.gate.weight"], hf[s + "mlp.up_proj.weight"])
        assert d + "attention.qkv.bias" not in trt and d + "attention.dense.bias" not in trt
    assert torch.equal(trt["lm_head.weight"], hf["model.embed_tokens.weight"])
    assert cfg["architecture"] == "Qwen3ForCausalLM" and cfg["qwen_type"] == "qwen3"
    assert cfg["attn_bias"] is False and cfg["qk_layernorm"] is True
    # head_dim (32) is not hidden/heads (16): the attention sizes follow head_dim
    assert cfg["head_size"] == hf_cfg["head_dim"] == 32
    assert trt["transformer.layers.0.attention.dense.weight"].shape == (64, 4 * 32)
    assert cfg["moe"]["num_experts"] == 0 and cfg["hidden_act"] == "silu"


@pytest.mark.parametrize("family", sorted(MOE))
def test_moe_layout(tmp_path: Path, family: str) -> None:
    """Every expert's up then gate projection fused in `mlp.fc` (E, 2*inter, hidden), the down projections stacked in
    `mlp.proj` (E, hidden, inter), the router float32 even in a float16 checkpoint; no dense `mlp.gate`."""
    src = make_checkpoint(tmp_path / "hf", family)
    hf, hf_cfg = hf_tensors(src), json.loads((src / "config.json").read_text())
    out = convert(src, tmp_path / "out")
    trt = load_rank(out / "rank0.safetensors")
    module, up, gate, down = MOE[family]
    experts = hf_cfg.get("num_experts") or hf_cfg["num_local_experts"]
    for layer in range(hf_cfg["num_hidden_layers"]):
        s, d = f"model.layers.{layer}.{module}.", f"transformer.layers.{layer}."
        router = trt[d + "mlp.router.weight"]
        assert router.dtype == torch.float32
        assert torch.equal(router, hf[s + "gate.weight"].float())
        fc = torch.stack([torch.cat([hf[s + f"experts.{e}.{up}.weight"], hf[s + f"experts.{e}.{gate}.weight"]])
                          for e in range(experts)])
        proj = torch.stack([hf[s + f"experts.{e}.{down}.weight"] for e in range(experts)])
        assert torch.equal(trt[d + "mlp.fc.weight"], fc)
        assert torch.equal(trt[d + "mlp.proj.weight"], proj)
        assert d + "mlp.gate.weight" not in trt
    assert trt["transformer.layers.0.attention.qkv.weight"].dtype == torch.float16


@pytest.mark.parametrize(
    ("family", "overrides", "mode"),
    [("mixtral", {}, 1), ("qwen3_moe", {"norm_topk_prob": True}, 1), ("qwen3_moe", {"norm_topk_prob": False}, 0)],
)
def test_moe_config(tmp_path: Path, family: str, overrides: dict[str, Any], mode: int) -> None:
    """`moe` as MoeConfig.to_dict() writes it; normalisation RENORMALIZE (1) where the model renormalises its top-k
    weights (Mixtral always, Qwen3-MoE with norm_topk_prob), NONE (0) otherwise; swiglu experts."""
    src = make_checkpoint(tmp_path / "hf", family, **overrides)
    hf_cfg = json.loads((src / "config.json").read_text())
    cfg = trt_config(convert(src, tmp_path / "out", tp=2))
    assert cfg["moe"] == {
        "num_experts": 4, "shared_expert_intermediate_size": 0, "top_k": hf_cfg["num_experts_per_tok"],
        "normalization_mode": mode, "sparse_mixer_epsilon": 0.01, "tp_mode": 0, "device_limited_n_group": 0,
        "device_limited_topk_group": 0, "device_limited_routed_scaling_factor": 1.0,
    }
    assert cfg["hidden_act"] == "swiglu"
    assert cfg["mapping"] == {"world_size": 2, "tp_size": 2, "pp_size": 1}  # moe_tp = tp, moe_ep = 1 (defaults)
    if family == "qwen3_moe":
        assert (cfg["qwen_type"], cfg["qk_layernorm"], cfg["attn_bias"]) == ("qwen3_moe", True, False)
        assert cfg["moe_intermediate_size"] == hf_cfg["moe_intermediate_size"]
        assert (cfg["mlp_only_layers"], cfg["decoder_sparse_step"]) == ([], 1)
    else:
        assert cfg["intermediate_size"] == hf_cfg["intermediate_size"]  # Mixtral's is each expert's
        assert "qwen_type" not in cfg


def test_mixtral_window_travels_like_mistral(tmp_path: Path) -> None:
    src = make_checkpoint(tmp_path / "hf", "mixtral", sliding_window=8)
    assert trt_config(convert(src, tmp_path / "out"))["sliding_window"] == 8


def merge_experts(directory: Path) -> dict[str, torch.Tensor]:
    """The tp=1 `mlp.fc` / `mlp.proj` of every layer from a sharded checkpoint, by TensorRT-LLM's expert split:
    each rank's fc holds its part of every expert's up rows then of its gate rows; proj is split on dim 2."""
    cfg = trt_config(directory)
    tp, pp = cfg["mapping"]["tp_size"], cfg["mapping"]["pp_size"]
    merged: dict[str, torch.Tensor] = {}
    for stage, layers in enumerate(stage_layers(cfg["num_hidden_layers"], pp)):
        files = [load_rank(directory / f"rank{stage * tp + t}.safetensors") for t in range(tp)]
        for local, layer in enumerate(layers):
            d, g = f"transformer.layers.{local}.", f"transformer.layers.{layer}."
            fcs = [f[d + "mlp.fc.weight"] for f in files]
            rows = fcs[0].shape[1] // 2
            merged[g + "mlp.fc.weight"] = torch.cat([torch.cat([fc[:, :rows] for fc in fcs], dim=1),
                                                     torch.cat([fc[:, rows:] for fc in fcs], dim=1)], dim=1)
            merged[g + "mlp.proj.weight"] = torch.cat([f[d + "mlp.proj.weight"] for f in files], dim=2)
    return merged


@pytest.mark.parametrize(
    ("family", "overrides", "tp", "pp"),
    [
        ("qwen3", {}, 2, 1),
        ("qwen3", {}, 4, 1),  # kv (2) < tp: KV heads repeated, q/k norms still whole
        ("qwen3", {"num_hidden_layers": 3}, 2, 2),
        ("qwen3_moe", {}, 2, 1),
        ("qwen3_moe", {"num_hidden_layers": 3}, 2, 2),
        # intermediate_size is no layer's (every layer has experts): tp need not divide it, only the experts' 32
        ("qwen3_moe", {"intermediate_size": 129}, 2, 1),
        ("mixtral", {}, 2, 1),
        ("mixtral", {}, 1, 2),
    ],
)
def test_shards_recombine(tmp_path: Path, family: str, overrides: dict[str, Any], tp: int, pp: int) -> None:
    """The rank files of a TP/PP conversion, merged back by TensorRT-LLM's split rules, are the tp=1 tensors."""
    src = make_checkpoint(tmp_path / "hf", family, **overrides)
    single = load_rank(convert(src, tmp_path / "tp1") / "rank0.safetensors")
    sharded = convert(src, tmp_path / "sharded", tp, pp)
    merged = merge_checkpoint(sharded)  # the dense tensors; q/k norms and routers must be equal on every rank
    if family in MOE:
        merged.update(merge_experts(sharded))
        for r in range(tp * pp):
            for name, tensor in load_rank(sharded / f"rank{r}.safetensors").items():
                if name.endswith("mlp.fc.weight"):
                    assert tensor.shape == (4, single["transformer.layers.0.mlp.fc.weight"].shape[1] // tp, 64)
    assert sorted(merged) == sorted(single)
    for name, tensor in single.items():
        assert torch.equal(merged[name], tensor), name
        assert merged[name].dtype == tensor.dtype, name


def test_hub_config_names_experts_num_experts(tmp_path: Path) -> None:
    """Qwen3-MoE configs on the Hub (transformers 4) say `num_experts`; transformers 5 writes `num_local_experts`:
    both convert to the same checkpoint."""
    src = make_checkpoint(tmp_path / "hf", "qwen3_moe")
    new = load_rank(convert(src, tmp_path / "a") / "rank0.safetensors")
    cfg = json.loads((src / "config.json").read_text())
    cfg["num_experts"] = cfg.pop("num_local_experts")
    (src / "config.json").write_text(json.dumps(cfg))
    old = load_rank(convert(src, tmp_path / "b") / "rank0.safetensors")
    assert old.keys() == new.keys() and all(torch.equal(old[k], new[k]) for k in old)
    assert trt_config(tmp_path / "b")["moe"]["num_experts"] == 4


def run_convert(src: Path, out: Path, *extra: str) -> tuple[int, str]:
    result = runner.invoke(app, ["convert", "--model", str(src), "--output", str(out), *extra])
    return result.exit_code, " ".join(result.output.split())


@pytest.mark.parametrize(
    ("family", "change", "extra", "expected"),
    [
        ("qwen3_moe", {"mlp_only_layers": [1]}, (),
         ["mlp_only_layers [1]", "experts in every layer", "build.flow: pytorch"]),
        ("qwen3_moe", {"decoder_sparse_step": 2}, (), ["decoder_sparse_step 2", "build.flow: pytorch"]),
        ("qwen3", {"attention_bias": True}, (), ["attention_bias is true", "attn_bias false"]),
        ("qwen3_moe", {"num_experts_per_tok": 5}, (), ["num_experts_per_tok 5", "4 experts", "config.json"]),
        ("mixtral", {"num_local_experts": 3}, (), ["block_sparse_moe.experts.3.w1.weight"]),
    ],
)
def test_refusals(tmp_path: Path, family: str, change: dict[str, Any], extra: tuple[str, ...],
                  expected: list[str]) -> None:
    """What TensorRT-LLM's engine flow cannot hold, or a config that does not match its weights, is refused before
    anything is written, naming the field or tensor and saying what to do."""
    src = make_checkpoint(tmp_path / "hf", family)
    edit_config(src, **change)
    code, text = run_convert(src, tmp_path / "out", *extra)
    assert code == 1, text
    for phrase in expected:
        assert phrase in text, (phrase, text)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("family", "overrides", "field"), [
    ("qwen3_moe", {"moe_intermediate_size": 30}, "moe_intermediate_size"),
    ("mixtral", {"intermediate_size": 30}, "intermediate_size"),
])
def test_tp_must_divide_the_experts(tmp_path: Path, family: str, overrides: dict[str, Any], field: str) -> None:
    """Each expert's intermediate dim is what tp splits (moe_tp = tp): a tp that cannot split it is refused naming
    the config.json field that holds it."""
    src = make_checkpoint(tmp_path / "hf", family, **overrides)
    code, text = run_convert(src, tmp_path / "out", "--tp-size", "4")
    assert code == 1 and f"does not divide the experts' intermediate size 30 ({field})" in text, text
    assert not (tmp_path / "out").exists()


def test_tp_rule_ignores_an_unused_intermediate_size(tmp_path: Path) -> None:
    """A Qwen3-MoE's `intermediate_size` sizes a dense MLP that no layer has (every layer holds experts, and dense
    layers are refused), so a tp that splits the experts converts whatever it says; the decoder's dense-MLP rule
    refused tp=2 here for intermediate_size 129. (The shards' contents: test_shards_recombine.)"""
    src = make_checkpoint(tmp_path / "hf", "qwen3_moe", intermediate_size=129, moe_intermediate_size=32)
    code, text = run_convert(src, tmp_path / "out", "--tp-size", "2")
    assert code == 0, text
    assert json.loads((tmp_path / "out" / "config.json").read_text())["mapping"]["tp_size"] == 2


def test_missing_expert_is_named(tmp_path: Path) -> None:
    """A checkpoint lacking one expert's tensor is refused with its name, not converted with a hole."""
    src = make_checkpoint(tmp_path / "hf", "qwen3_moe")
    tensors = hf_tensors(src)
    del tensors["model.layers.1.mlp.experts.2.down_proj.weight"]
    save_file(tensors, src / "model.safetensors", metadata={"format": "pt"})
    code, text = run_convert(src, tmp_path / "out")
    assert code == 1 and "model.layers.1.mlp.experts.2.down_proj.weight" in text and "missing" in text, text


def test_router_is_float32_in_the_rank_file_header(tmp_path: Path) -> None:
    """The safetensors header itself says F32 for the router and F16 for the rest (what trtllm-build reads)."""
    out = convert(make_checkpoint(tmp_path / "hf", "mixtral"), tmp_path / "out")
    with safe_open(out / "rank0.safetensors", "pt") as fh:
        dtypes = {name: fh.get_slice(name).get_dtype() for name in fh.keys()}  # noqa: SIM118
    routers = {n for n in dtypes if re.search(r"mlp\.router\.weight$", n)}
    assert routers and all(dtypes[n] == "F32" for n in routers)
    assert {dtypes[n] for n in dtypes if n not in routers} == {"F16"}


def validate_spec(directory: Path, target: Path, **build: Any) -> tuple[int, str]:
    directory.mkdir(parents=True)
    spec = directory / "pipeline.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "moe", "output_dir": str(directory / "out"), "target": {"model": str(target)},
        "speculative": {"mode": "none"},
        "build": {"max_batch_size": 2, "max_input_len": 32, "max_output_len": 16, **build},
    }, sort_keys=False), encoding="utf-8")
    result = runner.invoke(app, ["validate", str(spec)])
    return result.exit_code, " ".join(result.output.split())


def test_engine_layout_limits_apply_only_where_specbuild_converts(tmp_path: Path) -> None:
    """Dense layers in a Qwen3-MoE model are refused by `validate` on the engine flow (convert would have to lay
    them out), but not on the PyTorch flow with TensorRT-LLM's backend, which loads the Hugging Face directory as
    it is; the reference backend runs specbuild's conversion, so it is refused there too."""
    target = make_checkpoint(tmp_path / "hf", "qwen3_moe", mlp_only_layers=[1])
    Tokenizer(WordLevel({"[UNK]": 0}, unk_token="[UNK]")).save(str(target / "tokenizer.json"))
    code, text = validate_spec(tmp_path / "engine", target)
    assert code == 1 and "target.model" in text and "mlp_only_layers [1]" in text, text
    assert "TensorRT-LLM's PyTorch backend (build.flow: pytorch), vLLM and SGLang load" in text
    code, text = validate_spec(tmp_path / "pytorch", target, flow="pytorch")
    assert code == 0 and "mlp_only_layers" not in text, text
    code, text = validate_spec(tmp_path / "reference", target, flow="pytorch", backend="reference")
    assert code == 1 and "mlp_only_layers [1]" in text, text


def test_planned_bytes_count_the_float32_router(tmp_path: Path) -> None:
    """The size convert plans (its free-space check, `--dry-run`, validate) is what the rank files hold, the float32
    routers included, in a float16 conversion split over two ranks."""
    src = make_checkpoint(tmp_path / "hf", "qwen3_moe")
    request = ConvertRequest("m", src, tmp_path / "out", dtype="float16", tp_size=2)
    prepared = prepare_conversion(request)
    try:
        planned = prepared.output_bytes
        write_conversion(prepared)
    finally:
        prepared.close()
    written = sum(t.numel() * t.element_size() for r in range(2)
                  for t in load_rank(tmp_path / "out" / f"rank{r}.safetensors").values())
    assert planned == written


def test_qwen3_tensors_equal_modelopt_export(tmp_path: Path) -> None:
    """An independent writer of the same format: ModelOpt 0.47's `export_tensorrt_llm_checkpoint` (decoder type
    qwen) gives the same tensors, q/k layernorms included, bit for bit. (Its MoE export cannot read transformers 5's
    fused expert modules, so the MoE layouts are checked against NVIDIA's rules above only.)"""
    model = make_model("qwen3")
    ours = load_rank(convert(save_model(model, tmp_path / "hf"), tmp_path / "ours") / "rank0.safetensors")
    theirs = load_rank(modelopt_export(model, FAMILIES["qwen3"][3], tmp_path / "modelopt") / "rank0.safetensors")
    assert sorted(ours) == sorted(theirs)
    assert "transformer.layers.0.attention.q_layernorm.weight" in ours
    for name in ours:
        assert ours[name].dtype == theirs[name].dtype and torch.equal(ours[name], theirs[name]), name


def test_self_draft_adapter_sources_keep_the_float32_router(tmp_path: Path) -> None:
    """A self-draft whose last layer is read from an adapter renames that layer's sources only: each tensor's own
    dtype (the float32 router) stays, as in the target's conversion."""
    from specbuild.convert.architectures import architecture_for
    from specbuild.convert.self_draft import ADAPTER_PREFIX, SelfDraftArchitecture
    from specbuild.convert.sharding import Rank
    from specbuild.self_draft.adapter_format import AdapterInfo

    src = make_checkpoint(tmp_path / "hf", "mixtral")
    config = json.loads((src / "config.json").read_text())
    base = architecture_for(config, src / "config.json")
    adapter = AdapterInfo(tmp_path / "adapter", 1, base.hidden, base.num_layers, "mixtral", {})
    draft = SelfDraftArchitecture(base, 1, adapter)
    targets = draft.mapping(Rank(0, 1, 1, draft.num_layers)).targets
    router = targets["transformer.layers.1.mlp.router.weight"]
    assert all(name.startswith(ADAPTER_PREFIX) for name in router.sources)
    assert router.dtype == torch.float32
