"""mkdocs hook: the troubleshooting page's list of refusal messages, collected from specbuild's source at build time.

Typing the list would go stale with the first new check, so the page holds a marker per group and this hook
replaces it with every message the code can refuse with: the first argument (and `hint=`) of each `raise` of a
`SpecbuildError` subclass, each spec problem (`Issue` tuples of spec/schema.py and the checks it calls, the
`custom_error` messages of the spec's own field types, the generic pydantic problems spec/describe.py words),
and each `problems.append(...)`/`issues.append(...)` message of the stage checks. Values only known at run time
appear as `‹expression›`. The collector only reads source (no import), so it runs without torch.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "specbuild"
MARKER = re.compile(r"^<!-- refusals: (?P<group>[\w-]+) -->$", re.MULTILINE)
BASE_ERROR = "SpecbuildError"
GROUPS: dict[str, tuple[str, ...]] = {
    # group -> the package paths (prefixes) whose messages it lists; "other" takes the rest
    "spec": ("spec/", "contracts/"),
    "convert": ("convert/", "pickle_weights.py", "tokenizer.py", "corpus.py", "dtypes.py"),
    "build": ("build/",),
    "tune": ("tune/",),
    "deploy": ("deploy/",),
    "serve": ("serve/", "bench/", "python_models/", "triton_models/"),
    "export": ("export/",),
    "runtime": ("runtime/", "medusa/", "eagle/", "self_draft/", "training.py"),
    "other": (),
}


@dataclass(frozen=True)
class Refusal:
    """One message the code can refuse with: its text (a template), a hint, where it is raised."""

    message: str
    hint: str
    where: str


def _text(node: ast.AST | None) -> str | None:
    """A string literal, f-string or concatenation of them as a template (`‹expr›` for what is formatted in)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                parts.append(str(value.value))
            elif isinstance(value, ast.FormattedValue):
                parts.append(f"‹{ast.unparse(value.value)}›")
        return "".join(parts)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _text(node.left), _text(node.right)
        if left is not None and right is not None:
            return left + right
    return None


def _error_classes(trees: dict[str, ast.Module]) -> set[str]:
    """Every class name that derives from SpecbuildError, transitively, across the package."""
    bases: dict[str, set[str]] = {}
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases[node.name] = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases}
    found = {BASE_ERROR}
    while True:
        more = {name for name, parents in bases.items() if parents & found} - found
        if not more:
            return found
        found |= more


def _called(node: ast.Call) -> str:
    return node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")


def _issue_message(node: ast.AST) -> str | None:
    """The message of an issue/problem value: a plain string, or the first string after a tuple's first element
    (`((loc), message, line_loc)`, `(field, message)`)."""
    if isinstance(node, ast.Tuple) and len(node.elts) >= 2:
        return next((t for t in map(_text, node.elts[1:]) if t is not None), None)
    return _text(node)


def _refusals(rel: str, tree: ast.Module, errors: set[str]) -> Iterator[Refusal]:
    for node in ast.walk(tree):
        where = f"specbuild/{rel}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and _called(node.exc) in errors:
            message = _text(node.exc.args[0]) if node.exc.args else None
            hint = next((_text(k.value) for k in node.exc.keywords if k.arg == "hint"), None)
            if message is not None:
                yield Refusal(message, hint or "", where)
        elif isinstance(node, ast.Call) and _called(node) in ("_error", "_warning") and rel == "build/validate.py":
            message = _text(node.args[0]) if node.args else None
            if message is not None:
                yield Refusal(message if _called(node) == "_error" else f"warning: {message}", "", where)
        elif (isinstance(node, ast.Call) and _called(node) == "refuse" and rel.startswith("export/")
              and len(node.args) == 4):
            what, why = _text(node.args[2]), _text(node.args[3])  # export/plan.py `refuse`'s wording
            hint = next((_text(k.value) for k in node.keywords if k.arg == "hint"), None)
            if what is not None and why is not None:
                yield Refusal(f"‹spec›: {what}: ‹engine› cannot serve this ({why})", hint or "", where)
        elif isinstance(node, ast.Call) and _called(node) == "custom_error" and len(node.args) == 2:
            message = _text(node.args[1])
            if message is not None:
                yield Refusal(message, "", where)
        elif (isinstance(node, ast.Call) and _called(node) == "append" and len(node.args) == 1
              and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name)
              and node.func.value.id.endswith(("issues", "problems"))):
            message = _issue_message(node.args[0])
            if message is not None:
                yield Refusal(message, "", where)
        elif isinstance(node, ast.Yield | ast.Tuple) and rel.startswith("spec/"):
            value = node.value if isinstance(node, ast.Yield) else node
            # an Issue literal: ((loc...), message, ...)
            if isinstance(value, ast.Tuple) and len(value.elts) == 3 and isinstance(value.elts[0], ast.Tuple):
                message = _text(value.elts[1])
                if message is not None:
                    yield Refusal(message, "", where)
    for function in ast.walk(tree):  # (field, message) pairs a `*_problems`/`*_issues` function builds
        if isinstance(function, ast.FunctionDef) and ("problem" in function.name or "issue" in function.name):
            for node in ast.walk(function):
                if isinstance(node, ast.Tuple) and len(node.elts) in (2, 3):
                    message = _text(node.elts[1])
                    if message is not None and " " in message:
                        yield Refusal(message, "", f"specbuild/{rel}:{node.lineno}")
    if rel == "spec/describe.py":  # the generic problems pydantic reports, in describe.py's words
        for node in ast.walk(tree):
            if isinstance(node, ast.Return) and (message := _text(node.value)) is not None:
                yield Refusal(message, "", f"specbuild/{rel}:{node.lineno}")
            if isinstance(node, ast.Dict) and node.values and all(_text(v) for v in node.values):
                for value in node.values:
                    yield Refusal(f"must be {_text(value)} (got ‹value›)", "", f"specbuild/{rel}:{value.lineno}")


def collect(package: Path = PACKAGE) -> dict[str, list[Refusal]]:
    """group -> its refusals, each message once (the first place it is raised), in file order."""
    trees = {p.relative_to(package).as_posix(): ast.parse(p.read_text(encoding="utf-8"))
             for p in sorted(package.rglob("*.py"))}
    errors = _error_classes(trees)
    groups: dict[str, list[Refusal]] = {name: [] for name in GROUPS}
    seen: set[str] = set()
    for rel, tree in trees.items():
        group = next((name for name, prefixes in GROUPS.items() if rel.startswith(prefixes) and prefixes), "other")
        for refusal in sorted(_refusals(rel, tree, errors), key=lambda r: int(r.where.rsplit(":", 1)[1])):
            if refusal.message.strip() and refusal.message not in seen:
                seen.add(refusal.message)
                groups[group].append(refusal)
    return groups


def _cell(text: str) -> str:
    text = " ".join(text.split()).replace("|", "\\|").replace("`", "'")
    return f"`{text}`" if text else ""


def table(refusals: list[Refusal]) -> str:
    rows = ["| message | hint printed with it | raised at |", "|---|---|---|"]
    rows += [f"| {_cell(r.message)} | {_cell(r.hint)} | `{r.where}` |" for r in refusals]
    return "\n".join(rows)


def on_page_markdown(markdown: str, page: object, config: object, files: object) -> str:
    """mkdocs: replace each `<!-- refusals: GROUP -->` marker with GROUP's table."""
    if not MARKER.search(markdown):
        return markdown
    groups = collect()
    return MARKER.sub(lambda found: table(groups[found.group("group")]), markdown)
