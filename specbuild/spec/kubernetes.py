"""The spec's `deploy.kubernetes` section: what the tritonserver Kubernetes manifests of an engine-flow repository
need from the cluster (specbuild.serve.kubernetes writes them), and the rules for the names in every manifest
specbuild writes: `object_name` for the objects, `dynamo_name_problem` for the pods Dynamo's operator makes.

Dynamo's operator runs a DynamoGraphDeployment as one Grove PodCliqueSet named as the DGD, with a PodClique per
service named as the service lower-cased (ai-dynamo/dynamo deploy/operator/internal/dynamo/graph.go @d4872d7e,
GenerateGrovePodCliqueSet; in v1beta1 a service is a `spec.components` entry and its clique is
`strings.ToLower(component.ComponentName)`, as the operator's Grove provider overrides look cliques up); Grove
refuses a PodCliqueSet whose name plus a PodClique's pass 45 characters, the rest of a pod's name being indices,
hyphens and a random suffix (ai-dynamo/grove
operator/internal/webhook/admission/pcs/validation/podcliqueset.go @4d416a5c, validatePodNameConstraints; the same
45 in ai-dynamo/dynamo deploy/operator/internal/consts/consts.go @0367e404, MaxCombinedGroveResourceNameLength).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, Strict

from specbuild.contracts.images import TRITON_ENGINE_IMAGE
from specbuild.spec.dynamo import DynamoSpec

NAME_PREFIX = "specbuild"
"""What an object name starts with when the spec's name cannot (it starts with a digit, or has no letter or digit)."""
POD_NAME_PARTS = 45
"""Grove's limit on a PodCliqueSet's name plus a PodClique's: a DGD's name plus a component's (module docstring)."""


def object_name(spec_name: str) -> str:
    """A spec's name as the name of every object specbuild's manifests create: an RFC 1035 label (lower-case ASCII
    letters, digits and '-', starting with a letter, at most 63 characters). Kubernetes asks that of a Service
    (kubernetes/kubernetes pkg/apis/core/validation/validation.go @000f2605: `ValidateServiceName =
    NameIsDNS1035Label`), and it is a valid Deployment (RFC 1123 subdomain) and DynamoGraphDeployment name too. A
    name that starts with a digit gets NAME_PREFIX in front (`7b-medusa` -> `specbuild-7b-medusa`), not refused:
    the spec's name may start with one for every other use."""
    text = "".join(c if c.isascii() and c.isalnum() else "-" for c in spec_name.lower()).strip("-")
    if text[:1].isdigit():
        text = f"{NAME_PREFIX}-{text}"
    return text[:63].strip("-") or NAME_PREFIX


def dynamo_name_problem(spec_name: str, dynamo: DynamoSpec) -> str | None:
    """Why Dynamo's operator would refuse the DynamoGraphDeployment of a spec named `spec_name` (its pods' names
    would be too long, module docstring), with the longest name that fits; None when it would not."""
    name, service = object_name(spec_name), max(dynamo.service_names(), key=len)
    room = POD_NAME_PARTS - len(service)
    if len(name) <= room:
        return None
    return (f"too long for a Dynamo deployment: Grove names its pods from the DynamoGraphDeployment's name "
            f"({name!r}, {len(name)} characters) and the component's ({service.lower()!r}), together at most "
            f"{POD_NAME_PARTS} characters, so the name may have {room} (e.g. {name[:room].rstrip('-')!r})")


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
