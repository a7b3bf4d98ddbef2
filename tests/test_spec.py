"""The pipeline spec: shipped specs and presets validate, and bad specs fail with field, file and line."""

from __future__ import annotations

import ast
import json
import textwrap
from collections import Counter
from pathlib import Path
from typing import get_args

import pytest
from rich.console import Console

from specbuild.dtypes import DTYPES
from specbuild.errors import SpecError
from specbuild.spec import (
    BuildSpec,
    PipelineSpec,
    QuantizationSpec,
    SpecValidationError,
    load_spec,
    medusa_tree_problems,
    starter_spec_text,
    summarize_spec,
    write_starter_spec,
)

REPO = Path(__file__).resolve().parents[1]
CONFIGS = sorted((REPO / "configs").glob("*.yaml"))
PRESETS = sorted((REPO / "specbuild" / "data" / "medusa_choices").glob("*.json"))

MINIMAL = """\
name: t
target:
  model: models/target
build:
  max_batch_size: 2
  max_input_len: 32
  max_output_len: 16
"""


def write(directory: Path, text: str, name: str = "pipeline.yaml") -> Path:
    path = directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def line_of(path: Path, needle: str) -> int:
    """1-based line of the first line containing `needle`, so tests do not hard-code line numbers."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return next(number for number, line in enumerate(lines, start=1) if needle in line)


def spec_error(path: Path) -> SpecError:
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    return caught.value


# --- shipped files ------------------------------------------------------------------------------------------


def test_configs_exist() -> None:
    names = {path.name for path in CONFIGS}
    assert {"demo.yaml", "demo-medusa.yaml", "llama3.1-8b-llama3.2-1b.yaml", "vicuna-7b-medusa.yaml"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda path: path.name)
def test_shipped_config_validates(path: Path) -> None:
    spec = load_spec(path)
    assert spec.path == path
    assert spec.target.model.is_absolute()
    assert spec.target.trust_remote_code is False
    if spec.speculative.mode == "draft_target":
        assert spec.draft is not None and spec.medusa is None
    if spec.speculative.mode == "medusa":
        assert spec.medusa is not None and spec.draft is None
        assert len(spec.medusa.resolved_choices()) == spec.full_draft_len > 0


def test_demo_config_resolves_against_configs_dir() -> None:
    spec = load_spec(REPO / "configs" / "demo.yaml")
    assert spec.speculative.mode == "draft_target"
    assert spec.target.model == REPO / "demo" / "models" / "target"
    assert spec.draft is not None and spec.draft.model == REPO / "demo" / "models" / "draft"
    assert spec.output_dir == REPO / "demo" / "build"
    assert spec.checkpoint_dir("draft") == REPO / "demo" / "build" / "checkpoints" / "draft"
    assert (spec.build.max_batch_size, spec.build.max_input_len, spec.build.max_output_len) == (16, 256, 64)


def test_real_pair_quantizes_draft_to_fp8() -> None:
    spec = load_spec(REPO / "configs" / "llama3.1-8b-llama3.2-1b.yaml")
    assert spec.draft is not None and spec.draft.quantization.format == "fp8"
    assert spec.build.dtype == "bfloat16" and spec.build.tp_size == 1


def test_mc_sim_7b_63_preset_is_the_63_node_tree() -> None:
    data = json.loads((REPO / "specbuild" / "data" / "medusa_choices" / "mc_sim_7b_63.json").read_text())
    choices = data["choices"]
    assert "FasterDecoding/Medusa" in data["source"]
    assert len(choices) == 63
    # Per-depth node counts of mc_sim_7b_63 as documented for TensorRT-LLM's default tree.
    assert Counter(len(path) for path in choices) == {1: 10, 2: 28, 3: 23, 4: 2}
    assert medusa_tree_problems(choices) == []
    spec = load_spec(REPO / "configs" / "vicuna-7b-medusa.yaml")
    assert spec.medusa is not None and spec.medusa.resolved_choices() == choices


@pytest.mark.parametrize("path", PRESETS, ids=lambda path: path.name)
def test_presets_are_valid_trees(path: Path) -> None:
    data = json.loads(path.read_text())
    assert data["source"]
    assert medusa_tree_problems(data["choices"]) == []


def test_starter_spec_validates(tmp_path: Path) -> None:
    path = write_starter_spec(tmp_path / "pipeline.yaml")
    assert path.read_text(encoding="utf-8") == starter_spec_text()
    spec = load_spec(path)
    assert spec.name == "my-pipeline"
    assert spec.speculative.mode == "draft_target"
    assert spec.output_dir == tmp_path / "build" / "my-pipeline"


def test_validate_after_init_reports_each_missing_model_once_under_its_own_field(tmp_path: Path) -> None:
    """A new user's first `validate`: the starter spec names model directories that do not exist here. Each is
    reported once, at its own field (the draft/target pair check used to repeat the target's path under
    draft.model)."""
    from typer.testing import CliRunner

    from specbuild.cli.app import app

    spec_path = write_starter_spec(tmp_path / "pipeline.yaml")
    result = CliRunner().invoke(app, ["validate", str(spec_path)])
    assert result.exit_code == 1
    spec = load_spec(spec_path)
    lines = [line.strip() for line in result.output.splitlines() if "does not exist" in line]
    assert len(lines) == 2, result.output
    for field, model in (("target.model", spec.target.model), ("draft.model", spec.draft.model)):
        (line,) = [line for line in lines if f": {field}: " in line]
        assert str(model) in line
        assert line.startswith(f"{spec_path}:{spec.line_of(tuple(field.split('.')))}: ")


@pytest.mark.parametrize(("written", "fix"), [("1.3", "trtllm: '1.3'"), ("1.10", "one of '1.2' or '1.3'")])
def test_an_unquoted_release_line_is_refused_as_the_number_yaml_read(tmp_path: Path, written: str, fix: str) -> None:
    """`trtllm: 1.3` unquoted is the float 1.3 to YAML (and 1.10 the float 1.1): `validate` says a number was read
    and to quote it, at the field's line, instead of "must be one of '1.2' or '1.3' (got 1.3)"; quoted, it loads."""
    from typer.testing import CliRunner

    from specbuild.cli.app import app

    pytorch = MINIMAL.replace("build:\n", "build:\n  flow: pytorch\n  trtllm: {}\n")
    spec_path = write(tmp_path, pytorch.format(written))
    result = CliRunner().invoke(app, ["validate", str(spec_path)])
    output = " ".join(result.output.split())
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), output
    assert f"{spec_path}:{line_of(spec_path, 'trtllm:')}: build.trtllm: YAML read the unquoted" in output, output
    assert "as a number" in output and f"quote it: {fix}" in output, output
    assert load_spec(write(tmp_path, pytorch.format("'1.3'"), "quoted.yaml")).build.trtllm == "1.3"


