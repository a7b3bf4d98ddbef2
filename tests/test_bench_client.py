"""The LLM client and the serving benchmark against a real tritonserver serving `tinyllm` (tests/serve_fixtures.py).

tinyllm is deterministic: `max_tokens` words "<first prompt word><i>", and with K draft tokens it sends
1 + K//2 words per response and reports K//2 accepted of K drafted per step. So every figure the client
parses and the bench computes has a known right answer.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specbuild.bench.client import LLMClient, entry_model
from specbuild.bench.load import Load, TokenCounter, run_load
from specbuild.cli import app
from specbuild.errors import SpecbuildError
from specbuild.serve.server import TritonServer
from tests.serve_fixtures import tinyllm_repository

pytestmark = pytest.mark.tritonserver

STEP_S = 0.05  # long enough that four requests in flight beat the serial time by a wide margin


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    root = tmp_path_factory.mktemp("bench")
    with TritonServer(tinyllm_repository(root / "repo", step_delay_s=STEP_S), log_file=root / "server.log") as s:
        yield s


EXPECTED = "hello0 hello1 hello2 hello3 hello4 hello5"


def test_grpc_stream_gets_every_response_and_the_acceptance_outputs(server: TritonServer) -> None:
    with LLMClient(server.grpc_url, "tinyllm", "grpc") as client:
        assert client.model.decoupled and client.model.batched
        speculative = client.generate("hello there", 6, num_draft_tokens=4)
        plain = client.generate("hello there", 6)  # same stream, second request
    assert speculative.text == plain.text == EXPECTED
    assert len(speculative.response_times) == 2, "3 words per response with K=4"
    assert len(plain.response_times) == 6
    assert (speculative.accepted_draft_tokens, speculative.draft_tokens) == (4, 8)
    assert speculative.acceptance_rate == pytest.approx(0.5)
    assert plain.draft_tokens == 0
    assert speculative.reported_tokens == plain.reported_tokens == 6
    assert 0 < speculative.ttft_s < speculative.latency_s
    assert plain.latency_s >= 6 * STEP_S


def test_http_generate_and_generate_stream_give_the_same_answer(server: TritonServer) -> None:
    with LLMClient(f"http://{server.http_url}/", "tinyllm", "http") as client:
        whole = client.generate("hello", 6, stream=False, num_draft_tokens=4)
        streamed = client.generate("hello", 6, stream=True, num_draft_tokens=4)
    assert whole.text == streamed.text == EXPECTED
    assert len(whole.response_times) == 1 and len(streamed.response_times) == 2
    assert (whole.accepted_draft_tokens, whole.draft_tokens) == (4, 8)
    assert whole.ttft_s == pytest.approx(whole.latency_s, abs=0.01), "no streaming: first text is the answer"


def test_entry_model_is_found_and_unknown_models_are_clear_errors(server: TritonServer) -> None:
    with LLMClient(server.grpc_url) as client:
        assert client.model.name == "ensemble"
        assert client.generate("hello", 3).text == "hello0 hello1 hello2"
    with pytest.raises(SpecbuildError, match="nosuchmodel"):
        LLMClient(server.http_url, "nosuchmodel", "http")
    with pytest.raises(SpecbuildError, match="cannot reach"):
        LLMClient("127.0.0.1:1", "tinyllm", "grpc")
    assert entry_model(["ensemble", "preprocessing", "tensorrt_llm", "tensorrt_llm_bls",
                        "tensorrt_llm_draft"]) == "tensorrt_llm_bls"
    assert entry_model(["ensemble", "tensorrt_llm", "tensorrt_llm_bls"]) == "ensemble"


def test_concurrent_clients_multiply_throughput_and_figures_add_up(server: TritonServer) -> None:
    prompts = ("alpha beta", "gamma", "delta epsilon")
    one = run_load(server.grpc_url, Load(prompts=prompts, max_tokens=8, concurrency=1, requests=4,
                                         num_draft_tokens=4), model="tinyllm")
    four = run_load(server.grpc_url, Load(prompts=prompts, max_tokens=8, concurrency=4, requests=8,
                                          num_draft_tokens=4), model="tinyllm")
    for summary, requests in ((one, 4), (four, 8)):
        assert (summary.requests, summary.errors) == (requests, 0)
        assert summary.output_tokens == 8 * requests
        assert summary.output_tokens_per_s == pytest.approx(summary.output_tokens / summary.wall_s)
        assert summary.tokens_counted_by == "num_output_tokens"
        # 8 words at 3 per step: 3 steps, 2+2+1 accepted of 3×4 drafted
        assert (summary.accepted_draft_tokens, summary.draft_tokens) == (5 * requests, 12 * requests)
        assert summary.acceptance_rate == pytest.approx(5 / 12)
        assert summary.ttft_ms["mean"] < summary.latency_ms["mean"]
        assert summary.itl_ms["mean"] == pytest.approx(
            (summary.latency_ms["mean"] - summary.ttft_ms["mean"]) / 7, rel=0.25)
        assert summary.extra["stream"] is True, "tinyllm is decoupled, so the bench streams by default"
    # tinyllm sleeps STEP_S per step, so 8 requests of 3 steps served one after another take at least
    # 24 × STEP_S whatever the machine does; four in flight need about a quarter of that. A bound that holds
    # on a loaded machine, unlike a throughput ratio.
    assert four.wall_s < 8 * 3 * STEP_S, "4 requests in flight, not queued"


def test_tokens_are_counted_with_a_tokenizer_when_given(server: TritonServer, tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordPiece({"[UNK]": 0, "hello": 1, "##0": 2}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    summary = run_load(server.http_url, Load(prompts=("hello",), max_tokens=3, requests=1, warmup=False),
                       model="tinyllm", protocol="http", counter=TokenCounter(tmp_path))
    # "hello0 hello1 hello2": hello0 → hello ##0 (2 pieces); hello1, hello2 → [UNK] each (1 piece)
    assert summary.output_tokens == 4
    assert summary.tokens_counted_by.startswith("tokenizer")


def test_bench_cli_compares_two_endpoints_as_json_and_png(server: TritonServer, tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("one two\n\nthree\n")
    png = tmp_path / "plot.png"
    result = CliRunner().invoke(app, [
        "bench", server.grpc_url, "--model-name", "tinyllm", "--num-draft-tokens", "4", "--max-tokens", "9",
        "--compare", server.grpc_url, "--compare-model-name", "ensemble", "--prompts", str(prompts),
        "--concurrency", "1", "--concurrency", "2", "--json", "--png", str(png),
    ])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert [s["concurrency"] for s in report["endpoint"]] == [1, 2]
    assert [s["model"] for s in report["compare"]] == ["ensemble", "ensemble"]
    # tinyllm's repository has no preprocessing model, so no tokenizer: words, for both endpoints alike
    assert report["unit"] == "words"
    assert {s["tokens_counted_by"] for s in report["endpoint"] + report["compare"]} == {"words"}
    # tinyllm with K=4 sends 3 words per step, the ensemble (no num_draft_tokens input) one: about 3× the rate
    for ratio in report["ratios"]:
        assert 2.0 < ratio["output_tokens_per_s"] < 3.6
        assert ratio["itl_mean"] > 2.0
    assert report["compare"][0]["acceptance_rate"] is None
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_cli_table_and_unreachable_server(server: TritonServer) -> None:
    result = CliRunner().invoke(app, ["bench", server.http_url, "--protocol", "http", "--requests", "2",
                                      "--max-tokens", "4", "--model-name", "tinyllm", "--num-draft-tokens", "2"])
    assert result.exit_code == 0, result.output
    assert "output words/s" in result.stdout and "acceptance rate" in result.stdout
    assert "tokens/s" not in result.stdout, "words are never called tokens"
    assert "0.500" in result.stdout  # 4 words at 2 per step: 1 of 2 drafts accepted in each of 2 steps
    failed = CliRunner().invoke(app, ["bench", "127.0.0.1:1", "--model-name", "tinyllm"])
    assert failed.exit_code == 1
    assert "cannot reach" in failed.output


def test_bench_counts_with_the_tokenizer_the_servers_preprocessing_model_names(tmp_path: Path) -> None:
    """No --tokenizer, no --repository: the bench asks the server for preprocessing's tokenizer_dir (absolute here,
    so it names a directory on this machine) and counts with it, for both endpoints."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from tests.serve_fixtures import TINYLLM_CONFIG, TINYLLM_MODEL, _model

    tokenizer_dir = tmp_path / "tokenizer"
    tokenizer_dir.mkdir()
    tokenizer = Tokenizer(models.WordPiece({"[UNK]": 0, "hello": 1, "##0": 2}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(tokenizer_dir / "tokenizer.json"))
    repo = tinyllm_repository(tmp_path / "repo", step_delay_s=0.0)
    config = TINYLLM_CONFIG.replace('"tinyllm"', '"preprocessing"').replace("STEP_DELAY", "0")
    _model(repo, "preprocessing", config + f'parameters {{ key: "tokenizer_dir", value: {{ string_value: '
                                           f'"{tokenizer_dir}" }} }}\n', TINYLLM_MODEL)
    with TritonServer(repo, log_file=tmp_path / "server.log") as server:
        for url, protocol in ((server.grpc_url, "grpc"), (server.http_url, "http")):
            result = CliRunner().invoke(app, ["bench", url, "--protocol", protocol, "--model-name", "tinyllm",
                                              "--max-tokens", "3", "--requests", "1", "--prompts",
                                              str(_one_prompt(tmp_path)), "--json"])
            assert result.exit_code == 0, result.output
            report = json.loads(result.stdout)
            assert report["unit"] == "tokens"
            summary = report["endpoint"][0]
            assert summary["tokens_counted_by"] == f"tokenizer {tokenizer_dir}"
            assert summary["output_tokens"] == 4, "hello0 hello1 hello2: hello ##0, [UNK], [UNK]"


def _one_prompt(tmp_path: Path) -> Path:
    path = tmp_path / "prompt.txt"
    path.write_text("hello\n")
    return path
