#!/usr/bin/env bash
# cloud: a user's own PyTorch script (tests/lib/sdk_resume_train.py: tandem.init, tandem.log,
# tandem.checkpoint.save/load_latest, no resume logic of its own) on 2 spot instances of the EC2
# fixture (tests/lib/cloud.sh; the project hidden from the instances) with checkpoint_dir:
# s3://..., node 0 (the node of rank 0, the only one that ever held a checkpoint) interrupted
# mid-run after its step-10 checkpoint is committed in S3:
#   - the SDK's step-N.pt checkpoints are committed in S3 (object + .commit, listed by the AWS
#     CLI, not by tandem);
#   - the replacement node 0 restores the newest committed checkpoint from S3 before its
#     workers start, and both ranks resume from the same step (> 0), printed by the script;
#   - each step of train/loss is stored once (1..60), and the final weights (torch.load of the
#     run's out/w.pt artifact) are equal to those of an uninterrupted run of 2 local workers.
# Skips (77) without root, namespaces, the fixture's venv or the frameworks' venv (torch).
set -uo pipefail
: "${TANDEM_BIN:?}"
SRC=${TANDEM_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
B=$TANDEM_BIN
. "$SRC/tests/lib/frameworks.sh"
fw_python
[ "$(id -u)" = 0 ] || { echo "SKIP: needs root (the EC2 fixture)"; exit 77; }
. "$SRC/tests/lib/cloud.sh"
P=$(mktemp -d /tmp/tandem-awsck-XXXXXX)
# The frameworks' venv lives under /root, which is each instance's own: the instances see it
# through a bind mount outside the hidden directories, made before the fixture's namespaces,
# and the SDK from the wheel, installed into a venv in /tmp (which they share) that adds the
# frameworks through that mount (fw_remote_python).
V=$(mktemp -d /tmp/tandem-awsck-venv-XXXXXX)
mount --bind "$FW_VENV" "$V" || { echo "SKIP: cannot bind-mount the frameworks' venv"; rmdir "$V"; exit 77; }
W=$(mktemp -d /tmp/tandem-awsck-wheel-XXXXXX)
cleanup() {
    cloud_down
    umount "$V" 2>/dev/null && rmdir "$V"
    rm -rf "$P" "$W"
}
trap cleanup EXIT
HOST_PY=$(fw_remote_python "$V" "$W") || exit $?
fail() {
    echo "FAIL: $*" >&2
    for f in "$P"/*.log "$P"/.tandem/runs/sdk-1/logs/*.log; do [ -f "$f" ] && { echo "--- $f" >&2; tail -25 "$f" >&2; }; done
    cloud_logs 10
    exit 1
}
export TANDEM_HOME=$P
cloud_up "$P" || fail "the fixture did not come up"
aws() { sshd_exec "$CLOUD_AWS" "$@"; }
aws ec2 create-key-pair --key-name tk --query KeyName --output text >/dev/null || fail "create-key-pair"
aws s3 mb s3://tandem-ckpt >/dev/null || fail "s3 mb"
mkdir -p "$P/.tandem" "$P/vendor"
cp "$B" "$P/vendor/tandem"
cp "$SRC/tests/lib/sdk_resume_train.py" "$P/"
STEPS=60
aws_block="instance_type: t3.micro, image: $CLOUD_AMI, key_name: tk, user: root, spot: true, address: private"
cat >"$P/.tandem/workflows.yaml" <<EOF2
workflows:
  - name: sdk
    executor: aws
    nodes: 2
    aws:
      {$aws_block, tandem: /root/bin/tandem,
       setup: ["mkdir -p /root/bin", "install -m 755 vendor/tandem /root/bin/tandem"]}
    checkpoint_dir: s3://tandem-ckpt/sdk
    commands:
      - OMP_NUM_THREADS=1 $HOST_PY sdk_resume_train.py --steps $STEPS --every 5 --sleep 0.4
    artifacts: [out/w.pt]
EOF2
commits() { aws s3 ls s3://tandem-ckpt/sdk/sdk-1/ | sed -n 's/.*step-0*\([0-9][0-9]*\)\.pt\.commit$/\1/p' | sort -n; }
sshd_exec timeout -k 5 500 "$B" run sdk >"$P/sdk.log" 2>&1 &
sup=$!
for _ in $(seq 1 1500); do
    c=$(commits | tail -1)
    [ -n "$c" ] && [ "$c" -ge 10 ] && break
    kill -0 $sup 2>/dev/null || fail "the run ended before its checkpoint of step 10 reached S3"
    sleep 0.2
done
before=$(commits | tail -1)
[ "${before:-0}" -ge 10 ] || fail "no committed step-N.pt in S3 after 300 s: $(aws s3 ls --recursive s3://tandem-ckpt/)"
old0=$(aws ec2 describe-instances --filters Name=tag:tandem:run,Values=sdk-1 Name=tag:tandem:node,Values=0 \
    Name=instance-state-name,Values=running --query 'Reservations[].Instances[].InstanceId' --output text)
[ -n "$old0" ] || fail "no running instance of node 0"
cloud_interrupt "$old0" 30 || fail "cloud_interrupt"
echo "step $before committed in S3; spot interruption notice on node 0 ($old0)"
wait $sup || fail "tandem run sdk: exit $?"
R=$P/.tandem/runs/sdk-1
show=$("$B" show sdk-1)
grep -q '^status  *succeeded' <<<"$show" || fail "sdk-1 did not succeed: $show"
new0=$(aws ec2 describe-instances --filters Name=tag:tandem:run,Values=sdk-1 Name=tag:tandem:node,Values=0 \
    --query 'Reservations[].Instances[].InstanceId' --output text | tr '\t' '\n' | grep -v "^$old0$")
[ -n "$new0" ] || fail "node 0 was not replaced"
# both ranks resumed from one step, > 0, in their last attempt
r0=$(sed -n 's/^.*rank 0 resumed from step \([0-9]*\).*/\1/p' "$R/logs/rank-0.log" | tail -1)
r1=$(sed -n 's/^.*rank 1 resumed from step \([0-9]*\).*/\1/p' "$R/logs/rank-1.log" | tail -1)
[ -n "$r0" ] && [ "$r0" -gt 0 ] || fail "rank 0 did not resume from a checkpoint ('$r0')"
[ "$r0" = "$r1" ] || fail "rank 0 resumed from step $r0, rank 1 from step '$r1'"
grep -rq "s3 checkpoints: downloaded step-0*$r0.pt" "$R/logs" "$P/sdk.log" ||
    fail "the replacement node 0 did not restore step-$r0.pt from S3: $(grep -rh 's3 checkpoints' "$R/logs" "$P/sdk.log" | tail -5)"
echo "replacement $new0: both ranks resumed from step $r0, restored from S3"
steps=$("$B" metrics sdk-1 --key train/loss --csv | tail -n +2 | cut -d, -f3 | sort -n | tr '\n' ' ')
[ "$steps" = "$(seq 1 $STEPS | tr '\n' ' ')" ] || fail "train/loss steps are not 1..$STEPS once each: $steps"
[ -s "$R/artifacts/out/w.pt" ] || fail "no out/w.pt artifact in the run directory"
mkdir -p "$P/ref"
(cd "$P/ref" && env -u TANDEM_HOME -u PYTHONPATH timeout -k 5 200 "$B" launch --standalone \
    --nproc-per-node 2 -- "$FW_PY" "$SRC/tests/lib/sdk_resume_train.py" --steps $STEPS --sleep 0) \
    >"$P/ref.log" 2>&1 || fail "the uninterrupted run of 2 local workers: exit $?"
"$FW_PY" - "$R/artifacts/out/w.pt" "$P/ref/out/w.pt" <<'PY' || fail "the weights differ from the uninterrupted run's"
import sys, torch
a, b = torch.load(sys.argv[1]), torch.load(sys.argv[2])
assert a.keys() == b.keys(), (a.keys(), b.keys())
bad = [k for k in a if not torch.equal(a[k], b[k])]
assert not bad, f"differ: {bad}"
PY
echo "the interrupted run's weights equal the uninterrupted run's; train/loss steps 1..$STEPS once each"
