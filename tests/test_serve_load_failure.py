"""`specbuild serve` never waits out its ready-timeout once tritonserver has reported that a model cannot load.

Whatever form the report takes (a python error in `initialize`, a model.py that does not import, a config.pbtxt
with a field Triton does not know, a backend that does not exist, a missing model.py or version directory, an
ensemble whose step is missing or failed), the wait ends with one message naming the model and the server's
reason, and nothing is left running. Every broken repository here also holds a model whose `initialize` never
returns: tritonserver answers its repository index only once every load has ended, so the server log's report is
all there is to go by (before, such a repository waited out the whole ready-timeout). The ready-timeout is 600 s
and every case must end in a tenth of it. Broken models that the existing tests already cover without a stuck
neighbour (tests/test_serve.py, tests/test_faults_serve.py) are not repeated on their own.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from specbuild.errors import SpecbuildError
from specbuild.serve.server import TritonServer, _log_failures
from tests.serve_fixtures import (
    BROKEN_MODEL,
    ENSEMBLE_CONFIG,
    TINYLLM_CONFIG,
    TINYLLM_MODEL,
    processes_using,
    serve_regions,
    tinyllm_repository,
)

READY_TIMEOUT_S = 600.0
PROMPTLY_S = READY_TIMEOUT_S / 10
OTHERS_S = 10.0
"""How long these servers wait, past a failure, for the models still loading (`failure_others_s`; serve's default is
FAILURE_OTHERS_S): the stuck model never ends its load, so every test here waits this long, and the wait itself is
what is tested, not its length."""

STUCK_MODEL = '''
import time


class TritonPythonModel:
    def initialize(self, args):
        time.sleep(3600)  # a load that never ends: tritonserver's endpoints stay down meanwhile

    def execute(self, requests):
        return []
'''


def _config(name: str) -> str:
    return TINYLLM_CONFIG.replace('"tinyllm"', f'"{name}"').replace("STEP_DELAY", "0")


def _model(repo: Path, name: str, config: str | None, code: str | None, *, version: bool = True) -> None:
    (repo / name).mkdir(parents=True)
    if version:
        (repo / name / "1").mkdir()
    if config is not None:
        (repo / name / "config.pbtxt").write_text(config.lstrip())
    if code is not None:
        (repo / name / "1" / "model.py").write_text(code.lstrip())


def _with_stuck_model(repo: Path) -> Path:
    """tinyllm, which loads, and `stuck`, which never finishes loading."""
    tinyllm_repository(repo, ensemble=False)
    _model(repo, "stuck", _config("stuck"), STUCK_MODEL)
    return repo


def _initialize_raises(repo: Path) -> None:
    _model(repo, "broken", _config("broken"), BROKEN_MODEL)
    _model(repo, "ensemble", ENSEMBLE_CONFIG.replace('model_name: "tinyllm"', 'model_name: "broken"'), None)


def _import_fails(repo: Path) -> None:
    _model(repo, "noimport", _config("noimport"), "import no_such_module_xyz\n" + TINYLLM_MODEL)


def _unknown_config_field(repo: Path) -> None:
    _model(repo, "badfield", _config("badfield").replace("max_batch_size: 8", "max_batch_sizes: 8"), TINYLLM_MODEL)


def _unknown_backend(repo: Path) -> None:
    _model(repo, "nobackend", _config("nobackend").replace('backend: "python"', 'backend: "nosuchbackend"'),
           TINYLLM_MODEL)


def _missing_model_file(repo: Path) -> None:
    _model(repo, "nofile", _config("nofile"), None)


def _missing_version(repo: Path) -> None:
    _model(repo, "noversion", _config("noversion"), None, version=False)


def _ensemble_step_missing(repo: Path) -> None:
    _model(repo, "ensemble", ENSEMBLE_CONFIG.replace('model_name: "tinyllm"', 'model_name: "nosuchmodel"'), None)


CASES: dict[str, tuple[Callable[[Path], None], str, tuple[str, ...]]] = {
    # case: (break the repository, the model named first, what the message must quote of the server's reason)
    "initialize-raises": (_initialize_raises, "broken", ("RuntimeError: tokenizer_dir /no/such/tokenizer does not "
                                                         "exist", "model.py(3): initialize")),
    "import-fails": (_import_fails, "noimport", ("ModuleNotFoundError: No module named 'no_such_module_xyz'",)),
    "unknown-config-field": (_unknown_config_field, "badfield",
                             ('Message type "inference.ModelConfig" has no field named "max_batch_sizes"',)),
    "unknown-backend": (_unknown_backend, "nobackend", ("unable to find backend library for backend "
                                                        "'nosuchbackend'",)),
    "missing-model-file": (_missing_model_file, "nofile", ("Python model file not found in",
                                                           "/nofile/1/model.py")),
    "missing-version": (_missing_version, "noversion", ("at least one version must be available",)),
    "ensemble-step-missing": (_ensemble_step_missing, "ensemble", ("nosuchmodel",)),
}


def _start(repo: Path, log: Path) -> tuple[SpecbuildError, float]:
    started = time.monotonic()
    with pytest.raises(SpecbuildError) as caught:
        TritonServer(repo, log_file=log, ready_timeout_s=READY_TIMEOUT_S, failure_others_s=OTHERS_S).start()
    return caught.value, time.monotonic() - started


def _first_failure(message: str) -> str:
    return message.splitlines()[0]


@pytest.mark.tritonserver
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_load_failure_ends_the_wait_while_another_model_is_still_loading(tmp_path: Path, case: str) -> None:
    breaks, model, reasons = CASES[case]
    repo = _with_stuck_model(tmp_path / "repo")
    breaks(repo)
    error, elapsed = _start(repo, tmp_path / "server.log")
    message = error.message
    assert elapsed < PROMPTLY_S, f"waited {elapsed:.0f}s for a failure the server had reported: {message}"
    assert _first_failure(message).startswith(f"model '{model}' failed to load: "), message
    for reason in reasons:
        assert reason in message, f"the server's reason {reason!r} is not quoted: {message}"
    assert "not ready after" not in message and "stuck" not in message, "the model still loading is no failure"
    assert "tinyllm" not in message, "only the failing models are named"
    assert processes_using(repo) == [], "the stuck model's stub is stopped too"


@pytest.mark.tritonserver
def test_a_model_without_a_version_ends_the_wait_though_every_listed_model_is_ready(tmp_path: Path) -> None:
    """No stuck model: the index answers, every model it lists READY; the model that could not load is not listed
    at all, only the log says it failed (and the server never reports ready). Before, that waited out the
    ready-timeout."""
    repo = tinyllm_repository(tmp_path / "repo", ensemble=False)
    _missing_version(repo)
    error, elapsed = _start(repo, tmp_path / "server.log")
    assert elapsed < PROMPTLY_S
    assert error.message.startswith("model 'noversion' failed to load: at least one version must be available "
                                    "under the version policy of model 'noversion'"), error.message
    assert processes_using(repo) == []


@pytest.mark.tritonserver
def test_serve_exits_non_zero_at_once_naming_the_model_and_the_reason(tmp_path: Path) -> None:
    """The command line: exit 1 long before --ready-timeout, one message, no traceback, nothing left behind."""
    repo = _with_stuck_model(tmp_path / "repo")
    _initialize_raises(repo)
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "specbuild.cli", "serve", str(repo), "--log-file",
                             str(tmp_path / "s.log"), "--ready-timeout", str(int(READY_TIMEOUT_S))],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "COLUMNS": "250"})
    _, raw = proc.communicate(timeout=300)
    elapsed = time.monotonic() - started
    stderr = " ".join(raw.split())
    assert proc.returncode == 1, raw
    assert elapsed < PROMPTLY_S, f"exited after {elapsed:.0f}s"
    assert "model 'broken' failed to load: Internal: RuntimeError: tokenizer_dir /no/such/tokenizer does not " \
           "exist" in stderr, stderr
    assert "Traceback (most recent call last)" not in raw
    assert processes_using(repo) == []
    assert serve_regions(proc.pid) == []


# -- a deployed repository -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def plain_repository(demo_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo target deployed without speculation (the reference backend), once for this module."""
    from specbuild.deploy.repository import deploy_repository
    from tests.deploy_fixtures import convert_and_build, pipeline_data, write_spec

    root = tmp_path_factory.mktemp("plain")
    spec = write_spec(root / "specs", pipeline_data("load-failure", demo_models, "none", root / "build"))
    convert_and_build(spec)
    deploy_repository(spec)
    assert spec.deploy.model_repository is not None
    return spec.deploy.model_repository


