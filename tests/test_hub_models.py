"""`target.model` / `draft.model` as a Hugging Face Hub id (`owner/name`, optional `revision:`), resolved through
huggingface_hub's cache: the tests build that cache in tmp_path (its own layout: refs/<name> holding a commit,
snapshots/<commit>/files) and run the real CLI in a subprocess with HF_HUB_OFFLINE=1, so the Hub is never tried
and huggingface_hub reads the environment as a user's shell sets it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

SPEC = ("name: t\noutput_dir: out\n{models}"
        "build: {{dtype: float32, max_batch_size: 2, max_input_len: 32, max_output_len: 16}}\n")
MAIN, V2 = "a" * 40, "b" * 40


def add_snapshot(cache: Path, repo_id: str, commit: str, source: Path, *refs: str) -> Path:
    """Put `source`'s files into the cache as `repo_id` at `commit`, with each ref (branch or tag) pointing at it."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    shutil.copytree(source, snapshot)
    for ref in refs:
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
    return snapshot


def specbuild(tmp_path: Path, *args: str, hub: str | None = None) -> subprocess.CompletedProcess[str]:
    """The CLI with the cache in tmp_path: offline, or (`hub`) online against that endpoint."""
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_CACHE": str(tmp_path / "hub"),
           "HF_HUB_OFFLINE": "1", "COLUMNS": "250"}
    if hub is not None:
        env.update(HF_HUB_OFFLINE="0", HF_ENDPOINT=hub)
    return subprocess.run([sys.executable, "-m", "specbuild.cli", *args], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=300)


def write_spec(tmp_path: Path, models: str) -> Path:
    spec = tmp_path / "pipeline.yaml"
    spec.write_text(SPEC.format(models=models))
    return spec


def manifest_settings(tmp_path: Path, role: str) -> dict[str, object]:
    return json.loads((tmp_path / "out/checkpoints" / role / "manifest.json").read_text())["settings"]


def test_hub_id_validates_converts_and_records_its_commit(tmp_path: Path, demo_models: dict[str, Path]) -> None:
    first = add_snapshot(tmp_path / "hub", "acme/tiny", MAIN, demo_models["draft"], "main")
    spec = write_spec(tmp_path, "target: {model: acme/tiny}\n")
    validated = specbuild(tmp_path, "validate", str(spec))
    assert validated.returncode == 0, validated.stdout + validated.stderr
    assert f"acme/tiny@{MAIN} (Hugging Face Hub snapshot in" in validated.stdout  # what was resolved, by name
    converted = specbuild(tmp_path, "convert", str(spec))
    assert converted.returncode == 0, converted.stdout + converted.stderr
    assert manifest_settings(tmp_path, "target")["source"] == str(first)
    assert manifest_settings(tmp_path, "target")["hub"] == f"acme/tiny@{MAIN}"
    # main moves to another commit (same files): the checkpoint is stale and rewritten from the new snapshot
    add_snapshot(tmp_path / "hub", "acme/tiny", V2, demo_models["draft"], "main")
    again = specbuild(tmp_path, "convert", str(spec))
    assert again.returncode == 0 and "up to date" not in again.stdout, again.stdout + again.stderr
    assert manifest_settings(tmp_path, "target")["hub"] == f"acme/tiny@{V2}"


def test_revision_selects_a_snapshot(tmp_path: Path, demo_models: dict[str, Path]) -> None:
    add_snapshot(tmp_path / "hub", "acme/tiny", MAIN, demo_models["draft"], "main")
    tagged = add_snapshot(tmp_path / "hub", "acme/tiny", V2, demo_models["draft"], "v2")
    spec = write_spec(tmp_path, "target: {model: acme/tiny, revision: v2}\n")
    converted = specbuild(tmp_path, "convert", str(spec))
    assert converted.returncode == 0, converted.stdout + converted.stderr
    assert manifest_settings(tmp_path, "target")["hub"] == f"acme/tiny@{V2}"
    assert manifest_settings(tmp_path, "target")["source"] == str(tagged)
    by_commit = write_spec(tmp_path, f"target: {{model: acme/tiny, revision: {MAIN}}}\n")
    validated = specbuild(tmp_path, "validate", str(by_commit))
    assert validated.returncode == 0 and f"snapshots/{MAIN}" in validated.stdout, validated.stdout + validated.stderr


def test_id_not_in_the_cache_is_refused_naming_the_field(tmp_path: Path, demo_models: dict[str, Path]) -> None:
    add_snapshot(tmp_path / "hub", "acme/tiny", MAIN, demo_models["draft"], "main")
    spec = write_spec(tmp_path, "target: {model: acme/tiny}\ndraft: {model: acme/missing}\n"
                      "speculative: {mode: draft_target, num_draft_tokens: 3}\n")
    for command in ("validate", "convert"):  # offline: it may be a directory not made yet, or an id not cached
        result = specbuild(tmp_path, command, str(spec))
        output = " ".join((result.stdout + result.stderr).split())
        assert result.returncode == 1 and "Traceback" not in output, output
        assert f"{tmp_path / 'acme/missing'}: model directory does not exist" in output, output
        assert "Hugging Face Hub id (owner/name)" in output and "`specbuild convert SPEC` fills" in output, output
    assert not (tmp_path / "out").exists()
    unknown = write_spec(tmp_path, "target: {model: acme/tiny, revision: v9}\n")
    result = specbuild(tmp_path, "validate", str(unknown))
    output = " ".join(result.stderr.split())
    assert result.returncode == 1 and "target.model: acme/tiny@v9 is not in the Hugging Face cache" in output, output
    assert "HF_HUB_OFFLINE is set" in output and "`hf download acme/tiny --revision v9`" in output, output


