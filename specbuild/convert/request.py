"""What one conversion is asked to do (`ConvertRequest`) and what planning decided (`ConversionPlan`).

Both the convert driver (`specbuild.convert.pipeline`) and the quantization path (`specbuild.convert.quantize`)
read these; they live here, below both, so that neither imports the other back.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specbuild.atomic import Inputs
from specbuild.convert.architectures.base import Architecture
from specbuild.convert.mapping import RankPlan
from specbuild.convert.quantize.settings import QuantizeSettings


@dataclass(frozen=True)
class ConvertRequest:
    """One HF checkpoint to convert, and how."""

    name: str
    source: Path
    output: Path
    dtype: str = "auto"
    tp_size: int = 1
    pp_size: int = 1
    allow_pickle: bool = False
    medusa_heads: Path | None = None  # FasterDecoding head directory: write a MedusaForCausalLM checkpoint
    medusa_tree_nodes: int = 63  # Medusa: the tree's node count, config.json's max_draft_len (TensorRT-LLM's
    # default tree has 63; trtllm-build takes it when --max_draft_len is 0)
    quantization: QuantizeSettings | None = None  # ModelOpt quantization (the draft); None or "none": unquantized
    needs_tokenizer: bool = False  # a spec's target: deploy copies its tokenizer into the repository
    self_draft_layers: int | None = None  # keep only the source's first N decoder layers (+ final norm, LM head):
    # a self-draft (draft.source: target_layers), whose source is the target's HF directory
    self_draft_adapter: Path | None = None  # a self-draft's adapter directory (draft.adapter): its layer L
    inputs: tuple[tuple[str, Path | None], ...] = ()
    """Everything the command reads, each by the name the user gave it (a spec field, an option), which `output`
    may not be, contain or lie inside (atomic.refuse_overlap): for a spec, every model and file the spec names, not
    only this request's own. Empty: this request's own source, heads, adapter and calibration text."""
    output_name: str = "output"
    """How a refusal names `output` (`--output`, `output_dir's target checkpoint`)."""

    def named_inputs(self) -> Inputs:
        """`inputs`, or this request's own files under their field names when none were given."""
        if self.inputs:
            return dict(self.inputs)
        calibration = self.quantization.calib_source if self.quantization is not None else None
        return {"source": self.source, "medusa_heads": self.medusa_heads, "self_draft_adapter": self.self_draft_adapter,
                "calibration text": calibration if isinstance(calibration, Path) else None}


@dataclass
class ConversionPlan:
    """The checked plan of one unquantized conversion: architecture, resolved dtype, config.json, rank files."""

    arch: Architecture
    dtype: str
    config: dict[str, Any]
    rank_plans: list[RankPlan]
