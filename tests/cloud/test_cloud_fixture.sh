#!/usr/bin/env bash
# cloud: the EC2 fixture (tests/lib/cloud.sh) with the AWS CLI and boto3 only, no tandem.
# 1. Two t3.micro instances (default subnet, tagged, a user data script) become ssh hosts: `ssh
#    <private ip> hostname` answers the instance id; their addresses are in the default subnet;
#    their user data ran on each as root.
# 2. Their IMDSv2 from inside: a token, then instance-id, instance-type, availability zone,
#    local-ipv4; 401 without a token; spot/instance-action 404 until posted.
# 3. cloud_interrupt ID 1: the notice appears (action terminate, a time 1 s ahead), then the
#    instance is terminated (state reason Server.SpotInstanceTermination) and its host is gone;
#    cloud_rebalance on the other one.
# 4. A refused subnet (and a refused instance type) make run-instances fail with
#    InsufficientInstanceCapacity (HTTP 500) and create nothing; another subnet works (a spot
#    instance: its IMDS says so), and the refused one again once the refusal is cleared (with an
#    instance profile: its IMDS serves the role's credentials).
# 5. Terminating the rest tears every host down; cloud_down leaves no namespace, process or
#    state; a fixture whose test was SIGKILLed is torn down by its watcher.
set -uo pipefail
SRC=${TANDEM_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}

. "$SRC/tests/lib/cloud.sh"
trap cloud_down EXIT
fail() {
    echo "FAIL: $*" >&2
    cloud_logs 15
    exit 1
}
ms() { echo $(($(date +%s%N) / 1000000)); }
alive() { [ -e "/proc/$1" ] && ! grep -q '^State:.*Z' "/proc/$1/status" 2>/dev/null; }
aws() { sshd_exec "$CLOUD_AWS" "$@"; } # in the login namespace, where the endpoint is
state_of() { aws ec2 describe-instances --instance-ids "$1" --query 'Reservations[].Instances[].State.Name' --output text; }
# imds IP PATH: GET with a fresh token from inside the instance; prints "CODE BODY"
imds() {
    sshd_exec ssh "$1" 't=$(curl -sf -X PUT -H "X-aws-ec2-metadata-token-ttl-seconds: 60" http://169.254.169.254/latest/api/token) &&
        curl -s -w " %{http_code}" -H "X-aws-ec2-metadata-token: $t" http://169.254.169.254/latest/'"$2"
}
t_all=$(ms)

t0=$(ms)
cloud_up || fail "the fixture did not come up"
t_up=$(($(ms) - t0))
echo "cloud up in $t_up ms: $CLOUD_ENDPOINT (moto $CLOUD_MOTO_ENDPOINT), image $CLOUD_AMI," \
    "${#CLOUD_SUBNETS[@]} default subnets (${CLOUD_AZS[*]})"

# --- 1. two instances become hosts
t0=$(ms)
out=$(aws ec2 run-instances --image-id "$CLOUD_AMI" --count 2 --instance-type t3.micro \
    --tag-specifications 'ResourceType=instance,Tags=[{Key=tandem-test,Value=fixture}]' \
    --user-data "$(printf '#!/bin/sh\necho "ran on $(hostname) as $(id -un) in $PWD" >/root/user-data.out\n')" \
    --query 'Instances[].[InstanceId,PrivateIpAddress,SubnetId]' --output text) ||
    fail "run-instances: exit $?: $out"
t_run=$(($(ms) - t0))
read -r id1 ip1 sn1 id2 ip2 sn2 <<<"$(echo $out)"
[ -n "${sn2:-}" ] || fail "run-instances printed '$out'"
[ "$sn1" = "${CLOUD_SUBNETS[0]}" ] && [ "$sn2" = "$sn1" ] || fail "not in the default subnet ${CLOUD_SUBNETS[0]}: $out"
for ip in "$ip1" "$ip2"; do
    case $ip in 172.31.[0-9].* | 172.31.1[0-5].*) ;; *) fail "address $ip is outside the default subnet 172.31.0.0/20" ;; esac
done
for id in "$id1" "$id2"; do cloud_wait_host "$id" 60 || fail "no host for $id"; done
t_hosts=$(($(ms) - t0))
for pair in "$id1 $ip1" "$id2 $ip2"; do
    set -- $pair
    out=$(sshd_exec ssh "$2" hostname) || fail "ssh $2 hostname: exit $?"
    [ "$out" = "$1" ] || fail "ssh $2 hostname answered '$out', not $1"
    out=$(sshd_exec ssh "$1" hostname) || fail "ssh $1 hostname: exit $?"
    [ "$out" = "$1" ] || fail "ssh $1 hostname answered '$out'"
