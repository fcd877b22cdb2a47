#!/usr/bin/env bash
# The nodes' links back to `tandem run` (src/exec/links.c) under a job's connect storm: N node
# agents (default 256; processes on this machine running the real agent code,
# src/launch/agent_link.c) dial one supervisor's links endpoint at once; each proves the token,
# says hello, receives the run's code as a tar stream, sends a log line and ends. Prints the time
# until all joined and until all ended, and the supervisor's peak RSS (VmHWM). Figures are
# printed, never asserted. The driver is tests/executors/test_links.c (--bench N).
#   TANDEM_BUILD_DIR=build bash bench/bench_links.sh [N]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${TANDEM_BUILD_DIR:-build}
n=${1:-256}
bin=$build/tests/executors_test_links
if [ ! -x "$bin" ]; then
    echo "bench_links: $bin is missing; build first (TANDEM_BUILD_DIR=$build bash scripts/build.sh)" >&2
    exit 1
fi
ulimit -n 4096 2>/dev/null || true # the supervisor holds a descriptor per agent
echo "bench_links: $(nproc) cores; $(uptime)"
exec "$bin" --bench "$n"
