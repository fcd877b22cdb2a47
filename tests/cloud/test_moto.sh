#!/usr/bin/env bash
# tandem's AWS client against moto's server (EC2 and S3 in one local process), checked with
# boto3, never with tandem's own reading of the account:
#   - moto with IAM authentication on (/moto-api/reset-auth after the setup), so every request
#     of tandem's is checked against botocore's SigV4 by moto, with an IAM user's keys;
#   - RunInstances of 2 tagged instances, DescribeInstances by tag, TerminateInstances: boto3
#     sees the 2 instances with their tags, key and type, and ends with them terminated;
#   - S3: a small and a multipart (> 5 MiB, 3 parts) object put, listed in pages of 1, got back
#     and compared byte for byte; boto3 reads the same bytes and the SHA-256 stored with them;
#     a multipart upload that S3 refuses (EntityTooSmall) is aborted: no object, no upload left;
#     deleted: boto3 lists nothing;
#   - errors, each named: bad secret (AuthFailure / SignatureDoesNotMatch), unknown access key,
#     missing key pair, unknown instance type, missing object (and no file left by the get);
#   - credentials from an instance role through a fake IMDSv2 (token required) serving moto STS
#     temporary credentials (with a session token), used against moto with auth on;
#   - issue 29: a key with "." and ".." segments is stored as written (boto3 lists it so; libcurl
#     used to resolve it into another key); an s3:// prefix with them is refused; a describe of
#     6 reservations in pages of 5 gives what boto3's paginator gives; a capacity refusal (500
#     InsufficientInstanceCapacity) is sent once, not retried in place; a server that takes the
#     upload and goes silent fails it as a stall, once, named.
# Skips (77) without the venv (scripts/venv.sh: moto[server], boto3).
set -euo pipefail
venv=${TANDEM_VENV:-$TANDEM_SOURCE_DIR/.venv}
if [ ! -x "$venv/bin/moto_server" ]; then
  echo "SKIP: no moto_server in $venv (run scripts/venv.sh, or set TANDEM_VENV)"
  exit 77
fi
py=$venv/bin/python
driver=$TANDEM_BUILD_DIR/tests/cloud/cloud_driver
tmp=$(mktemp -d)
moto_pid= imds_pid= flaky_pid= stall_pid=
cleanup() {
  [ -n "$moto_pid" ] && kill "$moto_pid" 2>/dev/null && wait "$moto_pid" 2>/dev/null || true
  [ -n "$imds_pid" ] && kill "$imds_pid" 2>/dev/null && wait "$imds_pid" 2>/dev/null || true
  [ -n "$flaky_pid" ] && kill "$flaky_pid" 2>/dev/null && wait "$flaky_pid" 2>/dev/null || true
  [ -n "$stall_pid" ] && kill "$stall_pid" 2>/dev/null && wait "$stall_pid" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; [ -f "$tmp/moto.log" ] && tail -20 "$tmp/moto.log"; exit 1; }

# moto on a port of its choosing (port 0), read back from its log
: > "$tmp/moto.log"
MOTO_ENABLE_KEYPAIR_VALIDATION=true MOTO_EC2_ENABLE_INSTANCE_TYPE_VALIDATION=true \
  S3_UPLOAD_PART_MIN_SIZE=5242881 \
  "$venv/bin/moto_server" -H 127.0.0.1 -p 0 > "$tmp/moto.log" 2>&1 &
moto_pid=$!
port=
for _ in $(seq 100); do
  port=$(sed -n 's|.*Running on http://127.0.0.1:\([0-9]*\).*|\1|p' "$tmp/moto.log" | head -1)
  [ -n "$port" ] && break
  kill -0 "$moto_pid" 2>/dev/null || fail "moto_server exited"
  sleep 0.1
done
[ -n "$port" ] || fail "moto_server did not say its port in 10 s"
endpoint=http://127.0.0.1:$port
echo "moto at $endpoint"

# a clean environment: no ~/.aws, no credentials of the machine running the test
export HOME=$tmp AWS_REGION=us-east-1 AWS_ENDPOINT_URL=$endpoint AWS_EC2_METADATA_DISABLED=true
unset AWS_PROFILE AWS_DEFAULT_REGION AWS_ENDPOINT_URL_EC2 AWS_ENDPOINT_URL_S3 AWS_SESSION_TOKEN \
  AWS_SHARED_CREDENTIALS_FILE AWS_CONFIG_FILE AWS_EC2_METADATA_SERVICE_ENDPOINT
