"""`specbuild export vllm|sglang SPEC`: what a user runs instead of the Triton deployment, checked field by field.

The fast tier: every value written against the spec it came from, every refusal's field, reason and hint, without
the engines. Whether vLLM and SGLang accept the names and what they make of them is for their own code to say:
tests/test_engines_judge.py (`make test-engines`) runs both engines' parsers and config classes on these exports.
The few engine facts asserted here (vLLM 0.33 has no Medusa; SGLang 0.5.23's n-gram options and draft-token count)
name the upstream file and commit they come from.
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from safetensors.torch import save_file
from typer.testing import CliRunner

from specbuild.cli import app
from specbuild.contracts.quant_formats import FORMATS, kv_cache_quant_algo
from specbuild.eagle.format import Eagle3DraftConfig, expected_shapes, write_eagle3_draft
from specbuild.errors import SpecbuildError
from specbuild.export import ExportRefused, export_spec
from specbuild.export.draft import ENGINE_QUANTIZATION, MODELOPT_METHOD
from specbuild.spec import PipelineSpec, load_spec
from tests import hf_quant_schema
from tests.command_line import parse_flags
from tests.tiny_models import edit_config

runner = CliRunner()
MODELOPT_ALGOS = {engine: table.modelopt_algos for engine, table in ENGINE_QUANTIZATION.items()}
"""specbuild's own table (the engine tier holds vLLM's to vllm's QUANT_ALGOS): what a refusal must list."""
MODELOPT_SOURCES = {engine: str(table.modelopt_sources[0]).split("@")[0]
                    for engine, table in ENGINE_QUANTIZATION.items()}
LOAD_TIME_FORMATS = ("fp8",)
"""What both engines quantize an unquantized checkpoint to while loading: vLLM QuantizationMethods "fp8" (Fp8Config),
SGLang --quantization fp8 (Fp8Config on an unquantized checkpoint)."""


# -- specs ---------------------------------------------------------------------------------------------------------
def _model_dir(path: Path, hidden: int = 8, vocab: int = 16) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"hidden_size": hidden, "vocab_size": vocab}), encoding="utf-8")
    return path


def _heads(path: Path, *, num_heads: int = 4, hidden: int = 8, vocab: int = 16) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(0)
    tensors = {}
    for head in range(num_heads):
        tensors[f"{head}.0.linear.weight"] = torch.randn(hidden, hidden, generator=generator)
        tensors[f"{head}.0.linear.bias"] = torch.randn(hidden, generator=generator)
        tensors[f"{head}.1.weight"] = torch.randn(vocab, hidden, generator=generator)
    save_file(tensors, str(path / "medusa_lm_head.safetensors"))
    return path


def _spec(tmp: Path, mode: str = "none", *, target: Path | None = None, heads: Path | None = None,
          **extra: Any) -> PipelineSpec:
    data: dict[str, Any] = {
        "name": f"x-{mode}",
        "target": {"model": str(target or _model_dir(tmp / "target"))},
        "speculative": {"mode": mode},
        "build": {"dtype": "bfloat16", "tp_size": 2, "max_batch_size": 12, "max_input_len": 200,
                  "max_output_len": 56},
    }
    if mode == "draft_target":
        data["draft"] = {"model": str(_model_dir(tmp / "draft"))}
        data["speculative"]["num_draft_tokens"] = 5
    if mode == "medusa":
        data["medusa"] = {"heads": str(heads or _heads(tmp / "heads")), "choices": "mc_sim_7b_top8"}
    for section, values in extra.items():
        data.setdefault(section, {}).update(values)
    path = tmp / "pipeline.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return load_spec(path)


def _quantized(spec: PipelineSpec, fmt: str, kv_cache: str = "none", **build: Any) -> PipelineSpec:
    """`spec` with draft.quantization (and build settings) rewritten in its file, loaded again."""
    data = yaml.safe_load(spec.path.read_text(encoding="utf-8"))
    data["draft"]["quantization"] = {"format": fmt, "kv_cache": kv_cache}
    data["build"].update(build)
    spec.path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return load_spec(spec.path)