# --- located errors -----------------------------------------------------------------------------------------


def test_unknown_key_names_key_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + "  tp_sise: 2\n")
    err = spec_error(path)
    line = line_of(path, "tp_sise")
    assert f"pipeline.yaml:{line}: build.tp_sise: unknown key (did you mean 'tp_size'?)" in err.message
    assert err.hint is not None and "specbuild init" in err.hint


def test_wrong_type_names_field_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL.replace("max_batch_size: 2", "max_batch_size: four"))
    err = spec_error(path)
    line = line_of(path, "max_batch_size")
    assert f"pipeline.yaml:{line}: build.max_batch_size: must be an integer (got 'four')" in err.message


def test_bool_is_not_an_integer(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL.replace("max_batch_size: 2", "max_batch_size: true"))
    assert "build.max_batch_size: must be an integer (got true)" in spec_error(path).message


def test_range_error_in_documented_format(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + "  tp_size: 0\n")
    line = line_of(path, "tp_size")
    assert spec_error(path).message == f"{path}:{line}: build.tp_size: must be >= 1 (got 0)"


def test_dtype_choices_are_the_dtype_table(tmp_path: Path) -> None:
    """build.dtype takes its names from specbuild.dtypes, listed as they always were (smallest first)."""
    path = write(tmp_path, MINIMAL + "  dtype: fp16\n")
    line = line_of(path, "dtype")
    assert spec_error(path).message == (
        f"{path}:{line}: build.dtype: must be one of 'auto', 'float16', 'bfloat16' or 'float32' (got 'fp16')"
    )
    assert set(get_args(BuildSpec.model_fields["dtype"].annotation)) == {"auto", *DTYPES}


