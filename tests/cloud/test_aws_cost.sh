#!/usr/bin/env bash
# cloud: what a run's instances cost, on the EC2 fixture (tests/lib/cloud.sh; docs/cloud.md,
# "What it costs"). The prices are the fixture's, read with boto3/the AWS CLI of its venv:
# moto's DescribeSpotPriceHistory for spot, and an aws.prices file of the test's own for on
# demand (a price tandem's table does not have, so that the file is what is used).
# 1. A spot run: each instance's recorded price is the spot price EC2 (moto) gives for its type
#    and zone, its launch is the one EC2 gives, and the record's cost_usd and `tandem show`'s
#    total are that price times the recorded hours.
# 2. An on-demand run with aws.prices: the price is the file's line; the cost is price x hours.
# 3. A malformed aws.prices line fails the run's pricing with a warning naming the file and
#    line, and the run still succeeds (the cost leaves the instance out).
# 4. tandem run --dry-run prints the plan (instances, market, the hourly price and the estimate
#    for max_duration from the same prices, what is created, the permissions) and creates
#    nothing: EC2 (moto) reports as many instances before as after; a local workflow is refused.
# 5. resources: in a plan (us-west-2, where tandem's own table has no prices: the file's are all
#    there is) the type chosen is the cheapest of the file's types that have what is asked,
#    as computed here from boto3's DescribeInstanceTypes; a GPU model narrows it; an impossible
#    request is refused naming it and the closest types.
# 6. resources: in a real run: the instance EC2 (moto) reports is of the type computed the same
#    way (a request above every type of tandem's table but p4d.24xlarge, which the file prices).
# 7. nproc_per_node: gpu|cpu|auto (issue 30), plans only: counted from the instance type, with
#    the counts computed here from boto3's DescribeInstanceTypes: gpu on g5.12xlarge is its
#    GPUs, cpu on t3.nano its vCPUs, both said on the `tandem run:` line and in the plan; gpu on
#    t3.nano is refused naming the type, before any run; instance types tried in turn that count
#    differently are refused; with resources:, gpu chooses the cheapest type that has GPUs, and
#    auto narrows the types that fit to those of the chosen type's count. One real run: auto on
#    a t3.micro (no GPU) records its vCPUs and starts that many workers on the instance.
set -uo pipefail
: "${TANDEM_BIN:?}"
SRC=${TANDEM_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
B=$TANDEM_BIN
. "$SRC/tests/lib/cloud.sh"
cloud_test_begin cost
aws ec2 create-key-pair --key-name tk --query KeyName --output text >/dev/null || fail "create-key-pair"
mkdir -p "$P/.tandem"
printf '# the test'"'"'s own prices\nus-east-1 t3.nano 0.5\n* t3.nano 9\nus-east-1 t3.nano 0.25  # the last line wins\n' >"$P/prices.txt"
printf 'us-east-1 t3.nano zero\n' >"$P/bad-prices.txt"
printf 'us-west-2 t3.micro 0.001\nus-west-2 g4dn.xlarge 0.5\nus-west-2 g4dn.2xlarge 0.45\nus-west-2 g5.xlarge 0.9\nus-west-2 g5.2xlarge 0.95\nus-west-2 p4d.24xlarge 30\n' >"$P/west.txt"
printf 'us-east-1 p4d.24xlarge 50\nus-east-1 u-6tb1.56xlarge 1.0\nus-east-1 x2iedn.32xlarge 2.0\nus-east-1 m5.large 0.01\n' >"$P/east-big.txt"
# the cheapest type of a price file that has what is asked, from boto3's catalog
cheapest() { # REGION FILE CPU MEMORY_GIB GPUS MODEL
    sshd_exec "$CLOUD_PYTHON" - "$@" <<'PY'
import sys
import boto3
region, path, cpu, mem, gpus, model = sys.argv[1:7]
prices = {}
for line in open(path):
    r, t, p = line.split()
    if r == region:
        prices[t] = float(p)
types = boto3.client("ec2", region_name=region).describe_instance_types(
    InstanceTypes=sorted(prices))["InstanceTypes"]
def fits(t):
    g = (t.get("GpuInfo") or {}).get("Gpus") or []
    return ("x86_64" in t["ProcessorInfo"]["SupportedArchitectures"] and t["VCpuInfo"]["DefaultVCpus"] >= float(cpu) and t["MemoryInfo"]["SizeInMiB"] / 1024 >= float(mem)
            and sum(x["Count"] for x in g) >= int(gpus)
            and (not model or (g and g[0]["Name"].lower() == model.lower())))
fit = [(prices[t["InstanceType"]], t["InstanceType"]) for t in types if fits(t)]
print(min(fit)[1], len(fit))
PY
}
aws_block="image: $CLOUD_AMI, key_name: tk, user: root, address: private"
cat >"$P/.tandem/workflows.yaml" <<YAML
workflows:
  - name: spot
    executor: aws
    nodes: 2
    aws: {$aws_block, instance_type: t3.micro, spot: true}
    command: sleep 3
  - name: od
    executor: aws
    aws: {$aws_block, instance_type: t3.nano, prices: $P/prices.txt}
    command: sleep 3
  - name: plan
    executor: aws
    nodes: 3
    max_duration: 2h
    aws: {$aws_block, instance_type: t3.nano, prices: $P/prices.txt, spot: true, fallback: on-demand}
    command: "true"
  - name: pick
    executor: aws
    aws: {image: $CLOUD_AMI, key_name: tk, region: us-west-2, prices: $P/west.txt, resources: {cpu: 4, memory: 16, gpu: 1}}
    command: "true"
  - name: pickmodel
    executor: aws
    aws: {image: $CLOUD_AMI, key_name: tk, region: us-west-2, prices: $P/west.txt, resources: {gpu_model: a10g}}
    command: "true"
  - name: toobig
    executor: aws
    aws: {image: $CLOUD_AMI, key_name: tk, region: us-west-2, prices: $P/west.txt, resources: {gpu: 64, cpu: 8}}
    command: "true"
  - name: big
    executor: aws
    aws: {$aws_block, prices: $P/east-big.txt, resources: {cpu: 96, memory: 1000, disk: 30}}
    command: "true"
  - name: localplan
    command: "true"
  - name: gpuplan
    executor: aws
    nodes: 2
    nproc_per_node: gpu
    aws: {$aws_block, instance_type: g5.12xlarge}
    command: "true"
  - name: cpuplan
    executor: aws
    nproc_per_node: cpu
    aws: {$aws_block, instance_type: t3.nano, prices: $P/prices.txt}
    command: "true"
  - name: gpunone
    executor: aws
    nproc_per_node: gpu
    aws: {$aws_block, instance_type: t3.nano, prices: $P/prices.txt}
    command: "true"
  - name: gpumixed
    executor: aws
    nproc_per_node: gpu
    aws: {$aws_block, instance_types: [g5.12xlarge, g5.xlarge]}
    command: "true"
  - name: autorun
    executor: aws
    nproc_per_node: auto
    aws: {$aws_block, instance_type: t3.micro}
    command: echo "where rank \$RANK local \$LOCAL_WORLD_SIZE world \$WORLD_SIZE"
  - name: gpupick
    executor: aws
    nproc_per_node: gpu
    aws: {image: $CLOUD_AMI, key_name: tk, region: us-west-2, prices: $P/west.txt, resources: {cpu: 2}}
    command: "true"
  - name: autopick
    executor: aws
    nproc_per_node: auto
    aws: {image: $CLOUD_AMI, key_name: tk, region: us-west-2, prices: $P/west.txt, resources: {cpu: 2}}
    command: "true"
  - name: badprices
    executor: aws
    aws: {$aws_block, instance_type: t3.nano, prices: $P/bad-prices.txt}
    command: "true"
YAML

# the record's price per instance, its hours and cost_usd, against a price and launch times
# given by EC2 (moto), read with boto3
check_cost() { # RUN MODE(spot|FILE-PRICE)
    sshd_exec "$CLOUD_PYTHON" - "$P/.tandem/runs/$1/instances.json" "$2" <<'PY'
import datetime, json, sys
import boto3
rec = json.load(open(sys.argv[1]))
ec2 = boto3.client("ec2")
total = 0.0
for i in rec["instances"]:
    d = ec2.describe_instances(InstanceIds=[i["id"]])["Reservations"][0]["Instances"][0]
    launch = d["LaunchTime"].timestamp()
    assert abs(i["launched_s"] - launch) < 0.2, ("launch", i["launched_s"], launch)
    assert i["ended_s"] and i["ended_s"] > i["launched_s"], i
    if sys.argv[2] == "spot":
        h = ec2.describe_spot_price_history(InstanceTypes=[d["InstanceType"]],
            Filters=[{"Name": "availability-zone", "Values": [d["Placement"]["AvailabilityZone"]]}],
            ProductDescriptions=["Linux/UNIX"])["SpotPriceHistory"]
        price = float(max(h, key=lambda e: e["Timestamp"])["SpotPrice"])
    else:
        price = float(sys.argv[2])
    assert i["usd_per_hour"] == price, ("price", i["usd_per_hour"], price)
    total += price * (i["ended_s"] - i["launched_s"]) / 3600
    print("%s %s %s: %.6g USD/h (%s) x %.5f h" % (i["id"], i["market"], i["zone"], price,
          i["price_source"], (i["ended_s"] - i["launched_s"]) / 3600))
assert rec["cost_unpriced"] == 0, rec
assert abs(rec["cost_usd"] - total) <= 1e-9 * total, ("cost", rec["cost_usd"], total)
print("cost %.9g USD = the sum of price x hours (%.9g)" % (rec["cost_usd"], total))
open(sys.argv[1] + ".want", "w").write("%.6f\n" % total)
PY
}

# --- 1. spot
sshd_exec timeout -k 5 300 "$B" run spot >"$P/spot.log" 2>&1 || fail "tandem run spot: exit $?"
check_cost spot-1 spot || fail "spot-1's cost"
show=$("$B" show spot-1) || fail "tandem show spot-1"
grep -q "instance-hours, cost \$[0-9.]*$" <<<"$show" || fail "tandem show gives no cost: $show"

# --- 2. on demand, the user's prices
sshd_exec timeout -k 5 300 "$B" run od >"$P/od.log" 2>&1 || fail "tandem run od: exit $?"
check_cost od-1 0.25 || fail "od-1's cost"
grep -q "$P/prices.txt:4" "$P/.tandem/runs/od-1/instances.json" || fail "the price's source is not the file's line 4"
want=$(cat "$P/.tandem/runs/od-1/instances.json.want")
grep -q "cost \$$want$" <<<"$("$B" show od-1)" || fail "tandem show od-1 does not say \$$want: $("$B" show od-1 | grep instance-hours)"

# --- 3. a malformed price file: named, and the run goes on
sshd_exec timeout -k 5 300 "$B" run badprices >"$P/bad.log" 2>&1 || fail "tandem run badprices: exit $?"
grep -q "no price for t3.nano on-demand.*bad-prices.txt:1: expected 'REGION TYPE USD_PER_HOUR'" "$P/bad.log" ||
    fail "the malformed price file is not named"
python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); assert r["cost_usd"] is None and r["cost_unpriced"] == 1, r' \
    "$P/.tandem/runs/badprices-1/instances.json" || fail "badprices-1's record"

