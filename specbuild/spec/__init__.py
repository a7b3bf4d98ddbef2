"""The pipeline spec: one YAML file that says which checkpoints become which service.

One module per concern, each importing only those listed before it (no cycles):
`problems` (what a located problem is) -> `fields` (paths anchored at the spec's directory, counts, ports) ->
`dynamo`, `kubernetes` (the deploy target sections) ->
`presets` (`medusa.choices` -> a tree) -> `schema` (the sections and their rules) -> `yaml_lines` (YAML -> data
and field -> line) -> `describe` (pydantic errors in the spec's words) -> `load` (file -> PipelineSpec);
`starter` (the `specbuild init` template) and `summary` (the `specbuild validate` table) sit beside them.
"""

from specbuild.medusa.choices import medusa_tree_problems
from specbuild.spec.load import load_spec, parse_spec
from specbuild.spec.problems import SpecProblem, SpecValidationError
from specbuild.spec.schema import (
    MAX_DRAFT_TOKENS,
    BuildSpec,
    CalibSpec,
    DeploySpec,
    DraftSpec,
    MedusaSpec,
    ModelSource,
    PipelineSpec,
    QuantizationSpec,
    SpeculativeSpec,
    TargetSpec,
)
from specbuild.spec.starter import starter_spec_text, write_starter_spec
from specbuild.spec.summary import summarize_spec

__all__ = [
    "MAX_DRAFT_TOKENS",
    "BuildSpec",
    "CalibSpec",
    "DeploySpec",
    "DraftSpec",
    "MedusaSpec",
    "ModelSource",
    "PipelineSpec",
    "QuantizationSpec",
    "SpecProblem",
    "SpecValidationError",
    "SpeculativeSpec",
    "TargetSpec",
    "load_spec",
    "medusa_tree_problems",
    "parse_spec",
    "starter_spec_text",
    "summarize_spec",
    "write_starter_spec",
]
