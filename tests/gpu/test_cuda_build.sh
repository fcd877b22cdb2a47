#!/usr/bin/env bash
# The CUDA backend on every machine, GPU or not: it builds with nvcc from PyPI under the build's
# warnings as errors, its kernel bodies agree with direct loops on the host
# (test_gpu_kernels_host), and without a driver `tandem train --device cuda` refuses with the way
# out (scripts/cuda-check.sh). Skips (77) where scripts/venv.sh has not made the environments.
set -euo pipefail
exec "$TANDEM_SOURCE_DIR/scripts/cuda-check.sh" "$TANDEM_BUILD_DIR/cuda-check"
