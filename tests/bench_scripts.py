"""The bench scripts (bench/*.py) imported as they import each other: bench/ first on sys.path while they load."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[1] / "bench"


def bench_module(name: str) -> ModuleType:
    """bench/<name>.py (and whatever bench script it imports), loaded once per test session."""
    sys.path.insert(0, str(BENCH))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCH))
