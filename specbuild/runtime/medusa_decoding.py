"""Medusa speculative decoding (Cai et al. 2024, arXiv 2401.10774): one model, extra heads, a candidate tree.

Each round the heads' top-k tokens at the last accepted position fill the nodes of the tree given by
`medusa_choices`; the target runs once over the whole tree (tree attention mask: a node sees its ancestors;
positions: the node's depth), and verification keeps the longest root-to-node path whose tokens equal the
target's own choice at their parents, or, as an option, the paper's typical acceptance. The accepted nodes' KV
entries are compacted into the cache and the target's choice after the last accepted node becomes the next
pending token. The steps are the serving engine's (`specbuild.runtime.serving`), run to completion here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specbuild.medusa.tree import MedusaTree
from specbuild.runtime.generation import run_to_completion
from specbuild.runtime.model import CausalLM
from specbuild.runtime.sampling import SamplingParams
from specbuild.runtime.sequence import GenerationResult, StopCriteria
from specbuild.runtime.serving import Typical


@dataclass(frozen=True)
class MedusaConfig:
    choices: tuple[tuple[int, ...], ...]
    typical: bool = False  # typical acceptance instead of greedy verification (needs temperature > 0)
    posterior_threshold: float = 0.09
    posterior_alpha: float = 0.3


def check_medusa_model(model: CausalLM, tree: MedusaTree) -> None:
    heads = model.config.num_medusa_heads
    if heads == 0:
        raise ValueError("this checkpoint has no Medusa heads (architecture MedusaForCausalLM is needed)")
    if tree.max_depth > heads:
        raise ValueError(f"the Medusa tree is {tree.max_depth} deep but the checkpoint has only {heads} heads")


def generate_medusa(
    model: CausalLM,
    prompts: Sequence[Sequence[int]],
    config: MedusaConfig,
    params: SamplingParams = SamplingParams(),
    stop: StopCriteria = StopCriteria(),
) -> GenerationResult:
    """Generate a batch with Medusa heads; greedy output equals plain greedy decoding of the base model."""
    tree = MedusaTree.from_choices(config.choices)
    check_medusa_model(model, tree)
    if config.typical and params.greedy:
        raise ValueError("typical acceptance samples: give a temperature > 0 (greedy uses exact verification)")
    typical = Typical(config.posterior_threshold, config.posterior_alpha) if config.typical else None
    return run_to_completion(model, prompts, params, stop, medusa_choices=config.choices, typical=typical)
