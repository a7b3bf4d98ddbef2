"""Every build check fails a spec that breaks it, with its own message, and several problems come back together,
before any engine directory is written.

The rules are the build-time mistakes in shared/reference/tensorrt-llm.md §2-§5 and triton-backend.md §5: vocab
mismatch (#2789), K above the engine's max_draft_len (tensorrtllm_backend#473), Medusa tree limits
(speculativeChoicesUtils.cpp: index <= 16, depth <= 16, depth <= heads, nodes <= max_draft_len),
max_num_tokens below batch x (draft + 1), gather_context_logits with a draft length, fp8 before Ada/Hopper.
"""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import pytest
from rich.console import Console

from specbuild.build import build_pipeline
from specbuild.build.validate import BuildValidationError
from specbuild.errors import SpecError
from tests.build_pipelines import convert_all, edit_checkpoint_config, place, place_all, write_pipeline


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return convert_all(tmp_path_factory.mktemp("build-validate"))


def problems_of(spec, **kwargs) -> list[str]:  # type: ignore[no-untyped-def]
    with pytest.raises(BuildValidationError) as caught:
        build_pipeline(spec, backend="reference", console=Console(file=io.StringIO()), **kwargs)
    assert not (spec.output_dir / "engines").exists(), "nothing may be written when a check fails"
    return [problem.message for problem in caught.value.problems if problem.severity == "error"]


def only(messages: list[str]) -> str:
    assert len(messages) == 1, messages
    return messages[0]


def test_unconverted_checkpoints_are_named(tmp_path: Path, models: dict[str, Path]) -> None:
    spec = write_pipeline(tmp_path, models)
    messages = problems_of(spec)
    assert len(messages) == 2
    assert all("not converted yet" in m and "specbuild convert" in m for m in messages)


def test_draft_vocab_must_match_the_target(tmp_path: Path, models: dict[str, Path]) -> None:
    spec = write_pipeline(tmp_path, models)
    place(spec, "target", models["target"])
    place(spec, "draft", models["draft_vocab"])
    assert "draft vocab_size 1024 differs from the target's 1000" in only(problems_of(spec))


def test_checkpoint_sharding_must_match_the_spec(tmp_path: Path, models: dict[str, Path]) -> None:
    spec = write_pipeline(tmp_path, models, build={"tp_size": 2})
    place_all(spec, models)
    messages = problems_of(spec)
    assert len(messages) == 2
    assert all("sharded tp=1 pp=1, but build.tp_size/pp_size say tp=2 pp=1" in m for m in messages)


def test_checkpoint_dtype_must_match_the_spec(tmp_path: Path, models: dict[str, Path]) -> None:
    spec = write_pipeline(tmp_path, models, mode="none", build={"dtype": "bfloat16"})
    place_all(spec, models)
    assert "target checkpoint is float16, but build.dtype is bfloat16" in only(problems_of(spec))


def test_float16_quantized_draft_of_a_float32_pipeline_is_accepted(tmp_path: Path, models: dict[str, Path]) -> None:
    """ModelOpt exports quantized checkpoints only in float16/bfloat16 (reference modelopt-medusa.md §1.5), so a
    float32 pipeline's quantized draft arrives as float16; an unquantized float16 draft is still a stale convert."""
    spec = write_pipeline(tmp_path, models, build={"dtype": "float32"})
    place_all(spec, models)
    edit_checkpoint_config(spec.checkpoint_dir("target"), dtype="float32")
    messages = problems_of(spec)
    assert messages == ["draft checkpoint is float16, but build.dtype is float32; re-run `specbuild convert SPEC`"]
    edit_checkpoint_config(spec.checkpoint_dir("draft"), **{"quantization.quant_algo": "W8A8_SQ_PER_CHANNEL"})
    build_pipeline(spec, backend="reference", dry_run=True, console=Console(file=io.StringIO()))