# --- 4. --dry-run: the plan, nothing created
count_all() { aws ec2 describe-instances --query 'length(Reservations[].Instances[])' --output text; }
before=$(count_all)
sshd_exec "$B" run plan --dry-run >"$P/plan.log" 2>&1 || fail "tandem run plan --dry-run: exit $?"
[ "$(count_all)" = "$before" ] || fail "--dry-run created instances: $before before, $(count_all) after"
[ ! -d "$P/.tandem/runs/plan-1" ] || fail "--dry-run made a run"
spot=$(aws ec2 describe-spot-price-history --instance-types t3.nano --product-descriptions Linux/UNIX \
    --query 'max_by(SpotPriceHistory, &Timestamp).SpotPrice' --output text)
want_h=$(python3 -c "print('%.5f' % float('$spot'))")
want_est=$(python3 -c "print('%.4f' % (3 * float('$spot') * 2))")
grep -q "instances   3 x t3.nano, spot (on-demand if no spot capacity), in us-east-1" "$P/plan.log" || fail "plan: the instances"
grep -q "price       \$$want_h per instance-hour" "$P/plan.log" || fail "plan: not moto's spot price $spot"
grep -q "estimate    at most \$$want_est: 3 x 2.00 h" "$P/plan.log" || fail "plan: the estimate is not 3 x 2 h x $spot"
grep -q "on demand   \$0.25000 per instance-hour ($P/prices.txt:4)" "$P/plan.log" || fail "plan: the on-demand price"
grep -q "creates     3 instances" "$P/plan.log" && grep -q "permissions ec2:RunInstances.*ec2:DescribeSpotPriceHistory" "$P/plan.log" ||
    fail "plan: what is created and the permissions"
