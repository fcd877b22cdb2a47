#!/usr/bin/env bash
# One round on the lent GPU host (../shared/gpu-host/README.md), a few minutes: the CUDA build,
# the GPU tests, the benchmark, every log kept. Prepare here with ../shared/gpu-host/kit.sh, then
# run it there from the project root, .gpu-host carried:
#     scripts/gpu-round.sh [--no-bench | --bench-only] [--only REGEX] [--profile]
# --only REGEX: just the GPU tests matching it (and no benchmark), for a quick second try.
# --profile: then scripts/gpu-profile.sh (ncu's kernel times, ~1 min) into the same $OUT.
# On the H200 (2026-11-30) the build took 33 s, the tests 110 s and the benchmark 90 s, so one
# call of the device tool (10 min) holds a whole round with --profile (~5 min); where the tests
# run long, --no-bench then --bench-only on the still-warm machine (the build is kept).
# Logs go to $OUT (the device tool's output folder; ./gpu-round-logs without one) as one
# logs.tar.gz, since the tool brings back only a few files, plus summary.txt: the timeline, each
# test's result, the failures' output and the benchmark's verdicts. Exit status: the tests'.
set -uo pipefail
cd "$(dirname "$0")/.."
bench=1 tests=1 only= profile=0
while [ $# -gt 0 ]; do
  case $1 in
    --no-bench) bench=0 ;;
    --bench-only) tests=0 ;;
    --only) only=$2; bench=0; shift ;;
    --profile) profile=1 ;;
    *) echo "gpu-round: unknown argument '$1'" >&2; exit 2 ;;
  esac
  shift
done
out=${OUT:-$PWD/gpu-round-logs}
logs=$(mktemp -d)
mkdir -p "$out"
summary=$out/summary.txt
: >"$summary"
t0=$(date +%s)
say() { echo "[$(($(date +%s) - t0))s] $*" | tee -a "$summary"; }
pack() { tar -C "$logs" -czf "$out/logs.tar.gz" . ; }
trap pack EXIT

# shellcheck disable=SC1091
source .gpu-host/env.sh || { say "no .gpu-host/env.sh: run ../shared/gpu-host/kit.sh here first"; exit 1; }
py=$(command -v python3) # the host's Python with torch and NumPy, not /usr/bin/python3
nvidia-smi -L >>"$summary" 2>&1
say "configure (tests' Python: $py)"
# shellcheck disable=SC2086
cmake -S . -B build-gpu $TANDEM_KIT_CMAKE_ARGS -DTANDEM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DTANDEM_TEST_PYTHON="$py" >"$logs/configure.log" 2>&1 || { say "configure failed"; tail -30 "$logs/configure.log" | tee -a "$summary"; exit 1; }
say build
cmake --build build-gpu -j"$(nproc)" >"$logs/build.log" 2>&1 || { say "build failed"; grep -m20 -A6 'error' "$logs/build.log" | tee -a "$summary"; exit 1; }
rc=0
if [ $tests = 1 ]; then
  say "ctest -L gpu ${only:+-R $only}"
  (cd build-gpu && timeout 420 ctest -L gpu ${only:+-R "$only"} -j3 --output-on-failure) >"$logs/ctest.log" 2>&1
  rc=$?
  say "ctest exit $rc"
  grep -E 'Test +#' "$logs/ctest.log" | tee -a "$summary"
  [ $rc = 0 ] || sed -n '/The following tests FAILED/,$p;/\*\*\*Failed/,/Start/p' "$logs/ctest.log" | head -80 >>"$summary"
  engine=$(find build-gpu -name gpu_test_gpu_engine -type f | head -1)
  [ -n "$engine" ] && "$engine" >"$logs/test_gpu_engine.log" 2>&1
fi
if [ $bench = 1 ]; then
  say bench
  OUT=$logs TIMEOUT_S=120 timeout 300 bash bench/bench_gpu.sh --quick >"$logs/bench.log" 2>&1
  say "bench exit $?"
  grep -E '^(basicnet|mlp7|resnet-small) |PASS|FAIL|tandem / torch' "$logs/bench.log" | tee -a "$summary"
fi
if [ $profile = 1 ]; then
  say profile
  OUT=$out timeout 240 bash scripts/gpu-profile.sh >"$logs/profile.log" 2>&1
  say "profile exit $?"
fi
say done
exit $rc