def test_quantization_choices_are_the_formats_table(tmp_path: Path) -> None:
    """draft.quantization takes its names from specbuild.contracts.quant_formats (what convert runs and build
    expects), listed as they always were."""
    from specbuild.contracts.quant_formats import FORMATS, KV_FORMATS

    draft = "speculative:\n  mode: draft_target\ndraft:\n  model: models/draft\n  quantization:\n"
    path = write(tmp_path, MINIMAL + draft + "    format: int3\n    kv_cache: int8\n")
    message = spec_error(path).message
    assert (f"{path}:{line_of(path, 'format:')}: draft.quantization.format: must be one of 'none', 'fp8', "
            "'int8_sq', 'int8_wo', 'int4_awq' or 'w4a8_awq' (got 'int3')") in message
    assert (f"{path}:{line_of(path, 'kv_cache:')}: draft.quantization.kv_cache: must be one of 'none' or 'fp8' "
            "(got 'int8')") in message
    assert get_args(QuantizationSpec.model_fields["format"].annotation) == ("none", *FORMATS)
    assert get_args(QuantizationSpec.model_fields["kv_cache"].annotation) == ("none", *KV_FORMATS)


def test_all_problems_reported_together(tmp_path: Path) -> None:
    text = MINIMAL.replace("max_batch_size: 2", "max_batch_size: 0") + "  dtype: fp16\nextra: 1\n"
    path = write(tmp_path, text)
    err = spec_error(path)
    assert isinstance(err, SpecValidationError)
    assert [problem.field for problem in err.problems] == ["build.max_batch_size", "build.dtype", "extra"]
    assert [problem.line for problem in err.problems] == [
        line_of(path, "max_batch_size"), line_of(path, "dtype"), line_of(path, "extra")
    ]
    assert err.message.startswith(f"{path}: 3 problems")


def test_missing_required_field_points_at_parent(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL.replace("  max_output_len: 16\n", ""))
    err = spec_error(path)
    assert f"pipeline.yaml:{line_of(path, 'build:')}: build.max_output_len: required" in err.message


def test_duplicate_key_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + "  max_input_len: 64\n")
    err = spec_error(path)
    first, second = line_of(path, "max_input_len"), line_of(path, "max_input_len: 64")
    assert f":{second}: build.max_input_len: duplicate key (first on line {first})" in err.message


def test_draft_target_without_draft(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + "speculative:\n  mode: draft_target\n")
    err = spec_error(path)
    line = line_of(path, "mode:")
    assert f"pipeline.yaml:{line}: draft: required when speculative.mode is 'draft_target'" in err.message


def test_medusa_mode_without_medusa(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + "speculative:\n  mode: medusa\n")
    assert "medusa: required when speculative.mode is 'medusa'" in spec_error(path).message


def test_unused_draft_is_an_error_even_alongside_type_errors(tmp_path: Path) -> None:
    text = MINIMAL.replace("max_input_len: 32", "max_input_len: x") + "draft:\n  model: d\n"
    err = spec_error(write(tmp_path, text))
    assert "build.max_input_len: must be an integer" in err.message
    assert "draft: given, but speculative.mode is 'none'" in err.message


