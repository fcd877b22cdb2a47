#!/usr/bin/env bash
# executors: `tandem run --executor aws ... -- python3 script.py` (issue 30) on the EC2 fixture
# (tests/lib/cloud.sh: moto's EC2, each running instance a host of its own with sshd and
# IMDSv2; the project hidden from the instances): no workflow file, the instances' settings as
# flags and the rest in --set. The script asks the instance's own IMDS for its id: the rank ran
# on the instance the run's record (instances.json) names, tagged with the run and terminated
# at the end; NODE_RANK/NUM_NODES are set there; --artifact brings its output into the store.
set -uo pipefail
: "${TANDEM_BIN:?}"
SRC=${TANDEM_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
B=$TANDEM_BIN
. "$SRC/tests/lib/cloud.sh"
P=$(mktemp -d /tmp/tandem-runcmd-aws-XXXXXX)
cleanup() {
    cloud_down
    rm -rf "$P"
}
trap cleanup EXIT
fail() {
    echo "FAIL: $*" >&2
    for f in "$P"/*.log "$P"/.tandem/runs/*/logs/*; do [ -f "$f" ] && { echo "--- $f" >&2; tail -25 "$f" >&2; }; done
    cloud_logs 10
    exit 1
}
export TANDEM_HOME=$P
cloud_up "$P" || fail "the fixture did not come up"
aws() { sshd_exec "$CLOUD_AWS" "$@"; }
aws ec2 create-key-pair --key-name tk --query KeyName --output text >/dev/null || fail "create-key-pair"
mkdir -p "$P/.tandem"
cat >"$P/iid.py" <<'EOF'
import os, urllib.request
base = "http://169.254.169.254/latest"
tok = urllib.request.urlopen(urllib.request.Request(base + "/api/token", method="PUT",
      headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"}), timeout=10).read().decode()
iid = urllib.request.urlopen(urllib.request.Request(base + "/meta-data/instance-id",
      headers={"X-aws-ec2-metadata-token": tok}), timeout=10).read().decode()
os.makedirs("out", exist_ok=True)
line = "rank=%s node=%s/%s instance=%s" % (os.environ["RANK"], os.environ.get("NODE_RANK"),
                                         os.environ.get("NUM_NODES"), iid)
print(line, flush=True)
open("out/iid.txt", "w").write(line + "\n")
EOF
cd "$P" || fail "cd"
sshd_exec timeout -k 5 240 "$B" run --executor aws --instance-type t3.micro --image "$CLOUD_AMI" \
    --key-name tk --spot --set aws.user=root --set aws.address=private --artifact out/iid.txt \
    -- python3 iid.py >"$P/run.log" 2>&1 || fail "tandem run --executor aws: exit $?"
R=$P/.tandem/runs/iid-1
show=$("$B" show iid-1) || fail "tandem show iid-1"
grep -q '^status  *succeeded' <<<"$show" || fail "iid-1 did not succeed: $show"
id=$(sed -n 's/.*instance=\(i-[0-9a-f]*\).*/\1/p' "$R/artifacts/out/iid.txt")
[ -n "$id" ] || fail "no instance id in the artifact: $(cat "$R/artifacts/out/iid.txt" 2>&1)"
grep -q 'rank=0 node=0/1 ' "$R/artifacts/out/iid.txt" || fail "NODE_RANK/NUM_NODES: $(cat "$R/artifacts/out/iid.txt")"
grep -q "$id" "$R/instances.json" || fail "the rank's instance $id is not in the record: $(cat "$R/instances.json")"
tagged=$(aws ec2 describe-instances --filters "Name=tag:tandem:run,Values=iid-1" \
    --query 'Reservations[].Instances[].[InstanceId,InstanceLifecycle,State.Name]' --output text)
[ "$tagged" = "$(printf '%s\tspot\tterminated' "$id")" ] || fail "instances of the run: '$tagged'"
echo "tandem run --executor aws -- python3 iid.py: ran on spot instance $id (IMDS), in the run's record, terminated"
echo OK
