"""Whether the models a spec names beside its target fit that target and are the kind its speculative mode needs.

One rule per kind, read from config files and safetensors headers only (no weights), so `specbuild validate`
reports every misfit in seconds at its spec line and field, and each stage that would otherwise meet it late calls
the same rule instead of a copy: `export` refuses the draft (`draft_findings`), convert and export check Medusa
heads with `medusa_fit_problem`, and the EAGLE-3 pairing itself is `specbuild.eagle.format.fit_problems` (what the
reference runtime's loader checks). A self-draft adapter's fit is `specbuild.self_draft.adapter_format` and
convert's `SelfDraftArchitecture.check_adapter`, which validate reaches through convert's own planning.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

from specbuild.contracts.llm_api import llmapi_backend
from specbuild.eagle.format import (
    ARCHITECTURES,
    CONFIG_NAME,
    Eagle3DraftConfig,
    Eagle3Target,
    fit_problems,
    layer_id_problems,
    read_eagle3_header,
    target_from_config,
)
from specbuild.errors import MISSING_MODEL, CheckpointError, SpecbuildError
from specbuild.medusa.heads_format import KEY_RE
from specbuild.spec import PipelineSpec
from specbuild.spec.problems import Loc, show

Severity = Literal["error", "warning"]
Finding = tuple[Severity, Loc, str]
"""(severity, spec field, message), as `specbuild.convert.preflight` reports a model's problems."""

TARGET_MODEL: Loc = ("target", "model")
DRAFT_MODEL: Loc = ("draft", "model")
CAPTURE: Loc = ("speculative", "eagle3", "eagle3_layers_to_capture")


def _said(err: SpecbuildError) -> str:
    return f"{err.message} ({err.hint})" if err.hint else err.message