def test_num_draft_tokens_bounds(tmp_path: Path) -> None:
    base = MINIMAL + "draft:\n  model: d\nspeculative:\n  mode: draft_target\n"
    assert load_spec(write(tmp_path, base + "  num_draft_tokens: 64\n")).full_draft_len == 64
    for bad, expected in (("0", "must be >= 1"), ("65", "must be <= 64")):
        path = write(tmp_path, base + f"  num_draft_tokens: {bad}\n")
        assert f"speculative.num_draft_tokens: {expected} (got {bad})" in spec_error(path).message


def test_draft_len_schedule_follows_tensorrt_llms_rules(tmp_path: Path) -> None:
    """TensorRT-LLM's DecodingBaseConfig (tensorrt_llm/llmapi/llm_args.py): batch size 1 maps to the full draft
    length; for Medusa every scheduled length must be a leading slice of the tree that is a tree itself."""
    base = MINIMAL + "draft:\n  model: d\nspeculative:\n  mode: draft_target\n  num_draft_tokens: 4\n"
    spec = load_spec(write(tmp_path, base + "  draft_len_schedule: {1: 4, 4: 2, 8: 0}\n  max_concurrency: 12\n"))
    assert spec.speculative.draft_len_schedule == {1: 4, 4: 2, 8: 0} and spec.speculative.max_concurrency == 12
    message = spec_error(write(tmp_path, base + "  draft_len_schedule: {1: 3, 4: 7}\n")).message
    assert "batch size 1 must draft the full length 4, not 3" in message
    assert "draft length 7 (batch size 4) must be an integer in 0..4" in message
    medusa = ("speculative:\n  mode: medusa\n  draft_len_schedule: {1: 3, 2: 2}\nmedusa:\n  heads: h\n"
              "  choices: [[0], [0, 0], [1]]\n")
    assert load_spec(write(tmp_path, MINIMAL + medusa)).speculative.draft_len_schedule == {1: 3, 2: 2}
    short = medusa.replace("{1: 3, 2: 2}", "{1: 2}")
    assert "batch size 1 must draft the full length 3, not 2 (the Medusa tree's node count)" in spec_error(
        write(tmp_path, MINIMAL + short)).message
    child_first = medusa.replace("{1: 3, 2: 2}", "{1: 3, 2: 1}").replace("[[0], [0, 0], [1]]", "[[0, 0], [0], [1]]")
    assert "the tree's first 1 paths are not a tree" in spec_error(write(tmp_path, MINIMAL + child_first)).message


def test_plain_round_tokens_is_the_bls_s_and_says_where_it_is_not_used(tmp_path: Path) -> None:
    """The draft-target BLS's rounds without speculation (engine flow) take the most tokens from the spec; another
    mode or the PyTorch flow, which has no such rounds, is told so rather than silently ignoring it."""
    base = MINIMAL + "draft:\n  model: d\nspeculative:\n  mode: draft_target\n"
    assert load_spec(write(tmp_path, base + "  plain_round_tokens: 1\n")).speculative.plain_round_tokens == 1
    assert load_spec(write(tmp_path, base)).speculative.plain_round_tokens is None  # the BLS's default
    assert "speculative.plain_round_tokens: must be >= 1 (got 0)" in spec_error(
        write(tmp_path, base + "  plain_round_tokens: 0\n")).message
    medusa = MINIMAL + "speculative:\n  mode: medusa\n  plain_round_tokens: 2\nmedusa:\n  heads: h\n"
    assert "plain_round_tokens: only used in draft_target mode" in spec_error(write(tmp_path, medusa)).message
    pytorch = base.replace("build:\n", "build:\n  flow: pytorch\n", 1) + "  plain_round_tokens: 2\n"
    assert "build:\n  flow: pytorch" in pytorch
    assert "speculative.plain_round_tokens: only used on build.flow: engine" in spec_error(
        write(tmp_path, pytorch)).message


