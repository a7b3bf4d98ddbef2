"""The engine tier judges `speculative.mode: mtp`'s checkpoint rule: vLLM 0.33.0 and SGLang 0.5.23 find MTP layers
exactly where specbuild's validate does (`contracts.family_support.mtp_problem`).

Each engine's own code resolves a command line asking for its MTP method on three config-only checkpoints (no
weights: neither engine loads any while it resolves its configuration): a DeepSeek-V3 and a GLM-4.5 (Glm4Moe) config
declaring one MTP layer, and a Llama config declaring none. The lines judged are `specbuild export`'s own where it
writes one, and for the Llama, which specbuild refuses, the same line as a probe. vLLM (`--speculative-config
{"method": "mtp"}`) accepts the first two and raises "Unsupported speculative method: 'mtp'" for Llama; SGLang
(`--speculative-algorithm NEXTN`) turns NEXTN into EAGLE with the target itself as the draft where it finds MTP
layers, and with no draft at all for Llama. specbuild must accept and refuse the same checkpoints.
Runs under `make test-engines` (the engine virtualenvs), skipped without them as tests/test_engines_judge.py is.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from transformers import DeepseekV3Config, Glm4MoeConfig, LlamaConfig

from specbuild.contracts.family_support import mtp_problem
from specbuild.export import ExportRefused, export_spec
from specbuild.spec import parse_spec
from tests.test_engines_judge import VENVS, _run_checkers, engine_python

pytestmark = pytest.mark.engines

_TINY = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 4}
_MOE = {"moe_intermediate_size": 16, "n_routed_experts": 4, "num_experts_per_tok": 2, "n_group": 1,
        "topk_group": 1, "first_k_dense_replace": 1}
CHECKPOINTS: dict[str, tuple[str, Any]] = {
    "deepseek_v3": ("DeepseekV3ForCausalLM", lambda: DeepseekV3Config(
        **_TINY, **_MOE, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8,
        num_nextn_predict_layers=1)),
    "glm4_moe": ("Glm4MoeForCausalLM", lambda: Glm4MoeConfig(
        **_TINY, **_MOE, head_dim=8, num_nextn_predict_layers=1)),
    "llama": ("LlamaForCausalLM", lambda: LlamaConfig(**_TINY)),
}


def _checkpoint(root: Path, name: str) -> Path:
    architecture, make = CHECKPOINTS[name]
    directory = root / name
    make().save_pretrained(directory)
    config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    config["architectures"] = [architecture]  # as a Hub checkpoint's config.json names its class
    (directory / "config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    return directory


@pytest.fixture(scope="module")
def judged(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Path], dict[str, dict[str, Any]], set[str]]:
    for engine in VENVS:
        engine_python(engine)  # skip before any work when absent
    root = tmp_path_factory.mktemp("mtp")
    models = {name: _checkpoint(root, name) for name in CHECKPOINTS}
    k = 2
    probes = {
        "vllm": lambda path: ["vllm", "serve", str(path), "--max-model-len", "128", "--speculative-config",
                              json.dumps({"method": "mtp", "num_speculative_tokens": k})],
        "sglang": lambda path: ["python", "-m", "sglang.launch_server", "--model-path", str(path),
                                "--speculative-algorithm", "NEXTN", "--speculative-num-steps", str(k),
                                "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", str(k + 1)],
    }
    cases: dict[str, list[dict[str, Any]]] = {engine: [] for engine in probes}
    exported: set[str] = set()
    for name, path in models.items():
        spec = parse_spec({"name": name, "output_dir": str(root / "out" / name), "target": {"model": str(path)},
                           "speculative": {"mode": "mtp", "num_draft_tokens": k},
                           "build": {"flow": "pytorch", "max_batch_size": 8, "max_input_len": 64,
                                     "max_output_len": 64}}, root / f"{name}.yaml")
        for engine, probe in probes.items():
            try:
                argv = export_spec(spec, engine, root / "exports" / engine / name).plan.argv
                exported.add(f"{engine}:{name}")
            except ExportRefused:
                argv = probe(path)
            cases[engine].append({"name": name, "argv": argv})
    return models, _run_checkers(root, cases), exported


@pytest.mark.parametrize("name", sorted(CHECKPOINTS))
def test_vllm_finds_mtp_layers_where_specbuild_does(judged: Any, name: str) -> None:
    models, results, exported = judged
    case = results["vllm"]["cases"][name]
    carries = mtp_problem(models[name]) is None
    assert (f"vllm:{name}" in exported) is carries  # the export's own line where specbuild writes one
    assert case["accepted"] is carries, case.get("error")
    if carries:
        assert case["resolved"]["speculative"]["method"] == "mtp"
        assert case["resolved"]["speculative"]["model"] == str(models[name])  # the target's own layers
    else:
        assert "Unsupported speculative method: 'mtp'" in case["error"]


@pytest.mark.parametrize("name", sorted(CHECKPOINTS))
def test_sglang_finds_mtp_layers_where_specbuild_does(judged: Any, name: str) -> None:
    models, results, exported = judged
    case = results["sglang"]["cases"][name]
    assert (f"sglang:{name}" in exported) is (mtp_problem(models[name]) is None)
    assert case["accepted"], case.get("error")
    resolved = case["resolved"]
    assert resolved["speculative_algorithm"] == "EAGLE"  # NEXTN is EAGLE over the target's own MTP layers
    draft = resolved["speculative_draft_model_path"]
    assert (draft == str(models[name])) is (mtp_problem(models[name]) is None), draft
