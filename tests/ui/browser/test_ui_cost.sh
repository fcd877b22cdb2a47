#!/usr/bin/env bash
# ui: issue 31's cost in a real browser: a run whose RUN/instances.json (the aws executor's
# record, docs/cloud.md, written here by hand in its documented format) prices two instances,
# one replacing the other after a gap; its charts on the "cost ($)" x axis put each point at the
# dollars its instances had accrued by the point's time (computed in test_ui_cost.mjs from the
# record and the metrics file), the runs table and the run page show the total ($X.XX) with the
# instances and their prices in a tooltip, and a run without a record offers no cost axis and
# shows no Cost column value; the compare view of two priced runs puts each line on its own run's
# dollars, and offers no cost axis when a compared run has no price. test_ui_cost.mjs drives Debian's chromium through puppeteer-core.
# Skips (77) without node, chromium or node_modules.
set -uo pipefail
B=${TANDEM_BIN:?TANDEM_BIN must name the tandem binary}
B=$(cd "$(dirname "$B")" && pwd)/$(basename "$B")
HERE=$(cd "$(dirname "$0")" && pwd)
SRC=$(cd "$HERE/../../.." && pwd)
PY=${PYTHON:-/usr/bin/python3}
CHROMIUM=${TANDEM_CHROMIUM:-/usr/bin/chromium}
NODE=$(command -v node) || { echo "SKIP: node is missing (apt-get install nodejs)"; exit 77; }
[ -x "$CHROMIUM" ] || { echo "SKIP: $CHROMIUM is missing (apt-get install chromium)"; exit 77; }
[ -d "$SRC/src/ui/web/node_modules/puppeteer-core" ] ||
  { echo "SKIP: src/ui/web/node_modules/puppeteer-core is missing (run scripts/deps.sh)"; exit 77; }

P=$(mktemp -d /tmp/tandem-ui-cost-XXXXXX)
export TANDEM_HOME=$P TANDEM_UI_FAILSHOTS=$P
UI_PID=
cleanup() {
  [ -n "$UI_PID" ] && kill "$UI_PID" 2>/dev/null && wait "$UI_PID" 2>/dev/null
  if [ "${KEEP:-0}" = 1 ]; then echo "kept $P"; else rm -rf "$P"; fi
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
cd "$P"
mkdir -p .tandem

# 100 points of train/loss, one every 2 s of wall time from t0 (the metrics line's own time).
cat >curve.py <<'EOF'
import json, os
out = open(os.environ["TANDEM_METRICS"], "a")
t0 = 1700000000.0
for s in range(100):
    out.write(json.dumps({"step": s, "time": t0 + 2 * s, "train/loss": 1.0 / (1 + s)}) + "\n")
EOF
"$B" run --name cloud -- "$PY" curve.py >"$P/r1.log" 2>&1 || fail "tandem run cloud: $(cat "$P/r1.log")"
"$B" run --name plain -- "$PY" curve.py >"$P/r2.log" 2>&1 || fail "tandem run plain: $(cat "$P/r2.log")"
"$B" run --name cloud -- "$PY" curve.py >"$P/r3.log" 2>&1 || fail "tandem run cloud (2): $(cat "$P/r3.log")"
# cloud-2: one on-demand instance at another price, for the compare view's cost axis.
cat >.tandem/runs/cloud-2/instances.json <<'EOF'
{"provider": "aws", "region": "us-east-1",
 "instances": [
  {"id": "i-0other", "node": 0, "type": "p4d.24xlarge", "market": "on-demand", "subnet": "subnet-1",
   "zone": "us-east-1a", "launched_s": 1699999900.0, "ended_s": 1700000300.0, "end": "run ended",
   "replaces": null, "state": "terminated", "usd_per_hour": 32.77, "price_source": "aws.prices"}]}
EOF
# cloud-1 ran on a spot instance from 10 min before the first point to t0+30 s, then nothing
# billed for 10 s, then its replacement (another price) to t0+200 s; a third had no price.
cat >.tandem/runs/cloud-1/instances.json <<'EOF'
{"provider": "aws", "region": "us-east-1",
 "instances": [
  {"id": "i-0first", "node": 0, "type": "g5.xlarge", "market": "spot", "subnet": "subnet-1",
   "zone": "us-east-1a", "launched_s": 1699999400.0, "ended_s": 1700000030.0, "end": "spot interruption",
   "replaces": null, "state": "terminated", "usd_per_hour": 0.5, "price_source": "DescribeSpotPriceHistory"},
  {"id": "i-0second", "node": 0, "type": "g5.2xlarge", "market": "on-demand", "subnet": "subnet-1",
   "zone": "us-east-1b", "launched_s": 1700000040.0, "ended_s": 1700000200.0, "end": "run ended",
   "replaces": "i-0first", "state": "terminated", "usd_per_hour": 1.212, "price_source": "aws.prices"},
  {"id": "i-0free", "node": 1, "type": "x9.nothing", "market": "on-demand", "subnet": "subnet-1",
   "zone": "us-east-1a", "launched_s": 1700000000.0, "ended_s": 1700000100.0, "end": "run ended",
   "replaces": null, "state": "terminated", "usd_per_hour": null, "price_source": null}
 ],
 "cost_usd": 0, "cost_unpriced": 1}
EOF

"$B" ui --port 0 >"$P/ui.log" 2>&1 &
UI_PID=$!
URL=
for _ in $(seq 100); do
  URL=$(grep -o 'http://[^ ]*' "$P/ui.log" | head -1)
  [ -n "$URL" ] && break
  kill -0 "$UI_PID" 2>/dev/null || fail "tandem ui exited: $(cat "$P/ui.log")"
  sleep 0.1
done
[ -n "$URL" ] || fail "tandem ui printed no URL in 10 s: $(cat "$P/ui.log")"
echo "tandem ui at $URL"

"$NODE" "$HERE/test_ui_cost.mjs" "$URL"
rc=$?
[ $rc = 0 ] || { echo "--- tandem ui output:"; tail -n 30 "$P/ui.log"; }
exit $rc
