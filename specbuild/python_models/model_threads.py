"""Torch threads for the repository's python models, kept apart from `triton_io` so it imports (and is tested)
outside tritonserver's python stub."""

from __future__ import annotations

import contextlib
import os

__all__ = ["set_threads"]


def set_threads(params: dict[str, str], *, torch_too: bool = True) -> None:
    """Explicit torch threads: torch's default (one per core) crawls when the cores are shared with the other
    model processes of the same server (a decode step gets ~50x slower on 2 busy cores). The environment
    variables cover torch imported later (e.g. by transformers); models without torch skip importing it.
    `SPECBUILD_SERVER_THREADS` in the server's environment (set when starting `specbuild serve`) overrides the
    repository's `torch_threads` parameter, so a bigger machine needs no redeploy."""
    threads = str(int(os.environ.get("SPECBUILD_SERVER_THREADS") or params.get("torch_threads") or 1))
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = threads
    if not torch_too:
        return
    import torch

    torch.set_num_threads(int(threads))
    with contextlib.suppress(RuntimeError):  # already set in this process
        torch.set_num_interop_threads(1)
