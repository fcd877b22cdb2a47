#!/usr/bin/env bash
# executors: a user's Lightning script and HF Trainer script (tests/cloud/spot_fw_train.py, the
# EC2 legs' script: ModelCheckpoint / checkpoint-N/ into the run's checkpoint directory, resuming
# only through tandem.lightning.ckpt_path() / tandem.hf.last_checkpoint()) on 2 ssh hosts
# (tests/lib/sshd.sh) that share no directory with the submitting machine or with each other,
# 1 worker each, max_restarts: 1. Only rank 0 (host 1) writes a checkpoint, and both
# frameworks make every rank read it from its own disk. The first attempt holds after step
# HOLD's checkpoint (--hold); host 2's agent is SIGKILLed there (a lost machine) while host 2
# holds no committed checkpoint (asserted), and the run restarts on both hosts: node 0's agent
# must hand its checkpoint to host 2's before the workers start (src/launch/ckpt_peer.c).
# Asserts per framework (fw_resume_check): succeeded with restarts 1, both ranks resumed from
# step HOLD, each step's loss stored once, config, summary and out/w.pt in the store, the
# weights torch.equal to an uninterrupted run of 2 local workers; and on host 2, the committed
# copy (Lightning's file; HF's checkpoint-HOLD/ with tandem's commit marker, which kept the
# rng_state_1.pth rank 1 had written there).
# Skips (77) without the ssh fixture or the frameworks' venv (torch, lightning, transformers).
set -uo pipefail
: "${TANDEM_BIN:?}"
SRC=${TANDEM_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
B=$TANDEM_BIN
. "$SRC/tests/lib/frameworks.sh"
fw_python
. "$SRC/tests/lib/sshd.sh"
# The frameworks' venv lives under /root, which is each host's own (an empty tmpfs): the hosts
# see it through a bind mount outside the hidden directories, made before the fixture's
# namespaces, and the SDK and the tandem binary from the wheel, installed into a venv in /tmp
# (which the hosts share) that adds the frameworks through that mount (fw_remote_python).
V=$(mktemp -d /tmp/tandem-fw-resvenv-XXXXXX)
mount --bind "$FW_VENV" "$V" || { echo "SKIP: cannot bind-mount the frameworks' venv"; rmdir "$V"; exit 77; }
W=$(mktemp -d /tmp/tandem-fw-reswheel-XXXXXX)
sshd_cleanup_extra() { umount "$V" 2>/dev/null && rmdir "$V"; rm -rf "$W"; }
HOST_PY=$(fw_remote_python "$V" "$W") || { rc=$?; sshd_cleanup_extra; exit $rc; }
sshd_project fw-resume
sshd_exec ssh "$h1" "test -e '$P/.tandem'" && fail "host 1 sees the project"
mkdir -p "$P/.tandem"
cp "$SRC/tests/cloud/spot_fw_train.py" "$P/train.py"
STEPS=20 HOLD=10
wf() { # name framework
    cat <<EOF2
  - name: $1
    executor: ssh
    ssh: {hosts: [$h1, $h2], work_dir: $REMOTE}
    max_restarts: 1
    env:
      OMP_NUM_THREADS: "1"
    command: $HOST_PY train.py $2 --steps $STEPS --every 5 --sleep 0 --hold $HOLD --hold-cap 300
    artifacts: [out/w.pt]
EOF2
}
{
    echo "workflows:"
    wf lit lightning
    wf hft hf
} >"$P/.tandem/workflows.yaml"
. "$SRC/tests/executors/script_resume_check.sh"

# leg NAME FRAMEWORK KEY FIRST COMMITTED: COMMITTED is the file below the checkpoint directory
# whose presence says step HOLD's checkpoint is committed; KEY and FIRST as fw_resume_check.
leg() {
    local name=$1 fw=$2 key=$3 first=$4 done_file=$5 ck
    ck=$REMOTE/$name-1/checkpoints
    sshd_exec timeout -k 5 500 "$B" run "$name" >"$P/$name.log" 2>&1 &
    local sup=$!
    for _ in $(seq 1 3000); do
        sshd_host_exec 1 test -e "$ck/$done_file" 2>/dev/null && break
        kill -0 $sup 2>/dev/null || fail "$name: the run ended before its checkpoint of step $HOLD"
        sleep 0.1
    done
    sshd_host_exec 1 test -e "$ck/$done_file" || fail "$name: no $ck/$done_file on host 1 after 300 s"
    sshd_host_exec 2 test -e "$ck/$done_file" && fail "$name: host 2 has node 0's checkpoint: shared?"
    sshd_host_exec 2 pkill -KILL -f 'tandem launch' || fail "$name: no agent to kill on host 2"
    echo "$name: step $HOLD checkpointed on host 1 only; host 2's agent killed"
    wait $sup || fail "$name: tandem run: exit $?"
    fw_resume_check $name-1 "$fw" $STEPS $HOLD "$key" "$first"
    sshd_host_exec 2 test -f "$ck/$done_file" || fail "$name: host 2 holds no committed $done_file after the resume"
}
leg lit lightning train/loss 0 "epoch=0-step=$HOLD.ckpt"
leg hft hf loss 1 "checkpoint-$HOLD/trainer_state.json"
sshd_host_exec 2 test -f "$REMOTE/hft-1/checkpoints/checkpoint-$HOLD/.tandem-committed" ||
    fail "hft: host 2's checkpoint-$HOLD has no tandem commit marker (not the received copy?)"
sshd_host_exec 2 test -f "$REMOTE/hft-1/checkpoints/checkpoint-$HOLD/rng_state_1.pth" ||
    fail "hft: host 2's checkpoint-$HOLD lost the rng_state_1.pth rank 1 wrote there"
echo "hft: host 2's checkpoint-$HOLD is node 0's, committed, with its own rank's rng_state_1.pth"
