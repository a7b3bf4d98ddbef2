"""The spec as `python -m sglang.launch_server --model-path <target> ... --speculative-algorithm ...`.

SGLang takes speculation as flat flags (`sources.SGLANG_SPECULATIVE_DOCS`). A draft-target spec with K draft tokens
is STANDALONE drafting K steps with one candidate per step (topk 1), which verifies K + 1 tokens (the docs: with
topk 1, num_draft_tokens becomes num_steps + 1); EAGLE-3 is the same with EAGLE3 and the EAGLE-3 draft, n-gram is
NGRAM proposing a chain of K (num_draft_tokens K + 1 there too: its corpus counts the last verified token). SGLang
has no Medusa. A quantized draft is convert's ModelOpt export on build.flow:
pytorch (`--speculative-draft-model-quantization modelopt`), or fp8 applied while loading on build.flow: engine
(`draft.ENGINE_QUANTIZATION`). The same flags are written as the YAML file
`launch_server --config` reads (keys without the leading dashes, `sources.SGLANG_SERVER_ARGS_DOCS`).

A draft KV cache format is `--speculative-draft-kv-cache-dtype`, the draft's pool alone (the target's keeps
--kv-cache-dtype's default). Load-aware speculation (draft_len_schedule, max_concurrency) is SGLang's adaptive
speculation with one candidate step count per batch-size tier (`--speculative-adaptive`, `adaptive_config`): EAGLE3
only, since SGLang 0.5.23 switches adaptive speculation off for every other algorithm (`sources.SGLANG_ADAPTIVE`).
"""

from __future__ import annotations

import json
from pathlib import Path

from specbuild.contracts.quant_formats import NONE
from specbuild.export.draft import DraftLoad, draft_load
from specbuild.export.plan import (
    MEDUSA_INSTEAD,
    ExportPlan,
    Option,
    batch_schedule,
    command_line,
    load_notes,
    longest_ngram,
    ngram_notes,
    refuse,
)
from specbuild.export.sources import (
    SGLANG_ADAPTIVE,
    SGLANG_DRAFT_KV,
    SGLANG_NGRAM_PARAM,
    SGLANG_SERVER_ARGS_DOCS,
    SGLANG_SPEC_FIELDS,
    SGLANG_SPECULATIVE_DOCS,
)
from specbuild.spec import PipelineSpec

ENGINE = "sglang"
DISPLAY = "SGLang"
PROGRAM = ("python", "-m", "sglang.launch_server")
CONFIG_FILE = "config.yaml"
ADAPTIVE_FILE = "speculative_adaptive.json"

OPTIONS = (
    Option("--model-path", SGLANG_SERVER_ARGS_DOCS, lambda s: s.target.model),
    Option("--served-model-name", SGLANG_SERVER_ARGS_DOCS, lambda s: s.name),
    Option("--tp-size", SGLANG_SERVER_ARGS_DOCS, lambda s: s.build.tp_size),
    Option("--pp-size", SGLANG_SERVER_ARGS_DOCS, lambda s: s.build.pp_size),
    Option("--context-length", SGLANG_SERVER_ARGS_DOCS, lambda s: s.build.max_seq_len),
    Option("--max-running-requests", SGLANG_SERVER_ARGS_DOCS, lambda s: s.build.max_batch_size),
    Option("--dtype", SGLANG_SERVER_ARGS_DOCS, lambda s: s.build.dtype),  # auto, float16, bfloat16, float32
    Option("--trust-remote-code", SGLANG_SERVER_ARGS_DOCS, lambda s: s.target.trust_remote_code),
)


def _k(spec: PipelineSpec) -> int:
    return spec.speculative.num_draft_tokens


ALGORITHM = {"draft_target": "STANDALONE", "eagle3": "EAGLE3", "ngram": "NGRAM", "mtp": "NEXTN"}
"""speculative.mode -> --speculative-algorithm."""


DRAFT_KV_CACHE: dict[str, str] = {"fp8": "fp8_e4m3"}
"""draft.quantization.kv_cache -> --speculative-draft-kv-cache-dtype (choices auto, fp8_e5m2, fp8_e4m3, bf16, bfloat16
in the 0.5.23 wheel, SGLANG_DRAFT_KV): the spec's fp8 is E4M3, as TensorRT-LLM's FP8 KV cache and ModelOpt's."""


def _draft_kv_cache(spec: PipelineSpec) -> str | None:
    assert spec.draft is not None
    kv = spec.draft.quantization.kv_cache
    if kv == NONE:
        return None
    if kv not in DRAFT_KV_CACHE:
        raise refuse(spec, DISPLAY, f"draft.quantization.kv_cache {kv}",
                     f"--speculative-draft-kv-cache-dtype has no {kv} (auto, fp8_e5m2, fp8_e4m3, bf16, bfloat16; "
                     f"{SGLANG_DRAFT_KV})",
                     hint=f"set draft.quantization.kv_cache to one of {', '.join([NONE, *DRAFT_KV_CACHE])} for "
                          "this export")
    return DRAFT_KV_CACHE[kv]