sed 's/^/  /' "$P/plan.log"
out=$(sshd_exec "$B" run localplan --dry-run 2>&1) && fail "--dry-run of a local workflow succeeded"
grep -q "dry-run plans the instances of an executor: aws run" <<<"$out" || fail "the local refusal: $out"

# --- 5. resources: in a plan
read -r want nfit < <(cheapest us-west-2 "$P/west.txt" 4 16 1 "") || fail "the reference choice"
sshd_exec "$B" run pick --dry-run >"$P/pick.log" 2>&1 || fail "tandem run pick --dry-run: exit $?"
grep -q "^resources: chose $want (.*) for {cpu: 4, memory: 16, gpu: 1}: \$0.45000/h on-demand ($P/west.txt:3), the cheapest of $nfit types that fit" "$P/pick.log" ||
    fail "resources: not $want: $(cat "$P/pick.log")"
grep -q "instances   1 x $want, on-demand, in us-west-2" "$P/pick.log" || fail "the plan's instances are not $want"
read -r want nfit < <(cheapest us-west-2 "$P/west.txt" 0 0 1 A10G) || fail "the reference choice (A10G)"
sshd_exec "$B" run pickmodel --dry-run >"$P/pickmodel.log" 2>&1 || fail "tandem run pickmodel --dry-run: exit $?"
grep -q "^resources: chose $want (.*1 x A10G" "$P/pickmodel.log" || fail "gpu_model: not $want: $(cat "$P/pickmodel.log")"
out=$(sshd_exec "$B" run toobig --dry-run 2>&1) && fail "an impossible request was planned: $out"
grep -q "aws.resources: no x86_64 instance type in us-west-2 .*{cpu: 8, gpu: 64}.*the closest: [^;]* 8 x " <<<"$out" ||
    fail "the refusal does not name the request and the closest types: $out"
