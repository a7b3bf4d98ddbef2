#!/usr/bin/env bash
# Runs inside the TensorRT-LLM 1.2 container (see engines.sh): specbuild without its dependencies, on top of the
# container's own torch and tensorrt_llm, then `specbuild build --backend tensorrt`.
set -euo pipefail
SPEC="$1"
# --without-pip: the container may lack python3-venv (ensurepip); the venv uses the container's pip instead,
# which --system-site-packages makes importable.
python3 -m venv --system-site-packages --without-pip /tmp/specbuild-venv
PY=/tmp/specbuild-venv/bin/python
# --no-deps: the project's pins (CPU torch 2.13, transformers 5.14) would replace the container's CUDA stack.
# --ignore-requires-python: the container's Python is 3.12; the project pins 3.11 for its CPU stack only.
"$PY" -m pip install --quiet --no-deps --ignore-requires-python "$PWD"
"$PY" -m pip install --quiet "pydantic>=2.7,<3" "pyyaml>=6" "typer>=0.12" "rich>=13" "xxhash>=3"
"$PY" -c 'import tensorrt_llm; print("TensorRT-LLM", tensorrt_llm.__version__)'
/tmp/specbuild-venv/bin/specbuild build "$SPEC" --backend tensorrt --jobs "${JOBS:-1}"
