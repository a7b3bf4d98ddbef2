"""Server lifecycle: a real tritonserver (the nvidia-pytriton bundle, or the one on PATH) on small repositories.

What users rely on: `start()` returns only when every model answers; a broken model is named with Triton's
reason and nothing is left running; ports are honoured or picked; `stop()` leaves no server, python stub or shared
memory. What happens when things die under the server is in test_faults_serve.py.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import sysconfig
import urllib.request
from pathlib import Path

import psutil
import pytest
import tritonclient.http as httpclient

from specbuild.errors import SpecbuildError
from specbuild.serve import watch as server_watch
from specbuild.serve.launch import (
    Ports,
    check_serving_paths,
    is_plain,
    mpi_command,
    tensorrt_models,
)
from specbuild.serve.server import TritonServer
from specbuild.serve.triton_env import bundled_tritonserver
from tests.serve_fixtures import (
    bad_config_repository,
    broken_repository,
    processes_using,
    serve_regions,
    shm_regions,
    still_running,
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
        assert len(shm_regions(server.shm_prefix)) == 2, "one shared-memory region per python stub"
        assert sorted(server.stub_pids.values()) == ["tinyllm_0_0", "tinyllm_0_1"]
        server.check()  # healthy: no error
    assert server.pid is None
    assert processes_using(repo) == []
    assert shm_regions(server.shm_prefix) == []
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
    server_prefix = "specbuild_4242_0123abcd_"  # as TritonServer makes it
    cmd = mpi_command(Path("/opt/tritonserver/bin/tritonserver"), repo, Ports(8000, 8001, 8002),
                      world_size=trt.world_size, tensorrt_model_names=trt.names, shm_prefix=server_prefix)
    assert cmd[:2] == ["mpirun", "--allow-run-as-root"]
    ranks = " ".join(cmd[2:]).split(" : ")
    assert len(ranks) == 4
    prefixes = []
    for i, rank in enumerate(ranks):
        args = rank.split()
        assert args[:3] == ["-n", "1", "/opt/tritonserver/bin/tritonserver"]
        assert f"--model-repository={repo}" in args
        [config] = [a for a in args if a.startswith("--backend-config=python,shm-region-prefix-name=")]
        prefixes.append(config.split("=", 2)[2])
        # The server's cleanup (its own prefix) and the stale-region sweep (SHM_REGION, the pid) find every rank's.
        region = f"{prefixes[-1]}0a1b2c3d-region"
        assert region.startswith(server_prefix)
        match = server_watch.SHM_REGION.match(region)
        assert match is not None and match.group(1) == "4242"
        assert {"--http-port=8000", "--grpc-port=8001", "--metrics-port=8002"} <= set(args)
        loads_only_engines = "--model-control-mode=explicit" in args
        assert loads_only_engines == (i > 0)
        if i > 0:
            assert [a for a in args if a.startswith("--load-model=")] == [
                "--load-model=tensorrt_llm", "--load-model=tensorrt_llm_draft"]
    assert len(set(prefixes)) == 4, "the ranks share /dev/shm, so each needs its own prefix"


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
        family = processes_using(repo)
        assert family != [] and serve_regions(proc.pid) != []
        proc.send_signal(stop_signal)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert still_running(family, timeout=30) == []
    assert processes_using(repo) == []
    assert serve_regions(proc.pid) == []


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


# -- paths, parent death, leftovers (no server needed) ---------------------------------------------------------


def test_paths_the_stub_launcher_cannot_take_are_linked_or_refused(tmp_path: Path) -> None:
    assert is_plain("/tmp/pytest-of-root/repo_1.x/model-2") and not is_plain("/tmp/a b") and not is_plain("/tmp/$x")
    assert check_serving_paths(tinyllm_repository(tmp_path / "plain")) is False
    assert check_serving_paths(tinyllm_repository(tmp_path / "with space" / "repo")) is True, "served via a link"
    with pytest.raises(SpecbuildError, match=r"non-ASCII characters \('ö'\).*decodes file names as ASCII"):
        check_serving_paths(tinyllm_repository(tmp_path / "mödels"))
    spaced = tinyllm_repository(tmp_path / "spaced")
    (spaced / "tinyllm").rename(spaced / "tiny llm")
    with pytest.raises(SpecbuildError, match="model directory name 'tiny llm'"):
        check_serving_paths(spaced)


def test_a_child_started_with_die_with_this_thread_dies_with_its_parent(tmp_path: Path) -> None:
    """The parent is SIGKILLed (no atexit, no finally): the child still goes, as tritonserver does with `serve`."""
    script = (
        "import subprocess, sys, time\n"
        "from specbuild.serve.launch import die_with_this_thread\n"
        "child = subprocess.Popen(['sleep', '300'], start_new_session=True, preexec_fn=die_with_this_thread())\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(300)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        child = psutil.Process(int(parent.stdout.readline()))
        assert still_running([child]) == [child]
        parent.kill()
        parent.wait()
        assert still_running([child], timeout=30) == [], "the child outlived its SIGKILLed parent"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    pid = proc.pid
    assert not psutil.pid_exists(pid)
    return pid


def test_stale_shared_memory_goes_only_when_its_owner_is_gone_and_nothing_maps_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server_watch, "SHM_DIR", tmp_path)
    dead = _dead_pid()
    names = {
        "stale": f"specbuild_{dead}_0123abcd_stale",
        "mapped": f"specbuild_{dead}_0123abcd_mapped",
        "open": f"specbuild_{dead}_0123abcd_open",
        "live": f"specbuild_{os.getpid()}_0123abcd_live",
        "other": "specbuild_notours",
    }
    for name in names.values():
        (tmp_path / name).write_bytes(b"\0" * 4096)
    holder = subprocess.Popen([sys.executable, "-c", (
        "import mmap, sys, time\n"
        f"g = open({str(tmp_path / names['mapped'])!r}, 'r+b')\n"
        "m = mmap.mmap(g.fileno(), 4096)\n"
        f"f = open({str(tmp_path / names['open'])!r}, 'rb')\n"
        "print('holding', flush=True)\n"
        "time.sleep(300)\n")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        assert server_watch.remove_stale_shared_memory() == [names["stale"]]
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(v for k, v in names.items() if k != "stale")
    finally:
        holder.kill()
        holder.wait()
    assert server_watch.remove_stale_shared_memory() == sorted([names["mapped"], names["open"]])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([names["live"], names["other"]])


def test_wait_statuses_are_named() -> None:
    assert server_watch.describe(9) == "was killed by SIGKILL"
    assert server_watch.describe(6 | 0x80) == "was killed by SIGABRT"
    assert server_watch.describe(1 << 8) == "exited with code 1"
    assert server_watch.describe(None) == "died"
    assert server_watch.describe_returncode(-9) == "was killed by SIGKILL"
    assert server_watch.describe_returncode(3) == "exited with code 3"


def test_the_ready_timeout_quotes_the_log_and_blames_size_only_when_the_log_is_silent(tmp_path: Path) -> None:
    server = TritonServer(tinyllm_repository(tmp_path / "repo"), ready_timeout_s=30, log_file=tmp_path / "s.log")
    noise = (
        'E1201 11:49:38.896144 6502 server.cc:241] "CudaDriverHelper has not been initialized."\n'
        'I1201 11:49:38.897045 6502 model_lifecycle.cc:472] "loading: tinyllm:1"\n'
        'I1201 11:49:38.897046 6502 model_lifecycle.cc:472] "loading: ensemble:1"\n'
        "Error: Failed to initialize NVML\n"
    )
    silent = server._not_ready(noise)
    assert str(silent).startswith("the repository was not ready after 30s (still loading: ensemble, tinyllm)\n")
    assert "--ready-timeout" in (silent.hint or "")
    crashed = server._not_ready(noise + "terminate called after throwing an instance of 'std::invalid_argument'\n"
                                        "  what():  stol\n")
    assert crashed.message.endswith("the server log says:\nterminate called after throwing an instance of "
                                    "'std::invalid_argument'\nwhat():  stol")
    assert "ready-timeout" not in (crashed.hint or "") and "large models" not in str(crashed)


def test_serve_refuses_an_llmapi_repository_without_nvidias_code(tmp_path: Path) -> None:
    """A PyTorch-flow repository (Triton's llmapi model, as deploy writes it: tensorrt_llm/1/model.yaml, no model.py,
    which is NVIDIA's) is refused before tritonserver starts, naming the files to copy and from where, instead of
    failing as a generic load failure of tensorrt_llm; exit 1."""
    from typer.testing import CliRunner

    from specbuild.cli import app
    from specbuild.contracts.llm_api import llm_args
    from specbuild.deploy.llmapi import repository_files
    from specbuild.spec import parse_spec

    spec = parse_spec({"name": "pt", "target": {"model": str(tmp_path / "target")},
                       "build": {"flow": "pytorch", "max_batch_size": 1, "max_input_len": 8, "max_output_len": 8}},
                      tmp_path / "pt.yaml")
    repo = tmp_path / "repo"
    for name, text in repository_files(spec, llm_args(spec)).items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    with pytest.raises(SpecbuildError, match=r"tensorrt_llm/1/model\.py, tensorrt_llm/1/helpers\.py missing"):
        TritonServer(repo, log_file=tmp_path / "s.log").start()
    result = CliRunner().invoke(app, ["serve", str(repo), "--log-file", str(tmp_path / "s.log")])
    output = " ".join(result.output.split())
    assert result.exit_code == 1, output
    assert "triton_backend/all_models/llmapi/tensorrt_llm/1/" in output and "specbuild serve" in output
    assert "failed to load" not in output and "Traceback" not in output
    assert not (tmp_path / "s.log").exists()  # no tritonserver was started
