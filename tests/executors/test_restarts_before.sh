#!/usr/bin/env bash
# executors: `tandem launch --restarts-before K`, what the Slurm batch script passes to each
# launcher of a new step after a lost launcher (src/exec/slurm.c; docs/launch.md). No cluster:
# one launcher on this machine, 2 workers that print their restart variables and fail.
#   - --max-restarts 1 --restarts-before 1: the first attempt is restart 1, so the workers see
#     TORCHELASTIC_RESTART_COUNT=1 and TANDEM_RESTART_COUNT=1, their rank logs get the restart
#     marker, and no restart is left: one attempt, exit 1, the end record's restarts 1;
#   - --max-restarts 2 --restarts-before 1: one restart left, taken: two attempts (restarts 1
#     then 2), the end record's restarts 2;
#   - --restarts-before -1 is a usage error (exit 2) naming the flag.
set -uo pipefail
: "${TANDEM_BIN:?}"
B=$TANDEM_BIN
W=$(mktemp -d /tmp/tandem-restarts-before-XXXXXX)
trap 'rm -rf "$W"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
# Each worker prints its counts; rank 0 then fails, once rank 1 has printed (so the teardown
# never cuts rank 1's line): W/LEG-r1-K says it did.
worker() {
    echo "echo \"counts \$TORCHELASTIC_RESTART_COUNT \$TANDEM_RESTART_COUNT\"
if [ \"\$RANK\" = 1 ]; then touch '$W/$1-r1-'\$TANDEM_RESTART_COUNT; exit 0; fi
until [ -e '$W/$1-r1-'\$TANDEM_RESTART_COUNT ]; do sleep 0.05; done
exit 3"
}
endrec_restarts() { /usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["restarts"])' "$1"; }

"$B" launch --standalone --nproc-per-node 2 --max-restarts 1 --restarts-before 1 --grace 1 \
    --log-dir "$W/a" --end-record "$W/a.json" -- /bin/sh -c "$(worker a)" >"$W/a.out" 2>&1
code=$?
[ $code = 1 ] || fail "max-restarts 1, restarts-before 1: exit $code, not 1: $(cat "$W/a.out")"
[ "$(grep -c 'counts 1 1$' "$W/a.out")" = 2 ] || fail "the workers' restart counts are not 1 1: $(cat "$W/a.out")"
grep -q 'counts [02]' "$W/a.out" && fail "an attempt other than restart 1 ran: $(cat "$W/a.out")"
grep -qx -- '--- restart 1 ---' "$W/a/rank-0.log" || fail "no restart marker in rank-0.log: $(cat "$W/a/rank-0.log")"
[ "$(endrec_restarts "$W/a.json")" = 1 ] || fail "end record restarts: $(cat "$W/a.json")"

"$B" launch --standalone --nproc-per-node 2 --max-restarts 2 --restarts-before 1 --grace 1 \
    --end-record "$W/b.json" -- /bin/sh -c "$(worker b)" >"$W/b.out" 2>&1
code=$?
[ $code = 1 ] || fail "max-restarts 2, restarts-before 1: exit $code, not 1: $(cat "$W/b.out")"
[ "$(grep -c 'counts 1 1$' "$W/b.out")" = 2 ] && [ "$(grep -c 'counts 2 2$' "$W/b.out")" = 2 ] ||
    fail "not one attempt as restart 1 and one as restart 2: $(cat "$W/b.out")"
[ "$(endrec_restarts "$W/b.json")" = 2 ] || fail "end record restarts: $(cat "$W/b.json")"

"$B" launch --standalone --restarts-before -1 -- true >"$W/c.out" 2>&1
code=$?
[ $code = 2 ] || fail "--restarts-before -1: exit $code, not 2"
grep -q -- '--restarts-before' "$W/c.out" || fail "the usage error does not name --restarts-before: $(cat "$W/c.out")"
echo "ok: restarts-before 1 of max 1: one attempt as restart 1; of max 2: restarts 1 and 2; -1 refused"
