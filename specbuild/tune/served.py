"""`specbuild tune --served`: the load-aware schedule measured behind tritonserver, on the spec's own deployment.

In-process, a step's only cost is the engine's; served, every step also sends one response per sequence through
the python backend, postprocessing and gRPC, and that cost is the same for a plain step and a speculative one
whose response carries several tokens. So a length that loses in-process under load can win served, and the
schedule measured in-process turns speculation off where the server would gain from it. Here the deployed
repository is served by tritonserver once per candidate length, that length fixed at every batch size from 2 up
(`specbuild.runtime.schedule.fixed_length`, passed in SCHEDULE_ENV, so nothing is redeployed), and driven with
`specbuild bench`'s closed-loop load at each batch size: `batch` streaming clients sending the calibration prompts.
Every TensorRT-LLM line drafts the full length at batch size 1, so there only K itself is measured, and only for
the BLS's draft-target (`bls_draft_limit`): every K up to the target engine's max_draft_len, one streaming client
asking it with NVIDIA's `num_draft_tokens` input; the spec's K is the shortest one whose median pass lies within
this run's noise of the best K's (`specbuild.tune.schedule.shortest_within_noise`).

Measured on this machine, with the reference backend tritonserver runs here; on another machine or backend the
balance differs, so tune where the deployment will serve.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

from specbuild.errors import SpecbuildError
from specbuild.spec import PipelineSpec
from specbuild.tune.schedule import ScheduleTuning, length_orders


def deployed_repository(spec: PipelineSpec) -> Path:
    """The spec's deployed Triton repository, or an error saying how to deploy it."""
    repository = spec.deploy.model_repository
    if repository is None or not (repository / "manifest.json").is_file():
        raise SpecbuildError(f"--served measures the deployed repository, and {spec.path} has none at {repository}",
                             hint=f"run `specbuild convert/build/deploy {spec.path}` first, or leave out --served")
    return repository


ONE_CLIENT_PASSES = 3
"""Passes of every K at batch size 1 on each of the `repeats` servers, interleaved: one client's pass takes a few
seconds, and K is chosen within the spread of those passes (shortest_within_noise), which needs several of them."""


def bls_draft_limit(repository: Path) -> int | None:
    """The target engine's max_draft_len where the repository drafts through the BLS's draft model (the engine
    flow's draft-target), else None. Only there is a round two Triton calls, a cost a longer K spreads over more
    tokens (the 1.2 target also makes K + 1 tokens a round whatever it accepts), so the K the in-process tune
    chose for one engine need not be the served optimum: K at batch size 1 is measured served too."""
    from specbuild.deploy.layout import BLS
    from specbuild.deploy.pbtxt import parameters, read_config

    config = repository / BLS / "config.pbtxt"
    if not config.is_file():
        return None
    params = parameters(read_config(config))
    if not params.get("tensorrt_llm_draft_model_name"):
        return None
    return int(params.get("max_draft_len") or 0) or None


def measure_served_schedule(spec: PipelineSpec, texts: Sequence[str], sizes: Sequence[int],
                            lengths: Callable[[int], Sequence[int]], full_length: int, new_tokens: int, repeats: int,
                            tick: Callable[[], None], limit: int | None, log_dir: Path | None = None) -> ScheduleTuning:
    """Output tokens/s of the deployment at each batch size in `sizes` (1 left out) and each length (0, the full
    one and `lengths(full)`), the fastest of `repeats` passes; one server per length and pass. Where the BLS drafts
    (`limit`: bls_draft_limit of the deployed repository), first every K up to that max_draft_len at batch size 1
    (one client sending NVIDIA's `num_draft_tokens` input), and the shortest K whose median pass lies within the passes'
    noise of the best K's is the full length the loaded sizes are measured with."""
    from specbuild.bench.load import STEADY_PER_CLIENT, Load, TokenCounter, rotations, run_load
    from specbuild.runtime.schedule import DRAFT_LEN_ENV, SCHEDULE_ENV, fixed_length
    from specbuild.serve.server import TritonServer

    repository = deployed_repository(spec)
    counter = TokenCounter(Path(spec.target.model)) if Path(spec.target.model).is_dir() else TokenCounter()
    tuning = ScheduleTuning(full_length, served=True, current=spec.speculative.draft_len_schedule)
    most = max(sizes)
    log_dir = log_dir or repository.parent / "tune-served"

    def measure(name: str, length: int, cells: Sequence[tuple[int, int]], k: Callable[[int], int | None]) -> None:
        """One server whose models run `length` from batch size 2 on; (batch size, key) cells measured on it,
        a request asking K `k(key)` (None: the repository's)."""
        env = {SCHEDULE_ENV: json.dumps(fixed_length(limit or tuning.full_length, length, most))}
        if limit:  # every K a request may ask for is within the full length (served_draft_len)
            env[DRAFT_LEN_ENV] = str(limit)
        log = log_dir / f"tritonserver-{name}.log"
        server = TritonServer(repository, env=env, log_file=log)
        with server:
            for size, key in cells:
                load = Load(prompts=list(texts), max_tokens=new_tokens, concurrency=size,
                            per_client=STEADY_PER_CLIENT, num_draft_tokens=k(key))
                rate = run_load(server.grpc_url, load, counter=counter).output_tokens_per_s
                tuning.record(size, key, rate)
                if size == 1:
                    tuning.one_client.setdefault(key, []).append(rate)
                tick()
        _check_read(server.log_text(), log, repository, DRAFT_LEN_ENV if limit else None)  # stopped: all written

    if limit:  # a pass of one client is short, and neighbouring Ks lie close: more passes, interleaved
        orders = rotations(range(1, limit + 1), repeats * ONE_CLIENT_PASSES)  # no K always first in its pass
        for server in range(repeats):
            passes = orders[server * ONE_CLIENT_PASSES : (server + 1) * ONE_CLIENT_PASSES]
            measure("batch1", 0, [(1, k) for order in passes for k in order], lambda k: k)
        tuning.choose_full_length()
    full = tuning.full_length
    for order in length_orders(full, lengths(full), repeats):
        for length in order:
            measure(f"k{length}", length, [(size, length) for size in sizes if size > 1],
                    lambda _: full if limit else None)
    return tuning


def _check_read(logged: str, log: Path, repository: Path, also: str | None = None) -> None:
    """The served models said they run the fixed length (`served_steps` logs it) and, where `also` names it, the
    full length K (`served_draft_len`), or nothing here is measured: NVIDIA's C++ tensorrtllm backend and its llmapi
    model do not read SCHEDULE_ENV, and would serve their own schedule at every length."""
    from specbuild.runtime.schedule import SCHEDULE_ENV

    for name in (SCHEDULE_ENV, also):
        if name and name not in logged:
            raise SpecbuildError(f"the models of {repository} did not read {name} (see {log}), so every length "
                                 "would serve their own schedule",
                                 hint="--served measures repositories whose speculation runs in specbuild's models "
                                      "(build.backend: reference) or in the BLS")
