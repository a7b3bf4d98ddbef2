"""`specbuild demo-models --extras`: `make demo` trains the base models only, each `make demo-<method>` the extra
its spec names, and a misspelt extra is refused before the base build's minutes are spent."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from specbuild.cli import app
from specbuild.demo import extras
from specbuild.demo import models as dm
from specbuild.demo import recipe as dr
from tests.test_demo_models import tiny_recipe


def test_an_unknown_extra_is_refused_before_anything_is_built(tmp_path: Path) -> None:
    out = tmp_path / "models"
    result = CliRunner().invoke(app, ["demo-models", str(out), "--extras", "eagle3-draft,no-such-extra"])
    assert result.exit_code == 1, result.output
    assert "no-such-extra" in result.output and "eagle3-draft" in result.output  # the known names are listed
    assert not out.exists()


def test_extras_none_builds_the_base_models_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dr, "RECIPE", tiny_recipe())
    out = tmp_path / "models"
    result = CliRunner().invoke(app, ["demo-models", str(out), "--extras", "none"])
    assert result.exit_code == 0, result.output
    assert dm.is_complete(out, dr.recipe_hash(tiny_recipe()))
    assert not [name for name in extras.known_extras() if (out / name).exists()]
