"""Lookahead decoding's (W, N, G) as TensorRT-LLM 1.2 sizes and checks it, in one place for every stage.

Lookahead (Fu et al. 2024) has no draft model: each step the target runs a lookahead branch of W windows of
N-1 tokens and a verification branch of up to G candidate n-grams. The engine must be built for exactly the draft
tokens the executor's (W, N, G) needs, and each request's (w, n, g) must fit inside the server's. The spec,
`build` (trtllm-build `--max_draft_len`), `deploy` (the tensorrt_llm model's parameters) and the reference backend
(per-request inputs) all read the rules below, so no two of them can disagree.

Sources (NVIDIA/TensorRT-LLM):
- `cpp/tensorrt_llm/executor/decodingConfig.cpp` @97e36d0b: `LookaheadDecodingConfig` - the constructor's
  TLLM_CHECKs (ngramSize >= 1, windowSize >= 1, ngramSize=1 requires verificationSetSize=0 and windowSize=1,
  verificationSetSize >= 0), `calculateSpeculativeResourceTuple` (the draft-token count), `isLE`; the defaults
  (4, 3, 4) are `kDefaultLookaheadDecoding{Window,Ngram,VerificationSet}` of `cpp/include/tensorrt_llm/executor/
  executor.h` of the same line.
- `examples/lookahead/README.md` @7ed07f06: trtllm-build `--speculative_decoding_mode lookahead_decoding` with
  `--max_draft_len` = that count; the executor's (W, N, G) must give the same count; `(1, 1, 0)` is plain
  autoregressive decoding and `(2, 2, 1)` the smallest meaningful configuration; per request w <= W, n <= N, g <= G.
- `tensorrt_llm/llmapi/llm_args.py` (1.2 line, commit 195839a7): `LookaheadDecodingConfig` fields
  `max_window_size`, `max_ngram_size`, `max_verification_set_size` (each must be positive).
- `cpp/tensorrt_llm/layers/lookaheadDecodingLayer.cpp` @7ed07f06 `setup` and `cpp/tensorrt_llm/layers/
  lookaheadAlgorithm.cpp` @2a9abd95 `LookaheadAlgorithm::setup`: the per-request checks and their texts.
"""

from __future__ import annotations

from typing import NamedTuple

DEFAULT_WINDOW_SIZE = 4
DEFAULT_NGRAM_SIZE = 3
DEFAULT_VERIFICATION_SET_SIZE = 4
"""executor.h's kDefaultLookaheadDecodingWindow / Ngram / VerificationSet (what LookaheadDecodingConfig() and
the LLM API's LookaheadDecodingConfig default to)."""
SMALLEST_MEANINGFUL = (2, 2, 1)
"""examples/lookahead/README.md: the meaningful minimum (W, N, G); (1, 1, 0) is plain decoding."""
BUILD_MODE = "lookahead_decoding"
"""trtllm-build `--speculative_decoding_mode` for Lookahead (examples/lookahead/README.md)."""
DECODING_MODE = "lookahead"
"""The tensorrt_llm model's `decoding_mode` parameter value (model_instance_state.cc getExecutorConfigFromParams)."""
PARAMETERS = ("lookahead_window_size", "lookahead_ngram_size", "lookahead_verification_set_size")
"""The tensorrt_llm model's parameters and per-request inputs carrying (W, N, G), in that order (NVIDIA's
tensorrt_llm/config.pbtxt template; `specbuild.contracts.triton_backend.TENSORRT_LLM`)."""
ASSERT = "[TensorRT-LLM][ERROR] Assertion failed: "
"""How a TLLM_CHECK_WITH_INFO text starts (cpp/include/tensorrt_llm/common/tllmException.h)."""


class LookaheadConfig(NamedTuple):
    """(W, N, G): window size, n-gram size, verification set size."""

    window_size: int
    ngram_size: int
    verification_set_size: int