done
out=$(sshd_exec ssh "$ip1" "ssh $ip2 hostname; ip route show default") || fail "ssh $ip1 ssh $ip2: exit $?"
[ "$out" = "$(printf '%s\ndefault via 172.31.0.1 dev eth0 ' "$id2")" ] || fail "from $id1 to $id2: '$out'"
out=$(aws ec2 describe-instances --filters Name=tag:tandem-test,Values=fixture Name=instance-state-name,Values=running \
    --query 'Reservations[].Instances[].InstanceId' --output text | tr '\t' '\n' | sort | tr '\n' ' ')
[ "$out" = "$(printf '%s\n' "$id1" "$id2" | sort | tr '\n' ' ')" ] || fail "tagged running instances: '$out'"
echo "run-instances in $t_run ms; hosts $id1 ($ip1), $id2 ($ip2) answer ssh $((t_hosts)) ms after it"

# --- 2. IMDSv2 inside the instance
for pair in "$id1 $ip1 instance-id" "$id1 $ip1 local-ipv4" "$id2 $ip2 instance-type" \
    "$id2 $ip2 placement/availability-zone"; do
    set -- $pair
    case $3 in instance-id) want=$1 ;; local-ipv4) want=$2 ;; instance-type) want=t3.micro ;; *) want=${CLOUD_AZS[0]} ;; esac
    out=$(imds "$2" "meta-data/$3") || fail "IMDS $3 on $1: exit $?: $out"
    [ "$out" = "$want 200" ] || fail "IMDS $3 on $1: '$out', not '$want 200'"
done
out=$(sshd_exec ssh "$ip1" 'curl -s -o /dev/null -w %{http_code} http://169.254.169.254/latest/meta-data/instance-id')
[ "$out" = 401 ] || fail "IMDS without a token answered $out, not 401"
out=$(sshd_exec ssh "$ip1" 'curl -s -o /dev/null -w %{http_code} -H "X-aws-ec2-metadata-token: forged" http://169.254.169.254/latest/meta-data/instance-id')
[ "$out" = 401 ] || fail "IMDS with a forged token answered $out, not 401"
out=$(imds "$ip1" meta-data/spot/instance-action) && [ "${out##* }" = 404 ] || fail "spot/instance-action before a notice: '$out'"
out=$(imds "$ip2" meta-data/events/recommendations/rebalance) && [ "${out##* }" = 404 ] || fail "rebalance before a notice: '$out'"
for pair in "$id1 $ip1" "$id2 $ip2"; do
    set -- $pair
    sshd_wait 10 "the user data of $1" sshd_exec ssh "$2" test -s /root/user-data.out || fail "no user data ran on $1"
    out=$(sshd_exec ssh "$2" cat /root/user-data.out)
    [ "$out" = "ran on $1 as root in /" ] || fail "user data on $1: '$out'"
done
out=$(imds "$ip1" user-data) && [[ $out == '#!/bin/sh'*' 200' ]] || fail "user-data in the IMDS: '$out'"
echo "user data ran on both as root; IMDSv2 on both: token, instance-id, local-ipv4, instance-type, zone; 401 without a token; 404 before notices"

# --- 3. a spot interruption, 1 s ahead (a poller with its token in place reads the notice)
sshd_exec ssh "$ip1" 't=$(curl -sf -X PUT -H "X-aws-ec2-metadata-token-ttl-seconds: 60" http://169.254.169.254/latest/api/token)
    echo polling; for i in $(seq 600); do
      curl -sf -H "X-aws-ec2-metadata-token: $t" http://169.254.169.254/latest/meta-data/spot/instance-action && exit
      sleep 0.05; done' >"$TSH_STATE/notice" 2>&1 &