def test_k_above_the_engine_max_draft_len_is_refused_when_the_spec_loads(tmp_path: Path,
                                                                          models: dict[str, Path]) -> None:
    with pytest.raises(SpecError, match=r"speculative.max_draft_len: 3 is less than num_draft_tokens \(5\)"):
        write_pipeline(tmp_path, models, speculative={"num_draft_tokens": 5, "max_draft_len": 3})


def test_medusa_tree_deeper_than_the_heads(tmp_path: Path, models: dict[str, Path]) -> None:
    spec = write_pipeline(tmp_path, models, mode="medusa", choices=[[0], [0, 0], [0, 0, 0], [0, 0, 0, 0]])
    place_all(spec, models)
    assert "the tree is 4 deep, but the checkpoint has 3 Medusa heads" in only(problems_of(spec))


def test_medusa_index_above_16(tmp_path: Path, models: dict[str, Path]) -> None:
    spec = write_pipeline(tmp_path, models, mode="medusa", choices=[[0], [17]])
    place_all(spec, models)
    assert "top-k index 17 is more than 16" in only(problems_of(spec))


def test_medusa_tree_larger_than_max_draft_len(tmp_path: Path, models: dict[str, Path]) -> None:
    spec = write_pipeline(tmp_path, models, mode="medusa", speculative={"max_draft_len": 2})
    place_all(spec, models)
    assert "4 nodes, more than the engine's max_draft_len 2" in only(problems_of(spec))


def test_medusa_tree_missing_a_prefix_is_refused_when_the_spec_loads(tmp_path: Path,
                                                                      models: dict[str, Path]) -> None:
    with pytest.raises(SpecError, match=r"prefix \[1\] is not listed"):
        write_pipeline(tmp_path, models, mode="medusa", choices=[[0], [1, 0]])


def test_medusa_max_num_tokens_below_one_verification_step(tmp_path: Path, models: dict[str, Path]) -> None:
    spec = write_pipeline(tmp_path, models, mode="medusa", build={"max_num_tokens": 8})
    place_all(spec, models)
    message = only(problems_of(spec))
    assert "max_num_tokens 8 is less than max_batch_size x (max_draft_len + 1) = 2 x 5 = 10" in message


def test_gather_context_logits_never_with_a_draft_length(tmp_path: Path, models: dict[str, Path]) -> None:
    spec = write_pipeline(tmp_path, models, build={"gather_context_logits": True})
    place_all(spec, models)
    assert "target engine: build.gather_context_logits cannot be used" in only(problems_of(spec))  # not the draft


@pytest.mark.parametrize(
    ("gpu", "quant", "kv", "refused"),
    [
        ("A100", "FP8", None, "quant_algo=FP8, which needs Ada or Hopper"),
        ("A10G", "W8A16", "FP8", "kv_cache_quant_algo=FP8, which needs Ada or Hopper"),
        ("8.6", "W4A8_AWQ", None, "quant_algo=W4A8_AWQ, which needs Ada or Hopper"),
        ("H100", "NVFP4", None, "quant_algo=NVFP4, which needs Blackwell"),
    ],
)
def test_quantization_the_gpu_generation_cannot_run(tmp_path: Path, models: dict[str, Path], gpu: str,
                                                    quant: str, kv: str | None, refused: str) -> None:
    spec = write_pipeline(tmp_path, models, build={"gpu": gpu})
    place_all(spec, models)
    edit_checkpoint_config(spec.checkpoint_dir("draft"), **{"quantization.quant_algo": quant,
                                                            "quantization.kv_cache_quant_algo": kv})
    assert refused in only(problems_of(spec))


@pytest.mark.parametrize("gpu", ["H100", "NVIDIA L40S", "8.9", "sm_90"])
def test_fp8_passes_on_ada_and_hopper(tmp_path: Path, models: dict[str, Path], gpu: str) -> None:
    spec = write_pipeline(tmp_path, models, build={"gpu": gpu})
    place_all(spec, models)
    edit_checkpoint_config(spec.checkpoint_dir("draft"), **{"quantization.quant_algo": "FP8",
                                                            "quantization.kv_cache_quant_algo": "FP8"})
    results = build_pipeline(spec, dry_run=True, console=Console(file=io.StringIO()))
    assert [r.status for r in results] == ["planned", "planned"]


