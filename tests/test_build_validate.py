"""Every build check fails a spec that breaks it, with its own message, and several problems come back together,
before any engine directory is written.

The rules are the build-time mistakes TensorRT-LLM users report in GitHub issues: vocab mismatch
(NVIDIA/TensorRT-LLM#2789), K above the engine's max_draft_len (triton-inference-server/tensorrtllm_backend#473),
Medusa tree limits (NVIDIA/TensorRT-LLM cpp/tensorrt_llm/runtime/utils/speculativeChoicesUtils.cpp @b4f2086d:
index <= 16, depth <= 16, depth <= heads, nodes <= max_draft_len), max_num_tokens below batch x (draft + 1),
gather_context_logits with a draft length, fp8 before Ada/Hopper.
Then TensorRT-LLM 1.2's own build-time rules (NVIDIA/TensorRT-LLM tensorrt_llm/builder.py `build()`,
tensorrt_llm/_common.py `check_max_num_tokens()`): integer quantization refused on SM 100-119, paged context
FMHA dropped for an FP8 KV cache without FP8 context FMHA (or an INT8 one), max_num_tokens clamped to
[tokens_per_block, batch x max_seq_len].
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
    """ModelOpt exports quantized checkpoints only in float16/bfloat16 (ModelOpt 0.47.0,
    NVIDIA/Model-Optimizer modelopt/torch/export/model_config_export.py), so a
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
    # (W8A16 with an FP8 KV cache also loses paged context FMHA: test_a_draft_target_engine_that_loses_...)
    assert refused in only([m for m in problems_of(spec) if "which needs" in m])


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
    assert [r.status for r in results] == ["written", "written"]
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
    assert result.status == "written"
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


# TensorRT-LLM 1.2's own build-time rules, read from NVIDIA/TensorRT-LLM tensorrt_llm/builder.py `build()` (@73c0d691),
# tensorrt_llm/_common.py `check_max_num_tokens()` (@0fccc5b9) and tensorrt_llm/quantization/mode.py
# `QuantMode.from_quant_algo()` (@89fd9b74); see specbuild/build/validate.py.


def planned(spec, out: io.StringIO | None = None) -> list:  # type: ignore[no-untyped-def]
    """A dry run that must pass every check; its EngineResults."""
    results = build_pipeline(spec, dry_run=True, console=Console(file=out or io.StringIO(), width=400))
    assert {r.status for r in results} == {"planned"}
    return results


@pytest.mark.parametrize(
    ("gpu", "quant", "kv", "refused"),
    [
        ("B200", "W8A8_SQ_PER_CHANNEL", None, "quant_algo=W8A8_SQ_PER_CHANNEL (draft.quantization.format int8_sq) "
         "cannot be built for B200 (compute capability 10, Blackwell): TensorRT-LLM 1.2 refuses it on SM 100-119 "
         "(\"SmoothQuant is not supported on SM>=100.\"); set draft.quantization.format to fp8"),
        ("GB200", "W8A16", None, "(draft.quantization.format int8_wo) cannot be built for GB200 (compute capability "
         "10, Blackwell): TensorRT-LLM 1.2 refuses it on SM 100-119 (\"INT8/INT4 quantization is not supported"),
        ("B300", "W4A16_AWQ", None, "int4_awq) cannot be built for B300 (compute capability 10.3, Blackwell)"),
        ("10.0", "W4A8_AWQ", None, "w4a8_awq) cannot be built for sm_100 (compute capability 10, Blackwell): "
         "TensorRT-LLM 1.2 refuses it on SM 100-119 (\"INT8/INT4"),
        ("sm_103", "FP8_PER_CHANNEL_PER_TOKEN", None, "(\"Per-channel or per-token scaling is not supported on "
         "SM>=100.\")"),
    ],
)
def test_blackwell_sm100_refuses_integer_quantization(tmp_path: Path, models: dict[str, Path], gpu: str, quant: str,
                                                      kv: str | None, refused: str) -> None:
    """TensorRT-LLM 1.2's builder.py `build()` raises RuntimeError when `100 <= get_sm_version() < 120` for int8/int4
    weight-only (W8A16, W4A16_AWQ and, by quantization/mode.py's mapping, W4A8_AWQ), SmoothQuant (W8A8_SQ_*) and
    per-channel/per-token scaling (FP8_PER_CHANNEL_PER_TOKEN)."""
    spec = write_pipeline(tmp_path, models, build={"gpu": gpu})
    place_all(spec, models)
    edit_checkpoint_config(spec.checkpoint_dir("draft"), **{"quantization.quant_algo": quant,
                                                            "quantization.kv_cache_quant_algo": kv})
    message = only(problems_of(spec))
    assert message.startswith("draft engine: checkpoint ") and refused in message