def adaptive_config(spec: PipelineSpec) -> dict[str, dict[str, list[int]]] | None:
    """The spec's draft lengths by load as SGLang's adaptive config: one tier per batch size a length starts at
    (`plan.batch_schedule`), each with that one step count, so SGLang runs exactly the spec's K there (a tier's
    slot is the largest key <= the running batch size, after SGLang pads it up to a CUDA-graph batch size;
    SGLANG_ADAPTIVE). None without draft_len_schedule and max_concurrency."""
    ranges = batch_schedule(spec)
    if ranges is None:
        return None
    return {str(first): {"candidate_steps": [length]} for first, _, length in ranges}


def drafted(load: DraftLoad) -> tuple[Option, ...]:
    """STANDALONE and EAGLE3: K steps of one candidate each, K + 1 tokens verified, from the draft `load` names."""
    return (
        Option("--speculative-algorithm", SGLANG_SPECULATIVE_DOCS, lambda s: ALGORITHM[s.speculative.mode]),
        Option("--speculative-draft-model-path", SGLANG_SPECULATIVE_DOCS, lambda s: load.model),
        Option("--speculative-num-steps", SGLANG_SPECULATIVE_DOCS, _k),
        Option("--speculative-eagle-topk", SGLANG_SPECULATIVE_DOCS, lambda s: 1),
        Option("--speculative-num-draft-tokens", SGLANG_SPECULATIVE_DOCS, lambda s: _k(s) + 1),
        Option("--speculative-draft-model-quantization", SGLANG_SPECULATIVE_DOCS, lambda s: load.quantization),
        Option("--speculative-draft-kv-cache-dtype", SGLANG_DRAFT_KV, _draft_kv_cache),
    )


def trie_depth(spec: PipelineSpec) -> int:
    """--speculative-ngram-max-trie-depth: the trie stores (and matches) sequences up to this long, so a match of the
    longest n-gram (max_matching_ngram_size) can still propose K tokens after it (sglang 0.5.23 trie.cpp: a match of
    depth d continues at most depth - d tokens)."""
    return longest_ngram(spec) + _k(spec)


# sglang 0.5.23's n-gram options: sgl-project/sglang python/sglang/srt/arg_groups/fields/spec.py@015c872628e3
# (SGLANG_SPEC_FIELDS) and the K + 1 of python/sglang/kernels/jit/csrc/ngram_corpus/param.h@01a8b7f0f911
# (SGLANG_NGRAM_PARAM). Breadth 1 makes the proposal one chain of K, as TensorRT-LLM's NGram and vLLM's ngram propose.
NGRAM = (
    Option("--speculative-algorithm", SGLANG_SPECULATIVE_DOCS, lambda s: "NGRAM"),
    Option("--speculative-num-draft-tokens", SGLANG_NGRAM_PARAM, lambda s: _k(s) + 1),
    Option("--speculative-ngram-min-bfs-breadth", SGLANG_SPEC_FIELDS, lambda s: 1),
    Option("--speculative-ngram-max-bfs-breadth", SGLANG_SPEC_FIELDS, lambda s: 1),
    Option("--speculative-ngram-max-trie-depth", SGLANG_SPEC_FIELDS, trie_depth),
)

# NEXTN: the target's own MTP layers; SGLang turns it into EAGLE with the target itself as the draft (no draft path
# is given), K steps of one candidate, K + 1 tokens verified, as drafted() runs a draft.
NEXTN = (
    Option("--speculative-algorithm", SGLANG_SPECULATIVE_DOCS, lambda s: "NEXTN"),
    Option("--speculative-num-steps", SGLANG_SPECULATIVE_DOCS, _k),
    Option("--speculative-eagle-topk", SGLANG_SPECULATIVE_DOCS, lambda s: 1),
    Option("--speculative-num-draft-tokens", SGLANG_SPECULATIVE_DOCS, lambda s: _k(s) + 1),
)


def _check_draft(spec: PipelineSpec) -> list[str]:
    assert spec.draft is not None
    _draft_kv_cache(spec)  # refused before anything is written
    notes = []
    if spec.speculative.use_draft_logits:
        notes.append("speculative.use_draft_logits: not exported; SGLang has no option for how a draft is accepted")
    eagle3 = spec.speculative.eagle3
    if eagle3 is not None and eagle3.eagle3_layers_to_capture is not None:
        notes.append("speculative.eagle3.eagle3_layers_to_capture: not exported; SGLang takes the layers from the "
                     "draft checkpoint")
    return notes


