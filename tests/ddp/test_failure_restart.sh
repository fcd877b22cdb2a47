#!/usr/bin/env bash
# A worker of a 2-process training job killed with SIGKILL after a checkpoint exists:
#  (a) --max-restarts 0: the launcher exits non-zero within 2 s of the kill, naming the rank and
#      the signal;
#  (b) --max-restarts 1: the group restarts, the workers resume from the last checkpoint, and
#      the final weights are bitwise equal to an uninterrupted 2-worker run with the same flags.
set -uo pipefail
: "${TANDEM_BIN:?}" "${TANDEM_DATA:?}"
work=$(mktemp -d /tmp/tandem-ddp-restart-XXXXXX)
launcher=
cleanup() {
    [ -n "$launcher" ] && kill -9 "$launcher" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT
fail() {
    echo "FAIL: $*" >&2
    for f in "$work"/*.log; do [ -f "$f" ] && { echo "--- $f" >&2; tail -20 "$f" >&2; }; done
    exit 1
}

steps=100
common=(--model basicnet --data "$TANDEM_DATA" --steps $steps --batch 16 --threads 1 --seed 11
        --lr 1e-3 --checkpoint-every 10 --resume --no-progress)

# start_job TAG MAX_RESTARTS: the launcher in the background; sets $launcher
start_job() {
    local tag=$1 restarts=$2
    mkdir -p "$work/ck-$tag"
    "$TANDEM_BIN" launch --standalone --nproc-per-node 2 --max-restarts "$restarts" -- \
        "$TANDEM_BIN" train "${common[@]}" --checkpoint-dir "$work/ck-$tag" \
        --save "$work/w-$tag.safetensors" >"$work/$tag.log" 2>&1 &
    launcher=$!
}

# The launcher's child whose environment says RANK=$1.
worker_pid() {
    local want=$1 p
    for p in $(pgrep -P "$launcher"); do
        if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "RANK=$want"; then
            echo "$p"; return 0
        fi
    done
    return 1
}

# Waits (up to 120 s) until the job has written a checkpoint, i.e. it is mid-run.
await_checkpoint() {
    local dir=$1 i
    for ((i = 0; i < 1200; i++)); do
        compgen -G "$dir/ckpt-*.tdck" >/dev/null && return 0
        kill -0 "$launcher" 2>/dev/null || fail "the job ended before its first checkpoint"
        sleep 0.1
    done
    fail "no checkpoint in $dir after 120 s"
}

kill_rank1() {
    local pid
    pid=$(worker_pid 1) || fail "no worker with RANK=1 among the launcher's children"
    kill -9 "$pid"
    echo "$pid"
}

# ---- (a) no restarts: fast failure naming the root cause
start_job a 0
await_checkpoint "$work/ck-a"
t0=$(date +%s.%N)
victim=$(kill_rank1)
wait "$launcher"; rc=$?
t1=$(date +%s.%N)
launcher=
dt=$(echo "$t1 - $t0" | bc)
[ "$rc" -ne 0 ] || fail "(a) the launcher exited 0 after worker pid $victim was killed"
echo "(a) launcher exited $rc ${dt}s after the kill"
(( $(echo "$dt < 2" | bc) )) || fail "(a) the launcher took ${dt}s (> 2 s) to exit after the kill"
grep -q "rank 1 .*pid $victim.*signal 9" "$work/a.log" ||
    fail "(a) the launcher's output does not name rank 1 (pid $victim) and signal 9"
grep -m1 "signal 9" "$work/a.log"
[ ! -e "$work/w-a.safetensors" ] || fail "(a) the failed job still saved final weights"

# ---- reference: the same job without interruption
"$TANDEM_BIN" launch --standalone --nproc-per-node 2 -- \
    "$TANDEM_BIN" train "${common[@]}" --checkpoint-dir "$work/ck-ref" \
    --save "$work/w-ref.safetensors" >"$work/ref.log" 2>&1 || fail "the uninterrupted run failed"

# ---- (b) one restart: resume from the last checkpoint, same bits at the end
start_job b 1
await_checkpoint "$work/ck-b"
victim=$(kill_rank1)
wait "$launcher"; rc=$?
launcher=
[ "$rc" -eq 0 ] || fail "(b) the restarted job exited $rc"
grep -q "signal 9" "$work/b.log" || fail "(b) the log does not show the killed worker"
resumed=$(grep -m1 -o "resuming from [^ ]* at step [0-9]*" "$work/b.log") ||
    fail "(b) the restarted workers did not resume from a checkpoint"
echo "(b) killed pid $victim; after the restart: $resumed"
step=${resumed##* }
(( step > 0 && step < steps )) || fail "(b) resumed at step $step, expected mid-run (0 < step < $steps)"
cmp "$work/w-ref.safetensors" "$work/w-b.safetensors" ||
    fail "(b) weights after kill + restart + resume differ from the uninterrupted run"
echo "(b) weights after kill + restart + resume are bitwise equal to the uninterrupted run"
