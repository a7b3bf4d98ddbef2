"""What `specbuild convert` runs: a spec's models, or one Hugging Face directory without a spec.

Both go through `convert_requests`, so one model and a whole spec are checked, locked and written the same way;
the command only parses arguments and prints each result as it is written.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from rich.console import Console

from specbuild.convert.pipeline import ConvertRequest, ConvertResult, convert_requests, spec_requests


def convert_spec(spec_path: Path, *, allow_pickle: bool = False, force: bool = False, dry_run: bool = False,
                 console: Console | None = None,
                 on_result: Callable[[ConvertResult], None] | None = None) -> list[ConvertResult]:
    """Convert the target, draft and Medusa checkpoint of the spec at `spec_path`; every model (and the
    draft/target pair) is checked before any is written, and problems are reported at the spec file."""
    from specbuild.contracts.llm_api import reference_roles, refuse_other_flow, refuse_pytorch_flow_problems
    from specbuild.spec import load_spec

    spec = load_spec(spec_path)
    refuse_other_flow(spec, "convert")
    if spec.build.flow == "pytorch":  # the LLM API loads the HF checkpoints themselves: referenced, not converted
        refuse_pytorch_flow_problems(spec, "convert")
        roles = reference_roles(spec)  # build.backend: reference: specbuild's llmapi model runs these checkpoints
        if roles:
            requests, pair = spec_requests(spec, allow_pickle=allow_pickle)
            requests = [request for request in requests if request.name in roles]
            pair = pair if "draft" in roles else []  # an EAGLE-3 draft is no causal LM to pair with the target
            return convert_requests(requests, where=str(spec_path), pair_problems=pair, force=force,
                                    dry_run=dry_run, console=console, on_result=on_result)
        (console or Console(stderr=True)).print(
            f"{spec_path}: build.flow is pytorch: nothing to convert (the PyTorch backend loads target.model"
            + (" and draft.model" if spec.draft is not None else "") + " as they are)", highlight=False)
        return []
    requests, pair = spec_requests(spec, allow_pickle=allow_pickle)
    return convert_requests(requests, where=str(spec_path), pair_problems=pair, force=force, dry_run=dry_run,
                            console=console, on_result=on_result)


def convert_model(request: ConvertRequest, *, force: bool = False, dry_run: bool = False,
                  console: Console | None = None,
                  on_result: Callable[[ConvertResult], None] | None = None) -> ConvertResult:
    """Convert one Hugging Face directory as `request` says (the spec-less `convert --model HF_DIR`)."""
    (result,) = convert_requests([request], force=force, dry_run=dry_run, console=console, on_result=on_result)
    return result
