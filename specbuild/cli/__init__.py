"""The `specbuild` command line (entry point `specbuild.cli:app`): one module per command group, the shared
arguments in `options`, the one error handler in `errors`, the help conventions in `help`."""

from specbuild.cli.app import app, main

__all__ = ["app", "main"]
