#!/usr/bin/env bash
# s3:// checkpoints and artifacts (docs/cloud.md, "S3 checkpoints and artifacts") against moto's
# server (the venv's, port 0 on 127.0.0.1), checked with boto3, never with tandem's own reading:
#   1. a local run, 2 workers of BasicNet, checkpoint_dir: s3://ckpts/runs, artifacts to
#      s3://arts/a: boto3 sees committed checkpoints (object + .commit naming its size and
#      sha256, the newest 3 kept) and the weights artifact with the right bytes; with RUN/artifacts
#      deleted, `tandem artifacts --download` brings the same bytes back from S3;
#   2. the same workflow stopped mid-run (`tandem stop`): the stop's checkpoint is committed in S3
#      by the agent as it ends; the local checkpoints are deleted, and a half upload (an object
#      newer than every commit, without a commit) and a commit whose object does not match it are
#      planted; `tandem run --resume` downloads the newest good commit, resumes from it, ignores
#      both plants, and ends with weights cmp-equal to run 1's, each step stored once;
#   3. a bucket that does not exist: the run fails before any worker starts, naming the bucket
#      and the fix;
#   4. S3 gone for a while mid-run (moto killed, then started again on its port): the agent
#      warns, training goes on, and the checkpoints after S3 is back are committed, the last too
#      (the workers are frozen from the warning until S3 is back, so that training cannot end
#      while it is away, however fast it runs);
#   5. ssh (tests/lib/sshd.sh; skipped without root or namespaces): a run on one ssh host whose
#      credentials are its own ~/.aws files, moto in the fixture's login namespace: its
#      checkpoints are committed in S3.
# Skips (77) without the venv (scripts/venv.sh: moto[server], boto3) or the data set.
set -uo pipefail
SRC=${TANDEM_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
venv=${TANDEM_VENV:-$SRC/.venv}
if [ ! -x "$venv/bin/moto_server" ]; then
  echo "SKIP: no moto_server in $venv (run scripts/venv.sh, or set TANDEM_VENV)"
  exit 77
fi
py=$venv/bin/python
. "$SRC/tests/lib/project.sh"
project_setup s3ckpt
T0=$(date +%s)
moto_pid= moto2_pid=
cleanup() {
  [ -n "$moto_pid" ] && kill "$moto_pid" 2>/dev/null && wait "$moto_pid" 2>/dev/null
  [ -n "$moto2_pid" ] && kill "$moto2_pid" 2>/dev/null && wait "$moto2_pid" 2>/dev/null
  declare -F sshd_down >/dev/null && sshd_down
  project_cleanup
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  for f in "$P"/.tandem/runs/*/logs/*.log "$P"/*.out; do [ -f "$f" ] && { echo "--- $f"; tail -n 15 "$f"; } >&2; done
  exit 1
}
note() { echo "[$(($(date +%s) - T0))s] $*"; }

start_moto() { # start_moto LOG [RUNNER...]: moto on port 0 of 127.0.0.1 (or of the runner's net)
  local log=$1 host=$2
  shift 2
  : >"$log"
  "$@" "$venv/bin/moto_server" -H "$host" -p "${MOTO_BIND_PORT:-0}" >"$log" 2>&1 &
  local pid=$! port=
  for _ in $(seq 150); do
    port=$(sed -n 's|.*Running on http://[0-9.]*:\([0-9]*\).*|\1|p' "$log" | head -1)
    [ -n "$port" ] && break
    kill -0 "$pid" 2>/dev/null || fail "moto_server exited: $(tail -5 "$log")"
    sleep 0.1
  done
  [ -n "$port" ] || fail "moto_server did not say its port in 15 s"
  MOTO_PID=$pid MOTO_PORT=$port
}
start_moto "$P/moto.out" 127.0.0.1
moto_pid=$MOTO_PID
# a clean AWS environment: no ~/.aws or credentials of the machine running the test
export HOME=$P AWS_REGION=us-east-1 AWS_ENDPOINT_URL=http://127.0.0.1:$MOTO_PORT \
  AWS_EC2_METADATA_DISABLED=true AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing
unset AWS_PROFILE AWS_DEFAULT_REGION AWS_ENDPOINT_URL_S3 AWS_SESSION_TOKEN \
  AWS_SHARED_CREDENTIALS_FILE AWS_CONFIG_FILE TANDEM_CHECKPOINT_URL
boto() { "$py" - "$@"; } # python reading its script from stdin, with boto3
boto <<'PY' || fail "creating the buckets"
import os, boto3
s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
for b in ("ckpts", "arts"): s3.create_bucket(Bucket=b)
PY
note "moto at $AWS_ENDPOINT_URL"

mkdir -p .tandem
train="tandem train --model basicnet --data $DATA --batch 16 --threads 1 --seed 7 --no-progress"
cat >.tandem/workflows.yaml <<EOF
workflows:
  - name: s
    nproc_per_node: 2
    checkpoint_dir: s3://ckpts/runs
    commands:
      - mkdir -p out
      - $train --steps 60 --checkpoint-every 10 --save out/w.safetensors
    artifacts:
      paths: [out/w.safetensors]
      to: s3://arts/a/
  - name: flaky
    nproc_per_node: 2
    checkpoint_dir: s3://ckpts/runs
    command: $train --steps 480 --checkpoint-every 10
  - name: nobucket
    nproc_per_node: 2
    checkpoint_dir: s3://no-such-bucket-$$/x
    command: $train --steps 5 --checkpoint-every 1
EOF
field() { "$B" show "$1" | awk -v f="$2" 'index($0, f) == 1 { sub("^" f " +", ""); print; exit }'; }
wait_final() {
  local s
  for _ in $(seq 1 900); do
    s=$(field "$1" status)
    case "$s" in succeeded | failed | stopped | preempted) echo "$s"; return 0 ;; esac
    sleep 0.2
  done
  fail "run $1 still '$s' after 180 s"
}
check_metrics() { # run what: no duplicate (rank, key, step); train/loss steps 1..60 once each
  "$B" metrics "$1" --json >"$P/m.json" || fail "$2: tandem metrics $1 --json"
  "$PYTHON" - "$P/m.json" "$2" <<'EOF' || fail "$2: metrics of run $1"
import collections, json, sys
rows = json.load(open(sys.argv[1]))
seen = collections.Counter((r["rank"], r["key"], r["step"]) for r in rows)
dups = [k for k, n in seen.items() if n > 1]
assert not dups, "duplicate points (rank, key, step): %s" % dups[:5]
loss = sorted(r["step"] for r in rows if r["key"] == "train/loss")
assert loss == list(range(1, 61)), "train/loss steps: expected 1..60 once each, got %s" % loss
print("%s: %d points, train/loss steps 1..60 once each" % (sys.argv[2], len(rows)))
EOF
}
# The committed checkpoints boto3 sees under PREFIX: each commit's object has the size and
# sha256 the commit names; prints the committed steps.
committed() {
  boto "$1" <<'PY'
import hashlib, os, sys, boto3
s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
prefix = sys.argv[1]
keys = [o["Key"] for o in s3.list_objects_v2(Bucket="ckpts", Prefix=prefix).get("Contents", [])]
steps = []
for k in keys:
    if not k.endswith(".commit"): continue
    try:  # (a checkpoint the agent deletes meanwhile, as it keeps the newest 3, is passed over)
        c = dict(l.split(" ", 1) for l in s3.get_object(Bucket="ckpts", Key=k)["Body"].read().decode().splitlines())
        body = s3.get_object(Bucket="ckpts", Key=k[:-len(".commit")])["Body"].read()
    except s3.exceptions.NoSuchKey:
        continue
    assert len(body) == int(c["nbytes"]), (k, len(body), c)
    assert hashlib.sha256(body).hexdigest() == c["sha256"], (k, c)
    assert body[:8] == b"TDCKPT\r\n", k
    steps.append(int(c["step"]))
print(" ".join(str(s) for s in sorted(steps)))
PY
}

# --- 1. an uninterrupted run: checkpoints committed in S3, the artifact uploaded
out=$("$B" run s 2>&1) || fail "run s exited $?: $out"
[ "$(field s-1 status)" = succeeded ] || fail "1: status $(field s-1 status): $out"
R1=$P/.tandem/runs/s-1
W_REF=$P/w_ref.safetensors
cp "$R1/artifacts/out/w.safetensors" "$W_REF" || fail "1: no weights artifact"
grep -q "s3 checkpoints: uploaded ckpt-60.tdck ([0-9]* bytes, [0-9.]* s)" <<<"$out" ||
  fail "1: no upload line for ckpt-60 (bytes, seconds): $out"
steps=$(committed runs/s-1/) || fail "1: boto3 does not see good commits under runs/s-1/"
# Every checkpoint the agent saw was uploaded (it may skip one the trainer replaced before the
# scan), the last one always; 3 are kept, the older ones deleted with their objects.
case " $steps" in *" 60") ;; *) fail "1: the last checkpoint (60) is not committed in S3: '$steps'" ;; esac
n=$(wc -w <<<"$steps")
[ "$n" -ge 2 ] && [ "$n" -le 3 ] || fail "1: committed steps in S3: '$steps', expected the newest 3"
objs=$(boto <<'PY'
import os, boto3
s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
print(sum(1 for o in s3.list_objects_v2(Bucket="ckpts", Prefix="runs/s-1/").get("Contents", [])
          if o["Key"].endswith(".tdck")))
PY
)
[ "$objs" = "$n" ] || fail "1: $objs checkpoint objects in S3 for $n commits: older ones not deleted"
[ -f "$R1/artifacts-s3.json" ] || fail "1: no RUN/artifacts-s3.json"
boto "$W_REF" <<'PY' || fail "1: boto3 does not see the artifact's bytes at s3://arts/a/s-1/out/w.safetensors"
import os, sys, boto3
s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
body = s3.get_object(Bucket="arts", Key="a/s-1/out/w.safetensors")["Body"].read()
assert body == open(sys.argv[1], "rb").read(), "bytes differ"
PY
rm -rf "$R1/artifacts"
dl=$("$B" artifacts s-1 --download "$P/dl" 2>&1) || fail "1: tandem artifacts --download from S3: $dl"
case "$dl" in *"from S3"*) ;; *) fail "1: the download did not come from S3: $dl" ;; esac
cmp -s "$P/dl/out/w.safetensors" "$W_REF" || fail "1: the downloaded artifact differs"
note "1. s-1 succeeded; S3 holds commits $steps; artifact in s3://arts/a/s-1 and downloaded back equal"

# --- 2. stop mid-run, local checkpoints deleted, plants in S3, resume from S3
id=$("$B" run -d s) || fail "2: run -d exited $?"
[ "$id" = s-2 ] || fail "2: expected s-2, got $id"
# stopped right after its first checkpoint (a boto3 poll would be too slow for 60 steps)
for _ in $(seq 1200); do
  ls "$P/.tandem/runs/s-2/checkpoints" 2>/dev/null | grep -q '^ckpt-.*\.tdck$' && break
  sleep 0.05
done
stop=$("$B" stop s-2 2>&1) || fail "2: tandem stop: $stop"
st=$(wait_final s-2)
[ "$st" = stopped ] || fail "2: status $st, note $(field s-2 note)"
R2=$P/.tandem/runs/s-2
newest=$(ls "$R2/checkpoints" | sed -n 's/^ckpt-\([0-9]*\)\.tdck$/\1/p' | sort -n | tail -1)
[ -n "$newest" ] || fail "2: no local checkpoint after the stop"
[ "$newest" -lt 60 ] || fail "2: the run ended (step $newest) before the stop"
steps=$(committed runs/s-2/) || fail "2: boto3 sees bad commits"
case " $steps " in *" $newest "*) ;; *) fail "2: the stop's ckpt-$newest is not committed in S3 (commits: $steps)" ;; esac
# (by the upload thread when it saw the file before the workers exited, else by the agent's
# last upload as it ends)
grep -rq "uploaded ckpt-$newest.tdck ([0-9]* bytes" "$R2/logs" ||
  fail "2: no log line of the upload of ckpt-$newest: $(grep -rh 's3 checkpoints' "$R2/logs")"
rm -f "$R2"/checkpoints/*
boto <<'PY' || fail "2: planting"
import hashlib, os, boto3
s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
# a half upload: the object went up, its commit never did
s3.put_object(Bucket="ckpts", Key="runs/s-2/ckpt-9999.tdck", Body=b"TDCKPT\r\n half")
# a commit whose object is not the one it names
s3.put_object(Bucket="ckpts", Key="runs/s-2/ckpt-9998.tdck", Body=b"TDCKPT\r\n other")
s3.put_object(Bucket="ckpts", Key="runs/s-2/ckpt-9998.tdck.commit",
              Body=("tandem-checkpoint-commit 1\nobject ckpt-9998.tdck\nstep 9998\nnbytes 15\nsha256 %s\n" % ("0" * 64)).encode())
PY
out=$("$B" run --resume s-2 2>&1) || fail "2: tandem run --resume s-2 exited $?: $out"
log=$(cat "$R2"/logs/*.log; echo "$out")
grep -q "downloaded ckpt-$newest.tdck" <<<"$log" || fail "2: no download of ckpt-$newest from S3: $(grep 's3 ' <<<"$log")"
grep -q "skipping the committed ckpt-9998.tdck" <<<"$log" || fail "2: the mismatched commit was not named as skipped"
grep -q "ckpt-9999" <<<"$log" && fail "2: the uncommitted ckpt-9999 was considered: $(grep ckpt-9999 <<<"$log")"
grep -q "resuming from .*ckpt-$newest.tdck" <<<"$log" || fail "2: did not resume from ckpt-$newest: $(grep -i resum <<<"$log")"
[ "$(field s-2 status)" = succeeded ] || fail "2: after --resume: $(field s-2 status)"
cmp -s "$R2/artifacts/out/w.safetensors" "$W_REF" || fail "2: resumed weights differ from s-1's"
check_metrics s-2 "2. stop+resume from S3"
note "2. stopped at ckpt-$newest (committed by the ending agent), local copies deleted, resumed from S3, bitwise equal"

# --- 3. a bucket that does not exist
out=$("$B" run nobucket 2>&1) && fail "3: a run with a missing bucket succeeded: $out"
show=$("$B" show nobucket-1)
all="$out $show $(cat "$P"/.tandem/runs/nobucket-1/logs/*.log 2>/dev/null)"
case "$all" in *"no-such-bucket-$$"*"does not exist"*"aws s3 mb"*) ;;
  *) fail "3: the failure does not name the bucket and the fix: $all" ;; esac
ls "$P"/.tandem/runs/nobucket-1/logs/rank-*.log >/dev/null 2>&1 &&
  grep -q . "$P"/.tandem/runs/nobucket-1/logs/rank-*.log && fail "3: workers ran: $(cat "$P"/.tandem/runs/nobucket-1/logs/rank-*.log)"
[ "$(field nobucket-1 status)" = failed ] || fail "3: status $(field nobucket-1 status)"
note "3. missing bucket: failed before the workers, naming it"

# --- 4. S3 unreachable for a while: warnings, training goes on, later checkpoints committed
make_buckets() {
  boto <<'PY' || fail "creating the buckets"
import os, boto3
s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
for b in ("ckpts", "arts"): s3.create_bucket(Bucket=b)
PY
}
id=$("$B" run -d flaky) || fail "4: run -d exited $?"
for _ in $(seq 600); do
  [ -n "$(committed runs/flaky-1/ 2>/dev/null)" ] && break
  sleep 0.1
done
[ -n "$(committed runs/flaky-1/ 2>/dev/null)" ] || fail "4: no checkpoint committed in S3 after 60 s"
kill "$moto_pid"
wait "$moto_pid" 2>/dev/null
moto_pid=
for _ in $(seq 300); do
  grep -rqs "s3 checkpoints: uploading ckpt-[0-9]*.tdck to .* failed after" "$P/.tandem/runs/flaky-1/logs" && break
  sleep 0.1
done
warn=$(grep -rhs "s3 checkpoints: uploading ckpt-[0-9]*.tdck to .* failed after" "$P/.tandem/runs/flaky-1/logs" | head -1)
[ -n "$warn" ] || fail "4: no warning of a failed upload while S3 was away"
# the run's workers (not its agent, whose uploads must go on), frozen until S3 is back
workers=$(pgrep -f -- "^[^ ]*tandem train .*--steps 480 --checkpoint-every 10")
[ -n "$workers" ] || fail "4: the run's workers ended while S3 was away (training too fast for the test)"
kill -STOP $workers
MOTO_BIND_PORT=${AWS_ENDPOINT_URL##*:} start_moto "$P/moto.out" 127.0.0.1
moto_pid=$MOTO_PID
make_buckets
kill -CONT $workers
[ "$(wait_final flaky-1)" = succeeded ] || fail "4: status $(field flaky-1 status), note $(field flaky-1 note)"
steps=$(committed runs/flaky-1/) || fail "4: boto3 sees bad commits"
case " $steps" in *" 480") ;; *) fail "4: the last checkpoint (480) is not committed after S3 came back: '$steps'" ;; esac
# not only the agent's last upload at its end: the checkpoints after S3 came back went up too
[ "$(wc -w <<<"$steps")" -ge 2 ] || fail "4: only '$steps' committed: no upload after S3 came back"
note "4. S3 away mid-run: '${warn#*tandem: }'; the run succeeded and S3 holds $steps"

# --- 5. ssh: a host with its own credentials file
. "$SRC/tests/lib/sshd.sh"
REMOTE=$(mktemp -d /tmp/tandem-s3ssh-XXXXXX)
ssh_rc=0
sshd_up 1 "$P" "$REMOTE" || ssh_rc=$?
if [ "$ssh_rc" = 77 ]; then
  note "5. ssh part skipped: the sshd fixture cannot run here (root and namespaces needed)"
  rm -rf "$REMOTE"
  echo "PASS (without the ssh part) ($(($(date +%s) - T0)) s)"
  exit 0
fi
[ "$ssh_rc" = 0 ] || fail "5: the ssh host did not come up"
h1=${TSH_HOSTS[0]}
# moto in the login namespace, where the host reaches it
start_moto "$P/moto2.out" 10.81.0.1 sshd_exec
moto2_pid=$MOTO_PID
ep=http://10.81.0.1:$MOTO_PORT
AWS_ENDPOINT_URL=$ep sshd_exec "$py" - <<'PY' || fail "5: bucket in the second moto"
import os, boto3
boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"]).create_bucket(Bucket="ckpts")
PY
# the host's own credentials and region (its /root is a tmpfs of its own); the endpoint is a
# plain setting and travels with the workflow's env
sshd_host_exec 1 sh -c 'mkdir -p /root/.aws && printf "[default]\naws_access_key_id = hostkey\naws_secret_access_key = hostsecret\n" >/root/.aws/credentials && printf "[default]\nregion = us-east-1\n" >/root/.aws/config' ||
  fail "5: writing the host's credentials"
cat >>.tandem/workflows.yaml <<EOF
  - name: viassh
    executor: ssh
    ssh: {hosts: [$h1], work_dir: $REMOTE}
    checkpoint_dir: s3://ckpts/ssh
    env: {AWS_ENDPOINT_URL: "$ep"}
    commands:
      - $train --steps 20 --checkpoint-dir "\$TANDEM_CHECKPOINT_DIR" --checkpoint-every 10
EOF
(unset AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY AWS_REGION AWS_ENDPOINT_URL
  sshd_exec timeout -k 5 120 "$B" run viassh >"$P/ssh.out" 2>&1) || fail "5: tandem run viassh: exit $?: $(cat "$P/ssh.out")"
steps=$(AWS_ENDPOINT_URL=$ep sshd_exec "$py" - ssh/viassh-1/ <<'PY'
import hashlib, os, sys, boto3
s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
keys = [o["Key"] for o in s3.list_objects_v2(Bucket="ckpts", Prefix=sys.argv[1]).get("Contents", [])]
steps = []
for k in keys:
    if not k.endswith(".commit"): continue
    c = dict(l.split(" ", 1) for l in s3.get_object(Bucket="ckpts", Key=k)["Body"].read().decode().splitlines())
    body = s3.get_object(Bucket="ckpts", Key=k[:-len(".commit")])["Body"].read()
    assert len(body) == int(c["nbytes"]) and hashlib.sha256(body).hexdigest() == c["sha256"], k
    steps.append(int(c["step"]))
print(" ".join(str(s) for s in sorted(steps)))
PY
) || fail "5: boto3 reading the ssh run's commits"
case " $steps" in *" 20") ;; *) fail "5: commits of the ssh run: '$steps', expected the last, 20: $(cat "$P/ssh.out")" ;; esac
rm -rf "$REMOTE"
note "5. ssh run on $h1 (credentials from its ~/.aws): commits $steps in S3"
echo "PASS ($(($(date +%s) - T0)) s)"
