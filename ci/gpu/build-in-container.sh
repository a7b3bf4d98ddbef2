#!/usr/bin/env bash
# Runs inside the TensorRT-LLM 1.2 container (see engines.sh): specbuild without its dependencies, on top of the
# container's own torch and tensorrt_llm, then `specbuild build --backend tensorrt`.
set -euo pipefail
SPEC="$1"
python3 -m venv --system-site-packages /tmp/specbuild-venv
# --no-deps: the project's pins (CPU torch 2.13, transformers 5.14) would replace the container's CUDA stack.
/tmp/specbuild-venv/bin/pip install --quiet --no-deps "$PWD"
/tmp/specbuild-venv/bin/pip install --quiet "pydantic>=2.7,<3" "pyyaml>=6" "typer>=0.12" "rich>=13" "xxhash>=3"
/tmp/specbuild-venv/bin/python -c 'import tensorrt_llm; print("TensorRT-LLM", tensorrt_llm.__version__)'
/tmp/specbuild-venv/bin/specbuild build "$SPEC" --backend tensorrt --jobs "${JOBS:-1}"
