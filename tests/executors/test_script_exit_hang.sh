#!/usr/bin/env bash
# executors: how a script's workers ended is told as it happened (issue 30). As it was seen: a
# Lightning run hung at interpreter exit after Trainer.fit finished, tandem showed it `running`
# for 17 minutes, and `tandem stop` recorded "after the workers checkpointed" for a worker that
# was killed and wrote no checkpoint. tests/executors/script_exit.py as 2 local workers (the
# Python SDK, no framework needed):
#   1. hang: both ranks finish their run (tandem.finish), rank 1 then hangs at exit on a
#      non-daemon thread. While the run is still running its note names rank 1 as finished and
#      hanging at exit (waited for, not slept); after TANDEM_EXIT_GRACE the run stops the
#      workers and ends succeeded (exit 0), its note saying every worker finished and rank 1
#      hung at exit and was stopped.
#   2. stop: `tandem stop` while both run; rank 0 checkpoints and exits 143, rank 1 (which never
#      asks tandem.should_stop) is killed by the SIGTERM. The run is stopped; its note says rank
#      0 checkpointed and rank 1 was killed without a checkpoint, never "after the workers
#      checkpointed".
set -uo pipefail
SRC=${TANDEM_SOURCE_DIR:?TANDEM_SOURCE_DIR must name the source tree}
. "$SRC/tests/lib/project.sh"
project_init script-exit
PY=${PYTHON:-/usr/bin/python3}
export PYTHONPATH=$SRC/python
cp "$SRC/tests/executors/script_exit.py" exit.py

# --- 1. a worker that finished and hangs at exit
TANDEM_EXIT_GRACE=25 "$B" run --name hang --nproc-per-node 2 -- "$PY" exit.py hang >hang.log 2>&1 &
sup=$!
note=
for _ in $(seq 1 1200); do # up to 120 s on a loaded machine
    note=$(show_field hang-1 note)
    case "$note" in *"rank 1 finished training"*) break ;; esac
    kill -0 $sup 2>/dev/null || break
    sleep 0.1
done
status=$(show_field hang-1 status)
expect_contains "$note" "rank 1 finished training (tandem.finish) and has not exited" "the running run's note"
expect_contains "$note" "hangs at exit" "the running run's note"
[ "$status" = running ] || fail "hang-1 is $status while rank 1 hangs, expected running"
echo "ok: while it runs, hang-1 says: $note"
wait $sup
rc=$?
[ "$rc" = 0 ] || { cat hang.log >&2; fail "tandem run of the hanging worker exited $rc, expected 0"; }
[ "$(show_field hang-1 status)" = succeeded ] || fail "hang-1 is $(show_field hang-1 status)"
note=$(show_field hang-1 note)
expect_contains "$note" "every worker finished training (tandem.finish); rank 1 hung at exit for" "hang-1's note"
expect_contains "$note" "was stopped" "hang-1's note"
expect_lacks "$note" "rank 0 hung" "hang-1's note"
grep -q "rank 1 finished training (tandem.finish) and has not exited" hang.log ||
    fail "tandem run did not say so: $(cat hang.log)"
echo "ok: hang-1 ended after TANDEM_EXIT_GRACE: $note"

# --- 2. a stop that kills a worker without a checkpoint
"$B" run --name stop --nproc-per-node 2 -- "$PY" exit.py stop >stop.log 2>&1 &
sup=$!
R=$P/.tandem/runs/stop-1
for _ in $(seq 1 1200); do
    [ -e "$R/ready-0" ] && [ -e "$R/ready-1" ] && break
    kill -0 $sup 2>/dev/null || break
    sleep 0.1
done
[ -e "$R/ready-0" ] && [ -e "$R/ready-1" ] || { cat stop.log >&2; fail "the workers did not start"; }
"$B" stop stop-1 >/dev/null 2>&1 || fail "tandem stop stop-1"
wait $sup
[ "$(show_field stop-1 status)" = stopped ] || fail "stop-1 is $(show_field stop-1 status)"
ls "$R/checkpoints"/ckpt-*.txt >/dev/null 2>&1 || fail "rank 0 wrote no checkpoint"
note=$(show_field stop-1 note)
expect_contains "$note" "rank 0 checkpointed and exited 143" "stop-1's note"
expect_contains "$note" "rank 1 was killed by SIGTERM without a checkpoint" "stop-1's note"
expect_lacks "$note" "after the workers checkpointed" "stop-1's note"
echo "ok: stop-1: $note"
