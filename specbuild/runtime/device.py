"""The torch device a command names (`--device`), checked before anything is loaded onto it.

A wrong name, CUDA asked of a CPU-only torch or of a machine without a visible GPU, or a GPU index past the last
one each get one message here, not an assertion from deep inside torch after the weights were read.
"""

from __future__ import annotations

import torch

from specbuild.errors import SpecbuildError


def check_device(name: str) -> torch.device:
    """The torch device `--device` names, or one clear error: an unknown name, CUDA asked of a torch built without
    it or of a machine without a visible GPU, a GPU index past the last one."""
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise SpecbuildError(f"--device {name}: not a device name", hint="use cpu, cuda or cuda:N") from None
    if device.type == "cpu":
        return device
    if device.type != "cuda":
        raise SpecbuildError(f"--device {name}: the reference runtime runs on cpu or cuda, not {device.type}",
                             hint="use cpu, cuda or cuda:N")
    if torch.version.cuda is None:
        raise SpecbuildError(f"--device {name}: this torch ({torch.__version__}) was built without CUDA",
                             hint="use --device cpu, or install a CUDA build of torch")
    if not torch.cuda.is_available():
        raise SpecbuildError(f"--device {name}: torch {torch.__version__} sees no CUDA GPU on this machine "
                             "(driver missing, or CUDA_VISIBLE_DEVICES hides them)", hint="use --device cpu")
    count = torch.cuda.device_count()
    if device.index is not None and device.index >= count:
        raise SpecbuildError(f"--device {name}: this machine has {count} CUDA GPU(s), numbered 0-{count - 1}",
                             hint="use --device cuda or a smaller index")
    return device
