"""Arguments and options that several commands share, written once so that they read the same everywhere.

One spelling per meaning: SPEC is a pipeline spec file, REPOSITORY a Triton model repository, URL a server
address; `--model` is a Hugging Face directory (convert) and `--model-name` a Triton model (serve, bench).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

Spec = Annotated[Path, typer.Argument(help="The pipeline spec (YAML).", metavar="SPEC")]
OptionalSpec = Annotated[Path | None, typer.Argument(help="The pipeline spec (YAML).", metavar="SPEC")]
Force = Annotated[bool, typer.Option("--force", help="Do the work even if the manifest says up to date.")]
DryRun = Annotated[bool, typer.Option("--dry-run", help="Check everything and print the plan; write nothing.")]
ModelName = Annotated[
    str | None,
    typer.Option("--model-name", metavar="NAME", help="Triton model to send requests to (default: the repository's "
                 "entry model: tensorrt_llm_bls when a draft is deployed, else ensemble)."),
]
NumDraftTokens = Annotated[
    int | None,
    typer.Option("--num-draft-tokens", min=0, help="Draft tokens per speculation round (0: the same deployment "
                 "without speculating; default: the deployment's)."),
]
MaxTokens = Annotated[int, typer.Option("--max-tokens", min=1, help="New tokens per request at most.")]
JsonOutput = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables or text.")]
TrainingText = Annotated[
    list[Path] | None,
    typer.Option("--text", metavar="FILE", help="Training text files (repeatable); default: the built-in pydoc "
                 "corpus."),
]


def read_training_texts(paths: list[Path] | None) -> list[str] | None:
    """The `--text` files' contents (None: the trainer's built-in corpus); an unreadable file, or one that is not
    UTF-8 text (a binary, another encoding), is one error naming it."""
    from specbuild.errors import SpecbuildError

    texts = []
    for path in paths or ():
        try:
            texts.append(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError as err:
            raise SpecbuildError(f"{path}: --text is not UTF-8 text (byte {err.start}: {err.reason})",
                                 hint="give plain text files in UTF-8 (convert another encoding first, e.g. with "
                                 "`iconv -t UTF-8`)") from None
        except OSError as err:
            raise SpecbuildError(f"{path}: cannot read --text ({err.strerror or err})") from None
    return texts or None


def given_options(ctx: typer.Context, *names: str) -> list[str]:
    """Which of the command's parameters `names` the user set (on the command line or through the environment),
    spelled as on the command line (`base_lr` -> `--base-lr`): a command refuses an option it would otherwise
    ignore instead of dropping it silently, and needs to tell a typed value from its default. (Sources are
    compared by name: typer carries its own copy of click, whose ParameterSource is not click's.)"""
    spelled = {param.name: param.opts[0] for param in ctx.command.params}
    sources = {name: ctx.get_parameter_source(name) for name in names}
    return [spelled[name] for name, source in sources.items()
            if source is not None and source.name in ("COMMANDLINE", "ENVIRONMENT", "PROMPT")]


def print_training_metrics(metrics: dict[str, float], output: Path, width: int = 16) -> None:
    """What a training command prints last: its held-out figures, one per line, and where it wrote."""
    from specbuild.cli.errors import console

    for name, value in metrics.items():
        console.print(f"{name:{width}s} {value:.4f}", highlight=False)
    console.print(f"wrote {output}", highlight=False)

