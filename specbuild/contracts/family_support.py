"""Which speculative method each engine runs on which model family, and the engine's own reason where it does not.

One table (`REFUSALS`) read by `specbuild validate` and by the first check of every stage (`family_problems`,
through `contracts.llm_api.flow_problems`), by `export`, by the trainers (`eagle train`, `self-draft train`), by
ModelOpt quantization (`MODELOPT_DECODER_TYPES`) and by convert's Medusa wrapper, so a family an engine cannot run a
method on is refused once, with the same words, before anything is loaded. A (family, method, engine) that is not
in the table is supported as far as this table knows: whether an engine runs a family at all is the converter's
(engine flow: `specbuild.convert.architectures`) or the engine's own loader's question.

Each entry was read in the engine's own code (methods without entries: TensorRT-LLM's Lookahead is "for any of
decoder-only autoregressive LLM models", examples/lookahead/README.md @7ed07f06; draft-target, NGram and SA take any
model the engine runs):
- TensorRT-LLM 1.2 engine flow, Medusa: NVIDIA/TensorRT-LLM examples/medusa/convert_checkpoint.py @b93e14ca
  asserts `--model_type in ["llama", "mixtral", "qwen2"]`, loads a qwen2 base with QWenForCausalLM and every other
  base as transformers' LlamaForCausalLM/MixtralForCausalLM (convert_hf_llama): a Qwen3 base would lose its q/k
  norms, Gemma its norms and soft-caps, Phi-3 its fused projections, GPT-2 everything.
- TensorRT-LLM PyTorch flow, any mode: GPT-2 has no model class there (tensorrt_llm/_torch/models has no
  modeling_gpt2.py and no `register_auto_model("GPT2LMHeadModel")` in the source index); the engine flow's
  MODEL_MAP has it (tensorrt_llm/models/__init__.py @02267d3d).
- TensorRT-LLM PyTorch flow, EAGLE-3: one-model EAGLE-3 needs the target's class to be a
  `SpecDecOneEngineForCausalLM`, and either mode needs its model's forward to hand hidden states to the draft
  (`spec_metadata`); these families are plain `DecoderModelForCausalLM`s whose forward takes no spec_metadata:
  tensorrt_llm/_torch/models/modeling_gemma3.py @00e7d103, modeling_gemma2.py @04d175ac, modeling_mixtral.py
  @000a01de, modeling_phi3.py @000a01de (Qwen3 and Qwen3-MoE are SpecDecOneEngineForCausalLM: modeling_qwen3.py
  @5dedf53b, modeling_qwen3_moe.py @03441af1).
- vLLM 0.33.0 (the installed engine `make test-engines` judges with), EAGLE-3: vllm/v1/worker/gpu_model_runner.py
  `_setup_eagle3_aux_hidden_state_outputs` raises RuntimeError("Model does not support EAGLE3 interface but
  aux_hidden_state_outputs was requested") unless the target class implements `SupportsEagle3`; Llama, Mistral
  and Phi-3 (llama.py, subclasses), Qwen2, Qwen3, Qwen3-MoE do; gemma2.py, gemma3.py, mixtral.py, gpt2.py do not.
- SGLang 0.5.23, EAGLE3: sglang/srt/model_executor/model_runner_components/attention_backend_setup.py
  `configure_aux_hidden_state_capture` raises ValueError("Model ... does not implement
  set_eagle3_layers_to_capture, which EAGLE3 aux hidden-state capture requires."); llama.py (with Mistral and
  Phi-3), qwen2.py, qwen3.py, qwen3_moe.py and gemma3_causal.py implement it; gemma2.py, mixtral.py, gpt2.py do not.
- ModelOpt 0.47 (`nvidia-modelopt`, installed), draft quantization: `export_tensorrt_llm_checkpoint`
  (modelopt/torch/export/model_config_export.py; decoder types from model_utils.py `MODEL_NAME_TO_TYPE`) under
  transformers 5.14, measured on the tiny checkpoints of tests/tiny_models.py (FP8): Qwen3 ("qwen") exports;
  Gemma 3 raises NotImplementedError("Cannot export tensorrt_llm checkpoint for model gemma3 ... not supported by
  TensorRT-LLM yet"); Gemma 2 and Phi-3 raise KeyError for their decoder types in the TensorRT-LLM export's
  tables; Qwen3-MoE and Mixtral raise TypeError("object of type 'QuantQwen3MoeExperts' / 'QuantMixtralExperts'
  has no len()"): transformers 5 keeps an MoE layer's experts in one fused module the 0.47 export cannot walk.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from specbuild.spec import PipelineSpec
    from specbuild.spec.problems import Loc

LLAMA, MISTRAL, QWEN2, GPT2 = "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "GPT2LMHeadModel"
QWEN3, QWEN3_MOE, MIXTRAL = "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "MixtralForCausalLM"
GEMMA2, GEMMA3, PHI3 = "Gemma2ForCausalLM", "Gemma3ForCausalLM", "Phi3ForCausalLM"
ARCHITECTURES = (LLAMA, MISTRAL, QWEN2, GPT2, QWEN3, QWEN3_MOE, MIXTRAL, GEMMA2, GEMMA3, PHI3)
"""The Hugging Face architectures (config.json `architectures[0]`) the table speaks about, in docs order."""
FAMILY_NAMES = {LLAMA: "Llama", MISTRAL: "Mistral", QWEN2: "Qwen2", GPT2: "GPT-2", QWEN3: "Qwen3",
                QWEN3_MOE: "Qwen3-MoE", MIXTRAL: "Mixtral", GEMMA2: "Gemma 2", GEMMA3: "Gemma 3 (text)",
                PHI3: "Phi-3"}

Engine = Literal["engine", "pytorch", "vllm", "sglang", "specbuild"]
ENGINES: dict[str, str] = {
    "engine": "TensorRT-LLM 1.2's engine flow",
    "pytorch": "TensorRT-LLM's PyTorch flow",
    "vllm": "vLLM 0.33",
    "sglang": "SGLang 0.5.23",
    "specbuild": "specbuild's trainer",
}
"""Who runs a method: the engines, and specbuild itself where it trains the draft."""

Method = Literal["model", "quantized_draft", "medusa", "medusa_training", "eagle3", "eagle3_training",
                 "self_draft_adapter"]
METHODS: dict[str, str] = {
    "model": "the model at all",
    "quantized_draft": "draft quantization (ModelOpt)",
    "medusa": "Medusa heads",
    "medusa_training": "Medusa training (`specbuild medusa train`)",
    "eagle3": "EAGLE-3",
    "eagle3_training": "EAGLE-3 training (`specbuild eagle train`)",
    "self_draft_adapter": "self-draft adapter (`specbuild draft train`)",
}
"""What some engine restricts by family ("model": serving the family with any mode). Draft-target, NGram, SA and
Lookahead have no entries: every engine runs them on every family it runs at all."""


@dataclass(frozen=True)
class Refusal:
    """Why an engine cannot run a method on a family: the engine's reason (its words where it has them), where that
    was read, and what to do instead."""

    reason: str
    source: str
    instead: str


_MEDUSA_SOURCE = "NVIDIA/TensorRT-LLM examples/medusa/convert_checkpoint.py @b93e14ca"
_MEDUSA_INSTEAD = ("train an EAGLE-3 draft for the target (`specbuild eagle train`) where an engine runs it, or use "
                   "speculative.mode draft_target with a small model of the target's family")


def _medusa(family: str) -> Refusal:
    return Refusal(f"TensorRT-LLM's Medusa converter takes --model_type llama, mixtral or qwen2 (asserted) and loads "
                   f"any other base as a Llama, which a {family} is not", _MEDUSA_SOURCE, _MEDUSA_INSTEAD)


def _trtllm_eagle3(family: str, module: str, commit: str) -> Refusal:
    return Refusal(f"TensorRT-LLM's PyTorch backend registers {family} as a DecoderModelForCausalLM (one-model "
                   "EAGLE-3 needs a SpecDecOneEngineForCausalLM) whose model forward captures no hidden states for a "
                   "draft (no spec_metadata capture, which two-model EAGLE-3 reads)",
                   f"NVIDIA/TensorRT-LLM tensorrt_llm/_torch/models/{module} @{commit}",
                   "use speculative.mode draft_target (or ngram) on build.flow: pytorch")


_VLLM_SOURCE = "vllm-project/vllm 0.33.0 vllm/v1/worker/gpu_model_runner.py, vllm/model_executor/models/{}"
_SGLANG_SOURCE = ("sgl-project/sglang 0.5.23 python/sglang/srt/model_executor/model_runner_components/"
                  "attention_backend_setup.py, python/sglang/srt/models/{}")


def _vllm_eagle3(cls: str, module: str) -> Refusal:
    return Refusal(f"vLLM's {cls} does not implement SupportsEagle3 (\"Model does not support EAGLE3 interface but "
                   "aux_hidden_state_outputs was requested\")", _VLLM_SOURCE.format(module),
                   "use speculative.mode draft_target or ngram with vLLM, or an engine that runs EAGLE-3 on this "
                   "family (the docs' Model families table)")


def _sglang_eagle3(cls: str, module: str) -> Refusal:
    return Refusal(f"SGLang's {cls} does not implement set_eagle3_layers_to_capture (\"Model {cls} does not implement "
                   "set_eagle3_layers_to_capture, which EAGLE3 aux hidden-state capture requires.\")",
                   _SGLANG_SOURCE.format(module), "use speculative.mode draft_target or ngram with SGLang")


_MODELOPT_SOURCE = ("nvidia-modelopt 0.47.0 modelopt/torch/export/model_config_export.py "
                    "export_tensorrt_llm_checkpoint, measured under transformers 5.14")
_MODELOPT_INSTEAD = ("leave draft.quantization out (an unquantized draft of this family), or quantize on "
                     "build.flow: pytorch where ModelOpt's Hugging Face export takes it")


def _modelopt(what: str) -> Refusal:
    return Refusal(f"ModelOpt 0.47's TensorRT-LLM export fails on it ({what})", _MODELOPT_SOURCE, _MODELOPT_INSTEAD)


_MOE_EXPORT = "TypeError: transformers 5 keeps the experts in one fused module the export cannot iterate"

REFUSALS: dict[tuple[str, str, str], Refusal] = {
    (GPT2, "model", "pytorch"): Refusal(
        "TensorRT-LLM's PyTorch backend has no model class for GPT2LMHeadModel (no modeling_gpt2.py, nothing "
        "registered under that architecture with register_auto_model)",
        "NVIDIA/TensorRT-LLM tensorrt_llm/_torch/models/",
        "use build.flow: engine (TensorRT-LLM 1.2 converts GPT-2), or export to vLLM or SGLang"),
    # Medusa: TensorRT-LLM 1.2's engine flow is the only engine with Medusa (export and the PyTorch flow refuse the
    # mode itself); its converter takes Llama-architecture (Llama, Mistral), Mixtral and Qwen2 bases.
    **{(arch, "medusa", "engine"): _medusa(FAMILY_NAMES[arch]) for arch in (GPT2, QWEN3, QWEN3_MOE, GEMMA2, GEMMA3,
                                                                           PHI3)},
    # EAGLE-3 on the target's family.
    (GEMMA2, "eagle3", "pytorch"): _trtllm_eagle3("Gemma2ForCausalLM", "modeling_gemma2.py", "04d175ac"),
    (GEMMA3, "eagle3", "pytorch"): _trtllm_eagle3("Gemma3ForCausalLM", "modeling_gemma3.py", "00e7d103"),
    (MIXTRAL, "eagle3", "pytorch"): _trtllm_eagle3("MixtralForCausalLM", "modeling_mixtral.py", "000a01de"),
    (PHI3, "eagle3", "pytorch"): _trtllm_eagle3("Phi3ForCausalLM", "modeling_phi3.py", "000a01de"),
    (GPT2, "eagle3", "vllm"): _vllm_eagle3("GPT2LMHeadModel", "gpt2.py"),
    (MIXTRAL, "eagle3", "vllm"): _vllm_eagle3("MixtralForCausalLM", "mixtral.py"),
    (GEMMA2, "eagle3", "vllm"): _vllm_eagle3("Gemma2ForCausalLM", "gemma2.py"),
    (GEMMA3, "eagle3", "vllm"): _vllm_eagle3("Gemma3ForCausalLM", "gemma3.py"),
    (GPT2, "eagle3", "sglang"): _sglang_eagle3("GPT2LMHeadModel", "gpt2.py"),
    (MIXTRAL, "eagle3", "sglang"): _sglang_eagle3("MixtralForCausalLM", "mixtral.py"),
    (GEMMA2, "eagle3", "sglang"): _sglang_eagle3("Gemma2ForCausalLM", "gemma2.py"),
    # Draft quantization: TensorRT-LLM checkpoints come from ModelOpt's TensorRT-LLM export.
    (QWEN3_MOE, "quantized_draft", "engine"): _modelopt(_MOE_EXPORT),
    (MIXTRAL, "quantized_draft", "engine"): _modelopt(_MOE_EXPORT),
    (GEMMA2, "quantized_draft", "engine"): _modelopt("KeyError 'gemma2': no TensorRT-LLM layer table for it"),
    (GEMMA3, "quantized_draft", "engine"): _modelopt("NotImplementedError: \"Cannot export tensorrt_llm checkpoint for "
                                                     "model gemma3 ... It's not supported by TensorRT-LLM yet\""),
    (PHI3, "quantized_draft", "engine"): _modelopt("KeyError 'phi3': no TensorRT-LLM layer table for it"),
}
"""(HF architecture, method, engine) -> why that engine cannot run the method on that family."""

MODELOPT_DECODER_TYPES: dict[str, str] = {LLAMA: "llama", MISTRAL: "llama", QWEN2: "qwen", GPT2: "gpt",
                                          QWEN3: "qwen", QWEN3_MOE: "qwen3moe", MIXTRAL: "llama", GEMMA2: "gemma2",
                                          GEMMA3: "gemma3", PHI3: "phi3"}
"""HF architecture -> ModelOpt's `decoder_type` (modelopt/torch/export/model_utils.py MODEL_NAME_TO_TYPE, 0.47.0);
whether the TensorRT-LLM export then works is REFUSALS' ("quantized_draft", "engine") entries."""

