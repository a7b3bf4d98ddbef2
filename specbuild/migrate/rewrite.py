"""`specbuild migrate SPEC OUT.yaml`: an engine-flow spec (TensorRT-LLM 1.2, the last line with engines) rewritten
as a `build.flow: pytorch` spec for a later line, by editing the YAML text so the user's comments survive
(specbuild.tune.spec_edit).

What moves, and why (the line's tables: specbuild.contracts.llm_api LINES):
- Medusa -> EAGLE-3: the PyTorch lines have no MedusaDecodingConfig. An EAGLE-3 draft must be trained on the
  target first; the new spec names where `specbuild eagle train` writes it, and the command is returned to print
  (or run). K is the Medusa tree's depth (the longest path: the most tokens one Medusa step can accept).
- Lookahead -> NGram (training-free, no draft either): K = the lookahead n-gram size N (TensorRT-LLM's default
  when the spec leaves the windows out), and max_matching_ngram_size = N - 1, the key length Lookahead's pool
  matches on.
- an int8_sq draft -> fp8: the PyTorch backend has no linear method for W8A8 SmoothQuant (contracts.quant_formats
  `Format.pytorch_linear` None, PYTORCH_LINEAR_SOURCE); fp8 is the 8-bit format it loads.
- the load-aware schedule is carried over in the spec's own meaning (keys are the batch size a length applies
  from; the writer spells it as the line does): each non-zero length is capped at the new K, zeros (speculation
  off) stay; max_concurrency is kept.
- engine-only settings are dropped (speculative.max_draft_len, use_draft_logits, plain_round_tokens,
  build.gather_context_logits, deploy.exclude_input_in_output), as the spec's checks would refuse them there.
- output_dir, build.flow and build.trtllm are set, and relative paths are rebased to OUT's directory.

Nothing else changes, and the new spec's header names every key that did. The text edits work on any YAML a user
writes (block or flow style, anchors, comments), and their result is checked: it must parse to the spec's data with
exactly the named changes, and load as a spec meaning the same once its paths are rebased. Where an edit of the text
cannot give that (an anchor shared with a key migrate rewrites, a merge key), OUT is that data as plain YAML, and
its header says the comments were not kept. OUT is checked before anything is written, written whole (atomically)
or not at all; SPEC is never overwritten.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, get_args

import yaml

from specbuild.atomic import replace_text
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
ENGINE_ONLY = (("speculative", "max_draft_len"), ("speculative", "use_draft_logits"),
               ("speculative", "plain_round_tokens"), ("build", "gather_context_logits"),
               ("deploy", "exclude_input_in_output"))
"""Settings the spec's checks refuse on the PyTorch flow: removed."""
REMOVE: Any = object()
"""A Change's value that removes its key."""
_PROPERTIES = re.compile(r"(?:[&!][^\s,\[\]{}]*\s+)*")  # a node's anchor and tag, which an edit keeps
_ALIAS = re.compile(r"\s*:\s*(\*[^\s,\[\]{}]+)")  # `: *name` after a key: its value is the anchored node


@dataclass(frozen=True)
class Change:
    """One key migrate rewrites: `loc` gets `value` (REMOVE: the key goes), under the new key `key` where the
    entry becomes another one in its place (the medusa section becomes the draft section)."""

    loc: tuple[str, ...]
    value: Any
    key: str | None = None

    def named(self) -> str:
        """How the header names it."""
        old = ".".join(self.loc)
        if self.value is REMOVE:
            return f"{old} (removed)"
        return old if self.key is None else f"{old} -> {'.'.join((*self.loc[:-1], self.key))}"


@dataclass
class Migration:
    """What `migrate` made: the new spec text, the old and new methods, every key changed, and the commands still
    to run."""

    text: str
    line: str
    old_mode: str
    new_mode: str
    notes: list[str] = field(default_factory=list)
    train_command: list[str] | None = None
    changes: list[Change] = field(default_factory=list)


def _depth(choices: list[list[int]]) -> int:
    """A Medusa tree's depth: the most draft tokens one of its steps can accept."""
    return max(len(path) for path in choices)


def _carried_schedule(schedule: dict[int, int] | None, k: int) -> dict[int, int] | None:
    if schedule is None:
        return None
    carried = {int(size): (0 if int(length) == 0 else min(int(length), k)) for size, length in schedule.items()}
    carried[1] = k  # the full length alone, as every line requires
    return dict(sorted(carried.items()))


