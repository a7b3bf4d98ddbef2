"""The spec's `deploy.kubernetes` section: what the tritonserver Kubernetes manifests of an engine-flow repository
need from the cluster (specbuild.serve.kubernetes writes them), and the one rule for Kubernetes object names.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, Strict

from specbuild.contracts.images import TRITON_ENGINE_IMAGE


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
    builds the engines (26.03 for 1.2.0; specbuild.contracts.images)."""

    @property
    def container_image(self) -> str:
        return self.image or TRITON_ENGINE_IMAGE
