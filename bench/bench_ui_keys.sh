#!/usr/bin/env bash
# `tandem ui` with many metric keys: for each N, a store with one run of N keys
# (bench/ui_store_gen.c PROJECT 0 0 N: 10 points per key), `tandem ui --port 0` on it, and the run
# page timed in headless chromium by bench/bench_ui_keys.mjs (first chart, the run's JSON, the
# longest main-thread task, chart cells, finding a key with the filter box). docs/benchmarks.md
# ("UI with many keys") keeps the figures.
#
#   bench/bench_ui_keys.sh [BUILD_DIR] [REPS] [N ...]     (default build, 3, 2000 8000 100000)
set -euo pipefail
SRC=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(cd "${1:-$SRC/build}" && pwd)
REPS=${2:-3}
shift $(($# < 2 ? $# : 2))
KEYS=("$@")
[ ${#KEYS[@]} -gt 0 ] || KEYS=(2000 8000 100000)
B=${TANDEM_BENCH_BIN:-$BUILD/tandem}
GEN=$BUILD/bench/ui_store_gen
[ -x "$B" ] || { echo "no $B: build first (cmake --build $BUILD)"; exit 1; }
[ -x "$GEN" ] || { echo "no $GEN: build the ui_store_gen target"; exit 1; }
command -v node >/dev/null || { echo "node is missing"; exit 1; }
[ -d "$SRC/src/ui/web/node_modules/puppeteer-core" ] || { echo "run npm ci --prefix src/ui/web"; exit 1; }

P=
UI_PID=
cleanup() {
  [ -n "$UI_PID" ] && kill "$UI_PID" 2>/dev/null && wait "$UI_PID" 2>/dev/null
  [ -n "$P" ] && rm -rf "$P"
  UI_PID= P=
}
trap cleanup EXIT
for N in "${KEYS[@]}"; do
  P=$(mktemp -d /tmp/tandem-bench-ui-keys-XXXXXX)
  t0=$(date +%s.%N)
  ID=$("$GEN" "$P" 0 0 "$N" 2>/dev/null | sed -n 's/^wide //p')
  echo "== $N keys: run $ID, store made in $(echo "$(date +%s.%N) - $t0" | bc | cut -c1-5) s"
  (cd "$P" && TANDEM_HOME=$P exec "$B" ui --port 0 >"$P/ui.log" 2>&1) &
  UI_PID=$!
  URL=
  for _ in $(seq 100); do
    URL=$(grep -o 'http://[^ ]*' "$P/ui.log" | head -1 || true)
    [ -n "$URL" ] && break
    sleep 0.1
  done
  [ -n "$URL" ] || { echo "tandem ui printed no URL: $(cat "$P/ui.log")"; exit 1; }
  LAST=$(printf 'grad/layer%06d' $((N - 4))) # ui_store_gen's naming
  node "$SRC/bench/bench_ui_keys.mjs" "$URL" "$ID" "$REPS" "${TIMEOUT_S:-180}" "$LAST" | sed "s/^result: /result $N keys: /"
  cleanup
done
