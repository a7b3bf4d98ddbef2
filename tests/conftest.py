"""Shared pytest fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

DEMO_MODELS_DIR = Path(__file__).resolve().parents[1] / "demo" / "models"


@pytest.fixture(scope="session")
def demo_models() -> dict[str, Path]:
    """The demo models `make demo` uses: built once (about a minute cold), then reused from the cache."""
    from specbuild.demo_models import build_demo_models

    return build_demo_models(DEMO_MODELS_DIR, progress=False)