export AWS_ACCESS_KEY_ID=setup AWS_SECRET_ACCESS_KEY=setup
export ENDPOINT=$endpoint TMP=$tmp

# setup with boto3 while moto accepts anything: an IAM user allowed everything, a key pair, a
# bucket, a role the user may assume (for the IMDS case); then authentication on
"$py" - <<'PY' > "$tmp/setup.env"
import json, os, boto3, urllib.request
ep = os.environ["ENDPOINT"]
kw = dict(endpoint_url=ep, region_name="us-east-1")
iam = boto3.client("iam", **kw)
iam.create_user(UserName="tandem")
iam.put_user_policy(UserName="tandem", PolicyName="all", PolicyDocument=json.dumps(
    {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
k = iam.create_access_key(UserName="tandem")["AccessKey"]
trust = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
         "Principal": {"AWS": "arn:aws:iam::123456789012:user/tandem"}}]}
role = iam.create_role(RoleName="node", AssumeRolePolicyDocument=json.dumps(trust))["Role"]
iam.put_role_policy(RoleName="node", PolicyName="all", PolicyDocument=json.dumps(
    {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
ec2 = boto3.client("ec2", **kw)
ec2.create_key_pair(KeyName="tandem-key")
image = ec2.describe_images()["Images"][0]["ImageId"]
boto3.client("s3", **kw).create_bucket(Bucket="tandem-test")
req = urllib.request.Request(ep + "/moto-api/reset-auth", data=b"0", method="POST",
                             headers={"Content-Type": "text/plain"})
urllib.request.urlopen(req).read()
print(f"KEY_ID={k['AccessKeyId']}\nSECRET={k['SecretAccessKey']}\nIMAGE={image}")
print(f"ROLE_ARN={role['Arn']}")
PY
. "$tmp/setup.env"
export AWS_ACCESS_KEY_ID=$KEY_ID AWS_SECRET_ACCESS_KEY=$SECRET

# ---- EC2 ----
run=run-$$-$RANDOM
"$driver" ec2-run "$run" "$IMAGE" t3.micro 2 tandem-key > "$tmp/run.out" || {
  cat "$tmp/run.out"; fail "ec2-run"; }
cat "$tmp/run.out"
[ "$(wc -l < "$tmp/run.out")" = 2 ] || fail "ec2-run made $(wc -l < "$tmp/run.out") instances, not 2"
ids=$(awk '{print $1}' "$tmp/run.out" | sort | tr '\n' ' ')
"$driver" ec2-describe "$run" > "$tmp/desc.out" || { cat "$tmp/desc.out"; fail "ec2-describe"; }
[ "$(awk '{print $1}' "$tmp/desc.out" | sort | tr '\n' ' ')" = "$ids" ] ||
  fail "describe by tag found '$(cat "$tmp/desc.out")', expected $ids"
grep -qv " $run t3.micro tandem-key$" "$tmp/desc.out" && fail "describe: $(cat "$tmp/desc.out")"
# the same ClientToken again: the same instances, none new (idempotency)
"$driver" ec2-run "$run" "$IMAGE" t3.micro 2 tandem-key > "$tmp/run2.out" || fail "ec2-run again"
ids2=$(awk '{print $1}' "$tmp/run2.out" | sort | tr '\n' ' ')
if [ "$ids2" != "$ids" ]; then
  echo "note: moto ignores ClientToken (got $ids2): terminating those"
  # shellcheck disable=SC2086
  "$driver" ec2-terminate $ids2 > /dev/null || fail "ec2-terminate $ids2"
fi
export RUN=$run IDS=$ids
"$py" - <<'PY' || fail "boto3 does not see the instances as tandem made them"
import os, boto3
ec2 = boto3.client("ec2", endpoint_url=os.environ["ENDPOINT"], region_name="us-east-1")
r = ec2.describe_instances(Filters=[{"Name": "tag:tandem:run", "Values": [os.environ["RUN"]]}])
inst = {i["InstanceId"]: i for res in r["Reservations"] for i in res["Instances"]}
want = set(os.environ["IDS"].split())
assert want <= set(inst), (want, set(inst))
for i in want:
    x = inst[i]
    tags = {t["Key"]: t["Value"] for t in x.get("Tags", [])}
    assert tags.get("tandem:run") == os.environ["RUN"] and tags.get("Name") == "tandem-test", tags
    assert x["InstanceType"] == "t3.micro" and x["KeyName"] == "tandem-key", x
    assert x["State"]["Name"] in ("pending", "running"), x["State"]
print("boto3: instances", sorted(want), "tagged tandem:run and Name, t3.micro, tandem-key")
PY
# shellcheck disable=SC2086
"$driver" ec2-terminate $ids > "$tmp/term.out" || { cat "$tmp/term.out"; fail "ec2-terminate"; }
cat "$tmp/term.out"
"$driver" ec2-describe "$run" running > "$tmp/desc2.out" || fail "ec2-describe running"
[ ! -s "$tmp/desc2.out" ] || fail "still running after terminate: $(cat "$tmp/desc2.out")"
"$py" - <<'PY' || fail "boto3 does not see the instances terminated"
import os, boto3
ec2 = boto3.client("ec2", endpoint_url=os.environ["ENDPOINT"], region_name="us-east-1")
ids = os.environ["IDS"].split()
r = ec2.describe_instances(InstanceIds=ids)
states = {i["InstanceId"]: i["State"]["Name"] for res in r["Reservations"] for i in res["Instances"]}
assert all(states[i] == "terminated" for i in ids), states
print("boto3: terminated", states)
PY

# errors: each a typed error and a message that names the thing
expect_error() { # expect_error CODE KIND -- driver args...
  local code=$1 kind=$2; shift 3
  if "$driver" "$@" > "$tmp/err.out" 2> "$tmp/err.txt"; then fail "$* succeeded"; fi
  cat "$tmp/err.txt"
  grep -q "code=$code " "$tmp/err.out" && grep -q "kind=$kind " "$tmp/err.out" ||
    fail "$*: expected code=$code kind=$kind, got $(cat "$tmp/err.out")"
  grep -q -- "$SECRET" "$tmp/err.txt" "$tmp/err.out" && fail "a secret in the error output" || true
}
expect_error InvalidKeyPair.NotFound notfound -- ec2-run "$run-x" "$IMAGE" t3.micro 1 no-such-key
grep -q "no-such-key" "$tmp/err.txt" && grep -q "import-key-pair" "$tmp/err.txt" ||
  fail "the key pair error does not name the key and the fix"
expect_error InvalidInstanceType.NotFound invalid -- ec2-run "$run-y" "$IMAGE" t9.mega 1 tandem-key
grep -q "t9.mega" "$tmp/err.txt" || fail "the instance type error does not name the type"
AWS_SECRET_ACCESS_KEY=wrong-secret expect_error AuthFailure auth -- ec2-describe "$run"
grep -q "environment (AWS_ACCESS_KEY_ID)" "$tmp/err.txt" || fail "auth error without the source"
AWS_SECRET_ACCESS_KEY=wrong-secret expect_error SignatureDoesNotMatch auth -- \
  s3-list tandem-test "" 10
AWS_ACCESS_KEY_ID=AKIANOSUCHKEY000000 expect_error InvalidAccessKeyId auth -- \
  s3-list tandem-test "" 10
# HEAD answers have no body: the status alone, classified
AWS_ACCESS_KEY_ID=AKIANOSUCHKEY000000 expect_error AccessDenied auth -- \
  s3-head tandem-test nothing

# ---- S3 ----
head -c 1000 /dev/urandom > "$tmp/small.bin"
head -c $((12 * 1024 * 1024 + 12345)) /dev/urandom > "$tmp/big.bin"
export CLOUD_DRIVER_PART_MIB=6 # 3 parts: 6 + 6 + 0.01 MiB (moto's minimum here is 5 MiB + 1)
for f in small big; do
  "$driver" s3-put tandem-test "ckpt/$run/$f.bin" "$tmp/$f.bin" > "$tmp/put-$f.out" ||
    { cat "$tmp/put-$f.out"; fail "s3-put $f"; }
  [ "$(cat "$tmp/put-$f.out")" = "$(sha256sum < "$tmp/$f.bin" | cut -d' ' -f1)" ] ||
    fail "s3-put $f printed the wrong sha256"
done
"$driver" s3-put tandem-test "other/$run.bin" "$tmp/small.bin" > /dev/null || fail "s3-put other"
"$driver" s3-list tandem-test "ckpt/$run/" 1 > "$tmp/list.out" || { cat "$tmp/list.out"; fail "list"; }
cat "$tmp/list.out"
[ "$(awk '{print $1 " " $2}' "$tmp/list.out")" = "ckpt/$run/big.bin $((12 * 1024 * 1024 + 12345))
ckpt/$run/small.bin 1000" ] || fail "list (pages of 1) gave $(cat "$tmp/list.out")"
grep -q "big.bin .*-3$" "$tmp/list.out" || fail "big.bin was not a 3-part multipart upload"
for f in small big; do
  "$driver" s3-get tandem-test "ckpt/$run/$f.bin" "$tmp/$f.got" > "$tmp/get.out" ||
    { cat "$tmp/get.out"; fail "s3-get $f"; }
  cmp "$tmp/$f.bin" "$tmp/$f.got" || fail "s3-get $f: the bytes differ"
done
"$driver" s3-head tandem-test "ckpt/$run/big.bin" > "$tmp/head.out" || fail "s3-head"
[ "$(cut -d' ' -f2 "$tmp/head.out")" = "$(sha256sum < "$tmp/big.bin" | cut -d' ' -f1)" ] ||
  fail "s3-head: the stored sha256 is $(cat "$tmp/head.out")"
export TMP=$tmp
"$py" - <<'PY' || fail "boto3 does not read the objects tandem wrote"
import hashlib, os, boto3
s3 = boto3.client("s3", endpoint_url=os.environ["ENDPOINT"], region_name="us-east-1")
for f in ("small", "big"):
    local = open(os.path.join(os.environ["TMP"], f + ".bin"), "rb").read()
    o = s3.get_object(Bucket="tandem-test", Key=f"ckpt/{os.environ['RUN']}/{f}.bin")
    body = o["Body"].read()
    want = hashlib.sha256(local).hexdigest()
    assert hashlib.sha256(body).hexdigest() == want, f
    assert o["Metadata"].get("tandem-sha256") == want, o["Metadata"]
    print(f"boto3: {f}.bin {len(body)} bytes, sha256 {want[:16]}..., ETag {o['ETag']}")
assert not s3.list_multipart_uploads(Bucket="tandem-test").get("Uploads"), "uploads left"
PY
# a multipart upload S3 refuses (parts of 5 MiB, under this moto's minimum): aborted, nothing left
CLOUD_DRIVER_PART_MIB=5 expect_error EntityTooSmall invalid -- \
  s3-put tandem-test "ckpt/$run/refused.bin" "$tmp/big.bin"
grep -q "aborted" "$tmp/err.txt" || fail "the refused upload does not say it was aborted"
"$py" - <<'PY' || fail "the refused multipart upload left something behind"
import os, boto3
s3 = boto3.client("s3", endpoint_url=os.environ["ENDPOINT"], region_name="us-east-1")
assert not s3.list_multipart_uploads(Bucket="tandem-test").get("Uploads"), "an upload is left"
keys = [o["Key"] for o in s3.list_objects_v2(Bucket="tandem-test").get("Contents", [])]
assert not any(k.endswith("refused.bin") for k in keys), keys
print("boto3: no refused.bin, no multipart upload left")
PY
expect_error NoSuchKey notfound -- s3-get tandem-test "ckpt/$run/missing" "$tmp/missing.got"
[ -z "$(ls "$tmp" | grep missing.got)" ] || fail "a failed get left $(ls "$tmp" | grep missing)"
expect_error NotFound notfound -- s3-head tandem-test "ckpt/$run/missing"
expect_error NoSuchBucket notfound -- s3-put no-such-bucket-x k "$tmp/small.bin"
for k in "ckpt/$run/small.bin" "ckpt/$run/big.bin" "other/$run.bin"; do
  "$driver" s3-delete tandem-test "$k" || fail "s3-delete $k"
done
"$py" - <<'PY' || fail "boto3 still sees objects after the deletes"
import os, boto3
s3 = boto3.client("s3", endpoint_url=os.environ["ENDPOINT"], region_name="us-east-1")
left = s3.list_objects_v2(Bucket="tandem-test").get("Contents", [])
assert not left, [o["Key"] for o in left]
print("boto3: the bucket is empty")
PY

# ---- issue 29: keys are sent as written, never resolved ----
dotkey="dots/$run/a/../b/./c"
"$driver" s3-put tandem-test "$dotkey" "$tmp/small.bin" > /dev/null || fail "s3-put $dotkey"
"$driver" s3-get tandem-test "$dotkey" "$tmp/dot.got" > /dev/null || fail "s3-get $dotkey"
cmp "$tmp/small.bin" "$tmp/dot.got" || fail "s3-get $dotkey: the bytes differ"
export DOTKEY=$dotkey
"$py" - <<'PY' || fail "the key with dot segments was not stored as written"
import os, boto3
s3 = boto3.client("s3", endpoint_url=os.environ["ENDPOINT"], region_name="us-east-1")
keys = [o["Key"] for o in s3.list_objects_v2(Bucket="tandem-test").get("Contents", [])]
assert keys == [os.environ["DOTKEY"]], keys
body = s3.get_object(Bucket="tandem-test", Key=os.environ["DOTKEY"])["Body"].read()
assert body == open(os.path.join(os.environ["TMP"], "small.bin"), "rb").read()
s3.delete_object(Bucket="tandem-test", Key=os.environ["DOTKEY"])
print("boto3: the key", keys[0], "as tandem wrote it")
PY
for url in "s3://tandem-test/../other/x" "s3://tandem-test/a/./b" "s3://tandem-test/a//b"; do
  if "$driver" s3-url "$url" > "$tmp/url.out" 2> "$tmp/url.txt"; then
    fail "s3-url $url accepted: $(cat "$tmp/url.out")"
  fi
  grep -qF "'$url'" "$tmp/url.txt" && grep -q "write s3://BUCKET/PREFIX" "$tmp/url.txt" ||
    fail "s3-url $url: $(cat "$tmp/url.txt")"
done
echo "dot segments: a key as written; s3:// prefixes with them refused"

# DescribeInstances over two pages (moto pages by reservation): tandem and boto3's paginator
# find the same instances
export PAGED=paged-$$-$RANDOM
"$py" - <<'PY' > "$tmp/paged.ids" || fail "boto3 could not make 6 reservations"
import os, boto3
ec2 = boto3.client("ec2", endpoint_url=os.environ["ENDPOINT"], region_name="us-east-1")
image = ec2.describe_images()["Images"][0]["ImageId"]
tag = [{"ResourceType": "instance", "Tags": [{"Key": "tandem:run", "Value": os.environ["PAGED"]}]}]
for _ in range(6):
    ec2.run_instances(ImageId=image, InstanceType="t3.micro", MinCount=1, MaxCount=1,
                      TagSpecifications=tag)
f = [{"Name": "tag:tandem:run", "Values": [os.environ["PAGED"]]}]
pages = list(ec2.get_paginator("describe_instances").paginate(
    Filters=f, PaginationConfig={"PageSize": 5}))
assert len(pages) >= 2, f"{len(pages)} page(s): moto no longer pages by 5"
for p in pages:
    for r in p["Reservations"]:
        for i in r["Instances"]:
            print(i["InstanceId"])
PY
CLOUD_DRIVER_EC2_PAGE=5 "$driver" ec2-describe "$PAGED" > "$tmp/paged.out" ||
  { cat "$tmp/paged.out"; fail "ec2-describe in pages of 5"; }
[ "$(awk '{print $1}' "$tmp/paged.out" | sort | tr '\n' ' ')" = \
  "$(sort "$tmp/paged.ids" | tr '\n' ' ')" ] ||
  fail "pages of 5: tandem found $(awk '{print $1}' "$tmp/paged.out" | tr '\n' ' '), boto3's paginator $(tr '\n' ' ' < "$tmp/paged.ids")"
[ "$(wc -l < "$tmp/paged.ids")" = 6 ] || fail "boto3's paginator found $(wc -l < "$tmp/paged.ids") instances"
# shellcheck disable=SC2046
"$driver" ec2-terminate $(cat "$tmp/paged.ids") > /dev/null || fail "terminating the paged ones"
echo "describe: 6 instances over 2 pages of 5, as boto3's paginator"

# ---- retries: a server that throttles twice (503 SlowDown), then answers; and one that fails
# every time (500): retried with backoff up to the driver's 3 attempts, then a named error ----
: > "$tmp/flaky.log" # before the reader looks, however late the job starts
"$py" - <<'PY' > "$tmp/flaky.log" 2>&1 &
import http.server
n = {"count": 0}
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        n["count"] += 1
        print("request", n["count"], self.path, flush=True)
        if self.path.startswith("/broken"):
            code, body = 500, "<Error><Code>InternalError</Code><Message>boom</Message></Error>"
        elif n["count"] <= 2:
            code, body = 503, "<Error><Code>SlowDown</Code><Message>Reduce your rate</Message></Error>"
        else:
            code, body = 200, ("<ListBucketResult><IsTruncated>false</IsTruncated><Contents>"
                               "<Key>k</Key><Size>3</Size><ETag>\"e\"</ETag></Contents></ListBucketResult>")
        self.send_response(code); self.send_header("Content-Length", str(len(body)))
        self.end_headers(); self.wfile.write(body.encode())
    def do_POST(self): # EC2: no capacity, as the fixture's proxy and EC2 answer it
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        print("post", self.path, flush=True)
        body = ("<Response><Errors><Error><Code>InsufficientInstanceCapacity</Code><Message>We "
                "currently do not have sufficient t3.micro capacity</Message></Error></Errors>"
                "<RequestID>r-1</RequestID></Response>")
        self.send_response(500); self.send_header("Content-Length", str(len(body)))
        self.end_headers(); self.wfile.write(body.encode())
    def log_message(self, *a): pass
s = http.server.HTTPServer(("127.0.0.1", 0), H)
print("port", s.server_address[1], flush=True)
s.serve_forever()
PY
flaky_pid=$!
flaky_port=
for _ in $(seq 100); do
  flaky_port=$(sed -n 's/^port \([0-9]*\)$/\1/p' "$tmp/flaky.log")
  [ -n "$flaky_port" ] && break
  sleep 0.1
done
[ -n "$flaky_port" ] || fail "the flaky server did not start"
AWS_ENDPOINT_URL_S3=http://127.0.0.1:$flaky_port "$driver" s3-list flaky "" 10 > "$tmp/flaky.out" ||
  { cat "$tmp/flaky.out"; kill "$flaky_pid"; fail "s3-list did not get through two 503s"; }
[ "$(cat "$tmp/flaky.out")" = "k 3 e" ] || fail "s3-list through retries gave $(cat "$tmp/flaky.out")"
[ "$(grep -c '^request' "$tmp/flaky.log")" = 3 ] || fail "expected 3 requests: $(cat "$tmp/flaky.log")"
AWS_ENDPOINT_URL_S3=http://127.0.0.1:$flaky_port expect_error InternalError server -- \
  s3-list broken "" 10
grep -q "after 3 attempts" "$tmp/err.txt" || fail "the 500 error does not say how often it tried"
[ "$(grep -c 'broken' "$tmp/flaky.log")" = 3 ] || fail "expected 3 tries of /broken"
# a capacity refusal is the caller's to decide (another type, zone, market): one RunInstances,
# never retried in place
AWS_ENDPOINT_URL_EC2=http://127.0.0.1:$flaky_port expect_error InsufficientInstanceCapacity \
  capacity -- ec2-run "$run-cap" "$IMAGE" t3.micro 1
[ "$(grep -c '^post' "$tmp/flaky.log")" = 1 ] ||
  fail "a capacity refusal was retried in place: $(grep -c '^post' "$tmp/flaky.log") RunInstances"
kill "$flaky_pid"; wait "$flaky_pid" 2>/dev/null || true
flaky_pid=
# and nothing listening: a network error, retried, named with the endpoint
AWS_ENDPOINT_URL_S3=http://127.0.0.1:1 expect_error curl:7 network -- s3-list x "" 10
echo "retries: 2 x 503 then 200 in 3 requests; 3 x 500 and a closed port reported;" \
  "a capacity refusal sent once"

# ---- a server that takes an upload and goes silent: a stall, failed once, named ----
: > "$tmp/stall.log"
"$py" - <<'PY' > "$tmp/stall.log" 2>&1 &
import socket, threading
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(8)
print("port", s.getsockname()[1], flush=True)
held = []
while True:
    c, _ = s.accept()
    held.append(c) # never read, never answered, never closed
    print("accepted", flush=True)
PY
stall_pid=$!
stall_port=
for _ in $(seq 100); do
  stall_port=$(sed -n 's/^port \([0-9]*\)$/\1/p' "$tmp/stall.log")
  [ -n "$stall_port" ] && break
  sleep 0.1
done
[ -n "$stall_port" ] || fail "the silent server did not start"
CLOUD_DRIVER_STALL_S=2 AWS_ENDPOINT_URL_S3=http://127.0.0.1:$stall_port expect_error curl:28 \
  network -- s3-put stall "k" "$tmp/big.bin"
kill "$stall_pid"; wait "$stall_pid" 2>/dev/null || true
grep -q "the transfer stalled: under 1024 bytes/s for 2 s after 127.0.0.1:$stall_port" \
  "$tmp/err.txt" || fail "the stall is not named: $(cat "$tmp/err.txt")"
grep -q "after 3 attempts" "$tmp/err.txt" && fail "a stall was retried: $(cat "$tmp/err.txt")"
[ "$(grep -c '^accepted' "$tmp/stall.log")" = 1 ] ||
  fail "a stall was retried: $(grep -c '^accepted' "$tmp/stall.log") connections"
echo "stall: one attempt, failed and named"

# ---- the instance role: a fake IMDSv2 serving STS credentials of the role ----
export ROLE_ARN
: > "$tmp/imds.log" # before the reader looks, however late the job starts
"$py" - <<'PY' > "$tmp/imds.log" 2>&1 &
import boto3, json, os, http.server, sys
sts = boto3.client("sts", endpoint_url=os.environ["ENDPOINT"], region_name="us-east-1")
c = sts.assume_role(RoleArn=os.environ["ROLE_ARN"], RoleSessionName="node")["Credentials"]
doc = json.dumps({"Code": "Success", "Type": "AWS-HMAC", "AccessKeyId": c["AccessKeyId"],
                  "SecretAccessKey": c["SecretAccessKey"], "Token": c["SessionToken"],
                  "Expiration": c["Expiration"].strftime("%Y-%m-%dT%H:%M:%SZ")})
class H(http.server.BaseHTTPRequestHandler):
    def reply(self, code, body):
        self.send_response(code); self.end_headers(); self.wfile.write(body.encode())
    def do_PUT(self):
        ok = self.path == "/latest/api/token" and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")
        self.reply(200 if ok else 400, "tok-123" if ok else "")
    def do_GET(self):
        if self.headers.get("X-aws-ec2-metadata-token") != "tok-123":
            return self.reply(401, "")
        base = "/latest/meta-data/iam/security-credentials/"
        if self.path == base: return self.reply(200, "node-role\n")
        if self.path == base + "node-role": return self.reply(200, doc)
        self.reply(404, "")
    def log_message(self, *a): pass
s = http.server.HTTPServer(("127.0.0.1", 0), H)
print("port", s.server_address[1], flush=True)
s.serve_forever()
PY
imds_pid=$!
imds_port=
for _ in $(seq 100); do
  imds_port=$(sed -n 's/^port \([0-9]*\)$/\1/p' "$tmp/imds.log")
  [ -n "$imds_port" ] && break
  kill -0 "$imds_pid" 2>/dev/null || { cat "$tmp/imds.log"; fail "the fake IMDS exited"; }
  sleep 0.1
done
[ -n "$imds_port" ] || fail "the fake IMDS did not start"
(
  unset AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY AWS_EC2_METADATA_DISABLED
  export AWS_EC2_METADATA_SERVICE_ENDPOINT=http://127.0.0.1:$imds_port
  "$driver" creds > "$tmp/creds.out" || { cat "$tmp/creds.out"; exit 1; }
  cat "$tmp/creds.out"
  grep -q "instance role 'node-role'" "$tmp/creds.out" && grep -q "token yes" "$tmp/creds.out"
  "$driver" ec2-describe "$run" > "$tmp/desc3.out" || { cat "$tmp/desc3.out"; exit 1; }
  [ "$(wc -l < "$tmp/desc3.out")" = 2 ]
  # and switched off
  AWS_EC2_METADATA_DISABLED=true "$driver" creds > "$tmp/off.out" 2>&1 && exit 1
  grep -q "AWS_EC2_METADATA_DISABLED" "$tmp/off.out"
) || fail "credentials from the instance role"
echo "instance role: IMDSv2 credentials with a session token accepted by moto"
echo "ok"
