"""`specbuild tune --served`: the load-aware schedule measured behind tritonserver, on the spec's own deployment.

In-process, a step's only cost is the engine's; served, every step also sends one response per sequence through
the python backend, postprocessing and gRPC, and that cost is the same for a plain step and a speculative one
whose response carries several tokens. So a length that loses in-process under load can win served, and the
schedule measured in-process turns speculation off where the server would gain from it. Here the deployed
repository is served by tritonserver once per candidate length, that length fixed at every batch size from 2 up
(`specbuild.runtime.schedule.fixed_length`, passed in SCHEDULE_ENV, so nothing is redeployed), and driven with
`specbuild bench`'s closed-loop load at each batch size: `batch` streaming clients sending the calibration prompts.
Batch size 1 is not measured: every TensorRT-LLM line drafts the full length there.

Measured on this machine, with the reference backend tritonserver runs here; on another machine or backend the
balance differs, so tune where the deployment will serve.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

from specbuild.errors import SpecbuildError
from specbuild.spec import PipelineSpec
from specbuild.tune.schedule import ScheduleTuning


def deployed_repository(spec: PipelineSpec) -> Path:
    """The spec's deployed Triton repository, or an error saying how to deploy it."""
    repository = spec.deploy.model_repository
    if repository is None or not (repository / "manifest.json").is_file():
        raise SpecbuildError(f"--served measures the deployed repository, and {spec.path} has none at {repository}",
                             hint=f"run `specbuild convert/build/deploy {spec.path}` first, or leave out --served")
    return repository


def measure_served_schedule(spec: PipelineSpec, texts: Sequence[str], sizes: Sequence[int], lengths: Sequence[int],
                            full_length: int, new_tokens: int, repeats: int, tick: Callable[[], None],
                            log_dir: Path | None = None) -> ScheduleTuning:
    """Output tokens/s of the deployment at each batch size in `sizes` (1 left out) and each length (0, `lengths`
    and the full one), the fastest of `repeats` passes; one server per length and pass."""
    from specbuild.bench.load import STEADY_PER_CLIENT, Load, TokenCounter, run_load
    from specbuild.runtime.schedule import SCHEDULE_ENV, fixed_length
    from specbuild.serve.server import TritonServer

    repository = deployed_repository(spec)
    counter = TokenCounter(Path(spec.target.model)) if Path(spec.target.model).is_dir() else TokenCounter()
    tuning = ScheduleTuning(full_length, served=True)
    loaded = [size for size in sizes if size > 1]
    most = max(sizes)
    log_dir = log_dir or repository.parent / "tune-served"
    for _ in range(repeats):
        for length in sorted({0, full_length, *lengths}):
            env = {SCHEDULE_ENV: json.dumps(fixed_length(full_length, length, most))}
            log = log_dir / f"tritonserver-k{length}.log"
            server = TritonServer(repository, env=env, log_file=log)
            with server:
                for size in loaded:
                    load = Load(prompts=list(texts), max_tokens=new_tokens, concurrency=size,
                                per_client=STEADY_PER_CLIENT)
                    rate = run_load(server.grpc_url, load, counter=counter).output_tokens_per_s
                    cell = tuning.tokens_per_second.setdefault(size, {})
                    cell[length] = max(cell.get(length, 0.0), rate)
                    tick()
            _check_read(server.log_text(), log, repository)  # stopped: the whole log is written
    return tuning


def _check_read(logged: str, log: Path, repository: Path) -> None:
    """The served models said they run the fixed length (`served_steps` logs it), or nothing here is measured:
    NVIDIA's C++ tensorrtllm backend and its llmapi model do not read SCHEDULE_ENV, and would serve their own
    schedule at every length."""
    from specbuild.runtime.schedule import SCHEDULE_ENV

    if SCHEDULE_ENV not in logged:
        raise SpecbuildError(f"the models of {repository} did not read {SCHEDULE_ENV} (see {log}), so every length "
                             "would serve their own schedule",
                             hint="--served measures repositories whose speculation runs in specbuild's models "
                                  "(build.backend: reference) or in the BLS")