SELF_DRAFT_ADAPTER_FAMILIES: dict[str, str] = {LLAMA: "llama", MISTRAL: "mistral", QWEN2: "qwen2", QWEN3: "qwen3",
                                               PHI3: "phi3"}
"""HF architecture -> model_type of the targets `specbuild draft train` trains an adapter on: their decoder layer
runs standalone given rotary embeddings, and its parameters carry the checkpoint's own tensor names
(specbuild.self_draft.train)."""
_ADAPTER_SOURCE = ("specbuild/self_draft/train.py; transformers 5.14 integrations/sdpa_attention.py, "
                   "models/gemma2/modeling_gemma2.py, models/gemma3/modeling_gemma3.py")
_ADAPTER_INSTEAD = "use draft.source: target_layers without draft.adapter"
_ADAPTER_REASONS = {
    GPT2: "GPT-2's blocks have no rotary embeddings for the adapter trainer to run one standalone with",
    **dict.fromkeys((QWEN3_MOE, MIXTRAL), "transformers 5 holds an MoE layer's experts fused in one module "
                    "(experts.gate_up_proj), not under the per-expert names the checkpoint and convert use, so a "
                    "trained layer could not be written as the target's own"),
    GEMMA2: "the adapter trainer runs the target through SDPA attention with a plain causal mask, and transformers' "
            "SDPA path applies neither Gemma 2's attention-score soft-capping (only its eager attention does) nor "
            "its sliding windows",
    GEMMA3: "the adapter trainer gives a layer one rotary embedding and a plain causal mask, while Gemma 3's layers "
            "take a local or global rope base and a sliding-window or global mask by layer type",
}

