#!/usr/bin/env bash
# A short real libFuzzer run of every fuzz target (docs/fuzzing.md): scripts/fuzz.sh builds them
# with clang in $TANDEM_BUILD_DIR/fuzz-clang, then fuzzes each for TANDEM_FUZZ_SECONDS (default
# 8) from its committed corpus, new inputs going to a scratch directory that starts empty, so
# the corpus is left as it is. Any finding (crash, sanitizer report, leak, timeout) fails the
# test with libFuzzer's report; without clang's libFuzzer the test is skipped (exit 77).
set -euo pipefail
src=${TANDEM_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
build=${TANDEM_BUILD_DIR:-$src/build}
export TANDEM_FUZZ_BUILD_DIR=$build/fuzz-clang
export TANDEM_FUZZ_MERGE=0
seconds=${TANDEM_FUZZ_SECONDS:-8}
rc=0
"$src/scripts/fuzz.sh" --build >"$build/fuzz-clang.log" 2>&1 || rc=$?
if ((rc == 77)); then
  tail -2 "$build/fuzz-clang.log"
  exit 77
elif ((rc != 0)); then
  tail -40 "$build/fuzz-clang.log"
  echo "FAIL: building the fuzz targets with clang failed (log: $build/fuzz-clang.log)"
  exit 1
fi
failed=()
for name in $("$src/scripts/fuzz.sh" --list); do
  scratch=$TANDEM_FUZZ_BUILD_DIR/short/$name
  rm -rf "$scratch"
  log=$TANDEM_FUZZ_BUILD_DIR/short-$name.log
  if TANDEM_FUZZ_SCRATCH=$scratch TANDEM_FUZZ_SKIP_BUILD=1 \
    "$src/scripts/fuzz.sh" "$name" "$seconds" >"$log" 2>&1; then
    echo "fuzz_$name: $(grep -E '^(#[0-9]+[[:space:]]+DONE|stat::number_of_executed_units)' \
      "$log" | tr -s ' \t' ' ' | paste -sd ' ')"
  else
    tail -60 "$log"
    echo "FAIL: fuzz_$name (log: $log)"
    failed+=("$name")
  fi
done
if ((${#failed[@]})); then
  echo "FAIL: findings in: ${failed[*]}"
  exit 1
fi
echo "ok: ${seconds} s of libFuzzer on each target without a finding"
