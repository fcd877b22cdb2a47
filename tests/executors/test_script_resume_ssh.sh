#!/usr/bin/env bash
# executors: a user's own PyTorch script (tests/lib/sdk_resume_train.py: tandem.init,
# tandem.log, tandem.checkpoint.save/load_latest, tandem.artifact; no resume logic of its own)
# on 2 ssh hosts (tests/lib/sshd.sh) that share no directory with the submitting machine or with
# each other (the project and each host's work directory hidden), 1 worker each, max_restarts: 1.
# After node 0's step-10 checkpoint (which host 2 never has), host 2's agent is SIGKILLed (a
# lost machine); the run restarts on both hosts (issue 30: on two hosts without a shared disk
# rank 0 resumed at step 7 and rank 1 at step 0). Asserts:
#   - the run succeeded with restarts 1;
#   - both ranks' logs (from their hosts, over the links) say they resumed from one step, > 0;
#   - each step of train/loss is stored once (1..STEPS);
#   - the final weights (the script's tandem.artifact of out/w.pt, sent over the link) are
#     torch.equal to an uninterrupted run of 2 local workers;
#   - the script's config, summary and tag are in `tandem show`.
# Skips (77) without the ssh fixture or the frameworks' venv (torch).
set -uo pipefail
: "${TANDEM_BIN:?}"
SRC=${TANDEM_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
B=$TANDEM_BIN
. "$SRC/tests/lib/frameworks.sh"
fw_python
. "$SRC/tests/lib/sshd.sh"
FW=$FW_VENV # the frameworks' venv itself: FW_PY may be the wheel's overlay, which needs /root
# The frameworks' venv lives under /root, which is each host's own (an empty tmpfs): the hosts
# see it through a bind mount outside the hidden directories, made before the fixture's
# namespaces.
V=$(mktemp -d /tmp/tandem-script-resvenv-XXXXXX)
mount --bind "$FW" "$V" || { echo "SKIP: cannot bind-mount the frameworks' venv"; rmdir "$V"; exit 77; }
sshd_cleanup_extra() { umount "$V" 2>/dev/null && rmdir "$V"; }
sshd_project script-resume
sshd_exec ssh "$h1" "test -e '$P/.tandem'" && fail "host 1 sees the project"
sshd_exec ssh "$h1" "test -x '$V/bin/python'" || fail "host 1 does not see the venv at $V"
mkdir -p "$P/.tandem"
cp "$SRC/tests/lib/sdk_resume_train.py" "$P/train.py"
STEPS=40
cat >"$P/.tandem/workflows.yaml" <<EOF2
workflows:
  - name: res
    executor: ssh
    ssh: {hosts: [$h1, $h2], work_dir: $REMOTE}
    max_restarts: 1
    env:
      PYTHONPATH: "$SRC/python"
      OMP_NUM_THREADS: "1"
    command: $V/bin/python train.py --steps $STEPS --every 5 --sleep 0.25
EOF2

sshd_exec timeout -k 5 400 "$B" run res >"$P/run.log" 2>&1 &
sup=$!
ck=$REMOTE/res-1/checkpoints/step-000000000010.pt
for _ in $(seq 1 3000); do
    sshd_host_exec 1 test -e "$ck" 2>/dev/null && break
    kill -0 $sup 2>/dev/null || fail "the run ended before its checkpoint of step 10"
    sleep 0.1
done
sshd_host_exec 1 test -e "$ck" || fail "no $ck on host 1 after 300 s"
sshd_host_exec 2 test -e "$ck" && fail "host 2 has node 0's checkpoints: shared?"
sshd_host_exec 2 pkill -KILL -f 'tandem launch' || fail "no agent to kill on host 2"
echo "step 10 checkpointed on host 1; host 2's agent killed"
wait $sup || fail "tandem run res: exit $?"
. "$SRC/tests/executors/script_resume_check.sh"
script_resume_check res-1 $STEPS