EAGLE3_ENGINES = ("pytorch", "vllm", "sglang")
"""The engines that serve EAGLE-3 drafts (TensorRT-LLM's engine flow has none: contracts.llm_api)."""


def _refused_everywhere(architecture: str, method: str, engines: tuple[str, ...]) -> list[str]:
    """Each engine's refusal of `method` on `architecture` (of the model itself, or of the method), or [] when one
    engine runs it."""
    said = []
    for engine in engines:
        found = REFUSALS.get((architecture, "model", engine)) or REFUSALS.get((architecture, method, engine))
        if found is None:
            return []
        said.append(f"{ENGINES[engine]}: {found.reason}")
    return said


# specbuild's own trainers: a draft no engine serves is not trained (derived from the engines' entries above), and
# the adapter trainer's own limit.
for _arch in ARCHITECTURES:
    _nobody = _refused_everywhere(_arch, "eagle3", EAGLE3_ENGINES)
    if _nobody:
        REFUSALS[(_arch, "eagle3_training", "specbuild")] = Refusal(
            "no engine serves an EAGLE-3 draft on this target (" + "; ".join(_nobody) + ")",
            "the EAGLE-3 entries of specbuild/contracts/family_support.py",
            "use speculative.mode draft_target or ngram for this target")
    _nobody = _refused_everywhere(_arch, "medusa", ("engine",))
    if _nobody:
        REFUSALS[(_arch, "medusa_training", "specbuild")] = Refusal(
            "no engine serves Medusa heads on this base (" + "; ".join(_nobody) + ")",
            "the Medusa entries of specbuild/contracts/family_support.py", _MEDUSA_INSTEAD)
    if _arch not in SELF_DRAFT_ADAPTER_FAMILIES:
        REFUSALS[(_arch, "self_draft_adapter", "specbuild")] = Refusal(_ADAPTER_REASONS[_arch], _ADAPTER_SOURCE,
                                                                      _ADAPTER_INSTEAD)