def test_medusa_tree_with_missing_prefix(tmp_path: Path) -> None:
    medusa = "medusa:\n  heads: heads\n  choices: [[0], [1, 0], [0, 0]]\n"
    path = write(tmp_path, MINIMAL + "speculative:\n  mode: medusa\n" + medusa)
    err = spec_error(path)
    line = line_of(path, "choices:")
    assert f"pipeline.yaml:{line}: medusa.choices[1]: [1, 0]: prefix [1] is not listed" in err.message


@pytest.mark.parametrize(
    ("choices", "expected"),
    [
        ([[0], [0]], "listed twice"),
        ([[0], [-1]], "must be >= 0"),
        ([[0] * i for i in range(1, 18)], "depth 17 is more than 16"),
        ([[]], "root"),
        ([], "empty"),
    ],
)
def test_medusa_tree_rules(choices: list[list[int]], expected: str) -> None:
    assert any(expected in message for _, message in medusa_tree_problems(choices))


def test_unknown_medusa_preset_lists_known_ones(tmp_path: Path) -> None:
    text = MINIMAL + "speculative:\n  mode: medusa\nmedusa:\n  heads: heads\n  choices: mc_nope\n"
    message = spec_error(write(tmp_path, text)).message
    assert "medusa.choices: unknown tree preset 'mc_nope'" in message and "mc_sim_7b_63" in message


def test_preset_next_to_spec_wins_and_is_validated(tmp_path: Path) -> None:
    text = MINIMAL + "speculative:\n  mode: medusa\nmedusa:\n  heads: heads\n  choices: mc_sim_7b_63\n"
    path = write(tmp_path, text)
    (tmp_path / "medusa_choices").mkdir()
    preset = tmp_path / "medusa_choices" / "mc_sim_7b_63.json"
    preset.write_text(json.dumps({"source": "test", "choices": [[0], [0, 0]]}))
    spec = load_spec(path)
    assert spec.medusa is not None and spec.medusa.resolved_choices() == [[0], [0, 0]]
    assert spec.medusa.choices_file == preset
    preset.write_text(json.dumps([[0], [0, 1, 0]]))
    assert "prefix [0, 1] is not listed" in spec_error(path).message


# --- files and paths ----------------------------------------------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    err = spec_error(tmp_path / "nope.yaml")
    assert err.message.endswith("nope.yaml: no such file") and err.hint is not None


def test_yaml_syntax_error_has_line(tmp_path: Path) -> None:
    path = write(tmp_path, "name: t\ntarget:\n  model: m\n   bad: [\n")
    assert f"pipeline.yaml:{line_of(path, 'bad:')}: invalid YAML" in spec_error(path).message


@pytest.mark.parametrize("text", ["- a\n- b\n", "", "just text\n"])
def test_top_level_must_be_a_mapping(tmp_path: Path, text: str) -> None:
    assert "the spec must be a mapping" in spec_error(write(tmp_path, text)).message


def test_relative_paths_resolve_against_spec_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = MINIMAL.replace("models/target", "../models/target") + (
        "draft:\n  model: /abs/draft\n  quantization:\n    format: int4_awq\n    calib: {source: calib.txt}\n"
        "speculative:\n  mode: draft_target\n"
    )
    path = write(tmp_path / "specs", text)
    monkeypatch.chdir(tmp_path)  # not the spec's directory: relative paths must not follow the cwd
    spec = load_spec(path)
    assert spec.target.model == tmp_path / "models" / "target"
    assert spec.draft is not None and spec.draft.model == Path("/abs/draft")
    assert spec.draft.quantization.calib.source == tmp_path / "specs" / "calib.txt"
    assert spec.output_dir == tmp_path / "specs" / "build" / "t"
    assert spec.checkpoint_dir("target") == tmp_path / "specs" / "build" / "t" / "checkpoints" / "target"
    assert spec.deploy.model_repository == spec.output_dir / "model_repository"
    assert spec.deploy.triton_max_batch_size == spec.build.max_batch_size == 2


