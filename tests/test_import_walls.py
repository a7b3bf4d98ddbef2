"""The walls between specbuild's packages, checked on the source: every import of every module under specbuild/
(module level, inside functions and under `if TYPE_CHECKING:` alike) is read with `ast` and judged against the
table below, so that a wall holds although nothing at run time would notice it breaking — a convert import
added inside a runtime function, or a type-only import that ties two modules into a cycle.

A failure names the importing file and line, the module imported and the rule; the fix is to move the shared
name to a neutral module (or to a stage's public module), not to widen the table.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

# -- the walls: one table ------------------------------------------------------------------------------------------
ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "specbuild"

STAGES = frozenset({"convert", "build", "tune", "deploy", "serve", "bench", "demo", "export", "dynamo", "migrate"})
"""The pipeline's stages: each meets the others through the files it writes and the neutral modules."""

NEUTRAL = frozenset({
    "specbuild",  # the package itself (`__version__`)
    "errors", "atomic", "manifest", "dtypes", "tokenizer", "corpus", "pickle_weights", "spec", "training",
    "contracts", "medusa", "runtime", "python_models", "eagle", "self_draft",
})
"""Shared modules (second name of `specbuild.<name>`, a module or a package) that any stage may import."""

PLACED_IN = {"triton_models": "deploy"}
"""Directories that belong to a stage: `triton_models/` holds the config templates and model.py entry points that
deploy copies into a repository."""

CLI = "cli"
CLI_ONLY = ("specbuild.cli",)
"""The command line (and any command front end kept beside what it drives): only `specbuild.cli` imports them."""

MAY_IMPORT: dict[str, dict[str, tuple[str, ...]]] = {
    "convert": {},
    "build": {},
    # runtime, medusa and spec are neutral; it writes the spec that build then reads. `tune --served` measures the
    # deployed spec behind tritonserver as serve starts it (and its models' thread count), with bench's load; the
    # deployed BLS's config.pbtxt says whether it drafts and up to which K (the K a served tune measures)
    # `tune --engine vllm` measures the spec's vLLM export (its command line and flags) on the real engine, started,
    # read and asked as bench does it (one server launcher, one /metrics reader, one OpenAI client)
    "tune": {"serve": ("specbuild.serve.server", "specbuild.serve.triton_env"),
             "bench": ("specbuild.bench.load", "specbuild.bench.engine_server", "specbuild.bench.engine_metrics",
                       "specbuild.bench.openai"),
             "deploy": ("specbuild.deploy.layout", "specbuild.deploy.pbtxt"),
             "export": ("specbuild.export", "specbuild.export.vllm")},
    "deploy": {},  # what build wrote, and what a spec asks of an engine, come from contracts/
    "serve": {"deploy": ("specbuild.deploy.pbtxt",  # reads back the config.pbtxt deploy wrote
                         "specbuild.deploy.model_code"),  # and whether the model code deploy wrote is still ours
              "bench": ("specbuild.bench.client",)},  # asks the served repository its prompts
    "bench": {},
    "demo": {},
    "export": {},  # reads the spec and the HF checkpoints it names (no stage output but the quantized draft)
    # Dynamo's launch and manifests: each worker's engine settings from the one writer of each engine's settings
    "dynamo": {"deploy": ("specbuild.deploy.llmapi",), "export": ("specbuild.export",),
               # the same child-process launch as tritonserver, and the same serving until Ctrl-C
               "serve": ("specbuild.serve.launch", "specbuild.serve.lifetime"),
               # serve --prompt and the readiness probe speak OpenAI through bench's one OpenAI client
               "bench": ("specbuild.bench.openai",)},
    # a spec rewritten in place (tune's YAML editor), measured with tune's prompts on checkpoints convert writes
    "migrate": {"tune": ("specbuild.tune.spec_edit", "specbuild.tune.measure"),
                "convert": ("specbuild.convert.pipeline", "specbuild.convert.request")},
}
"""Which other stages a stage may import, and through which of their modules (that stage's public face)."""

