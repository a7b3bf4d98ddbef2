"""Reading a generated command line the way its program would, for tests of written serve commands."""

from __future__ import annotations


def parse_flags(argv: list[str]) -> dict[str, str | bool]:
    """`--flag value` and value-less `--flag` (True), each name once: what a generated command line sets."""
    flags: dict[str, str | bool] = {}
    index = 0
    while index < len(argv):
        name = argv[index]
        assert name.startswith("--"), f"stray argument {name!r} in {argv}"
        assert name not in flags, f"{name} given twice"
        if index + 1 < len(argv) and not argv[index + 1].startswith("--"):
            flags[name], index = argv[index + 1], index + 2
        else:
            flags[name], index = True, index + 1
    return flags
