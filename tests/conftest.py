"""Shared pytest fixtures, and the two test tiers.

Markers, set here so no test can forget them:
- `demo_models`: the test needs the trained demo models (it uses the `demo_models` fixture, directly or through
  another fixture). Added automatically from the fixture closure.
- `tritonserver`: the test starts a real tritonserver. Set by the module (`pytestmark`) or, for tests that reach a
  server through a fixture, automatically from `SERVER_FIXTURES`; a test without the marker that starts a server
  fails at once, so the fast tier cannot silently grow a server test.

`make test-fast` runs `-m "not demo_models and not tritonserver"`; `make test` runs everything.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest_plugins = ["tests.deploy_fixtures"]
"""The deployed demo pipelines and the servers on them (`deployed`, `dt_server`, ...), for every test module."""

os.environ.setdefault("HF_HUB_OFFLINE", "1")
"""No test reaches the Hugging Face Hub (these machines reach only the package registries): a spec naming a Hub id
resolves from a cache the test makes, and convert, which downloads what the cache lacks, reads the cache only."""

DEMO_MODELS_DIR = Path(os.environ.get("SPECBUILD_TEST_DEMO_MODELS") or
                       Path(__file__).resolve().parents[1] / "demo" / "models")
"""Where the session's demo models are built (cached). `make test-variant` points this at a second directory
so that models built under other conditions do not replace the ones `make demo` uses."""

SERVER_FIXTURES = frozenset({"dt_server", "medusa_server", "plain_server", "unary_server"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if "demo_models" in fixtures:
            item.add_marker(pytest.mark.demo_models)
        if fixtures & SERVER_FIXTURES:
            item.add_marker(pytest.mark.tritonserver)


@pytest.fixture(autouse=True)
def _servers_only_where_marked(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Starting a tritonserver in a test without the `tritonserver` marker is a test bug: fail with the fix."""
    if request.node.get_closest_marker("tritonserver") is not None:
        return
    from specbuild.serve.server import TritonServer

    def refuse(self: TritonServer, *args: object) -> None:
        raise AssertionError(f"{request.node.nodeid} starts a tritonserver: mark it `pytest.mark.tritonserver`")

    monkeypatch.setattr(TritonServer, "_launch", refuse)


@pytest.fixture(scope="session")
def demo_models() -> dict[str, Path]:
    """The demo models `make demo` uses: built once (about a minute and a half cold), then reused from the cache."""
    from specbuild.demo.models import build_demo_models

    return build_demo_models(DEMO_MODELS_DIR, progress=False)


@pytest.fixture(scope="session")
def demo_extra(demo_models: dict[str, Path]) -> Callable[[str], Path]:
    """`demo_extra(name)`: the directory of a demo artifact trained on the demo target (specbuild.demo.extras),
    built on first use and cached beside the demo models."""
    from specbuild.demo.extras import build_extra

    models_dir = demo_models["target"].parent
    return lambda name: build_extra(models_dir, name)


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread() -> None:
    """The tests' models are tiny: one thread is fastest for them and does not slow to a crawl when another
    process holds the second core (torch's two threads then contend for one). Demo training sets its own."""
    import torch

    torch.set_num_threads(1)


@pytest.fixture
def engines_built(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every `specbuild.runtime.serving.ServingEngine` built during the test, in order (the class is swapped for a
    subclass that records its instances), to assert which engine a stage ran its generations on."""
    from specbuild.runtime import serving

    built: list[Any] = []

    class Recording(serving.ServingEngine):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            built.append(self)

    monkeypatch.setattr(serving, "ServingEngine", Recording)
    return built
