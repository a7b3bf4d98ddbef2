"""The spec's `deploy.kubernetes` section: what the tritonserver Kubernetes manifests of an engine-flow repository
need from the cluster (specbuild.serve.kubernetes writes them).

The default image follows NVIDIA's release compatibility matrix (triton-inference-server/server
docs/introduction/compatibility.md @0f963c9a8c6913aa4cd9b57ee04f9c2b76ee8d2a, "Container Name: trtllm-python-py3"):
26.03 carries TensorRT-LLM 1.2.0, 26.04 to 26.07 carry 1.2.1. A TensorRT engine runs only under the TensorRT-LLM
release that built it, so the image is the one whose TensorRT-LLM is the build container's
(`specbuild.build.trtllm_flags.CONTAINER`, tensorrt-llm/release:1.2.0).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, Strict

TRITON_TRTLLM_IMAGES: dict[str, str] = {
    "1.2.0": "nvcr.io/nvidia/tritonserver:26.03-trtllm-python-py3",
    "1.2.1": "nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3",
}
"""TensorRT-LLM release -> the newest Triton trtllm-python-py3 image that carries it (see the module docstring)."""
ENGINE_TRTLLM_RELEASE = "1.2.0"
"""The TensorRT-LLM release `specbuild build` plans engines with (its container, build.trtllm_flags.CONTAINER)."""


def object_name(spec_name: str) -> str:
    """A spec's name as a Kubernetes object name (an RFC 1123 label: lower-case ASCII letters, digits and '-', at
    most 63 characters), for every manifest specbuild writes."""
    text = "".join(c if c.isascii() and c.isalnum() else "-" for c in spec_name.lower()).strip("-")
    return text[:63].strip("-") or "specbuild"


class KubernetesSpec(BaseModel):
    """The cluster side of the tritonserver manifests `deploy` writes for TensorRT-LLM engines (`<output_dir>/k8s/`)."""

    model_config = ConfigDict(extra="forbid")

    models_pvc: Annotated[str, Strict(), Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")] = "specbuild-models"
    """The PersistentVolumeClaim that holds the build (the model repository and the engines), mounted at the same
    path as on the machine that ran deploy, so the paths in the repository's config.pbtxt files hold in the pod."""
    image: Annotated[str, Strict(), Field(min_length=1)] | None = None
    """The tritonserver image. Default: NVIDIA's Triton trtllm-python-py3 release carrying the TensorRT-LLM that
    built the engines (26.03 for 1.2.0)."""

    @property
    def container_image(self) -> str:
        return self.image or TRITON_TRTLLM_IMAGES[ENGINE_TRTLLM_RELEASE]
