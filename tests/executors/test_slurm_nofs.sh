#!/usr/bin/env bash
# executors: `executor: slurm` without a shared file system (`slurm: {work_dir: DIR}`) on a real
# two-node Slurm cluster (tests/lib/slurm.sh) whose nodes do not see the project directory (and
# so the run directory) nor each other's DIR: TDS_HIDE_DIRS gives each node an empty tmpfs of
# its own over both; only the tandem binary and the data are on a file system they share. Each
# node keeps its copy of the run under DIR/RUN_ID and its `tandem launch` links back to `tandem
# run`. 1. BasicNet on 2 nodes x 1 worker ends succeeded with weights bitwise equal to 2 local
# workers; the code reached both nodes; both ranks' logs (written by workers that cannot see the
# run directory), every step's metrics once and both nodes' system metrics reached the run
# store over the links; node 0 sent the artifact back. 2. `scontrol requeue` once node 0 has a
# checkpoint (in its own DIR), then the time-limit signal after a newer one: the same run id
# resumes twice from node 0's checkpoints, restarts 2, the uninterrupted run's bits, every
# step's metrics once. 3. A link_host the nodes cannot resolve fails the run within bounds,
# saying that the nodes could not reach tandem run, and leaves no job behind.
set -uo pipefail
. "$(dirname "$0")/exec_test.sh" nofs
t0=$SECONDS
NODES=/tmp/tandem-nofs-$$/nodes # slurm: work_dir; on each node a private tmpfs
ref=''                            # the background reference run of part 2, if any
trap '[ -z "$ref" ] || kill "$ref" 2>/dev/null; cleanup; rm -rf "/tmp/tandem-nofs-$$"' EXIT
mkdir -p "$NODES" "$P/.tandem" "$P/scripts" || fail "cannot create $NODES or $P"
echo "code the nodes must receive" >"$P/scripts/note.txt"

STEPS=300 # run 2
train="tandem train --model basicnet --data $TANDEM_DATA --steps 40 --batch 32 --threads 1 --seed 7 --no-progress"
train2="tandem train --model basicnet --data $TANDEM_DATA --steps $STEPS --batch 16 --threads 1 --seed 7 --no-progress"
cat >"$P/.tandem/workflows.yaml" <<EOF
workflows:
  - name: bn
    nodes: 2
    executor: slurm
    slurm: {work_dir: $NODES}
    commands:
      - mkdir -p out
      - grep -q 'code the nodes must receive' scripts/note.txt
      - echo "worker \$RANK on \$(hostname), project \$(test -e '$P/.tandem' && echo visible || echo hidden)"
      - $train --save out/w.safetensors
    artifacts: [out/w.safetensors]
  - name: rq
    nodes: 2
    executor: slurm
    slurm: {work_dir: $NODES}
    commands:
      - mkdir -p out
      - $train2 --checkpoint-every 10 --save out/w.safetensors
    artifacts: [out/w.safetensors]
  - name: badarg
    nodes: 2
    executor: slurm
    slurm: {work_dir: $NODES}
    command: |
      if [ "\$GROUP_RANK" = 1 ]; then exec tandem train --model basicnet --lr abc; fi
      sleep 30
  - name: nolink
    nodes: 2
    executor: slurm
    slurm: {work_dir: $NODES, link_host: nosuch.invalid}
    command: "true"
EOF

# Three nodes for 2-node jobs: the requeued job of part 2 runs on the other two.
TDS_HIDE_DIRS="$P $NODES" slurm_up 3 || fail "the cluster did not come up"
n1=${TDS_NODES[0]} n2=${TDS_NODES[1]} n3=${TDS_NODES[2]}

# --- 0. the premise: the nodes see neither the project nor each other's work dir; they do see
# the tandem binary and the data; the login node (where tandem run runs) sees the project
slurm_exec test -s "$P/.tandem/workflows.yaml" || fail "the login node does not see the project"
seen=$(slurm_exec timeout -k 5 30 srun --chdir=/ -N2 --ntasks-per-node=1 sh -c "
    if test -e '$P/.tandem/workflows.yaml'; then p=sees; else p=hidden; fi
    test -x '$B' && test -d '$TANDEM_DATA' && b=ok || b=missing
    echo \"\$(hostname) project \$p, tandem and data \$b\"" 2>&1 | sort)
