#!/usr/bin/env bash
# cloud: `tandem run --resume RUN -d` of a run that lived in the cloud (issue 31; docs/cloud.md,
# "The controller"), on the EC2 fixture (tests/lib/cloud.sh). What tandem did is checked with the
# AWS CLI of the fixture's venv, never with tandem's own account; the steps against the count.
# 1. A 1-node run submitted with -d is stopped with `tandem stop` once its checkpoint at step
#    20 or later is in S3: its store says stopped, nothing of it left running (AWS CLI).
# 2. `tandem run --resume RUN -d`: the same id printed, a new controller (a second instance
#    tagged tandem:controller=RUN; the first terminated), which resumes from the S3 checkpoints;
#    the store in S3 says succeeded (AWS CLI), and `tandem show/metrics` here: succeeded,
#    restarts 1, train/loss steps 1..240 once each, rank 0 resumed from a checkpoint; nothing
#    left running, the new controller terminated by its own switch.
# 3. --resume -d of a run that is not stopped (succeeded) is refused, nothing created.
# 4. An attached run (its supervisor here), stopped with tandem stop, then resumed with -d: its
#    run directory goes to the store first, a controller resumes it to succeeded, steps 1..240
#    once each.
set -uo pipefail
: "${TANDEM_BIN:?}" "${TANDEM_DATA:?}"
SRC=${TANDEM_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
B=$TANDEM_BIN
. "$SRC/tests/lib/cloud.sh"
cloud_test_logs() {
    for c in $(cloud_tagged tandem:controller "${R:-x}" pending,running,stopping,stopped,shutting-down,terminated 2>/dev/null); do
        echo "--- controller $c"
        cloud_host_exec "$c" sh -c 'tail -20 /root/.tandem-controller/*/run.log; tail -40 /root/.tandem-controller/*/project/.tandem/runs/*/logs/supervisor.log' 2>/dev/null
    done
}
cloud_test_begin detachresume
t_begin=$SECONDS
alive_all() {
    aws ec2 describe-instances --filters "Name=instance-state-name,Values=pending,running,stopping,stopped" \
        --query 'Reservations[].Instances[].InstanceId' --output text | tr '\t' '\n' | sed '/^$/d' | sort
}
# the run's status and restarts as its store in S3 says (its controller's run.json): "STATUS N"
store_status() {
    aws s3 cp "s3://tandem-ckpt/res/$1/.tandem-run/run/run.json" - 2>/dev/null |
        "$CLOUD_PYTHON" -c 'import json,sys; r = json.load(sys.stdin); print(r["status"], r["restarts"])' 2>/dev/null
}
wait_final() { # wait_final RUN RESTARTS: the store's final status of that life (600 s at most)
    local t0=$SECONDS
    while [ $((SECONDS - t0)) -lt 600 ]; do
        case "$(store_status "$1")" in "succeeded $2" | "failed $2" | "stopped $2" | "preempted $2") break ;; esac
        sleep 0.2
    done
    store_status "$1"
}
aws ec2 create-key-pair --key-name tk --query KeyName --output text >/dev/null || fail "create-key-pair"
aws s3 mb s3://tandem-ckpt >/dev/null || fail "s3 mb"
export TANDEM_SHUTDOWN_CMD=$SRC/tests/lib/cloud_shutdown.sh
export XDG_CACHE_HOME=$P/cache
mkdir -p "$P/.tandem"
train="tandem train --model basicnet --data $TANDEM_DATA --batch 128 --threads 1 --seed 7 --no-progress"
cat >"$P/.tandem/workflows.yaml" <<EOF
workflows:
  - name: res
    executor: aws
    aws: {instance_type: t3.micro, image: $CLOUD_AMI, key_name: tk, user: root, address: private, orphan_timeout: 60s}
    checkpoint_dir: s3://tandem-ckpt/res
    command: $train --steps 240 --checkpoint-every 10 --checkpoint-dir "\$TANDEM_CHECKPOINT_DIR"
