#!/usr/bin/env bash
# The test command: install what is missing, build with warnings as errors, run every test.
#   scripts/test.sh               the whole suite
#   scripts/test.sh -L comm       ctest arguments pass through (here: only the comm layer)
#   TANDEM_SANITIZE=1 scripts/test.sh   the same under ASan+UBSan, in build-asan/
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/venv.sh # from PyPI: the tests' clients and servers (moto, boto3, the AWS CLI); the frameworks; nvcc
export TANDEM_VENV=${TANDEM_VENV:-$PWD/.venv}
TANDEM_FRAMEWORKS_VENV=$(scripts/venv.sh --print-frameworks)
export TANDEM_FRAMEWORKS_VENV # PyTorch 2.x, Lightning, transformers, accelerate, wandb, MLflow
if [ "${TANDEM_SANITIZE:-0}" = 1 ]; then
  export TANDEM_BUILD_DIR=${TANDEM_BUILD_DIR:-build-asan}
  export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=1}
  export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
  scripts/build.sh -DTANDEM_SANITIZE=ON
else
  scripts/build.sh
fi
cd "${TANDEM_BUILD_DIR:-build}"
ctest --output-on-failure -j"$(nproc)" "$@"
