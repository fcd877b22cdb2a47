#!/usr/bin/env bash
# executors: a lost launcher on the namespace Slurm cluster whose nodes share the run directory
# (no slurm: work_dir; the nofs case is test_lost_launcher_slurm.sh). `tandem run` (2 nodes x 1
# worker, max_restarts 1) trains BasicNet 120 steps with a checkpoint every 10; once one exists,
# node 1's `tandem launch` is SIGKILLed. The batch script ends the step (srun
# --kill-on-bad-exit) and starts the group again as a new step (--restarts-before=1), which
# resumes from the newest checkpoint. Waits for the restart's marker (no fixed deadline), then
# asserts: succeeded, restarts 1, the batch script said why (srun exit 137, restart 1 of 1),
# the weights `cmp`-equal to an uninterrupted run of 2 local workers, train/loss once at each of
# steps 1..120.
set -uo pipefail
. "$(dirname "$0")/exec_test.sh" lost-shared
slurm_up 2 || fail "the cluster did not come up"
STEPS=120
mkdir -p "$P/.tandem"
train="tandem train --model basicnet --data $TANDEM_DATA --steps $STEPS --batch 16 --threads 1 --seed 7 --no-progress"
cat >"$P/.tandem/workflows.yaml" <<EOF2
workflows:
  - name: lost
    nodes: 2
    executor: slurm
    max_restarts: 1
    commands:
      - mkdir -p out
      - $train --checkpoint-every 10 --save out/w.safetensors
    artifacts: [out/w.safetensors]
EOF2
# The reference, uninterrupted (2 local workers), while the cluster job runs.
timeout -k 5 300 "$B" launch --standalone --nproc-per-node 2 -- "$B" ${train#tandem } \
    --save "$P/w-ref.safetensors" >"$P/ref.log" 2>&1 &
ref=$!
slurm_exec timeout -k 5 300 "$B" run lost >"$P/run.log" 2>&1 &
sup=$!
R=$P/.tandem/runs/lost-1
until ls "$R/checkpoints" 2>/dev/null | grep -q '^ckpt-'; do
    kill -0 $sup 2>/dev/null || fail "the run ended before its first checkpoint"
    sleep 0.1
done
# This run's node 1 launcher, by what only it has (its --log-dir, SLURM_NODEID=1), never by
# name: other tests' launchers run on this machine too.
pid=
for d in /proc/[0-9]*; do
    [ "$(readlink "$d/exe" 2>/dev/null)" = "$(readlink -f "$B")" ] || continue
    tr '\0' '\n' <"$d/cmdline" 2>/dev/null | grep -qx launch || continue
    tr '\0' '\n' <"$d/cmdline" 2>/dev/null | grep -qx -- "--log-dir=$R/logs" || continue
    tr '\0' '\n' <"$d/environ" 2>/dev/null | grep -qx SLURM_NODEID=1 || continue
    pid=${d#/proc/}
    break
done
[ -n "$pid" ] || fail "no launcher of node 1 found"
kill -KILL "$pid" || fail "kill -KILL $pid (node 1's launcher): exit $?"
t_kill=$SECONDS
echo "node 1's launcher (pid $pid) SIGKILLed after $(ls "$R/checkpoints" | sort -V | tail -1)"
until grep -qx -- '--- restart 1 ---' "$R/logs/rank-1.log" 2>/dev/null; do
    kill -0 $sup 2>/dev/null || fail "the run ended without restarting the group: $(tail -5 "$P/run.log")"
    sleep 0.2
done
echo "the group restarted $((SECONDS - t_kill)) s after the kill (the rendezvous timeout is 300 s)"
wait $sup || fail "tandem run lost: exit $?"
wait $ref || fail "the reference run: exit $?"

show=$("$B" show lost-1) || fail "tandem show lost-1"
grep -q '^status  *succeeded' <<<"$show" || fail "lost-1 did not succeed: $show"
grep -q '^restarts  *1$' <<<"$show" || fail "restarts: $show"
jid=$(head -1 "$R/slurm-job") || fail "no RUN/slurm-job"
grep -q "a launcher of slurm job $jid was lost (srun exit 137): starting the group again as a new step (restart 1 of 1)" \
    "$R/logs/slurm-$jid.err" || fail "the batch script did not say the launcher was lost"
cmp "$R/artifacts/out/w.safetensors" "$P/w-ref.safetensors" ||
    fail "weights after the lost launcher differ from the uninterrupted run"
steps=$("$B" metrics lost-1 --key train/loss --csv | tail -n +2 | cut -d, -f3 | sort -n | tr '\n' ' ')
[ "$steps" = "$(seq 1 $STEPS | tr '\n' ' ')" ] || fail "train/loss steps (each once, 1..$STEPS): $steps"
echo "ok: succeeded, restarts 1, the uninterrupted run's bits" \
     "($(sha256sum <"$P/w-ref.safetensors" | cut -c1-16)), train/loss 1..$STEPS once each"