[ "$seen" = "$n1 project hidden, tandem and data ok
$n2 project hidden, tandem and data ok" ] || fail "the nodes' view is not the test's premise: $seen"
slurm_node_exec 1 sh -c "echo n1 >'$NODES/marker'" || fail "cannot write to node 1's $NODES"
slurm_node_exec 2 test -e "$NODES/marker" && fail "node 2 sees node 1's $NODES"
[ -e "$NODES/marker" ] && fail "the login side sees node 1's $NODES"
slurm_node_exec 1 rm -f "$NODES/marker"
echo "no shared file system: $n1 and $n2 see neither $P nor each other's $NODES"

# --- 1. training on two Slurm nodes without a shared directory == two local workers
slurm_exec timeout -k 5 150 "$B" run bn >"$P/run.log" 2>&1 || fail "tandem run bn: exit $?"
R=$P/.tandem/runs/bn-1
show=$("$B" show bn-1) || fail "tandem show bn-1"
grep -q '^status  *succeeded' <<<"$show" || fail "bn-1 did not succeed: $show"
grep -q "submitted slurm job" "$P/run.log" || fail "no 'submitted slurm job' line"
[ -s "$R/artifacts/out/w.safetensors" ] || fail "artifact not stored (node 0 did not send it back?)"
timeout -k 5 150 "$B" launch --standalone --nproc-per-node 2 -- "$B" ${train#tandem } --save "$P/w-local.safetensors" \
    >"$P/local.log" 2>&1 || fail "2 local workers: exit $?"
cmp "$R/artifacts/out/w.safetensors" "$P/w-local.safetensors" ||
    fail "weights differ: 2 Slurm nodes without a shared directory vs 2 local workers"
echo "executor slurm, work_dir on the nodes, 2 nodes x 1 worker == 2 local workers:" \
     "bitwise-identical weights ($(sha256sum <"$P/w-local.safetensors" | cut -c1-16))"
# each node has its own copy of the run, code included
for i in 1 2; do
    slurm_node_exec "$i" test -d "$NODES/bn-1" || fail "node $i has no $NODES/bn-1"
    [ -n "$(slurm_node_exec "$i" find "$NODES/bn-1" -name note.txt -size +0)" ] ||
        fail "the code did not reach node $i (no note.txt under $NODES/bn-1)"
done
# the logs came over the links: their writers could not see the run directory
for r in 0 1; do [ -s "$R/logs/rank-$r.log" ] || fail "logs/rank-$r.log is missing or empty"; done
grep -q 'training basicnet' "$R/logs/rank-0.log" || fail "rank-0.log lacks the trainer's lines"
grep -q 'step 40/40' "$R/logs/rank-0.log" || fail "rank-0.log lacks step 40/40: $(tail -3 "$R/logs/rank-0.log")"
h0=$(sed -n 's/^worker 0 on \([^,]*\), project hidden$/\1/p' "$R/logs/rank-0.log")
h1=$(sed -n 's/^worker 1 on \([^,]*\), project hidden$/\1/p' "$R/logs/rank-1.log")
[ "$(printf '%s\n' "$h0" "$h1" | sort | tr '\n' ' ')" = "$n1 $n2 " ] ||
    fail "ranks 0 and 1 did not log from $n1 and $n2 without seeing the project: '$h0' '$h1'" \
         "($(grep -h '^worker' "$R"/logs/rank-*.log))"
"$B" logs bn-1 | grep -q '^\[rank 1\] worker 1 on ' || fail "tandem logs lacks rank 1's lines"
"$B" show bn-1 | grep -q "logs/rank-1.log" || fail "rank-1.log not recorded"
steps=$("$B" metrics bn-1 --key train/loss --rank 0 --csv | tail -n +2 | cut -d, -f3 | sort -n | tr '\n' ' ')
[ "$steps" = "$(seq 1 40 | tr '\n' ' ')" ] || fail "rank 0's train/loss steps (each once, 1..40): $steps"
sys=$("$B" metrics bn-1 --key sys/cpu_percent --csv | tail -n +2 | cut -d, -f1 | sort -u | tr '\n' ' ')
[ "$sys" = "0 1 " ] || fail "sys/cpu_percent ranks: '$sys' (want 0 and 1, sampled on each node)"
for n in "$n1" "$n2"; do
    [ -s "$R/metrics/sys-$n.jsonl" ] || fail "no metrics/sys-$n.jsonl from $n: $(ls "$R/metrics")"
done
echo "run store: rank logs from $h0 (rank 0) and $h1 (rank 1), which could not see it," \
     "train/loss steps 1..40 once each, both nodes' system metrics"

# --- 2. requeued twice mid-run: resumes from node 0's own checkpoints to the same bits
timeout -k 5 220 "$B" launch --standalone --nproc-per-node 2 -- "$B" ${train2#tandem } --save "$P/w-ref.safetensors" \
    >"$P/ref.log" 2>&1 &
ref=$!
slurm_exec timeout -k 5 240 "$B" run rq >"$P/rq.log" 2>&1 &
sup=$!
R=$P/.tandem/runs/rq-1
# The checkpoints are on node 0 only, somewhere under its $NODES/rq-1: newest last.
ckpts() {
    local i
    for i in 1 2 3; do slurm_node_exec "$i" find "$NODES/rq-1" -name 'ckpt-*.tdck' 2>/dev/null; done |
        sed 's#.*/##' | sort -uV
}
has_ckpt() { [ -n "$(ckpts)" ]; }
newer_ckpt() { [ "$(ckpts | tail -1)" != "$1" ] && [ -n "$(ckpts)" ]; }
sup_state() { kill -0 $sup 2>/dev/null && echo "tandem run still runs" || echo "tandem run has ended"; }
slurm_wait 120 "a checkpoint of rq-1 on a node" has_ckpt ||
    fail "no checkpoint under $NODES/rq-1 on either node after 120 s ($(sup_state))"
jid=$(head -1 "$R/slurm-job") || fail "no RUN/slurm-job"
# The links drop (both nodes' connections aborted, as by a network fault): the job goes on, each
# agent dials again, and the mirror sends from the new manifest (the step and log checks below
# find nothing lost and nothing twice).
port=$(sed -n 's/.*link back to [^ ]*:\([0-9]*\)$/\1/p' "$P/rq.log" | head -1)
[ -n "$port" ] || fail "no link port in tandem run's output: $(cat "$P/rq.log")"
for i in 1 2; do
    slurm_node_exec "$i" ss -K state established "( dport = :$port )" >/dev/null 2>&1 ||
        fail "ss -K on node $i: exit $?"
done
back() { grep -q "link to the supervisor at .* is back" "$R/logs/node-0.log" &&
    grep -q "link to the supervisor at .* is back" "$R/logs/node-1.log"; }
slurm_wait 30 "both nodes' links to come back" back ||
    fail "the links did not come back: $(tail -3 "$R"/logs/node-*.log)"
grep -q "the link of node [01] closed" "$P/rq.log" || fail "tandem run did not see a link close"
echo "both links aborted mid-run (ss -K): each agent dialled again and carried on"
# Node 0's machine leaves (drained, as for maintenance): the requeued job runs on $n2 and $n3,
# and its node 0 ($n2) has none of the checkpoints $n1 wrote: it gets the newest from tandem run,
# to which $n1's agent sent each one (and the last, written as the requeue stopped the workers).
slurm_exec scontrol update NodeName="$n1" State=DRAIN Reason=tandem-test ||
    fail "scontrol update $n1 DRAIN: exit $?"
slurm_exec scontrol requeue "$jid" || fail "scontrol requeue $jid: exit $?"
echo "requeued slurm job $jid after $(ckpts | tail -1) (on the node)"
slurm_wait 30 "rq-1 to show the requeue" sh -c "'$B' ps | grep -q '^rq-1 .*pending .*requeued, restart 1'" ||
    fail "ps never showed the requeued job pending: $("$B" ps)"
# 2. the time-limit relay: after the resumed job has written a newer checkpoint (newer than
# the one its workers wrote when the requeue stopped them)
first=$(ckpts | tail -1)
slurm_wait 60 "rq-1 to run again" sh -c "'$B' ps | grep -q '^rq-1 .*running .*restart 1'" ||
    fail "rq-1 did not run again: $("$B" ps)"
slurm_wait 90 "a checkpoint newer than $first" newer_ckpt "$first" ||
    fail "no checkpoint after $first ($(sup_state))"
slurm_exec scancel --batch --signal=USR1 "$jid" || fail "scancel --batch --signal=USR1 $jid: exit $?"
echo "time-limit signal (USR1 to the batch shell) after $(ckpts | tail -1)"
wait $sup || fail "tandem run rq: exit $?"
wait $ref || fail "the reference run: exit $?"

show=$("$B" show rq-1) || fail "tandem show rq-1"
grep -q '^status  *succeeded' <<<"$show" || fail "rq-1 did not succeed: $show"
grep -q '^restarts  *2$' <<<"$show" || fail "restarts: $show"
[ "$("$B" ps -a | grep -c '^rq-')" = 1 ] || fail "the requeue made another run: $("$B" ps -a)"
grep -q "slurm job $jid (requeued, restart 1) running on" "$P/rq.log" ||
    fail "the supervisor never saw the job run again"
grep -q "slurm job $jid (requeued, restart 1) running on ${n1%n1}n\[2-3\]" "$P/rq.log" ||
    fail "the requeued job did not run on $n2 and $n3: $(grep 'restart 1) running' "$P/rq.log")"
kept=$(find "$R/checkpoints" -name 'ckpt-*.tdck' | wc -l)
[ "$kept" -ge 1 ] && [ "$kept" -le 2 ] || fail "tandem run keeps $kept checkpoints of rq-1 (1 or 2)"
for n in 1 2; do
    for r in 0 1; do
        grep -q "^--- slurm requeue $n of job $jid ---" "$R/logs/rank-$r.log" ||
            fail "no requeue $n marker in rank-$r.log (the node's log not mirrored after the requeue?)"
    done
done
# The batch script's own requeue: its stderr is on the job's first node (or mirrored here).
jobout=$(cat "$R"/logs/*"$jid"* 2>/dev/null
    for i in 1 2 3; do slurm_node_exec "$i" find "$NODES" -name "*$jid*.err" -exec cat {} + 2>/dev/null; done)
grep -q "the time limit is near and the workers checkpointed: requeueing slurm job $jid" <<<"$jobout" ||
    fail "the batch script did not requeue itself (job $jid's stderr: $(tail -5 <<<"$jobout"))"
# (before its link is up a launcher's messages go to the job's output, on the first node)
grep -q "received the run's newest checkpoint .*/rq-1/checkpoints/ckpt-[0-9]*.tdck" <<<"$jobout" ||
    fail "the new node 0 ($n2) was not sent a checkpoint (job $jid's stderr: $(tail -5 <<<"$jobout"))"
grep -q "resuming from .*ckpt-[0-9]*.tdck at step" "$R/logs/rank-0.log" ||
    fail "the requeued job did not resume from a checkpoint"
at=$(sed -n 's/.*resuming from .*ckpt-\([0-9]*\).tdck at step.*/\1/p' "$R/logs/rank-0.log" | tr '\n' ' ' | sed 's/ $//')
[ "$(grep -c "resuming from .*ckpt-[0-9]*.tdck at step" "$R/logs/rank-0.log")" = 2 ] ||
    fail "rank-0.log should say 'resuming from' exactly twice (nothing doubled by the links): $(grep resuming "$R/logs/rank-0.log")"
[ "$(grep -c "step $STEPS/$STEPS" "$R/logs/rank-0.log")" -le 1 ] ||
    fail "rank-0.log holds step $STEPS/$STEPS twice: a tail sent twice"
[ -s "$R/artifacts/out/w.safetensors" ] || fail "rq-1's artifact not stored"
cmp "$R/artifacts/out/w.safetensors" "$P/w-ref.safetensors" ||
    fail "weights after the requeues differ from the uninterrupted run"
steps=$("$B" metrics rq-1 --key train/loss --rank 0 --csv | tail -n +2 | cut -d, -f3 | sort -n | tr '\n' ' ')
[ "$steps" = "$(seq 1 $STEPS | tr '\n' ' ')" ] || fail "train/loss steps (each once, 1..$STEPS): ${steps:0:400}"
echo "scontrol requeue with $n1 drained, then the time-limit requeue: rq-1 resumed at steps" \
     "$at on $n2 and $n3 (the first from the checkpoint $n1 sent up and tandem run sent down)" \
     "under the same id (restarts 2), final weights == uninterrupted" \
     "($(sha256sum <"$P/w-ref.safetensors" | cut -c1-16)), train/loss steps 1..$STEPS once each"

# --- 3. the nodes cannot reach tandem run: the run fails, in bounded time, and says so
t_nl=$SECONDS
slurm_exec timeout -k 5 120 "$B" run nolink >"$P/nolink.log" 2>&1
rc=$?
[ $rc != 0 ] || fail "a run whose nodes cannot reach tandem run succeeded"
if [ $rc = 124 ] || [ $rc = 137 ]; then fail "tandem run nolink hung (killed after 120 s)"; fi
show=$("$B" show nolink-1) || fail "tandem show nolink-1"
grep -q '^status  *failed' <<<"$show" || fail "nolink-1 is not failed: $show"
note=$(sed -n 's/^note  *//p' <<<"$show")
grep -qE 'link_host|nosuch\.invalid' <<<"$note
$(cat "$P/nolink.log")" || fail "nothing says the nodes could not reach tandem run: note '$note'"
queue_empty() { [ -z "$(slurm_exec squeue -h)" ]; }
slurm_wait 30 "nolink's job to leave the queue" queue_empty ||
    fail "a job is left in the queue 30 s after tandem run ended: $(slurm_exec squeue)"
echo "link_host nosuch.invalid: failed after $((SECONDS - t_nl)) s (exit $rc), note: $note"

# --- 4. a worker's bad argument on the second node: its launcher's end record comes over the
# node's link (end/node-1.json) and the run's note and exit code are that worker's
slurm_exec timeout -k 5 120 "$B" run badarg >"$P/badarg.log" 2>&1 && fail "a run with --lr abc succeeded"
. "$SRC/tests/lib/bad_argument.sh"
expect_bad_argument badarg-1 1
echo "a worker's bad argument on a linked node: the run's note and exit code are that worker's"
echo "ok: $((SECONDS - t0)) s"
