"""`specbuild tune` for EAGLE-3 (`speculative.mode: eagle3`): the draft length K, by the draft-target K search.

An EAGLE-3 round is a draft-target round in cost: K draft forwards of one token each (the catch-up on the
target's features, then K - 1 chain steps; `specbuild.runtime.eagle3_decoding`) and one target forward over K + 1
tokens, so Leviathan et al.'s expected speedup holds with c = one draft-head forward over one target forward.
Only how one draft forward is timed differs (`eagle3_forward`); generations run in the llmapi model's serving
engine with the EAGLE-3 proposer, as the server runs them (`specbuild.tune.measure.one_engine`).

The models are the ones the PyTorch flow's reference backend serves (`specbuild.contracts.llm_api.reference_settings`):
the target checkpoint `specbuild convert` writes for build.backend: reference, and the EAGLE-3 draft from its
Hugging Face directory (draft.model) as it is.
"""

from __future__ import annotations

from pathlib import Path

import torch

from specbuild.errors import SpecbuildError
from specbuild.runtime.model import CausalLM
from specbuild.tune.measure import Step, StepFactory


def load_eagle3_draft(directory: Path, target: CausalLM) -> object:
    """The EAGLE-3 draft at `directory` for `target`; a draft that does not fit the target is named with why."""
    from specbuild.runtime.eagle3 import Eagle3Draft

    try:
        return Eagle3Draft.from_directory(directory, target)
    except ValueError as err:
        raise SpecbuildError(f"draft.model {directory}: {err}",
                             hint="draft.model must be an EAGLE-3 draft trained for this target") from err


def eagle3_forward(draft: object) -> StepFactory:
    """How one forward of the EAGLE-3 draft head (an Eagle3Draft) is timed for the K search."""
    from specbuild.runtime.eagle3 import Eagle3Draft

    assert isinstance(draft, Eagle3Draft)

    def step_after(prompt: list[int], context: int, most: int) -> Step:
        """One draft-head forward of n tokens after `context` committed ones. The hidden inputs are zeros: the
        head's cost does not depend on their values."""
        ids = (prompt * (context // len(prompt) + 1))[:context]
        width = draft.config.hidden_size
        cache = draft.new_cache(1, context + most + 1)
        draft(torch.tensor([ids]), torch.zeros(1, context, width, dtype=draft.dtype), cache)
        cache.advance(context)
        token = ids[-1]

        def step(n: int) -> None:
            draft(torch.full((1, n), token, dtype=torch.long), torch.zeros(1, n, width, dtype=draft.dtype), cache)

        return step

    return step_after
