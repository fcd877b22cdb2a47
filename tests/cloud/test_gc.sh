#!/usr/bin/env bash
# Nothing keeps billing: `tandem gc`, and the orphan check of `tandem ps`, against moto's EC2
# (moto_server on 127.0.0.1, port 0), every state checked with boto3, never with tandem's own
# reading of the account. In one project, three real local runs (tandem run), and instances made
# with boto3, tagged as executor aws tags them (tandem:run, tandem:project, tandem:node, Name):
#   (a) w-1: ended, supervisor gone; its RUN/instances.json lists one of its two instances
#       (as if its supervisor died before recording the second);
#   (b) w-2: live: its RUN/lock held as a supervisor holds it;
#   (c) w-1 of another project (the same run id: only the tandem:project tag tells them apart);
#   (d) w-3: ended, an instance made after the first gc, listed live in its record.
# Then: gc --dry-run terminates nothing and says what it would do; gc terminates (a)'s two only,
# naming each, and records their ends (the unrecorded one added); ps terminates (d)'s through its
# check, and then makes no AWS call (a closed endpoint, no warning), nor for the live (b); show
# and the ui's run object (GET /api/runs/{id}) give the record and its instance-hours; gc --all terminates (c) and still leaves (b); without
# a region, or credentials, gc fails naming the fix. Then the controllers of detached runs
# (tandem:controller): terminated when their run's store says the run ended, their switch failed
# or a newer controller took over; live and starting ones, and other projects', left.
# Skips (77) without the venv (scripts/venv.sh: moto[server], boto3).
set -uo pipefail
venv=${TANDEM_VENV:-$TANDEM_SOURCE_DIR/.venv}
if [ ! -x "$venv/bin/moto_server" ]; then
  echo "SKIP: no moto_server in $venv (run scripts/venv.sh, or set TANDEM_VENV)"
  exit 77
fi
py=$venv/bin/python
. "$TANDEM_SOURCE_DIR/tests/lib/project.sh"
project_init gc
moto_pid= lock_pid= ui_pid=
cleanup() {
  [ -n "$lock_pid" ] && kill "$lock_pid" 2>/dev/null
  [ -n "$ui_pid" ] && kill "$ui_pid" 2>/dev/null
  [ -n "$moto_pid" ] && kill "$moto_pid" 2>/dev/null && wait "$moto_pid" 2>/dev/null
  project_cleanup
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; [ -f "$P/moto.log" ] && tail -5 "$P/moto.log"; exit 1; }

: > "$P/moto.log"
"$venv/bin/moto_server" -H 127.0.0.1 -p 0 > "$P/moto.log" 2>&1 &
moto_pid=$!
port=
for _ in $(seq 100); do
  port=$(sed -n 's|.*Running on http://127.0.0.1:\([0-9]*\).*|\1|p' "$P/moto.log" | head -1)
  [ -n "$port" ] && break
  kill -0 "$moto_pid" 2>/dev/null || fail "moto_server exited"
  sleep 0.1
done
[ -n "$port" ] || fail "moto_server did not say its port in 10 s"
export HOME=$P AWS_REGION=us-east-1 AWS_ENDPOINT_URL=http://127.0.0.1:$port
export AWS_EC2_METADATA_DISABLED=true AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing
unset AWS_PROFILE AWS_DEFAULT_REGION AWS_ENDPOINT_URL_EC2 AWS_ENDPOINT_URL_S3 AWS_SESSION_TOKEN \
  AWS_SHARED_CREDENTIALS_FILE AWS_CONFIG_FILE

# three real runs of this project, ended
mkdir -p .tandem
cat > .tandem/workflows.yaml <<'EOF'
workflows:
  - name: w
    command: "true"
EOF
for i in 1 2 3; do "$B" run w > "$P/run$i.out" 2>&1 || { cat "$P/run$i.out"; fail "tandem run w"; }; done
R=$P/.tandem/runs
[ -d "$R/w-1" ] && [ -d "$R/w-2" ] && [ -d "$R/w-3" ] || fail "runs w-1..3 missing: $(ls "$R")"
# (b) live: RUN/lock held (tandem run holds it with flock for its supervisor's whole life), by
# one process (killed at the end) that keeps no pipe of ctest's open
(exec 9> "$R/w-2/lock" && flock -x 9 && exec sleep 600) > /dev/null 2>&1 < /dev/null &
lock_pid=$!
for _ in $(seq 100); do flock -n "$R/w-2/lock" true || break; sleep 0.05; done
flock -n "$R/w-2/lock" true && fail "the lock of w-2 is not held"

