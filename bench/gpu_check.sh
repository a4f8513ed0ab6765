#!/usr/bin/env bash
# One command on a machine with CUDA: the gpu-marked tests and the GPU forms of the benchmarks,
# one table (bench/gpu_check.py says what and why). Without CUDA every row says skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-$(command -v python3 || command -v python)}"
exec "$PY" bench/gpu_check.py "$@"
