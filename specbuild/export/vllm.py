"""The spec as `vllm serve <target> ... --speculative-config '<json>'`.

Limits map one to one (tp, pp, max_model_len = max_input_len + max_output_len, max_num_seqs = max_batch_size); the
speculative method is one JSON object whose keys are SpeculativeConfig's fields (`sources.VLLM_SPECULATIVE`).
The draft is the Hugging Face checkpoint the spec names, or with draft.quantization on build.flow: pytorch convert's
ModelOpt export of it as quantization "modelopt"; on build.flow: engine only fp8, which vLLM applies while loading
(`draft.ENGINE_QUANTIZATION` says which format goes which way).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from specbuild.contracts.quant_formats import KV_FORMATS, NONE
from specbuild.export.draft import draft_load
from specbuild.export.medusa_heads import CONFIG_SOURCE, MEDUSA_DIR, MODEL_SOURCE, VllmMedusaHeads, convert_heads
from specbuild.export.plan import (
    SCRIPT_DIR_LINE,
    ExportPlan,
    Option,
    command_line,
    load_notes,
    longest_ngram,
    ngram_notes,
    refuse,
)
from specbuild.export.sources import VLLM_CACHE, VLLM_ENGINE_ARGS, VLLM_SPECULATIVE, Source
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


def _medusa(spec: PipelineSpec, directory: Path, heads: VllmMedusaHeads, notes: list[str]) -> dict[str, Any]:
    assert spec.medusa is not None
    depth = spec.medusa.depth
    if depth > heads.num_heads:
        raise refuse(spec, DISPLAY, f"medusa.choices (depth {depth})",
                     f"the heads in {spec.medusa.heads} are only {heads.num_heads}, one per proposed token")
    notes.append(f"medusa.choices: vLLM proposes one chain, each head's top-1 token ({MODEL_SOURCE}), not the "
                 f"{len(spec.medusa.resolved_choices())}-node tree; its length is the tree's depth, {depth}")
    return {"method": "medusa", "model": str(directory / MEDUSA_DIR), "num_speculative_tokens": depth}


UNQUOTED_DIR_CHECK = (
    r'case $here in *[\"\\]*)',
    r'  echo "$here: a path with a quote or a backslash cannot be pasted into --speculative-config (JSON); move the '
    r'export to a plainer path" >&2; exit 1;;',
    "esac",
)
"""serve.sh's refusal of a directory it cannot paste into the JSON (one clear message instead of vLLM's parse error)."""


def _script_command(argv: list[str], speculative: dict[str, Any]) -> str:
    """serve.sh's command, with the Medusa heads read from MEDUSA_DIR beside the script: the JSON is quoted in two
    parts around the model path, which the shell fills in from `$here` (SCRIPT_DIR_LINE; UNQUOTED_DIR_CHECK refuses
    a directory whose name JSON would need to escape)."""
    mark = json.dumps("\0")  # no path holds a NUL, so the split finds the model value alone
    before, after = json.dumps({**speculative, "model": "\0"}, separators=(",", ":")).split(mark)
    return f'{shlex.join(argv[:-1])} {shlex.quote(before)}"\\"$here/{MEDUSA_DIR}\\""{shlex.quote(after)}'


def build_plan(spec: PipelineSpec, directory: Path, *, allow_pickle: bool = False) -> ExportPlan:
    """The command and config for `spec`, whose files will live in `directory`."""
    mode = spec.speculative.mode
    notes: list[str] = []
    draft_sources: list[Source] = []
    heads: VllmMedusaHeads | None = None
    speculative: dict[str, Any] | None
    if mode == "none":
        speculative = None
    elif mode == "draft_target":
        speculative = _draft_model(spec, notes, draft_sources)
    elif mode == "ngram":
        speculative = _ngram(spec, notes)
    elif mode == "eagle3":
        speculative = _eagle3(spec, notes, draft_sources)
    elif mode == "medusa":
        assert spec.medusa is not None
        heads = convert_heads(spec.medusa.heads, spec.target.model, allow_pickle=allow_pickle)
        speculative = _medusa(spec, directory, heads, notes)
    elif mode == "lookahead":
        raise refuse(spec, DISPLAY, "speculative.mode lookahead",
                     "vLLM has no Lookahead decoding: SpeculativeConfig.method takes ngram, medusa, mlp_speculator, "
                     f"draft_model, suffix, the EAGLE/MTP family ({VLLM_SPECULATIVE})",
                     hint="serve it with TensorRT-LLM (`specbuild deploy`), or export speculative.mode ngram, the "
                          "nearest draft-free method vLLM has")
    else:
        raise refuse(spec, DISPLAY, f"speculative.mode {mode}", "specbuild does not export this mode to vLLM yet")
    if speculative is not None:
        notes += load_notes(spec, DISPLAY)
    argv = command_line((*PROGRAM, str(spec.target.model)), OPTIONS, spec)
    files: dict[str, str] = {}
    sources = [VLLM_ENGINE_ARGS]
    if speculative is not None:
        text = json.dumps(speculative, separators=(",", ":"))
        argv += [SPECULATIVE_FLAG.flag, text]
        files[CONFIG_FILE] = json.dumps(speculative, indent=2) + "\n"
        sources += [VLLM_SPECULATIVE, *draft_sources] + ([VLLM_CACHE] if "kv_cache_dtype" in speculative else [])
    plan = ExportPlan(ENGINE, argv, files, sources, notes, heads)
    if heads is not None and speculative is not None:
        plan.sources += [MODEL_SOURCE, CONFIG_SOURCE]
        plan.script_lines = [f"# The Medusa heads are read from {MEDUSA_DIR}/ beside this script ({CONFIG_FILE} and "
                             "manifest.json name where they were written).", SCRIPT_DIR_LINE, *UNQUOTED_DIR_CHECK]
        plan.script_command = _script_command(argv, speculative)
    return plan