# boto3: make instances tagged like executor aws's; prints "KEY ID" lines
make() { # make KEY RUN PROJECT NODE...
  MK_KEY=$1 MK_RUN=$2 MK_PROJECT=$3 "$py" - "${@:4}" <<'PY'
import os, sys, boto3
ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
image = ec2.describe_images()["Images"][0]["ImageId"]
for node in sys.argv[1:]:
    run = os.environ["MK_RUN"]
    tags = [{"Key": "tandem:run", "Value": run}, {"Key": "tandem:project",
            "Value": os.environ["MK_PROJECT"]}, {"Key": "tandem:node", "Value": node},
            {"Key": "Name", "Value": f"tandem-{run}-n{node}"}]
    r = ec2.run_instances(ImageId=image, InstanceType="t3.micro", MinCount=1, MaxCount=1,
                          TagSpecifications=[{"ResourceType": "instance", "Tags": tags}])
    print(os.environ["MK_KEY"] + node, r["Instances"][0]["InstanceId"])
PY
}
states() { # states ID...: "ID STATE" per line, from boto3
  "$py" - "$@" <<'PY'
import os, sys, boto3
ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
r = ec2.describe_instances(InstanceIds=sys.argv[1:])
for res in r["Reservations"]:
    for i in res["Instances"]:
        print(i["InstanceId"], i["State"]["Name"])
PY
}
state_of() { states "$1" | awk '{print $2}'; }
record() { # record RUN_DIR ID NODE...: RUN/instances.json listing those instances live
  local dir=$1; shift
  REC_DIR=$dir "$py" - "$@" <<'PY'
import json, os, sys, time
a = sys.argv[1:]
inst = [{"id": a[i], "node": int(a[i + 1]), "type": "t3.micro", "market": "on-demand",
         "subnet": None, "zone": "us-east-1a", "launched_s": time.time() - 1800,
         "ended_s": None, "end": None, "replaces": None, "state": "running"}
        for i in range(0, len(a), 2)]
with open(os.environ["REC_DIR"] + "/instances.json", "w") as f:
    json.dump({"provider": "aws", "region": "us-east-1", "instances": inst}, f)
PY
}
make a w-1 "$P" 0 1 > "$P/ids" || fail "boto3 run_instances (a)"
make b w-2 "$P" 0 >> "$P/ids" || fail "boto3 run_instances (b)"
make c w-1 /srv/another-project 0 >> "$P/ids" || fail "boto3 run_instances (c)"
id() { awk -v k="$1" '$1 == k {print $2}' "$P/ids"; }
a0=$(id a0) a1=$(id a1) b0=$(id b0) c0=$(id c0)
[ -n "$a0" ] && [ -n "$a1" ] && [ -n "$b0" ] && [ -n "$c0" ] || fail "instances: $(cat "$P/ids")"
record "$R/w-1" "$a0" 0 # a1 unrecorded: its supervisor died first
record "$R/w-2" "$b0" 0
all_running() {
  local s
  s=$(states "$@")
  [ "$(grep -c ' running$' <<<"$s")" = $# ] || fail "$1: not all running: $s"
}
all_running "$a0" "$a1" "$b0" "$c0"

# ---- gc --dry-run: nothing changes ----
out=$("$B" gc --dry-run 2>&1) || fail "tandem gc --dry-run: exit $?: $out"
echo "$out"
grep -q "^would terminate $a0 (t3.micro on-demand, node 0 of run w-1" <<<"$out" ||
  fail "dry run does not name $a0"
grep -q "^would terminate $a1 (t3.micro on-demand, node 1 of run w-1" <<<"$out" ||
  fail "dry run does not name $a1"
grep -q "^left $b0 .*run w-2 is live" <<<"$out" || fail "dry run: $b0 not left as live"
grep -q "^left $c0 .*/srv/another-project.*--all" <<<"$out" ||
  fail "dry run: $c0 not left as another project's with the --all hint"
all_running "$a0" "$a1" "$b0" "$c0"
grep -q '"ended_s": null' "$R/w-1/instances.json" || fail "dry run changed the record"

# ---- gc: (a) only ----
out=$("$B" gc 2>&1) || fail "tandem gc: exit $?: $out"
echo "$out"
grep -q "^terminated $a0 (t3.micro on-demand, node 0 of run w-1, up [0-9.]* h)$" <<<"$out" ||
  fail "gc does not name $a0 as terminated"
grep -q "^terminated $a1 (t3.micro on-demand, node 1 of run w-1, up [0-9.]* h)$" <<<"$out" ||
  fail "gc does not name $a1 as terminated"
grep -q "^left $b0 " <<<"$out" && grep -q "^left $c0 " <<<"$out" || fail "gc: b, c not left"
for i in "$a0" "$a1"; do
  s=$(state_of "$i")
  [ "$s" = terminated ] || [ "$s" = shutting-down ] || fail "$i is $s after gc"
done
all_running "$b0" "$c0"
REC=$R/w-1/instances.json A0=$a0 A1=$a1 "$py" - <<'PY' || fail "w-1's record: $(cat "$R/w-1/instances.json")"
import json, os
r = json.load(open(os.environ["REC"]))
by = {i["id"]: i for i in r["instances"]}
for k in ("A0", "A1"):
    i = by[os.environ[k]]  # A1 was not recorded: gc added it
    assert i["end"] == "terminated by tandem gc" and i["ended_s"], i
assert by[os.environ["A1"]]["node"] == 1 and by[os.environ["A1"]]["type"] == "t3.micro", by
print("record of w-1:", [(i["id"], i["end"]) for i in r["instances"]])
PY

# ---- show: the record and its instance-hours ----
out=$("$B" show w-1) || fail "tandem show w-1: $out"
echo "$out" | sed -n '/^instances/,/^$/p'
grep -q "^  $a0 .*t3.micro .*terminated by tandem gc" <<<"$out" || fail "show lacks $a0: $out"
grep -q "^instances .*instance-hours" <<<"$out" || fail "show lacks the total: $out"
# a1 was recorded with its launch time: about 0 h; a0's record said 30 min ago: 0.5 h
grep -Eq "^instances .*0\.5[0-9]? instance-hours" <<<"$out" || fail "total is not 0.5 h: $out"

# ---- the ui's run object: the same record, hours, and null for a run without one ----
"$B" ui --port 0 > "$P/ui.out" 2> "$P/ui.err" < /dev/null &
ui_pid=$!
uport=
for _ in $(seq 100); do
  uport=$(sed -n 's|^tandem ui: http://127.0.0.1:\([0-9]*\)/.*|\1|p' "$P/ui.out")
  [ -n "$uport" ] && break
  sleep 0.1
done
[ -n "$uport" ] || fail "tandem ui did not say its port: $(cat "$P/ui.out" "$P/ui.err")"
utoken=$(sed -n 's|^tandem ui: http://.*?token=\([0-9a-f]*\)$|\1|p' "$P/ui.out") # every request needs it
UPORT=$uport UTOKEN=$utoken A0=$a0 "$py" - <<'PY' || fail "the ui's run object"
import json, os, urllib.request
get = lambda p: json.load(urllib.request.urlopen(urllib.request.Request(
    f"http://127.0.0.1:{os.environ['UPORT']}{p}", headers={"X-Tandem-Token": os.environ["UTOKEN"]})))
rec = get("/api/runs/w-1")["instances"]
assert rec["provider"] == "aws" and rec["region"] == "us-east-1", rec
assert 0.45 < rec["instance_hours"] < 0.6, rec
a0 = next(i for i in rec["instances"] if i["id"] == os.environ["A0"])
assert a0["end"] == "terminated by tandem gc" and a0["live"] is False and a0["node"] == 0, a0
assert 0.45 < a0["instance_hours"] < 0.6 and abs(a0["lifetime"] - 3600 * a0["instance_hours"]) < 1e-6, a0
assert get("/api/runs/w-3")["instances"] is None  # no record (yet)
print("ui: w-1 instances", [(i["id"], round(i["instance_hours"], 3)) for i in rec["instances"]])
PY
kill "$ui_pid"; wait "$ui_pid" 2>/dev/null; ui_pid=

# ---- ps: its check terminates (d), then asks AWS no more ----
make d w-3 "$P" 0 > "$P/ids-d" || fail "boto3 run_instances (d)"
d0=$(awk '{print $2}' "$P/ids-d")
record "$R/w-3" "$d0" 0
out=$("$B" ps 2>&1) || fail "tandem ps: exit $?: $out"
echo "$out"
grep -q "terminated $d0 (t3.micro on-demand, node 0 of run w-3, up [0-9.]* h)" <<<"$out" ||
  fail "ps did not terminate $d0"
grep -q "$b0" <<<"$out" && fail "ps touched the live run's $b0"
s=$(state_of "$d0")
[ "$s" = terminated ] || [ "$s" = shutting-down ] || fail "$d0 is $s after ps"
all_running "$b0" "$c0"
grep -q "terminated by tandem gc" "$R/w-3/instances.json" || fail "w-3's record: no end"
# nothing of this project is orphaned now (w-2 lives): ps must not ask AWS at all
out=$(AWS_ENDPOINT_URL=http://127.0.0.1:1 "$B" ps 2>&1) || fail "offline ps: exit $?: $out"
grep -qi "warning\|terminated i-" <<<"$out" && fail "ps asked AWS with no orphan: $out"

# ---- gc --all: (c) too, never the live (b) ----
out=$("$B" gc --all 2>&1) || fail "tandem gc --all: exit $?: $out"
echo "$out"
grep -q "^terminated $c0 (t3.micro on-demand, node 0 of run w-1" <<<"$out" ||
  fail "gc --all did not terminate $c0"
grep -q "^left $b0 .*live" <<<"$out" || fail "gc --all: $b0 not left"
s=$(state_of "$c0")
[ "$s" = terminated ] || [ "$s" = shutting-down ] || fail "$c0 is $s after gc --all"
all_running "$b0"

# ---- errors: named, with the fix; exit 1 ----
out=$(env -u AWS_REGION "$B" gc 2>&1) && fail "gc without a region succeeded: $out"
grep -q "AWS_REGION" <<<"$out" || fail "no-region error does not say AWS_REGION: $out"
out=$(env -u AWS_REGION "$B" gc --region us-east-1 2>&1) || fail "gc --region: exit $?: $out"
grep -q "^1 instance tagged tandem:run in us-east-1: 0 terminated, 1 left$" <<<"$out" ||
  fail "gc --region us-east-1 (only the live run's instance is left): $out"
out=$(env -u AWS_ACCESS_KEY_ID -u AWS_SECRET_ACCESS_KEY "$B" gc 2>&1) &&
  fail "gc without credentials succeeded: $out"
grep -q "AWS_ACCESS_KEY_ID" <<<"$out" || fail "no-credentials error: $out"

# ---- the controllers of detached runs (tandem:controller), decided by their run's store ----
# Instances tagged as controller.c tags a controller (tandem:controller, tandem:project,
# tandem:store), their stores written with boto3 as a controller writes them (run/run.json,
# controller.json); moto's S3 on the same endpoint:
#   (e) dx-1: its run ended (run.json stopped, after the controller started)   -> terminated
#   (f) dx-2: running, its controller spoke now, promising 5 min               -> left (live)
#   (g) dx-3: running, its controller's promise passed 700 s ago (switch failed) -> terminated
#   (h, i) dx-4: i spoke after h started (a resume's controller): h            -> terminated,
#       i live                                                                  -> left
#   (j) dx-5: run.json ended before j started (a resume's, no word yet)        -> left (starting)
#   (k) dx-6 of another project, ended                       -> left; terminated by gc --all
#   (l) w-3: no store tag, no remote.json; ended here, nobody holds its lock   -> terminated
#   (m) w-2: no store tag; live here (its lock held)                           -> left
#   (n) dx-7: its run.json says stopped but is 2 MiB (not tandem's: a record is a few KiB)
#       -> left unread (HEAD first), not terminated on what it says
ctl() { # ctl KEY RUN PROJECT [STORE]: prints "KEY ID"
  CT_KEY=$1 CT_RUN=$2 CT_PROJECT=$3 CT_STORE=${4:-} "$py" - <<'PY'
import os, boto3
ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
image = ec2.describe_images()["Images"][0]["ImageId"]
run = os.environ["CT_RUN"]
tags = [{"Key": "tandem:controller", "Value": run}, {"Key": "tandem:project",
        "Value": os.environ["CT_PROJECT"]}, {"Key": "Name", "Value": f"tandem-{run}-controller"}]
if os.environ["CT_STORE"]:
    tags.append({"Key": "tandem:store", "Value": os.environ["CT_STORE"]})
r = ec2.run_instances(ImageId=image, InstanceType="t3.micro", MinCount=1, MaxCount=1,
                      TagSpecifications=[{"ResourceType": "instance", "Tags": tags}])
print(os.environ["CT_KEY"], r["Instances"][0]["InstanceId"])
PY
}
store() { # store RUN STATUS [SPEAKER HEARD_AGO PROMISE_IN]: run.json (ended now when final);
  # ST_PAD=N pads run.json with N bytes
  ST_RUN=$1 ST_STATUS=$2 ST_WHO=${3:-} ST_AGO=${4:-0} ST_IN=${5:-0} "$py" - <<'PY'
import json, os, time, boto3
s3 = boto3.client("s3", region_name="us-east-1", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
try:
    s3.create_bucket(Bucket="gcstore")
except s3.exceptions.BucketAlreadyOwnedByYou:
    pass
run, status, now = os.environ["ST_RUN"], os.environ["ST_STATUS"], time.time()
final = status in ("succeeded", "failed", "stopped", "preempted")
s3.put_object(Bucket="gcstore", Key=f"p/{run}/.tandem-run/run/run.json", Body=json.dumps(
    {"id": run, "status": status, "created": now - 900, "started": now - 890,
     "ended": now if final else 0, **({"pad": "x" * int(os.environ["ST_PAD"])}
                                      if os.environ.get("ST_PAD") else {})}))
if os.environ["ST_WHO"]:
    heard = now - float(os.environ["ST_AGO"])
    s3.put_object(Bucket="gcstore", Key=f"p/{run}/.tandem-run/controller.json", Body=json.dumps(
        {"format": 1, "run": run, "instance": os.environ["ST_WHO"], "heard_s": heard,
         "promise_s": now + float(os.environ["ST_IN"]), "orphan_timeout_s": 300, "ended": False}))
PY
}
url() { echo "s3://gcstore/p/$1/.tandem-run"; }
{
  ctl e dx-1 "$P" "$(url dx-1)"
  ctl f dx-2 "$P" "$(url dx-2)"
  ctl g dx-3 "$P" "$(url dx-3)"
  ctl h dx-4 "$P" "$(url dx-4)"
  ctl k dx-6 /srv/another-project "$(url dx-6)"
} > "$P/ctl-ids" || fail "boto3: controllers"
cid() { awk -v k="$1" '$1 == k {print $2}' "$P/ctl-ids"; }
sleep 1.1 # launch times are in whole seconds: i starts a second after h, which the word follows
ctl i dx-4 "$P" "$(url dx-4)" >> "$P/ctl-ids" || fail "boto3: controller i"
store dx-1 stopped || fail "store dx-1"
store dx-2 running "$(cid f)" 0 300 || fail "store dx-2"
store dx-3 running "$(cid g)" 1000 -700 || fail "store dx-3"
store dx-4 running "$(cid i)" 0 300 || fail "store dx-4"
store dx-5 stopped || fail "store dx-5"
store dx-6 succeeded || fail "store dx-6"
ST_PAD=$((2 << 20)) store dx-7 stopped || fail "store dx-7"
sleep 1.1 # j starts after dx-5's end (a resumed run's new controller)
{
  ctl j dx-5 "$P" "$(url dx-5)"
  ctl l w-3 "$P"
  ctl m w-2 "$P"
  ctl n dx-7 "$P" "$(url dx-7)"
} >> "$P/ctl-ids" || fail "boto3: controllers j, l, m, n"
ce=$(cid e) cf=$(cid f) cg=$(cid g) ch=$(cid h) ci=$(cid i) cj=$(cid j) ck=$(cid k) cl=$(cid l) cm=$(cid m)
cn=$(cid n)
all_running "$ce" "$cf" "$cg" "$ch" "$ci" "$cj" "$ck" "$cl" "$cm" "$cn"
out=$("$B" gc --dry-run 2>&1) || fail "tandem gc --dry-run (controllers): exit $?: $out"
echo "$out" | grep controller
all_running "$ce" "$cf" "$cg" "$ch" "$ci" "$cj" "$ck" "$cl" "$cm"
grep -q "^would terminate $ce (t3.micro on-demand, controller of run dx-1, up [0-9.]* h): its run ended (stopped at " <<<"$out" ||
  fail "dry run: $ce (dx-1 ended)"
out=$("$B" gc 2>&1) || fail "tandem gc (controllers): exit $?: $out"
echo "$out" | grep controller
ok_line() { grep -q "$1" <<<"$out" || fail "gc: no line '$1'"; }
ok_line "^terminating $ce (t3.micro on-demand, controller of run dx-1, up [0-9.]* h): its run ended (stopped at .*s3://gcstore/p/dx-1/.tandem-run/run/run.json"
ok_line "^terminated $ce (t3.micro on-demand, controller of run dx-1"
ok_line "^left $cf (.*controller of run dx-2.*): it is live: it last spoke at "
ok_line "^terminating $cg (.*controller of run dx-3.*): its dead-man's switch failed: its supervisor last spoke at "
ok_line "^terminating $ch (.*controller of run dx-4.*): the run has a newer controller, $ci "
ok_line "^left $ci (.*controller of run dx-4.*): it is live"
ok_line "^left $cj (.*controller of run dx-5.*): it is starting"
ok_line "^left $ck (.*controller of run dx-6.*): run dx-6 of /srv/another-project; 'tandem gc --all' terminates it"
ok_line "^terminating $cl (.*controller of run w-3.*): its run ended here (succeeded) and nobody holds its lock"
ok_line "^left $cm (.*controller of run w-2.*): its run's store is unknown"
ok_line "^left $cn (.*controller of run dx-7.*): its run's store s3://gcstore/p/dx-7/.tandem-run could not be read: s3://gcstore/p/dx-7/.tandem-run/run/run.json is 20[0-9]* bytes, more than the 1048576 "
ok_line "^10 controllers tagged tandem:controller in us-east-1: 4 terminated, 6 left$"
for i in "$ce" "$cg" "$ch" "$cl"; do
  s=$(state_of "$i")
  [ "$s" = terminated ] || [ "$s" = shutting-down ] || fail "controller $i is $s after gc"
done
all_running "$cf" "$ci" "$cj" "$ck" "$cm" "$cn" "$b0"
# w-3's controller is in w-3's record now, ended, no node, at t3.micro's on-demand price (a
# controller records itself only when it ends itself: one gc ended would be missing from the
# run's instances and cost); botocore's own account of the instance is the reference
REC=$R/w-3/instances.json CL=$cl "$py" - <<'PY' || fail "w-3's record lacks its controller: $(cat "$R/w-3/instances.json")"
import json, os, boto3
rec = json.load(open(os.environ["REC"]))
mine = [e for e in rec["instances"] if e["id"] == os.environ["CL"]]
assert len(mine) == 1, rec
e = mine[0]
assert e["node"] is None and e["ended_s"] and e["state"] in ("shutting-down", "terminated"), e
assert e["end"].startswith("terminated by tandem gc: its run ended here (succeeded)"), e["end"]
assert e["usd_per_hour"] == 0.0104 and e["price_source"], e
ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
inst = ec2.describe_instances(InstanceIds=[e["id"]])["Reservations"][0]["Instances"][0]
assert e["type"] == inst["InstanceType"] and abs(e["launched_s"] - inst["LaunchTime"].timestamp()) < 1, (e, inst)
PY
out=$("$B" gc --all 2>&1) || fail "tandem gc --all (controllers): exit $?: $out"
ok_line "^terminated $ck (t3.micro on-demand, controller of run dx-6"
s=$(state_of "$ck")
[ "$s" = terminated ] || [ "$s" = shutting-down ] || fail "controller $ck is $s after gc --all"
all_running "$cf" "$ci" "$cj" "$cm" "$cn" "$b0"
echo "controllers: ended, switch failed and superseded ones terminated (boto3 says so); live, starting and unknown-store ones left"
echo "PASS"
