"""One module per model family; importing this package imports each of them, which fills the registry (a new
family is one new module here, nothing else to edit)."""

import importlib
import pkgutil

from specbuild.convert.architectures.base import REFUSED, REGISTRY, Architecture, architecture_for, refuse, register

for _module in pkgutil.iter_modules(__path__):
    if _module.name != "base":
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["REFUSED", "REGISTRY", "Architecture", "architecture_for", "refuse", "register"]
