"""`specbuild bench` while it runs and when it is stopped early, against a real tritonserver serving `tinyllm`
(tests/serve_fixtures.py: deterministic, `max_tokens` words "<first prompt word><i>", one word per STEP_S).

- progress (requests answered of the total) reaches stderr while the bench runs, stdout keeps the JSON;
- Ctrl-C (SIGINT) or SIGTERM: the figures of the requests that completed are printed, the report says it was cut
  short, and the exit code is the signal's (128 + its number);
- `--duration`: each run stops at its bound with what completed, and the next run still runs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specbuild.cli import app
from specbuild.serve.server import TritonServer
from tests.serve_fixtures import tinyllm_repository

pytestmark = pytest.mark.tritonserver

STEP_S = 0.05
MAX_TOKENS = 6  # 6 words of tinyllm a request: about 0.3 s each


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    root = tmp_path_factory.mktemp("bench-cut")
    with TritonServer(tinyllm_repository(root / "repo", step_delay_s=STEP_S), log_file=root / "server.log") as s:
        yield s


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_progress_shows_while_it_runs_and_a_signal_prints_what_completed(server: TritonServer,
                                                                         signum: signal.Signals) -> None:
    requests = 40  # about 12 s: the signal comes long before the end
    process = subprocess.Popen(
        [sys.executable, "-m", "specbuild.cli", "bench", server.grpc_url, "--model-name", "tinyllm",
         "--max-tokens", str(MAX_TOKENS), "--requests", str(requests), "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "COLUMNS": "200"})
    progress: list[str] = []
    seen = threading.Event()  # a progress line, or the end of stderr

    def read_stderr() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            progress.append(line)
            if f"/{requests} requests" in line:
                seen.set()
        seen.set()

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    try:
        seen.wait(60)
        assert process.poll() is None and any(f"/{requests} requests" in line for line in progress), (
            f"no progress on stderr while the bench ran:\n{''.join(progress)}")
        time.sleep(1.0)  # a few more requests
        process.send_signal(signum)
        assert process.stdout is not None
        stdout = process.stdout.read()  # stderr is the reader's
        process.wait(30)
    finally:
        if process.poll() is None:
            process.kill()
    reader.join(5)
    assert process.returncode == 128 + signum, "".join(progress)
    report = json.loads(stdout)
    summary = report["endpoint"][0]
    assert report["cut_short"] == summary["cut_short"] == signum.name
    assert 2 <= summary["requests"] < requests and summary["errors"] == 0
    assert summary["output_tokens"] == MAX_TOKENS * summary["requests"]  # only whole answers are counted
    assert summary["output_tokens_per_s"] == pytest.approx(summary["output_tokens"] / summary["wall_s"])
    assert summary["latency_ms"]["mean"] >= MAX_TOKENS * STEP_S * 1e3
    assert any(f"cut short by {signum.name}" in line for line in progress), "".join(progress)
    assert "Traceback" not in "".join(progress)


def test_duration_bounds_each_run_and_reports_what_completed(server: TritonServer) -> None:
    result = CliRunner().invoke(app, ["bench", server.grpc_url, "--model-name", "tinyllm", "--max-tokens",
                                      str(MAX_TOKENS), "--requests", "1000", "--duration", "1.5", "--concurrency", "1",
                                      "--concurrency", "2", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert [s["concurrency"] for s in report["endpoint"]] == [1, 2], "the first run's bound did not stop the next"
    for summary in report["endpoint"]:
        assert summary["cut_short"] == "the 1.5 s time bound"
        assert 1 <= summary["requests"] < 1000 and summary["errors"] == 0
        assert 1.5 <= summary["wall_s"] < 3.0
        assert summary["output_tokens"] == MAX_TOKENS * summary["requests"]
    assert "cut_short" not in report, "a time bound the user set is not a signal"
    assert "cut short by the 1.5 s time bound" in result.stderr


def test_a_signal_before_any_answer_is_one_line_and_no_traceback(tmp_path: Path) -> None:
    """SIGINT while the only run is still warming up: nothing completed, so nothing to print but why, and the
    signal's exit code."""
    slow = tinyllm_repository(tmp_path / "repo", step_delay_s=1.0)
    with TritonServer(slow, log_file=tmp_path / "server.log") as slow_server:
        process = subprocess.Popen(
            [sys.executable, "-m", "specbuild.cli", "bench", slow_server.grpc_url, "--model-name", "tinyllm",
             "--max-tokens", "4", "--requests", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert process.stderr is not None
        first = process.stderr.readline()  # said before the run starts: the load is next
        assert "counting words" in first, first
        time.sleep(1.0)  # connected, the warm-up request (4 s) in flight
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=30)
    assert process.returncode == 128 + signal.SIGINT, stderr
    assert "cut short by SIGINT before any request completed" in stderr
    assert "Traceback" not in stderr and stdout == ""