RULES = {
    "runtime-independent": "runtime/ imports no stage and not the cli: it is the independent check of what convert "
                           "writes and what the reference Triton models run",
    "cli-on-top": f"only specbuild.cli imports {', '.join(CLI_ONLY)}: commands sit on top of the stages",
    "neutral-below-stages": "a neutral module imports no stage: every stage may import it, so it would tie them all",
    "stage-walls": "a stage imports another stage only through a module MAY_IMPORT lists for it",
    "placed": "every module is in STAGES, NEUTRAL, PLACED_IN or the cli",
    "no-cycles": "no two modules import each other, directly or around a loop (deferred and type-only imports "
                 "count: they hide a cycle, they do not remove it)",
}


# -- reading the imports -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Import:
    """One import statement's edge: `importer` (a module name) imports `target` at `file:line`."""

    importer: str
    target: str
    file: str
    line: int

    def where(self) -> str:
        return f"{self.file}:{self.line}: {self.importer} imports {self.target}"


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def find_modules(root: Path = PACKAGE) -> dict[str, Path]:
    return {module_name(p, root): p for p in sorted(root.rglob("*.py")) if "__pycache__" not in p.parts}


def imports_of(source: str, module: str, *, is_package: bool, known: set[str], file: str = "<source>",
               prefix: str = "specbuild") -> Iterator[Import]:
    """Every import of a `prefix` module anywhere in `source` (ast.walk reaches function bodies and
    `if TYPE_CHECKING:` blocks); `from package import name` counts as importing the submodule where one exists."""
    package = module if is_package else module.rpartition(".")[0]
    nodes = [n for n in ast.walk(ast.parse(source, filename=file)) if isinstance(n, ast.Import | ast.ImportFrom)]
    for node in sorted(nodes, key=lambda n: (n.lineno, n.col_offset)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        for target in dict.fromkeys(targets):
            if target == prefix or target.startswith(prefix + "."):
                yield Import(module, target, file, node.lineno)


def all_imports(root: Path = PACKAGE) -> list[Import]:
    modules = find_modules(root)
    known = set(modules)
    return [imp for name, path in modules.items()
            for imp in imports_of(path.read_text(encoding="utf-8"), name, is_package=path.name == "__init__.py",
                                  known=known, file=str(path.relative_to(root.parent)))]


# -- judging them --------------------------------------------------------------------------------------------------
def group(module: str) -> str:
    """The table's name for a module's place: a stage, a neutral name, 'cli', or the bare name if unplaced."""
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else parts[0]
    return PLACED_IN.get(top, top)


def _within(module: str, names: tuple[str, ...]) -> bool:
    return any(module == name or module.startswith(name + ".") for name in names)


def broken_rule(imp: Import) -> str | None:
    """The first rule of RULES that `imp` breaks, or None."""
    source, target = group(imp.importer), group(imp.target)
    if source == CLI:
        return None
    if _within(imp.target, CLI_ONLY):
        return "cli-on-top"
    if source == "runtime" and target in STAGES:
        return "runtime-independent"
    if source in NEUTRAL and target in STAGES:
        return "neutral-below-stages"
    crosses = source in STAGES and target in STAGES and source != target
    if crosses and not _within(imp.target, MAY_IMPORT[source].get(target, ())):
        return "stage-walls"
    return None


def cycles(edges: list[Import]) -> list[list[str]]:
    """Strongly connected components of more than one module, or a module that imports itself (Tarjan)."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        graph.setdefault(e.importer, set()).add(e.target)
        graph.setdefault(e.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph[node]:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


# -- the tests -----------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def imports() -> list[Import]:
    return all_imports()


def test_every_module_is_placed() -> None:
    places = STAGES | NEUTRAL | {CLI}
    unplaced = sorted(m for m in find_modules() if group(m) not in places)
    if unplaced:
        pytest.fail(f"placed: {RULES['placed']}; not placed: {', '.join(unplaced)} (add each to the table)",
                    pytrace=False)


@pytest.mark.parametrize("rule", ["runtime-independent", "cli-on-top", "neutral-below-stages", "stage-walls"])
def test_no_import_crosses_a_wall(imports: list[Import], rule: str) -> None:
    broken = [imp.where() for imp in imports if broken_rule(imp) == rule]
    if broken:
        pytest.fail(f"{rule}: {RULES[rule]}:\n  " + "\n  ".join(broken), pytrace=False)


def test_no_import_cycles(imports: list[Import]) -> None:
    found = cycles(imports)
    lines = []
    for component in found:
        members = set(component)
        lines.append(" <-> ".join(component) + ":")
        lines += [f"    {imp.where()}" for imp in imports if imp.importer in members and imp.target in members]
    if found:
        pytest.fail(f"no-cycles: {RULES['no-cycles']}:\n  " + "\n  ".join(lines), pytrace=False)


def test_every_name_in_the_tables_exists() -> None:
    """A row naming a module that was moved or deleted guards nothing (a wall kept for a ghost, or a front end that
    may no longer be imported where it now lives), so every name the tables give must be in the package."""
    modules = set(find_modules())
    stale = [f"STAGES/NEUTRAL: specbuild.{name}" for name in sorted(STAGES | (NEUTRAL - {"specbuild"}))
             if f"specbuild.{name}" not in modules]
    stale += [f"PLACED_IN: specbuild/{name}/ (-> {stage})" for name, stage in sorted(PLACED_IN.items())
              if not (PACKAGE / name).is_dir() or stage not in STAGES]
    stale += [] if f"specbuild.{CLI}" in modules else [f"CLI: specbuild.{CLI}"]
    stale += [f"CLI_ONLY: {name}" for name in CLI_ONLY if name not in modules]
    stale += [f"MAY_IMPORT: stage {name}" for name in sorted(set(MAY_IMPORT) ^ STAGES)]
    stale += [f"MAY_IMPORT[{stage}]: {target}: {name}" for stage, allowed in sorted(MAY_IMPORT.items())
              for target, names in sorted(allowed.items()) for name in names
              if target not in STAGES or group(name) != target or name not in modules]
    assert not stale, "stale rows in the walls tables (remove or correct them):\n  " + "\n  ".join(stale)


def test_the_reader_sees_deferred_type_only_and_relative_imports() -> None:
    """The walls are only as good as the reader: imports inside functions, under TYPE_CHECKING, `from package
    import submodule` and relative imports all count."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "import json\n"
        "from specbuild.errors import SpecbuildError\n"
        "if TYPE_CHECKING:\n"
        "    from specbuild.convert.pipeline import ConvertRequest\n"
        "def load():\n"
        "    from specbuild.demo import models\n"
        "    from . import sampling\n"
        "    from .. import cli\n"
    )
    known = {"specbuild.demo.models", "specbuild.runtime.sampling", "specbuild.cli"}
    found = [(i.target, i.line) for i in imports_of(source, "specbuild.runtime.model", is_package=False, known=known)]
    assert found == [("specbuild.errors", 3), ("specbuild.convert.pipeline", 5), ("specbuild.demo.models", 7),
                     ("specbuild.runtime.sampling", 8), ("specbuild.cli", 9)]
    rules = [broken_rule(Import("specbuild.runtime.model", t, "f", n)) for t, n in found]
    assert rules == [None, "runtime-independent", "runtime-independent", None, "cli-on-top"]


def test_cycles_are_found_around_a_loop() -> None:
    edges = [Import(a, b, "f", 1) for a, b in (("a", "b"), ("b", "c"), ("c", "a"), ("c", "d"), ("e", "e"))]
    assert cycles(edges) == [["a", "b", "c"], ["e"]]
