"""Which files make a directory a tokenizer, per stage: one marker list (`tokenizer.TOKENIZER_MARKERS`) for what
deploy copies and the bench counts with, plus tokenizer.model for calibrating a sentencepiece-only draft.

Files only: nothing here loads transformers. The expected sets are what each stage accepted before the lists were
merged, so a user's directory is accepted or refused as it was.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from specbuild.convert.quantize.plan import tokenizer_files_problem
from specbuild.errors import SpecbuildError
from specbuild.tokenizer import copy_tokenizer, has_tokenizer

FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "special_tokens_map.json")


@pytest.mark.parametrize("name", FILES)
def test_each_stage_accepts_the_tokenizer_files_it_always_did(tmp_path: Path, name: str) -> None:
    source = tmp_path / "model"
    source.mkdir()
    (source / name).write_text("{}", encoding="utf-8")
    marker = name in ("tokenizer.json", "tokenizer_config.json")
    assert has_tokenizer(source) == marker
    assert (tokenizer_files_problem(source) is None) == (marker or name == "tokenizer.model")
    if marker:
        assert copy_tokenizer(source, tmp_path / "copy", trust_remote_code=False) == [name]
    else:
        with pytest.raises(SpecbuildError, match=r"no tokenizer here \(tokenizer\.json / tokenizer_config\.json\)"):
            copy_tokenizer(source, tmp_path / "copy", trust_remote_code=False)


def test_a_missing_tokenizer_directory_is_named_as_missing(tmp_path: Path) -> None:
    """transformers takes a path that does not exist for a Hub repo id and complains about its form; the user
    must hear that the directory is not there."""
    from specbuild.tokenizer import load_tokenizer

    missing = tmp_path / "models" / "target"
    with pytest.raises(SpecbuildError) as caught:
        load_tokenizer(missing)
    assert str(caught.value).startswith(f"{missing}: cannot load the tokenizer: no such directory")
    assert "repo" not in str(caught.value).lower()
