#!/usr/bin/env bash
# executors: a user's own PyTorch script (tests/lib/sdk_resume_train.py, the SDK's
# checkpoints) on the namespace Slurm cluster without a shared file system (slurm: work_dir;
# the nodes see neither the project nor each other's work directory, TDS_HIDE_DIRS), 2 nodes x
# 1 worker, on a cluster of 3. After node 0's step-10 checkpoint node 0's machine is drained
# and the job requeued (a lost machine): it resumes on the other two, which never held a
# checkpoint (node 0's came up its link and back down from tandem run). Asserts, as
# test_script_resume_ssh.sh (script_resume_check): succeeded with restarts 1, both ranks resumed
# from one step, train/loss once at each step, config, summary, tag and the w.pt artifact in
# the store, the weights torch.equal to an uninterrupted run of 2 local workers.
set -uo pipefail
NODES=/tmp/tandem-script-res-$$/nodes
. "$(dirname "$0")/exec_test.sh" script-res
trap 'cleanup; rm -rf "/tmp/tandem-script-res-$$"' EXIT
. "$SRC/tests/lib/frameworks.sh"
fw_python
mkdir -p "$NODES" "$P/.tandem" || fail "cannot create $NODES or $P"
cp "$SRC/tests/lib/sdk_resume_train.py" "$P/train.py"
STEPS=40
cat >"$P/.tandem/workflows.yaml" <<EOF2
workflows:
  - name: res
    nodes: 2
    executor: slurm
    slurm: {work_dir: $NODES}
    max_restarts: 1
    env:
      PYTHONPATH: "$SRC/python"
      OMP_NUM_THREADS: "1"
    command: $FW_PY train.py --steps $STEPS --every 5 --sleep 0.25
EOF2
TDS_HIDE_DIRS="$P $NODES" slurm_up 3 || fail "the cluster did not come up"
slurm_node_exec 1 test -e "$P/.tandem/workflows.yaml" && fail "node 1 sees the project"
slurm_exec timeout -k 5 400 "$B" run res >"$P/run.log" 2>&1 &
sup=$!
ck=$NODES/res-1/checkpoints/step-000000000010.pt
for _ in $(seq 1 3000); do
    slurm_node_exec 1 test -e "$ck" 2>/dev/null && break
    kill -0 $sup 2>/dev/null || fail "the run ended before its checkpoint of step 10"
    sleep 0.1
done
slurm_node_exec 1 test -e "$ck" || fail "no $ck on node 1 after 300 s"
slurm_node_exec 2 test -e "$ck" && fail "node 2 has node 0's checkpoints: shared?"
# Node 0's machine leaves (drained, as for maintenance) and the job is requeued: it runs again
# on the other two nodes, whose disks have none of node 0's checkpoints; the new node 0 gets the
# newest from tandem run, to which the old one's agent sent each (over the links).
jid=$(sed -n 's/.*submitted slurm job \([0-9]*\).*/\1/p' "$P/run.log" | head -1)
[ -n "$jid" ] || fail "no job id in tandem run's output"
slurm_exec scontrol update NodeName="${TDS_NODES[0]}" State=DRAIN Reason=tandem-test ||
    fail "scontrol update ${TDS_NODES[0]} DRAIN: exit $?"
slurm_exec scontrol requeue "$jid" || fail "scontrol requeue $jid: exit $?"
echo "step 10 checkpointed on node 0 (${TDS_NODES[0]}); its machine drained, job $jid requeued"
wait $sup || fail "tandem run res: exit $?"
. "$SRC/tests/executors/script_resume_check.sh"
script_resume_check res-1 $STEPS