def refusal(architecture: str, method: str, engine: str) -> Refusal | None:
    """Why `engine` cannot run `method` on a model of `architecture`, or None."""
    return REFUSALS.get((architecture, method, engine))


def family(architecture: str) -> str:
    """How a user is told the family: `Qwen3 (Qwen3ForCausalLM)`."""
    name = FAMILY_NAMES.get(architecture)
    return f"{name} ({architecture})" if name else architecture


def refusal_message(architecture: str, method: str, engine: str, where: object) -> str | None:
    """The one sentence every command says for a refused (family, method, engine): what, the engine's reason with
    its source, and what to do instead."""
    found = refusal(architecture, method, engine)
    if found is None:
        return None
    return (f"{where} is a {family(architecture)}: {ENGINES[engine]} cannot run {METHODS[method]} on it: "
            f"{found.reason} ({found.source}); {found.instead}")


def _hf_config(directory: Path | None) -> dict[str, Any] | None:
    """A Hugging Face directory's config.json as a JSON object; None where there is none to read (the model checks
    name a missing or broken directory themselves)."""
    if directory is None:
        return None
    try:
        data = json.loads((Path(directory) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def architecture_of(directory: Path | None) -> str | None:
    """config.json's `architectures[0]` of a Hugging Face directory; None where there is none to read."""
    data = _hf_config(directory)
    architectures = data.get("architectures") if data is not None else None
    if isinstance(architectures, list) and architectures and isinstance(architectures[0], str):
        return architectures[0]
    return None


MTP_LAYER_FIELDS = ("num_nextn_predict_layers", "mtp_num_hidden_layers")
"""The config.json fields that count the multi-token-prediction layers a checkpoint ships (top level, or in a
multimodal checkpoint's text_config), as the engines read them: vLLM 0.33.0 vllm/config/speculative.py
SpeculativeConfig.hf_config_override takes `n_predict` from num_nextn_predict_layers for deepseek_v3/deepseek_v32
(DeepSeek-V3/R1), glm4_moe (GLM-4.5), MiMoForCausalLM (MiMo) and qwen3_next, and from mtp_num_hidden_layers for
qwen3_5; TensorRT-LLM 1.3 MTPDecodingConfig.num_nextn_predict_layers is "auto-populated from the target pretrained
config" (tensorrt_llm/llmapi/llm_args.py @0004396720054fd8e205cbf616f21f0b57c6b412); transformers 5.14's
DeepseekV3Config and Glm4MoeConfig map num_mtp_layers to num_nextn_predict_layers. A checkpoint with none of them
above 0 has no MTP layers to draft with."""
MTP_MODELS = "DeepSeek-V3/R1, GLM-4.5, MiMo or Qwen3-Next"


def mtp_layers(directory: Path | None) -> int | None:
    """How many MTP layers the checkpoint's config.json declares (0: none); None where there is no config.json to
    read (the model checks name a missing or broken directory themselves)."""
    data = _hf_config(directory)
    if data is None:
        return None
    configs = [data, data.get("text_config")]
    counts = [config.get(name) for config in configs if isinstance(config, dict) for name in MTP_LAYER_FIELDS]
    return max([count for count in counts if isinstance(count, int) and not isinstance(count, bool)] + [0])


def mtp_problem(directory: Path | None) -> str | None:
    """Why `speculative.mode: mtp` cannot draft with this target (None: it declares MTP layers, or has no readable
    config.json)."""
    if mtp_layers(directory) != 0:
        return None
    return (f"{directory} carries no multi-token-prediction layers: its config.json sets none of "
            f"{', '.join(MTP_LAYER_FIELDS)} above 0, which is where every engine reads them from; speculative.mode "
            f"mtp drafts with the target's own MTP layers (as {MTP_MODELS} ship them): use eagle3, draft_target, "
            "ngram or sa for this model")


def spec_engines(spec: PipelineSpec) -> tuple[str, ...]:
    """The engines a spec's deployment runs on: the build flow's TensorRT-LLM, or a Dynamo deployment's workers
    (vLLM, SGLang, or TensorRT-LLM's PyTorch flow)."""
    deploy = spec.deploy
    if deploy.target == "dynamo" and deploy.dynamo is not None and deploy.dynamo.engine in ("vllm", "sglang"):
        return (deploy.dynamo.engine,)
    return ("pytorch",) if spec.build.flow == "pytorch" else ("engine",)


def family_problems(spec: PipelineSpec, engines: tuple[str, ...] | None = None) -> list[tuple[Loc, str]]:
    """The spec's (family, method) pairs its engines refuse (`engines`: the deployment's, `spec_engines`, unless an
    export names its own), each located at the model whose family is refused."""
    engines = engines if engines is not None else spec_engines(spec)
    mode, draft = spec.speculative.mode, spec.draft
    target = architecture_of(spec.target.model)
    asks: list[tuple[Loc, str | None, str, object]] = [(("target", "model"), target, "model", spec.target.model)]
    if draft is not None and draft.model is not None and mode == "draft_target":
        asks.append((("draft", "model"), architecture_of(draft.model), "model", draft.model))
    if mode == "eagle3":
        asks.append((("target", "model"), target, "eagle3", spec.target.model))
    if mode == "medusa":
        asks.append((("target", "model"), target, "medusa", spec.target.model))
    if draft is not None and draft.quantization.enabled:  # a self-draft is the target's own layers
        source = draft.model if draft.model is not None else spec.target.model
        asks.append((("draft", "quantization"), architecture_of(source), "quantized_draft", source))
    problems: list[tuple[Loc, str]] = []
    if mode == "mtp":
        no_layers = mtp_problem(spec.target.model)
        if no_layers is not None:
            problems.append((("target", "model"), no_layers))
    for loc, arch, method, where in asks:
        for engine in engines:
            message = refusal_message(arch, method, engine, where) if arch is not None else None
            if message is not None:
                problems.append((loc, message))
    return problems


def support_table() -> list[list[str]]:
    """The docs' "Model families" table: one row per family, one column per (method, engine) pair the table
    restricts somewhere; a cell is "yes" or "no" (the reason is in REFUSALS, which the docs link)."""
    columns = sorted({(method, engine) for _, method, engine in REFUSALS}, key=lambda c: (list(METHODS).index(c[0]),
                                                                                          list(ENGINES).index(c[1])))
    header = ["Family", *(f"{METHODS[m]}: {ENGINES[e]}" for m, e in columns)]
    rows = [[family(arch), *("no" if (arch, m, e) in REFUSALS or (arch, "model", e) in REFUSALS else "yes"
                             for m, e in columns)]
            for arch in ARCHITECTURES]
    return [header, *rows]


def support_markdown() -> str:
    """`support_table()` as the Markdown table docs/methods/families.md shows."""
    rows = support_table()
    return "\n".join(["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0]),
                      *("| " + " | ".join(row) + " |" for row in rows[1:])])


def reasons_markdown() -> str:
    """One bullet per engine refusal (the trainers' derived ones are said in the table), as the docs list them."""
    own = ("eagle3_training", "medusa_training", "self_draft_adapter")
    entries = sorted(((key, found) for key, found in REFUSALS.items() if key[1] not in own),
                     key=lambda item: (item[0][1], item[0][2], item[0][0]))
    return "\n".join(f"- **{family(arch)}, {METHODS[method]}, {ENGINES[engine]}**: {found.reason} ({found.source}); "
                     f"{found.instead}." for (arch, method, engine), found in entries)