echo "resources: $(head -1 "$P/pick.log")"
echo "refused: $out" | head -c 400; echo

# --- 6. resources: a real run
read -r want nfit < <(cheapest us-east-1 "$P/east-big.txt" 96 1000 0 "") || fail "the reference choice (big)"
sshd_exec timeout -k 5 300 "$B" run big >"$P/big.log" 2>&1 || fail "tandem run big: exit $?"
got=$(aws ec2 describe-instances --filters Name=tag:tandem:run,Values=big-1 \
    --query 'Reservations[].Instances[].InstanceType' --output text)
[ "$got" = "$want" ] || fail "resources {cpu: 96, memory: 1000}: the run made '$got', not $want"
grep -q "chose $want" "$P/big.log" || fail "the run did not say what it chose"
echo "a run with resources {cpu: 96, memory: 1000}: EC2 has a $got, the cheapest that fits"

# --- 7. nproc_per_node: gpu|cpu|auto, counted from the type (plans: nothing created)
# The count by tandem launch's rule from boto3's catalog: ARGS: REGION SPEC TYPE, or REGION SPEC
# - FILE CPU (resources: the cheapest type of the file with >= CPU vCPUs on which SPEC counts;
# then how many of those count as many). Prints TYPE COUNT NFIT, COUNT "none" for gpu without.
nproc_ref() {
    sshd_exec "$CLOUD_PYTHON" - "$@" <<'PY'
import sys
import boto3
region, spec, name = sys.argv[1:4]
ec2 = boto3.client("ec2", region_name=region)
def count(t):
    gpus = sum(g["Count"] for g in (t.get("GpuInfo") or {}).get("Gpus") or [])
    vcpus = t["VCpuInfo"]["DefaultVCpus"]
    if spec == "gpu":
        return gpus or None
    return gpus if spec == "auto" and gpus else vcpus
if name != "-":
    t = ec2.describe_instance_types(InstanceTypes=[name])["InstanceTypes"][0]
    print(name, count(t) or "none", 1)
    sys.exit(0)
path, cpu = sys.argv[4], float(sys.argv[5])
prices = {l.split()[1]: float(l.split()[2]) for l in open(path) if l.split()[0] == region}
types = ec2.describe_instance_types(InstanceTypes=sorted(prices))["InstanceTypes"]
fit = [(prices[t["InstanceType"]], t["InstanceType"], count(t)) for t in types
       if "x86_64" in t["ProcessorInfo"]["SupportedArchitectures"]
       and t["VCpuInfo"]["DefaultVCpus"] >= cpu and count(t)]
_, best, n = min(fit)
print(best, n, sum(1 for f in fit if f[2] == n))
PY
}
before=$(count_all)
read -r _ want _ < <(nproc_ref us-east-1 gpu g5.12xlarge) || fail "the reference count (g5.12xlarge)"
[ "$want" -gt 1 ] 2>/dev/null || fail "the reference itself: g5.12xlarge has '$want' GPUs in the fixture"
sshd_exec "$B" run gpuplan --dry-run >"$P/gpuplan.log" 2>"$P/gpuplan.err" || fail "tandem run gpuplan --dry-run: exit $?: $(cat "$P/gpuplan.err")"
grep -q "^tandem run: nproc_per_node gpu: $want workers per instance, one per GPU of g5.12xlarge ($want x " "$P/gpuplan.err" ||
    fail "gpu on g5.12xlarge: not $want workers on the tandem run: line: $(cat "$P/gpuplan.err")"
