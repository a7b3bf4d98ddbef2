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


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread() -> None:
    """The tests' models are tiny: one thread is fastest for them and does not slow to a crawl when another
    process holds the second core (torch's two threads then contend for one). Demo training sets its own."""
    import torch

    torch.set_num_threads(1)