def test_an_existing_directory_shaped_like_an_id_stays_a_path(tmp_path: Path, demo_models: dict[str, Path]) -> None:
    """`acme/tiny` exists beside the spec and in the cache: the directory wins; `acme/draft` is only in the cache."""
    add_snapshot(tmp_path / "hub", "acme/tiny", MAIN, demo_models["draft"], "main")
    draft = add_snapshot(tmp_path / "hub", "acme/draft", V2, demo_models["draft"], "main")
    shutil.copytree(demo_models["target"], tmp_path / "acme/tiny")
    spec = write_spec(tmp_path, "target: {model: acme/tiny}\ndraft: {model: acme/draft}\n"
                      "speculative: {mode: draft_target, num_draft_tokens: 3}\n")
    converted = specbuild(tmp_path, "convert", str(spec))
    assert converted.returncode == 0, converted.stdout + converted.stderr
    target = manifest_settings(tmp_path, "target")
    assert target["source"] == str(tmp_path / "acme/tiny") and "hub" not in target
    assert manifest_settings(tmp_path, "draft")["source"] == str(draft)
    assert manifest_settings(tmp_path, "draft")["hub"] == f"acme/draft@{V2}"
    pinned = write_spec(tmp_path, "target: {model: acme/tiny, revision: main}\n")
    refused = specbuild(tmp_path, "validate", str(pinned))
    assert refused.returncode == 1, refused.stdout
    assert "target.model: acme/tiny is a local path; `revision` applies only to a Hugging Face Hub id" in (
        refused.stderr)


def test_convert_asks_the_hub_for_what_the_cache_lacks_and_validate_never_does(tmp_path: Path,
                                                                               demo_models: dict[str, Path]) -> None:
    """Online, convert downloads an id the cache lacks; validate reads the cache only. The Hub is a stand-in on
    loopback (HF_ENDPOINT; no other network here) that knows no model, answering as the Hub does for an unknown
    repository (404 with X-Error-Code: RepoNotFound): convert asks it and says there is no such model, naming the
    field; validate never asks and reports the missing directory."""
    asked: list[str] = []

    class NoModels(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            self.send_response(404)
            self.send_header("X-Error-Code", "RepoNotFound")
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        do_HEAD = do_GET

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), NoModels)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    hub = f"http://127.0.0.1:{server.server_address[1]}"
    add_snapshot(tmp_path / "hub", "acme/tiny", MAIN, demo_models["draft"], "main")
    spec = write_spec(tmp_path, "target: {model: acme/tiny}\ndraft: {model: acme/missing}\n"
                      "speculative: {mode: draft_target, num_draft_tokens: 3}\n")
    try:
        validated = specbuild(tmp_path, "validate", str(spec), hub=hub)
        assert validated.returncode == 1 and asked == [], (asked, validated.stderr)
        converted = specbuild(tmp_path, "convert", str(spec), hub=hub)
    finally:
        server.shutdown()
    output = " ".join(converted.stderr.split())
    assert converted.returncode == 1 and "Traceback" not in output, output
    assert any("acme/missing" in path for path in asked), asked
    assert f"{spec}:4: draft.model: acme/missing: no such model on the Hugging Face Hub" in output, output
    assert not (tmp_path / "out").exists()


def test_medusa_heads_may_be_a_hub_id(tmp_path: Path, demo_models: dict[str, Path]) -> None:
    """`medusa.heads` takes a Hub id (with `revision`) like the models: resolved in the cache, converted with the
    target into one MedusaForCausalLM checkpoint whose manifest records the heads' snapshot."""
    add_snapshot(tmp_path / "hub", "acme/heads", MAIN, demo_models["medusa-heads"], "v1")
    spec = write_spec(tmp_path, f"target: {{model: {demo_models['target']}}}\n"
                      "medusa: {heads: acme/heads, revision: v1}\nspeculative: {mode: medusa}\n")
    validated = specbuild(tmp_path, "validate", str(spec))
    assert validated.returncode == 0, validated.stdout + validated.stderr
    assert f"acme/heads@{MAIN}" in validated.stdout, validated.stdout
    converted = specbuild(tmp_path, "convert", str(spec))
    assert converted.returncode == 0, converted.stdout + converted.stderr
    config = json.loads((tmp_path / "out/checkpoints/medusa/config.json").read_text())
    assert config["architecture"] == "MedusaForCausalLM"
    assert manifest_settings(tmp_path, "medusa")["medusa_heads"] == str(
        tmp_path / "hub/models--acme--heads/snapshots" / MAIN), manifest_settings(tmp_path, "medusa")
    untagged = write_spec(tmp_path, f"target: {{model: {demo_models['target']}}}\n"
                          "medusa: {heads: acme/heads, revision: v9}\nspeculative: {mode: medusa}\n")
    result = specbuild(tmp_path, "validate", str(untagged))
    output = " ".join(result.stderr.split())
    assert result.returncode == 1 and "medusa.heads: acme/heads@v9 is not in the Hugging Face cache" in output, output
