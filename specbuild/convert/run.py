"""What `specbuild convert` runs: a spec's models, or one Hugging Face directory without a spec.

Both go through `convert_requests`, so one model and a whole spec are checked, locked and written the same way;
the command only parses arguments and prints each result as it is written.

On `build.flow: pytorch` the LLM API loads Hugging Face checkpoints, so convert writes only what that flow needs:
with `draft.quantization`, the draft quantized by ModelOpt as its Hugging Face export (`checkpoints/draft-hf`, what
`speculative_model` then names), and with `build.backend: reference` the TensorRT-LLM checkpoints specbuild's own
llmapi model serves, the draft's from the same calibration as the export (`shared_quantization`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from specbuild.convert.pipeline import (
    ConvertRequest,
    ConvertResult,
    checkpoint_output_name,
    convert_requests,
    prepare_conversion,
    spec_requests,
    write_conversion,
)
from specbuild.convert.quantize.settings import HF
from specbuild.convert.quantize.write import shared_quantization

if TYPE_CHECKING:
    from specbuild.spec import PipelineSpec


def convert_spec(spec_path: Path, *, allow_pickle: bool = False, force: bool = False, dry_run: bool = False,
                 console: Console | None = None,
                 on_result: Callable[[ConvertResult], None] | None = None) -> list[ConvertResult]:
    """Convert the target, draft and Medusa checkpoint of the spec at `spec_path`; every model (and the
    draft/target pair) is checked before any is written, and problems are reported at the spec file."""
    from specbuild.contracts.llm_api import refuse_other_flow
    from specbuild.spec import load_spec
    from specbuild.spec.fields import downloads

    with downloads():  # convert is the stage that fetches a Hub id's snapshot the cache lacks (unless offline)
        spec = load_spec(spec_path)
    refuse_other_flow(spec, "convert")
    if spec.build.flow == "pytorch":
        return _convert_pytorch_flow(spec, spec_path, allow_pickle=allow_pickle, force=force, dry_run=dry_run,
                                     console=console, on_result=on_result)
    requests, pair = spec_requests(spec, allow_pickle=allow_pickle)
    return convert_requests(requests, where=str(spec_path), pair_problems=pair, force=force, dry_run=dry_run,
                            console=console, on_result=on_result)


def hf_draft_request(draft: ConvertRequest, output: Path) -> ConvertRequest:
    """The draft request written as ModelOpt's Hugging Face export instead of a TensorRT-LLM checkpoint: same
    source, checks and quantization plan (tp/pp stay the spec's, so int4 groups are checked per rank as the PyTorch
    backend shards the linears)."""
    assert draft.quantization is not None
    return replace(draft, name="draft-hf", output=output, output_name=checkpoint_output_name("draft-hf"),
                   quantization=replace(draft.quantization, export=HF))


def _convert_pytorch_flow(spec: PipelineSpec, spec_path: Path, *, allow_pickle: bool, force: bool, dry_run: bool,
                          console: Console | None,
                          on_result: Callable[[ConvertResult], None] | None) -> list[ConvertResult]:
    """The checkpoints a `build.flow: pytorch` spec needs (see the module docstring); nothing else is converted."""
    from specbuild.contracts.llm_api import quantized_draft_dir, reference_roles, refuse_pytorch_flow_problems

    refuse_pytorch_flow_problems(spec, "convert")
    roles = reference_roles(spec)  # build.backend: reference: specbuild's llmapi model runs these checkpoints
    hf_dir = quantized_draft_dir(spec)
    if not roles and hf_dir is None:
        (console or Console(stderr=True)).print(
            f"{spec_path}: build.flow is pytorch: nothing to convert (the PyTorch backend loads target.model"
            + (" and draft.model" if spec.draft is not None else "") + " as they are)", highlight=False)
        return []
    all_requests, pair = spec_requests(spec, allow_pickle=allow_pickle)
    requests = [request for request in all_requests if request.name in roles]
    if hf_dir is not None:
        requests.append(hf_draft_request(next(r for r in all_requests if r.name == "draft"), hf_dir))
    pair = pair if any(r.name.startswith("draft") for r in requests) else []  # an EAGLE-3 draft: no causal LM pair
    seen: list[ConvertResult] = []

    def record(result: ConvertResult) -> None:
        seen.append(result)
        if on_result is not None:
            on_result(result)

    with shared_quantization():  # the draft and its HF export: one calibration
        results = convert_requests(requests, where=str(spec_path), pair_problems=pair, force=force,
                                   dry_run=dry_run, console=console, on_result=record)
        redo = _one_of_a_pair_written(seen)
        if redo is not None:  # the other was up to date from an earlier calibration: rewrite it from this one
            prepared = prepare_conversion(redo)
            try:
                again = write_conversion(prepared, force=True, console=console)
            finally:
                prepared.close()
            results = [again if r.request == redo else r for r in results]
            if on_result is not None:
                on_result(again)
    return results


def _one_of_a_pair_written(results: list[ConvertResult]) -> ConvertRequest | None:
    """The quantized draft's TensorRT-LLM checkpoint or its HF export when only the other one was written now: the
    reference would then serve another calibration than the export holds (the same inputs calibrate alike, but
    that is ModelOpt's behaviour to rely on, not specbuild's)."""
    by_name = {r.request.name: r for r in results}
    draft, hf = by_name.get("draft"), by_name.get("draft-hf")
    if draft is None or hf is None or draft.request.quantization is None:
        return None
    if draft.status == "written" and hf.status == "up to date":
        return hf.request
    if hf.status == "written" and draft.status == "up to date":
        return draft.request
    return None


def convert_model(request: ConvertRequest, *, force: bool = False, dry_run: bool = False,
                  console: Console | None = None,
                  on_result: Callable[[ConvertResult], None] | None = None) -> ConvertResult:
    """Convert one Hugging Face directory as `request` says (the spec-less `convert --model HF_DIR`)."""
    (result,) = convert_requests([request], force=force, dry_run=dry_run, console=console, on_result=on_result)
    return result
