"""Build plans render to the exact `trtllm-build` argument lists of TensorRT-LLM 1.2.

Contract tests: the expected lists were written by hand from NVIDIA/TensorRT-LLM (1.x line)
`examples/medusa/README.md` and `tensorrt_llm/builder.py` `build()` @008b2b8d (Medusa build; with a speculative
mode `max_seq_len` grows by `max_draft_len`), `examples/draft_target_model/README.md` @567239fc (draft-target
build: target with `--speculative_decoding_mode draft_tokens_external --max_draft_len K`, paged context FMHA on
both, `--gather_generation_logits` on both with logits) and `tensorrt_llm/commands/build.py` @65f1d153 with
`tensorrt_llm/plugin/plugin.py` @c20322ff (flag names/defaults), and every flag and value is checked against the
1.2 flag table in tests/trtllm_1_2_flags.py (same source).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from specbuild.build.plan import BuildPlan, plan_pipeline
from specbuild.contracts.checkpoint_facts import CheckpointFacts
from specbuild.contracts.engine_limits import default_max_num_tokens
from specbuild.spec import PipelineSpec, parse_spec
from tests.trtllm_1_2_flags import flag_problems

ROOT = Path("/models")
COMMON = [
    "--max_beam_width", "1", "--kv_cache_type", "paged", "--gpt_attention_plugin", "auto", "--gemm_plugin", "auto",
    "--context_fmha", "enable", "--remove_input_padding", "enable", "--use_paged_context_fmha", "enable",
    "--tokens_per_block", "32",
]


def spec_of(mode: str = "none", speculative: dict[str, Any] | None = None, build: dict[str, Any] | None = None,
            choices: Any = None) -> PipelineSpec:
    data: dict[str, Any] = {
        "name": "p", "output_dir": "/out", "target": {"model": "/models/target"},
        "speculative": {"mode": mode, **(speculative or {})},
        "build": {"max_batch_size": 4, "max_input_len": 1000, "max_output_len": 200, **(build or {})},
    }
    if mode == "draft_target":
        data["draft"] = {"model": "/models/draft"}
    if mode == "medusa":
        data["medusa"] = {"heads": "/models/heads", "choices": choices or "mc_sim_7b_63"}
    return parse_spec(data, "/specs/p.yaml")


def facts(role: str, quant: str | None = None, kv: str | None = None) -> CheckpointFacts:
    return CheckpointFacts(role, Path(f"/out/checkpoints/{role}"), "LlamaForCausalLM", "float16", 32000, 1, 1,
                           32, 8, 128, quant, kv)


def plans_of(spec: PipelineSpec, **by_role: CheckpointFacts) -> dict[str, BuildPlan]:
    return {plan.role: plan for plan in plan_pipeline(spec, dict(by_role))}


def test_plain_target_renders_the_hand_checked_arguments() -> None:
    plans = plans_of(spec_of())
    assert list(plans) == ["target"]
    assert plans["target"].command() == [
        "trtllm-build", "--checkpoint_dir", "/out/checkpoints/target", "--output_dir", "/out/engines/target",
        "--max_batch_size", "4", "--max_input_len", "1000", "--max_seq_len", "1200", "--max_num_tokens", "4000",
        *COMMON, "--use_fp8_context_fmha", "disable", "--workers", "1",
    ]
    assert plans["target"].engine_max_seq_len == 1200


def test_a_plan_is_the_spec_limits_plus_what_trtllm_build_needs() -> None:
    """The plan is the EngineLimits deploy checks engine.json against, unchanged, plus paths and build options;
    the manifest and build.sh record it with the keys in the order they always had."""
    from dataclasses import fields

    from specbuild.contracts.engine_limits import EngineLimits, engine_limits

    spec = spec_of("draft_target", {"num_draft_tokens": 5, "use_draft_logits": True})
    for role, plan in plans_of(spec).items():
        limits = engine_limits(spec, role)
        assert isinstance(plan, EngineLimits)
        assert {f.name: getattr(plan, f.name) for f in fields(EngineLimits)} == vars(limits)
        assert list(plan.to_json()) == [
            "role", "checkpoint_dir", "output_dir", "max_batch_size", "max_input_len", "max_seq_len",
            "max_num_tokens", "speculative_decoding_mode", "max_draft_len", "gather_generation_logits",
            "gather_context_logits", "fp8_context_fmha", "workers", "medusa_choices"]


def test_draft_target_builds_a_verifying_target_and_a_plain_draft() -> None:
    """Both engines see the whole sequence so far as their input (NVIDIA/TensorRT-LLM
    `triton_backend/all_models/inflight_batcher_llm/tensorrt_llm_bls/1/lib/decode.py` @4db68284 `_spec_generate`)."""
    plans = plans_of(spec_of("draft_target", {"num_draft_tokens": 5}))
    assert list(plans) == ["target", "draft"]
    sizes = ["--max_batch_size", "4", "--max_input_len", "1199", "--max_seq_len", "1200", "--max_num_tokens", "4796"]
    assert plans["target"].args() == [
        "--checkpoint_dir", "/out/checkpoints/target", "--output_dir", "/out/engines/target", *sizes, *COMMON,
        "--use_fp8_context_fmha", "disable",
        "--speculative_decoding_mode", "draft_tokens_external", "--max_draft_len", "5", "--workers", "1",
    ]
    assert plans["draft"].args() == [
        "--checkpoint_dir", "/out/checkpoints/draft", "--output_dir", "/out/engines/draft", *sizes, *COMMON,
        "--use_fp8_context_fmha", "disable", "--workers", "1",
    ]
    # trtllm-build adds max_draft_len to max_seq_len under a speculative mode (NVIDIA/TensorRT-LLM
    # tensorrt_llm/builder.py build() @008b2b8d); the engine's limit says so.
    assert plans["target"].engine_max_seq_len == 1205
    assert plans["draft"].engine_max_seq_len == 1200


def test_draft_logits_put_gather_generation_logits_on_both_engines() -> None:
    plans = plans_of(spec_of("draft_target", {"num_draft_tokens": 4, "use_draft_logits": True}))
    for role in ("target", "draft"):
        assert "--gather_generation_logits" in plans[role].args()
    plain = plans_of(spec_of("draft_target"))
    assert all("--gather_generation_logits" not in plan.args() for plan in plain.values())


def test_engine_max_draft_len_can_exceed_k() -> None:
    plan = plans_of(spec_of("draft_target", {"num_draft_tokens": 4, "max_draft_len": 10}))["target"]
    args = plan.args()
    assert args[args.index("--max_draft_len") + 1] == "10"


def test_medusa_is_one_engine_sized_by_its_tree() -> None:
    plans = plans_of(spec_of("medusa"))  # mc_sim_7b_63: 63 nodes
    assert list(plans) == ["medusa"]
    plan = plans["medusa"]
    assert plan.args() == [
        "--checkpoint_dir", "/out/checkpoints/medusa", "--output_dir", "/out/engines/medusa",
        "--max_batch_size", "4", "--max_input_len", "1000", "--max_seq_len", "1200", "--max_num_tokens", "4000",
        *COMMON, "--use_fp8_context_fmha", "disable",
        "--speculative_decoding_mode", "medusa", "--max_draft_len", "63", "--workers", "1",
    ]
    assert plan.max_num_tokens >= 4 * (63 + 1)
    assert plan.medusa_choices is not None and len(plan.medusa_choices) == 63


def test_fp8_context_fmha_only_for_an_fp8_checkpoint_with_an_fp8_kv_cache() -> None:
    spec = spec_of()
    on = plans_of(spec, target=facts("target", "FP8", "FP8"))["target"].args()
    off = plans_of(spec, target=facts("target", "FP8"))["target"].args()
    assert on[on.index("--use_fp8_context_fmha") + 1] == "enable"
    assert off[off.index("--use_fp8_context_fmha") + 1] == "disable"


def test_parallel_checkpoints_build_with_one_worker_per_rank() -> None:
    args = plans_of(spec_of(build={"tp_size": 2, "pp_size": 2}))["target"].args()
    assert args[args.index("--workers") + 1] == "4"
    # 1.x takes the mapping from the checkpoint only (NVIDIA/TensorRT-LLM tensorrt_llm/commands/build.py @65f1d153)
    assert "--tp_size" not in args


@pytest.mark.parametrize(
    "spec",
    [
        spec_of(),
        spec_of("draft_target", {"num_draft_tokens": 8, "use_draft_logits": True}),
        spec_of("draft_target", build={"gather_context_logits": True, "max_num_tokens": 16384}),
        spec_of("medusa", choices="mc_sim_7b_top8"),
        spec_of(build={"tp_size": 2, "gather_context_logits": True}),
    ],
    ids=["plain", "draft-target-logits", "draft-target-context-logits", "medusa", "tp2"],
)
def test_every_flag_and_value_is_in_the_trtllm_1_2_table(spec: PipelineSpec) -> None:
    for plan in plan_pipeline(spec, {role: facts(role, "FP8", "FP8") for role in ("target", "draft", "medusa")}):
        assert flag_problems(plan.args()) == [], plan.role


def test_the_flag_table_rejects_flags_1_2_no_longer_has() -> None:
    assert flag_problems(["--paged_kv_cache", "enable"]) != []
    assert flag_problems(["--use_paged_context_fmha", "true"]) != []
    assert flag_problems(["--speculative_decoding_mode", "draft_target"]) != []


@pytest.mark.parametrize(
    ("batch", "input_len", "draft", "expected"),
    [
        (4, 1000, 0, 4000),  # every prompt of a full batch in one step
        (64, 4096, 0, 8192),  # capped at trtllm-build's default...
        (1, 16384, 0, 16384),  # ...but never below one whole prompt
        (256, 16, 63, 256 * 64),  # and never below one verification step of a full batch
    ],
)
def test_default_max_num_tokens(batch: int, input_len: int, draft: int, expected: int) -> None:
    assert default_max_num_tokens(batch, input_len, draft) == expected


def test_spec_max_num_tokens_is_passed_as_given() -> None:
    args = plans_of(spec_of(build={"max_num_tokens": 2048}))["target"].args()
    assert args[args.index("--max_num_tokens") + 1] == "2048"