def build_plan(spec: PipelineSpec, directory: Path) -> ExportPlan:
    """The command and config for `spec`; `directory` is where the export goes, which the command names the adaptive
    config in (EAGLE3 with a load setting)."""
    mode = spec.speculative.mode
    notes: list[str] = []
    options = list(OPTIONS)
    sources = [SGLANG_SERVER_ARGS_DOCS] + ([SGLANG_SPECULATIVE_DOCS] if mode != "none" else [])
    files: dict[str, str] = {}
    by_load = False
    if mode in ("draft_target", "eagle3"):
        load = draft_load(spec, ENGINE)  # refused before the KV cache, as vLLM does
        notes += [*load.notes, *_check_draft(spec)]
        sources += [source for source in load.sources if source not in sources]
        sources += [SGLANG_DRAFT_KV] if spec.draft is not None and spec.draft.quantization.kv_cache != NONE else []
        options += drafted(load)
        tiers = adaptive_config(spec) if mode == "eagle3" else None
        if tiers is not None:
            by_load = True
            files[ADAPTIVE_FILE] = json.dumps(tiers, indent=2) + "\n"
            path = directory / ADAPTIVE_FILE
            options += [Option("--speculative-adaptive", SGLANG_ADAPTIVE, lambda s: True),
                        Option("--speculative-adaptive-config", SGLANG_ADAPTIVE, lambda s: path)]
            sources.append(SGLANG_ADAPTIVE)
            notes.append("speculative.draft_len_schedule / max_concurrency: SGLang looks the running batch size up "
                         "after padding it to a CUDA-graph batch size, so a batch between two graph sizes drafts "
                         "the larger one's length")
    elif mode == "ngram":
        notes += ngram_notes(spec, "SGLang's NGRAM")
        notes.append(f"speculative.ngram.max_matching_ngram_size {longest_ngram(spec)}: SGLang has no separate limit "
                     "on the suffix it matches; --speculative-ngram-max-trie-depth "
                     f"{trie_depth(spec)} (that length plus K) bounds the match and the proposal together")
        sources += [SGLANG_SPEC_FIELDS, SGLANG_NGRAM_PARAM]
        options += NGRAM
    elif mode == "mtp":
        options += NEXTN
    elif mode == "medusa":
        raise refuse(spec, DISPLAY, "speculative.mode medusa",
                     "SGLang has no Medusa: --speculative-algorithm takes EAGLE, EAGLE3, STANDALONE, NGRAM and NEXTN "
                     f"({SGLANG_SPECULATIVE_DOCS})",
                     hint=MEDUSA_INSTEAD)
    elif mode == "lookahead":
        raise refuse(spec, DISPLAY, "speculative.mode lookahead",
                     "SGLang has no Lookahead decoding: --speculative-algorithm takes EAGLE, EAGLE3, STANDALONE, NGRAM "
                     f"and NEXTN ({SGLANG_SPECULATIVE_DOCS})",
                     hint="serve it with TensorRT-LLM (`specbuild deploy`), or export speculative.mode ngram")
    elif mode == "sa":
        raise refuse(spec, DISPLAY, "speculative.mode sa",
                     "SGLang has no suffix-automaton drafting: --speculative-algorithm takes EAGLE, EAGLE3, "
                     f"STANDALONE, NGRAM and NEXTN ({SGLANG_SPECULATIVE_DOCS})",
                     hint="serve it with TensorRT-LLM's PyTorch backend (`specbuild deploy`), or export "
                          "speculative.mode ngram")
    elif mode != "none":
        raise refuse(spec, DISPLAY, f"speculative.mode {mode}", "specbuild does not export this mode to SGLang yet")
    if mode != "none":
        notes += load_notes(spec, DISPLAY, by_load=by_load)
        if not by_load and (spec.speculative.draft_len_schedule is not None
                            or spec.speculative.max_concurrency is not None):
            notes.append(f"SGLang's only load lever, --speculative-adaptive (step counts by batch size), runs with "
                         f"EAGLE and EAGLE3 alone; {ALGORITHM[mode]} keeps one K ({SGLANG_ADAPTIVE})")
    argv = command_line(PROGRAM, options, spec)
    files[CONFIG_FILE] = config_yaml(argv[len(PROGRAM):])
    return ExportPlan(ENGINE, argv, files, sources, notes)


def config_yaml(flags: list[str]) -> str:
    """The flags as `launch_server --config` YAML: `name: value`, a bare switch as `name: true`."""
    import yaml

    mapping: dict[str, object] = {}
    index = 0
    while index < len(flags):
        name = flags[index].removeprefix("--")
        following = flags[index + 1] if index + 1 < len(flags) else None
        if following is None or following.startswith("--"):
            mapping[name], index = True, index + 1
        else:
            mapping[name], index = _scalar(following), index + 2
    return yaml.safe_dump(mapping, sort_keys=False)


def _scalar(text: str) -> object:
    return int(text) if text.lstrip("-").isdigit() else text