def test_unknown_gpu_name(tmp_path: Path, models: dict[str, Path]) -> None:
    spec = write_pipeline(tmp_path, models, build={"gpu": "Voodoo5"})
    place_all(spec, models)
    assert "build.gpu: unknown GPU 'Voodoo5'" in only(problems_of(spec))


def test_memory_estimate_warns_and_builds(tmp_path: Path, models: dict[str, Path]) -> None:
    spec = write_pipeline(tmp_path, models, build={"gpu_memory_gb": 0.001})
    place_all(spec, models)
    out = io.StringIO()
    results = build_pipeline(spec, backend="reference", console=Console(file=out, width=400))
    assert [r.status for r in results] == ["built", "built"]
    text = out.getvalue()
    assert "warning:" in text and "more than 90% of the GPU's 0.001 GiB" in text
    assert "target: weights" in text and "draft: weights" in text


def test_several_problems_are_reported_together(tmp_path: Path, models: dict[str, Path]) -> None:
    spec = write_pipeline(tmp_path, models, build={"gather_context_logits": True, "gpu": "A100", "dtype": "float32"})
    place(spec, "target", models["target"])
    place(spec, "draft", models["draft_vocab"])
    edit_checkpoint_config(spec.checkpoint_dir("draft"), **{"quantization.quant_algo": "FP8"})
    with pytest.raises(BuildValidationError) as caught:
        build_pipeline(spec, backend="reference", console=Console(file=io.StringIO()))
    text = str(caught.value)
    for expected in ("target checkpoint is float16, but build.dtype is float32",
                     "draft vocab_size 1024 differs", "gather_context_logits cannot be used",
                     "quant_algo=FP8, which needs Ada or Hopper"):
        assert expected in text
    assert "4 problem(s)" in text
    shutil.rmtree(spec.output_dir)


def test_a_medusa_checkpoint_without_heads(tmp_path: Path, models: dict[str, Path]) -> None:
    spec = write_pipeline(tmp_path, models, mode="medusa")
    place(spec, "medusa", models["target"])
    assert "medusa checkpoint is a LlamaForCausalLM, not a MedusaForCausalLM" in only(problems_of(spec))


def test_sequences_longer_than_a_learned_position_table(tmp_path: Path, models: dict[str, Path]) -> None:
    spec = write_pipeline(tmp_path, models, mode="none")
    place_all(spec, models)
    edit_checkpoint_config(spec.checkpoint_dir("target"), position_embedding_type="learned_absolute",
                           max_position_embeddings=40)
    assert "sequences of up to 48 tokens, but the model has 40 positions" in only(problems_of(spec))


def test_sequences_longer_than_rope_training_only_warn(tmp_path: Path, models: dict[str, Path]) -> None:
    spec = write_pipeline(tmp_path, models, mode="none", build={"max_input_len": 250})  # 250 + 16 > 256
    place_all(spec, models)
    out = io.StringIO()
    [result] = build_pipeline(spec, console=Console(file=out, width=400))
    assert result.status == "built"
    assert "warning: target engine: sequences of up to 266 tokens, but the model has 256 positions" in out.getvalue()


@pytest.mark.parametrize(
    ("mode", "speculative", "message"),
    [
        ("medusa", {"use_draft_logits": True}, "speculative.use_draft_logits: only used in draft_target mode"),
        ("none", {"max_draft_len": 4}, "speculative.max_draft_len: only used with speculative decoding"),
    ],
)
def test_build_keys_that_the_mode_does_not_use_are_spec_errors(tmp_path: Path, models: dict[str, Path], mode: str,
                                                                speculative: dict[str, object], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        write_pipeline(tmp_path, models, mode=mode, speculative=speculative)
