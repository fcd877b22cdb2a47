#!/usr/bin/env bash
# `tandem ui` benchmark: a store of 100 runs, one of them 1,000,000 points over 10 keys and 2
# ranks (bench/ui_store_gen.c, through the real track API), served by `tandem ui --port 0`, timed
# in headless chromium by bench/bench_ui.mjs (the browser test's invocation). Targets: the run's
# first chart <= 1 s after navigation start, at most a few thousand points per chart, the runs
# table <= 0.5 s. Prints the numbers; docs/ui.md keeps a table of them.
#
#   bench/bench_ui.sh [BUILD_DIR] [REPS]     (default build, 5)
set -euo pipefail
SRC=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(cd "${1:-$SRC/build}" && pwd)
REPS=${2:-5}
B=$BUILD/tandem
GEN=$BUILD/bench/ui_store_gen
[ -x "$B" ] || { echo "no $B: build first (cmake --build $BUILD)"; exit 1; }
[ -x "$GEN" ] || { echo "no $GEN: build the ui_store_gen target"; exit 1; }
command -v node >/dev/null || { echo "node is missing"; exit 1; }
[ -d "$SRC/src/ui/web/node_modules/puppeteer-core" ] || { echo "run npm ci --prefix src/ui/web"; exit 1; }

P=$(mktemp -d /tmp/tandem-bench-ui-XXXXXX)
UI_PID=
cleanup() {
  [ -n "$UI_PID" ] && kill "$UI_PID" 2>/dev/null && wait "$UI_PID" 2>/dev/null
  rm -rf "$P"
}
trap cleanup EXIT
t0=$(date +%s.%N)
BIG=$("$GEN" "$P" 99 1000000 | tail -1)
echo "store: $(du -sh "$P/.tandem/runs.db" | cut -f1) runs.db, made in $(echo "$(date +%s.%N) - $t0" | bc | cut -c1-5) s; big run $BIG"

cd "$P"
TANDEM_HOME=$P "$B" ui --port 0 >"$P/ui.log" 2>&1 &
UI_PID=$!
URL=
for _ in $(seq 100); do
  URL=$(grep -o 'http://[^ ]*' "$P/ui.log" | head -1 || true)
  [ -n "$URL" ] && break
  sleep 0.1
done
[ -n "$URL" ] || { echo "tandem ui printed no URL: $(cat "$P/ui.log")"; exit 1; }
node "$SRC/bench/bench_ui.mjs" "$URL" "$BIG" "$REPS"