class SpeculativeResource(NamedTuple):
    """What `calculateSpeculativeResourceTuple` returns, in its order."""

    max_decoding_tokens: int
    """Tokens one step feeds the engine: the draft tokens plus the golden (last accepted) token."""
    max_path_len: int
    max_draft_tokens: int
    """The engine's max_draft_len (trtllm-build --max_draft_len)."""
    max_draft_path_len: int


def speculative_resource(window_size: int, ngram_size: int, verification_set_size: int) -> SpeculativeResource:
    """decodingConfig.cpp calculateSpeculativeResourceTuple: N-2 prefill tokens of the first window (none when
    N = 1), then W-1 more windows and G guesses of N-1 tokens each."""
    first_window = 0 if ngram_size == 1 else ngram_size - 2
    draft_tokens = first_window + (window_size - 1 + verification_set_size) * (ngram_size - 1)
    return SpeculativeResource(draft_tokens + 1, ngram_size, draft_tokens, ngram_size - 1)


def max_draft_len(window_size: int, ngram_size: int, verification_set_size: int) -> int:
    """The `--max_draft_len` an engine for (W, N, G) is built with (83 for (7, 7, 7))."""
    return speculative_resource(window_size, ngram_size, verification_set_size).max_draft_tokens


def legal_problems(window_size: int, ngram_size: int, verification_set_size: int) -> list[str]:
    """The rules LookaheadDecodingConfig's constructor enforces (decodingConfig.cpp), with its texts, in its
    order: what any (w, n, g), a request's included, must satisfy."""
    rules = [
        (ngram_size >= 1, "ngramSize requires >= 1"),
        (window_size >= 1, "windowSize requires >= 1"),
        (ngram_size != 1 or verification_set_size == 0, "ngramSize=1 requires verificationSetSize=0"),
        (ngram_size != 1 or window_size == 1, "ngramSize=1 requires windowSize=1"),
        (verification_set_size >= 0, "verificationSetSize requires >=0"),
    ]
    return [text for ok, text in rules if not ok]


def server_problems(window_size: int, ngram_size: int, verification_set_size: int) -> list[tuple[str, str]]:
    """What a server's (W, N, G) must satisfy, as (field, rule that failed): at least the smallest meaningful
    configuration (2, 2, 1), below which lookahead drafts nothing (README). It implies the LLM API's positive
    values and every rule of `legal_problems`."""
    values = {"window_size": window_size, "ngram_size": ngram_size, "verification_set_size": verification_set_size}
    return [(name, f"must be at least {least}: (W, N, G) = {SMALLEST_MEANINGFUL} is the smallest meaningful "
                   "lookahead configuration (TensorRT-LLM examples/lookahead/README.md; (1, 1, 0) is plain decoding)")
            for (name, value), least in zip(values.items(), SMALLEST_MEANINGFUL, strict=True) if value < least]


def request_problem(request: LookaheadConfig, server: LookaheadConfig) -> str | None:
    """Why the executor refuses a request's (w, n, g) on a server built for (W, N, G), in the C++ text, or None.

    The order is the C++ order: the request's LookaheadDecodingConfig is constructed (its legality checks), the
    decoding layer's setup checks the tokens per step against the engine's, then the algorithm's setup checks
    each of w, n, g against the server's."""
    legal = legal_problems(*request)
    if legal:
        return ASSERT + legal[0]
    w, n, g = request
    tokens = speculative_resource(*request).max_decoding_tokens
    limit = speculative_resource(*server).max_decoding_tokens
    if tokens > limit:
        return f"{ASSERT}runtime w({w}) n({n}) g({g}) exceeds maxTokensPerStep({limit})"
    for name, value, most in (("w", w, server.window_size), ("n", n, server.ngram_size),
                              ("g", g, server.verification_set_size)):
        if value > most:
            return f"{ASSERT}lookahead requires setup {name} ({value}) <= max_{name} ({most})"
    return None
