#!/usr/bin/env bash
# executors: the Slurm fixture (tests/lib/slurm.sh) is a real two-node cluster, and tandem's
# launcher runs across its nodes. 1. `srun -N2 hostname` answers from two hosts. 2. `tandem
# launch --nnodes 2` started by srun on both nodes (explicit flags, no Slurm detection) trains to
# the same bits as 2 local workers. 3. What the slurm executor will rely on: `scontrol requeue`
# runs a job again (jobcomp and squeue show it) and `scancel --signal=USR1` reaches its tasks.
set -uo pipefail
: "${TANDEM_BIN:?}" "${TANDEM_DATA:?}"
SRC=${TANDEM_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}

. "$SRC/tests/lib/slurm.sh"
work=$(mktemp -d /tmp/tandem-exec-slurm-XXXXXX)
cleanup() {
    slurm_down
    rm -rf "$work"
}
trap cleanup EXIT
fail() {
    echo "FAIL: $*" >&2
    for f in "$work"/*.log "$work"/*.out; do [ -f "$f" ] && { echo "--- $f" >&2; tail -15 "$f" >&2; }; done
    slurm_logs 10
    exit 1
}
# state JOB: the job's state as squeue shows it (empty once it has left the queue)
state() { slurm_exec squeue -h -j "$1" -o %T 2>/dev/null; }
t0=$SECONDS

slurm_up 2 || fail "the cluster did not come up"
n1=${TDS_NODES[0]} n2=${TDS_NODES[1]}
echo "cluster up in $((SECONDS - t0)) s: nodes $n1 $n2, state in $TDS_STATE"

# --- 1. two nodes, two hostnames
out=$(slurm_exec timeout 60 srun -N2 --ntasks-per-node=1 hostname | sort | tr '\n' ' ')
[ "$out" = "$n1 $n2 " ] || fail "srun -N2 hostname printed '$out', expected '$n1 $n2 '"
echo "srun -N2 --ntasks-per-node=1 hostname: $out"

# --- 2. tandem launch across the nodes == 2 local workers, bit for bit
# Ranks on different nodes talk tcp without being told: comm's host key includes the network
# namespace and the hostname, so it never tries shm across nodes (each node also has a private
# /dev/shm, where shm segments could not be found anyway). TANDEM_COMM_TRANSPORT=tcp would force
# it; the check below that the group is tcp-only proves that auto got it right.
train=(train --model basicnet --data "$TANDEM_DATA" --steps 30 --batch 32 --threads 1 --seed 7
       --json --no-progress)
export TANDEM_TOKEN=slurm-test-$$ TANDEM_LOG_LEVEL=debug # debug: comm logs its transports
# The shared file system (like NFS on a cluster) holds $work; only rank 0 saves. The port is
# free: nothing else lives in the node's network namespace.
slurm_exec timeout -k 5 150 srun -N2 --ntasks-per-node=1 bash -c \
    '"$TANDEM_BIN" launch --nnodes 2 --node-rank "$SLURM_NODEID" --rdzv-endpoint "$1" \
        --rdzv-id "slurm-$SLURM_JOB_ID" --rdzv-timeout 60 --nproc-per-node 1 -- "${@:2}"' \
    bash "$n1:29500" "$TANDEM_BIN" "${train[@]}" --save "$work/w-slurm.safetensors" \
    >"$work/slurm.log" 2>&1 || fail "tandem launch under srun -N2: exit $?"
[ -s "$work/w-slurm.safetensors" ] || fail "rank 0 saved no weights under srun"
for r in 0 1; do
    line=$(grep -m1 "comm: rank $r/2 group .* up:" "$work/slurm.log") || fail "rank $r: no comm group line"
    [[ $line == *tcp* && $line != *shm* ]] || fail "rank $r: expected a tcp-only group: $line"
done
js=$(grep -m1 '^\[rank 0\] {' "$work/slurm.log") || fail "rank 0 printed no json summary"
[[ $js =~ \"world_size\":2[,}] && $js =~ \"steps\":30[,}] ]] || fail "rank 0's summary: $js"
echo "tandem launch on 2 Slurm nodes: world_size 2, tcp between the nodes," \
     "final loss $(sed 's/.*"final_loss":\([0-9.]*\).*/\1/' <<<"$js")"

timeout -k 5 150 "$TANDEM_BIN" launch --standalone --nproc-per-node 2 -- \
    "$TANDEM_BIN" "${train[@]}" --save "$work/w-local.safetensors" >"$work/local.log" 2>&1 ||
    fail "2 local workers: exit $?"
line=$(grep -m1 "comm: rank 0/2 group .* up:" "$work/local.log") || fail "local: no comm group line"
[[ $line == *shm* ]] || fail "2 local workers should use shm: $line"
cmp "$work/w-slurm.safetensors" "$work/w-local.safetensors" ||
    fail "weights after 30 steps differ: 2 Slurm nodes (tcp) vs 2 local workers (shm)"
echo "2 Slurm nodes x 1 worker == 2 local workers: bitwise-identical weights" \
     "($(sha256sum <"$work/w-local.safetensors" | cut -c1-16))"
t1=$SECONDS

# --- 3a. scontrol requeue: the running job is stopped and runs again, SLURM_RESTART_COUNT=1
cat >"$work/rq.sh" <<'EOF'
#!/bin/bash
echo "run ${SLURM_RESTART_COUNT:-0} on $(hostname)"
exec sleep 300
EOF
jid=$(slurm_exec sbatch --parsable -N2 --ntasks-per-node=1 --requeue --open-mode=append \
      -o "$work/rq.out" "$work/rq.sh") || fail "sbatch: $jid"
slurm_wait 30 "job $jid to run" sh -c "grep -q 'run 0' '$work/rq.out'" || fail "job $jid never ran"
slurm_exec scontrol requeue "$jid" || fail "scontrol requeue $jid: exit $?"
# Back to the queue, then (after cred_expire, 10 s in the fixture) running again.
slurm_wait 60 "job $jid to run again" sh -c "grep -q 'run 1' '$work/rq.out'" ||
    fail "requeued job $jid did not run again ($(state "$jid"))"
[ "$(state "$jid")" = RUNNING ] || fail "squeue: requeued job $jid is '$(state "$jid")'"
slurm_exec scontrol show job "$jid" | grep -q 'Restarts=1' || fail "scontrol: no Restarts=1"
# jobcomp logs the requeue as a finished run (22.05 writes the job's new state, PENDING).
grep -Eq "^JobId=$jid .*JobState=(PENDING|REQUEUE[D]?) " "$TDS_STATE/jobcomp.log" ||
    fail "jobcomp has no requeue record for $jid: $(cat "$TDS_STATE/jobcomp.log")"
slurm_exec scancel "$jid"
slurm_wait 30 "a CANCELLED record of job $jid" sh -c "grep -q '^JobId=$jid .*JobState=CANCELLED' '$TDS_STATE/jobcomp.log'" ||
    fail "scancel $jid: no CANCELLED record in jobcomp"
echo "scontrol requeue: job $jid ran twice ($(grep -c '^run' "$work/rq.out") runs, Restarts=1)," \
     "jobcomp: $(sed -n "s/^JobId=$jid .*JobState=\([A-Z]*\) .*/\1/p" "$TDS_STATE/jobcomp.log" | tr '\n' ' ')"

# --- 3b. scancel --signal=USR1 reaches the tasks of the job's steps on both nodes; the batch
# shell is not signalled without --batch/--full (the executor must ask for that if it wants it).
cat >"$work/sig.sh" <<'EOF'
#!/bin/bash
trap 'echo "batch got USR1"' USR1
srun bash -c 'trap "echo task got USR1 on \$(hostname); exit 0" USR1; echo ready; while :; do sleep 0.1; done'
echo "step exited $?"
EOF
jid=$(slurm_exec sbatch --parsable -N2 --ntasks-per-node=1 -o "$work/sig.out" "$work/sig.sh") ||
    fail "sbatch: $jid"
slurm_wait 30 "the tasks of job $jid to start" sh -c "[ \$(grep -c ready '$work/sig.out') = 2 ]" ||
    fail "job $jid: tasks not ready"
slurm_exec scancel --signal=USR1 "$jid" || fail "scancel --signal=USR1 $jid: exit $?"
slurm_wait 30 "job $jid to complete" sh -c "grep -q '^JobId=$jid ' '$TDS_STATE/jobcomp.log'" ||
    fail "job $jid did not finish after USR1 ($(state "$jid"))"
got=$(sed -n 's/^task got USR1 on //p' "$work/sig.out" | sort | tr '\n' ' ')
[ "$got" = "$n1 $n2 " ] || fail "USR1 reached tasks on '$got', expected '$n1 $n2 '"
grep -q 'step exited 0' "$work/sig.out" || fail "the step did not exit 0 after USR1"
! grep -q 'batch got USR1' "$work/sig.out" || fail "the batch shell got USR1 without --batch"
grep -q "^JobId=$jid .*JobState=COMPLETED .*ExitCode=0:0" "$TDS_STATE/jobcomp.log" ||
    fail "jobcomp: job $jid not COMPLETED 0:0: $(grep "^JobId=$jid " "$TDS_STATE/jobcomp.log")"
[ -z "$(state "$jid")" ] || [ "$(state "$jid")" = COMPLETED ] || fail "squeue: job $jid is '$(state "$jid")'"
echo "scancel --signal=USR1: tasks on ${got% } got it, job $jid COMPLETED 0:0"
echo "ok: training $((t1 - t0)) s, Slurm checks $((SECONDS - t1)) s"
