"""Server lifecycle: a real tritonserver (the nvidia-pytriton bundle, or the one on PATH) on small repositories.

What users rely on: `start()` returns only when every model answers; a broken model is named with Triton's
reason and nothing is left running; ports are honoured or picked; `stop()` leaves no server or python stub.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.request
from pathlib import Path

import pytest
import tritonclient.http as httpclient

from specbuild.deploy.server import TritonServer
from specbuild.deploy.server_launch import Ports, mpi_command, tensorrt_models
from specbuild.deploy.triton_env import bundled_tritonserver
from specbuild.errors import SpecbuildError
from tests.serve_fixtures import (
    bad_config_repository,
    broken_repository,
    processes_using,
    slow_repository,
    tinyllm_repository,
)


@pytest.mark.tritonserver
def test_server_serves_every_model_and_stops_without_leftovers(tmp_path: Path) -> None:
    repo = tinyllm_repository(tmp_path / "repo")
    log = tmp_path / "logs" / "server.log"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    with TritonServer(repo, http_port=free, log_file=log) as server:
        assert server.pid is not None
        assert server.http_url == f"127.0.0.1:{free}", "a given port is used as given"
        client = httpclient.InferenceServerClient(server.http_url)
        assert client.is_model_ready("tinyllm")
        assert client.get_model_config("tinyllm")["max_batch_size"] == 8
        states = {m["name"]: m["state"] for m in server.models()}
        assert states == {"tinyllm": "READY", "ensemble": "READY"}
        assert len({server.http_url, server.grpc_url, server.metrics_url}) == 3
        body = json.dumps({"text_input": "hello world", "max_tokens": 3}).encode()
        request = urllib.request.Request(f"http://{server.http_url}/v2/models/ensemble/generate", data=body)
        with urllib.request.urlopen(request, timeout=30) as response:
            assert json.loads(response.read())["text_output"] == "hello0 hello1 hello2"
        with urllib.request.urlopen(f"http://{server.metrics_url}/metrics", timeout=10) as response:
            assert b"nv_inference_request_success" in response.read()
        family = processes_using(repo)
        assert len(family) >= 3, "the server and one python stub per tinyllm instance"
    assert server.pid is None
    assert processes_using(repo) == []
    assert "successfully loaded 'tinyllm'" in log.read_text()
    server.stop()  # idempotent


@pytest.mark.tritonserver
def test_broken_model_is_named_with_its_error_and_nothing_survives(tmp_path: Path) -> None:
    repo = broken_repository(tmp_path / "repo")
    with pytest.raises(SpecbuildError) as caught:
        TritonServer(repo, log_file=tmp_path / "server.log").start()
    message = str(caught.value)
    assert message.startswith("model 'broken' failed to load"), "the root cause comes first"
    assert "tokenizer_dir /no/such/tokenizer does not exist" in message
    assert "model 'ensemble' failed to load: ensemble step 'broken' has no loaded version" in message
    assert "tinyllm" not in message.split("hint:")[0], "only the failing models are reported"
    assert processes_using(repo) == []


@pytest.mark.tritonserver
def test_unparsable_config_is_named_with_the_parse_error(tmp_path: Path) -> None:
    repo = bad_config_repository(tmp_path / "repo")
    with pytest.raises(SpecbuildError) as caught, TritonServer(repo, log_file=tmp_path / "server.log"):
        pass
    message = str(caught.value)
    assert "model 'badcfg' failed to load" in message
    assert "Expected integer, got: eight" in message
    assert processes_using(repo) == []


@pytest.mark.tritonserver
def test_a_taken_port_is_a_clear_error(tmp_path: Path) -> None:
    repo = tinyllm_repository(tmp_path / "repo", ensemble=False)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(SpecbuildError, match="could not open its ports"):
            TritonServer(repo, http_port=port, log_file=tmp_path / "a.log").start()
        assert processes_using(repo) == []


def test_missing_repository_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(SpecbuildError, match="no such model repository"):
        TritonServer(tmp_path / "nowhere").start()


def _trtllm_repo(tmp_path: Path, tp: int, pp: int, *, engine_json: bool) -> Path:
    repo = tmp_path / "repo"
    for name, role in (("tensorrt_llm", "target"), ("tensorrt_llm_draft", "draft")):
        engine = tmp_path / "engines" / role
        engine.mkdir(parents=True)
        if engine_json:
            info = {"role": role, "backend": "tensorrt", "architecture": "LlamaForCausalLM", "dtype": "float16",
                    "vocab_size": 32000, "tp_size": tp, "pp_size": pp, "max_batch_size": 8, "max_input_len": 512,
                    "max_seq_len": 1024, "max_num_tokens": 4096}
            (engine / "engine.json").write_text(json.dumps(info))
        else:
            mapping = {"world_size": tp * pp, "tp_size": tp, "pp_size": pp}
            (engine / "config.json").write_text(json.dumps({"pretrained_config": {"mapping": mapping}}))
        (repo / name).mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(
            f'name: "{name}"\nbackend: "tensorrtllm"\nmax_batch_size: 8\n'
            f'parameters: {{\n  key: "gpt_model_path"\n  value: {{\n    string_value: "{engine}"\n  }}\n}}\n'
        )
    (repo / "preprocessing").mkdir()
    (repo / "preprocessing" / "config.pbtxt").write_text('name: "preprocessing"\nbackend: "python"\n')
    return repo


@pytest.mark.parametrize("engine_json", [True, False], ids=["engine.json", "trtllm-config.json"])
def test_sharded_tensorrt_engines_get_one_mpi_rank_per_gpu(tmp_path: Path, engine_json: bool) -> None:
    repo = _trtllm_repo(tmp_path, tp=2, pp=2, engine_json=engine_json)
    trt = tensorrt_models(repo)
    assert trt.names == ("tensorrt_llm", "tensorrt_llm_draft")
    assert trt.world_size == 4
    cmd = mpi_command(Path("/opt/tritonserver/bin/tritonserver"), repo, Ports(8000, 8001, 8002),
                      world_size=trt.world_size, tensorrt_model_names=trt.names)
    assert cmd[:2] == ["mpirun", "--allow-run-as-root"]
    ranks = " ".join(cmd[2:]).split(" : ")
    assert len(ranks) == 4
    for i, rank in enumerate(ranks):
        args = rank.split()
        assert args[:3] == ["-n", "1", "/opt/tritonserver/bin/tritonserver"]
        assert f"--model-repository={repo}" in args
        assert f"--backend-config=python,shm-region-prefix-name=prefix{i}_" in args
        assert {"--http-port=8000", "--grpc-port=8001", "--metrics-port=8002"} <= set(args)
        loads_only_engines = "--model-control-mode=explicit" in args
        assert loads_only_engines == (i > 0)
        if i > 0:
            assert [a for a in args if a.startswith("--load-model=")] == [
                "--load-model=tensorrt_llm", "--load-model=tensorrt_llm_draft"]


def test_single_gpu_engines_need_no_mpi(tmp_path: Path) -> None:
    assert tensorrt_models(_trtllm_repo(tmp_path, tp=1, pp=1, engine_json=True)).world_size == 1
    assert tensorrt_models(tinyllm_repository(tmp_path / "py")).names == ()


def _specbuild(*args: str) -> list[str]:
    return [sys.executable, "-m", "specbuild.cli", *args]


def _as_a_background_job() -> None:
    """Start the child with SIGINT ignored, as a non-interactive shell starts background jobs (CI runners,
    `nohup`): Python then keeps ignoring it unless the program installs its own handler."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.tritonserver
