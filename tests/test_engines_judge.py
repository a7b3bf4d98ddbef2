"""The engine tier: vLLM 0.33.0 and SGLang 0.5.23 judge every `specbuild export`, with their own code.

Why: the export writes another engine's command line, and only that engine's parser and config classes can say
whether it is accepted and what it means; copied tables of names drift (issue 23 found three such drifts). Each
engine lives in its own cached virtualenv outside the project's .venv (their torch pins differ; `make test-engines`
installs them, about 10 GB each). This module (in .venv) writes the exports of every demo spec and of specs that
cover each method, a quantized draft and tp > 1, then runs tests/engine_checkers/{vllm,sglang}_check.py once per
engine with that engine's python, which parse each command line as `vllm serve` / `sglang.launch_server` do and
print what the engine resolved (their docstrings say what is stood in for a GPU: nothing for vLLM, which has its
own `VLLM_TARGET_DEVICE=cpu`; for SGLang the CUDA device queries, `nvidia-smi` and sgl_kernel's compiled ops).

Each export must be accepted and resolve to what the spec asked (method, K, draft path, quantization, tensor and
pipeline parallelism, max lengths, batch size). Each export specbuild refuses is paired with a probe, the command
line an export would have needed, which the engine's own code must refuse too. Without the engine virtualenvs the
tests skip (naming `make test-engines`), so `make test` stays green on a machine without them; with
SPECBUILD_REQUIRE_ENGINES=1 (`make test-engines` sets it) a missing engine fails instead.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from specbuild.contracts.family_support import ARCHITECTURES, REFUSALS
from specbuild.export import ExportRefused, export_spec
from specbuild.spec import PipelineSpec, load_spec
from tests import hf_quant_schema

pytestmark = pytest.mark.engines

REPO = Path(__file__).resolve().parents[1]
CHECKERS = Path(__file__).resolve().parent / "engine_checkers"
ENGINES_DIR = Path(os.environ.get("SPECBUILD_ENGINES_DIR") or Path.home() / ".cache" / "specbuild" / "engines")
VENVS = {"vllm": ENGINES_DIR / "vllm-0.33.0", "sglang": ENGINES_DIR / "sglang-0.5.23"}
"""Where `make test-engines` installs each engine (its ENGINES_DIR); `.installed-stamp` marks a finished install."""
CHECK_TIMEOUT = 900
DEMO_SPECS = sorted(REPO.glob("configs/demo*.yaml"))


def engine_python(engine: str) -> Path:
    """The engine virtualenv's python, or a skip (a failure under SPECBUILD_REQUIRE_ENGINES) naming the fix."""
    venv = VENVS[engine]
    if not (venv / ".installed-stamp").is_file():
        message = f"{engine} is not installed in {venv}: `make test-engines` installs it (about 10 GB)"
        if os.environ.get("SPECBUILD_REQUIRE_ENGINES"):
            pytest.fail(message)
        pytest.skip(message)
    return venv / "bin" / "python"


# -- the specs -----------------------------------------------------------------------------------------------------
def _demo_spec(path: Path, root: Path, models: Path, extra: Callable[[str], Path]) -> Path:
    """A demo spec with its model paths pointed at the session's demo models (the extras it names built)."""
    text = path.read_text(encoding="utf-8")
    for name in sorted(set(re.findall(r"\.\./demo/models/([\w.-]+)", text))):
        if not (models / name).exists():
            extra(name)
    text = text.replace("../demo/models/", f"{models}/").replace("output_dir: ../demo/", f"output_dir: {root}/")
    spec = root / path.name
    spec.write_text(text, encoding="utf-8")
    return spec