def _flow(value: Any) -> str:
    """`value` as one line of YAML: a scalar, or a flow mapping."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_flow(k)}: {_flow(v)}" for k, v in value.items()) + "}"
    return scalar(value)


def plan(spec: PipelineSpec, data: dict[str, Any], *, line: str = NEWEST_TRTLLM_LINE, to: str = "ngram") -> Migration:
    """What migrating `spec` (`data`, as its file parses) to TensorRT-LLM `line` changes (no text yet), or a
    SpecError saying why it cannot."""
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
    changes: list[Change] = []
    notes: list[str] = []
    speculative = spec.speculative
    mode, new_mode = speculative.mode, speculative.mode
    k = speculative.num_draft_tokens
    train: list[str] | None = None
    # Its own output_dir: the PyTorch flow's repository must not replace the engine spec's.
    output_dir = spec.output_dir.with_name(spec.output_dir.name + "-migrated")
    notes.append(f"output_dir {output_dir}: apart from the engine spec's")
    if mode == "medusa":
        assert spec.medusa is not None  # the spec's checks require the section for mode medusa
        k = _depth(spec.medusa.resolved_choices())
        new_mode = "eagle3"
        draft = output_dir / EAGLE3_DRAFT_DIR
        # The medusa section becomes the draft section, where it was.
        changes.append(Change(("medusa",), {"model": os.path.relpath(draft, spec.path.parent)}, key="draft"))
        train = ["specbuild", "eagle", "train", str(spec.target.model), str(draft)]
        notes.append(f"Medusa -> EAGLE-3 (K {k}, the tree's depth): TensorRT-LLM {line} has no Medusa; train the "
                     f"draft first: {shlex.join(train)}")
    elif mode == "lookahead":
        k, new_mode = speculative.lookahead_config().ngram_size, to
        matched = max(k - 1, 1) if to == "ngram" else -1  # SA's default: the longest suffix match
        changes.append(Change(("speculative", "lookahead"), {"max_matching_ngram_size": matched}, key=to))
        how = f"matching on N - 1 = {matched} tokens" if to == "ngram" else "the longest suffix match"
        notes.append(f"Lookahead -> {'NGram' if to == 'ngram' else 'SA'} (K {k} = the n-gram size N, {how}): "
                     f"TensorRT-LLM {line} has no Lookahead; both need no draft")
    if new_mode != mode:
        changes.append(Change(("speculative", "mode"), new_mode))
        changes.append(Change(("speculative", "num_draft_tokens"), k))
    schedule = _carried_schedule(speculative.draft_len_schedule, k)
    if schedule is not None and schedule != speculative.draft_len_schedule:
        changes.append(Change(("speculative", "draft_len_schedule"), schedule))
        notes.append(f"draft_len_schedule carried over as {_flow(schedule)} (lengths capped at K {k})")
    if spec.draft is not None and spec.draft.quantization.format in QUANT_REPLACEMENT:
        old = spec.draft.quantization.format
        changes.append(Change(("draft", "quantization", "format"), QUANT_REPLACEMENT[old]))
        notes.append(f"draft quantization {old} -> {QUANT_REPLACEMENT[old]}: the PyTorch backend has no linear "
                     f"method for {old}")
    for loc in ENGINE_ONLY:
        if loc[-1] in (data.get(loc[0]) or {}):
            changes.append(Change(loc, REMOVE))
            notes.append(f"{'.'.join(loc)} removed: an engine-flow setting")
    changes.append(Change(("build", "flow"), "pytorch"))
    changes.append(Change(("build", "trtllm"), line))
    changes.append(Change(("output_dir",), os.path.relpath(output_dir, spec.path.parent)))
    return Migration("", line, mode, new_mode, notes, train, changes)


# -- the new text -----------------------------------------------------------------------------------------------------
def _alias(text: str, key: yaml.Node, value: yaml.Node) -> re.Match[str] | None:
    """The `*name` written as `key`'s value, if it is an alias (its node is the anchored one, written before)."""
    return _ALIAS.match(text, key.end_mark.index) if value.start_mark.index < key.start_mark.index else None


def _value_end(text: str, key: yaml.Node, value: yaml.Node) -> int:
    """Where `key`'s value ends in the text: its alias, or a block mapping's last value (which may be one)."""
    alias = _alias(text, key, value)
    if alias is not None:
        return alias.end()
    if isinstance(value, yaml.MappingNode) and not value.flow_style and value.value:
        return _value_end(text, *value.value[-1])
    return spec_edit._end(value)


def _line_end(text: str, at: int) -> int:
    newline = text.find("\n", at)
    return len(text) if newline < 0 else newline


