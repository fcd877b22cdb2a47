#!/usr/bin/env bash
# executors: a Slurm job requeued mid-run resumes to the same bits. `tandem run` (executor
# slurm, 2 nodes x 1 worker) trains BasicNet with a checkpoint every 10 steps. 1. Once a
# checkpoint exists, `scontrol requeue` stops the job (its workers get SIGTERM and checkpoint)
# and puts it back in the queue: the run shows pending with "requeued", then running again under
# the same run id, SLURM_RESTART_COUNT=1 -> TANDEM_RESUME=1, resumed from the newest checkpoint.
# 2. Once it has written a newer checkpoint, the time-limit signal (what --signal=B:USR1@LEAD
# sends the batch shell, here by `scancel --batch --signal=USR1`) makes the batch script pass
# SIGTERM to the launchers and requeue its own job, which resumes again. The run ends succeeded,
# restarts 2, with the weights of an uninterrupted run bit for bit and every step's metrics
# stored exactly once.
set -uo pipefail
. "$(dirname "$0")/exec_test.sh" requeue
t0=$SECONDS
slurm_up 2 || fail "the cluster did not come up"

STEPS=80
mkdir -p "$P/.tandem"
train="tandem train --model basicnet --data $TANDEM_DATA --steps $STEPS --batch 16 --threads 1 --seed 7 --no-progress"
cat >"$P/.tandem/workflows.yaml" <<EOF
workflows:
  - name: rq
    nodes: 2
    executor: slurm
    commands:
      - mkdir -p out
      - $train --checkpoint-every 10 --save out/w.safetensors
    artifacts: [out/w.safetensors]
EOF

# The reference, uninterrupted (2 local workers), while the cluster job waits in the queue.
timeout -k 5 220 "$B" launch --standalone --nproc-per-node 2 -- "$B" ${train#tandem } --save "$P/w-ref.safetensors" \
    >"$P/ref.log" 2>&1 &
ref=$!

slurm_exec timeout -k 5 220 "$B" run rq >"$P/run.log" 2>&1 &
sup=$!
R=$P/.tandem/runs/rq-1
slurm_wait 120 "a checkpoint of rq-1" sh -c "ls '$R/checkpoints' | grep -q '^ckpt-'" ||
    fail "no checkpoint after 120 s"
jid=$(head -1 "$R/slurm-job") || fail "no RUN/slurm-job"
slurm_exec scontrol requeue "$jid" || fail "scontrol requeue $jid: exit $?"
echo "requeued slurm job $jid after $(ls "$R/checkpoints" | sort -V | tail -1)"
slurm_wait 30 "rq-1 to show the requeue" sh -c "'$B' ps | grep -q '^rq-1 .*pending .*requeued, restart 1'" ||
    fail "ps never showed the requeued job pending: $("$B" ps)"
# 2. the time-limit relay: after the resumed job has written a newer checkpoint
first=$(ls "$R/checkpoints" | sort -V | tail -1)
slurm_wait 60 "rq-1 to run again" sh -c "'$B' ps | grep -q '^rq-1 .*running .*restart 1'" ||
    fail "rq-1 did not run again: $("$B" ps)"
slurm_wait 90 "a checkpoint newer than $first" sh -c "[ \"\$(ls '$R/checkpoints' | sort -V | tail -1)\" != $first ]" ||
    fail "no checkpoint after $first"
slurm_exec scancel --batch --signal=USR1 "$jid" || fail "scancel --batch --signal=USR1 $jid: exit $?"
echo "time-limit signal (USR1 to the batch shell) after $(ls "$R/checkpoints" | sort -V | tail -1)"
wait $sup || fail "tandem run rq: exit $?"
wait $ref || fail "the reference run: exit $?"

show=$("$B" show rq-1) || fail "tandem show rq-1"
grep -q '^status  *succeeded' <<<"$show" || fail "rq-1 did not succeed: $show"
grep -q '^restarts  *2$' <<<"$show" || fail "restarts: $show"
[ "$("$B" ps -a | grep -c '^rq-')" = 1 ] || fail "the requeue made another run: $("$B" ps -a)"
grep -q "slurm job $jid (requeued, restart 1) running on" "$P/run.log" ||
    fail "the supervisor never saw the job run again"
for n in 1 2; do
    grep -q "^--- slurm requeue $n of job $jid ---" "$R/logs/rank-0.log" || fail "no requeue $n marker in rank-0.log"
done
grep -q "the time limit is near and the workers checkpointed: requeueing slurm job $jid" \
    "$R/logs/slurm-$jid.err" || fail "the batch script did not requeue itself"
grep -q "resuming from .*ckpt-[0-9]*.tdck at step" "$R/logs/rank-0.log" ||
    fail "the requeued job did not resume from a checkpoint"
at=$(sed -n 's/.*resuming from .*ckpt-\([0-9]*\).tdck at step.*/\1/p' "$R/logs/rank-0.log" | tr '\n' ' ' | sed 's/ $//')
cmp "$R/artifacts/out/w.safetensors" "$P/w-ref.safetensors" ||
    fail "weights after the requeue differ from the uninterrupted run"
steps=$("$B" metrics rq-1 --key train/loss --csv | tail -n +2 | cut -d, -f3 | sort -n | tr '\n' ' ')
[ "$steps" = "$(seq 1 $STEPS | tr '\n' ' ')" ] || fail "train/loss steps (each once, 1..$STEPS): $steps"
echo "scontrol requeue, then the time-limit requeue: rq-1 resumed at steps $at under the same" \
     "id (restarts 2), final weights" \
     "== uninterrupted ($(sha256sum <"$P/w-ref.safetensors" | cut -c1-16)), train/loss steps" \
     "1..$STEPS once each"
echo "ok: $((SECONDS - t0)) s"