def _spec(root: Path, name: str, data: dict[str, Any]) -> Path:
    data = {"name": name, "output_dir": str(root / name), **data}
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def _modelopt_fp8_export(spec: PipelineSpec, draft: Path) -> None:
    """What `convert` leaves in <output_dir>/checkpoints/draft-hf for an fp8 draft, as far as an engine reads it
    before loading weights: the draft's config.json with ModelOpt 0.47's quantization_config (tests/hf_quant_schema.py,
    which tests/test_quantize_hf_export.py holds a real export to), hf_quant_config.json, the tokenizer, and convert's
    manifest.json. Neither engine loads weights while it resolves its configuration."""
    directory = spec.output_dir / "checkpoints" / "draft-hf"
    directory.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if (draft / name).is_file():
            shutil.copy(draft / name, directory / name)
    config = json.loads((draft / "config.json").read_text(encoding="utf-8"))
    config["quantization_config"] = hf_quant_schema.quantization_config("FP8", None)
    (directory / "config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    (directory / "hf_quant_config.json").write_text(json.dumps(hf_quant_schema.hf_quant_config("FP8", None, None)),
                                                    encoding="utf-8")
    (directory / "manifest.json").write_text(json.dumps({"stage": "convert"}), encoding="utf-8")


def build_specs(root: Path, models: Path, extra: Callable[[str], Path]) -> dict[str, PipelineSpec]:
    """Every demo spec, and one spec per method, quantized draft and tp > 1 the demos leave out."""
    paths = {path.stem: _demo_spec(path, root, models, extra) for path in DEMO_SPECS}
    build = {"dtype": "bfloat16", "max_batch_size": 8, "max_input_len": 200, "max_output_len": 56}
    target, draft = str(models / "target"), str(models / "draft")
    paths["ngram"] = _spec(root, "ngram", {
        "target": {"model": target}, "build": {**build, "flow": "pytorch"},
        "speculative": {"mode": "ngram", "num_draft_tokens": 4, "ngram": {"max_matching_ngram_size": 3}}})
    paths["draft-tp2"] = _spec(root, "draft-tp2", {
        "target": {"model": target}, "draft": {"model": draft}, "build": {**build, "tp_size": 2},
        "speculative": {"mode": "draft_target", "num_draft_tokens": 3}})
    paths["fp8-pytorch"] = _spec(root, "fp8-pytorch", {
        "target": {"model": target}, "draft": {"model": draft, "quantization": {"format": "fp8"}},
        "build": {**build, "flow": "pytorch"}, "speculative": {"mode": "draft_target", "num_draft_tokens": 5}})
    paths["fp8-engine"] = _spec(root, "fp8-engine", {
        "target": {"model": target}, "draft": {"model": draft, "quantization": {"format": "fp8"}},
        "build": build, "speculative": {"mode": "draft_target", "num_draft_tokens": 2}})
    paths["medusa-pytorch"] = _spec(root, "medusa-pytorch", {
        "target": {"model": target}, "medusa": {"heads": str(models / "medusa-heads"), "choices": "mc_sim_7b_top8"},
        "build": {**build, "flow": "pytorch"}, "speculative": {"mode": "medusa"}})
    paths["draft-by-load"] = _spec(root, "draft-by-load", {  # load-aware K (issue 51): a schedule and a cutoff
        "target": {"model": target}, "draft": {"model": draft}, "build": {**build, "flow": "pytorch"},
        "speculative": {"mode": "draft_target", "num_draft_tokens": 4, "draft_len_schedule": {1: 4, 3: 2, 5: 1},
                        "max_concurrency": 6}})
    paths["eagle3-by-load"] = _spec(root, "eagle3-by-load", {  # SGLang's adaptive tiers, the draft's own KV dtype
        "target": {"model": target},
        "draft": {"model": str(models / "eagle3-draft"), "quantization": {"kv_cache": "fp8"}},
        "build": {**build, "flow": "pytorch", "trtllm": "1.3"},
        "speculative": {"mode": "eagle3", "num_draft_tokens": 3, "draft_len_schedule": {1: 3, 3: 1},
                        "max_concurrency": 5}})
    qwen3 = _qwen3_pair(root / "qwen3")  # a family of issue 49 with a draft of its own family
    paths["qwen3-draft"] = _spec(root, "qwen3-draft", {
        "target": {"model": str(qwen3["target"])}, "draft": {"model": str(qwen3["draft"])},
        "build": {**build, "max_input_len": 64, "max_output_len": 32}, "speculative": {"mode": "draft_target"}})
    specs = {name: load_spec(path) for name, path in paths.items()}
    _modelopt_fp8_export(specs["fp8-pytorch"], models / "draft")
    return specs