def _edit(text: str, root: yaml.MappingNode, change: Change) -> Edit | None:
    """The text edit making `change`, in the style of the mapping it is in (block or flow); where a value is an
    alias, the alias is what is edited."""
    loc, found = change.loc, find(root, change.loc)
    section = (None, root) if len(loc) == 1 else find(root, loc[:-1])
    parent = section[1] if section is not None else None
    if not isinstance(parent, yaml.MappingNode):  # written through a merge key, say
        raise ValueError(f"no `{'.'.join(loc[:-1])}:` mapping in the text to edit")
    if found is None:
        if change.value is REMOVE:
            return None
        edit = spec_edit.set_value(text, root, (*loc[:-1], change.key or loc[-1]), _flow(change.value))
        if parent.flow_style or not parent.value:
            return edit
        at = _line_end(text, _value_end(text, *parent.value[-1]))  # after the last entry's line
        return replace(edit, start=at, end=at)
    key, value = found
    alias = _alias(text, key, value)
    start, end = key.start_mark.index, _value_end(text, key, value)
    if change.value is REMOVE:
        if parent.flow_style:  # `k: v` and the comma after it, or else the one before it
            after = re.compile(r"\s*,\s*").match(text, end)
            before = re.search(r",\s*$", text[:start])
            return Edit(start, after.end(), "") if after else Edit(before.start() if before else start, end, "")
        if len(parent.value) == 1 and section is not None:  # its section's only entry: the section stays, empty
            return Edit(section[0].end_mark.index, _line_end(text, end), ": {}")
        return Edit(text.rfind("\n", 0, start) + 1, min(_line_end(text, end) + 1, len(text)), "")  # whole lines
    if change.key is not None:  # the entry becomes another one, where it was
        # in a block, to the line's end: a trailing comment there speaks of the old value
        return Edit(start, end if parent.flow_style else _line_end(text, end), f"{change.key}: {_flow(change.value)}")
    if alias is not None:
        return Edit(alias.start(1), end, _flow(change.value))
    if isinstance(value, yaml.MappingNode | yaml.SequenceNode) and not value.flow_style:
        return Edit(key.end_mark.index, end, f": {_flow(change.value)}")  # `key: value` on one line
    return spec_edit.set_value(text, root, loc, _flow(change.value))


def _applied(text: str, edits: list[Edit]) -> str:
    """`text` with `edits` made; one that replaces an anchored (or tagged) value keeps its anchor (and tag), and
    an edit made twice (a path shared through an alias, rebased once for each key) is made once."""
    kept = [replace(edit, start=_PROPERTIES.match(text, edit.start).end())
            if edit.end > edit.start and text[edit.start] in "&!" else edit for edit in edits]
    return spec_edit.apply(text, list(dict.fromkeys(kept)))


def _copy(data: Any) -> Any:
    """A copy sharing nothing: an alias's data is its own once changed."""
    if isinstance(data, dict):
        return {key: _copy(value) for key, value in data.items()}
    return [_copy(item) for item in data] if isinstance(data, list) else data


def _after(data: dict[str, Any], changes: list[Change]) -> dict[str, Any]:
    """`data` with `changes` made: what the new spec's text must parse to."""
    new = _copy(data)
    for change in changes:
        *path, last = change.loc
        section = new
        for part in path:
            if not isinstance(section.get(part), dict):
                section[part] = {}
            section = section[part]
        section.pop(last, None)
        if change.value is not REMOVE:
            section[change.key or last] = _copy(change.value)
    return new


class _PlainDumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:  # each value written out where it is
        return True


def _differing(old: Any, new: Any, loc: tuple[str, ...] = ()) -> list[str]:
    """The dotted keys whose values differ."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [found for key in {**old, **new} for found in _differing(old.get(key), new.get(key), (*loc, str(key)))]
    return [] if old == new else [".".join(loc)]


def _edited(spec: PipelineSpec, text: str, changes: list[Change], want: dict[str, Any], here: PipelineSpec,
            out: Path) -> tuple[str, list[str]]:
    """`text` with `changes` made and its relative paths rebased to OUT's directory, and the keys rebased; a
    ValueError where the result is not `want` (rebased), which means `here` at SPEC's place."""
    body = text
    for change in changes:  # one at a time, each on the text the last one left: no two edits meet
        edit = _edit(body, spec_edit.compose(body, "the edited text"), change)
        body = body if edit is None else _applied(body, [edit])
    if yaml.safe_load(body) != want:
        raise ValueError("an anchor or alias would carry a change to a key not named here")
    new_dir = Path(os.path.abspath(out)).parent  # lexical, as the spec resolves its paths (spec.fields.resolve)
    if new_dir != spec.path.parent:
        rebased = spec_edit.rebase_paths(body, spec_edit.compose(body, str(out)), here, new_dir)
        body = _applied(body, rebased)
    moved = yaml.safe_load(body)
    if parse_spec(moved, out).model_dump() != here.model_dump():
        raise ValueError("rebasing its relative paths changes what the spec means")
    return body, _differing(want, moved)