@pytest.mark.tritonserver
def test_a_deployed_repository_whose_engine_lost_its_weights_names_tensorrt_llm(plain_repository: Path,
                                                                                  tmp_path: Path) -> None:
    """A copy of a deployed repository whose tensorrt_llm engine has no weights file: tensorrt_llm is named with
    its reason while the tokenizer models and the BLS still load (the ensemble over it fails only after it)."""
    repo = tmp_path / "repo"
    shutil.copytree(plain_repository, repo, symlinks=True)
    config = repo / "tensorrt_llm" / "config.pbtxt"
    text = config.read_text()
    engine = Path(re.search(r'key: "gpt_model_path" value: \{ string_value: "([^"]+)"', text).group(1))
    broken = tmp_path / "engine"
    shutil.copytree(engine, broken)
    weights = sorted(broken.rglob("*.safetensors"))
    assert weights, f"no weights in {broken}"
    for path in weights:
        path.unlink()
    config.write_text(text.replace(f'string_value: "{engine}"', f'string_value: "{broken}"'))
    error, elapsed = _start(repo, tmp_path / "server.log")
    assert elapsed < READY_TIMEOUT_S / 5, "(five stubs importing torch on two busy cores take up to a minute)"
    first = _first_failure(error.message)
    assert first.startswith("model 'tensorrt_llm' failed to load: "), error.message
    assert f"{broken}/checkpoint/rank0.safetensors: rank file is missing" in error.message, error.message
    assert not any(f"model '{name}'" in error.message for name in ("preprocessing", "postprocessing",
                                                                   "tensorrt_llm_bls")), error.message
    assert processes_using(repo) == []