def _qwen3_pair(root: Path) -> dict[str, Path]:
    """A tiny Qwen3 target and a one-layer Qwen3 draft (tests/tiny_models.py) sharing a trained tokenizer."""
    from specbuild import corpus
    from specbuild.demo.tokenizer import save_tokenizer, train_tokenizer
    from tests.tiny_models import make_checkpoint

    tokenizer = train_tokenizer(corpus.training_texts()[:20], 512)
    pair = {"target": make_checkpoint(root / "target", "qwen3", vocab_size=512),
            "draft": make_checkpoint(root / "draft", "qwen3", seed=1, vocab_size=512, num_hidden_layers=1)}
    for directory in pair.values():
        save_tokenizer(tokenizer, directory, 256)
    return pair


# -- probes: what an export would have needed, for what specbuild refuses --------------------------------------------
MODELOPT_ALGO = {"int8_sq": "W8A8_SQ_PER_CHANNEL", "int8_wo": "W8A16", "int4_awq": "W4A16_AWQ", "w4a8_awq": "W4A8_AWQ"}


@dataclass(frozen=True)
class Probe:
    """A command line the engine must refuse, and a word its refusal must name."""

    argv: list[str]
    names: str


def _modelopt_draft(root: Path, draft: Path, algo: str) -> Path:
    """A draft directory whose config.json says ModelOpt quantized it with `algo` (what a ModelOpt export of that
    format carries, tests/hf_quant_schema.py)."""
    directory = root / f"modelopt-{algo}"
    directory.mkdir(parents=True, exist_ok=True)
    config = json.loads((draft / "config.json").read_text(encoding="utf-8"))
    config["quantization_config"] = hf_quant_schema.quantization_config(algo, None)
    (directory / "config.json").write_text(json.dumps(config), encoding="utf-8")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(draft / name, directory / name)
    return directory


def probe(engine: str, spec: PipelineSpec, root: Path) -> Probe | None:
    """The launch line specbuild declined to write for `spec` (None: nothing the engine could be given, as for a
    self-draft, which exists only as a TensorRT-LLM checkpoint). A quantized draft's format is refused by the
    engine's model loader when it reads the checkpoint's quantization_config, which the checkers run too."""
    target, mode = str(spec.target.model), spec.speculative.mode
    vllm = ["vllm", "serve", target]
    sglang = ["python", "-m", "sglang.launch_server", "--model-path", target]
    if mode in ("medusa", "lookahead"):
        model = str(spec.medusa.heads) if spec.medusa is not None else target
        if engine == "vllm":
            config = {"method": mode, "model": model, "num_speculative_tokens": 3}
            return Probe([*vllm, "--speculative-config", json.dumps(config)], mode)
        return Probe([*sglang, "--speculative-algorithm", mode.upper(), "--speculative-draft-model-path", model,
                      "--speculative-num-draft-tokens", "4"], mode)
    if spec.draft is not None and spec.draft.is_self_draft:
        return None
    if spec.draft is not None and spec.draft.quantization.format in MODELOPT_ALGO:
        algo = MODELOPT_ALGO[spec.draft.quantization.format]
        draft = str(_modelopt_draft(root / "probes", spec.draft.model, algo))
        if engine == "vllm":
            config = {"method": "draft_model", "model": draft, "num_speculative_tokens": 4, "quantization": "modelopt"}
            return Probe([*vllm, "--speculative-config", json.dumps(config)], "modelopt")
        return Probe([*sglang, "--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", draft,
                      "--speculative-num-steps", "4", "--speculative-eagle-topk", "1",
                      "--speculative-num-draft-tokens", "5", "--speculative-draft-model-quantization", "modelopt"],
                     "modelopt")
    raise AssertionError(f"{spec.name}: no probe for this refusal; add one")


