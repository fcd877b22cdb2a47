#!/usr/bin/env bash
# ui: the page of `tandem ui` with many metric keys, the compare view's metrics table, restart and
# resume marks, the run's config and summary, the runs table at 1024 px and the legend's number
# format, in headless chromium (test_ui_keys.mjs). The store comes from bench/ui_store_gen (the
# real track API): 24 small 2-rank runs of workflow "sweep" and one run "wide" with
# TANDEM_UI_WIDE_KEYS (20,000) keys; sweep-1 gets a resume event in the store (what the ingest
# keeps of a trainer's resume line when it restarts from a checkpoint). Skips (77) without node, chromium,
# node_modules or the ui_store_gen binary of the build.
set -uo pipefail
B=${TANDEM_BIN:?TANDEM_BIN must name the tandem binary}
B=$(cd "$(dirname "$B")" && pwd)/$(basename "$B")
HERE=$(cd "$(dirname "$0")" && pwd)
SRC=$(cd "$HERE/../../.." && pwd)
GEN=${TANDEM_BUILD_DIR:-$(dirname "$B")}/bench/ui_store_gen
CHROMIUM=${TANDEM_CHROMIUM:-/usr/bin/chromium}
NODE=$(command -v node) || { echo "SKIP: node is missing (apt-get install nodejs)"; exit 77; }
[ -x "$CHROMIUM" ] || { echo "SKIP: $CHROMIUM is missing (apt-get install chromium)"; exit 77; }
[ -d "$SRC/src/ui/web/node_modules/puppeteer-core" ] ||
  { echo "SKIP: src/ui/web/node_modules/puppeteer-core is missing (run scripts/deps.sh, or npm ci --prefix src/ui/web)"; exit 77; }
[ -x "$GEN" ] || { echo "SKIP: $GEN is missing (build the ui_store_gen target)"; exit 77; }
WIDE=${TANDEM_UI_WIDE_KEYS:-20000}

P=$(mktemp -d /tmp/tandem-ui-keys-XXXXXX)
export TANDEM_HOME=$P TANDEM_UI_FAILSHOTS=$P
UI_PID=
cleanup() {
  [ -n "$UI_PID" ] && kill "$UI_PID" 2>/dev/null && wait "$UI_PID" 2>/dev/null
  if [ "${KEEP:-0}" = 1 ]; then echo "kept $P"; else rm -rf "$P"; fi
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
cd "$P"

WIDE_ID=$("$GEN" "$P" 24 0 "$WIDE" 2>"$P/gen.log" | sed -n 's/^wide //p') || fail "ui_store_gen: $(cat "$P/gen.log")"
[ -n "$WIDE_ID" ] || fail "ui_store_gen printed no wide run: $(cat "$P/gen.log")"
for r in sweep-1 sweep-2 sweep-3; do [ -d "$P/.tandem/runs/$r" ] || fail "no run $r in the store"; done
# sweep-1 resumed from its checkpoint at step 400: the event the ingest keeps in the store's
# run_events table for a trainer's resume line (docs/metrics-format.md), seeded there as
# ui_store_gen seeds the points (an ingested resume line would also cut steps 401.. of the
# generated series); the UI reads marks from the store only.
"${PYTHON:-/usr/bin/python3}" - "$P/.tandem/runs.db" <<'PYEOF' || fail "could not seed sweep-1's resume"
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], timeout=30)
with db:
    db.execute("INSERT INTO run_events(run, file, line, rank, kind, step, time)"
               " SELECT seq, 'rank-0.jsonl', 1, 0, 'resume', 400, 1700000000.5 FROM runs"
               " WHERE id = 'sweep-1'")
PYEOF

"$B" ui --port 0 >"$P/ui.log" 2>&1 &
UI_PID=$!
URL=
for _ in $(seq 100); do
  URL=$(grep -o 'http://[^ ]*' "$P/ui.log" 2>/dev/null | head -1)
  [ -n "$URL" ] && break
  kill -0 "$UI_PID" 2>/dev/null || fail "tandem ui exited: $(cat "$P/ui.log")"
  sleep 0.1
done
[ -n "$URL" ] || fail "tandem ui printed no URL in 10 s: $(cat "$P/ui.log")"
echo "tandem ui at $URL; wide run $WIDE_ID with $WIDE keys"

"$NODE" "$HERE/test_ui_keys.mjs" "$URL" "$WIDE_ID" "$WIDE"
rc=$?
[ $rc = 0 ] || { echo "--- tandem ui output:"; tail -n 30 "$P/ui.log"; }
exit $rc