def _rewritten(spec: PipelineSpec, text: str, data: dict[str, Any], migration: Migration,
               out: Path) -> tuple[str, list[str], str | None]:
    """The new spec's body, the keys whose relative paths were rebased, and why the user's text (comments,
    layout) could not be kept (None: it was)."""
    want = _after(data, migration.changes)
    try:
        here = parse_spec(want, spec.path)
    except SpecError as err:
        raise SpecError(f"the spec migrated from {spec.where} would not load, so nothing was written: {err.message}",
                        hint=err.hint) from None
    try:
        return (*_edited(spec, text, migration.changes, want, here, out), None)
    except (ValueError, LookupError, yaml.YAMLError, SpecError) as err:  # a form the edits in place cannot keep
        lost = "an edit in place failed: " + str(err).splitlines()[0]
    plain = yaml.dump(want, Dumper=_PlainDumper, sort_keys=False, allow_unicode=True, width=118)
    try:
        return (*_edited(spec, plain, [], want, here, out), lost)
    except (ValueError, yaml.YAMLError) as err:
        raise SpecError(f"{spec.where}: migrate cannot write it as {out} without changing it: {err}",
                        hint="write the spec without anchors or merge keys, then migrate again") from None


def _header(spec: PipelineSpec, migration: Migration, rebased: list[str], lost: str | None) -> str:
    """The comment the migrated spec starts with: where it came from and every change, because the comments kept
    from the engine-flow spec may still describe what it was (its quantization, its BLS or Medusa ensemble)."""
    lines = [f"# Written by `specbuild migrate` from {spec.path.name} for TensorRT-LLM {migration.line} "
             "(build.flow: pytorch). What changed:"]
    lines += [f"#  - {note}" for note in migration.notes]
    lines.append(f"# Keys rewritten: {', '.join(change.named() for change in migration.changes)}.")
    named = {".".join(change.loc) for change in migration.changes}
    if rebased := [key for key in rebased if key not in named]:
        lines.append(f"# Relative paths rebased to this file's directory: {', '.join(rebased)}.")
    if lost is None:
        lines.append("# The comments below are the engine-flow spec's, kept as they were: where one disagrees with "
                     "a value, the value")
        lines.append("# (and this list) is what this spec means.")
    else:
        lines.append(f"# The engine-flow spec's comments and layout were not kept ({lost}): below is its data, "
                     "as plain YAML.")
    return "\n".join(lines) + "\n"


def _check_out(spec_path: Path, out: Path) -> None:
    """OUT must be a file migrate may write: not SPEC, not a directory, not under a file."""
    if out.resolve() == spec_path.resolve():
        raise SpecError(f"{out}: OUT is the spec itself; migrate never overwrites its input",
                        hint="name another file, e.g. " + str(spec_path.with_name(spec_path.stem + "-pytorch.yaml")))
    if out.is_dir():
        raise SpecError(f"{out}: OUT is a directory; migrate writes the new spec to a file",
                        hint=f"name a file, e.g. {out / (spec_path.stem + '-pytorch.yaml')}")
    above = next(parent for parent in Path(os.path.abspath(out)).parents if parent.exists())
    if not above.is_dir():
        raise SpecError(f"{out}: {above} is a file, so OUT cannot be written under it", hint="name OUT in a directory")


def migrate_spec(spec_path: Path, out: Path, *, line: str = NEWEST_TRTLLM_LINE, to: str = "ngram") -> Migration:
    """Migrate the spec at `spec_path` and write OUT atomically (relative paths rebased to OUT's directory); OUT
    and the new spec are checked first, so a migration that would not load, or a bad OUT, writes nothing."""
    _check_out(spec_path, out)
    spec = load_spec(spec_path)
    text = spec_path.read_text(encoding="utf-8")
    data = yaml.safe_load(text)
    migration = plan(spec, data, line=line, to=to)
    body, rebased, lost = _rewritten(spec, text, data, migration, out)
    migration.text = _header(spec, migration, rebased, lost) + body
    if lost is not None:
        migration.notes.append(f"comments and layout not kept ({lost}): OUT is the migrated data as plain YAML")
    replace_text(out, migration.text)
    return migration
