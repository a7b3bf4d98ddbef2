"""The demo extras' cache (specbuild.demo.extras): each artifact trained on the demo target is built once per key,
replaced when its key changes, and never written over something that is not one of them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from specbuild.demo import extras
from specbuild.errors import SpecbuildError


def _models_dir(tmp_path: Path, recipe_hash: str = "base-1") -> Path:
    models = tmp_path / "models"
    models.mkdir(exist_ok=True)
    (models / extras.BASE_MANIFEST).write_text(json.dumps({"recipe_hash": recipe_hash}))
    return models


@pytest.fixture
def counting_extra(monkeypatch: pytest.MonkeyPatch) -> tuple[list[dict[str, Any]], str]:
    """A registered extra whose build writes one file and counts its calls."""
    calls: list[dict[str, Any]] = []

    def build(models_dir: Path, out: Path, settings: dict[str, Any], progress: object) -> dict[str, Any]:
        calls.append(settings)
        (out / "weights.txt").write_text(f"trained with {settings}")
        return {"loss": 1.0}

    name = "test-extra"
    monkeypatch.setitem(extras.EXTRAS, name, extras.Extra(name, build, {"steps": 3}))
    return calls, name


def test_built_once_then_reused(tmp_path: Path, counting_extra: tuple[list[dict[str, Any]], str]) -> None:
    calls, name = counting_extra
    models = _models_dir(tmp_path)
    first = extras.build_extra(models, name)
    again = extras.build_extra(models, name)
    assert first == again == models / name
    assert len(calls) == 1
    record = json.loads((first / extras.EXTRA_MANIFEST).read_text())
    assert record["files"] == {"weights.txt": (first / "weights.txt").stat().st_size}
    assert str(tmp_path) not in (first / extras.EXTRA_MANIFEST).read_text()  # a moved demo dir stays valid


def test_new_settings_or_base_retrain_and_replace(tmp_path: Path, counting_extra: tuple[list[dict[str, Any]], str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A changed key (the extra's settings, or a rebuilt base) replaces the earlier build: before the fix the
    atomic swap refused a directory holding this cache's manifest instead of the stages' one."""
    calls, name = counting_extra
    models = _models_dir(tmp_path)
    extras.build_extra(models, name)
    monkeypatch.setitem(extras.EXTRAS, name, extras.Extra(name, extras.EXTRAS[name].build, {"steps": 4}))
    extras.build_extra(models, name)
    _models_dir(tmp_path, recipe_hash="base-2")
    built = extras.build_extra(models, name)
    assert [c["steps"] for c in calls] == [3, 4, 4]
    assert (built / "weights.txt").read_text() == "trained with {'steps': 4}"


def test_foreign_directory_is_not_replaced(tmp_path: Path, counting_extra: tuple[list[dict[str, Any]], str]) -> None:
    calls, name = counting_extra
    models = _models_dir(tmp_path)
    (models / name).mkdir()
    (models / name / "mine.txt").write_text("not a demo extra")
    with pytest.raises(SpecbuildError, match="not a demo extra"):
        extras.build_extra(models, name)
    assert (models / name / "mine.txt").read_text() == "not a demo extra" and not calls


def test_needs_a_base_build_and_a_known_name(tmp_path: Path) -> None:
    with pytest.raises(SpecbuildError, match="no complete demo-models build"):
        extras.build_extra(tmp_path, next(iter(sorted(extras.EXTRAS)), "eagle3-draft"))
    with pytest.raises(SpecbuildError, match="unknown demo extra"):
        extras.build_extra(_models_dir(tmp_path), "no-such-extra")