def _modelopt_export(spec: PipelineSpec, quant_algo: str, kv_algo: str | None) -> Path:
    """What `convert` leaves in checkpoints/draft-hf, as far as an engine reads it to pick its loader: config.json
    with ModelOpt 0.47's quantization_config and hf_quant_config.json (tests/hf_quant_schema.py, which
    tests/test_quantize_hf_export.py holds the real export to), and convert's manifest.json."""
    directory = spec.output_dir / "checkpoints" / "draft-hf"
    directory.mkdir(parents=True, exist_ok=True)
    config = {"hidden_size": 8, "vocab_size": 16, "quantization_config": hf_quant_schema.quantization_config(
        quant_algo, kv_algo)}
    (directory / "config.json").write_text(json.dumps(config), encoding="utf-8")
    quant = hf_quant_schema.hf_quant_config(quant_algo, kv_algo, 64 if "AWQ" in quant_algo else None)
    (directory / "hf_quant_config.json").write_text(json.dumps(quant), encoding="utf-8")
    (directory / "manifest.json").write_text(json.dumps({"stage": "convert"}), encoding="utf-8")
    return directory


# -- reading the command lines -------------------------------------------------------------------------------------
def _vllm(plan_argv: list[str], spec: PipelineSpec) -> tuple[dict[str, str | bool], dict[str, Any] | None]:
    assert plan_argv[:3] == ["vllm", "serve", str(spec.target.model)]
    flags = parse_flags(plan_argv[3:])
    assert flags["--tensor-parallel-size"] == "2" and flags["--pipeline-parallel-size"] == "1"
    assert flags["--max-model-len"] == "256"  # max_input_len + max_output_len
    assert flags["--max-num-seqs"] == "12" and flags["--dtype"] == "bfloat16"
    assert flags["--served-model-name"] == spec.name
    config = json.loads(flags["--speculative-config"]) if "--speculative-config" in flags else None
    return flags, config


def _sglang(argv: list[str], spec: PipelineSpec) -> dict[str, str | bool]:
    assert argv[:3] == ["python", "-m", "sglang.launch_server"]
    flags = parse_flags(argv[3:])
    assert flags["--model-path"] == str(spec.target.model) and flags["--tp-size"] == "2"
    assert flags["--context-length"] == "256" and flags["--max-running-requests"] == "12"
    assert flags["--dtype"] == "bfloat16"
    return flags


