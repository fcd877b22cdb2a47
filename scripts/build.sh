#!/usr/bin/env bash
# Configures and builds tandem into build/ (or $TANDEM_BUILD_DIR), warnings as errors.
# Extra arguments go to cmake's configure step, e.g. -DTANDEM_SANITIZE=ON.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${TANDEM_BUILD_DIR:-build}
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release -DTANDEM_WERROR=ON "$@" >/dev/null
cmake --build "$build_dir" -j"$(nproc)"