EOF
cd "$P" || fail "cd $P"
# the run $R's committed checkpoints in S3, by step
commits() { aws s3 ls "s3://tandem-ckpt/res/$R/" | sed -n 's/.*ckpt-\([0-9]*\)\.tdck\.commit$/\1/p' | sort -n; }
wait_commit() { # a committed checkpoint of step 20 or later in S3 (300 s at most; PID: while it lives)
    local t0=$SECONDS c
    while [ $((SECONDS - t0)) -lt 300 ]; do
        c=$(commits | tail -1) # one listing per look: the CLI's start is most of a look's time
        [ -n "$c" ] && [ "$c" -ge 20 ] && break
        [ -z "${1:-}" ] || kill -0 "$1" 2>/dev/null || break
        sleep 0.2
    done
}

# --- 1. detached, stopped from here once a checkpoint is in S3
R=$(sshd_exec timeout -k 5 300 "$B" run res -d 2>"$P/submit.log") || fail "tandem run res -d: exit $?"
[ "$R" = res-1 ] || fail "tandem run -d printed '$R'"
ctl1=$(cloud_tagged tandem:controller "$R")
[ "$(wc -w <<<"$ctl1")" = 1 ] || fail "controller instances: '$ctl1'"
wait_commit
at=$(commits | tail -1)
[ "${at:-0}" -ge 20 ] || fail "no committed checkpoint at step 20: $(aws s3 ls --recursive s3://tandem-ckpt/res/)"
out=$(sshd_exec timeout -k 5 200 "$B" stop "$R" --wait 150 2>&1) || fail "tandem stop $R: $out"
grep -q "run $R stopped" <<<"$out" || fail "tandem stop: $out"
[ "$(store_status "$R")" = "stopped 0" ] || fail "the store says '$(store_status "$R")' after the stop"
t0=$SECONDS
while [ $((SECONDS - t0)) -lt 120 ] && [ -n "$(alive_all)" ]; do sleep 0.5; done
[ -z "$(alive_all)" ] || fail "still alive after the stop: $(alive_all)"
echo "stopped $R at checkpoint $at or later (the store says stopped); nothing left running"

# --- 2. resumed in the cloud: a new controller, the same id
t_resume=$SECONDS
R2=$(sshd_exec timeout -k 5 300 "$B" run --resume "$R" -d 2>"$P/resume.log") || fail "tandem run --resume $R -d: exit $?"
[ "$R2" = "$R" ] || fail "tandem run --resume -d printed '$R2', not $R"
ctl2=$(cloud_tagged tandem:controller "$R")
[ "$(wc -w <<<"$ctl2")" = 1 ] && [ "$ctl2" != "$ctl1" ] || fail "the resumed run's controller: '$ctl2' (the first: $ctl1)"
grep -q "handed to the controller $ctl2" "$P/resume.log" || fail "resume: $(cat "$P/resume.log")"
st=$(wait_final "$R" 1)
[ "$st" = "succeeded 1" ] || fail "the resumed run's store says '$st' (status, restarts)"
t_done=$((SECONDS - t_resume))
show=$(sshd_exec "$B" show "$R" 2>&1) || fail "tandem show $R: $show"
grep -q '^status  *succeeded' <<<"$show" || fail "show: $show"
grep -q '^restarts  *1$' <<<"$show" || fail "restarts: $show"
steps=$(sshd_exec "$B" metrics "$R" --key train/loss --csv | tail -n +2 | cut -d, -f3 | sort -n | tr '\n' ' ')
[ "$steps" = "$(seq 1 240 | tr '\n' ' ')" ] || fail "train/loss steps are not 1..240 once each: $(wc -w <<<"$steps") points: $steps"
RD=$P/.tandem/runs/$R
resumed=$(sed -n 's/.*resuming from .*ckpt-\([0-9]*\)\.tdck.*/\1/p' "$RD/logs/rank-0.log" | tail -1)
[ -n "$resumed" ] && [ "$resumed" -ge "$at" ] || fail "rank 0 did not resume from checkpoint >= $at: $(tail -5 "$RD/logs/rank-0.log")"
# the stop came before the end: the new controller's life trained steps of its own
[ "$resumed" -lt 240 ] || fail "the first life reached step 240 before the stop: nothing was resumed"
"$CLOUD_PYTHON" - "$RD/instances.json" "$ctl1" "$ctl2" <<'PY' || fail "the record: $(cat "$RD/instances.json")"
import json, sys
rec = {i["id"]: i for i in json.load(open(sys.argv[1]))["instances"]}
# both lives' controllers are in the run's cost, and two nodes (one per life)
assert rec[sys.argv[2]]["node"] is None and rec[sys.argv[3]]["node"] is None, rec
assert sum(1 for i in rec.values() if i["node"] == 0) == 2, rec
assert all(i["ended_s"] for i in rec.values()), rec
PY
t0=$SECONDS
while [ $((SECONDS - t0)) -lt 120 ] && [ -n "$(alive_all)" ]; do sleep 0.5; done
[ -z "$(alive_all)" ] || fail "still alive after the resumed run: $(alive_all)"
why=$(aws ec2 describe-instances --instance-ids "$ctl2" --query 'Reservations[].Instances[].[State.Name,StateReason.Code]' --output text)
[ "$why" = "$(printf 'terminated\tClient.InstanceInitiatedShutdown')" ] || fail "the new controller $ctl2: '$why'"
echo "resumed with -d: $R on a new controller $ctl2, from checkpoint $resumed, succeeded $t_done s after tandem run --resume -d; steps 1..240 once each, restarts 1; nothing left running"

