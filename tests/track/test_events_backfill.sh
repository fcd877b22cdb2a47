#!/usr/bin/env bash
# track: the run_events table on an index made before it existed (issue 31). A run records
# points, a resume (which cut its later points, re-logged after it) and a restart through
# `tandem run`; then the index is made to look like an older tandem's (the run_events tables
# dropped with SQLite itself) and `tandem reindex` runs: the run's events come back exactly as
# they were stored (the reference: the rows read with Python's sqlite3 before the drop), and its
# points are neither doubled nor cut again (the file's bytes already ingested are read for events
# only). A second reindex changes nothing.
set -uo pipefail
source "$(dirname "$0")/../lib/project.sh"
project_init events-backfill
PY=${PYTHON:-/usr/bin/python3}
DB=$P/.tandem/runs.db

cat >"$P/lines" <<'EOF2'
{"step": 1, "time": 100.5, "loss": 1.0}
{"step": 2, "time": 101.5, "loss": 0.9}
{"step": 3, "time": 102.5, "loss": 0.8}
{"event": "resume", "step": 1}
{"step": 2, "time": 103.5, "loss": 0.7}
{"event": "restart", "step": 2, "time": 104.0}
{"step": 3, "time": 105.5, "loss": 0.6}
EOF2
"$B" run --name ev -- sh -c "cat '$P/lines' >>\"\$TANDEM_METRICS\"" >"$P/run.log" 2>&1 \
  || fail "tandem run: $(cat "$P/run.log")"

# events and points as SQLite has them: "kind rank step time" lines, and the loss points
state() {
  "$PY" - "$DB" <<'PYEOF'
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], timeout=30)
seq = db.execute("SELECT seq FROM runs WHERE id = 'ev-1'").fetchone()[0]
for row in db.execute("SELECT kind, rank, step, time FROM run_events WHERE run = ?"
                      " ORDER BY rank, line", (seq,)):
    print("event", *row)
for row in db.execute("SELECT m.step, m.value FROM metrics m JOIN metric_keys k ON k.id = m.key"
                      " WHERE m.run = ? AND k.name = 'loss' ORDER BY m.step", (seq,)):
    print("loss", *row)
PYEOF
}
before=$(state) || fail "reading the store"
expected='event resume 0 1 103.5
event restart 0 2 104.0
loss 1 1.0
loss 2 0.7
loss 3 0.6'
[ "$before" = "$expected" ] || fail "the ingest stored:
$before
expected:
$expected"

# An index of an older tandem: no run_events tables.
"$PY" - "$DB" <<'PYEOF' || fail "could not drop the tables"
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], timeout=30)
with db:
    db.execute("DROP TABLE run_events")
    db.execute("DROP TABLE run_events_backfill")
PYEOF
"$B" reindex >"$P/reindex.log" 2>&1 || fail "tandem reindex: $(cat "$P/reindex.log")"
after=$(state) || fail "reading the store after reindex"
[ "$after" = "$expected" ] || fail "after tandem reindex of an older index:
$after
expected:
$expected"
left=$("$PY" -c "import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute('SELECT count(*) FROM run_events_backfill').fetchone()[0])" "$DB")
[ "$left" = 0 ] || fail "$left files still wait to be read again for events"
"$B" reindex >"$P/reindex2.log" 2>&1 || fail "second tandem reindex: $(cat "$P/reindex2.log")"
[ "$(state)" = "$expected" ] || fail "a second reindex changed the store: $(state)"
echo "ok: events rebuilt by tandem reindex on an index without them, points untouched"
