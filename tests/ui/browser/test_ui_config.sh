#!/usr/bin/env bash
# ui: issue 33's runs table in a real browser: the config as columns (workflow params, --param
# and the Python SDK's config in one namespace), sort and filter by a config key, the compare
# view listing the differing config first and bolding the best run, metric columns chosen from
# what the runs logged (the pick kept), accuracy units, the "silent for N" state, the page's
# nits (Show 0 more, 1 points, gaps on the time axis, ISO dates, seconds on system charts) and
# the layout at 1024 and 1280 px (screenshots under $TANDEM_BUILD_DIR/ui-shots, and the table
# must not overflow its box). Real `tandem run`s make the store; test_ui_config.mjs drives
# Debian's chromium through puppeteer-core. Skips (77) without node, chromium or node_modules.
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
SHOTS=${TANDEM_UI_SHOTS:-${TANDEM_BUILD_DIR:-/tmp}/ui-shots}
mkdir -p "$SHOTS" && SHOTS=$(cd "$SHOTS" && pwd)

P=$(mktemp -d /tmp/tandem-ui-config-XXXXXX)
export TANDEM_HOME=$P TANDEM_UI_FAILSHOTS=$P TANDEM_UI_SHOTS=$SHOTS PYTHONPATH=$SRC/python
UI_PID=
QUIET=
cleanup() {
  [ -n "$QUIET" ] && touch "$P/.tandem/runs/$QUIET/release" && "$B" stop "$QUIET" --wait 30 >/dev/null 2>&1
  [ -n "$UI_PID" ] && kill "$UI_PID" 2>/dev/null && wait "$UI_PID" 2>/dev/null
  if [ "${KEEP:-0}" = 1 ]; then echo "kept $P"; else rm -rf "$P"; fi
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
cd "$P"
mkdir -p .tandem

# A 1-rank "trainer" writing train/loss, train/acc and test/acc (fractions) with wall times;
# --gap 1 leaves two hours between its first and second half (a preemption and a resume).
cat >tiny.py <<'EOF'
import json, math, os, sys
a = dict(zip(sys.argv[1::2], sys.argv[2::2]))  # --lr --steps --gap --batch --optimizer
lr, steps, gap = float(a["--lr"]), int(a["--steps"]), int(a.get("--gap", "0"))
out = open(os.environ["TANDEM_METRICS"], "a")
t0 = 1700000000.0
for s in range(steps):
    t = t0 + s * 0.5 + (7200 if gap and s >= steps // 2 else 0)
    loss = 2.0 * math.exp(-lr * s / 30) + 0.05
    out.write(json.dumps({"step": s, "time": t, "train/loss": loss, "train/acc": 1 - loss / 2.2,
                          "test/acc": 1 - loss / 2.0}) + "\n")
EOF
cat >.tandem/workflows.yaml <<'EOF'
workflows:
  - name: tiny
    params: {lr: 0.1, steps: 100, gap: 0, batch: 32, optimizer: adamw}
    command: /usr/bin/python3 tiny.py
EOF
# An HF-like script: the SDK's config, HF's key names, accuracy as a fraction.
cat >hf.py <<'EOF'
import tandem
tandem.init(config={"lr": 0.05, "warmup_steps": 10, "optim": {"name": "adamw"}})
for s in range(20):
    tandem.log({"loss": 1.5 - s * 0.05, "learning_rate": 0.05}, step=s)
    if s % 5 == 4:
        tandem.log({"eval_loss": 1.6 - s * 0.05, "eval_accuracy": 0.5 + s * 0.02}, step=s)
EOF
# tandem train's way: test/acc in percent, its config recorded in sdk.json.
cat >pct.py <<'EOF'
import tandem
tandem.init(config={"lr": 0.2, "model": "mlp7"})
for s in range(10):
    tandem.log({"train/loss": 1.0 - s * 0.05, "test/acc": 80.0 + s}, step=s)
tandem.log({"final/acc": 89.0}, step=10)
EOF

"$B" run tiny --param gap=1 >"$P/r1.log" 2>&1 || fail "tandem run tiny: $(cat "$P/r1.log")"
"$B" run tiny --param lr=0.3 >"$P/r2.log" 2>&1 || fail "tandem run tiny lr=0.3: $(cat "$P/r2.log")"
# Four config keys differ between the tiny runs (lr, gap, batch, optimizer): the widest
# automatic choice, which must still fit 1024 px.
"$B" run tiny --param lr=0.03 --param batch=64 --param optimizer=sgd >"$P/r3.log" 2>&1 ||
  fail "tandem run tiny lr=0.03: $(cat "$P/r3.log")"
"$B" run --name hf -- "$PY" hf.py >"$P/r4.log" 2>&1 || fail "tandem run hf: $(cat "$P/r4.log")"
"$B" run --name pct -- "$PY" pct.py >"$P/r5.log" 2>&1 || fail "tandem run pct: $(cat "$P/r5.log")"
# A live run that says one line and then nothing: silent after TANDEM_SILENT_S of the server.
QUIET=$("$B" run -d --name quiet -- /bin/sh -c 'echo started; while [ ! -e "$TANDEM_RUN_DIR/release" ]; do sleep 0.2; done' 2>"$P/r6.log") ||
  fail "tandem run -d quiet: $(cat "$P/r6.log")"

TANDEM_SILENT_S=3 "$B" ui --port 0 >"$P/ui.log" 2>&1 &
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

"$NODE" "$HERE/test_ui_config.mjs" "$URL" "$QUIET"
rc=$?
[ $rc = 0 ] || { echo "--- tandem ui output:"; tail -n 30 "$P/ui.log"; }
echo "screenshots: $SHOTS"
exit $rc
