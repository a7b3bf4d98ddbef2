"""The serving engine that a reference `tensorrt_llm` model's config describes, built in one place.

The Triton adapter (`triton_models/tensorrt_llm/1/model.py`) serves it; the benches that run the same model
without Triton (bench/round_cost_bench.py, bench/medusa_cost_bench.py) build it here too, so what they measure is
what the server runs: the same checkpoint and dtype, Medusa tree, load schedule, Lookahead window, self-draft and
KV-cache rows, from the same parameters.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specbuild.python_models.llm_backend import BackendConfig
from specbuild.python_models.model_paths import parameter_path


def _quiet(_: str) -> None:
    pass


@dataclass
class LlmEngine:
    """One model instance's engine and what it was built from."""

    config: BackendConfig
    info: Any  # the engine directory's EngineInfo
    model: Any  # the CausalLM every engine of the instance shares
    engine: Any  # the ServingEngine, not started (its tree and schedule: `engine.choices`, `engine.schedule`)


def build_engine(params: Mapping[str, str], model_config: Mapping[str, Any], model_dir: Path, *,
                 log_info: Callable[[str], None] = _quiet,
                 log_warn: Callable[[str], None] = _quiet) -> LlmEngine:
    """The engine of a tensorrt_llm model whose directory is `model_dir`, from its parameters and model config.
    Raises `llm_backend.ModelLoadError` where the C++ backend would refuse to load; logs what it logs."""
    from specbuild.contracts.engine_info import ENGINE_INFO, read_engine_info, reference_checkpoint
    from specbuild.dtypes import torch_dtype
    from specbuild.medusa.choices import load_choices, parse_choices
    from specbuild.runtime.model import CausalLM
    from specbuild.runtime.schedule import DraftSchedule, served_steps
    from specbuild.runtime.serving import ServingEngine

    engine_dir = parameter_path(model_dir, params["gpt_model_path"])
    info = read_engine_info(engine_dir)
    config, warnings = BackendConfig.from_model(params, model_config, info)
    for warning in warnings:
        log_warn(warning)
    choices = None
    if config.medusa:
        if params.get("medusa_choices"):
            choices = parse_choices(params["medusa_choices"])
        else:
            from specbuild.spec.presets import DEFAULT_MEDUSA_CHOICES  # the C++ backend's default too

            log_warn("medusa_choices parameter is not specified. Will be using default "
                     f"{DEFAULT_MEDUSA_CHOICES} choices instead.")
            choices = load_choices(DEFAULT_MEDUSA_CHOICES)
    schedule = None
    # Only a model that speculates on its own (a Medusa tree, Lookahead, a self-draft) runs a schedule; the BLS's
    # target and draft engines are plain tensorrt_llm models and leave the BLS's to it.
    speculates = bool(choices) or config.lookahead or bool(params.get("self_draft_layers"))
    steps = served_steps(params.get("draft_len_schedule"), log_info) if speculates else {}
    if steps or params.get("max_concurrency"):
        schedule = DraftSchedule(steps, len(choices) if choices else info.max_draft_len,
                                 int(params["max_concurrency"]) if params.get("max_concurrency") else None)
    dtype = torch_dtype(info.dtype, where=f"{engine_dir / ENGINE_INFO}: dtype")  # unknown: an error, not float32
    model = CausalLM.from_checkpoint(reference_checkpoint(engine_dir), dtype=dtype)
    proposer = None
    if params.get("self_draft_layers"):  # a self-draft: this model drafts with its own layers and KV cache
        from specbuild.runtime.self_draft import self_draft_proposer, shared_memory

        k = int(params["self_draft_len"])
        proposer = self_draft_proposer(model, int(params["self_draft_layers"]), k,
                                       params.get("self_draft_checkpoint") or None)
        if schedule is not None:
            schedule = DraftSchedule(schedule.steps, k, schedule.max_concurrency)
        memory = shared_memory(model, proposer.draft)
        log_info(f"[TensorRT-LLM] self-draft of {params['self_draft_layers']} layers, K {k}: shares the "
                 f"target's weights and KV cache ({memory['shared_extra_params']} parameters of its own, "
                 f"{memory['shared_extra_kv_bytes_per_token']} KV bytes per token of its own)")
    engine = ServingEngine(model, max_batch=info.max_batch_size, max_seq_len=info.max_seq_len,
                           max_draft_len=info.max_draft_len, medusa_choices=choices,
                           kv_rows=int(params.get("kv_cache_slots") or 0), schedule=schedule,
                           lookahead=config.lookahead_config, proposer=proposer)
    return LlmEngine(config, info, model, engine)