def _read_config(directory: Path) -> dict[str, object]:
    """A Hugging Face checkpoint's config.json; a missing directory or file is named as such."""
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: model directory does not exist", hint=MISSING_MODEL)
    path = directory / CONFIG_NAME
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no such file",
                              hint="point the field at a Hugging Face checkpoint directory") from None
    except (OSError, ValueError) as err:
        raise CheckpointError(f"{path}: not readable JSON ({err})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return data


def read_target(directory: Path) -> Eagle3Target:
    """What a draft reads of the target, from its config.json alone."""
    return target_from_config(_read_config(Path(directory)), Path(directory) / CONFIG_NAME)


# -- EAGLE-3 -------------------------------------------------------------------------------------------------------
def eagle3_findings(spec: PipelineSpec, *, engine: str | None = None) -> list[Finding]:
    """`speculative.mode: eagle3`: draft.model is an EAGLE-3 draft (config.json and weight header as the engines'
    loaders read them) made for target.model, and speculative.eagle3.eagle3_layers_to_capture names as many of the
    target's layers as the draft's fc reads. `engine`: an export's engine (vllm, sglang), which reads the draft
    alone: neither the capture layers (no export writes them) nor the reference runtime's target families apply."""
    assert spec.draft is not None and spec.draft.model is not None
    draft = spec.draft.model
    findings: list[Finding] = []
    config, target = None, None
    try:
        config, shapes = read_eagle3_header(draft)
    except CheckpointError as err:
        findings.append(("error", DRAFT_MODEL, _said(err)))
    try:
        target = read_target(spec.target.model)
    except CheckpointError as err:
        findings.append(("error", TARGET_MODEL, _said(err)))
    if config is None or target is None:
        return findings
    reference = engine is None and llmapi_backend(spec) == "reference"
    misfits = fit_problems(config, target, own_embedding="embed_tokens.weight" in shapes, llama_only=reference)
    if misfits:
        return [*findings, ("error", DRAFT_MODEL, f"{draft}: this EAGLE-3 draft does not fit target.model "
                            f"{spec.target.model}: {'; '.join(misfits)}")]
    if engine is None:
        findings += capture_findings(spec, config, target)
    return findings


def capture_findings(spec: PipelineSpec, config: Eagle3DraftConfig, target: Eagle3Target) -> list[Finding]:
    """speculative.eagle3.eagle3_layers_to_capture against the target's depth and the draft's fc (TensorRT-LLM's
    counting: id i is decoder layer i's output, -1 the last layer), then against the layers the draft was trained
    on: the reference runtime serves those whatever the spec says, so a different set is refused there; TensorRT-LLM
    captures what the spec says, which a draft trained on other layers reads badly (a warning)."""
    eagle3 = spec.speculative.eagle3
    given = eagle3.eagle3_layers_to_capture if eagle3 is not None else None
    if given is None:
        return []
    problems = layer_id_problems(given, target.num_layers, config.num_captured, last=True)
    if problems:
        return [("error", CAPTURE, f"{show(given)}: {problem}") for problem in problems]
    trained = config.resolve_layer_ids(target.num_layers)  # fit_problems resolved it already
    if sorted(given) == sorted(trained):
        return []
    where = ("its config.json's eagle_config.eagle_aux_hidden_state_layer_ids" if config.target_layer_ids is not None
             else f"TensorRT-LLM's default for a target of {target.num_layers} layers")
    said = f"{show(given)}: the draft in draft.model was trained on the target's layers {list(trained)} ({where})"
    if llmapi_backend(spec) == "reference":
        return [("error", CAPTURE, f"{said}, and build.backend reference serves it with those, not these; remove "
                 f"speculative.eagle3.eagle3_layers_to_capture or set it to {list(trained)}")]
    return [("warning", CAPTURE, f"{said}; TensorRT-LLM captures these instead, features the draft never learned "
             "from (expect few accepted tokens)")]


# -- a draft model -------------------------------------------------------------------------------------------------
def draft_model_findings(spec: PipelineSpec) -> list[Finding]:
    """`speculative.mode: draft_target` with draft.model: a Hugging Face checkpoint directory, and not an EAGLE-3
    draft (which only proposes from the target's hidden states, so no engine runs it as a standalone draft)."""
    assert spec.draft is not None and spec.draft.model is not None
    try:
        data = _read_config(spec.draft.model)
    except CheckpointError as err:
        return [("error", DRAFT_MODEL, _said(err))]
    architectures = data.get("architectures")
    if isinstance(architectures, list) and architectures and architectures[0] in ARCHITECTURES:
        return [("error", DRAFT_MODEL, f"{spec.draft.model / CONFIG_NAME}: architectures {architectures} is an "
                 "EAGLE-3 draft, which proposes from the target's hidden states and cannot run as a draft_target "
                 "draft model; set speculative.mode: eagle3 (with build.flow: pytorch), or point draft.model at a "
                 "small model of the target's family")]
    return []


def draft_findings(spec: PipelineSpec, *, engine: str | None = None) -> list[Finding]:
    """The draft's findings for the spec's mode: eagle3 (`eagle3_findings`; `engine` as there) or draft_target with
    draft.model (`draft_model_findings`); [] for the other modes and for a self-draft."""
    if spec.draft is None or spec.draft.model is None:
        return []
    if spec.speculative.mode == "eagle3":
        return eagle3_findings(spec, engine=engine)
    if spec.speculative.mode == "draft_target":
        return draft_model_findings(spec)
    return []


# -- Medusa heads --------------------------------------------------------------------------------------------------
def medusa_head_shape(kind: str, hidden: int, vocab: int) -> tuple[int, ...]:
    """The shape of a FasterDecoding head tensor of `kind` (`linear.weight`, `linear.bias` of a ResBlock, or the
    head's vocabulary projection `weight`) on a target of this hidden size and vocabulary."""
    return {"linear.weight": (hidden, hidden), "linear.bias": (hidden,), "weight": (vocab, hidden)}[kind]


MEDUSA_FIT_HINT = ("Medusa heads are trained on one target: point medusa.heads at heads trained on target.model, or "
                   "train them on it (`specbuild medusa train`)")
"""What to do about a `medusa_fit_problem`, wherever it is found."""


def medusa_fit_problem(shapes: Mapping[str, Sequence[int]], hidden: int, vocab: int, target: object) -> str | None:
    """Why heads with these tensor shapes (FasterDecoding keys, as `heads_format.count_heads` accepted them) cannot
    run on `target` (named in the message) of this hidden size and vocabulary, or None."""
    for key in sorted(shapes):
        match = KEY_RE.match(key)
        if match is None:
            continue  # count_heads refuses unknown keys
        expected = medusa_head_shape(match[3], hidden, vocab)
        if tuple(shapes[key]) != expected:
            return (f"tensor {key!r} has shape {list(shapes[key])}, the target ({target}) needs {list(expected)} "
                    f"(hidden_size {hidden}, vocab_size {vocab}): these heads were trained for another model")
    return None
