"""The spec's `deploy.dynamo` section (used with `deploy.target: dynamo`) and the checks that refuse a Dynamo
deployment whose workers cannot run, before anything is written.

Facts the checks rest on:
- Dynamo's TensorRT-LLM worker takes LLM-API settings (`python -m dynamo.trtllm --extra-engine-args FILE.yaml`) and
  runs TensorRT-LLM's PyTorch backend only (ai-dynamo/dynamo examples/backends/trtllm/engine_configs/, and the 1.6.1
  wheel's dynamo/profiler/templates/dgd/trtllm/agg.yaml), so `engine: trtllm` needs `build.flow: pytorch`.
- A worker is one pod: its GPUs (`tensor_parallel_size` x `pipeline_parallel_size`) must fit on one node; specbuild
  writes no multinode workers.
- Disaggregated prefill/decode moves the KV cache between workers: TensorRT-LLM's `cache_transceiver_config.backend`
  (NIXL, UCX, MPI), vLLM's `--kv-transfer-config` NixlConnector, SGLang's `--disaggregation-transfer-backend`
  (nixl, mooncake); the 1.6.1 wheel's dynamo/profiler/templates/dgd/{trtllm,vllm,sglang}/disagg.yaml set them.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict

from specbuild.spec.fields import Count

Engine = Literal["trtllm", "vllm", "sglang"]
KvTransfer = Literal["nixl", "ucx", "mpi", "mooncake"]
KV_TRANSFERS: dict[str, tuple[str, ...]] = {"trtllm": ("nixl", "ucx", "mpi"), "vllm": ("nixl",),
                                            "sglang": ("nixl", "mooncake")}
"""Which KV-transfer backends each engine's disaggregated workers take (see the module docstring)."""

DYNAMO_VERSION = "1.6.1"
IMAGES: dict[str, str] = {engine: f"nvcr.io/nvidia/ai-dynamo/{name}-runtime:{DYNAMO_VERSION}"
                          for engine, name in (("trtllm", "tensorrtllm"), ("vllm", "vllm"), ("sglang", "sglang"))}
"""The NGC runtime images Dynamo 1.6.1's own DGD templates use (wheel: dynamo/profiler/templates/dgd/*/agg.yaml)."""
FRONTEND_SERVICE = "Frontend"
WORKER_SERVICES: dict[str, str] = {"trtllm": "TRTLLMWorker", "vllm": "worker", "sglang": "decode"}
"""The DynamoGraphDeployment's components: the frontend, and an aggregated worker's by engine (disaggregated
workers' are their roles, `prefill` and `decode`), named as the 1.6.1 wheel's own DGD templates name them
(dynamo/profiler/templates/dgd/{trtllm,vllm,sglang}/agg.yaml: `TRTLLMWorker`; `worker`, Dynamo 1.6.0 having renamed
the vLLM workers; SGLang's aggregated worker `decode`, of type worker)."""


class DynamoSpec(BaseModel):
    """NVIDIA Dynamo in front of the spec's engine: an OpenAI frontend, its router, and the engine's workers."""

    model_config = ConfigDict(extra="forbid")

    engine: Engine = "trtllm"
    """The workers' engine: `trtllm` (`python -m dynamo.trtllm`, the PyTorch flow's LLM-API settings; served on CPU
    by specbuild's reference engine with build.backend: reference), `vllm` or `sglang` (`python -m dynamo.vllm` /
    `dynamo.sglang` with the arguments `specbuild export` writes)."""
    mode: Literal["aggregated", "disaggregated"] = "aggregated"
    """`aggregated`: every worker prefills and decodes; `disaggregated`: prefill and decode workers, the KV cache
    moved between them (`kv_transfer`)."""
    workers: Count = 1
    """Aggregated workers (replicas)."""
    prefill_workers: Count = 1
    """Disaggregated: prefill workers."""
    decode_workers: Count = 1
    """Disaggregated: decode workers."""
    router_mode: Literal["kv", "round-robin"] = "kv"
    """The frontend's `--router-mode`: `kv` routes by KV-cache (prefix) overlap, `round-robin` in turn."""
    kv_transfer: KvTransfer | None = None
    """Disaggregated: how the KV cache moves from prefill to decode workers (required there): trtllm nixl, ucx or
    mpi; vllm nixl; sglang nixl or mooncake."""
    gpus_per_node: Count = 8
    """GPUs on one node of the cluster: a worker's tp x pp GPUs must fit on one."""
    image: Annotated[str, Strict(), Field(min_length=1)] | None = None
    """The workers' and frontend's container image. Default: Dynamo 1.6.1's NGC runtime image for the engine."""
    models_pvc: Annotated[str, Strict(), Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")] = "specbuild-models"
    """The PersistentVolumeClaim holding the models (target, draft) in the Kubernetes manifests, mounted at
    /models: the target at /models/target, the draft at /models/draft."""

    @property
    def container_image(self) -> str:
        return self.image or IMAGES[self.engine]

    def worker_counts(self) -> dict[str, int]:
        """Worker role -> replicas: {"worker": N} aggregated, {"prefill": P, "decode": D} disaggregated."""
        if self.mode == "aggregated":
            return {"worker": self.workers}
        return {"prefill": self.prefill_workers, "decode": self.decode_workers}

    def service_names(self) -> list[str]:
        """The DynamoGraphDeployment's components: the frontend, then one per worker role."""
        workers = [WORKER_SERVICES[self.engine] if role == "worker" else role for role in self.worker_counts()]
        return [FRONTEND_SERVICE, *workers]
