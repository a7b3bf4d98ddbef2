"""The `specbuild` command line: the app and which module holds each command.

Commands are thin: they parse arguments, call one stage function, and print what it did. Heavy imports
(torch, transformers, ModelOpt) happen inside the commands so that `specbuild --help` and `specbuild init`
answer at once.
"""

from __future__ import annotations

from specbuild.cli import bench, build, convert, demo, deploy, generate, init, migrate, serve, tune
from specbuild.cli.draft import draft_app
from specbuild.cli.eagle import eagle_app
from specbuild.cli.export import export_app
from specbuild.cli.help import App
from specbuild.cli.medusa import medusa_app

app = App(
    name="specbuild",
    help=(
        "Hugging Face checkpoints to a speculative-decoding service on Triton Inference Server (TensorRT-LLM), "
        "NVIDIA Dynamo, vLLM or SGLang.\n\n"
        "Typical flow: `specbuild init pipeline.yaml` writes a commented spec; edit it, `validate` it; `convert` and "
        "`build` (TensorRT-LLM checkpoints and engines, or reference bundles without a GPU); optionally `tune`; "
        "`deploy` (a Triton model repository, or with deploy.target: dynamo a Dynamo deployment); `serve` it; "
        "`bench` it. For vLLM or SGLang, `export vllm|sglang SPEC` writes the engine's serve command. Each stage "
        "checks everything first, writes atomically, and skips itself when its inputs are unchanged."
    ),
)

# In the order a pipeline runs them (the order `specbuild --help` lists them in).
app.command()(init.init)
app.command()(build.validate)
app.command("demo-models")(demo.demo_models)
app.command()(convert.convert)
app.command()(build.build)
app.command()(tune.tune)
app.command()(migrate.migrate)
app.command()(deploy.deploy)
app.command()(serve.serve)
app.command()(bench.bench)
app.add_typer(medusa_app, name="medusa")
app.add_typer(draft_app, name="draft")
app.add_typer(eagle_app, name="eagle")
app.add_typer(export_app, name="export")
app.command()(generate.generate)


def main() -> None:  # pragma: no cover - `python -m specbuild.cli` (__main__.py); the console script is `app`
    app()
