"""The documentation site builds, cites its figures and lists the refusals users meet.

- `mkdocs build --strict` (what `make docs` runs) passes: a broken link, a missing page in the nav, a missing
  anchor or a `--8<--` include of a bench/results file that is not there fails it.
- Every figure typed in README.md or docs/ (a number with a unit: tok/s, ms, s, %, ×, GB, ...) is also found in a
  bench/results file; figures the pages include from there are not typed at all.
- The troubleshooting page's generated tables (docs/hooks/refusals.py) hold the messages a wrong spec really gets:
  each problem `load_spec` reports for a set of broken specs matches one of the listed templates.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
FIGURE = re.compile(r"(?<![\w.@/-])(\d+(?:\.\d+)?)(?:(x|×)|\s?(tok/s|tokens/s|ms|s|%|min|GB|GiB|MB|MiB|KiB))(?![\w/])")
"""A measured figure: `1.40x`, `1.21×`, `117.8 tok/s`, `30.7 ms`, `88 s`, `99 %`, `9.4 GB` (a multiplication sign
after a space is an operator, as in `64 x 256`)."""
INCLUDE = re.compile(r"^\s*--8<--.*$", re.MULTILINE)


@functools.cache
def _refusals() -> ModuleType:
    """docs/hooks/refusals.py, the hook mkdocs runs (not a package module: loaded from its file)."""
    spec = importlib.util.spec_from_file_location("docs_hooks_refusals", REPO / "docs" / "hooks" / "refusals.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_the_site_builds_in_strict_mode(tmp_path: Path) -> None:
    mkdocs = Path(sys.executable).parent / "mkdocs"
    result = subprocess.run([str(mkdocs), "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=REPO,
                            env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    troubleshooting = (tmp_path / "site" / "troubleshooting" / "index.html").read_text(encoding="utf-8")
    assert "<!-- refusals:" not in troubleshooting  # every marker was replaced by its table


def figures(text: str) -> list[str]:
    """The figures typed in `text` (include lines left out), as written."""
    return [found.group(0) for found in FIGURE.finditer(INCLUDE.sub("", text))]


def test_the_figure_pattern_finds_figures_and_leaves_operators() -> None:
    assert figures("reaches 1.40x plain, 117.8 tok/s, 30.7 ms and 88 s (99 %)") == [
        "1.40x", "117.8 tok/s", "30.7 ms", "88 s", "99 %"]
    assert figures("64 x 256 tokens, tp × pp, Python 3.11, K = 4, SM 100-119, --max-tokens 48") == []
    assert figures('--8<-- "bench/results/serving.md:3"\n') == []


def _sourced(number: str, sources: str) -> bool:
    return re.search(rf"(?<![\d.]){re.escape(number)}(?![\d])", sources) is not None


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_typed_figure_has_a_bench_results_source(page: Path) -> None:
    sources = "\n".join(p.read_text(encoding="utf-8", errors="replace") for p in sorted(RESULTS.iterdir())
                        if p.suffix in (".md", ".json", ".txt"))
    unsourced = [figure for figure in figures(page.read_text(encoding="utf-8"))
                 if not _sourced(FIGURE.match(figure).group(1), sources)]  # type: ignore[union-attr]
    assert not unsourced, (f"{page.relative_to(REPO)}: figures found in no bench/results file: {unsourced}; "
                           "include the bench/results file (--8<--) or cite a figure it holds")


BROKEN_SPECS = {
    "misspelt key": "targt:\n  model: target\n",
    "missing target": "speculative:\n  mode: none\n",
    "wrong type": "target:\n  model: target\nbuild:\n  max_batch_size: many\n",
    "out of range": "target:\n  model: target\nbuild:\n  max_batch_size: 0\n",
    "unknown mode": "target:\n  model: target\nspeculative:\n  mode: sometimes\n",
    "layers without a self-draft": "target:\n  model: target\ndraft:\n  model: target\n  layers: 2\n"
                                   "speculative:\n  mode: draft_target\n",
    "self-draft without layers": "target:\n  model: target\ndraft:\n  source: target_layers\n"
                                 "speculative:\n  mode: draft_target\n",
    "lookahead too small": "target:\n  model: target\nspeculative:\n  mode: lookahead\n  lookahead:\n"
                           "    window_size: 1\n    ngram_size: 1\n    verification_set_size: 0\n",
}


def _template_pattern(template: str) -> re.Pattern[str]:
    parts = re.split(r"‹[^›]*›", " ".join(template.split()))
    return re.compile(".*?".join(map(re.escape, parts)), re.DOTALL)


@functools.cache
def _spec_templates() -> list[re.Pattern[str]]:
    return [_template_pattern(r.message) for r in _refusals().collect()["spec"]]


@pytest.mark.parametrize("name", sorted(BROKEN_SPECS))
def test_troubleshooting_lists_the_problems_a_broken_spec_gets(name: str, tmp_path: Path) -> None:
    from specbuild.errors import SpecError
    from specbuild.spec.load import load_spec
    from specbuild.spec.problems import SpecValidationError

    (tmp_path / "target").mkdir()
    spec = tmp_path / "pipeline.yaml"
    spec.write_text(f"name: broken\noutput_dir: build\n{BROKEN_SPECS[name]}")
    with pytest.raises(SpecError) as raised:
        load_spec(spec)
    problems = raised.value.problems if isinstance(raised.value, SpecValidationError) else []
    assert problems, f"{name}: expected located spec problems, got {raised.value}"
    templates = _spec_templates()
    unlisted = [p.message for p in problems if not any(t.fullmatch(" ".join(p.message.split())) for t in templates)]
    assert not unlisted, f"{name}: reported but not on the troubleshooting page: {unlisted}"
