"""Options a command cannot honour are refused by name, never dropped silently (issue 48, item 4).

Each test runs the real CLI (typer's CliRunner) on a real deployed repository and asserts what the user reads.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from specbuild.cli import app
from tests.deploy_fixtures import deploy_pytorch_flow, pipeline_data


@pytest.fixture(scope="module", name="llmapi_repository")
def llmapi_repository_fixture(tmp_path_factory: pytest.TempPathFactory, demo_models: dict[str, Path]) -> Path:
    """A PyTorch-flow repository (Triton's llmapi model, n-gram drafting: no draft to convert)."""
    root = tmp_path_factory.mktemp("llmapi-ngram")
    data = pipeline_data("llmapi-ngram", demo_models, "ngram", root / "out")
    data["speculative"]["num_draft_tokens"] = 3
    return deploy_pytorch_flow(root, data)


@pytest.mark.parametrize("k", ["0", "2"])
def test_serve_refuses_a_draft_length_the_llmapi_model_cannot_take(llmapi_repository: Path, k: str) -> None:
    """The llmapi model has no num_draft_tokens input (the LLM API drafts its speculative_config's length for every
    request): `serve --num-draft-tokens 0 --prompt` used to speculate anyway, silently. It is refused naming the
    option and the model, before tritonserver starts (an unmarked test cannot start one)."""
    result = CliRunner().invoke(app, ["serve", str(llmapi_repository), "--prompt", "Lists are",
                                      "--num-draft-tokens", k])
    output = " ".join(result.output.split())
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), output
    assert f"--num-draft-tokens {k}: model" in output and "has no num_draft_tokens input" in output, output
    assert "speculative.num_draft_tokens" in output, output


def test_serve_refuses_a_draft_length_without_a_prompt_to_send_it_with(llmapi_repository: Path) -> None:
    """Without --prompt serve sends no request, so --num-draft-tokens would change nothing the server does."""
    result = CliRunner().invoke(app, ["serve", str(llmapi_repository), "--num-draft-tokens", "0"])
    output = " ".join(result.output.split())
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), output
    assert "--num-draft-tokens is the draft length of --prompt's requests" in output, output


def test_a_sequence_the_engine_fails_is_an_error_not_a_short_output(tmp_path: Path) -> None:
    """GPT-2 has learned positions: past them the engine ends the sequence with an error. `generate` (and every
    batch method) used to return the tokens so far as if the sequence had finished; it raises, naming why."""
    import torch

    from specbuild.convert.pipeline import convert_checkpoint
    from specbuild.convert.request import ConvertRequest
    from specbuild.runtime.generation import generate
    from specbuild.runtime.model import CausalLM
    from specbuild.runtime.sequence import StopCriteria
    from tests.tiny_models import make_checkpoint

    hf = make_checkpoint(tmp_path / "gpt2", "gpt2", dtype=torch.float32)
    convert_checkpoint(ConvertRequest("target", hf, tmp_path / "ckpt", "float32"))
    model = CausalLM.from_checkpoint(tmp_path / "ckpt")
    positions = model.config.max_position_embeddings
    fits = generate(model, [[1, 2, 3]], stop=StopCriteria(positions - 3))  # no end id: runs to its length
    assert len(fits.output_ids[0]) == positions - 3
    with pytest.raises(ValueError, match=rf"prompt 1 failed after \d+ tokens: .*past the model's {positions} learned"):
        generate(model, [[1, 2, 3]], stop=StopCriteria(positions))


def test_generate_on_a_hugging_face_directory_says_to_convert_it(demo_models: dict[str, Path]) -> None:
    """The likeliest first mistake with `generate`: the model's own directory instead of its converted checkpoint.
    It used to read "architecture None is not supported by the reference runtime"."""
    target = demo_models["target"]
    result = CliRunner().invoke(app, ["generate", str(target), "--tokenizer", str(target), "--prompt", "Lists are"])
    output = " ".join(result.output.split())
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), output
    assert "a Hugging Face checkpoint" in output and f"specbuild convert --model {target} --output CKPT" in output
