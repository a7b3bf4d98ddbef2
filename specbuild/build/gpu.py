"""Which GPU the engines are for: named in the spec, or seen by nvidia-smi; and what its generation runs.

A TensorRT engine is built for one GPU generation (compute capability), so a quantization format that the
generation lacks fails only after the checkpoint has been converted and the build has started. The table
holds the data-center and workstation GPUs TensorRT-LLM 1.x supports (Ampere and newer), plus older ones so
that they are named rather than unknown.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass

# name -> (compute capability, memory GiB or None where the name has several sizes). Public NVIDIA specs.
KNOWN_GPUS: dict[str, tuple[float, float | None]] = {
    "V100": (7.0, None), "T4": (7.5, 15.0),
    "A100": (8.0, None), "A30": (8.0, 24.0), "A10": (8.6, 24.0), "A10G": (8.6, 24.0), "A40": (8.6, 48.0),
    "RTX A6000": (8.6, 48.0), "RTX 3090": (8.6, 24.0),
    "L4": (8.9, 24.0), "L40": (8.9, 48.0), "L40S": (8.9, 48.0), "RTX 4090": (8.9, 24.0),
    "RTX 6000 Ada": (8.9, 48.0),
    "H100": (9.0, 80.0), "H100 NVL": (9.0, 94.0), "H800": (9.0, 80.0), "H200": (9.0, 141.0), "GH200": (9.0, 96.0),
    "B100": (10.0, None), "B200": (10.0, 180.0), "GB200": (10.0, 186.0), "RTX 5090": (12.0, 32.0),
    # Blackwell Ultra is sm_103, inside the SM 100-119 range TensorRT-LLM's builder treats apart (validate.py).
    "B300": (10.3, None), "GB300": (10.3, None),
}
_CC_RE = re.compile(r"^(?:sm_?)?(\d{1,2})\.?(\d)$", re.IGNORECASE)
_MEMORY_RE = re.compile(r"(\d{2,3})\s*GB", re.IGNORECASE)
_NOISE_RE = re.compile(r"\b(NVIDIA|Tesla|GeForce|PCIe|SXM\d?|HBM\d?e?|Graphics)\b", re.IGNORECASE)


@dataclass(frozen=True)
class Gpu:
    """A GPU as far as the build checks care: its name, compute capability and (when known) memory."""

    name: str
    compute_capability: float
    memory_gib: float | None = None

    @property
    def sm(self) -> int:
        """The compute capability as TensorRT-LLM's `get_sm_version()` returns it: major * 10 + minor (90, 103)."""
        return round(self.compute_capability * 10)

    @property
    def generation(self) -> str:
        cc = self.compute_capability
        names = ((10.0, "Blackwell"), (9.0, "Hopper"), (8.9, "Ada"), (8.0, "Ampere"), (7.5, "Turing"))
        return next((name for floor, name in names if cc >= floor), "Volta or older")


def parse_gpu(text: str, memory_gib: float | None = None) -> Gpu | None:
    """`H100`, `NVIDIA A100-SXM4-80GB`, `8.9` or `sm_89` -> Gpu; None for a name not in the table."""
    text = text.strip()
    match = _CC_RE.match(text)
    if match:
        return Gpu(f"sm_{match.group(1)}{match.group(2)}", float(f"{match.group(1)}.{match.group(2)}"), memory_gib)
    cleaned = " ".join(_NOISE_RE.sub(" ", text.replace("-", " ")).split()).upper()
    best = None
    for name in KNOWN_GPUS:
        if re.search(rf"(^| ){re.escape(name.upper())}( |$)", cleaned) and (best is None or len(name) > len(best)):
            best = name
    if best is None:
        return None
    capability, table_memory = KNOWN_GPUS[best]
    size = _MEMORY_RE.search(text)
    memory = memory_gib or (float(size.group(1)) if size else table_memory)
    return Gpu(best, capability, memory)


def visible_gpus() -> list[Gpu]:
    """The GPUs `nvidia-smi` lists (name, compute capability, memory); empty where there is none."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,compute_cap,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    gpus = []
    for line in out.splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) != 3:
            continue
        try:
            gpus.append(Gpu(parts[0], float(parts[1]), float(parts[2]) / 1024))
        except ValueError:
            continue
    return gpus
