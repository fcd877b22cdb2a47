#!/usr/bin/env bash
# cloud: a user's Lightning and HF Trainer scripts (tests/cloud/spot_fw_train.py, resuming only
# through tandem.lightning.ckpt_path() / tandem.hf.last_checkpoint()) each on 2 spot instances of
# the EC2 fixture (tests/lib/cloud.sh; the project hidden from the instances) with
# checkpoint_dir: s3://..., node 0 (the only node whose rank writes checkpoints) interrupted
# mid-run once the checkpoint of step HOLD=10 is committed in S3; and the same three scripts (the
# SDK's is sdk_resume_train.py) each on 1 spot instance, interrupted and replaced: there the
# replacement finds nothing of the run on any node and everything comes back from S3. The interruption always
# lands mid-run: on the first attempt (no resume, restart count 0) the scripts' --hold makes
# every rank wait after step HOLD's checkpoint until the interruption's SIGTERM (exit 1 after
# 600 s without one); the replacement run resumes and trains to the end. For each leg:
#   - the framework's checkpoints are committed in S3 (listed by the AWS CLI, not by tandem);
#   - every rank resumes from one step (> 0), the TANDEM_RESUME_STEP its agent got (each rank's
#     log), and a node that lacked it downloaded exactly that step from S3 ("the step node 0
#     resumes from");
#   - each step of the loss is stored once, the final weights (the run's out/w.pt artifact)
#     equal an uninterrupted local run's (torch.equal on every tensor), config and summary are
#     in the store and the artifact is listed by `tandem artifacts`.
# Leg hftd: the HF Trainer script with dropout drawn from torch's global RNG (--dropout) on 2
# spot instances, NODE 1 interrupted once step HOLD is committed: rank 1's RNG state
# (checkpoint-N/rng_state_1.pth) is written on node 1 only, so it reaches S3 only as node 1's own
# files (src/launch/ckpt_s3_ranks.c: PREFIX/checkpoint-N/.tandem-node-1.commit, listed by the AWS
# CLI); the replacement node 1 restores it, rank 1 resumes with it (the Trainer, logging at info,
# never says "Didn't find an RNG file") and the final weights equal the uninterrupted run's
# (without the file rank 1 draws other dropout masks and they differ).
# One fixture for the six legs; TANDEM_AWSFW_LEGS="hftd lit ..." runs only those named. Skips (77) without root, namespaces, the fixture's venv or
# the frameworks' venv (torch, lightning, transformers).
set -uo pipefail
: "${TANDEM_BIN:?}"
SRC=${TANDEM_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
B=$TANDEM_BIN
. "$SRC/tests/lib/frameworks.sh"
fw_python
[ "$(id -u)" = 0 ] || { echo "SKIP: needs root (the EC2 fixture)"; exit 77; }
. "$SRC/tests/lib/cloud.sh"
P=$(mktemp -d /tmp/tandem-awsfw-XXXXXX)
# The frameworks' venv lives under /root, which is each instance's own: the instances see it
# through a bind mount outside the hidden directories, made before the fixture's namespaces,
# and the SDK from the wheel, installed into a venv in /tmp (which they share) that adds the
# frameworks through that mount (fw_remote_python).
V=$(mktemp -d /tmp/tandem-awsfw-venv-XXXXXX)
mount --bind "$FW_VENV" "$V" || { echo "SKIP: cannot bind-mount the frameworks' venv"; rmdir "$V"; exit 77; }
W=$(mktemp -d /tmp/tandem-awsfw-wheel-XXXXXX)
cleanup() {
    cloud_down
    umount "$V" 2>/dev/null && rmdir "$V"
    rm -rf "$P" "$W"
}
trap cleanup EXIT
HOST_PY=$(fw_remote_python "$V" "$W") || exit $?
RUN=none
fail() {
    echo "FAIL: $*" >&2
    for f in "$P"/*.log "$P/.tandem/runs/$RUN"/logs/*.log; do [ -f "$f" ] && { echo "--- $f" >&2; tail -25 "$f" >&2; }; done
    cloud_logs 10
    exit 1
}
export TANDEM_HOME=$P
cloud_up "$P" || fail "the fixture did not come up"
aws() { sshd_exec "$CLOUD_AWS" "$@"; }
aws ec2 create-key-pair --key-name tk --query KeyName --output text >/dev/null || fail "create-key-pair"
aws s3 mb s3://tandem-ckfw >/dev/null || fail "s3 mb"
mkdir -p "$P/.tandem" "$P/vendor"
cp "$B" "$P/vendor/tandem"
cp "$SRC/tests/cloud/spot_fw_train.py" "$SRC/tests/lib/sdk_resume_train.py" "$P/"
STEPS=20 HOLD=10
aws_block="instance_type: t3.micro, image: $CLOUD_AMI, key_name: tk, user: root, spot: true, address: private"
wf() { # name nodes command
    cat <<EOF2
  - name: $1
    executor: aws
    nodes: $2
    aws:
      {$aws_block, tandem: /root/bin/tandem,
       setup: ["mkdir -p /root/bin", "install -m 755 vendor/tandem /root/bin/tandem"]}
    checkpoint_dir: s3://tandem-ckfw/$1
    commands:
      - OMP_NUM_THREADS=1 $HOST_PY $3
    artifacts: [out/w.pt]
EOF2
}
{
    echo "workflows:"
    wf lit 2 "spot_fw_train.py lightning --steps $STEPS --every 5 --sleep 0 --hold $HOLD"
    wf hft 2 "spot_fw_train.py hf --steps $STEPS --every 5 --sleep 0 --hold $HOLD"
    wf hftd 2 "spot_fw_train.py hf --dropout 0.5 --steps $STEPS --every 5 --sleep 0 --hold $HOLD"
    wf sdk1 1 "sdk_resume_train.py --steps $STEPS --every 5 --sleep 0 --hold $HOLD"
    wf lit1 1 "spot_fw_train.py lightning --steps $STEPS --every 5 --sleep 0 --hold $HOLD"
    wf hft1 1 "spot_fw_train.py hf --steps $STEPS --every 5 --sleep 0 --hold $HOLD"
} >"$P/.tandem/workflows.yaml"

# leg NAME NODES SED REF KEY [NODE]: runs workflow NAME (1 worker per node), interrupts node NODE
# (0 unless given) once the commit of step HOLD (where the first attempt holds) is in S3 (SED: a
# commit key's step), checks the resume against REF (the script and its arguments) run
# uninterrupted as NODES local workers, and that each step of metric KEY is stored once.
leg() {
    local name=$1 nodes=$2 sedx=$3 ref_args=$4 mkey=$5 inode=${6:-0} c before oldn newn r s rs steps uniq R
    case " ${TANDEM_AWSFW_LEGS:-$name} " in *" $name "*) ;; *) echo "$name: skipped (TANDEM_AWSFW_LEGS)"; return 0 ;; esac
    RUN=$name-1
    R=$P/.tandem/runs/$RUN
    commits() { aws s3 ls "s3://tandem-ckfw/$name/$RUN/" | sed -n "$sedx" | sort -n; }
    sshd_exec timeout -k 5 500 "$B" run "$name" >"$P/$name.log" 2>&1 &
    local sup=$!
    for _ in $(seq 1 1500); do
        c=$(commits | tail -1)
        [ -n "$c" ] && [ "$c" -ge $HOLD ] && break
        kill -0 $sup 2>/dev/null || fail "$name: the run ended before the checkpoint of step $HOLD reached S3"
        sleep 0.2
    done
    before=$(commits | tail -1)
    [ "${before:-0}" = $HOLD ] || fail "$name: the newest checkpoint in S3 after 300 s is not step $HOLD ('$before'): $(aws s3 ls --recursive "s3://tandem-ckfw/$name/")"
    oldn=$(aws ec2 describe-instances --filters Name=tag:tandem:run,Values=$RUN Name=tag:tandem:node,Values=$inode \
        Name=instance-state-name,Values=running --query 'Reservations[].Instances[].InstanceId' --output text)
    [ -n "$oldn" ] || fail "$name: no running instance of node $inode"
    cloud_interrupt "$oldn" 30 || fail "cloud_interrupt"
    echo "$name: step $before committed in S3 (the first attempt holds there); spot interruption notice on node $inode ($oldn)"
    wait $sup || fail "$name: tandem run: exit $?"
    grep -q '^status  *succeeded' <<<"$("$B" show $RUN)" || fail "$RUN did not succeed: $("$B" show $RUN)"
    newn=$(aws ec2 describe-instances --filters Name=tag:tandem:run,Values=$RUN Name=tag:tandem:node,Values=$inode \
        --query 'Reservations[].Instances[].InstanceId' --output text | tr '\t' '\n' | grep -v "^$oldn$")
    [ -n "$newn" ] || fail "$name: node $inode was not replaced"
    # every rank resumed from one step (> 0), the TANDEM_RESUME_STEP its agent handed it
    rs=
    for ((r = 0; r < nodes; r++)); do
        s=$(sed -n "s/^.*rank $r resumed from step \([0-9]*\).*/\1/p" "$R/logs/rank-$r.log" | tail -1)
        [ -n "$s" ] && [ "$s" -gt 0 ] || fail "$name: rank $r did not resume from a checkpoint ('$s')"
        [ "$s" = $HOLD ] || fail "$name: rank $r resumed from step $s, not from step $HOLD where the first attempt held"
        [ -z "$rs" ] || [ "$s" = "$rs" ] || fail "$name: rank 0 resumed from step $rs, rank $r from step $s"
        if [ "$name" != sdk1 ]; then
            grep -q "rank $r resumed from step $s (TANDEM_RESUME_STEP=$s)" "$R/logs/rank-$r.log" ||
                fail "$name: rank $r resumed from step $s but was handed $(grep -o 'TANDEM_RESUME_STEP=[0-9-]*' "$R/logs/rank-$r.log" | tail -1)"
        fi
        rs=$s
    done
    if [ "$nodes" = 2 ]; then
        grep -rq "s3 checkpoints: downloaded .*: the step node 0 resumes from" "$R/logs" "$P/$name.log" ||
            fail "$name: node 1 did not restore step $rs from S3: $(grep -rh 's3 checkpoints\|resum' "$R/logs" "$P/$name.log" | tail -8)"
    fi
    if [ "$inode" = 0 ]; then
        grep -rq "s3 checkpoints: downloaded .*newer than the local directory" "$R/logs" "$P/$name.log" ||
            fail "$name: the replacement node 0 did not restore from S3: $(grep -rh 's3 checkpoints' "$R/logs" "$P/$name.log" | tail -5)"
    fi
    steps=$("$B" metrics $RUN --key "$mkey" --csv | tail -n +2 | cut -d, -f3 | sort -n)
    uniq=$(sort -un <<<"$steps")
    [ "$steps" = "$uniq" ] && [ "$(wc -l <<<"$steps")" = $STEPS ] ||
        fail "$name: $mkey steps are not $STEPS steps once each: $(tr '\n' ' ' <<<"$steps")"
    [ -n "$(show_section $RUN config)" ] || fail "$name: no config in the store: $("$B" show $RUN)"
    [ -n "$(show_section $RUN summary)" ] || fail "$name: no summary in the store: $("$B" show $RUN)"
    "$B" artifacts $RUN | grep -q 'out/w.pt' || fail "$name: out/w.pt is not among the artifacts: $("$B" artifacts $RUN)"
    [ -s "$R/artifacts/out/w.pt" ] || fail "$name: no out/w.pt artifact in the run directory"
    mkdir -p "$P/ref-$name"
    (cd "$P/ref-$name" && env -u TANDEM_HOME -u PYTHONPATH TANDEM_CHECKPOINT_DIR="$P/ref-$name/checkpoints" \
        timeout -k 5 300 "$B" launch --standalone --nproc-per-node "$nodes" -- "$FW_PY" $ref_args --steps $STEPS --sleep 0) \
        >"$P/ref-$name.log" 2>&1 || fail "$name: the uninterrupted run of $nodes local worker(s): exit $?"
    "$FW_PY" - "$R/artifacts/out/w.pt" "$P/ref-$name/out/w.pt" <<'PY' || fail "$name: the weights differ from the uninterrupted run's"
import sys, torch
a, b = torch.load(sys.argv[1]), torch.load(sys.argv[2])
assert a.keys() == b.keys(), (a.keys(), b.keys())
bad = [k for k in a if not torch.equal(a[k], b[k])]
assert not bad, f"differ: {bad}"
PY
    if [[ $ref_args == *--dropout* ]]; then
        # (after the weights: without rank 1's RNG state they differ, and the leg says so first)
        # every rank's RNG state is in S3 (rank 1's as node 1's own files) and every rank resumed
        # with its own: the Trainer, logging at info (its "Resuming training from checkpoint"
        # line is there), never went on with a fresh RNG
        local keys
        keys=$(aws s3 ls --recursive "s3://tandem-ckfw/$name/$RUN/checkpoint-$rs/") || fail "$name: aws s3 ls"
        grep -q "checkpoint-$rs/\.tandem-node-1\.commit$" <<<"$keys" ||
            fail "$name: S3 holds no node 1 addendum of checkpoint-$rs: $keys"
        grep -q "checkpoint-$rs/\.tandem-node-1/rng_state_1\.pth$" <<<"$keys" ||
            fail "$name: rank 1's rng_state_1.pth of checkpoint-$rs is not in S3: $keys"
        for ((r = 0; r < nodes; r++)); do
            grep -q "rank $r resumes with its RNG state rng_state_$r.pth (checkpoint-$rs)" "$R/logs/rank-$r.log" ||
                fail "$name: rank $r resumed without its RNG state: $(grep 'resumes with' "$R/logs/rank-$r.log")"
            grep -q "Resuming training from checkpoint with epoch" "$R/logs/rank-$r.log" ||
                fail "$name: rank $r's log has no Trainer info line (Resuming training from checkpoint): is it logging at info?"
            ! grep -q "Didn't find an RNG file" "$R/logs/rank-$r.log" ||
                fail "$name: $(grep -h "Didn't find an RNG file" "$R/logs/rank-$r.log" | head -1)"
        done
        grep -rq "s3 checkpoints: downloaded this node's 1 file(s) of checkpoint-$rs" "$R/logs" "$P/$name.log" ||
            fail "$name: the replacement node 1 did not restore its own files of checkpoint-$rs: $(grep -rh 's3 checkpoints' "$R/logs" "$P/$name.log" | tail -8)"
    fi
    echo "$name: replacement $newn of node $inode; every rank resumed from step $rs (from S3); $STEPS steps stored once; weights equal the uninterrupted run's; config, summary, artifact in the store"
}
show_section() { "$B" show "$1" 2>/dev/null | awk -v t="$2:" '$0 == t {on = 1; next} on && /^$/ {exit} on'; }

leg lit 2 's/.*step=\([0-9]*\)\.ckpt\.commit$/\1/p' "$SRC/tests/cloud/spot_fw_train.py lightning" train/loss
leg hft 2 's/.*checkpoint-\([0-9]*\)\.commit$/\1/p' "$SRC/tests/cloud/spot_fw_train.py hf" loss
leg hftd 2 's/.*checkpoint-\([0-9]*\)\.commit$/\1/p' "$SRC/tests/cloud/spot_fw_train.py hf --dropout 0.5" loss 1
leg sdk1 1 's/.*step-0*\([0-9][0-9]*\)\.pt\.commit$/\1/p' "$SRC/tests/lib/sdk_resume_train.py" train/loss
leg lit1 1 's/.*step=\([0-9]*\)\.ckpt\.commit$/\1/p' "$SRC/tests/cloud/spot_fw_train.py lightning" train/loss
leg hft1 1 's/.*checkpoint-\([0-9]*\)\.commit$/\1/p' "$SRC/tests/cloud/spot_fw_train.py hf" loss
