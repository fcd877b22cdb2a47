#!/usr/bin/env bash
# executors: a lost launcher on the namespace Slurm cluster without a shared file system (slurm:
# work_dir, TDS_HIDE_DIRS), 2 nodes x 1 worker, max_restarts: 1, a user's PyTorch script
# (tests/lib/sdk_resume_train.py, the SDK's checkpoints). The first attempt holds after step 10's
# checkpoint (--hold), which only rank 0 writes, on node 0; then node 1's `tandem launch` (the
# node agent, not a worker) is SIGKILLed. Slurm never restarts a task inside a running job: before
# the fix the job stayed RUNNING and node 0's launcher waited in the rendezvous for its 300 s.
# Now the batch script's srun ends the step (--kill-on-bad-exit) and starts the group again as a
# new step of the same allocation (--restarts-before=1), and node 1 takes node 0's checkpoint
# from node 0's agent (src/launch/ckpt_peer.c). Waits for the restart's marker in the rank logs
# (no fixed deadline), then asserts the batch script said why (srun exit 137, restart 1 of 1)
# and, as test_script_resume_slurm.sh (script_resume_check): succeeded with restarts 1, both
# ranks resumed from one step, train/loss once at each step, config, summary, tag and the w.pt
# artifact in the store, the weights torch.equal to an uninterrupted run of 2 local workers.
set -uo pipefail
NODES=/tmp/tandem-lost-launcher-$$/nodes
. "$(dirname "$0")/exec_test.sh" lost-launcher
trap 'cleanup; rm -rf "/tmp/tandem-lost-launcher-$$"' EXIT
. "$SRC/tests/lib/frameworks.sh"
fw_python
mkdir -p "$NODES" "$P/.tandem" || fail "cannot create $NODES or $P"
cp "$SRC/tests/lib/sdk_resume_train.py" "$P/train.py"
STEPS=30 HOLD=10
cat >"$P/.tandem/workflows.yaml" <<EOF2
workflows:
  - name: lost
    nodes: 2
    executor: slurm
    slurm: {work_dir: $NODES}
    max_restarts: 1
    env:
      PYTHONPATH: "$SRC/python"
      OMP_NUM_THREADS: "1"
    command: $FW_PY train.py --steps $STEPS --every 5 --sleep 0 --hold $HOLD --hold-cap 300
EOF2
TDS_HIDE_DIRS="$P $NODES" slurm_up 2 || fail "the cluster did not come up"
slurm_node_exec 1 test -e "$P/.tandem/workflows.yaml" && fail "node 1 sees the project"
slurm_exec timeout -k 5 400 "$B" run lost >"$P/run.log" 2>&1 &
sup=$!
R=$P/.tandem/runs/lost-1
ck=$NODES/lost-1/checkpoints/step-$(printf %012d $HOLD).pt
until slurm_node_exec 1 test -e "$ck" 2>/dev/null; do
    kill -0 $sup 2>/dev/null || fail "the run ended before its checkpoint of step $HOLD"
    sleep 0.1
done

# The launcher of this run's node 1: the node namespaces share the machine's pids, so it is
# found by what only it has (this test's node directory in its command line, SLURM_NODEID=1 in
# its environment), never by name: other tests' launchers run on this machine too.
launcher_of_node1() {
    local d pid
    for d in /proc/[0-9]*; do
        pid=${d#/proc/}
        [ "$(readlink "$d/exe" 2>/dev/null)" = "$(readlink -f "$B")" ] || continue
        tr '\0' '\n' <"$d/cmdline" 2>/dev/null | grep -qx launch || continue
        tr '\0' '\n' <"$d/cmdline" 2>/dev/null | grep -q "^--log-dir=$NODES/lost-1/" || continue
        tr '\0' '\n' <"$d/environ" 2>/dev/null | grep -qx SLURM_NODEID=1 || continue
        echo "$pid"
        return 0
    done
    return 1
}
pid=$(launcher_of_node1) || fail "no launcher of node 1 found after step $HOLD's checkpoint"
kill -KILL "$pid" || fail "kill -KILL $pid (node 1's launcher): exit $?"
t_kill=$SECONDS
echo "step $HOLD checkpointed on node 0; node 1's launcher (pid $pid) SIGKILLed"
# The restart: each worker of the new step writes the restart's marker into its rank log
# (src/launch/workers.c), which its node's link carries to tandem run.
until grep -qx -- '--- restart 1 ---' "$R/logs/rank-1.log" 2>/dev/null; do
    kill -0 $sup 2>/dev/null || fail "the run ended without restarting the group: $(tail -5 "$P/run.log")"
    sleep 0.2
done
echo "the group restarted $((SECONDS - t_kill)) s after the kill (the rendezvous timeout is 300 s)"
wait $sup || fail "tandem run lost: exit $?"

jid=$(head -1 "$R/slurm-job") || fail "no RUN/slurm-job"
err=$(slurm_node_exec 1 cat "$NODES/lost-1-slurm-$jid.err") || fail "no batch script stderr on node 0"
grep -q "a launcher of slurm job $jid was lost (srun exit 137): starting the group again as a new step (restart 1 of 1)" <<<"$err" ||
    fail "the batch script did not say the launcher was lost: $err"
"$B" ps -a | grep -c '^lost-' | grep -qx 1 || fail "the restart made another run: $("$B" ps -a)"
. "$SRC/tests/executors/script_resume_check.sh"
script_resume_check lost-1 $STEPS