def test_defaults(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, MINIMAL))
    assert spec.speculative.mode == "none" and spec.full_draft_len == 0
    build = spec.build
    assert (build.dtype, build.tp_size, build.pp_size, build.backend) == ("auto", 1, 1, "auto")
    assert spec.target.trust_remote_code is False
    assert spec.draft is None and spec.medusa is None
    with pytest.raises(ValueError, match="unknown checkpoint role"):
        spec.checkpoint_dir("engine")


def test_summary_shows_resolved_values(tmp_path: Path) -> None:
    spec = load_spec(REPO / "configs" / "demo-medusa.yaml")
    console = Console(record=True, width=200)
    console.print(summarize_spec(spec))
    text = console.export_text()
    assert "demo-medusa" in text and "inline list: 8 nodes, depth 3" in text
    assert str(REPO / "demo" / "models" / "medusa-heads") in text


def test_model_validate_without_file_has_no_path() -> None:
    data = {"name": "t", "target": {"model": "m"}, "build": {"max_batch_size": 1, "max_input_len": 1,
                                                          "max_output_len": 1}}
    spec = PipelineSpec.model_validate(data)
    with pytest.raises(RuntimeError, match="not loaded from a file"):
        _ = spec.path


# --- starter ------------------------------------------------------------------------------------------------


def test_write_starter_refuses_overwrite(tmp_path: Path) -> None:
    path = tmp_path / "pipeline.yaml"
    path.write_text("mine\n")
    with pytest.raises(SpecError) as caught:
        write_starter_spec(path)
    assert str(path) in caught.value.message and "already exists" in caught.value.message
    assert path.read_text() == "mine\n"
    write_starter_spec(path, force=True)
    assert path.read_text() == starter_spec_text()
    assert [p.name for p in tmp_path.iterdir()] == ["pipeline.yaml"]  # no temporary file left behind


def test_starter_spec_gets_the_mode_of_any_new_file(tmp_path: Path) -> None:
    """`specbuild init` writes through a temporary file (0600 when created); the spec must end up readable by
    the team like any file the user creates (0666 minus the umask), and a replaced spec keeps its own mode."""
    import os

    old_mask = os.umask(0o022)
    try:
        path = write_starter_spec(tmp_path / "pipeline.yaml")
        assert path.stat().st_mode & 0o777 == 0o644
        path.chmod(0o640)
        write_starter_spec(path, force=True)
        assert path.stat().st_mode & 0o777 == 0o640
    finally:
        os.umask(old_mask)


# --- package layout ------------------------------------------------------------------------------------------

SPEC_LAYERS = ["problems", "fields", "dynamo", "kubernetes", "presets", "schema", "yaml_lines", "describe", "load",
               "starter", "summary"]
"""specbuild/spec/ from the bottom up: a module may import only modules listed before it (no cycles)."""


def test_spec_modules_import_only_downwards() -> None:
    package = REPO / "specbuild" / "spec"
    assert sorted(SPEC_LAYERS) == sorted(p.stem for p in package.glob("*.py") if p.stem != "__init__")
    for index, name in enumerate(SPEC_LAYERS):
        tree = ast.parse((package / f"{name}.py").read_text(encoding="utf-8"))
        imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
        imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        siblings = {module.removeprefix("specbuild.spec.") for module in imported
                    if module.startswith("specbuild.spec.") or module == "specbuild.spec"}
        assert siblings <= set(SPEC_LAYERS[:index]), f"specbuild/spec/{name}.py imports {siblings} (upwards)"


def test_summary_names_the_flow_where_no_engine_is_built() -> None:
    """On the PyTorch flow `build.backend` (where engines are built) means nothing, so the summary says the flow."""
    console = Console(record=True, width=200)
    console.print(summarize_spec(load_spec(REPO / "configs" / "demo-pytorch.yaml")))
    text = console.export_text()
    assert "pytorch (LLM API, no engines)" in text and "backend" not in text
    console = Console(record=True, width=200)
    console.print(summarize_spec(load_spec(REPO / "configs" / "demo.yaml")))
    assert "backend" in console.export_text()
