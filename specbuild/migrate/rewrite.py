"""`specbuild migrate SPEC OUT.yaml`: an engine-flow spec (TensorRT-LLM 1.2, the last line with engines) rewritten
as a `build.flow: pytorch` spec for a later line, by editing the YAML text so the user's comments survive
(specbuild.tune.spec_edit).

What moves, and why (the line's tables: specbuild.contracts.llm_api LINES):
- Medusa -> EAGLE-3: the PyTorch lines have no MedusaDecodingConfig. An EAGLE-3 draft must be trained on the
  target first; the new spec names where `specbuild eagle train` writes it, and the command is returned to print
  (or run). K is the Medusa tree's depth (the longest path: the most tokens one Medusa step can accept).
- Lookahead -> NGram (training-free, no draft either): K = the lookahead n-gram size N, and
  max_matching_ngram_size = N - 1, the key length Lookahead's pool matches on.
- an int8_sq draft -> fp8: the PyTorch backend has no linear method for W8A8 SmoothQuant (contracts.quant_formats
  `Format.pytorch_linear` None, PYTORCH_LINEAR_SOURCE); fp8 is the 8-bit format it loads.
- the load-aware schedule is carried over in the spec's own meaning (keys are the batch size a length applies
  from; the writer spells it as the line does): each non-zero length is capped at the new K, zeros (speculation
  off) stay; max_concurrency is kept.
- engine-only settings are dropped (speculative.max_draft_len, use_draft_logits, plain_round_tokens,
  build.gather_context_logits, deploy.exclude_input_in_output), as the spec's checks would refuse them there.
The result is parsed as a spec before anything is written, and OUT is replaced atomically; SPEC is never
overwritten.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import get_args

import yaml

from specbuild.atomic import stage_text
from specbuild.errors import SpecError
from specbuild.spec.load import load_spec, parse_spec
from specbuild.spec.schema import ENGINE_TRTLLM_LINE, NEWEST_TRTLLM_LINE, PipelineSpec, TrtllmLine
from specbuild.tune import spec_edit
from specbuild.tune.spec_edit import Edit, find, scalar

EAGLE3_DRAFT_DIR = "eagle3-draft"
"""Where the migrated spec expects its EAGLE-3 draft, under the spec's output_dir (`specbuild eagle train TARGET
OUT` writes it there)."""
QUANT_REPLACEMENT = {"int8_sq": "fp8"}
"""Draft formats the PyTorch backend cannot load -> the format the migrated spec uses instead."""


@dataclass
class Migration:
    """What `migrate` made: the new spec text, the old and new methods, and the commands still to run."""

    text: str
    line: str
    old_mode: str
    new_mode: str
    notes: list[str] = field(default_factory=list)
    train_command: list[str] | None = None


def _replace_entry(text: str, root: yaml.MappingNode, loc: tuple[str, ...], entry: str) -> Edit:
    """An edit replacing the whole `key: value` entry at `loc` (which exists) with the text `entry`."""
    found = find(root, loc)
    assert found is not None
    key, value = found
    end = spec_edit._end(value)
    newline = text.find("\n", end)  # its trailing comment goes with it
    return Edit(key.start_mark.index, len(text) if newline < 0 else newline, entry)


def _remove(text: str, root: yaml.MappingNode, loc: tuple[str, ...]) -> Edit | None:
    """An edit deleting the `key: value` entry at `loc` (its whole lines; None when absent)."""
    found = find(root, loc)
    if found is None:
        return None
    key, value = found
    start = text.rfind("\n", 0, key.start_mark.index) + 1
    end = spec_edit._end(value)
    newline = text.find("\n", end)
    return Edit(start, len(text) if newline < 0 else newline + 1, "")


def _depth(choices: list[list[int]]) -> int:
    """A Medusa tree's depth: the most draft tokens one of its steps can accept."""
    return max(len(path) for path in choices)


def _carried_schedule(schedule: dict[int, int] | None, k: int) -> dict[int, int] | None:
    if schedule is None:
        return None
    carried = {int(size): (0 if int(length) == 0 else min(int(length), k)) for size, length in schedule.items()}
    carried[1] = k  # the full length alone, as every line requires
    return dict(sorted(carried.items()))


def _flow_map(mapping: dict[int, int]) -> str:
    return "{" + ", ".join(f"{k}: {v}" for k, v in mapping.items()) + "}"


def migrate_text(spec: PipelineSpec, text: str, *, line: str = NEWEST_TRTLLM_LINE, to: str = "ngram") -> Migration:
    """The PyTorch-flow spec text for `spec` (loaded from `text`) on TensorRT-LLM `line`."""
    where = spec.where
    if spec.build.flow == "pytorch":
        raise SpecError(f"{where}: build.flow is already pytorch (TensorRT-LLM {spec.build.line}); migrate moves an "
                        "engine-flow spec", hint="to change its line, edit build.trtllm")
    if line == ENGINE_TRTLLM_LINE or line not in get_args(TrtllmLine):
        later = [each for each in get_args(TrtllmLine) if each != ENGINE_TRTLLM_LINE]
        raise SpecError(f"--line {line}: migrate writes a PyTorch-flow spec for a line after {ENGINE_TRTLLM_LINE}: "
                        f"{', '.join(later)}")
    if to not in ("ngram", "sa"):
        raise SpecError(f"--to {to}: Lookahead migrates to ngram (prompt lookup) or sa (suffix automaton)")
    if spec.draft is not None and spec.draft.source == "target_layers":
        raise SpecError(f"{where}: draft.source target_layers (a self-draft) is written as a TensorRT-LLM checkpoint "
                        "and needs build.flow: engine; there is no PyTorch-flow form of it",
                        hint="use a separate draft model (draft.model) or speculative.mode: ngram")
    root = spec_edit.compose(text, where)
    edits: list[Edit | None] = []
    notes: list[str] = []
    speculative = spec.speculative
    mode, new_mode = speculative.mode, speculative.mode
    k = speculative.num_draft_tokens
    train: list[str] | None = None
    # Its own output_dir: the PyTorch flow's repository must not replace the engine spec's.
    output_dir = spec.output_dir.with_name(spec.output_dir.name + "-migrated")
    edits.append(spec_edit.set_value(text, root, ("output_dir",), scalar(os.path.relpath(output_dir,
                                                                                          spec.path.parent))))
    notes.append(f"output_dir {output_dir}: apart from the engine spec's")
    if mode == "medusa":
        assert spec.medusa is not None
        k = _depth(spec.medusa.resolved_choices())
        new_mode = "eagle3"
        draft = output_dir / EAGLE3_DRAFT_DIR
        draft_text = os.path.relpath(draft, spec.path.parent)
        # The medusa section becomes the draft section, where it was.
        edits.append(_replace_entry(text, root, ("medusa",), "draft:\n  model: " + scalar(draft_text)))
        train = ["specbuild", "eagle", "train", str(spec.target.model), str(draft)]
        notes.append(f"Medusa -> EAGLE-3 (K {k}, the tree's depth): TensorRT-LLM {line} has no Medusa; train the "
                     f"draft first: {shlex.join(train)}")
    elif mode == "lookahead":
        la = speculative.lookahead
        n = la.ngram_size if la is not None else 3
        k, new_mode = n, to
        if to == "ngram":
            edits.append(_replace_entry(text, root, ("speculative", "lookahead"),
                                        "ngram: {max_matching_ngram_size: " + str(max(n - 1, 1)) + "}"))
            notes.append(f"Lookahead -> NGram (K {k} = the n-gram size N, matching on N - 1 = {max(n - 1, 1)} "
                         f"tokens): TensorRT-LLM {line} has no Lookahead; both need no draft")
        else:  # SA's default: the longest suffix match over the request's own tokens
            edits.append(_replace_entry(text, root, ("speculative", "lookahead"),
                                        "sa: {max_matching_ngram_size: -1}"))
            notes.append(f"Lookahead -> SA (K {k} = the n-gram size N, the longest suffix match): TensorRT-LLM "
                         f"{line} has no Lookahead; both need no draft")
    if new_mode != mode:
        edits.append(spec_edit.set_value(text, root, ("speculative", "mode"), new_mode))
    if new_mode in ("eagle3", "ngram", "sa") and mode != new_mode:
        edits.append(spec_edit.set_value(text, root, ("speculative", "num_draft_tokens"), str(k)))
    schedule = _carried_schedule(speculative.draft_len_schedule, k)
    if schedule is not None and schedule != speculative.draft_len_schedule:
        edits.append(spec_edit.set_value(text, root, ("speculative", "draft_len_schedule"), _flow_map(schedule)))
        notes.append(f"draft_len_schedule carried over as {_flow_map(schedule)} (lengths capped at K {k})")
    if spec.draft is not None and spec.draft.quantization.format in QUANT_REPLACEMENT:
        old = spec.draft.quantization.format
        edits.append(spec_edit.set_value(text, root, ("draft", "quantization", "format"), QUANT_REPLACEMENT[old]))
        notes.append(f"draft quantization {old} -> {QUANT_REPLACEMENT[old]}: the PyTorch backend has no linear "
                     f"method for {old}")
    for loc in (("speculative", "max_draft_len"), ("speculative", "use_draft_logits"),
                ("speculative", "plain_round_tokens"), ("build", "gather_context_logits"),
                ("deploy", "exclude_input_in_output")):
        removed = _remove(text, root, loc)
        if removed is not None:
            edits.append(removed)
            notes.append(f"{'.'.join(loc)} removed: an engine-flow setting")
    edits.append(spec_edit.set_value(text, root, ("build", "flow"), "pytorch"))
    edits.append(spec_edit.set_value(text, root, ("build", "trtllm"), scalar(line) if line.isdigit() else f'"{line}"'))
    body = spec_edit.apply(text, [e for e in edits if e is not None])
    return Migration(_header(spec, line, notes) + body, line, mode, new_mode, notes, train)


def _header(spec: PipelineSpec, line: str, notes: list[str]) -> str:
    """The comment the migrated spec starts with: where it came from and every change, because the comments kept
    from the engine-flow spec may still describe what it was (its quantization, its BLS or Medusa ensemble)."""
    lines = [f"# Written by `specbuild migrate` from {spec.path.name if spec.path else spec.where} for "
             f"TensorRT-LLM {line} (build.flow: pytorch). What changed:"]
    lines += [f"#  - {note}" for note in notes]
    lines.append("# The comments below are the engine-flow spec's, kept as they were: where one disagrees with a "
                 "value, the value")
    lines.append("# (and this list) is what this spec means.")
    return "\n".join(lines) + "\n"


def migrate_spec(spec_path: Path, out: Path, *, line: str = NEWEST_TRTLLM_LINE, to: str = "ngram") -> Migration:
    """Migrate the spec at `spec_path` and write OUT atomically (relative paths rebased to OUT's directory); the
    new spec is parsed first, so a migration that would not load writes nothing."""
    if out.resolve() == spec_path.resolve():
        raise SpecError(f"{out}: OUT is the spec itself; migrate never overwrites its input",
                        hint="name another file, e.g. " + str(spec_path.with_name(spec_path.stem + "-pytorch.yaml")))
    spec = load_spec(spec_path)
    text = spec_path.read_text(encoding="utf-8")
    migration = migrate_text(spec, text, line=line, to=to)
    new_dir = out.resolve().parent
    if new_dir != spec_path.resolve().parent:
        moved = spec_edit.apply(migration.text, spec_edit.rebase_paths(
            migration.text, spec_edit.compose(migration.text, str(out)), _loaded(migration.text, spec_path), new_dir))
        migration.text = moved
    parse_spec(yaml.safe_load(migration.text), out)  # the new spec must load before it replaces OUT
    os.replace(stage_text(out, migration.text), out)
    return migration


def _loaded(text: str, where: Path) -> PipelineSpec:
    return parse_spec(yaml.safe_load(text), where)
