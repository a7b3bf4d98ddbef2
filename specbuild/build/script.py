"""`--dry-run`'s standalone `build.sh`: one engine's build, runnable unchanged in the TensorRT-LLM 1.2 container.

It does what `specbuild build --backend tensorrt` does for that engine, without specbuild installed: checks the
TensorRT-LLM version (engines only load in the runtime of the version that built them: triton-inference-server/
tensorrtllm_backend issues #330, #337, #194),
runs `trtllm-build` with the plan's arguments into a temporary directory with a log, writes the `engine.json`
deploy reads and a manifest, and swaps the result into place only when everything succeeded.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from specbuild.build.plan import BuildPlan
from specbuild.build.trtllm_flags import CONTAINER, TRTLLM_VERSION
from specbuild.contracts.engine_info import ENGINE_INFO, EngineInfo

SCRIPT_NAME = "build.sh"


def script_path(output_dir: Path, role: str) -> Path:
    """`<output_dir>/build-scripts/<role>/build.sh`: beside the engines, never inside one."""
    return output_dir / "build-scripts" / role / SCRIPT_NAME


def _argument_lines(plan: BuildPlan) -> list[str]:
    """`trtllm-build` and its arguments, one flag per line, the paths as the script's variables."""
    args = plan.args()
    lines = ["trtllm-build"]
    for index, arg in enumerate(args):
        previous = args[index - 1] if index else ""
        if previous == "--checkpoint_dir":
            word = '"$CHECKPOINT_DIR"'
        elif previous == "--output_dir":
            word = '"$tmp"'
        else:
            word = shlex.quote(arg)
        if arg.startswith("--") and index:
            lines.append(word)
        else:
            lines[-1] += f" {word}"
    return lines


def render_build_script(plan: BuildPlan, info: EngineInfo, pipeline: str) -> str:
    """The script's text (bash; `bash -n` clean). Paths are single-quoted words (in an assignment's default, where
    they are one word whatever they hold: quotes, `$`, a newline); the comments name only the spec's name (its
    repr: one line) and fixed text."""
    engine_json = json.dumps(info.to_json(), indent=2)
    manifest = json.dumps(
        {"stage": "build", "written_by": SCRIPT_NAME, "backend": "tensorrt", "plan": plan.to_json()}, indent=2
    )
    command = " \\\n  ".join(_argument_lines(plan))
    return f"""#!/usr/bin/env bash
# Builds the {plan.role} engine of pipeline {pipeline!r} with TensorRT-LLM {TRTLLM_VERSION}.
# Written by `specbuild build --dry-run`; runs unchanged inside {CONTAINER}
# with the checkpoint mounted at the same path (or set CHECKPOINT_DIR and ENGINE_DIR).
set -euo pipefail

CHECKPOINT_DIR=${{CHECKPOINT_DIR:-{shlex.quote(str(plan.checkpoint_dir))}}}
ENGINE_DIR=${{ENGINE_DIR:-{shlex.quote(str(plan.output_dir))}}}

version="$(python3 -c 'import tensorrt_llm; print(tensorrt_llm.__version__)' 2>/dev/null | tail -n 1 || true)"
case "$version" in
  {TRTLLM_VERSION}.*) ;;
  *) echo "build.sh: needs TensorRT-LLM {TRTLLM_VERSION}.x (found '${{version:-none}}'); run it in {CONTAINER}" >&2
     exit 1 ;;
esac
if [ ! -f "$CHECKPOINT_DIR/config.json" ]; then
  echo "build.sh: $CHECKPOINT_DIR has no config.json; run \\`specbuild convert SPEC\\` first" >&2
  exit 1
fi

parent="$(dirname "$ENGINE_DIR")"
mkdir -p "$parent"
tmp="$(mktemp -d "$parent/.$(basename "$ENGINE_DIR").tmp-XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
start=$SECONDS
echo "building the {plan.role} engine; log: $tmp/build.log"
{command} \\
  > "$tmp/build.log" 2>&1 || {{ tail -n 40 "$tmp/build.log" >&2; echo "build.sh: trtllm-build failed" >&2; exit 1; }}

cat > "$tmp/{ENGINE_INFO}" <<'SPECBUILD_ENGINE_JSON'
{engine_json}
SPECBUILD_ENGINE_JSON
cat > "$tmp/manifest.json" <<'SPECBUILD_MANIFEST_JSON'
{manifest}
SPECBUILD_MANIFEST_JSON
chmod 755 "$tmp"
if [ -e "$ENGINE_DIR" ]; then
  old="$tmp.old"
  mv "$ENGINE_DIR" "$old"
  mv "$tmp" "$ENGINE_DIR"
  rm -rf "$old"
else
  mv "$tmp" "$ENGINE_DIR"
fi
trap - EXIT
echo "built $ENGINE_DIR in $((SECONDS - start)) s"
"""


def write_build_script(plan: BuildPlan, info: EngineInfo, pipeline: str, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_build_script(plan, info, pipeline), encoding="utf-8")
    path.chmod(0o755)
    return path
