"""The README's runnable command blocks run as written on the demo models.

A fenced block that follows a `<!-- runnable -->` line is a promise that a user can paste it after `make demo`:
this test runs each such block in bash (`set -e`, the project's `specbuild` first on PATH) from the repository
root, with two substitutions and no others: `demo/models/` (also as `$PWD/demo/models/`, the absolute form a spec
written under /tmp needs) becomes the test session's demo-model directory (the same models unless
`make test-variant` moved them) and `/tmp/` a fresh temporary directory, so the test writes nothing outside it.
Every command must exit 0; a block whose command fails, or a README that marks no block at all, fails the test.
The README's relative links (into docs/ and the repository) must name files that exist.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
MARKER = "<!-- runnable -->"
BLOCK = re.compile(rf"^{re.escape(MARKER)}\n```(?:sh|bash)\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def runnable_blocks(text: str) -> list[str]:
    """The bodies of the fenced sh/bash blocks that directly follow a runnable marker, in README order."""
    return BLOCK.findall(text)


def test_the_readme_marks_runnable_blocks() -> None:
    blocks = runnable_blocks(README.read_text(encoding="utf-8"))
    assert blocks, f"{README}: no block follows {MARKER!r}"
    marked = README.read_text(encoding="utf-8").count(MARKER)
    assert len(blocks) == marked, f"{README}: {marked} markers, but only {len(blocks)} are followed by a sh block"


LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_the_readme_links_name_files_that_exist() -> None:
    text = README.read_text(encoding="utf-8")
    targets = [t for t in LINK.findall(text) if "://" not in t]
    assert any(t.startswith("docs/") for t in targets), f"{README}: no link into docs/"
    missing = [t for t in targets if not (REPO / t).exists()]
    assert not missing, f"{README}: links to files that do not exist: {missing}"


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(runnable_blocks(README.read_text(encoding="utf-8")))))
def test_a_runnable_readme_block_runs_on_the_demo(index: int, demo_models: dict[str, Path], tmp_path: Path) -> None:
    block = runnable_blocks(README.read_text(encoding="utf-8"))[index]
    models = demo_models["target"].parent
    places = {"$PWD/demo/models/": f"{models}/", "demo/models/": f"{models}/", "/tmp/": f"{tmp_path}/"}
    # in one pass (either may hold the other); the alternation tries the longer $PWD form first
    script = re.sub("|".join(map(re.escape, places)), lambda found: places[found.group(0)], block)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=1200)
    assert result.returncode == 0, (f"README block {index + 1} failed (exit {result.returncode}):\n{block}\n"
                                    f"--- stderr:\n{result.stderr[-4000:]}")
