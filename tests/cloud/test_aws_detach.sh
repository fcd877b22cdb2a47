#!/usr/bin/env bash
# cloud: `tandem run -d` of an aws run lives in the cloud (issue 31; docs/runs.md, "A run that
# lives in the cloud"; docs/cloud.md, "The controller"), on the EC2 fixture (tests/lib/cloud.sh).
# What tandem did is checked with the AWS CLI of the fixture's venv, never with tandem's own
# account; the weights against 2 local workers, train/loss against the step count.
# The submitter (the laptop) is a network namespace of its own behind the fixture's login
# namespace (a veth, 10.254.0.2, routed through the login namespace to 172.31.0.0/16), with the
# login namespace's mounts (its ssh keys): cutting its route to the instances leaves it 172.31.0.1
# (EC2 and S3, as a laptop reaches AWS) and nothing else, while the fixture itself (its watcher
# checks each new host over ssh from the login namespace) and the instances (which reach EC2 and
# S3 at 172.31.0.1 as they would reach AWS) are untouched.
# 1. A 2-node spot run submitted with -d: the submitter returns with the run's id and leaves
#    no tandem process behind in its namespace (any found is killed -9 and named); its route to
#    every instance is then cut (ssh to the controller fails from it).
#    A spot interruption of node 1 meanwhile: the controller replaces it and the run resumes.
#    The run ends on its own: its store in S3 says succeeded (read with the AWS CLI). Then, with
#    the route still cut, `tandem show/metrics/artifacts` on the submitter attach through S3:
#    succeeded, restarts 1, train/loss steps 1..240 once each, the artifact equal (cmp) to 2
#    local workers' uninterrupted weights, the record showing the interrupted instance and its
#    replacement. The AWS CLI finds nothing left running, the controller included (it
#    terminated itself: its dead-man's switch, state reason Client.InstanceInitiatedShutdown).
# 2. tandem stop from the submitter of a detached run (route cut again after the submission):
#    asked through S3, the run ends stopped, nothing left running.
# 3. -d of an aws workflow without an S3 checkpoint_dir: refused, naming the fix, nothing made.
set -uo pipefail
: "${TANDEM_BIN:?}" "${TANDEM_DATA:?}"
SRC=${TANDEM_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
B=$TANDEM_BIN
. "$SRC/tests/lib/cloud.sh"
LAPTOP_NS=tsh-laptop-$$
cloud_test_cleanup() { ip netns del "$LAPTOP_NS" 2>/dev/null; }
cloud_test_logs() {
    for c in ${ctl:-} ${ctl2:-}; do
        echo "--- controller $c"
        cloud_host_exec "$c" sh -c 'tail -20 /root/.tandem-controller/*/run.log; tail -40 /root/.tandem-controller/*/project/.tandem/runs/*/logs/supervisor.log; tail -3 /dev/shm/tandem-orphan.log'
    done
}
cloud_test_begin detach
tagged() { cloud_tagged "$@"; }
alive_all() {
    aws ec2 describe-instances --filters "Name=instance-state-name,Values=pending,running,stopping,stopped" \
        --query 'Reservations[].Instances[].InstanceId' --output text | tr '\t' '\n' | sed '/^$/d' | sort
}
# the run's status as its store in S3 says (the controller's run.json), read with the AWS CLI
store_status() {
    aws s3 cp "s3://tandem-ckpt/long/$1/.tandem-run/run/run.json" - 2>/dev/null |
        "$CLOUD_PYTHON" -c 'import json,sys; print(json.load(sys.stdin)["status"])' 2>/dev/null
}
# the submitter's namespace: behind the login namespace, with its mounts
LOGIN_PID=$(cat "$TSH_STATE/login.pid")
LOGIN_NS=$(ip netns identify "$LOGIN_PID")
[ -n "$LOGIN_NS" ] || fail "the login namespace has no name"
ip netns add "$LAPTOP_NS" &&
    ip -n "$LOGIN_NS" link add lp0 type veth peer name eth0 netns "$LAPTOP_NS" &&
    ip -n "$LOGIN_NS" addr add 10.254.0.1/30 dev lp0 && ip -n "$LOGIN_NS" link set lp0 up &&
    ip -n "$LAPTOP_NS" addr add 10.254.0.2/30 dev eth0 && ip -n "$LAPTOP_NS" link set eth0 up &&
    ip -n "$LAPTOP_NS" link set lo up &&
    ip -n "$LAPTOP_NS" route add 172.31.0.0/16 via 10.254.0.1 &&
    ip netns exec "$LOGIN_NS" sysctl -qw net.ipv4.ip_forward=1 || fail "the submitter's namespace"
laptop() { nsenter -t "$LOGIN_PID" -m -u --net="/run/netns/$LAPTOP_NS" --wd="$PWD" -- "$@"; }
# its route to the instances: cut (172.31.0.1 alone: EC2 and S3) or whole again
cut_route() {
    ip -n "$LAPTOP_NS" route del 172.31.0.0/16 && ip -n "$LAPTOP_NS" route add 172.31.0.1/32 via 10.254.0.1
}
restore_route() {
    ip -n "$LAPTOP_NS" route del 172.31.0.1/32 2>/dev/null
    ip -n "$LAPTOP_NS" route add 172.31.0.0/16 via 10.254.0.1 2>/dev/null
}
# tandem processes of the submitter's namespace, killed -9 and named
kill_submitter_side() {
    local net pid found=
    net=$(laptop readlink /proc/self/ns/net)
    for pid in $(pgrep -f "$(readlink -f "$B")"); do
        [ "$(readlink "/proc/$pid/ns/net" 2>/dev/null)" = "$net" ] || continue
        found="$found $pid:$(tr '\0' ' ' <"/proc/$pid/cmdline" | cut -c1-80)"
        kill -9 "$pid" 2>/dev/null
    done
    echo "${found:-none}"
}

aws ec2 create-key-pair --key-name tk --query KeyName --output text >/dev/null || fail "create-key-pair"
aws s3 mb s3://tandem-ckpt >/dev/null || fail "s3 mb"
export TANDEM_SHUTDOWN_CMD=$SRC/tests/lib/cloud_shutdown.sh
export XDG_CACHE_HOME=$P/cache # the bundle of tandem shipped to the controller is cached here
mkdir -p "$P/.tandem"
train="tandem train --model basicnet --data $TANDEM_DATA --batch 128 --threads 1 --seed 7 --no-progress"
aws_block="instance_type: t3.micro, image: $CLOUD_AMI, key_name: tk, user: root, spot: true, address: private, orphan_timeout: 60s"
cat >"$P/.tandem/workflows.yaml" <<EOF
workflows:
  - name: long
    executor: aws
    nodes: 2
    aws: {$aws_block}
    checkpoint_dir: s3://tandem-ckpt/long
    commands:
      - mkdir -p out
      - $train --steps 240 --checkpoint-dir "\$TANDEM_CHECKPOINT_DIR" --checkpoint-every 10 --save out/w.safetensors
    artifacts: [out/w.safetensors]
  - name: sleepy
    executor: aws
    aws: {$aws_block}
    checkpoint_dir: s3://tandem-ckpt/long
    command: echo started; sleep 600
  - name: nostore
    executor: aws
    aws: {$aws_block}
    command: "true"
EOF

# --- 3. no S3 store: refused before anything is made
n0=$(aws ec2 describe-instances --query 'length(Reservations[].Instances[])' --output text)
out=$(laptop timeout -k 5 60 "$B" run nostore -d 2>&1) && fail "nostore -d succeeded: $out"
grep -q "checkpoint_dir: s3://BUCKET/PREFIX" <<<"$out" || fail "nostore -d: $out"
[ "$(aws ec2 describe-instances --query 'length(Reservations[].Instances[])' --output text)" = "$n0" ] ||
    fail "a refused -d created an instance"
echo "-d without an S3 checkpoint_dir: refused ($(grep -o 'set checkpoint_dir[^(]*' <<<"$out")), nothing created"

# --- 1. submitted with -d, the submitter gone, the route cut, node 1 interrupted
t_submit=$(date +%s)
R=$(laptop timeout -k 5 300 "$B" run long -d 2>"$P/submit.log") || fail "tandem run long -d: exit $?"
[ "$R" = long-1 ] || fail "tandem run -d printed '$R'"
echo "submitted $R with -d in $(($(date +%s) - t_submit)) s: $(grep -o 'handed to the controller i-[0-9a-f]*' "$P/submit.log")"
ctl=$(tagged tandem:controller "$R")
[ "$(wc -w <<<"$ctl")" = 1 ] || fail "controller instances: '$ctl'"
ctl_ip=$(aws ec2 describe-instances --instance-ids "$ctl" \
    --query 'Reservations[].Instances[].[InstanceLifecycle,PrivateIpAddress]' --output text)
[ "$(cut -f1 <<<"$ctl_ip")" = None ] || fail "the controller is not on demand: $ctl_ip"
ctl_ip=$(cut -f2 <<<"$ctl_ip")
# tandem itself reached the controller as its bundle (the image has none; /root is its own)
grep -q "tandem shipped to the controller $ctl in .* s (.* MB): /root/.cache/tandem/bundles/[0-9a-f]*/tandem$" "$P/submit.log" ||
    fail "no line of tandem shipped to the controller: $(grep -i 'ship\|bundle' "$P/submit.log")"
sup_exe=$(cloud_host_exec "$ctl" sh -c 'for p in /proc/[0-9]*; do
    e=$(readlink "$p/exe" 2>/dev/null); case "$e" in /root/.cache/tandem/bundles/*/bin/tandem) echo "$e"; break ;; esac; done')
[ -n "$sup_exe" ] || fail "no process of the bundle's tandem on the controller"
echo "the controller runs the submitter's tandem, shipped: $sup_exe"
echo "the submitter's tandem processes left (killed -9): $(kill_submitter_side)"
cut_route || fail "cutting the login namespace's route"
laptop timeout 20 ssh -o BatchMode=yes -o ConnectTimeout=5 -o StrictHostKeyChecking=no \
    -o UserKnownHostsFile=/dev/null "$ctl_ip" true 2>/dev/null && fail "the login namespace still reaches the controller"
echo "route cut: ssh $ctl_ip from the submitter's namespace fails; S3 and EC2 still answer there"
commits() { aws s3 ls "s3://tandem-ckpt/long/$R/" | sed -n 's/.*ckpt-\([0-9]*\)\.tdck\.commit$/\1/p' | sort -n; }
for _ in $(seq 1 1500); do
    c=$(commits | tail -1) # one listing per look: the CLI's start is most of a look's time
    [ -n "$c" ] && [ "$c" -ge 20 ] && break
    [ -n "$(tagged tandem:controller "$R")" ] || fail "the controller is gone before step 20"
    sleep 0.2
done
before=$(commits | tail -1)
[ "${before:-0}" -ge 20 ] || fail "no committed checkpoint at step 20: $(aws s3 ls --recursive s3://tandem-ckpt/long/)"
old1=$(tagged tandem:run "$R" running | while read -r id; do
    [ "$(aws ec2 describe-instances --instance-ids "$id" --query 'Reservations[].Instances[].Tags[?Key==`tandem:node`]|[0][0].Value' --output text)" = 1 ] && echo "$id"
done)
[ -n "$old1" ] || fail "no running instance of node 1"
t_notice=$(date +%s)
cloud_interrupt "$old1" 40 || fail "cloud_interrupt"
echo "interruption notice on node 1 ($old1) at checkpoint $before, the submitter away"
# live while it runs: the submitter's verbs attach through S3, the route still cut
grep "^$R " <<<"$(laptop "$B" ps 2>&1)" | grep -q running || fail "tandem ps: $(laptop "$B" ps 2>&1)"
n_live=$(laptop "$B" metrics "$R" --key train/loss --csv | tail -n +2 | wc -l)
[ "$n_live" -ge 20 ] || fail "tandem metrics while it runs: $n_live train/loss points"
echo "live while it runs: tandem ps says running, tandem metrics has $n_live train/loss points"
for _ in $(seq 1 3000); do
    case "$(store_status "$R")" in succeeded | failed | stopped | preempted) break ;; esac
    sleep 0.2
done
st=$(store_status "$R")
[ "$st" = succeeded ] || fail "the run's store says '$st' after 600 s"
echo "the run ended on its own: its store in S3 says $st, $(($(date +%s) - t_notice)) s after the notice"
# The controller puts itself in the run's record after the run has ended, and the end reaches
# the store only with that last push (a pass as the run goes holds an ended run.json back): so
# the store that says the run ended has the controller in its instances already (once in CI,
# before that, an earlier pass carried the end and the attach pulled a record without it).
aws s3 cp "s3://tandem-ckpt/long/$R/.tandem-run/run/instances.json" - 2>/dev/null |
    grep -q "\"$ctl\"" ||
    fail "the store says the run ended, but its instances.json lacks the controller $ctl"

# attach from the submitter, the route still cut
show=$(laptop "$B" show "$R" 2>"$P/show.err") || fail "tandem show $R: $(cat "$P/show.err")"
grep -q '^status  *succeeded' <<<"$show" || fail "show: $show"
grep -q '^restarts  *1$' <<<"$show" || fail "restarts: $show"
steps=$(laptop "$B" metrics "$R" --key train/loss --csv | tail -n +2 | cut -d, -f3 | sort -n | tr '\n' ' ')
[ "$steps" = "$(seq 1 240 | tr '\n' ' ')" ] || fail "train/loss steps are not 1..240 once each: $(wc -w <<<"$steps") points"
RD=$P/.tandem/runs/$R
[ -s "$RD/artifacts/out/w.safetensors" ] || fail "the artifact did not come back: $(ls -R "$RD")"
laptop "$B" artifacts "$R" | grep -q 'out/w.safetensors' || fail "tandem artifacts does not list it"
timeout -k 5 400 "$B" launch --standalone --nproc-per-node 2 -- "$B" ${train#tandem } --steps 240 \
    --save "$P/w-local.safetensors" >"$P/local.log" 2>&1 || fail "2 local workers, 240 steps"
cmp "$RD/artifacts/out/w.safetensors" "$P/w-local.safetensors" || fail "weights differ from the uninterrupted run"
new1=$(tagged tandem:run "$R" pending,running,stopping,stopped,shutting-down,terminated | grep -v "^$old1$" |
    while read -r id; do
        [ "$(aws ec2 describe-instances --instance-ids "$id" --query 'Reservations[].Instances[].Tags[?Key==`tandem:node`]|[0][0].Value' --output text)" = 1 ] && echo "$id"
    done)
[ "$(wc -w <<<"$new1")" = 1 ] || fail "node 1's replacement: '$new1'"
"$CLOUD_PYTHON" - "$RD/instances.json" "$old1" "$new1" "$ctl" <<'PY' || fail "the record: $(cat "$RD/instances.json")"
import json, sys
rec = {i["id"]: i for i in json.load(open(sys.argv[1]))["instances"]}
old, new, ctl = rec[sys.argv[2]], rec[sys.argv[3]], rec[sys.argv[4]]
assert old["end"].startswith("interrupted"), old
assert new["replaces"] == sys.argv[2] and new["node"] == 1, new
assert all(i["ended_s"] for i in rec.values()), rec
# the controller is in the run's cost: on demand, priced (tandem's table has t3.micro), no node
assert ctl["node"] is None and ctl["market"] == "on-demand" and ctl["usd_per_hour"] > 0, ctl
PY
echo "attached with the route cut: succeeded, restarts 1, steps 1..240 once each, the artifact == 2 local workers (cmp), $new1 replaced $old1, the controller $ctl in the record"
# issue 31's measure, from the pulled store: notice to the first step of the resumed attempt
resumed=$(sed -n 's/.*resuming from .*ckpt-\([0-9]*\)\.tdck.*/\1/p' "$RD/logs/rank-0.log" | tail -1)
[ -n "$resumed" ] || fail "rank 0 did not resume from a checkpoint: $(tail -5 "$RD/logs/rank-0.log")"
t_first=$(laptop "$B" metrics "$R" --key train/loss --csv | awk -F, -v s=$((resumed + 1)) '$3 == s {print $5; exit}')
[ -n "$t_first" ] && echo "replacement under the controller: notice to the first resumed step ($((resumed + 1))): $(awk "BEGIN{printf \"%.1f\", $t_first - $t_notice}") s"
t0=$SECONDS
while [ $((SECONDS - t0)) -lt 120 ] && [ -n "$(alive_all)" ]; do sleep 0.5; done
[ -z "$(alive_all)" ] || fail "still alive after the run: $(alive_all)"
why=$(aws ec2 describe-instances --instance-ids "$ctl" --query 'Reservations[].Instances[].[State.Name,StateReason.Code]' --output text)
[ "$why" = "$(printf 'terminated\tClient.InstanceInitiatedShutdown')" ] || fail "the controller $ctl: '$why'"
echo "nothing left running (AWS CLI): the nodes terminated by the controller, the controller $ctl by itself ($why)"
restore_route

# --- 2. tandem stop from the submitter, through the store
R2=$(laptop timeout -k 5 300 "$B" run sleepy -d 2>"$P/submit2.log") || fail "tandem run sleepy -d: exit $?"
ctl2=$(tagged tandem:controller "$R2")
echo "the submitter's tandem processes left (killed -9): $(kill_submitter_side)"
cut_route || fail "cutting the route again"
for _ in $(seq 1 600); do
    laptop "$B" logs "$R2" 2>/dev/null | grep -q started && break
    sleep 0.5
done
laptop "$B" logs "$R2" 2>/dev/null | grep -q started || fail "$R2's worker never said it started"
out=$(laptop timeout -k 5 200 "$B" stop "$R2" --wait 150 2>&1) || fail "tandem stop $R2: $out"
grep -q "run $R2 stopped" <<<"$out" || fail "tandem stop: $out"
grep -q '^status  *stopped' <<<"$(laptop "$B" show "$R2")" || fail "show $R2: $(laptop "$B" show "$R2")"
t0=$SECONDS
while [ $((SECONDS - t0)) -lt 120 ] && [ -n "$(alive_all)" ]; do sleep 0.5; done
[ -z "$(alive_all)" ] || fail "still alive after the stop: $(alive_all)"
echo "tandem stop of a detached run, the route cut: '$out'; nothing left running, the controller $ctl2 included"
restore_route