def test_serve_cli_exits_non_zero_naming_the_failing_model(tmp_path: Path) -> None:
    repo = broken_repository(tmp_path / "repo")
    done = subprocess.run(_specbuild("serve", str(repo), "--log-file", str(tmp_path / "s.log")),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "model 'broken' failed to load" in done.stderr
    assert "tokenizer_dir /no/such/tokenizer does not exist" in done.stderr
    assert "Traceback" not in done.stderr
    assert processes_using(repo) == []


@pytest.mark.tritonserver
@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_serve_cli_serves_until_interrupted_then_leaves_nothing(tmp_path: Path, stop_signal: int) -> None:
    repo = tinyllm_repository(tmp_path / "repo", ensemble=False)
    proc = subprocess.Popen(_specbuild("serve", str(repo), "--log-file", str(tmp_path / "s.log")),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_as_a_background_job)
    try:
        lines = []
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if "metrics" in line:
                break
        assert lines and lines[0].startswith("ready: tinyllm"), "".join(lines) + (proc.stderr.read() if
                                                                                  proc.stderr else "")
        http = next(line.split()[-1] for line in lines if line.strip().startswith("HTTP"))
        with urllib.request.urlopen(f"{http}/v2/health/ready", timeout=10) as response:
            assert response.status == 200
        assert processes_using(repo) != []
        proc.send_signal(stop_signal)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert processes_using(repo) == []


@pytest.mark.tritonserver
def test_serve_cli_prompts_over_grpc_and_http_then_stops(tmp_path: Path) -> None:
    repo = tinyllm_repository(tmp_path / "repo", ensemble=False)
    done = subprocess.run(_specbuild("serve", str(repo), "--prompt", "hello world", "--prompt", "bye",
                                     "--max-tokens", "4", "--num-draft-tokens", "2"),
                          capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0, done.stderr
    assert "asking tinyllm" in done.stdout
    assert "gRPC stream (2 responses): hello0 hello1 hello2 hello3" in done.stdout
    assert "HTTP generate: bye0 bye1 bye2 bye3" in done.stdout
    assert "acceptance_rate 0.500, total_accepted_draft_tokens 2, total_draft_tokens 4" in done.stdout
    assert processes_using(repo) == []


def test_bundled_server_is_set_up_once_with_the_stub_for_this_python(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECBUILD_CACHE", str(tmp_path / "cache"))
    first = bundled_tritonserver()
    stub = first.backend_directory / "python" / "triton_python_backend_stub" if first.backend_directory else None
    assert stub is not None and stub.is_file() and os.access(stub, os.X_OK)
    assert f"py{sys.version_info.major}.{sys.version_info.minor}" in str(first.binary)
    assert first.binary.is_relative_to(tmp_path / "cache") and os.access(first.binary, os.X_OK)
    stamp = stub.stat().st_mtime_ns
    again = bundled_tritonserver()
    assert again.binary == first.binary and stub.stat().st_mtime_ns == stamp, "prepared once, then reused"
    libdir = sysconfig.get_config_var("LIBDIR")
    assert libdir in again.env["LD_LIBRARY_PATH"].split(os.pathsep)
    assert any(p.endswith("nvidia_pytriton.libs") for p in again.env["LD_LIBRARY_PATH"].split(os.pathsep))
    assert again.env["PATH"].split(os.pathsep)[0] == str(Path(sys.executable).parent), "stubs import our packages"
    assert again.env["OMP_NUM_THREADS"] == "1", "one thread per python model process, not one per core"


@pytest.mark.tritonserver
def test_ctrl_c_while_models_load_stops_the_server_and_its_stubs(tmp_path: Path) -> None:
    repo = slow_repository(tmp_path / "repo")
    proc = subprocess.Popen(_specbuild("serve", str(repo), "--log-file", str(tmp_path / "s.log")),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_as_a_background_job)
    try:
        deadline = time.monotonic() + 60
        while not any("triton_python_backend_stub" in " ".join(p.cmdline()) for p in processes_using(repo)):
            assert time.monotonic() < deadline and proc.poll() is None, "the model never started loading"
            time.sleep(0.2)
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
        # The model takes 120 s to load; 90 s leaves a loaded machine room and still fails a stop that waits.
        assert time.monotonic() - started < 90, "stopping must not wait for the load to finish"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert processes_using(repo) == []
