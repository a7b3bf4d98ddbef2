"""Path parameters of the repository's python models, kept apart from `triton_io` so that what runs a model
outside tritonserver's python stub (`llm_engine.build_engine` in the benches) reads them by the same rule."""

from __future__ import annotations

from pathlib import Path

__all__ = ["parameter_path"]


def parameter_path(model_dir: Path, value: str) -> Path:
    """A path parameter of the model in `model_dir`: relative ones are taken from that directory, so the
    repository can move."""
    path = Path(value)
    return path if path.is_absolute() else (model_dir / path).resolve()
