#!/usr/bin/env bash
# workflow: `tandem stop` signals a run's supervisor, not whatever holds its pid now. As it was
# seen: "tandem stop a-1 stopped a-2": a-1's supervisor had died, its pid went to a-2's
# supervisor, and the liveness check (alive, and its command line names tandem) took that for
# a-1's. Now the store records the supervisor's start time with its pid, and:
#   - a-1 recorded as running with its (dead) supervisor's start time and a pid now held by an
#     unrelated process named tandem-fake: `tandem stop a-1` says the supervisor is gone, marks
#     a-1 failed, and tandem-fake lives on;
#   - the same with the pid of a-2's live supervisor: a-2 is not stopped, and is still running;
#   - `tandem stop a-2`, whose supervisor is alive and started when recorded, stops it.
set -uo pipefail
B=${TANDEM_BIN:?TANDEM_BIN must name the tandem binary}
PY=${PYTHON:-python3}
P=$(mktemp -d /tmp/tandem-recycled-XXXXXX)
fake=
cleanup() {
  [ -n "$fake" ] && kill -9 "$fake" 2>/dev/null
  local f
  for f in $(grep -lz "^TANDEM_RUN_DIR=$P/" /proc/[0-9]*/environ 2>/dev/null); do
    f=${f%/environ}
    kill -9 "${f#/proc/}" 2>/dev/null
  done
  [ -n "${sup2:-}" ] && kill -9 "$sup2" 2>/dev/null
  rm -rf "$P"
}
trap cleanup EXIT
export TANDEM_HOME=$P
unset TANDEM_PROGRESS TANDEM_RESUME TANDEM_CHECKPOINT_DIR TANDEM_METRICS
cd "$P" || exit 1
fail() { echo "FAIL: $*" >&2; exit 1; }
mkdir -p .tandem
cat > .tandem/workflows.yaml <<EOF
workflows:
  - name: a
    command: |
      [ -e "$P/quick" ] && exit 0
      trap 'exit 143' TERM
      touch "$P/up-\$TANDEM_RUN_ID"
      while :; do sleep 0.1; done
EOF

touch quick
out=$("$B" run a 2>&1) || fail "tandem run a: $out"
rm quick
id2=$("$B" run -d a 2>&1 | tail -1) || fail "tandem run -d a: $id2"
[ "$id2" = a-2 ] || fail "expected run a-2, got '$id2'"
for _ in $(seq 100); do [ -e "$P/up-a-2" ] && break; sleep 0.1; done
[ -e "$P/up-a-2" ] || fail "run a-2 did not start"
sup2=$("$B" show a-2 | awk '/supervisor pid/ {print $3}')
[ -n "$sup2" ] || fail "no supervisor pid in tandem show a-2"

# make_running PID: a-1, whose supervisor (the attached `tandem run` above) has exited, is
# recorded as running under PID, with the start time its own supervisor had: what the index
# holds when that supervisor died and the kernel handed its pid on.
make_running() {
  "$PY" - "$P/.tandem" "$1" <<'EOF' || fail "could not rewrite run a-1"
import json, sqlite3, sys
d, pid = sys.argv[1], int(sys.argv[2])
db = sqlite3.connect(d + "/runs.db", timeout=10)
db.execute("UPDATE runs SET status = 'running', ended = 0, exit_code = -1, note = NULL,"
           " supervisor_pid = ? WHERE id = 'a-1'", (pid,))
start = db.execute("SELECT supervisor_start FROM runs WHERE id = 'a-1'").fetchone()[0]
db.commit()
assert start > 0, "a-1 has no supervisor start time recorded"
p = d + "/runs/a-1/run.json"
j = json.load(open(p))
j.update(status="running", ended=0, exit_code=-1, note=None, supervisor_pid=pid)
json.dump(j, open(p, "w"))
EOF
}

# ---- a pid now held by an unrelated process whose command line names tandem ----
bash -c 'exec -a tandem-fake sleep 120' &
fake=$!
for _ in $(seq 50); do grep -q '^tandem-fake' "/proc/$fake/cmdline" 2>/dev/null && break; sleep 0.1; done
grep -q '^tandem-fake' "/proc/$fake/cmdline" || fail "tandem-fake did not start"
make_running "$fake"
out=$("$B" stop a-1 --wait 5 2>&1)
rc=$?
kill -0 "$fake" 2>/dev/null || fail "tandem stop a-1 signalled pid $fake (tandem-fake), which is not a-1's supervisor: $out"
[ "$rc" -eq 2 ] || fail "tandem stop a-1 exited $rc (expected 2, already ended): $out"
case "$out" in *"already ended (failed)"*"is gone"*) ;;
  *) fail "tandem stop a-1 does not say its supervisor is gone: $out" ;; esac
show=$("$B" show a-1)
echo "$show" | grep -q '^status *failed' || fail "a-1 not marked failed: $show"
echo "$show" | grep -q "supervisor (pid $fake) is gone" || fail "a-1's note: $show"
echo "ok: a pid held by tandem-fake is not a-1's supervisor; a-1 failed, tandem-fake untouched"

# ---- the pid of a later run's live supervisor ----
make_running "$sup2"
out=$("$B" stop a-1 --wait 5 2>&1)
rc=$?
kill -0 "$sup2" 2>/dev/null || fail "tandem stop a-1 killed a-2's supervisor: $out"
[ "$rc" -eq 2 ] || fail "tandem stop a-1 exited $rc (expected 2): $out"
sleep 0.5
"$B" show a-2 | grep -q '^status *running' || fail "run a-2 was stopped by tandem stop a-1: $("$B" show a-2)"
"$B" show a-1 | grep -q '^status *failed' || fail "a-1 not marked failed: $("$B" show a-1)"
ps_out=$("$B" ps)
echo "$ps_out" | grep -q '^a-2 .* running' || fail "tandem ps does not show a-2 running: $ps_out"
echo "ok: tandem stop a-1 left a-2 (which holds the pid now) running"

# ---- a live supervisor, started when recorded, is still stopped ----
out=$("$B" stop a-2 --wait 30 2>&1) || fail "tandem stop a-2: $out"
case "$out" in *"run a-2 stopped"*) ;; *) fail "tandem stop a-2: $out" ;; esac
echo "ok: tandem stop a-2 stopped its live supervisor's run"
echo "test_stop_recycled_pid: ok"
