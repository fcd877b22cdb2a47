#!/usr/bin/env bash
# cloud: the zone and the architecture of `executor: aws` instances, on the EC2 fixture
# (tests/lib/cloud.sh), every expectation computed here with boto3 from the answers the fixture
# gives (its DescribeSpotPriceHistory with per-zone prices set by cloud_spot_prices, moto's
# DescribeInstanceTypes), never from tandem's output:
# 1. aws.zones of a named spot type: the run's instance is in the cheapest zone the list allows
#    (EC2's Placement, read back with the AWS CLI), not the cheapest zone of all.
# 2. resources: with spot: the plan (--dry-run, nothing created) chooses the (type, zone) pair of
#    the lowest spot price among the x86_64 types that fit, and tries the type's zones cheapest
#    first.
# 3. resources: {arch: arm64} while tandem ships itself (no aws.tandem): refused before anything
#    is created, naming both architectures and the fix; with aws.tandem (an image with an arm64
#    tandem) the plan chooses the cheapest arm64 type that fits; {arch: any} is narrowed to this
#    tandem's own architecture.
set -uo pipefail
: "${TANDEM_BIN:?}"
SRC=${TANDEM_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
B=$TANDEM_BIN
. "$SRC/tests/lib/cloud.sh"
cloud_test_begin zones
export XDG_CACHE_HOME=$P/cache
count_all() { # both regions the test uses
    echo $(($(aws ec2 describe-instances --query 'length(Reservations[].Instances[])' --output text) +
        $(aws ec2 describe-instances --region us-west-2 --query 'length(Reservations[].Instances[])' --output text)))
}
aws ec2 create-key-pair --key-name tk --query KeyName --output text >/dev/null || fail "create-key-pair"
mkdir -p "$P/.tandem"
zones=($(aws ec2 describe-availability-zones --query 'AvailabilityZones[].ZoneName' --output text))
[ "${#zones[@]}" -ge 3 ] || fail "us-east-1 has ${#zones[@]} zones in the fixture: ${zones[*]}"
west=($(aws ec2 describe-availability-zones --region us-west-2 --query 'AvailabilityZones[].ZoneName' --output text))
[ "${#west[@]}" -ge 3 ] || fail "us-west-2 has ${#west[@]} zones in the fixture: ${west[*]}"
# per-zone spot prices (a type named here has none in the zones not named): t3.micro in us-east-1
# cheapest in zones[1], then zones[2], then zones[0]; in us-west-2 (where tandem's own table has
# no on-demand price: only the file's types are candidates) each type's cheapest zone differs
cloud_spot_prices "t3.micro ${zones[0]} 0.0090" "t3.micro ${zones[1]} 0.0020" "t3.micro ${zones[2]} 0.0050" \
    "t3.micro ${west[0]} 0.0090" "t3.micro ${west[1]} 0.0061" "t3.micro ${west[2]} 0.0050" \
    "t3.small ${west[0]} 0.0040" "t3.small ${west[1]} 0.0070" "t3.small ${west[2]} 0.0060" \
    "m5.large ${west[0]} 0.0300" "m5.large ${west[1]} 0.0035" "m5.large ${west[2]} 0.0300" \
    "t4g.small ${west[0]} 0.0010" "t4g.small ${west[1]} 0.0011" \
    "m6g.large ${west[0]} 0.0200" "m6g.large ${west[2]} 0.0008"
printf 'us-west-2 t3.micro 0.0104\nus-west-2 t3.small 0.0208\nus-west-2 m5.large 0.096\nus-west-2 t4g.small 0.0168\nus-west-2 m6g.large 0.077\n' >"$P/prices.txt"
# The cheapest (zone) or (type, zone) from boto3: ARGS: REGION TYPE|- ALLOWED_ZONES|- CPU MEM ARCH
reference() {
    sshd_exec "$CLOUD_PYTHON" - "$P/prices.txt" "$@" <<'PY'
import sys
import boto3
path, region, only, allowed, cpu, mem, arch = sys.argv[1:8]
ec2 = boto3.client("ec2", region_name=region)
priced = {l.split()[1] for l in open(path) if l.split()[0] == region}
if only != "-":
    names = [only]
else:
    types = ec2.describe_instance_types(InstanceTypes=sorted(priced))["InstanceTypes"]
    names = [t["InstanceType"] for t in types
             if arch in t["ProcessorInfo"]["SupportedArchitectures"]
             and t["VCpuInfo"]["DefaultVCpus"] >= float(cpu)
             and t["MemoryInfo"]["SizeInMiB"] / 1024 >= float(mem)]
best = []
for name in names:
    h = ec2.describe_spot_price_history(InstanceTypes=[name], ProductDescriptions=["Linux/UNIX"])
    newest = {}
    for e in h["SpotPriceHistory"]:
        z = e["AvailabilityZone"]
        if (allowed == "-" or z in allowed.split(",")) and (z not in newest or e["Timestamp"] > newest[z][0]):
            newest[z] = (e["Timestamp"], float(e["SpotPrice"]))
    best += [(p, name, z) for z, (_, p) in newest.items()]
p, name, z = min(best)
order = sorted((pp, zz) for pp, nn, zz in best if nn == name)
print(name, z, "%.5f" % p, ",".join(zz for _, zz in order))
PY
}
blk="image: $CLOUD_AMI, key_name: tk, user: root, address: private"
west_blk="image: $CLOUD_AMI, key_name: tk, region: us-west-2, prices: $P/prices.txt"
cat >"$P/.tandem/workflows.yaml" <<YAML
workflows:
  - name: zoned
    executor: aws
    aws: {$blk, instance_type: t3.micro, spot: true, zones: [${zones[0]}, ${zones[2]}]}
    command: "true"
  - name: pick
    executor: aws
    aws: {$west_blk, spot: true, resources: {cpu: 2, memory: 1}}
    command: "true"
  - name: arm
    executor: aws
    aws: {$west_blk, spot: true, resources: {cpu: 2, arch: arm64}}
    command: "true"
  - name: armimage
    executor: aws
    aws: {$west_blk, spot: true, tandem: /opt/tandem/bin/tandem, resources: {cpu: 2, arch: arm64}}
    command: "true"
  - name: anyarch
    executor: aws
    aws: {$west_blk, spot: true, resources: {cpu: 2, arch: any}}
    command: "true"
YAML

# --- 1. aws.zones: the cheapest allowed zone, where EC2 put the instance
read -r _ want_zone want_usd order < <(reference us-east-1 t3.micro "${zones[0]},${zones[2]}" 0 0 x86_64) || fail "the reference zone"
[ "$want_zone" = "${zones[2]}" ] || fail "the reference itself: $want_zone (the prices were not served per zone?)"
sshd_exec timeout -k 5 300 "$B" run zoned >"$P/zoned.log" 2>&1 || fail "tandem run zoned: exit $?"
got=$(aws ec2 describe-instances --filters Name=tag:tandem:run,Values=zoned-1 \
    --query 'Reservations[].Instances[].Placement.AvailabilityZone' --output text)
[ "$got" = "$want_zone" ] || fail "aws.zones [${zones[0]}, ${zones[2]}]: the instance is in '$got', not $want_zone"
grep -q "t3.micro spot is cheapest in $want_zone: \$$want_usd/h" "$P/zoned.log" || fail "the zone choice was not said: $(grep -i zone "$P/zoned.log")"
grep -q "zones in turn: ${order//,/ }$" "$P/zoned.log" || fail "the zones' order is not $order: $(grep 'in turn' "$P/zoned.log")"
echo "aws.zones [${zones[0]}, ${zones[2]}]: the instance went to $got (\$$want_usd/h; ${zones[1]}, cheaper, is not allowed)"

# --- 2. resources: the cheapest (type, zone)
n0=$(count_all)
read -r want_type want_zone want_usd order < <(reference us-west-2 - - 2 1 x86_64) || fail "the reference (type, zone)"
sshd_exec "$B" run pick --dry-run >"$P/pick.log" 2>&1 || fail "tandem run pick --dry-run: exit $?"
grep -q "^resources: chose $want_type (.*) for {cpu: 2, memory: 1}: \$$want_usd/h spot in $want_zone (spot price of $want_zone at " "$P/pick.log" ||
    fail "resources: not $want_type in $want_zone at \$$want_usd: $(cat "$P/pick.log")"
grep -q "instances   1 x $want_type, spot, in us-west-2, zones in turn ${order//,/, }" "$P/pick.log" ||
    fail "the plan's zones are not $order: $(grep instances "$P/pick.log")"
echo "resources {cpu: 2, memory: 1} spot: $want_type in $want_zone at \$$want_usd/h, zones $order"

# --- 3. arm64: refused while tandem ships itself; chosen with an image's tandem
out=$(sshd_exec "$B" run arm --dry-run 2>&1) && fail "arch: arm64 with a shipped $(uname -m) tandem was planned: $out"
grep -q "aws.resources asks for arm64 instances, but this tandem is an $(uname -m) binary and ships itself to the instances (no aws.tandem): it cannot run on arm64; use an image that has tandem built for arm64 (aws.image, and aws.tandem: its path there), or ask for arch: x86_64" <<<"$out" ||
    fail "the arm64 refusal: $out"
out=$(sshd_exec timeout -k 5 120 "$B" run arm 2>&1) && fail "arch: arm64 with a shipped tandem ran: $out"
grep -q "asks for arm64 instances, but this tandem is an $(uname -m) binary" <<<"$out" || fail "the run's arm64 refusal: $out"
[ "$(count_all)" = "$n0" ] || fail "a refused run created instances: $n0 before, $(count_all) after"
read -r want_type want_zone want_usd _ < <(reference us-west-2 - - 2 0 arm64) || fail "the reference (arm64)"
sshd_exec "$B" run armimage --dry-run >"$P/armimage.log" 2>&1 || fail "tandem run armimage --dry-run: exit $?"
grep -q "^resources: chose $want_type (.*) for {cpu: 2, arch: arm64}: \$$want_usd/h spot in $want_zone" "$P/armimage.log" ||
    fail "arm64 with an image's tandem: not $want_type in $want_zone: $(cat "$P/armimage.log")"
mine=$([ "$(uname -m)" = aarch64 ] && echo arm64 || uname -m)
read -r want_type want_zone want_usd _ < <(reference us-west-2 - - 2 0 "$mine") || fail "the reference (any)"
sshd_exec "$B" run anyarch --dry-run >"$P/anyarch.log" 2>&1 || fail "tandem run anyarch --dry-run: exit $?"
grep -q "^resources: chose $want_type (.*) for {cpu: 2, arch: any}: \$$want_usd/h spot in $want_zone .*(arch: any, narrowed to $mine" "$P/anyarch.log" ||
    fail "arch: any with a shipped tandem: not $want_type: $(cat "$P/anyarch.log")"
[ "$(count_all)" = "$n0" ] || fail "a plan created instances"
echo "arch: arm64 refused while tandem ships itself, nothing created; with an image's tandem: $(sed -n 's/^resources: chose \([^ ]*\).*/\1/p' "$P/armimage.log"); arch: any narrowed to $mine"