def test_every_form_of_load_failure_in_the_log_is_read() -> None:
    """The forms tritonserver 2.51 writes (from the runs above), an unquoted message with its traceback on the
    lines after it (older servers), and the ISO8601 log format, each read as (model, reason)."""
    log = "\n".join([
        'E1201 21:59:29.627883 7553 model_repository_manager.cc:1460] "Poll failed for model directory \'cfg\': '
        'failed to read text proto from /r/cfg/config.pbtxt"',
        'E1201 21:59:29.628849 7553 model_repository_manager.cc:703] "Invalid argument: ensemble ens contains '
        'models that are not available or ambiguous: nosuchmodel"',
        'E1201 21:59:29.630371 7553 model_repository_manager.cc:724] "failed to load model \'nover\': at least one '
        'version must be available under the version policy of model \'nover\'"',
        'I1201 21:57:05.816530 6350 pb_stub.cc:2105]  Failed to preinitialize Python stub: Python model file not '
        "found in '/r/nofile/1/model.py'",
        "E0101 00:00:00.000000 1 model_lifecycle.cc:626] failed to load 'old' version 1: Internal: ValueError: bad",
        "",
        "At:",
        "  /r/old/1/model.py(9): initialize",
        'I0101 00:00:00.000001 1 model_lifecycle.cc:777] "failed to load \'old\'"',
        '2024-12-01T21:59:31Z E 7553 model_lifecycle.cc:642] "failed to load \'iso\' version 1: Internal: '
        'RuntimeError: no tokenizer\\n\\nAt:\\n  /r/iso/1/model.py(3): initialize\\n"',
        'E1201 21:59:31.686614 7553 model_repository_manager.cc:703] "Invalid argument: ensemble \'ensemble\' '
        'depends on \'iso\' which has no loaded version. Model \'iso\' loading failed with error: ..."',
    ])
    assert dict(_log_failures(log)) == {
        "cfg": "failed to read text proto from /r/cfg/config.pbtxt",
        "ens": "ensemble steps missing: nosuchmodel (no such model in the repository)",
        "nover": "at least one version must be available under the version policy of model 'nover'",
        "nofile": "its python stub could not start: Python model file not found in '/r/nofile/1/model.py'",
        "old": "Internal: ValueError: bad\n\nAt:\n  /r/old/1/model.py(9): initialize",
        "iso": "Internal: RuntimeError: no tokenizer\n\nAt:\n  /r/iso/1/model.py(3): initialize\n",
        "ensemble": "ensemble step 'iso' has no loaded version (it failed to load)",
    }
