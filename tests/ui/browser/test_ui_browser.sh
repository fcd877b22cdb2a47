#!/usr/bin/env bash
# ui: the page of `tandem ui` in a real browser. Makes a store with real `tandem run`s (two
# finished runs of a 2-rank workflow that differ in one param, one running run that waits),
# starts `tandem ui --port 0` on it and drives Debian's chromium (headless, puppeteer-core from
# src/ui/web/node_modules) through test_ui_browser.mjs: runs table, run page charts, live points
# and logs, artifacts, compare view, Stop. Skips (77) without node, chromium or node_modules.
#
# TANDEM_UI_SHOTS=DIR also saves ui-run.png and ui-compare.png (1280x800) there: that is how
# docs/img/ui-run.png and docs/img/ui-compare.png are made:
#   TANDEM_BIN=build/tandem TANDEM_UI_SHOTS=docs/img bash tests/ui/browser/test_ui_browser.sh
set -uo pipefail
B=${TANDEM_BIN:?TANDEM_BIN must name the tandem binary}
B=$(cd "$(dirname "$B")" && pwd)/$(basename "$B")
HERE=$(cd "$(dirname "$0")" && pwd)
SRC=$(cd "$HERE/../../.." && pwd) # where test_ui_browser.mjs finds puppeteer-core
CHROMIUM=${TANDEM_CHROMIUM:-/usr/bin/chromium}
NODE=$(command -v node) || { echo "SKIP: node is missing (apt-get install nodejs)"; exit 77; }
[ -x "$CHROMIUM" ] || { echo "SKIP: $CHROMIUM is missing (apt-get install chromium)"; exit 77; }
[ -d "$SRC/src/ui/web/node_modules/puppeteer-core" ] ||
  { echo "SKIP: src/ui/web/node_modules/puppeteer-core is missing (run scripts/deps.sh, or npm ci --prefix src/ui/web)"; exit 77; }
[ -n "${TANDEM_UI_SHOTS:-}" ] && TANDEM_UI_SHOTS=$(mkdir -p "$TANDEM_UI_SHOTS" && cd "$TANDEM_UI_SHOTS" && pwd)

P=$(mktemp -d /tmp/tandem-ui-browser-XXXXXX)
export TANDEM_HOME=$P TANDEM_UI_FAILSHOTS=$P
UI_PID=
cleanup() {
  [ -e "$P/.tandem/runs/tiny-3" ] && touch "$P/.tandem/runs/tiny-3/release"
  "$B" stop tiny-3 --wait 30 >/dev/null 2>&1
  [ -n "$UI_PID" ] && kill "$UI_PID" 2>/dev/null && wait "$UI_PID" 2>/dev/null
  if [ "${KEEP:-0}" = 1 ]; then echo "kept $P"; else rm -rf "$P"; fi
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
cd "$P"
mkdir -p .tandem

# A 2-rank "trainer": metric lines to $TANDEM_METRICS, log lines to stdout, an artifact; with
# --hold it waits (printing a line when the test touches RUN/ping) until RUN/release or SIGTERM.
cat >tiny.py <<'EOF'
import json, math, os, random, sys, time
a = dict(zip(sys.argv[1::2], sys.argv[2::2]))
lr, steps, hold = float(a["--lr"]), int(a["--steps"]), float(a["--hold"])
rank = int(os.environ["RANK"])
run_dir = os.environ["TANDEM_RUN_DIR"]
random.seed(rank * 7 + int(lr * 1000))
out = open(os.environ["TANDEM_METRICS"], "a", buffering=1)
t0 = time.time() - steps * 0.5
for s in range(steps):
    loss = 2.0 * math.exp(-lr * s / 30) + 0.15 * random.random() + 0.03 * rank
    out.write(json.dumps({"step": s, "time": t0 + s * 0.5, "train/loss": loss,
                          "train/acc": max(0.0, 1 - loss / 2.2), "lr": lr * (1 - s / steps)}) + "\n")
    if s % 50 == 0:
        out.write(json.dumps({"step": s, "time": t0 + s * 0.5, "test/acc": max(0.0, 1 - loss / 2.0)}) + "\n")
    if s % 25 == 0:
        print(f"rank {rank} step {s} loss {loss:.4f}", flush=True)
if rank == 0:
    out.write(json.dumps({"step": steps, "time": t0 + steps * 0.5, "final/acc": 0.9}) + "\n")
    os.makedirs("out", exist_ok=True)
    random.seed(42)
    open("out/model.bin", "wb").write(bytes(random.getrandbits(8) for _ in range(4096)))
end, pinged = time.time() + hold, False
while time.time() < end and not os.path.exists(os.path.join(run_dir, "release")):
    if not pinged and os.path.exists(os.path.join(run_dir, "ping")):
        print(f"rank {rank} saw the ping at step {steps}", flush=True)
        pinged = True
    time.sleep(0.05)
print(f"rank {rank} finished: the last line", flush=True)
EOF
cat >.tandem/workflows.yaml <<'EOF'
workflows:
  - name: tiny
    nproc_per_node: 2
    params: {lr: 0.1, steps: 300, hold: 0}
    command: /usr/bin/python3 tiny.py
    artifacts: [out/model.bin]
EOF

"$B" run tiny >"$P/run1.log" 2>&1 || fail "tandem run tiny: $(cat "$P/run1.log")"
"$B" run tiny --param lr=0.3 >"$P/run2.log" 2>&1 || fail "tandem run tiny --param lr=0.3: $(cat "$P/run2.log")"
id=$("$B" run -d tiny --param hold=600 2>"$P/run3.log") || fail "tandem run -d: $(cat "$P/run3.log")"
[ "$id" = tiny-3 ] || fail "the detached run is $id, expected tiny-3"

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
case "$URL" in *token=*) ;; *) fail "the URL carries no token: $URL" ;; esac
echo "tandem ui at $URL"

"$NODE" "$HERE/test_ui_browser.mjs" "$URL"
rc=$?
[ $rc = 0 ] || { echo "--- tandem ui output:"; tail -n 30 "$P/ui.log"; }
exit $rc
