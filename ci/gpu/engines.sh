#!/usr/bin/env bash
# GPU CI job: convert -> build (TensorRT-LLM 1.2 engines, in the NGC container) -> deploy, for one pipeline spec.
#
#   ci/gpu/engines.sh [SPEC]        default: ci/gpu/demo-gpu.yaml (the demo models, built first if missing)
#
# Needs: an NVIDIA GPU, Docker with the NVIDIA container toolkit, python3.11 with venv. Convert and deploy run in
# the project's own .venv on the host; only `specbuild build` runs in the container, because an engine loads only
# in the TensorRT-LLM that built it and the container's torch/TensorRT-LLM must not be replaced by the project's
# pinned CPU torch. Environment: TRTLLM_IMAGE (default the 1.2.0 release), JOBS (parallel engine builds).
set -euo pipefail
cd "$(dirname "$0")/../.."

SPEC="${1:-ci/gpu/demo-gpu.yaml}"
IMAGE="${TRTLLM_IMAGE:-nvcr.io/nvidia/tensorrt-llm/release:1.2.0}"
JOBS="${JOBS:-1}"

make install
if [ "$SPEC" = "ci/gpu/demo-gpu.yaml" ]; then
  .venv/bin/specbuild demo-models demo/models
fi
.venv/bin/specbuild validate "$SPEC"
.venv/bin/specbuild convert "$SPEC"
# Every check and the trtllm-build plans, before the container starts (build.sh scripts land beside the engines).
.venv/bin/specbuild build "$SPEC" --backend tensorrt --dry-run

docker run --rm --gpus all --ipc=host --ulimit memlock=-1 --ulimit stack=67108864 \
  --user "$(id -u):$(id -g)" -e HOME=/tmp -e JOBS="$JOBS" \
  -v "$PWD:$PWD" -w "$PWD" "$IMAGE" bash ci/gpu/build-in-container.sh "$SPEC"

.venv/bin/specbuild deploy "$SPEC"