def test_blackwell_sm100_refuses_an_int8_kv_cache(tmp_path: Path, models: dict[str, Path]) -> None:
    """builder.py `build()`: `has_int8_kv_cache()` on SM 100-119 is "INT8/INT4 quantization is not supported on
    SM>=100." too (the lost paged context FMHA is only a warning without draft-target)."""
    spec = write_pipeline(tmp_path, models, mode="none", build={"gpu": "B200"})
    place_all(spec, models)
    edit_checkpoint_config(spec.checkpoint_dir("target"), **{"quantization.kv_cache_quant_algo": "INT8"})
    message = only(problems_of(spec))
    assert "target engine: checkpoint kv_cache_quant_algo=INT8 cannot be built for B200" in message
    assert "INT8/INT4 quantization is not supported on SM>=100." in message


@pytest.mark.parametrize(
    ("gpu", "quant"),
    [("RTX 5090", "W8A8_SQ_PER_CHANNEL"), ("12.0", "W4A16_AWQ"), ("B200", "FP8"), ("GB200", None),
     ("H100", "W8A8_SQ_PER_CHANNEL"), ("A100", "W8A16")],
)
def test_the_sm100_refusal_spares_sm120_fp8_and_pre_blackwell_gpus(tmp_path: Path, models: dict[str, Path], gpu: str,
                                                                  quant: str | None) -> None:
    """builder.py `build()` checks `get_sm_version() >= 100 and get_sm_version() < 120`: SM 120 (RTX 50xx, RTX PRO
    Blackwell) builds SmoothQuant and int4 engines, and FP8 / unquantized builds on every Blackwell part."""
    spec = write_pipeline(tmp_path, models, build={"gpu": gpu})
    place_all(spec, models)
    edit_checkpoint_config(spec.checkpoint_dir("draft"), **{"quantization.quant_algo": quant})
    planned(spec)


@pytest.mark.parametrize(
    ("quant", "kv", "shown", "reason"),
    [
        ("W8A8_SQ_PER_CHANNEL", "FP8", "quant_algo=W8A8_SQ_PER_CHANNEL (draft.quantization.format int8_sq) with "
         "kv_cache_quant_algo=FP8 (draft.quantization.kv_cache fp8)",
         "FP8 Paged Context FMHA is disabled because FP8 context FMHA is disabled."),
        (None, "FP8", "quant_algo=null with kv_cache_quant_algo=FP8", "FP8 Paged Context FMHA is disabled"),
        ("W8A16", "FP8", "int8_wo", "FP8 Paged Context FMHA is disabled"),
        ("W4A16_AWQ", "FP8", "int4_awq", "FP8 Paged Context FMHA is disabled"),
        (None, "INT8", "kv_cache_quant_algo=INT8",
         "Paged Context FMHA is disabled because it doesn't work with int8 kv cache currently."),
    ],
)
def test_a_draft_target_engine_that_loses_paged_context_fmha(tmp_path: Path, models: dict[str, Path],
                                                             quant: str | None, kv: str, shown: str,
                                                             reason: str) -> None:
    """builder.py `build()` ("Logics to control paged_context_fmha and fp8_context_fmha"): a quant_algo other than
    FP8/W4A8_AWQ/NVFP4 turns FP8 context FMHA off, and with an FP8 KV cache `use_paged_context_fmha` off too; an INT8
    KV cache always turns it off. It only logs a warning; draft-target serving needs it (KV-cache reuse)."""
    spec = write_pipeline(tmp_path, models)
    place_all(spec, models)
    edit_checkpoint_config(spec.checkpoint_dir("draft"), **{"quantization.quant_algo": quant,
                                                            "quantization.kv_cache_quant_algo": kv})
    message = only(problems_of(spec))
    assert message.startswith("draft engine: checkpoint ") and shown in message
    assert f"without paged context FMHA (\"{reason}" in message
    assert "draft-target serving needs on both engines" in message and "draft.quantization.kv_cache to" in message


