"""The spec as `vllm serve <target> ... --speculative-config '<json>'`.

Limits map one to one (tp, pp, max_model_len = max_input_len + max_output_len, max_num_seqs = max_batch_size); the
speculative method is one JSON object whose keys are SpeculativeConfig's fields (`sources.VLLM_SPECULATIVE`).
The draft stays the Hugging Face checkpoint the spec names: specbuild's quantized draft is a TensorRT-LLM
checkpoint, which vLLM does not read, so a quantization is passed only where vLLM applies it while loading.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specbuild.export.medusa_heads import CONFIG_SOURCE, MEDUSA_DIR, MODEL_SOURCE, VllmMedusaHeads, convert_heads
from specbuild.export.plan import ExportPlan, Option, command_line, refuse
from specbuild.export.sources import VLLM_CACHE, VLLM_ENGINE_ARGS, VLLM_QUANTIZATION, VLLM_SPECULATIVE
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
)
SPECULATIVE_FLAG = Option("--speculative-config", VLLM_ENGINE_ARGS, lambda s: None)

DRAFT_QUANTIZATION = {"none": None, "fp8": "fp8"}
"""draft.quantization.format -> SpeculativeConfig.quantization (VLLM_QUANTIZATION): fp8 needs no calibration, so
vLLM applies it to the unquantized draft while loading; the others need a checkpoint quantized ahead."""
DRAFT_KV_CACHE = {"none": None, "fp8": "fp8"}
"""draft.quantization.kv_cache -> SpeculativeConfig.kv_cache_dtype (a CacheDType, VLLM_CACHE): the draft's alone."""


def _draft_model(spec: PipelineSpec, notes: list[str], method: str = "draft_model") -> dict[str, Any]:
    assert spec.draft is not None
    quant = spec.draft.quantization
    if quant.format not in DRAFT_QUANTIZATION:
        raise refuse(
            spec, DISPLAY, f"draft.quantization.format {quant.format}",
            f"vLLM reads {quant.format} only from a checkpoint quantized ahead in its own formats, and specbuild's "
            f"quantized draft is a TensorRT-LLM checkpoint; vLLM quantizes while loading only with fp8 "
            f"({VLLM_QUANTIZATION})",
            hint="set draft.quantization.format to fp8 or none for this export",
        )
    config: dict[str, Any] = {"method": method, "model": str(spec.draft.model),
                              "num_speculative_tokens": spec.speculative.num_draft_tokens}
    if DRAFT_QUANTIZATION[quant.format]:
        config["quantization"] = DRAFT_QUANTIZATION[quant.format]
    if DRAFT_KV_CACHE[quant.kv_cache]:
        config["kv_cache_dtype"] = DRAFT_KV_CACHE[quant.kv_cache]
    if spec.speculative.use_draft_logits:
        config["draft_sample_method"] = "probabilistic"  # accept by the draft's and the target's probabilities
    if spec.draft.trust_remote_code and not spec.target.trust_remote_code:
        notes.append("draft.trust_remote_code: vLLM loads the draft with the target's trust_remote_code (false)")
    return config


def _ngram(spec: PipelineSpec, notes: list[str]) -> dict[str, Any]:
    """Prompt lookup: the longest suffix tried is max_matching_ngram_size, down to one token (vLLM's min would
    otherwise default to the max)."""
    ngram = spec.speculative.ngram
    given = sorted(ngram.model_fields_set - {"max_matching_ngram_size"}) if ngram is not None else []
    if given:
        notes.append(f"speculative.ngram {', '.join(given)}: not exported; vLLM's ngram proposer has no such setting")
    longest = ngram.max_matching_ngram_size if ngram is not None else 2
    return {"method": "ngram", "num_speculative_tokens": spec.speculative.num_draft_tokens,
            "prompt_lookup_max": longest, "prompt_lookup_min": 1}


def _eagle3(spec: PipelineSpec, notes: list[str]) -> dict[str, Any]:
    eagle3 = spec.speculative.eagle3
    if eagle3 is not None and eagle3.eagle3_layers_to_capture is not None:
        notes.append("speculative.eagle3.eagle3_layers_to_capture: not exported; vLLM takes the layers from the "
                     "draft checkpoint's config (eagle_aux_hidden_state_layer_ids)")
    if eagle3 is not None and "eagle3_one_model" in eagle3.model_fields_set:
        notes.append("speculative.eagle3.eagle3_one_model: not exported; vLLM runs the draft in the target's engine")
    return _draft_model(spec, notes, "eagle3")


def _medusa(spec: PipelineSpec, directory: Path, heads: VllmMedusaHeads, notes: list[str]) -> dict[str, Any]:
    assert spec.medusa is not None
    depth = spec.medusa.depth
    if depth > heads.num_heads:
        raise refuse(spec, DISPLAY, f"medusa.choices (depth {depth})",
                     f"the heads in {spec.medusa.heads} are only {heads.num_heads}, one per proposed token")
    notes.append(f"medusa.choices: vLLM proposes one chain, each head's top-1 token ({MODEL_SOURCE}), not the "
                 f"{len(spec.medusa.resolved_choices())}-node tree; its length is the tree's depth, {depth}")
    return {"method": "medusa", "model": str(directory / MEDUSA_DIR), "num_speculative_tokens": depth}


def _unexported(spec: PipelineSpec) -> list[str]:
    said = []
    if spec.speculative.draft_len_schedule is not None:
        said.append("speculative.draft_len_schedule: not exported; vLLM speculates the same length at any load")
    if spec.speculative.max_concurrency is not None:
        said.append("speculative.max_concurrency: not exported; vLLM has no load above which it stops speculating")
    return said


def build_plan(spec: PipelineSpec, directory: Path, *, allow_pickle: bool = False) -> ExportPlan:
    """The command and config for `spec`, whose files will live in `directory`."""
    mode = spec.speculative.mode
    notes: list[str] = []
    heads: VllmMedusaHeads | None = None
    speculative: dict[str, Any] | None
    if mode == "none":
        speculative = None
    elif mode == "draft_target":
        speculative = _draft_model(spec, notes)
    elif mode == "ngram":
        speculative = _ngram(spec, notes)
    elif mode == "eagle3":
        speculative = _eagle3(spec, notes)
    elif mode == "medusa":
        assert spec.medusa is not None
        heads = convert_heads(spec.medusa.heads, spec.target.model, allow_pickle=allow_pickle)
        speculative = _medusa(spec, directory, heads, notes)
    else:
        raise refuse(spec, DISPLAY, f"speculative.mode {mode}", "specbuild does not export this mode to vLLM yet")
    if speculative is not None:
        notes += _unexported(spec)
    argv = command_line((*PROGRAM, str(spec.target.model)), OPTIONS, spec)
    files: dict[str, str] = {}
    sources = [VLLM_ENGINE_ARGS]
    if speculative is not None:
        text = json.dumps(speculative, separators=(",", ":"))
        argv += [SPECULATIVE_FLAG.flag, text]
        files[CONFIG_FILE] = json.dumps(speculative, indent=2) + "\n"
        sources.append(VLLM_SPECULATIVE)
        sources += [source for key, source in (("quantization", VLLM_QUANTIZATION), ("kv_cache_dtype", VLLM_CACHE))
                    if key in speculative]
    if heads is not None:
        sources += [MODEL_SOURCE, CONFIG_SOURCE]
    return ExportPlan(ENGINE, argv, files, sources, notes, heads)