# -- running the engines -----------------------------------------------------------------------------------------------
@dataclass
class Judged:
    specs: dict[str, PipelineSpec]
    exports: dict[tuple[str, str], Path]
    """(engine, spec name) -> export directory, for the exports specbuild wrote."""
    refused: dict[tuple[str, str], ExportRefused]
    probes: dict[tuple[str, str], Probe | None]
    results: dict[str, dict[str, Any]]
    """engine -> the checker's JSON (facts, cases by name)."""


def _run_checkers(root: Path, cases: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Both checkers at once, each in its engine's python; their JSON with cases by name."""
    running = {}
    for engine, engine_cases in cases.items():
        path, out = root / f"{engine}-cases.json", root / f"{engine}-judged.json"
        path.write_text(json.dumps(engine_cases, indent=1), encoding="utf-8")
        log = (root / f"{engine}-check.log").open("w", encoding="utf-8")
        process = subprocess.Popen([str(engine_python(engine)), str(CHECKERS / f"{engine}_check.py"), str(path),
                                    str(out)], stdout=log, stderr=subprocess.STDOUT, cwd=root,
                                   env={**os.environ, "VLLM_TARGET_DEVICE": "cpu", "PYTHONPATH": "",
                                        "SPECBUILD_ARCHITECTURES": json.dumps(ARCHITECTURES)})
        running[engine] = (process, out, log)
    results = {}
    for engine, (process, out, log) in running.items():
        try:
            code = process.wait(timeout=CHECK_TIMEOUT)
        finally:
            if process.poll() is None:
                process.kill()
            log.close()
        tail = (root / f"{engine}-check.log").read_text(encoding="utf-8", errors="replace")[-3000:]
        assert code == 0 and out.is_file(), f"{engine} checker exited {code}:\n{tail}"
        data = json.loads(out.read_text(encoding="utf-8"))
        data["cases"] = {case["name"]: case for case in data["cases"]}
        results[engine] = data
    return results


@pytest.fixture(scope="module")
def judged(tmp_path_factory: pytest.TempPathFactory, demo_models: dict[str, Path],
           demo_extra: Callable[[str], Path]) -> Judged:
    pythons = {engine: engine_python(engine) for engine in VENVS}  # skip before any work when absent
    assert pythons
    root = tmp_path_factory.mktemp("engines")
    specs = build_specs(root, demo_models["target"].parent, demo_extra)
    exports, refused, probes = {}, {}, {}
    cases: dict[str, list[dict[str, Any]]] = {engine: [] for engine in VENVS}
    for engine in VENVS:
        for name, spec in specs.items():
            try:
                result = export_spec(spec, engine, root / "exports" / engine / name)
            except ExportRefused as err:
                refused[engine, name] = err
                probes[engine, name] = found = probe(engine, spec, root)
                if found is not None:
                    cases[engine].append({"name": f"probe:{name}", "argv": found.argv})
                continue
            exports[engine, name] = result.directory
            cases[engine].append({"name": name, "argv": result.plan.argv})
            if engine == "sglang":  # the same flags as launch_server --config reads them
                config = str(result.directory / "config.yaml")
                cases[engine].append({"name": f"config:{name}",
                                      "argv": ["python", "-m", "sglang.launch_server", "--config", config]})
    cases["sglang"].append({"name": "old-ngram-flags", "argv": [
        "python", "-m", "sglang.launch_server", "--model-path", str(specs["ngram"].target.model),
        "--speculative-algorithm", "NGRAM", "--speculative-ngram-min-match-window-size", "1",
        "--speculative-ngram-max-match-window-size", "3"]})
    return Judged(specs, exports, refused, probes, _run_checkers(root, cases))


WRITTEN = ("demo-dynamo", "demo-eagle3", "demo-plain", "demo-pytorch", "demo-qwen3", "ngram", "draft-tp2",
           "fp8-pytorch", "fp8-engine", "qwen3-draft", "draft-by-load", "eagle3-by-load")
"""What specbuild writes for both engines (each engine must accept it); the rest it refuses, for both."""
REFUSED = ("demo", "demo-lookahead", "demo-medusa", "demo-medusa2", "demo-self-draft", "medusa-pytorch")
ALL_SPECS = (*WRITTEN, *REFUSED)


def test_every_demo_spec_is_judged() -> None:
    """A new configs/demo*.yaml is judged too: it must be named above as written or refused."""
    assert {path.stem for path in DEMO_SPECS} <= set(ALL_SPECS)


@pytest.mark.parametrize("engine", sorted(VENVS))
def test_specbuild_writes_and_refuses_as_listed(judged: Judged, engine: str) -> None:
    written = {name for (which, name) in judged.exports if which == engine}
    assert written == set(WRITTEN), {name: str(judged.refused.get((engine, name))) for name in set(WRITTEN) - written}


# -- accepted, and meaning what the spec asked ---------------------------------------------------------------------
QUANT_CONFIG = {("vllm", "modelopt"): "ModelOptFp8Config", ("vllm", "fp8"): "OnlineQuantizationConfig",
                ("sglang", "modelopt"): "ModelOptFp8Config", ("sglang", "fp8"): "Fp8Config"}
"""The engine's quantization config class its model loader builds for a draft quantization: ModelOpt's calibrated
FP8 from convert's export, or FP8 applied while loading."""


def _expected_draft(spec: PipelineSpec) -> tuple[str | None, str | None]:
    """(draft path, the quantization the engine resolves for it) the spec asks."""
    if spec.draft is None or spec.speculative.mode == "ngram":
        return None, None
    fmt = spec.draft.quantization.format
    if fmt == "none":
        return str(spec.draft.model), None
    if spec.build.flow == "pytorch":
        return str(spec.output_dir / "checkpoints" / "draft-hf"), "modelopt"
    return str(spec.draft.model), fmt


def _k_by_load(spec: PipelineSpec) -> list[int] | None:
    """K at each batch size 1..max_batch_size as the spec means it: specbuild's one load rule (runtime.schedule, the
    served models' and the BLS's, held to TensorRT-LLM's drafter there); None without draft_len_schedule and
    max_concurrency, where the engine must run one K at any load."""
    from specbuild.runtime.schedule import DraftSchedule

    speculative = spec.speculative
    if speculative.draft_len_schedule is None and speculative.max_concurrency is None:
        return None
    rule = DraftSchedule(dict(speculative.draft_len_schedule or {}), speculative.num_draft_tokens,
                         speculative.max_concurrency)
    return [rule.draft_len(batch) for batch in range(1, spec.build.max_batch_size + 1)]


def vllm_accepts(judged: Judged, name: str) -> None:
    """vLLM accepted the export, and its engine config is the spec's: limits, method, K, draft, quantization."""
    spec = judged.specs[name]
    case = judged.results["vllm"]["cases"][name]
    assert case["accepted"], f"vLLM refused the export of {name}: {case['error']}"
    got = case["resolved"]
    assert (got["model"], got["served_model_name"], got["tensor_parallel_size"], got["pipeline_parallel_size"],
            got["max_model_len"], got["max_num_seqs"], got["dtype"]) == (
        str(spec.target.model), spec.name, spec.build.tp_size, spec.build.pp_size, spec.build.max_seq_len,
        spec.build.max_batch_size, spec.build.dtype)
    speculative = got["speculative"]
    mode = spec.speculative.mode
    # each response's acceptance (metrics.speculative_decoding), wherever there is speculation to report
    assert got["per_request_spec_decode_metrics"] == ("none" if mode == "none" else "summary")
    if mode == "none":
        assert speculative is None
        return
    k = spec.speculative.num_draft_tokens
    method = {"draft_target": "draft_model", "eagle3": "eagle3", "ngram": "ngram"}[mode]
    assert (speculative["method"], speculative["num_speculative_tokens"]) == (method, k)
    assert speculative["k_by_batch_size"] == _k_by_load(spec)
    if mode == "ngram":
        assert (speculative["prompt_lookup_min"], speculative["prompt_lookup_max"]) == (
            1, spec.speculative.ngram.max_matching_ngram_size)
        return
    draft, quantization = _expected_draft(spec)
    assert (speculative["model"], speculative["quantization"]) == (draft, quantization)
    assert speculative["quant_config"] == QUANT_CONFIG.get(("vllm", quantization or ""))
    assert speculative["draft_tensor_parallel_size"] == spec.build.tp_size  # vLLM's default: the target's
    assert speculative["draft_max_model_len"] == spec.build.max_seq_len


def _sglang_expected(spec: PipelineSpec) -> dict[str, Any]:
    build = spec.build
    expected: dict[str, Any] = {
        "model_path": str(spec.target.model), "served_model_name": spec.name, "tp_size": build.tp_size,
        "pp_size": build.pp_size, "context_length": build.max_seq_len, "max_running_requests": build.max_batch_size,
        "dtype": build.dtype}
    mode, k = spec.speculative.mode, spec.speculative.num_draft_tokens
    if mode == "none":
        return {**expected, "speculative_algorithm": None}
    if mode == "ngram":
        n = spec.speculative.ngram.max_matching_ngram_size
        return {**expected, "speculative_algorithm": "NGRAM", "steps_by_batch_size": None,
                "speculative_num_draft_tokens": k + 1,
                "speculative_eagle_topk": 1, "speculative_ngram_max_bfs_breadth": 1,
                "speculative_ngram_max_trie_depth": n + k}
    draft, quantization = _expected_draft(spec)
    return {**expected, "speculative_algorithm": {"draft_target": "STANDALONE", "eagle3": "EAGLE3"}[mode],
            "speculative_draft_model_path": draft, "speculative_num_steps": k, "speculative_eagle_topk": 1,
            "speculative_num_draft_tokens": k + 1, "speculative_draft_model_quantization": quantization,
            "draft_quant_config": QUANT_CONFIG.get(("sglang", quantization or "")),
            # the draft's KV pool alone (the target's stays auto); the spec's fp8 is E4M3
            "kv_cache_dtype": "auto", "speculative_draft_kv_cache_dtype": _SGLANG_DRAFT_KV.get(
                spec.draft.quantization.kv_cache),
            # SGLang's adaptive tiers run the spec's K at each batch size; EAGLE3 only (SGLang turns them off for
            # STANDALONE), where the spec has a load setting
            "steps_by_batch_size": _k_by_load(spec) if mode == "eagle3" else None}


_SGLANG_DRAFT_KV = {"fp8": "fp8_e4m3"}
"""draft.quantization.kv_cache -> the dtype SGLang's draft pool must resolve to (fp8: E4M3, as TensorRT-LLM's)."""


def sglang_accepts(judged: Judged, name: str) -> None:
    """SGLang accepted the export and resolved the spec's settings; read back from the export's config.yaml
    (`launch_server --config`) too, to the same resolution."""
    spec = judged.specs[name]
    cases = judged.results["sglang"]["cases"]
    for case in (cases[name], cases[f"config:{name}"]):
        assert case["accepted"], f"SGLang refused {case['name']}: {case['error']}"
        got = case["resolved"]
        expected = _sglang_expected(spec)
        assert {key: got[key] for key in expected} == expected, case["name"]
    assert cases[f"config:{name}"]["resolved"] == cases[name]["resolved"]


# -- refused by specbuild, and by the engine -------------------------------------------------------------------------
def engine_refuses(judged: Judged, engine: str, name: str) -> None:
    """specbuild refused the export; the engine refuses the launch line it would have needed, in its own words."""
    found = judged.probes[engine, name]
    if found is None:  # a self-draft: there is no Hugging Face draft to hand the engine
        assert "draft.source target_layers" in str(judged.refused[engine, name])
        return
    case = judged.results[engine]["cases"][f"probe:{name}"]
    assert not case["accepted"], f"{engine} accepts {found.argv}, which specbuild refuses: " + str(
        judged.refused[engine, name])
    assert found.names.lower() in case["error"].lower(), case["error"]


ACCEPTS = {"vllm": vllm_accepts, "sglang": sglang_accepts}


@pytest.mark.parametrize("engine", sorted(VENVS))
@pytest.mark.parametrize("name", ALL_SPECS)
def test_the_engine_judges_each_export_as_specbuild_does(judged: Judged, engine: str, name: str) -> None:
    """An export specbuild writes, the engine accepts as the spec means it; one it refuses, the engine refuses."""
    if (engine, name) in judged.exports:
        ACCEPTS[engine](judged, name)
    else:
        engine_refuses(judged, engine, name)


@pytest.mark.parametrize("engine", sorted(VENVS))
def test_the_eagle3_family_table_is_the_engines_own(judged: Judged, engine: str) -> None:
    """specbuild refuses EAGLE-3 (validate, export) exactly on the target families whose model class in the engine
    gives a draft no hidden states (vLLM: SupportsEagle3; SGLang: set_eagle3_layers_to_capture), read by the
    checker from the engine's own registry; every family has a class there."""
    found = judged.results[engine]["facts"]["eagle3_targets"]
    assert set(found) == set(ARCHITECTURES) and None not in found.values(), found
    refused = {arch for arch in ARCHITECTURES if (arch, "eagle3", engine) in REFUSALS}
    assert refused == {arch for arch, takes in found.items() if not takes}


def test_sglang_rejects_the_ngram_flags_of_before_0_5_23(judged: Judged) -> None:
    """The control: the tier sees a flag SGLang lacks (main wrote these before issue 23)."""
    case = judged.results["sglang"]["cases"]["old-ngram-flags"]
    assert not case["accepted"] and case["error"].startswith("argparse exit 2")
    assert "--speculative-ngram-min-match-window-size" in case["error"]


# -- specbuild's names, against the engines' own lists ---------------------------------------------------------------
def test_specbuilds_names_are_vllms(judged: Judged) -> None:
    """What specbuild/export names of vLLM's (its ModelOpt algorithms, cache dtypes, the methods a refusal lists)
    against vLLM's own code, read by the checker."""
    from specbuild.export import vllm
    from specbuild.export.draft import ENGINE_QUANTIZATION

    facts = judged.results["vllm"]["facts"]
    assert facts["version"] == "0.33.0"
    assert set(ENGINE_QUANTIZATION["vllm"].modelopt_algos) == set(facts["modelopt_quant_algos"])
    assert {ENGINE_QUANTIZATION["vllm"].modelopt_name, *ENGINE_QUANTIZATION["vllm"].load_time.values()} <= set(
        facts["quantization_methods"])
    assert set(vllm.CACHE_DTYPES) <= set(facts["cache_dtypes"])
    assert set(vllm.VLLM_METHODS) - {"the MTP model types"} <= set(facts["speculative_methods"])
    assert "medusa" not in facts["speculative_methods"] and "lookahead" not in facts["speculative_methods"]


def test_specbuilds_names_are_sglangs(judged: Judged) -> None:
    from specbuild.export import sglang
    from specbuild.export.draft import ENGINE_QUANTIZATION

    facts = judged.results["sglang"]["facts"]
    assert facts["version"] == "0.5.23"
    # NEXTN is a launch name, not a SpeculativeAlgorithm member: SGLang's argument hook turns it into EAGLE
    # (sglang 0.5.23 srt/arg_groups/speculative_hook.py); tests/test_engines_mtp.py has its parser judge it.
    assert set(sglang.ALGORITHM.values()) - {"NEXTN"} <= set(facts["speculative_algorithms"])
    assert "EAGLE" in facts["speculative_algorithms"]
    assert not {"MEDUSA", "LOOKAHEAD"} & set(facts["speculative_algorithms"])
    assert {ENGINE_QUANTIZATION["sglang"].modelopt_name, *ENGINE_QUANTIZATION["sglang"].load_time.values()} <= set(
        facts["quantization_choices"])
