"""The two files every bench script leaves in bench/results/: `<stem>.json` (every figure, settings, machine info)
and `<stem>.md` (the tables docs/benchmarks.md includes), written by one function so they always come as a pair."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def write_results(folder: Path, stem: str, report: Mapping[str, Any], text: str) -> None:
    """Write `report` as `<stem>.json` and `text` as `<stem>.md` under `folder` (created if missing)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{stem}.json").write_text(json.dumps(report, indent=2) + "\n")
    (folder / f"{stem}.md").write_text(text)