poller=$! n1=$(sshd_host_index "$id1")
sshd_wait 20 "the IMDS poller" grep -q polling "$TSH_STATE/notice" || fail "the poller did not start"
t0=$(ms)
cloud_interrupt "$id1" 1 || fail "cloud_interrupt: exit $?"
sshd_wait 10 "the spot notice" grep -q '"action": "terminate"' "$TSH_STATE/notice" || fail "no notice: $(cat "$TSH_STATE/notice")"
t_notice=$(($(ms) - t0))
notice=$(tail -n1 "$TSH_STATE/notice")
when=$(sed -n 's/.*"time": "\([^"]*\)".*/\1/p' <<<"$notice")
d=$(($(date -u -d "$when" +%s) - t0 / 1000))
# the notice's time is in whole seconds, at or after now+1 when the fixture posts it, and t0 is
# cut to whole seconds here: up to 3 s apart on a busy machine
[ $d -ge 0 ] && [ $d -le 3 ] || fail "notice time $when is $d s from the interruption: $notice"
cloud_wait_gone "$id1" 30 || fail "the host of $id1 is still there"
t_gone=$(($(ms) - t0))
[ $t_gone -ge 1000 ] || fail "the host of $id1 went $t_gone ms after the interruption, before its time"
wait "$poller" 2>/dev/null
[ "$(state_of "$id1")" = terminated ] || fail "$id1 is $(state_of "$id1") in moto, not terminated"
reason=$(aws ec2 describe-instances --instance-ids "$id1" --query 'Reservations[].Instances[].StateReason.Code' --output text)
[ "$reason" = Server.SpotInstanceTermination ] || fail "$id1's state reason: '$reason'"
sshd_exec ssh -o ConnectTimeout=2 "$ip1" true 2>/dev/null && fail "ssh $ip1 still answers"
ip netns list | grep -q "^tsh-$$-h$n1\b" && fail "the namespace of $id1 (tsh-$$-h$n1) is left"
cloud_rebalance "$id2" || fail "cloud_rebalance: exit $?"
out=$(imds "$ip2" meta-data/events/recommendations/rebalance)
[[ $out =~ ^\{\"noticeTime\":\ \"[0-9T:-]+Z\"\}\ 200$ ]] || fail "rebalance: '$out'"
[ "$(sshd_exec ssh "$ip2" hostname)" = "$id2" ] || fail "$id2 suffered from $id1's end"
echo "cloud_interrupt $id1 1: notice after $t_notice ms ($notice), terminated ($reason) and host gone after $t_gone ms;" \
    "rebalance on $id2: ${out% 200}"

# --- 4. capacity refusals
# (one attempt: the CLI and boto3 retry an HTTP 500 up to 4 times, as against EC2)
before=$(aws ec2 describe-instances --query 'length(Reservations[].Instances[])' --output text)
cloud_refuse_capacity "${CLOUD_SUBNETS[1]}" c5.large
out=$(AWS_MAX_ATTEMPTS=1 aws ec2 run-instances --image-id "$CLOUD_AMI" --count 1 --instance-type t3.micro \
    --subnet-id "${CLOUD_SUBNETS[1]}" 2>&1) && fail "run-instances in a refused subnet succeeded: $out"
grep -q 'InsufficientInstanceCapacity' <<<"$out" || fail "refused subnet: '$out'"
echo "refused subnet ${CLOUD_SUBNETS[1]}: $(echo $out)"
out=$(sshd_exec "$CLOUD_PYTHON" -c 'import boto3, botocore.config, botocore.exceptions, sys
ec2 = boto3.client("ec2", config=botocore.config.Config(retries={"total_max_attempts": 1}))
try:
    ec2.run_instances(ImageId=sys.argv[1], MinCount=1, MaxCount=1, InstanceType="c5.large")
except botocore.exceptions.ClientError as e:
    print(e.response["Error"]["Code"], e.response["ResponseMetadata"]["HTTPStatusCode"],
          bool(e.response["ResponseMetadata"].get("RequestId")))' "$CLOUD_AMI") || fail "boto3: $out"
[ "$out" = "InsufficientInstanceCapacity 500 True" ] || fail "refused instance type, boto3 saw '$out'"
by_type=$out
after=$(aws ec2 describe-instances --query 'length(Reservations[].Instances[])' --output text)
[ "$after" = "$before" ] || fail "refused launches created instances: $before -> $after"
out=$(aws ec2 run-instances --image-id "$CLOUD_AMI" --count 1 --instance-type t3.micro \
    --instance-market-options MarketType=spot --subnet-id "${CLOUD_SUBNETS[2]}" --query 'Instances[0].[InstanceId,PrivateIpAddress]' --output text) ||
    fail "run-instances in ${CLOUD_SUBNETS[2]} (not refused): $out"
read -r id3 ip3 <<<"$out"
cloud_refuse_capacity
aws iam create-instance-profile --instance-profile-name tandem-node >/dev/null || fail "create-instance-profile"
out=$(aws ec2 run-instances --image-id "$CLOUD_AMI" --count 1 --instance-type t3.micro \
    --iam-instance-profile Name=tandem-node --subnet-id "${CLOUD_SUBNETS[1]}" --query 'Instances[0].[InstanceId,PrivateIpAddress]' --output text) ||
    fail "run-instances in ${CLOUD_SUBNETS[1]} after clearing: $out"
read -r id4 ip4 <<<"$out"
case "$ip3 $ip4" in "172.31.3"[2-9].*" 172.31."1[6-9].* | "172.31.4"[0-7].*" 172.31.3"[01].*) ;; *)
    fail "addresses $ip3 ($id3) and $ip4 ($id4) are not in 172.31.32.0/20 and 172.31.16.0/20" ;; esac
for id in "$id3" "$id4"; do cloud_wait_host "$id" 60 || fail "no host for $id"; done
[ "$(sshd_exec ssh "$ip3" hostname)" = "$id3" ] || fail "ssh $ip3 hostname"
out=$(imds "$ip3" meta-data/instance-life-cycle) && [ "$out" = "spot 200" ] || fail "the spot instance's life cycle: '$out'"
out=$(imds "$ip4" meta-data/iam/security-credentials/) && [ "$out" = "tandem-node 200" ] || fail "the role of $id4: '$out'"
out=$(imds "$ip4" meta-data/iam/security-credentials/tandem-node) && [[ $out == *'"Code": "Success"'*'"Token": '* ]] ||
    fail "the credentials of $id4: '$out'"
echo "c5.large refused too (boto3: $by_type); ${CLOUD_SUBNETS[2]} works: $id3 ($ip3, spot);" \
    "cleared, ${CLOUD_SUBNETS[1]} works: $id4 ($ip4, its role's credentials in its IMDS)"

# --- 5. terminate the rest; cloud_down
t0=$(ms)
aws ec2 terminate-instances --instance-ids "$id2" "$id3" "$id4" >/dev/null || fail "terminate-instances"
for id in "$id2" "$id3" "$id4"; do cloud_wait_gone "$id" 30 || fail "the host of $id is left"; done
t_term=$(($(ms) - t0))
left=$(ip netns list | grep -c "^tsh-$$-")
[ "$left" = 1 ] || fail "namespaces besides the login one: $(ip netns list | grep "^tsh-$$-")"
[ -z "$(cloud_hosts)" ] || fail "hosts left: $(cloud_hosts)"
state=$TSH_STATE pids=$(cat "$TSH_STATE"/cloud/*.pid "$TSH_STATE/login.pid" | tr '\n' ' ')
t0=$(ms)
cloud_down
t_down=$(($(ms) - t0))
cloud_down # idempotent
ip netns list | grep -q "^tsh-$$-" && fail "namespaces left: $(ip netns list | grep "^tsh-$$-")"
[ ! -e "$state" ] || fail "$state is left"
for p in $pids; do alive "$p" && fail "process $p still runs: $(tr '\0' ' ' <"/proc/$p/cmdline")"; done
pgrep -f "tandem-ssh-$$/" >/dev/null && fail "processes left: $(pgrep -af "tandem-ssh-$$/")"
echo "terminate-instances: 3 hosts gone in $t_term ms; cloud_down in $t_down ms: nothing left"

# --- a test killed by SIGKILL: its watcher tears its fixture down
work=$(mktemp -d /tmp/tandem-cloud-fix-XXXXXX)
bash -c '. "$1"; cloud_up || exit; echo "$TSH_STATE" >"$2"; exec sleep 1000' sh "$SRC/tests/lib/cloud.sh" \
    "$work/child" </dev/null >"$work/child.log" 2>&1 &
old=$!
sshd_wait 120 "a second fixture" test -s "$work/child" || fail "a second fixture did not come up: $(cat "$work/child.log")"
t0=$(ms)
{ kill -9 "$old" && wait "$old"; } 2>/dev/null
sshd_wait 20 "the killed fixture's teardown" sh -c "! ip netns list | grep -q '^tsh-$old-' && [ ! -e '$(cat "$work/child")' ]" ||
    fail "the fixture of the killed test $old is left: $(ip netns list | grep "^tsh-$old-")"
t_kill=$(($(ms) - t0))
rm -rf "$work"
echo "a SIGKILLed test's fixture torn down by its watcher in $t_kill ms"
echo "ok: up $t_up ms, run-instances $t_run ms, 2 hosts $t_hosts ms, notice $t_notice ms," \
    "interruption to host gone $t_gone ms, 3 terminations $t_term ms, down $t_down ms;" \
    "total $(($(ms) - t_all)) ms"
