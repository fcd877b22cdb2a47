#!/usr/bin/env bash
# executors: a user's Lightning script and HF Trainer script (tests/cloud/spot_fw_train.py, as
# test_fw_resume_ssh.sh) on the namespace Slurm cluster without a shared file system (slurm:
# work_dir; the nodes see neither the project nor each other's work directory, TDS_HIDE_DIRS),
# 2 nodes x 1 worker on a cluster of 3, max_restarts: 1. The first attempt holds after step
# HOLD's checkpoint (--hold), which only rank 0 writes, on its node; then node 0's machine is
# drained and the job requeued (a lost machine), and it runs again on the two others: the new
# node 0 (the old node 1, which never held a committed checkpoint) gets the checkpoint
# (Lightning's epoch=0-step=HOLD.ckpt file; the HF Trainer's checkpoint-HOLD/ directory, file by
# file, then committed) from tandem run, to which the old node 0's agent sent it over its link;
# the new node 1 (the third machine, fresh) gets it from the new node 0's agent
# (src/launch/ckpt_peer.c).
# Asserts per framework (fw_resume_check): succeeded with restarts 1, both ranks resumed from
# step HOLD, each step's loss stored once, config, summary and out/w.pt in the store, the
# weights torch.equal to an uninterrupted run of 2 local workers.
set -uo pipefail
NODES=/tmp/tandem-fw-res-$$/nodes
. "$(dirname "$0")/exec_test.sh" fw-res
trap 'cleanup; rm -rf "/tmp/tandem-fw-res-$$"' EXIT
. "$SRC/tests/lib/frameworks.sh"
fw_python
# The nodes see /root and the build directory: the frameworks' overlay venv with the wheel
# installed (fw_python's) serves them as it is; the SDK comes from the wheel, no PYTHONPATH.
fw_need_wheel
mkdir -p "$NODES" "$P/.tandem" || fail "cannot create $NODES or $P"
cp "$SRC/tests/cloud/spot_fw_train.py" "$P/train.py"
STEPS=20 HOLD=10
wf() { # name framework
    cat <<EOF2
  - name: $1
    nodes: 2
    executor: slurm
    slurm: {work_dir: $NODES}
    max_restarts: 1
    env:
      OMP_NUM_THREADS: "1"
    command: $FW_PY train.py $2 --steps $STEPS --every 5 --sleep 0 --hold $HOLD --hold-cap 300
    artifacts: [out/w.pt]
EOF2
}
{
    echo "workflows:"
    wf lit lightning
    wf hft hf
} >"$P/.tandem/workflows.yaml"
TDS_HIDE_DIRS="$P $NODES" slurm_up 3 || fail "the cluster did not come up"
slurm_node_exec 1 test -e "$P/.tandem/workflows.yaml" && fail "node 1 sees the project"
. "$SRC/tests/executors/script_resume_check.sh"

# leg NAME FRAMEWORK KEY FIRST COMMITTED LOSE: COMMITTED is the file below the checkpoint
# directory whose presence says step HOLD's checkpoint is committed (KEY and FIRST as
# fw_resume_check); LOSE which machine of the job is drained: 0 node 0's, 1 node 1's. The
# machines are told apart by what their disks hold: node 0's has COMMITTED, node 1's the run's
# directory without it, the third neither (Slurm picks the job's two).
leg() {
    local name=$1 fw=$2 key=$3 first=$4 done_file=$5 lose=$6 ck jid i zero='' one='' fresh lost
    ck=$NODES/$name-1/checkpoints
    slurm_exec timeout -k 5 500 "$B" run "$name" >"$P/$name.log" 2>&1 &
    local sup=$!
    for _ in $(seq 1 3000); do
        for i in 1 2 3; do
            slurm_node_exec $i test -e "$ck/$done_file" 2>/dev/null && zero=$i
        done
        [ -n "$zero" ] && break
        kill -0 $sup 2>/dev/null || fail "$name: the run ended before its checkpoint of step $HOLD"
        sleep 0.1
    done
    [ -n "$zero" ] || fail "$name: no machine holds $ck/$done_file after 300 s"
    for i in 1 2 3; do
        [ $i = "$zero" ] && continue
        slurm_node_exec $i test -e "$ck/$done_file" && fail "$name: machine $i has node 0's checkpoint: shared?"
        if slurm_node_exec $i test -d "$NODES/$name-1"; then one=$i; else fresh=$i; fi
    done
    [ -n "$one" ] && [ -n "${fresh:-}" ] || fail "$name: cannot tell node 1's machine from the third (node 0: $zero)"
    lost=$([ "$lose" = 0 ] && echo "$zero" || echo "$one")
    jid=$(sed -n 's/.*submitted slurm job \([0-9]*\).*/\1/p' "$P/$name.log" | head -1)
    [ -n "$jid" ] || fail "$name: no job id in tandem run's output"
    slurm_exec scontrol update NodeName="${TDS_NODES[lost - 1]}" State=DRAIN Reason=tandem-test ||
        fail "scontrol update ${TDS_NODES[lost - 1]} DRAIN: exit $?"
    slurm_exec scontrol requeue "$jid" || fail "scontrol requeue $jid: exit $?"
    echo "$name: step $HOLD checkpointed on ${TDS_NODES[zero - 1]} (node 0) only; node $lose's machine" \
         "${TDS_NODES[lost - 1]} drained, job $jid requeued"
    wait $sup || fail "$name: tandem run: exit $?"
    fw_resume_check $name-1 "$fw" $STEPS $HOLD "$key" "$first"
    # node 0 after the requeue ran on the machine that lacked the checkpoint (asserted above)
    grep -q "resuming from step $HOLD (the newest committed checkpoint on node 0)" \
        "$P/.tandem/runs/$name-1/logs/node-0.log" ||
        fail "$name: the new node 0 did not resume from its own copy of step $HOLD"
    slurm_node_exec $fresh test -f "$ck/$done_file" ||
        fail "$name: the fresh machine ${TDS_NODES[fresh - 1]} holds no committed $done_file"
    slurm_exec scontrol update NodeName="${TDS_NODES[lost - 1]}" State=RESUME ||
        fail "scontrol update ${TDS_NODES[lost - 1]} RESUME: exit $?"
}
leg lit lightning train/loss 0 "epoch=0-step=$HOLD.ckpt" 0
leg hft hf loss 1 "checkpoint-$HOLD/trainer_state.json" 0
