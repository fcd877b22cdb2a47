#!/usr/bin/env bash
# cloud: the dead-man's switch of executor aws on the EC2 fixture (tests/lib/cloud.sh; docs/cloud.md,
# "The dead-man's switch"). Every instance's shutdown command is the fixture's
# (tests/lib/cloud_shutdown.sh through TANDEM_SHUTDOWN_CMD), which makes moto do what EC2 does
# with the instance's InstanceInitiatedShutdownBehavior. What happened is asked of moto with the
# AWS CLI of the fixture's venv, never of tandem.
# 1. A live run that prints nothing for 4.5 times its aws.orphan_timeout (10 s): it succeeds, no
#    instance shut itself down, and each was created with InstanceInitiatedShutdownBehavior
#    terminate.
# 0. aws.orphan_timeout out of range or not a duration, a resources: field unknown, resources
#    with instance_type: refused when the workflow is read, naming the field.
# 2. tandem run killed with -9 while its 2 instances run (aws.orphan_timeout 15 s) and never
#    started again: every instance terminates itself (state reason Client.InstanceInitiatedShutdown,
#    the fixture's record of the shutdown), not before the timeout has run from the kill less one
#    heartbeat period; nobody ran tandem gc or any tandem command.
set -uo pipefail
: "${TANDEM_BIN:?}"
SRC=${TANDEM_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
B=$TANDEM_BIN
. "$SRC/tests/lib/cloud.sh"
sup=
cloud_test_cleanup() { [ -n "$sup" ] && kill -9 "$sup" 2>/dev/null; }
cloud_test_logs() {
    [ -n "${TSH_STATE:-}" ] && for f in "$TSH_STATE"/log/user-data-*.log; do
        [ -f "$f" ] && { echo "--- $f"; tail -5 "$f"; }
    done
    for id in ${ids:-}; do
        echo "--- $id: /dev/shm"
        cloud_host_exec "$id" sh -c 'ls -l --time-style=+%s /dev/shm; date +%s; cat /dev/shm/tandem-orphan.log'
    done
}
cloud_test_begin orphan
instances_of() { cloud_tagged tandem:run "$@"; }
aws ec2 create-key-pair --key-name tk --query KeyName --output text >/dev/null || fail "create-key-pair"
export TANDEM_SHUTDOWN_CMD=$SRC/tests/lib/cloud_shutdown.sh
mkdir -p "$P/.tandem"
aws_block="instance_type: t3.micro, image: $CLOUD_AMI, key_name: tk, user: root, address: private"
cat >"$P/.tandem/workflows.yaml" <<YAML
workflows:
  - name: quiet
    executor: aws
    nodes: 2
    aws: {$aws_block, orphan_timeout: 10s}
    command: sleep 45
  - name: orphan
    executor: aws
    nodes: 2
    aws: {$aws_block, orphan_timeout: 15s}
    command: sleep 600
YAML

# --- 0. bad settings, named
bad() { # WHAT AWS-FIELDS EXPECTED-TEXT
    printf 'workflows:\n  - name: b\n    executor: aws\n    aws: {%s}\n    command: "true"\n' "$2" >"$P/bad.yaml"
    out=$(sshd_exec "$B" run -f "$P/bad.yaml" b 2>&1)
    rc=$?
    [ $rc = 2 ] && grep -q "$3" <<<"$out" || fail "$1: exit $rc: $out"
}
base="image: $CLOUD_AMI, key_name: tk"
bad "orphan_timeout 5s" "$base, instance_type: t3.micro, orphan_timeout: 5s" "aws.orphan_timeout: expected a duration from 10s to 1d"
bad "orphan_timeout soon" "$base, instance_type: t3.micro, orphan_timeout: soon" "aws.orphan_timeout: expected a duration .*got 'soon'"
bad "resources.cores" "$base, resources: {cores: 4}" "aws.resources: unknown field 'cores'; the fields are: cpu, memory"
bad "resources and instance_type" "$base, instance_type: t3.micro, resources: {cpu: 4}" "gives both instance_type and resources"
bad "neither" "$base" "needs instance_type (such as g5.xlarge or c7i.large), or resources"
echo "bad aws.orphan_timeout and resources: refused, named"

# --- 1. a live, quiet run is never touched
sshd_exec timeout -k 5 400 "$B" run quiet >"$P/quiet.log" 2>&1 || fail "tandem run quiet: exit $?"
grep -q '^status  *succeeded' <<<"$("$B" show quiet-1)" || fail "quiet-1 did not succeed"
ids=$(instances_of quiet-1 pending,running,stopping,stopped,shutting-down,terminated)
[ "$(wc -l <<<"$ids")" = 2 ] || fail "quiet-1 made '$ids', not 2 instances"
for id in $ids; do
    how=$(aws ec2 describe-instance-attribute --instance-id "$id" \
        --attribute instanceInitiatedShutdownBehavior \
        --query InstanceInitiatedShutdownBehavior.Value --output text)
    [ "$how" = terminate ] || fail "$id: InstanceInitiatedShutdownBehavior '$how', not terminate"
    [ ! -e "$TSH_STATE/cloud/shutdown/$id" ] ||
        fail "$id of a live run shut itself down: $(cat "$TSH_STATE/cloud/shutdown/$id")"
    code=$(aws ec2 describe-instances --instance-ids "$id" \
        --query 'Reservations[].Instances[].StateReason.Code' --output text)
    [ "$code" != Client.InstanceInitiatedShutdown ] || fail "$id: state reason $code"
done
echo "a run silent for 45 s with aws.orphan_timeout 10 s: succeeded, its instances" $ids "untouched by the switch"

# --- 2. the supervisor killed -9, never restarted: every instance ends itself
sshd_exec "$B" run orphan >"$P/orphan.log" 2>&1 &
sup=$!
for _ in $(seq 1 900); do
    grep -q "agents started" "$P/orphan.log" && [ "$(instances_of orphan-1 running | wc -l)" = 2 ] && break
    kill -0 "$sup" 2>/dev/null || fail "tandem run orphan ended early"
    sleep 0.2
done
ids=$(instances_of orphan-1 running)
[ "$(wc -l <<<"$ids")" = 2 ] || fail "orphan-1 has '$ids' running"
# each agent has heard its supervisor: the switch's file is there, its time in the future
for id in $ids; do
    for _ in $(seq 1 150); do
        cloud_host_exec "$id" sh -c '[ "$(stat -c %Y /dev/shm/tandem-heard)" -gt "$(date +%s)" ]' 2>/dev/null && break
        sleep 0.2
    done
    cloud_host_exec "$id" sh -c '[ "$(stat -c %Y /dev/shm/tandem-heard)" -gt "$(date +%s)" ]' ||
        fail "$id: its agent never heard 'alive' from the supervisor"
done
# sshd_exec, a function, runs in a subshell of its own: its child (nsenter, which became
# tandem) is the supervisor
tp=$(pgrep -P "$sup")
[ "$(readlink "/proc/$tp/exe")" = "$(readlink -f "$B")" ] || fail "the supervisor's pid: '$tp'"
t_kill=$(date +%s.%N)
kill -9 "$tp" || fail "kill -9 tandem run"
wait "$sup" 2>/dev/null
sup=
t0=$SECONDS
while [ $((SECONDS - t0)) -lt 240 ]; do # up to 4 min on a loaded machine; the assertion is below
    [ -z "$(instances_of orphan-1)" ] && break
    sleep 0.5
done
t_gone=$(date +%s.%N)
[ -z "$(instances_of orphan-1)" ] || fail "still alive $(awk "BEGIN{print $t_gone - $t_kill}") s after the kill: $(instances_of orphan-1)"
for id in $ids; do
    code=$(aws ec2 describe-instances --instance-ids "$id" \
        --query 'Reservations[].Instances[].[State.Name,StateReason.Code]' --output text)
    [ "$code" = "$(printf 'terminated\tClient.InstanceInitiatedShutdown')" ] || fail "$id: '$code'"
    rec=$TSH_STATE/cloud/shutdown/$id
    [ -s "$rec" ] || fail "$id: the fixture saw no shutdown from inside"
    read -r how at why <"$rec"
    [ "$how" = terminate ] || fail "$id: shut down with behaviour '$how'"
    # not before the promise ran out: the last "alive 15" came at most one period (15/4 s)
    # before the kill; a second for the clocks' rounding
    after=$(awk "BEGIN{print $at - $t_kill}")
    awk "BEGIN{exit !($after >= 15 - 15/4 - 1)}" || fail "$id shut itself down $after s after the kill: too early"
    echo "$id terminated itself $after s after tandem run was killed: $why"
done
echo "every instance of orphan-1 gone $(awk "BEGIN{printf \"%.1f\", $t_gone - $t_kill}") s after kill -9 of its supervisor (aws.orphan_timeout 15 s), with no tandem command run"
