#!/usr/bin/env bash
# Where tandem's credentials come from, against boto3 (issue 29):
#   - the same environment and files, each way of naming a profile (none, AWS_PROFILE, a named
#     profile, "default" named): tandem picks the access key boto3.Session picks (a named
#     profile drops the environment's keys; AWS_PROFILE alone does not);
#   - a fake IMDSv2 whose session token or role credentials carry a control character
#     (CR/LF): refused, naming the source and the field, the value never shown.
# Skips (77) without the venv's boto3.
set -euo pipefail
venv=${TANDEM_VENV:-$TANDEM_SOURCE_DIR/.venv}
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import boto3' 2>/dev/null; then
  echo "SKIP: no boto3 in $venv (run scripts/venv.sh, or set TANDEM_VENV)"
  exit 77
fi
py=$venv/bin/python
driver=$TANDEM_BUILD_DIR/tests/cloud/cloud_driver
tmp=$(mktemp -d)
imds_pid=
cleanup() {
  [ -n "$imds_pid" ] && kill "$imds_pid" 2>/dev/null && wait "$imds_pid" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }

unset AWS_PROFILE AWS_DEFAULT_REGION AWS_SESSION_TOKEN AWS_CONFIG_FILE AWS_ENDPOINT_URL \
  AWS_EC2_METADATA_SERVICE_ENDPOINT AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY
export HOME=$tmp AWS_REGION=us-east-1 AWS_EC2_METADATA_DISABLED=true
export AWS_SHARED_CREDENTIALS_FILE=$tmp/credentials
cat > "$AWS_SHARED_CREDENTIALS_FILE" <<'EOF'
[default]
aws_access_key_id = AKIAFILEDEFAULT
aws_secret_access_key = secret-default
[p]
aws_access_key_id = AKIAFILEPROFILE
aws_secret_access_key = secret-p
EOF

# compare ENV_KEYS(0/1) AWS_PROFILE(""/name) NAMED(""/name)
compare() {
  local env_keys=$1 aws_profile=$2 named=$3 ours theirs
  (
    if [ "$env_keys" = 1 ]; then
      export AWS_ACCESS_KEY_ID=AKIAENVIRONMENT AWS_SECRET_ACCESS_KEY=secret-env
    fi
    [ -n "$aws_profile" ] && export AWS_PROFILE=$aws_profile
    ours=$("$driver" creds $named | sed -n 's/^key_id //p') || exit 1
    theirs=$(NAMED=$named "$py" -c '
import os, boto3
s = boto3.Session(profile_name=os.environ["NAMED"] or None)
print(s.get_credentials().access_key)')
    echo "env keys $env_keys, AWS_PROFILE '$aws_profile', named '$named': tandem $ours, boto3 $theirs"
    [ -n "$ours" ] && [ "$ours" = "$theirs" ]
  ) || fail "tandem and boto3 disagree (env keys $env_keys, AWS_PROFILE '$aws_profile', named '$named')"
}
compare 1 "" ""
compare 1 p ""
compare 1 "" p
compare 1 "" default
compare 1 p default
compare 0 p ""
compare 0 "" p

# ---- a fake IMDSv2 answering with control characters ----
: > "$tmp/imds.log"
MODE_FILE=$tmp/mode "$py" - <<'PY' > "$tmp/imds.log" 2>&1 &
import http.server, json, os
class H(http.server.BaseHTTPRequestHandler):
    def mode(self):
        return open(os.environ["MODE_FILE"]).read().strip()
    def reply(self, code, body):
        self.send_response(code); self.send_header("Content-Length", str(len(body)))
        self.end_headers(); self.wfile.write(body.encode())
    def do_PUT(self):
        tok = "tok\r\nX-Injected: 1" if self.mode() == "token" else "tok"
        self.reply(200, tok)
    def do_GET(self):
        # accepts "tok": what a client that cut the token at its first line would send
        if self.headers.get("X-aws-ec2-metadata-token") != "tok":
            return self.reply(401, "")
        base = "/latest/meta-data/iam/security-credentials/"
        if self.path == base: return self.reply(200, "node-role")
        secret = "sec\r\nret-value" if self.mode() == "creds" else "secret"
        doc = {"Code": "Success", "AccessKeyId": "AKIAROLE", "SecretAccessKey": secret,
               "Token": "role-token", "Expiration": "2099-01-01T00:00:00Z"}
        if self.path == base + "node-role": return self.reply(200, json.dumps(doc))
        self.reply(404, "")
    def log_message(self, *a): pass
s = http.server.HTTPServer(("127.0.0.1", 0), H)
print("port", s.server_address[1], flush=True)
s.serve_forever()
PY
imds_pid=$!
echo ok > "$tmp/mode"
port=
for _ in $(seq 100); do
  port=$(sed -n 's/^port \([0-9]*\)$/\1/p' "$tmp/imds.log")
  [ -n "$port" ] && break
  kill -0 "$imds_pid" 2>/dev/null || { cat "$tmp/imds.log"; fail "the fake IMDS exited"; }
  sleep 0.1
done
[ -n "$port" ] || fail "the fake IMDS did not start"
export AWS_SHARED_CREDENTIALS_FILE=$tmp/none AWS_EC2_METADATA_SERVICE_ENDPOINT=http://127.0.0.1:$port
unset AWS_EC2_METADATA_DISABLED
"$driver" creds > "$tmp/ok.out" 2>&1 || { cat "$tmp/ok.out"; fail "the fake IMDS's clean answer"; }
grep -q "key_id AKIAROLE" "$tmp/ok.out" || fail "not the role's key: $(cat "$tmp/ok.out")"
echo token > "$tmp/mode"
"$driver" creds > "$tmp/tok.out" 2>&1 && fail "a token with CR/LF was used: $(cat "$tmp/tok.out")"
cat "$tmp/tok.out"
grep -q "latest/api/token: the session token has a control character" "$tmp/tok.out" ||
  fail "the token's control character is not named"
grep -q "X-Injected" "$tmp/tok.out" && fail "the token was shown"
echo creds > "$tmp/mode"
"$driver" creds > "$tmp/creds.out" 2>&1 && fail "a secret with CR/LF was used: $(cat "$tmp/creds.out")"
cat "$tmp/creds.out"
grep -q "instance role 'node-role'.*SecretAccessKey has a control character" "$tmp/creds.out" ||
  fail "the secret's control character is not named with its source"
grep -q "ret-value" "$tmp/creds.out" && fail "the secret was shown"
echo "ok"