# -- vLLM ----------------------------------------------------------------------------------------------------------
def test_vllm_plain_is_the_target_with_the_spec_limits_and_no_speculation(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    result = export_spec(spec, "vllm")
    flags, config = _vllm(result.plan.argv, spec)
    assert config is None and "--trust-remote-code" not in flags
    assert result.directory == spec.output_dir.resolve() / "export" / "vllm"
    script = (result.directory / "serve.sh").read_text(encoding="utf-8")
    assert os.access(result.directory / "serve.sh", os.X_OK)
    assert shlex.split(script.splitlines()[-1]) == ["exec", *result.plan.argv, "$@"]


def test_vllm_draft_target_is_draft_model_with_k(tmp_path: Path) -> None:
    spec = _spec(tmp_path, "draft_target", target=_model_dir(tmp_path / "t"), deploy={})
    result = export_spec(spec, "vllm", tmp_path / "out")
    _, config = _vllm(result.plan.argv, spec)
    assert config == {"method": "draft_model", "model": str(spec.draft.model), "num_speculative_tokens": 5}
    written = json.loads((tmp_path / "out" / "speculative_config.json").read_text(encoding="utf-8"))
    assert written == config
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["engine"] == "vllm" and manifest["argv"] == result.plan.argv
    assert any("vllm/config/speculative.py" in source for source in manifest["sources"])


def test_vllm_fp8_draft_and_its_kv_cache_and_draft_logits_are_passed(tmp_path: Path) -> None:
    spec = _spec(tmp_path, "draft_target", speculative={"use_draft_logits": True})
    data = yaml.safe_load(spec.path.read_text(encoding="utf-8"))
    data["draft"]["quantization"] = {"format": "fp8", "kv_cache": "fp8"}
    spec.path.write_text(yaml.safe_dump(data), encoding="utf-8")
    spec = load_spec(spec.path)
    _, config = _vllm(export_spec(spec, "vllm", dry_run=True).plan.argv, spec)
    assert config is not None
    assert (config["quantization"], config["kv_cache_dtype"], config["draft_sample_method"]) == (
        "fp8", "fp8", "probabilistic")


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@pytest.mark.parametrize("fmt", [name for name in FORMATS if name not in LOAD_TIME_FORMATS])
def test_engine_flow_formats_neither_engine_quantizes_while_loading_are_refused(tmp_path: Path, engine: str,
                                                                                 fmt: str) -> None:
    """build.flow engine: convert writes no ModelOpt export, so only fp8 (applied while loading) is served; the other
    formats are refused naming the engine's ModelOpt algorithms, and nothing is written."""
    spec = _quantized(_spec(tmp_path, "draft_target"), fmt)
    with pytest.raises(ExportRefused, match=rf"draft\.quantization\.format {fmt}: \w+ cannot serve this") as err:
        export_spec(spec, engine, tmp_path / "out")
    assert FORMATS[fmt].quant_algo in str(err.value)
    assert all(algo in str(err.value) for algo in MODELOPT_ALGOS[engine])
    assert err.value.hint == "set draft.quantization.format to fp8 or none for this export"
    assert not (tmp_path / "out").exists()


def test_a_kv_cache_format_vllm_lacks_is_one_refusal_not_a_key_error(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The draft's KV formats come from contracts/quant_formats.py; one that vLLM's CacheDType has no name for (the
    engine tier holds vllm.CACHE_DTYPES to vLLM's own) is refused naming the field, as a new table entry would be."""
    from specbuild.contracts.quant_formats import KV_FORMATS
    from specbuild.export import vllm

    assert set(vllm.DRAFT_KV_CACHE) <= set(KV_FORMATS) and set(vllm.DRAFT_KV_CACHE.values()) <= set(vllm.CACHE_DTYPES)
    spec = _spec(tmp_path, "draft_target")
    data = yaml.safe_load(spec.path.read_text(encoding="utf-8"))
    data["draft"]["quantization"] = {"format": "fp8", "kv_cache": "fp8"}
    spec.path.write_text(yaml.safe_dump(data), encoding="utf-8")
    monkeypatch.setattr(vllm, "DRAFT_KV_CACHE", {})
    with pytest.raises(ExportRefused, match=r"draft\.quantization\.kv_cache fp8: vLLM cannot serve this .*CacheDType"
                       ) as err:
        export_spec(load_spec(spec.path), "vllm", tmp_path / "out")
    assert err.value.hint == "set draft.quantization.kv_cache to one of none for this export"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("mode", "metrics"), [("draft_target", "summary"), ("none", None)])
def test_vllm_reports_each_responses_acceptance_where_it_speculates(tmp_path: Path, mode: str,
                                                                     metrics: str | None) -> None:
    """--per-request-spec-decode-metrics summary puts each response's acceptance under metrics.speculative_decoding
    (vllm 0.33.0 config/observability.py); vLLM refuses the flag without a speculative config, so a plain export
    leaves it out (the engine tier judges both)."""
    spec = _spec(tmp_path, mode)
    flags, _ = _vllm(export_spec(spec, "vllm", dry_run=True).plan.argv, spec)
    assert flags.get("--per-request-spec-decode-metrics") == metrics


def test_vllm_gets_the_load_aware_k_as_draft_lengths_by_batch_size(tmp_path: Path) -> None:
    """draft_len_schedule {1: 5, 4: 2} (each K from that many sequences on) and max_concurrency 8 (none above 8), at
    max_batch_size 12, are vLLM's num_speculative_tokens_per_batch_size ranges [1, 3] -> 5, [4, 8] -> 2, [9, 12] -> 0
    (inclusive ranges from 1, vllm/v1/spec_decode/dynamic/utils.py in 0.33.0); vLLM's own expansion of them is held
    to the spec at every batch size in tests/test_engines_judge.py. Nothing about the load is a note any more; the
    BLS's plain_round_tokens still is."""
    spec = _spec(tmp_path, "draft_target", speculative={"draft_len_schedule": {1: 5, 4: 2}, "max_concurrency": 8,
                                                        "plain_round_tokens": 2})
    plan = export_spec(spec, "vllm", dry_run=True).plan
    _, config = _vllm(plan.argv, spec)
    assert config is not None
    assert config["num_speculative_tokens_per_batch_size"] == [[1, 3, 5], [4, 8, 2], [9, 12, 0]]
    assert not [note for note in plan.notes if "draft_len_schedule" in note or "max_concurrency" in note], plan.notes
    assert any(note.startswith("speculative.plain_round_tokens: not exported;") for note in plan.notes)
    assert any("dynamic/utils.py" in str(source) for source in plan.sources)


@pytest.mark.parametrize(("speculative", "ranges"), [
    ({"max_concurrency": 4}, [[1, 4, 5], [5, 12, 0]]),
    ({"draft_len_schedule": {1: 5, 2: 5, 6: 3}}, [[1, 5, 5], [6, 12, 3]]),
    ({}, None),
])
def test_vllm_load_ranges_merge_equal_lengths_and_need_a_load_setting(tmp_path: Path, speculative: dict[str, Any],
                                                                      ranges: list[list[int]] | None) -> None:
    """A cutoff alone is K up to it and 0 above; equal neighbouring lengths are one range; without either setting
    vLLM gets no schedule and runs K at any load."""
    spec = _spec(tmp_path, "draft_target", speculative=speculative)
    _, config = _vllm(export_spec(spec, "vllm", dry_run=True).plan.argv, spec)
    assert config is not None and config.get("num_speculative_tokens_per_batch_size") == ranges


def test_load_dependent_speculation_is_a_note_on_sglang_standalone(tmp_path: Path) -> None:
    spec = _spec(tmp_path, "draft_target", speculative={"draft_len_schedule": {1: 5, 4: 0}, "max_concurrency": 8,
                                                        "plain_round_tokens": 2})
    notes = export_spec(spec, "sglang", dry_run=True).plan.notes
    name = "SGLang"
    assert f"speculative.draft_len_schedule: not exported; {name} speculates the same length at any load" in notes
    assert f"speculative.max_concurrency: not exported; {name} has no load above which it stops speculating" in notes
    assert any(n.startswith("speculative.plain_round_tokens: not exported;") and name in n for n in notes), notes


def test_vllm_refuses_medusa_with_what_to_do_instead(tmp_path: Path) -> None:
    """vLLM 0.33.0 has no Medusa: its SpeculativeMethod (vllm/config/speculative.py at the wheel's commit 4ba787ec9)
    lists no "medusa" and vllm/model_executor/models/ has no medusa.py, so `vllm serve` rejects `"method": "medusa"`.
    The export refuses before anything is written (the heads are not even read), naming the field and pointing at
    EAGLE-3 or TensorRT-LLM 1.2's engine flow."""
    spec = _spec(tmp_path, "medusa", speculative={"draft_len_schedule": {1: 8, 2: 0}})
    (spec.medusa.heads / "medusa_lm_head.safetensors").write_bytes(b"not safetensors")  # never read
    with pytest.raises(ExportRefused, match=r"speculative\.mode medusa: vLLM cannot serve this \(vLLM 0\.33 has no "
                       r"Medusa: SpeculativeConfig\.method takes ngram, draft_model, .*vllm/config/speculative\.py"
                       ) as err:
        export_spec(spec, "vllm", tmp_path / "out")
    assert "medusa," not in str(err.value).split("takes", 1)[1]
    hint = err.value.hint or ""
    assert "specbuild eagle train" in hint and "speculative.mode: eagle3" in hint and "TensorRT-LLM 1.2" in hint
    assert not (tmp_path / "out").exists()


# -- SGLang --------------------------------------------------------------------------------------------------------
def test_sglang_draft_target_is_standalone_k_steps_topk_1_k_plus_1_tokens(tmp_path: Path) -> None:
    spec = _spec(tmp_path, "draft_target")
    result = export_spec(spec, "sglang", tmp_path / "out")
    flags = _sglang(result.plan.argv, spec)
    assert flags["--speculative-algorithm"] == "STANDALONE"
    assert flags["--speculative-draft-model-path"] == str(spec.draft.model)
    assert (flags["--speculative-num-steps"], flags["--speculative-eagle-topk"],
            flags["--speculative-num-draft-tokens"]) == ("5", "1", "6")
    assert "--speculative-draft-model-quantization" not in flags
    config = yaml.safe_load((tmp_path / "out" / "config.yaml").read_text(encoding="utf-8"))
    assert {f"--{key}": value for key, value in config.items()} == {
        name: value if value is True or not str(value).isdigit() else int(value) for name, value in flags.items()}


def test_sglang_plain_has_no_speculative_flags(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    flags = _sglang(export_spec(spec, "sglang", dry_run=True).plan.argv, spec)
    assert not [name for name in flags if name.startswith("--speculative")]
    assert not (spec.output_dir / "export").exists()  # a dry run writes nothing


def test_sglang_fp8_draft_and_its_own_kv_cache_dtype_are_passed(tmp_path: Path) -> None:
    """draft.quantization.kv_cache fp8 is --speculative-draft-kv-cache-dtype fp8_e4m3, the draft's KV pool alone
    (sglang 0.5.23 mem_cache/kv_cache_dtype.py); the server-wide --kv-cache-dtype is not written, so the target's
    KV cache stays unquantized as the spec keeps it. The engine tier holds SGLang's resolution to this."""
    spec = _spec(tmp_path, "draft_target")
    data = yaml.safe_load(spec.path.read_text(encoding="utf-8"))
    data["draft"]["quantization"] = {"format": "fp8"}
    spec.path.write_text(yaml.safe_dump(data), encoding="utf-8")
    flags = _sglang(export_spec(load_spec(spec.path), "sglang", dry_run=True).plan.argv, spec)
    assert flags["--speculative-draft-model-quantization"] == "fp8"
    assert "--speculative-draft-kv-cache-dtype" not in flags
    data["draft"]["quantization"]["kv_cache"] = "fp8"
    spec.path.write_text(yaml.safe_dump(data), encoding="utf-8")
    flags = _sglang(export_spec(load_spec(spec.path), "sglang", dry_run=True).plan.argv, spec)
    assert flags["--speculative-draft-kv-cache-dtype"] == "fp8_e4m3" and "--kv-cache-dtype" not in flags


def test_sglang_eagle3_runs_the_load_aware_k_as_adaptive_tiers(tmp_path: Path) -> None:
    """EAGLE3 with draft_len_schedule {1: 3, 4: 1} and max_concurrency 8 (max_batch_size 12): SGLang's adaptive
    speculation with one tier per length's first batch size, each a single candidate step count ({"1": [3], "4": [1],
    "9": [0]}), so it cannot move off the spec's K; the file is written beside serve.sh and named by absolute path.
    The engine tier holds SGLang's own tier lookup to the spec at every batch size."""
    spec = _mode_spec(tmp_path, "eagle3", draft_len_schedule={1: 3, 4: 1}, max_concurrency=8)
    result = export_spec(spec, "sglang", tmp_path / "out")
    flags = _sglang(result.plan.argv, spec)
    assert flags["--speculative-adaptive"] is True and flags["--speculative-num-steps"] == "3"
    assert flags["--speculative-adaptive-config"] == str(tmp_path / "out" / "speculative_adaptive.json")
    tiers = json.loads((tmp_path / "out" / "speculative_adaptive.json").read_text(encoding="utf-8"))
    assert tiers == {"1": {"candidate_steps": [3]}, "4": {"candidate_steps": [1]}, "9": {"candidate_steps": [0]}}
    assert not [note for note in result.plan.notes if "not exported" in note and "draft_len_schedule" in note]


def test_sglang_standalone_says_adaptive_is_eagle_only(tmp_path: Path) -> None:
    """SGLang 0.5.23 turns --speculative-adaptive off for any algorithm but EAGLE/EAGLE3
    (adaptive_spec_params.py `adaptive_unsupported_reason`), so a draft-target schedule is a note naming that, and
    no adaptive flag is written."""
    spec = _spec(tmp_path, "draft_target", speculative={"draft_len_schedule": {1: 5, 4: 2}})
    plan = export_spec(spec, "sglang", dry_run=True).plan
    assert "--speculative-adaptive" not in plan.argv
    assert any("EAGLE and EAGLE3 alone; STANDALONE keeps one K" in note for note in plan.notes), plan.notes


def test_sglang_refuses_medusa_with_the_reason(tmp_path: Path) -> None:
    with pytest.raises(ExportRefused, match="SGLang has no Medusa") as err:
        export_spec(_spec(tmp_path, "medusa"), "sglang", tmp_path / "out")
    assert "specbuild eagle train" in (err.value.hint or "") and "export vllm" not in (err.value.hint or "")
    assert not (tmp_path / "out").exists()


def test_messages_name_the_spec_file_or_an_in_memory_spec_by_its_name(tmp_path: Path) -> None:
    """A spec built in memory (no file) is named by its `name` in refusals and in the manifest, not a traceback."""
    loaded = _spec(tmp_path, "medusa")
    in_memory = PipelineSpec.model_validate(yaml.safe_load(loaded.path.read_text(encoding="utf-8")))
    with pytest.raises(ExportRefused, match=rf"^{loaded.path}: speculative.mode medusa"):
        export_spec(loaded, "sglang", dry_run=True)
    with pytest.raises(ExportRefused, match=r"^x-medusa: speculative.mode medusa"):
        export_spec(in_memory, "sglang", dry_run=True)
    plain = PipelineSpec.model_validate({**in_memory.model_dump(mode="json", exclude={"medusa"}),
                                         "speculative": {"mode": "none"}})
    export_spec(plain, "sglang", tmp_path / "out")
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["spec"] == "x-medusa"
    assert (tmp_path / "out" / "serve.sh").read_text(encoding="utf-8").splitlines()[1].endswith("from x-medusa.")


# -- writing and the command line ----------------------------------------------------------------------------------
def test_an_export_replaces_its_own_directory_but_not_a_foreign_one(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    export_spec(spec, "vllm", tmp_path / "out")
    export_spec(spec, "vllm", tmp_path / "out")  # its own: replaced
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep", encoding="utf-8")
    with pytest.raises(SpecbuildError, match="not written by specbuild"):
        export_spec(spec, "vllm", foreign)
    assert sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]


def test_cli_dry_run_prints_the_command_and_a_refusal_is_one_message(tmp_path: Path) -> None:
    spec = _spec(tmp_path, "draft_target")
    result = runner.invoke(app, ["export", "vllm", str(spec.path), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "vllm serve" in result.output and '"method":"draft_model"' in result.output
    medusa = _spec(tmp_path / "m", "medusa")
    result = runner.invoke(app, ["export", "sglang", str(medusa.path)])
    assert result.exit_code == 1 and "SGLang has no Medusa" in result.output and "Traceback" not in result.output


# -- n-gram and EAGLE-3 --------------------------------------------------------------------------------------------
def _mode_spec(tmp: Path, mode: str, **speculative: Any) -> PipelineSpec:
    data: dict[str, Any] = {
        "name": f"x-{mode}",
        "target": {"model": str(_model_dir(tmp / "target"))},
        "speculative": {"mode": mode, "num_draft_tokens": 3, **speculative},
        "build": {"flow": "pytorch", "dtype": "bfloat16", "tp_size": 2, "max_batch_size": 12, "max_input_len": 200,
                  "max_output_len": 56},
    }
    if mode == "eagle3":  # a real EAGLE-3 draft made for the target: export refuses anything else
        edit_config(tmp / "target", architectures=["LlamaForCausalLM"], num_hidden_layers=4)
        config = Eagle3DraftConfig(hidden_size=8, intermediate_size=16, num_attention_heads=2, num_key_value_heads=1,
                                   vocab_size=16, target_layer_ids=(0, 1, 2))
        tensors = {name: torch.zeros(shape) for name, shape in expected_shapes(config).items()
                   if name not in ("d2t", "t2d", "embed_tokens.weight")}
        data["draft"] = {"model": str(write_eagle3_draft(tmp / "eagle3-draft", config, tensors))}
    path = tmp / "pipeline.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return load_spec(path)


def test_ngram_is_prompt_lookup_up_to_the_longest_ngram(tmp_path: Path) -> None:
    spec = _mode_spec(tmp_path, "ngram", ngram={"max_matching_ngram_size": 4, "is_keep_all": False})
    vllm = export_spec(spec, "vllm", dry_run=True)
    _, config = _vllm(vllm.plan.argv, spec)
    assert config == {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 1}
    assert any("is_keep_all" in note for note in vllm.plan.notes)


SGLANG_0_5_23_NGRAM_OPTIONS = {"--speculative-ngram-min-bfs-breadth", "--speculative-ngram-max-bfs-breadth",
                               "--speculative-ngram-match-type", "--speculative-ngram-max-trie-depth",
                               "--speculative-ngram-capacity", "--speculative-ngram-external-corpus-path",
                               "--speculative-ngram-external-sam-budget",
                               "--speculative-ngram-external-corpus-max-tokens"}
"""sglang 0.5.23's n-gram options (sgl-project/sglang python/sglang/srt/arg_groups/fields/spec.py@015c872628e3, the
same in the 0.5.23 wheel); its argparse exits 2 on any other --speculative-ngram-* (the engine tier,
tests/test_engines_judge.py, runs the parser itself)."""


def test_sglang_ngram_options_are_the_ones_sglang_0_5_23_has(tmp_path: Path) -> None:
    """Breadth 1 (one chain, as the other engines propose) and a trie deep enough for the longest n-gram plus K;
    no --speculative-ngram-*-match-window-size, which 0.5.23 no longer has."""
    spec = _mode_spec(tmp_path, "ngram", ngram={"max_matching_ngram_size": 4})
    result = export_spec(spec, "sglang", dry_run=True)
    flags = _sglang(result.plan.argv, spec)
    ngram = {name for name in flags if name.startswith("--speculative-ngram-")}
    assert ngram <= SGLANG_0_5_23_NGRAM_OPTIONS, sorted(ngram - SGLANG_0_5_23_NGRAM_OPTIONS)
    assert (flags["--speculative-algorithm"], flags["--speculative-ngram-min-bfs-breadth"],
            flags["--speculative-ngram-max-bfs-breadth"], flags["--speculative-ngram-max-trie-depth"]) == (
        "NGRAM", "1", "1", "7")  # 4 + K
    assert "--speculative-draft-model-path" not in flags
    assert any("max_matching_ngram_size 4" in note and "max-trie-depth 7" in note for note in result.plan.notes)


@pytest.mark.parametrize("k", [1, 3, 4])
def test_sglang_ngram_num_draft_tokens_counts_the_last_verified_token(tmp_path: Path, k: int) -> None:
    """SGLang's NGRAM proposes --speculative-num-draft-tokens - 1 tokens: its corpus returns the last verified token
    first (python/sglang/kernels/jit/csrc/ngram_corpus/param.h@01a8b7f0f911 `get_draft_token_num` is
    draft_token_num - 1; trie.cpp fills draft_token_num + 1 nodes from last_token). So K proposals are K + 1, as
    STANDALONE and EAGLE3 write."""
    spec = _mode_spec(tmp_path, "ngram", num_draft_tokens=k)
    flags = parse_flags(export_spec(spec, "sglang", dry_run=True).plan.argv[3:])
    assert (flags["--speculative-algorithm"], flags["--speculative-num-draft-tokens"]) == ("NGRAM", str(k + 1))


def test_eagle3_passes_the_draft_head_with_k(tmp_path: Path) -> None:
    spec = _mode_spec(tmp_path, "eagle3")
    _, config = _vllm(export_spec(spec, "vllm", dry_run=True).plan.argv, spec)
    assert config == {"method": "eagle3", "model": str(spec.draft.model), "num_speculative_tokens": 3}
    flags = _sglang(export_spec(spec, "sglang", dry_run=True).plan.argv, spec)
    assert (flags["--speculative-algorithm"], flags["--speculative-draft-model-path"], flags["--speculative-num-steps"],
            flags["--speculative-eagle-topk"], flags["--speculative-num-draft-tokens"]) == (
        "EAGLE3", str(spec.draft.model), "3", "1", "4")


# -- a quantized draft on build.flow: pytorch: convert's ModelOpt export --------------------------------------------
def _pytorch_flow(tmp_path: Path, fmt: str, kv_cache: str = "none") -> PipelineSpec:
    return _quantized(_spec(tmp_path, "draft_target"), fmt, kv_cache, flow="pytorch")


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_pytorch_flow_serves_the_modelopt_export_where_the_engine_reads_its_algorithm(tmp_path: Path, engine: str,
                                                                                      fmt: str) -> None:
    """Each format's quant_algo against the engine's ModelOpt loader (draft.ENGINE_QUANTIZATION): served from
    checkpoints/draft-hf with the engine's name for a ModelOpt checkpoint, or refused naming the algorithm, the ones
    the engine reads and where that list is, before anything is written."""
    spec = _pytorch_flow(tmp_path, fmt)
    algo = FORMATS[fmt].quant_algo
    export = _modelopt_export(spec, algo, None)
    if algo not in MODELOPT_ALGOS[engine]:
        with pytest.raises(ExportRefused, match=rf"draft\.quantization\.format {fmt}: \w+ cannot serve this") as err:
            export_spec(spec, engine, tmp_path / "out")
        message = str(err.value)
        assert algo in message and all(name in message for name in MODELOPT_ALGOS[engine])
        assert MODELOPT_SOURCES[engine] in message
        assert err.value.hint == "set draft.quantization.format to fp8 or none for this export"
        assert not (tmp_path / "out").exists()
        return
    result = export_spec(spec, engine, tmp_path / "out")
    assert any(MODELOPT_SOURCES[engine] in source for source in
               json.loads((tmp_path / "out" / "manifest.json").read_text(encoding="utf-8"))["sources"])
    assert any(str(export) in note for note in result.plan.notes)
    if engine == "vllm":
        _, config = _vllm(result.plan.argv, spec)
        assert config == {"method": "draft_model", "model": str(export), "num_speculative_tokens": 5,
                          "quantization": "modelopt"}
    else:
        flags = _sglang(result.plan.argv, spec)
        assert flags["--speculative-draft-model-path"] == str(export)
        assert flags["--speculative-draft-model-quantization"] == "modelopt"


def test_the_engines_read_the_export_by_modelopts_quant_method() -> None:
    """The export's config.json names the method both engines detect a ModelOpt checkpoint by (ModelOpt 0.47's
    quantization_config, tests/hf_quant_schema.py); the engine tier runs each engine's loader on it. FP8 is served
    from the export by both, and fp8 is the one format both quantize while loading."""
    assert hf_quant_schema.quantization_config("FP8", None)["quant_method"] == MODELOPT_METHOD
    assert all("FP8" in table.modelopt_algos for table in ENGINE_QUANTIZATION.values())
    assert all(tuple(table.load_time) == LOAD_TIME_FORMATS for table in ENGINE_QUANTIZATION.values())


def test_vllm_fp8_kv_cache_rides_with_the_export(tmp_path: Path) -> None:
    """The export's k/v scales are ModelOpt's (kv_cache_quant_algo FP8); the draft's cache dtype is still vLLM's
    draft-only kv_cache_dtype."""
    spec = _pytorch_flow(tmp_path, "fp8", "fp8")
    export = _modelopt_export(spec, "FP8", kv_cache_quant_algo("fp8"))
    _, config = _vllm(export_spec(spec, "vllm", dry_run=True).plan.argv, spec)
    assert config is not None and (config["model"], config["quantization"], config["kv_cache_dtype"]) == (
        str(export), "modelopt", "fp8")


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_an_export_before_convert_wrote_the_draft_is_refused(tmp_path: Path, engine: str) -> None:
    spec = _pytorch_flow(tmp_path, "fp8")
    with pytest.raises(ExportRefused, match=r"ModelOpt Hugging Face export in .*draft-hf, which is not written yet"
                       ) as err:
        export_spec(spec, engine, tmp_path / "out")
    assert err.value.hint == "run `specbuild convert SPEC`, then export again"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("written", "kv_cache", "field"), [
    (("W8A16", None), "none", "config.json: quantization_config.quant_algo is 'W8A16', the spec asks 'FP8'"),
    (("FP8", None), "fp8", "hf_quant_config.json: quantization.kv_cache_quant_algo is None, the spec asks 'FP8'"),
])
def test_an_export_of_another_quantization_is_refused_at_its_field(tmp_path: Path, written: tuple[str, str | None],
                                                                   kv_cache: str, field: str) -> None:
    """draft-hf left by an earlier convert of another draft.quantization: refused naming the file and field, not
    served as the spec's."""
    spec = _pytorch_flow(tmp_path, "fp8", kv_cache)
    _modelopt_export(spec, *written)
    with pytest.raises(ExportRefused, match=r"is not the spec's draft\.quantization") as err:
        export_spec(spec, "vllm", tmp_path / "out")
    assert field in str(err.value) and err.value.hint == "run `specbuild convert SPEC`, then export again"
    assert not (tmp_path / "out").exists()


def test_engine_flow_fp8_is_applied_while_loading_and_says_so(tmp_path: Path) -> None:
    spec = _quantized(_spec(tmp_path, "draft_target"), "fp8")
    result = export_spec(spec, "sglang", dry_run=True)
    flags = _sglang(result.plan.argv, spec)
    assert (flags["--speculative-draft-model-path"], flags["--speculative-draft-model-quantization"]) == (
        str(spec.draft.model), "fp8")
    assert any("while loading" in note and "build.flow: pytorch" in note for note in result.plan.notes)


@pytest.mark.parametrize(("engine", "says"), [("vllm", "Arctic Inference's suffix decoding"),
                                              ("sglang", "SGLang has no suffix-automaton drafting")])
def test_sa_is_refused_with_the_nearest_method(tmp_path: Path, engine: str, says: str) -> None:
    """TensorRT-LLM's SA has no counterpart in either engine (vLLM 0.33's `suffix` method is another algorithm,
    vllm/config/speculative.py's suffix_decoding_* settings over arctic_inference; SGLang 0.5.23's algorithms are
    EAGLE, EAGLE3, STANDALONE, NGRAM, NEXTN): refused, naming ngram instead, and nothing is written."""
    spec = _spec(tmp_path, "sa", build={"flow": "pytorch"})
    with pytest.raises(ExportRefused, match=says) as refused:
        export_spec(spec, engine, tmp_path / "out")
    assert "speculative.mode ngram" in str(refused.value.hint)
    assert not (tmp_path / "out").exists()
