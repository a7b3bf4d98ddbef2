"""One module per model family; importing this package fills the registry."""

from specbuild.convert.architectures import gpt2, llama, qwen2  # noqa: F401  (registration)
from specbuild.convert.architectures.base import REGISTRY, Architecture, architecture_for, register

__all__ = ["REGISTRY", "Architecture", "architecture_for", "register"]