grep -q "^  instances   2 x g5.12xlarge, on-demand, in us-east-1, .*; $want workers each$" "$P/gpuplan.log" ||
    fail "the plan does not say $want workers each: $(cat "$P/gpuplan.log")"
grep -q "^  workers     nproc_per_node gpu: $want workers per instance, one per GPU of g5.12xlarge" "$P/gpuplan.log" ||
    fail "the plan does not say how the workers were counted: $(cat "$P/gpuplan.log")"
read -r _ want _ < <(nproc_ref us-east-1 cpu t3.nano) || fail "the reference count (t3.nano)"
sshd_exec "$B" run cpuplan --dry-run >"$P/cpuplan.log" 2>&1 || fail "tandem run cpuplan --dry-run: exit $?"
grep -q "^tandem run: nproc_per_node cpu: $want workers\\? per instance, one per vCPU of t3.nano ($want vCPU, no GPU)" "$P/cpuplan.log" &&
    grep -q "; $want workers\\? each$" "$P/cpuplan.log" || fail "cpu on t3.nano: not its $want vCPUs: $(cat "$P/cpuplan.log")"
out=$(sshd_exec "$B" run gpunone --dry-run 2>&1) && fail "gpu on t3.nano was planned: $out"
grep -q "nproc_per_node: gpu counts the GPUs of the instance type, and t3.nano has none .*give a number of workers, cpu (one per vCPU) or auto, or a type with GPUs" <<<"$out" ||
    fail "the refusal of gpu on t3.nano: $out"
