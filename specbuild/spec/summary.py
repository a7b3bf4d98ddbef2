"""What a loaded spec resolves to (absolute paths, filled-in defaults), as the table `specbuild validate` prints."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from rich.table import Table

from specbuild.spec.fields import snapshot_commit
from specbuild.spec.schema import ModelSource, PipelineSpec


def _where(path: Path) -> str:
    """A Hub snapshot as `owner/name@commit` (what was resolved, readable), with the cache directory it reads."""
    hub = snapshot_commit(path)
    return f"{hub} (Hugging Face Hub snapshot in {path})" if hub else str(path)


def _model_row(source: ModelSource) -> str:
    return _where(source.model) + ("  (trust_remote_code)" if source.trust_remote_code else "")


def _speculation_rows(spec: PipelineSpec) -> Iterator[tuple[str, str]]:
    if spec.draft is not None:
        quant = spec.draft.quantization
        adapter = f" + the adapter {spec.draft.adapter}" if spec.draft.adapter is not None else ""
        yield "draft", (f"the target's first {spec.draft.layers} layers{adapter} (a copy: the TensorRT engines "
                        "share no weights or KV cache)" if spec.draft.is_self_draft else _model_row(spec.draft))
        if quant.enabled:
            calib = quant.calib
            yield "draft quantization", (
                f"{quant.format}, kv cache {quant.kv_cache}; calib {calib.source} "
                f"({calib.size} x {calib.seq_len} tokens)"
            )
        yield "draft tokens (K)", str(spec.speculative.num_draft_tokens)
    if spec.medusa is not None:
        tree = spec.medusa.resolved_choices()
        origin = spec.medusa.choices if isinstance(spec.medusa.choices, str) else "inline list"
        yield "medusa heads", _where(spec.medusa.heads)
        yield "medusa tree", f"{origin}: {len(tree)} nodes, depth {spec.medusa.depth}"


def summarize_spec(spec: PipelineSpec) -> Table:
    """What a spec resolves to (absolute paths, filled-in defaults), for `specbuild validate`."""
    build, deploy = spec.build, spec.deploy
    table = Table(title=f"{spec.name}  ({spec.path})", header_style="bold", title_justify="left")
    table.add_column("setting", style="cyan", no_wrap=True)
    table.add_column("value", overflow="fold")
    rows: list[tuple[str, str]] = [
        ("mode", spec.speculative.mode),
        ("target", _model_row(spec.target)),
        *_speculation_rows(spec),
        ("backend", build.backend) if build.flow == "engine" else ("flow", "pytorch (LLM API, no engines)"),
        ("dtype", build.dtype),
        ("parallelism", f"tp {build.tp_size} x pp {build.pp_size} = {build.world_size} rank(s)"),
        ("max batch", str(build.max_batch_size)),
        ("max tokens", f"input {build.max_input_len}, output {build.max_output_len}"),
        ("output_dir", str(spec.output_dir)),
        ("model repository", str(deploy.model_repository)),
        ("triton batch", str(deploy.triton_max_batch_size)),
        ("responses", "streamed (decoupled)" if deploy.decoupled else "one per request"),
        ("ports", f"http {deploy.http_port}, grpc {deploy.grpc_port}, metrics {deploy.metrics_port}"),
    ]
    for key, value in rows:
        table.add_row(key, value)
    return table
