"""Lookahead decoding (Fu et al. 2024, arXiv 2402.02057) of a batch with the reference runtime: no draft model.

Each step runs one forward of the target over the last accepted token, its lookahead window of Jacobi guesses and
up to G candidate n-grams from its pool (`specbuild.runtime.lookahead` builds the block and its tree mask); the
longest candidate prefix the target agrees with is accepted with the target's next token, and only those tokens'
K/V are committed. The steps are the serving engine's (`specbuild.runtime.serving`), run to completion here, so a
batch of different prompts runs as the server runs it. Greedy only, as TensorRT-LLM's lookahead layer is: the
output then equals plain greedy decoding token for token.
"""

from __future__ import annotations

from collections.abc import Sequence

from specbuild.runtime.generation import run_to_completion
from specbuild.runtime.lookahead import LookaheadConfig, check_config
from specbuild.runtime.model import CausalLM
from specbuild.runtime.sampling import SamplingParams
from specbuild.runtime.sequence import GenerationResult, StopCriteria


def generate_lookahead(
    model: CausalLM,
    prompts: Sequence[Sequence[int]],
    config: LookaheadConfig,
    params: SamplingParams = SamplingParams(),
    stop: StopCriteria = StopCriteria(),
) -> GenerationResult:
    """Generate a batch with Lookahead decoding (W, N, G); the output equals plain greedy decoding."""
    config = LookaheadConfig(*config)
    check_config(config)
    if not params.greedy:
        raise ValueError("Lookahead decoding here is greedy (its verification matches the target's argmax): "
                         "leave the temperature at 0")
    return run_to_completion(model, prompts, params, stop, lookahead=config)
