"""Field types the spec sections share: paths anchored at the spec file's directory, counts and ports.

Relative paths are resolved once, here, against the spec file's directory (the working directory for in-memory
specs), so a spec means the same from any working directory and no later stage resolves a path again.

A `model:` may name a Hugging Face Hub id instead (`owner/name`, with `revision:`): a value is a local path when it
exists, starts with `/`, `./`, `../` or `~`, or has more than one `/`; otherwise a valid `owner/name` repo id is a
Hub id, resolved here, once, to its snapshot directory in huggingface_hub's cache, so every stage reads a local
directory. Only what convert, validate and deploy read is fetched (config and tokenizer files, safetensors
weights): never pickle weights, never code. `HF_HUB_OFFLINE=1` resolves from the cache only.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, BeforeValidator, Field, Strict, ValidationInfo

from specbuild.spec.problems import custom_error, show
from specbuild.tokenizer import TOKENIZER_FILES


def spec_path_from(context: object) -> Path | None:
    """The spec file's absolute path, which the loader passes as validation context (`spec_path`)."""
    if isinstance(context, dict) and isinstance(context.get("spec_path"), Path):
        return context["spec_path"]
    return None


def base_dir(context: object) -> Path:
    """Where relative paths start: the spec file's directory (the working directory for in-memory specs)."""
    spec_path = spec_path_from(context)
    return spec_path.parent if spec_path is not None else Path.cwd()


def resolve(value: Path, base: Path) -> Path:
    # normpath, not resolve(): keep the user's symlinks and do not touch the filesystem.
    return Path(os.path.normpath(base / value.expanduser()))


def _check_path_input(value: object) -> object:
    if isinstance(value, os.PathLike) or (isinstance(value, str) and value.strip()):
        return value
    raise custom_error("path_type", f"must be a non-empty path (got {show(value)})")


def _resolve_path(value: Path, info: ValidationInfo) -> Path:
    """Anchor a relative path at the spec's directory, so the spec means the same from any working dir."""
    return resolve(value, base_dir(info.context))


ALLOW_PATTERNS = ("*.json", "*.safetensors", *TOKENIZER_FILES)
"""What a snapshot holds: config.json, generation_config.json, the safetensors shards and their index, tokenizer."""

_LOCAL_PREFIXES = ("/", "./", "../", "~")
_DOWNLOADS: ContextVar[bool] = ContextVar("specbuild_hub_downloads", default=False)


def snapshot_commit(path: Path) -> str | None:
    """`owner/name@commit` when `path` is a snapshot in huggingface_hub's cache (`models--owner--name/snapshots/
    <commit>`; a repo id never holds `--`), else None: what a manifest records so a rebuild is reproducible."""
    repo = path.parent.parent.name
    if path.parent.name != "snapshots" or not repo.startswith("models--"):
        return None
    return f"{repo.removeprefix('models--').replace('--', '/')}@{path.name}"


class HubProblem(Exception):
    """Why an id did not resolve, saying what to do."""


def hub_id(text: str, base: Path) -> str | None:
    """The repo id `text` names, or None when it is a local path (existing paths win over ids)."""
    if text.startswith(_LOCAL_PREFIXES) or text.count("/") != 1 or (base / text).exists():
        return None
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(text)
    except HFValidationError:
        return None
    return text


