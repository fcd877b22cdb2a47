#!/usr/bin/env bash
# track: run.json is only read when it is a regular file. As it was seen: a FIFO named run.json
# (mkfifo .tandem/runs/ok-1/run.json) made `tandem reindex` hang forever in open(2), waiting for
# a writer, and every verb whose stale-run check reads run.json with it. Now it is opened without
# blocking or following links and refused unless regular:
#   - `tandem reindex` finishes, leaves that run out of the index with a warning naming the file,
#     what it is and what to do, and restores the other runs; so does the automatic rebuild of a
#     missing index (`tandem ps`);
#   - a symbolic link named run.json is refused the same way;
#   - a running run whose supervisor is gone and whose run.json is a FIFO is still reaped by
#     `tandem ps`: the row changes, and the FIFO is left alone with a warning (the writer used
#     to refuse it, failing the whole update);
#   - once the FIFO is removed, `tandem reindex` recovers the run from its files.
set -uo pipefail
B=${TANDEM_BIN:?TANDEM_BIN must name the tandem binary}
PY=${PYTHON:-python3}
P=$(mktemp -d /tmp/tandem-runjson-fifo-XXXXXX)
trap 'rm -rf "$P"' EXIT
export TANDEM_HOME=$P
unset TANDEM_PROGRESS TANDEM_RESUME TANDEM_CHECKPOINT_DIR TANDEM_METRICS
cd "$P" || exit 1
fail() { echo "FAIL: $*" >&2; exit 1; }
mkdir -p .tandem
cat > .tandem/workflows.yaml <<'EOF'
workflows:
  - name: ok
    command: "true"
EOF
for i in 1 2; do
  out=$("$B" run ok 2>&1) || fail "tandem run ok: $out"
done
R=$P/.tandem/runs
lose_index() { rm -f .tandem/runs.db .tandem/runs.db-wal .tandem/runs.db-shm; }

# ---- tandem reindex with a FIFO for ok-1's run.json ----
lose_index
rm "$R/ok-1/run.json"
mkfifo "$R/ok-1/run.json"
timeout 30 "$B" reindex > out.txt 2> err.txt
rc=$?
[ "$rc" -ne 124 ] || fail "tandem reindex hung on a FIFO named run.json"
[ "$rc" -eq 0 ] || fail "tandem reindex exited $rc: $(cat out.txt err.txt)"
grep -q "$R/ok-1/run.json is a FIFO (named pipe), not a regular file" err.txt ||
  fail "no warning naming the FIFO: $(cat err.txt)"
grep -q "left out of the index" err.txt || fail "the warning does not say the run is left out: $(cat err.txt)"
grep -q "rm '$R/ok-1/run.json'" err.txt || fail "the warning does not say what to do: $(cat err.txt)"
grep -q "left out 1 run directory" out.txt || fail "the summary does not count it: $(cat out.txt)"
grep -q "^restored *ok-2" out.txt || fail "ok-2 was not restored: $(cat out.txt)"
"$B" show ok-1 > /dev/null 2>&1 && fail "ok-1 (run.json a FIFO) was indexed anyway"
"$B" show ok-2 | grep -q '^status *succeeded' || fail "ok-2 not restored as succeeded"
[ -p "$R/ok-1/run.json" ] || fail "the FIFO was touched"
echo "ok: tandem reindex skips a run whose run.json is a FIFO, with a warning"

# ---- the automatic rebuild of a missing index ----
lose_index
timeout 30 "$B" ps -a > out.txt 2> err.txt
rc=$?
[ "$rc" -ne 124 ] || fail "tandem ps (rebuilding the index) hung on the FIFO"
[ "$rc" -eq 0 ] || fail "tandem ps exited $rc: $(cat out.txt err.txt)"
grep -q "run.json is a FIFO" err.txt || fail "tandem ps: no warning about the FIFO: $(cat err.txt)"
grep -q '^ok-2 ' out.txt || fail "tandem ps: ok-2 missing after the rebuild: $(cat out.txt)"
echo "ok: the automatic rebuild skips it too"

# ---- a symbolic link named run.json ----
lose_index
rm "$R/ok-1/run.json"
ln -s "$R/ok-2/run.json" "$R/ok-1/run.json"
timeout 30 "$B" reindex > out.txt 2> err.txt || fail "tandem reindex: $(cat out.txt err.txt)"
grep -q "$R/ok-1/run.json is a symbolic link to $R/ok-2/run.json, not a regular file" err.txt ||
  fail "no warning naming the link: $(cat err.txt)"
"$B" show ok-1 > /dev/null 2>&1 && fail "ok-1 (run.json a link) was indexed anyway"
echo "ok: a symbolic link named run.json is refused"

# ---- a stale running run whose run.json is a FIFO is still reaped ----
"$PY" - "$P/.tandem/runs.db" <<'EOF' || fail "could not mark ok-2 running"
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], timeout=10)
db.execute("UPDATE runs SET status = 'running', ended = 0, supervisor_pid = 2147483646,"
           " supervisor_start = 0 WHERE id = 'ok-2'")
db.commit()
EOF
rm "$R/ok-2/run.json"
mkfifo "$R/ok-2/run.json"
timeout 30 "$B" ps > out.txt 2> err.txt
rc=$?
[ "$rc" -ne 124 ] || fail "tandem ps hung reading a FIFO named run.json (stale-run check)"
[ "$rc" -eq 0 ] || fail "tandem ps exited $rc: $(cat out.txt err.txt)"
grep -q '^ok-2 .* failed' out.txt || fail "ok-2 was not reaped: $(cat out.txt err.txt)"
grep -q "$R/ok-2/run.json is a FIFO (named pipe), not a regular file: the record of run ok-2 there is not updated" err.txt ||
  fail "no warning that ok-2's run.json is not updated: $(cat err.txt)"
[ -p "$R/ok-2/run.json" ] || fail "ok-2's FIFO was replaced"
"$B" show ok-2 | grep -q "supervisor (pid 2147483646) is gone" || fail "ok-2's note: $("$B" show ok-2)"
echo "ok: a stale run whose run.json is a FIFO is reaped without hanging"

# ---- the way out the warning gives ----
rm "$R/ok-1/run.json"
timeout 30 "$B" reindex > out.txt 2> err.txt || fail "tandem reindex: $(cat out.txt err.txt)"
grep -q "^recovered *ok-1" out.txt || fail "ok-1 not recovered once the link was removed: $(cat out.txt)"
echo "test_runjson_fifo: ok"