def test_paged_context_fmha_loss_only_warns_without_draft_target(tmp_path: Path, models: dict[str, Path]) -> None:
    """Same builder.py rule; a plain engine still builds and serves without KV-cache reuse, so it is a warning."""
    spec = write_pipeline(tmp_path, models, mode="none")
    place_all(spec, models)
    edit_checkpoint_config(spec.checkpoint_dir("target"), **{"quantization.kv_cache_quant_algo": "FP8"})
    out = io.StringIO()
    planned(spec, out)
    assert "warning: target engine: checkpoint quant_algo=null with kv_cache_quant_algo=FP8 is built by " \
           "TensorRT-LLM 1.2 without paged context FMHA" in out.getvalue()


@pytest.mark.parametrize("quant", ["FP8", "W4A8_AWQ"])
def test_fp8_kv_cache_with_fp8_context_fmha_keeps_paged_context_fmha(tmp_path: Path, models: dict[str, Path],
                                                                     quant: str) -> None:
    """builder.py `build()`: FP8 and W4A8_AWQ (and NVFP4) keep paged context FMHA with an FP8 KV cache, and then
    *enable* FP8 context FMHA whatever --use_fp8_context_fmha says ("FP8 Context FMHA is enabled to support FP8 Paged
    Context FMHA."), so the plan passes enable for both."""
    spec = write_pipeline(tmp_path, models, build={"gpu": "H100"})
    place_all(spec, models)
    edit_checkpoint_config(spec.checkpoint_dir("draft"), **{"quantization.quant_algo": quant,
                                                            "quantization.kv_cache_quant_algo": "FP8"})
    draft = {r.role: r for r in planned(spec)}["draft"].plan
    args = draft.args()
    assert draft.fp8_context_fmha and args[args.index("--use_fp8_context_fmha") + 1] == "enable"


@pytest.mark.parametrize(("mode", "engines"), [("none", ["target"]), ("medusa", ["medusa"])])
def test_max_num_tokens_above_batch_times_sequence_length(tmp_path: Path, models: dict[str, Path], mode: str,
                                                          engines: list[str]) -> None:
    """_common.py `check_max_num_tokens()` lowers max_num_tokens to max_batch_size x max_seq_len (before builder.py
    adds max_draft_len), so the engine's build_config.max_num_tokens would fail the post-build plan check."""
    spec = write_pipeline(tmp_path, models, mode=mode, build={"max_num_tokens": 8192})  # batch 2 x (32 + 16)
    place_all(spec, models)
    message = only(problems_of(spec))
    assert message.startswith(f"{engines[0]} engine: build.max_num_tokens 8192 is more than max_batch_size x "
                              "(max_input_len + max_output_len) = 2 x 48 = 96; trtllm-build lowers it to 96")
    assert "set build.max_num_tokens to at most 96" in message


def test_max_num_tokens_below_tokens_per_block_warns(tmp_path: Path, models: dict[str, Path]) -> None:
    """_common.py `check_max_num_tokens()` raises max_num_tokens below tokens_per_block (32) to 32 when context FMHA
    is on, and says chunked context is then needed."""
    spec = write_pipeline(tmp_path, models, mode="none", build={"max_num_tokens": 16})
    place_all(spec, models)
    out = io.StringIO()
    planned(spec, out)
    assert "warning: target engine: build.max_num_tokens 16 is less than tokens_per_block (32); trtllm-build " \
           "raises it to 32" in out.getvalue()


def test_default_max_num_tokens_is_never_below_tokens_per_block(tmp_path: Path, models: dict[str, Path]) -> None:
    """Same `check_max_num_tokens()` rule: specbuild's own default already asks for what the engine gets."""
    spec = write_pipeline(tmp_path, models, mode="none", build={"max_batch_size": 1, "max_input_len": 8,
                                                                "max_output_len": 8})
    place_all(spec, models)
    out = io.StringIO()
    [result] = planned(spec, out)
    assert result.plan.max_num_tokens == 32 and "warning" not in out.getvalue()


def test_formats_table_maps_both_ways() -> None:
    """Build names a checkpoint's quant_algo by the spec format that exports it, and deploy expects that
    quant_algo back, from the one table convert runs (specbuild.contracts.quant_formats): every format is found
    again from its algorithm."""
    from specbuild.contracts.quant_formats import FORMATS, KV_FORMATS, format_of, kv_format_of, quant_algo

    assert all(format_of(fmt.quant_algo) == name and quant_algo(name) == fmt.quant_algo
               for name, fmt in FORMATS.items())
    assert all(kv_format_of(kv.kv_cache_quant_algo) == name for name, kv in KV_FORMATS.items())
    assert quant_algo("none") is None and format_of("W4A16") is None  # TensorRT-LLM names specbuild does not offer