def offline() -> bool:
    """HF_HUB_OFFLINE as huggingface_hub reads it (read now, not at its import, so a command's env is honoured)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in {"1", "ON", "YES", "TRUE"}


@contextmanager
def downloads() -> Iterator[None]:
    """Let the specs loaded inside fetch what the cache lacks: `convert`, the stage that first reads the weights,
    downloads; every other command (validate included) reads the cache only and never the network."""
    token = _DOWNLOADS.set(True)
    try:
        yield
    finally:
        _DOWNLOADS.reset(token)


def resolve_snapshot(repo_id: str, revision: str | None, *, local: Path) -> Path | None:
    """The snapshot directory of `repo_id` at `revision` (default `main`): from the cache, else downloaded inside
    `downloads()` unless offline. None when it is not cached, no revision was asked and nothing may download
    (another command than convert, or HF_HUB_OFFLINE): the value stays the path `local`, whose absence the stage
    reading it reports with MISSING_MODEL's hint. Raises HubProblem saying what to do."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    at = f"{repo_id}@{revision}" if revision else repo_id
    fetch = f"`hf download {repo_id}{' --revision ' + revision if revision else ''}`"
    for only_cache in (True, False):
        try:
            return Path(snapshot_download(repo_id, revision=revision, allow_patterns=list(ALLOW_PATTERNS),
                                          local_files_only=only_cache))
        except GatedRepoError:
            raise HubProblem(f"{repo_id} is a gated model on the Hugging Face Hub: accept its licence at "
                             f"https://huggingface.co/{repo_id}, then log in with `hf auth login` (or set HF_TOKEN)"
                             ) from None
        except RevisionNotFoundError:
            raise HubProblem(f"revision {revision!r} is not a branch, tag or commit of {repo_id} on the Hugging "
                             "Face Hub; fix revision") from None
        except RepositoryNotFoundError:
            raise HubProblem(f"{repo_id}: no such model on the Hugging Face Hub (or it is private), and no "
                             f"directory {local}: fix the id or the path, or log in with `hf auth login`") from None
        except LocalEntryNotFoundError:
            if not only_cache:
                raise HubProblem(f"{at} is not in the Hugging Face cache, there is no directory {local}, and the "
                                 "Hub cannot be reached: check the network, or set HF_HUB_OFFLINE=1 and run "
                                 f"{fetch} where it can be") from None
            if offline() or not _DOWNLOADS.get():
                if revision is None:  # the path `local`, whose absence the stage reading it reports (MISSING_MODEL)
                    return None
                how = (f"HF_HUB_OFFLINE is set: run {fetch} where the Hub is reachable" if offline() else
                       f"`specbuild convert SPEC` downloads it (or run {fetch})")
                raise HubProblem(f"{at} is not in the Hugging Face cache yet; {how}") from None
        except (HfHubHTTPError, OSError) as err:
            raise HubProblem(f"{at}: download from the Hugging Face Hub failed ({err})") from None
    raise AssertionError("unreachable")  # the loop returns or raises


def _hub_model(value: object, info: ValidationInfo) -> object:
    """A Hugging Face Hub id (`owner/name`, not an existing path) becomes its snapshot directory in the cache, so
    every stage reads a local directory; `revision:` (a sibling field, validated first) picks the snapshot."""
    if not isinstance(value, str):
        return value
    base = base_dir(info.context)
    repo_id = hub_id(value, base)
    revision = info.data.get("revision")
    if repo_id is None:
        if revision is not None:
            raise custom_error("hub_revision", f"{value} is a local path; `revision` applies only to a Hugging "
                               "Face Hub id (owner/name): remove revision")
        return value
    if "revision" not in info.data:
        raise custom_error("hub_revision", f"{value} is not resolved on the Hugging Face Hub until revision is fixed")
    try:
        snapshot = resolve_snapshot(repo_id, revision, local=resolve(Path(value), base))
    except HubProblem as err:
        raise custom_error("hub_model", str(err)) from None
    return value if snapshot is None else snapshot


SpecPath = Annotated[Path, BeforeValidator(_check_path_input), AfterValidator(_resolve_path)]
ModelPath = Annotated[SpecPath, BeforeValidator(_hub_model)]
"""A Hugging Face checkpoint directory, or a Hub id resolved to its snapshot directory (`_hub_model`)."""
Count = Annotated[int, Strict(), Field(ge=1)]
Port = Annotated[int, Strict(), Field(ge=1, le=65535)]
