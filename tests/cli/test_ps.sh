#!/usr/bin/env bash
# cli: issue 33's `tandem ps`, through real `tandem run`s (command runs with --param, and scripts
# recording their config with the Python SDK), each claim checked against the runs' own records
# (run.json, read by Python's json module) rather than against tandem's own output:
#   - ps in a directory without .tandem/ says there are no runs and creates nothing (--json: []);
#   - --json is one JSON array, newest first (by run.json's created), with ISO 8601 UTC times
#     equal to run.json's, the params and config objects, the note and the user's notes;
#   - the table is newest first, shows dates (YYYY-MM-DD HH:MM, local), the CONFIG column with
#     the key that differs between the runs, and the notes;
#   - --filter KEY=V / KEY>N / KEY<N select by a param (--param) or an SDK config key, the same
#     runs Python selects from run.json; a bad filter is a usage error naming the forms;
#   - --sort KEY orders by a config key numerically;
#   - a live run that wrote nothing for TANDEM_SILENT_S seconds is "silent" with "silent for N
#     s" in its note, and --json says silent_s; with TANDEM_SILENT_S=0 it is plain running;
#     runs as old that keep writing (metric lines only, or log lines only) are not silent, and
#     their last_activity is past their start (run.json's): the store saw both kinds of writing;
#   - tandem train's own config (lr, optimizer, batch: its sdk.json) selects its run (with
#     Fashion-MNIST; left out without it);
#   - issue 31's cost: runs given a hand-written RUN/instances.json (docs/cloud.md's format) have
#     --json cost_usd equal to price x hours computed here in Python from the file (a live
#     instance's between the figures before and after the call), null for a record without a
#     price; the table has a COST column ($X.XX, - without a price) only while a run has one.
set -uo pipefail
SRC=${TANDEM_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
PY=${PYTHON:-/usr/bin/python3}
command -v "$PY" >/dev/null 2>&1 || { echo "SKIP: no $PY"; exit 77; }
. "$SRC/tests/lib/project.sh"
project_init ps
LIVE=
cleanup() {
  for r in $LIVE; do
    touch "$P/.tandem/runs/$r/release"
    "$B" stop "$r" --wait 20 >/dev/null 2>&1
  done
  project_cleanup
}
trap cleanup EXIT
export PYTHONPATH=$SRC/python

# ---- 1. no .tandem/ here: no runs, nothing created ----
EMPTY=$P/empty
mkdir "$EMPTY"
out=$(cd "$EMPTY" && TANDEM_HOME= "$B" ps 2>&1) || fail "tandem ps in an empty directory: exit $?: $out"
expect_contains "$out" "no runs" "ps without .tandem/"
[ ! -e "$EMPTY/.tandem" ] || fail "tandem ps created $EMPTY/.tandem"
out=$(TANDEM_HOME=$EMPTY "$B" ps --json 2>&1) || fail "tandem ps --json without .tandem/: $out"
[ "$out" = "[]" ] || fail "ps --json without .tandem/ prints [], got: $out"
[ ! -e "$EMPTY/.tandem" ] || fail "tandem ps --json created $EMPTY/.tandem"

# ---- 2. runs: command runs with --param, SDK scripts with a config ----
"$B" run --name cmd --param lr=0.001 --param opt=adamw --notes "first try" -- true >/dev/null 2>&1 ||
  fail "tandem run cmd-1"
"$B" run --name cmd --param lr=0.2 --param opt=adamw -- true >/dev/null 2>&1 || fail "tandem run cmd-2"
for lr in 0.01 0.05; do
  "$B" run --name sdk -- "$PY" -c "
import tandem
tandem.init(config={'lr': $lr, 'batch': 32, 'optim': {'name': 'sgd'}})
tandem.log({'loss': 1.0 - $lr})
" >/dev/null 2>&1 || fail "tandem run sdk (lr $lr)"
done

# Python's view of the store: each run's record, newest first.
records() {
  "$PY" - "$P/.tandem/runs" <<'EOF'
import json, os, sys
runs = []
for d in os.listdir(sys.argv[1]):
    with open(os.path.join(sys.argv[1], d, "run.json")) as f:
        runs.append(json.load(f))
runs.sort(key=lambda r: (r["created"], r["n"]), reverse=True)
print(json.dumps(runs))
EOF
}
REC=$(records)

# ---- 3. --json: one array, newest first, ISO times, params and config ----
"$B" ps --json >"$P/ps.json" 2>"$P/ps.err" || fail "tandem ps --json: $(cat "$P/ps.err")"
"$PY" - "$P/ps.json" "$REC" <<'EOF' || fail "ps --json against run.json (above)"
import datetime, json, sys
ps = json.load(open(sys.argv[1]))           # one JSON document: an array
rec = json.loads(sys.argv[2])
assert isinstance(ps, list), type(ps)
ids = [r["id"] for r in ps]
want = [r["id"] for r in rec]
assert ids == want, f"newest first: ps {ids}, run.json {want}"
by = {r["id"]: r for r in rec}
for r in ps:
    src = by[r["id"]]
    for field in ("created", "started", "ended"):
        t = datetime.datetime.fromtimestamp(int(src[field]), datetime.timezone.utc)
        assert r[field] == t.strftime("%Y-%m-%dT%H:%M:%SZ"), (r["id"], field, r[field], src[field])
    assert r["status"] == "succeeded" and r["exit_code"] == 0, r
    params = src["params"] if isinstance(src["params"], dict) else json.loads(src["params"])
    assert r["params"] == params, (r["params"], params)
    assert r["config"] == (src.get("config") or {}), (r["config"], src.get("config"))
c1 = next(r for r in ps if r["id"] == "cmd-1")
assert c1["params"] == {"lr": 0.001, "opt": "adamw"}, c1["params"]
assert c1["notes"] == "first try", c1
s = next(r for r in ps if r["id"] == "sdk-2")
assert s["config"] == {"lr": 0.05, "batch": 32, "optim": {"name": "sgd"}}, s["config"]
# 0.2 in its shortest form, not 0.20000000000000001
assert '"lr":0.2,' in open(sys.argv[1]).read().replace(" ", ""), "lr 0.2 written shortest"
EOF

# ---- 4. the table: newest first, dates, the differing config, notes ----
table=$("$B" ps 2>&1) || fail "tandem ps: $table"
order=$(echo "$table" | awk 'NR > 1 {print $1}' | tr '\n' ' ')
want=$("$PY" -c 'import json,sys; print(" ".join(r["id"] for r in json.loads(sys.argv[1])) + " ")' "$REC")
[ "$order" = "$want" ] || fail "ps newest first: '$order', run.json says '$want'"
expect_contains "$(echo "$table" | head -1)" "CONFIG" "the CONFIG column"
day=$("$PY" -c 'import json,sys,time; r=json.loads(sys.argv[1])[0]; print(time.strftime("%Y-%m-%d %H:%M", time.localtime(r["started"])))' "$REC")
expect_contains "$(echo "$table" | sed -n 2p)" "$day" "the newest run's start as date and time"
echo "$table" | grep -qE '^cmd-2 .* lr=0\.2( |$)' || fail "cmd-2's lr=0.2 (differs between the runs): $table"
expect_contains "$(echo "$table" | grep '^sdk-1 ')" "lr=0.01" "sdk-1's lr from its SDK config"
expect_contains "$(echo "$table" | grep '^cmd-1 ')" "first try" "cmd-1's notes"

# ---- 5. --filter: the runs Python selects from run.json ----
py_select() { # PYTHON-PREDICATE-ON-LR
  "$PY" - "$REC" "$1" <<'EOF'
import json, sys
rec = json.loads(sys.argv[1])
pred = eval("lambda lr: " + sys.argv[2])
out = []
for r in rec:
    params = r["params"] if isinstance(r["params"], dict) else json.loads(r["params"])
    lr = params.get("lr", (r.get("config") or {}).get("lr"))
    if lr is not None and pred(lr):
        out.append(r["id"])
print(" ".join(out))
EOF
}
ps_ids() { "$B" ps --json "$@" | "$PY" -c 'import json,sys; print(" ".join(r["id"] for r in json.load(sys.stdin)))'; }
for case in "lr=0.001|abs(lr-0.001)<1e-12" "lr>0.01|lr>0.01" "lr<0.05|lr<0.05" "lr>=0.05|lr>=0.05" \
  "lr!=0.2|abs(lr-0.2)>1e-12"; do
  expr=${case%%|*} pred=${case#*|}
  got=$(ps_ids --filter "$expr") || fail "ps --filter $expr"
  want=$(py_select "$pred")
  [ -n "$want" ] || fail "the case $expr selects nothing: a useless check"
  [ "$got" = "$want" ] || fail "ps --filter '$expr': '$got', Python over run.json: '$want'"
done
got=$(ps_ids --filter optim.name=sgd --filter batch=32)
[ "$got" = "sdk-2 sdk-1" ] || fail "filters on a nested SDK config key and a second key: '$got'"
got=$(ps_ids --filter opt=adamw)
[ "$got" = "cmd-2 cmd-1" ] || fail "a text param: '$got'"
[ -z "$(ps_ids --filter nosuch=1)" ] || fail "a key no run has matches nothing"
# the table filters too, and names the filter's key in its CONFIG column
t=$("$B" ps --filter 'lr<0.01')
[ "$(echo "$t" | awk 'NR > 1 {print $1}')" = "cmd-1" ] || fail "table --filter 'lr<0.01': $t"
for bad in lr 'lr>fast' '=3'; do
  err=$("$B" ps --filter "$bad" 2>&1 >/dev/null)
  rc=$?
  [ $rc = 2 ] || fail "ps --filter '$bad': exit $rc, expected 2 ($err)"
  expect_contains "$err" "--filter '$bad': " "the bad filter '$bad' is named"
done
for bad in lr '=3'; do
  expect_contains "$("$B" ps --filter "$bad" 2>&1)" "KEY=VALUE, KEY!=VALUE, KEY<N" "'$bad': the forms"
done

# ---- 6. --sort KEY: numerically, runs without the key last ----
got=$("$B" ps --sort lr | awk 'NR > 1 {print $1}' | tr '\n' ' ')
[ "$got" = "cmd-1 sdk-1 sdk-2 cmd-2 " ] || fail "ps --sort lr (0.001 0.01 0.05 0.2): '$got'"
got=$("$B" ps --sort -batch | awk 'NR > 1 {print $1}' | tr '\n' ' ')
[ "$got" = "sdk-2 sdk-1 cmd-2 cmd-1 " ] || fail "ps --sort -batch (the runs without batch last): '$got'"

# Notes are anyone's bytes: --json stays JSON, a byte that is not UTF-8 becomes U+FFFD.
"$B" note cmd-2 "$(printf 'bad \377 byte')" >/dev/null 2>&1 || fail "tandem note cmd-2"
notes=$("$B" ps --json | "$PY" -c 'import json,sys; print([r["notes"] for r in json.load(sys.stdin) if r["id"] == "cmd-2"][0])')
[ "$notes" = "bad $(printf '\357\277\275') byte" ] || fail "cmd-2's notes in --json: '$notes'"

# ---- 7. silent: a live run whose workers write nothing; two that keep writing are not ----
# busy writes metric lines and nothing to its log; chatty prints and logs no metric.
QUIET=$("$B" run -d --name quiet -- /bin/sh -c 'echo started; while [ ! -e "$TANDEM_RUN_DIR/release" ]; do sleep 0.2; done') ||
  fail "tandem run -d quiet"
LIVE=$QUIET
BUSY=$("$B" run -d --name busy -- /bin/sh -c 'i=0; while [ ! -e "$TANDEM_RUN_DIR/release" ]; do i=$((i+1)); echo "{\"step\": $i, \"loss\": 1}" >>"$TANDEM_METRICS"; sleep 0.2; done') ||
  fail "tandem run -d busy"
LIVE="$LIVE $BUSY"
CHATTY=$("$B" run -d --name chatty -- /bin/sh -c 'while [ ! -e "$TANDEM_RUN_DIR/release" ]; do echo tick; sleep 0.2; done') ||
  fail "tandem run -d chatty"
LIVE="$LIVE $CHATTY"
# Waits for the event (ps says silent), bounded generously; no fixed sleep decides it.
silent=
for _ in $(seq 300); do
  line=$(TANDEM_SILENT_S=2 "$B" ps | grep "^$QUIET ")
  case "$line" in *" silent "*"silent for "*) silent=$line; break ;; esac
  sleep 0.1
done
[ -n "$silent" ] || fail "the quiet run never showed as silent with TANDEM_SILENT_S=2: $line"
js=$(TANDEM_SILENT_S=2 "$B" ps --json | "$PY" -c "import json,sys; r=[r for r in json.load(sys.stdin) if r['id']=='$QUIET'][0]; print(r['status'], r['silent_s'] >= 2)")
[ "$js" = "running True" ] || fail "ps --json of the silent run: $js"
line=$(TANDEM_SILENT_S=0 "$B" ps | grep "^$QUIET ")
expect_lacks "$line" "silent" "TANDEM_SILENT_S=0 turns the mark off"
expect_contains "$line" "running" "the quiet run is still running"
line=$("$B" ps | grep "^$QUIET ")
expect_lacks "$line" "silent" "the default (15 min) has not passed"
# The writing runs, once older than the threshold (5 s; they write every 0.2 s) by run.json's
# start: not silent, and their last activity is after their start. Without the store's record
# of their writing they would be silent here.
check_writing() { # prints "wait" until both runs are 6 s old, then one verdict line per run
  TANDEM_SILENT_S=5 "$B" ps --json | "$PY" -c '
import datetime, json, os, sys, time
runs = {r["id"]: r for r in json.load(sys.stdin)}
ids, root = sys.argv[1:3], sys.argv[3]
started = {i: json.load(open(os.path.join(root, i, "run.json")))["started"] for i in ids}
if any(not s or time.time() - s < 6 for s in started.values()):
    print("wait"); sys.exit()
for i in ids:
    r = runs[i]
    last = datetime.datetime.strptime(r["last_activity"], "%Y-%m-%dT%H:%M:%SZ").replace(
        tzinfo=datetime.timezone.utc).timestamp()
    print(i, r["status"], r["silent_s"], last > int(started[i]))
' "$BUSY" "$CHATTY" "$P/.tandem/runs"
}
verdict=wait
for _ in $(seq 300); do
  verdict=$(check_writing) || fail "ps --json of the writing runs: $verdict"
  [ "$verdict" != wait ] && break
  sleep 0.1
done
[ "$verdict" = "$BUSY running None True
$CHATTY running None True" ] || fail "runs that keep writing (metrics; logs) with TANDEM_SILENT_S=5: $verdict"
for r in $LIVE; do touch "$P/.tandem/runs/$r/release"; done
for r in $LIVE; do "$B" stop "$r" --wait 30 >/dev/null 2>&1; done
LIVE=

# ---- 8. tandem train's own config (what it records in sdk.json), where Fashion-MNIST is ----
DATA=${TANDEM_DATA:-/usr/share/datasets/fashion-mnist}
if [ -f "$DATA/train-images-idx3-ubyte.gz" ]; then
  out=$("$B" run --name tt -- tandem train --model mlp7 --data "$DATA" --steps 5 --batch 16 --lr 0.02 \
    --optimizer sgd --threads 1 2>&1) || fail "tandem run -- tandem train: $out"
  got=$(ps_ids --filter lr=0.02 --filter optimizer=sgd --filter batch=16)
  [ "$got" = "tt-1" ] || fail "tandem train's lr, optimizer and batch select its run: '$got'"
  "$B" ps --filter model=mlp7 | grep -qE '^tt-1 .* model=mlp7' || fail "the filter's key in CONFIG: $("$B" ps --filter model=mlp7)"
else
  echo "note: no Fashion-MNIST in $DATA: tandem train's config not checked"
fi

# ---- 9. the cloud instances' cost (issue 31): RUN/instances.json as docs/cloud.md writes it ----
# cmd-1: two ended instances with prices and one without; cmd-2: one still billing (its lock
# held here, as a live supervisor holds it, so ps's orphan check leaves it alone); sdk-1: an
# instance with no price at all (cost unknown, not 0). Expected figures: price x hours from the
# file, in Python.
now=$("$PY" -c 'import time; print(time.time())')
"$PY" - "$P/.tandem/runs" "$now" <<'PYEOF' || fail "writing the instance records"
import json, os, sys
root, now = sys.argv[1], float(sys.argv[2])
def inst(i, price, launched, ended, market="spot", state="terminated"):
    return {"id": i, "node": 0, "type": "t3.micro", "market": market, "subnet": "subnet-1",
            "zone": "us-east-1a", "launched_s": launched, "ended_s": ended, "end": None,
            "replaces": None, "state": state, "usd_per_hour": price,
            "price_source": "DescribeSpotPriceHistory" if price else None}
t0 = round(now - 3 * 3600, 1)
recs = {
    "cmd-1": [inst("i-01", 0.0416, t0, t0 + 5400.0, "on-demand"),
              inst("i-02", 0.25, t0 + 60, t0 + 2760.5), inst("i-03", None, t0, t0 + 100)],
    "cmd-2": [inst("i-04", 0.5, round(now - 7200, 1), None, state="running")],
    "sdk-1": [inst("i-05", None, t0, t0 + 10)],
}
for run, items in recs.items():
    with open(os.path.join(root, run, "instances.json"), "w") as f:
        json.dump({"provider": "aws", "region": "us-east-1", "instances": items}, f)
PYEOF
exec 9>"$P/.tandem/runs/cmd-2/lock"
flock -n 9 || fail "cannot take cmd-2's lock"
before=$("$PY" -c 'import time; print(time.time())')
json=$("$B" ps --json 2>&1) || fail "tandem ps --json with instance records: $json"
after=$("$PY" -c 'import time; print(time.time())')
verdict=$("$PY" - "$P/.tandem/runs" "$before" "$after" "$json" <<'PYEOF'
import json, os, sys
root, before, after = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
runs = {r["id"]: r for r in json.loads(sys.argv[4])}
def cost(run, t):
    items = json.load(open(os.path.join(root, run, "instances.json")))["instances"]
    return sum(i["usd_per_hour"] * (min(i["ended_s"] or t, t) - i["launched_s"]) / 3600
               for i in items if i["usd_per_hour"])
bad = []
want = cost("cmd-1", after)
if runs["cmd-1"]["cost_usd"] is None or abs(runs["cmd-1"]["cost_usd"] - want) > 1e-9:
    bad.append(f"cmd-1 cost_usd {runs['cmd-1']['cost_usd']} != {want}")
lo, hi = cost("cmd-2", before), cost("cmd-2", after)
got = runs["cmd-2"]["cost_usd"]
if got is None or not lo - 1e-9 <= got <= hi + 1e-9:
    bad.append(f"cmd-2 (live) cost_usd {got} not in [{lo}, {hi}]")
for r in ("sdk-1", "sdk-2"):
    if runs[r]["cost_usd"] is not None:
        bad.append(f"{r} has no priced instance: cost_usd {runs[r]['cost_usd']}, want null")
print("; ".join(bad) or "ok", "%.2f" % want)
PYEOF
) || fail "checking ps --json's cost_usd: $verdict"
[ "${verdict% *}" = ok ] || fail "ps --json cost_usd: $verdict"
dollars=${verdict##* }
table=$("$B" ps 2>&1) || fail "tandem ps with instance records: $table"
echo "$table" | head -1 | grep -qE '^ID .* LOSS +COST +CONFIG' || fail "ps has a COST column before CONFIG: $table"
echo "$table" | grep -qF " \$$dollars " || fail "cmd-1's COST is \$$dollars: $table"
echo "$table" | grep -qE '^sdk-1 .* [0-9.]+ +- ' || fail "sdk-1 (no price) shows - in COST: $table"
exec 9>&-
for r in cmd-1 cmd-2 sdk-1; do rm -f "$P/.tandem/runs/$r/instances.json"; done
out=$("$B" ps 2>&1)
echo "$out" | head -1 | grep -q COST && fail "a COST column with no priced run: $out"
echo PASS