# --- 3. a succeeded run is not resumed, nothing created
n0=$(aws ec2 describe-instances --query 'length(Reservations[].Instances[])' --output text)
out=$(sshd_exec timeout -k 5 60 "$B" run --resume "$R" -d 2>&1) && fail "--resume -d of a succeeded run: $out"
grep -q "only preempted, stopped or failed runs can be resumed" <<<"$out" || fail "refusal: $out"
[ "$(aws ec2 describe-instances --query 'length(Reservations[].Instances[])' --output text)" = "$n0" ] ||
    fail "a refused --resume -d created an instance"
echo "--resume -d of a succeeded run: refused, nothing created"

# --- 4. an attached run, stopped, resumed in the cloud
sshd_exec timeout -k 5 400 "$B" run res >"$P/attached.log" 2>&1 &
att=$!
R=res-2
wait_commit "$att"
at=$(commits | tail -1)
[ "${at:-0}" -ge 20 ] || fail "attached: no committed checkpoint at step 20"
out=$(sshd_exec timeout -k 5 200 "$B" stop "$R" --wait 150 2>&1) || fail "tandem stop $R (attached): $out"
wait "$att"
grep -q '^status  *stopped' <<<"$(sshd_exec "$B" show "$R")" || fail "attached $R is not stopped: $(sshd_exec "$B" show "$R")"
R2=$(sshd_exec timeout -k 5 300 "$B" run --resume "$R" -d 2>"$P/resume2.log") || fail "tandem run --resume $R -d (attached): exit $?"
[ "$R2" = "$R" ] || fail "--resume -d printed '$R2', not $R"
st=$(wait_final "$R" 1)
[ "$st" = "succeeded 1" ] || fail "the attached run resumed in the cloud: its store says '$st'"
grep -q '^status  *succeeded' <<<"$(sshd_exec "$B" show "$R")" || fail "show $R: $(sshd_exec "$B" show "$R")"
steps=$(sshd_exec "$B" metrics "$R" --key train/loss --csv | tail -n +2 | cut -d, -f3 | sort -n | tr '\n' ' ')
[ "$steps" = "$(seq 1 240 | tr '\n' ' ')" ] || fail "$R: train/loss steps are not 1..240 once each: $(wc -w <<<"$steps") points"
t0=$SECONDS
while [ $((SECONDS - t0)) -lt 120 ] && [ -n "$(alive_all)" ]; do sleep 0.5; done
[ -z "$(alive_all)" ] || fail "still alive after $R: $(alive_all)"
echo "an attached run stopped at checkpoint $at or later, resumed with -d: its directory sent to the store, succeeded on a controller, steps 1..240 once each; nothing left running"
echo "PASS ($((SECONDS - t_begin)) s)"
