#!/usr/bin/env bash
# workflow: how a launcher ended reaches the run's record through its typed end record
# (include/tandem/endrec.h), not through its stderr. Asserts, for a worker that fails on a bad
# argument (`tandem train --lr abc`, exit 2) with max_restarts: 1:
#   - the run is failed with the worker's exit code (2), not the launcher's (1);
#   - its note names the failing rank and carries the worker's own error line (not the
#     launcher's closing "giving up after 1 restart", not tandem train's "(see --help)" hint);
#   - restarts is 1, the restart the launcher really made (the 0.5 s system-metrics sample
#     never sees a worker that dies at once);
#   - RUN/end/node-0.json is the record: outcome failed, restarts 1, the failure's rank;
# and with nodes: 2, where only node 1's worker fails, the same from node 1's record.
set -uo pipefail
. "${TANDEM_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/lib/project.sh"
project_init endrec
mkdir -p .tandem
cat > .tandem/workflows.yaml <<EOF2
workflows:
  - name: badarg
    nproc_per_node: 2
    max_restarts: 1
    command: |
      if [ "\$RANK" = 1 ]; then exec "$B" train --model basicnet --lr abc; fi
      sleep 30
  - name: badnode
    nodes: 2
    command: |
      if [ "\$GROUP_RANK" = 1 ]; then echo "ValueError: no such column 'label'" >&2; exit 3; fi
      sleep 30
EOF2
field() { # field RUN NAME: a value from `tandem show`
  "$B" show "$1" | sed -n "s/^$2   *//p" | head -1
}
out=$("$B" run badarg 2>&1) && fail "tandem run badarg succeeded: $out"
status=$(field badarg-1 status)
code=$(field badarg-1 'exit code')
restarts=$(field badarg-1 restarts)
note=$(field badarg-1 note)
[ "$status" = failed ] || fail "status '$status', expected failed: $("$B" show badarg-1)"
[ "$code" = 2 ] || fail "exit code '$code', expected the worker's 2: $("$B" show badarg-1)"
[ "$restarts" = 1 ] || fail "restarts '$restarts', expected 1: $("$B" show badarg-1)"
case "$note" in *"worker rank 1"*"exited with code 2"*"--lr 'abc'"*) ;;
  *) fail "the note does not carry rank 1's own error line: '$note'" ;; esac
case "$note" in *"giving up"*|*"see 'tandem train --help'"*) fail "note: '$note'" ;; esac
rec=.tandem/runs/badarg-1/end/node-0.json
[ -f "$rec" ] || fail "no end record at $rec"
python3 - "$rec" <<'PY' || fail "end record: $(cat "$rec")"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["record"] == "tandem.launch.end" and r["version"] == 1, r
assert r["outcome"] == "failed" and r["exit_code"] == 1 and r["restarts"] == 1, r
f = r["failure"]
assert f["rank"] == 1 and f["exit_code"] == 2 and "--lr 'abc'" in f["last_line"], f
assert sorted(w["rank"] for w in r["workers"]) == [0, 1], r
PY

out=$("$B" run badnode 2>&1) && fail "tandem run badnode succeeded: $out"
code=$(field badnode-1 'exit code')
note=$(field badnode-1 note)
[ "$code" = 3 ] || fail "2 nodes: exit code '$code', expected node 1's worker's 3: $("$B" show badnode-1)"
case "$note" in *"worker rank 1"*"on node 1"*"ValueError: no such column 'label'"*) ;;
  *) fail "2 nodes: the note does not carry node 1's worker's line: '$note'" ;; esac
for n in 0 1; do
  [ -f .tandem/runs/badnode-1/end/node-$n.json ] || fail "2 nodes: no end record for node $n"
done
echo "ok: exit code, note and restarts of a failed run come from the launchers' end records"
