#!/usr/bin/env bash
# libFuzzer on the parsers that read outside input (docs/fuzzing.md).
#   scripts/fuzz.sh NAME [SECONDS]  builds the clang targets, then fuzzes tests/fuzz/fuzz_NAME.c
#                                   for SECONDS (default 600) starting from the committed corpus
#                                   tests/fuzz/corpus/NAME. New inputs go to a scratch directory;
#                                   afterwards the small ones that add coverage are merged into
#                                   the committed corpus (libFuzzer -merge=1).
#   scripts/fuzz.sh --build         only builds the targets
#   scripts/fuzz.sh --list          prints the target names
# A finding (crash, sanitizer report, leak, timeout, out-of-memory) ends the run with libFuzzer's
# report and the input saved under $BUILD/artifacts/NAME/; the exit status is then 1. Exit 77:
# this machine has no clang with libFuzzer (Debian: apt-get install clang libclang-rt-14-dev).
# Environment:
#   TANDEM_FUZZ_BUILD_DIR  the clang build (default build-fuzz/)
#   TANDEM_FUZZ_SCRATCH    where new inputs go (default $BUILD/scratch/NAME, kept between runs)
#   TANDEM_FUZZ_MERGE=0    leave the committed corpus as it is
#   TANDEM_FUZZ_MERGE_MAX  largest input merged back, bytes (default 2048)
#   TANDEM_FUZZ_MAX_LEN    largest input the fuzzer makes, bytes (default 4096)
#   TANDEM_FUZZ_SKIP_BUILD=1  the targets are built already (a run right after --build)
# Run it niced on a shared machine: nice -n 19 scripts/fuzz.sh spec 600.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${TANDEM_FUZZ_BUILD_DIR:-$root/build-fuzz}
targets=(idx npy csv image checkpoint safetensors spec workflow metrics store mirror)

usage() {
  echo "usage: scripts/fuzz.sh NAME [SECONDS] | --build | --list   (NAME: ${targets[*]})" >&2
  exit 2
}

# clang must compile and link a fuzz target: the compiler alone is not enough, libFuzzer's
# runtime (libclang_rt.fuzzer) ships separately.
check_libfuzzer() {
  if ! command -v clang >/dev/null 2>&1; then
    echo "fuzz: clang is not installed; libFuzzer needs it (apt-get install clang" \
         "libclang-rt-14-dev, or run scripts/deps.sh)"
    exit 77
  fi
  local probe
  probe=$(mktemp -d)
  printf 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n);\n%s\n' \
    'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { return d && n; }' \
    >"$probe/probe.c"
  if ! clang -fsanitize=fuzzer,address "$probe/probe.c" -o "$probe/probe" 2>"$probe/err"; then
    echo "fuzz: clang cannot link libFuzzer (-fsanitize=fuzzer): $(head -c 300 "$probe/err")"
    echo "fuzz: install its runtime: apt-get install libclang-rt-14-dev (or run scripts/deps.sh)"
    rm -rf "$probe"
    exit 77
  fi
  rm -rf "$probe"
}

build_targets() {
  check_libfuzzer
  mkdir -p "$build"
  # Warnings stay warnings here: the gcc build is the -Werror gate, and clang's -Wformat=2
  # also flags the vsnprintf wrappers that gcc accepts.
  if ! cmake -S "$root" -B "$build" -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=Release \
       -DTANDEM_FUZZ=ON -DTANDEM_WERROR=OFF -DTANDEM_CUDA=OFF >"$build/fuzz-configure.log" 2>&1; then
    tail -30 "$build/fuzz-configure.log"
    echo "fuzz: configuring the clang build in $build failed (log: $build/fuzz-configure.log)"
    exit 1
  fi
  # Only the fuzz targets and the libraries they link, not the whole tree.
  cmake --build "$build" -j"$(nproc)" --target "${targets[@]/#/fuzz_}"
}

case "${1:-}" in
  --list) printf '%s\n' "${targets[@]}"; exit 0 ;;
  --build) build_targets; exit 0 ;;
  "" | -*) usage ;;
esac
name=$1
seconds=${2:-600}
[[ " ${targets[*]} " == *" $name "* ]] || usage
[[ $seconds =~ ^[0-9]+$ ]] || usage
[ "${TANDEM_FUZZ_SKIP_BUILD:-0}" = 1 ] || build_targets

corpus=$root/tests/fuzz/corpus/$name
scratch=${TANDEM_FUZZ_SCRATCH:-$build/scratch/$name}
artifacts=$build/artifacts/$name
max_len=${TANDEM_FUZZ_MAX_LEN:-4096}
mkdir -p "$scratch" "$artifacts"
# Leaks are findings here, whatever the test suite's ASan settings say.
export ASAN_OPTIONS=detect_leaks=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
bin=$build/tests/fuzz/fuzz_$name
echo "fuzz: $name for $seconds s from $corpus (new inputs: $scratch)"
rc=0
# The scratch directory comes first: libFuzzer writes new inputs only to the first one.
"$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len="$max_len" \
  -print_final_stats=1 -artifact_prefix="$artifacts/" "$scratch" "$corpus" || rc=$?
if ((rc != 0)); then
  echo "fuzz: $name: finding (libFuzzer exit $rc); the input is in $artifacts/:"
  ls -l "$artifacts" || true
  exit 1
fi
if [ "${TANDEM_FUZZ_MERGE:-1}" != 0 ]; then
  small=$build/merge/$name
  rm -rf "$small"
  mkdir -p "$small"
  find "$scratch" -maxdepth 1 -type f -size -"$((${TANDEM_FUZZ_MERGE_MAX:-2048} + 1))"c \
    -exec cp -t "$small" {} +
  before=$(find "$corpus" -type f | wc -l)
  "$bin" -merge=1 -max_len="$max_len" "$corpus" "$small" 2>"$build/merge-$name.log" || {
    tail -20 "$build/merge-$name.log"
    echo "fuzz: merging into $corpus failed"
    exit 1
  }
  after=$(find "$corpus" -type f | wc -l)
  echo "fuzz: merged $((after - before)) new inputs into $corpus ($(du -sh --apparent-size "$corpus" | cut -f1))"
fi