out=$(sshd_exec timeout -k 5 120 "$B" run gpunone 2>&1) && fail "a run of gpu on t3.nano ran: $out"
grep -q "and t3.nano has none" <<<"$out" || fail "the run's refusal of gpu on t3.nano: $out"
[ ! -d "$P/.tandem/runs/gpunone-1" ] || fail "a run was made for gpu on t3.nano"
read -r _ small _ < <(nproc_ref us-east-1 gpu g5.xlarge) || fail "the reference count (g5.xlarge)"
out=$(sshd_exec "$B" run gpumixed --dry-run 2>&1) && fail "types of different counts were planned: $out"
grep -q "nproc_per_node: gpu counts [0-9]* workers on g5.12xlarge but $small on g5.xlarge (aws.instance_types, tried in turn on capacity refusals); a run has one count per node: give a number" <<<"$out" ||
    fail "the refusal of disagreeing types: $out"
read -r type want nfit < <(nproc_ref us-west-2 gpu - "$P/west.txt" 2) || fail "the reference (gpu, resources)"
sshd_exec "$B" run gpupick --dry-run >"$P/gpupick.log" 2>&1 || fail "tandem run gpupick --dry-run: exit $?: $(cat "$P/gpupick.log")"
grep -q "^resources: chose $type (.*) for {cpu: 2} and nproc_per_node: gpu = $want: .*the cheapest of $nfit types\\? that fit" "$P/gpupick.log" &&
    grep -q "^  instances   1 x $type, .*; $want workers\\? each$" "$P/gpupick.log" ||
    fail "gpu with resources {cpu: 2}: not $type ($want workers, $nfit of that count): $(cat "$P/gpupick.log")"
read -r type want nfit < <(nproc_ref us-west-2 auto - "$P/west.txt" 2) || fail "the reference (auto, resources)"
sshd_exec "$B" run autopick --dry-run >"$P/autopick.log" 2>&1 || fail "tandem run autopick --dry-run: exit $?: $(cat "$P/autopick.log")"
grep -q "^resources: chose $type (.*) for {cpu: 2} and nproc_per_node: auto = $want: .*the cheapest of $nfit types\\? that fit" "$P/autopick.log" ||
    fail "auto with resources {cpu: 2}: not $type of $nfit types with $want workers: $(cat "$P/autopick.log")"
[ "$(count_all)" = "$before" ] || fail "the nproc plans created instances: $before before, $(count_all) after"
read -r _ want _ < <(nproc_ref us-east-1 auto t3.micro) || fail "the reference count (t3.micro)"
sshd_exec timeout -k 5 300 "$B" run autorun >"$P/autorun.log" 2>&1 || fail "tandem run autorun: exit $?: $(tail -5 "$P/autorun.log")"
grep -q "^tandem run: nproc_per_node auto: $want workers\\? per instance, one per vCPU of t3.micro" "$P/autorun.log" ||
    fail "auto on t3.micro: not its $want vCPUs: $(grep nproc "$P/autorun.log")"
"$B" show autorun-1 | grep -qE "^workers  *1 node\(s\) x $want process\(es\)$" ||
    fail "the record is not 1 x $want workers: $("$B" show autorun-1 | head -15)"
for ((r = 0; r < want; r++)); do
    grep -qx "where rank $r local $want world $want" "$P/.tandem/runs/autorun-1/logs/rank-$r.log" ||
        fail "autorun: rank $r's log: $(cat "$P/.tandem/runs/autorun-1/logs/rank-$r.log" 2>&1)"
done
[ ! -e "$P/.tandem/runs/autorun-1/logs/rank-$want.log" ] || fail "autorun: more than $want workers"
echo "nproc_per_node: $(grep "^tandem run:" "$P/gpuplan.err"); gpu on t3.nano refused; $(grep "^resources:" "$P/gpupick.log" | cut -c1-200)"
echo "costs equal price x hours from the fixture's prices; a malformed aws.prices is named; --dry-run plans and creates nothing; resources picks the cheapest fitting type"
