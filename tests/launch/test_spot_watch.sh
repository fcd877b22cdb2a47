#!/usr/bin/env bash
# The node agent's spot watch (TANDEM_SPOT_WATCH=1, src/launch/spot_watch.c) against a fake
# IMDSv2 on 127.0.0.1 (token required: PUT /latest/api/token with a TTL header, 401 without a
# token; 404 for the notices until the test posts them):
#   (a) a 2-worker training: a rebalance recommendation only logs (the job goes on); an
#       instance-action notice makes the agent log it, stop the workers as a SIGTERM does
#       (they checkpoint at the stop step) and exit 143 within seconds; its end record says why;
#   (b) --forward-stdio: the mirror stream carries the notes `rebalance TIME` and
#       `interrupted terminate TIME`, decoded frame by frame;
#   (c) an IMDS that answers 401 to everything, and (d) one that is not there: one warning,
#       polling goes on quietly, the job ends normally.
set -uo pipefail
: "${TANDEM_BIN:?}" "${TANDEM_DATA:?}"
py=${PYTHON:-/usr/bin/python3}
work=$(mktemp -d /tmp/tandem-spot-XXXXXX)
imds_pid= launcher= feeder=
cleanup() {
    [ -n "$launcher" ] && kill -9 "$launcher" 2>/dev/null
    [ -n "$feeder" ] && kill "$feeder" 2>/dev/null
    [ -n "$imds_pid" ] && kill "$imds_pid" 2>/dev/null && wait "$imds_pid" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT
fail() {
    echo "FAIL: $*" >&2
    for f in "$work"/*.log "$work"/logs-*/*.log; do
        [ -f "$f" ] && { echo "--- $f" >&2; tail -15 "$f" >&2; }
    done
    exit 1
}

# ---- the fake IMDSv2: the notices are files in $work/imds (posted with an atomic rename)
mkdir -p "$work/imds"
"$py" - "$work/imds" >"$work/imds.log" 2>&1 <<'PY' &
import http.server, os, secrets, sys, time
d = sys.argv[1]
tokens = {}
def posted(name):
    try:
        with open(os.path.join(d, name)) as f:
            return f.read()
    except OSError:
        return None
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def reply(self, code, body=""):
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        print("request", self.command, self.path, code, flush=True)
    def do_PUT(self):
        if posted("refuse"): return self.reply(401, "Unauthorized")
        ttl = self.headers.get("X-aws-ec2-metadata-token-ttl-seconds", "")
        if self.path != "/latest/api/token" or not ttl.isdigit() or not 1 <= int(ttl) <= 21600:
            return self.reply(400, "Bad Request")
        t = secrets.token_hex(16)
        tokens[t] = time.monotonic() + int(ttl)
        self.reply(200, t)
    def do_GET(self):
        t = self.headers.get("X-aws-ec2-metadata-token")
        if posted("refuse") or t is None or tokens.get(t, 0) < time.monotonic():
            return self.reply(401, "Unauthorized")
        files = {"/latest/meta-data/spot/instance-action": "action",
                 "/latest/meta-data/events/recommendations/rebalance": "rebalance"}
        body = posted(files[self.path]) if self.path in files else None
        self.reply(200, body) if body is not None else self.reply(404, "Not Found")
    def log_message(self, *a): pass
s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
print("port", s.server_address[1], flush=True)
s.serve_forever()
PY
imds_pid=$!
port=
for _ in $(seq 100); do
    port=$(sed -n 's/^port \([0-9]*\)$/\1/p' "$work/imds.log")
    [ -n "$port" ] && break
    kill -0 "$imds_pid" 2>/dev/null || fail "the fake IMDS exited"
    sleep 0.1
done
[ -n "$port" ] || fail "the fake IMDS did not start"

post() { # post NAME JSON
    printf '%s' "$2" >"$work/imds/$1.tmp" && mv "$work/imds/$1.tmp" "$work/imds/$1"
}
unpost() { rm -f "$work/imds/action" "$work/imds/rebalance" "$work/imds/refuse"; }
iso() { date -u -d "@$(($(date +%s) + $1))" +%Y-%m-%dT%H:%M:%SZ; }

export AWS_EC2_METADATA_SERVICE_ENDPOINT=http://127.0.0.1:$port
export TANDEM_SPOT_WATCH=1 TANDEM_SPOT_WATCH_PERIOD=0.5
train=("$TANDEM_BIN" train --model basicnet --data "$TANDEM_DATA" --steps 100000 --batch 16
       --threads 1 --seed 3 --lr 1e-3 --checkpoint-every 50 --no-progress)

# Waits (up to 60 s) until DIR has a checkpoint: the workers train.
await_checkpoint() {
    local i
    for ((i = 0; i < 600; i++)); do
        compgen -G "$1/ckpt-*.tdck" >/dev/null && return 0
        kill -0 "$launcher" 2>/dev/null || fail "the job ended before its first checkpoint"
        sleep 0.1
    done
    fail "no checkpoint in $1 after 60 s"
}

# Posts the notice, then waits for the launcher: sets rc and dt (seconds).
interrupt_and_wait() {
    local t0 t1
    when=$(iso 120)
    t0=$(date +%s.%N)
    post action "{\"action\": \"terminate\", \"time\": \"$when\"}"
    for _ in $(seq 200); do kill -0 "$launcher" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$launcher" 2>/dev/null && fail "the launcher still runs 20 s after the notice"
    wait "$launcher"; rc=$?
    t1=$(date +%s.%N)
    launcher=
    dt=$(echo "$t1 - $t0" | bc)
}

# The stop step, from rank 0's "stopped by SIGTERM after step S", and its checkpoint.
check_stop_checkpoint() { # LOG DIR TAG
    local step
    step=$(grep -m1 -o "stopped by SIGTERM after step [0-9]*" "$1" | grep -o "[0-9]*$") ||
        fail "($3) no worker says it stopped by SIGTERM (did they checkpoint?)"
    [ -f "$2/ckpt-$step.tdck" ] || fail "($3) no checkpoint at the stop step $step in $2: $(ls "$2")"
    echo "($3) the workers stopped after step $step; $2/ckpt-$step.tdck exists"
}

# ---- (a) a plain agent: rebalance logs only, the notice stops the job with a checkpoint
mkdir -p "$work/ck-a"
"$TANDEM_BIN" launch --standalone --nproc-per-node 2 --end-record "$work/end-a.json" -- \
    "${train[@]}" --checkpoint-dir "$work/ck-a" >"$work/a.log" 2>&1 &
launcher=$!
await_checkpoint "$work/ck-a"
grep -q "watching the instance metadata service at http://127.0.0.1:$port" "$work/a.log" ||
    fail "(a) the agent does not say it watches IMDS"
post rebalance "{\"noticeTime\": \"$(iso 0)\"}"
for _ in $(seq 50); do grep -q "spot rebalance recommendation" "$work/a.log" && break; sleep 0.1; done
grep -q "spot rebalance recommendation" "$work/a.log" || fail "(a) the rebalance was not logged"
sleep 1
kill -0 "$launcher" 2>/dev/null || fail "(a) a rebalance recommendation ended the job"
grep -q "stopped by SIGTERM" "$work/a.log" && fail "(a) a rebalance recommendation stopped the workers"
interrupt_and_wait
echo "(a) launcher exited $rc ${dt}s after the notice"
[ "$rc" -eq 143 ] || fail "(a) exit code $rc after the notice, expected 143"
(($(echo "$dt < 10" | bc))) || fail "(a) the launcher took ${dt}s (> 10 s) to stop after the notice"
line=$(grep -m1 "spot interruption notice: this instance will terminate at $when (in [0-9]* s); the workers checkpoint and stop" "$work/a.log") ||
    fail "(a) the notice line is missing or wrong"
echo "(a) $line"
check_stop_checkpoint "$work/a.log" "$work/ck-a" a
[ "$(grep -c "spot interruption notice: this" "$work/a.log")" = 1 ] || fail "(a) the notice was acted on more than once"
"$py" - "$work/end-a.json" <<'PY' || fail "(a) the end record does not say why it stopped"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["outcome"] == "preempted" and r["exit_code"] == 143, r
assert r["cause"].startswith("spot interruption notice"), r["cause"]
print("(a) end record:", r["outcome"], "-", r["cause"])
PY
unpost

# ---- (b) --forward-stdio: the notes on the mirror stream
mkdir -p "$work/ck-b" "$work/logs-b"
mkfifo "$work/in-b"
sleep 60 >"$work/in-b" & # holds the supervisor's end open: EOF would stop the agent
feeder=$!
"$TANDEM_BIN" launch --standalone --nproc-per-node 2 --forward-stdio --log-dir "$work/logs-b" -- \
    "${train[@]}" --checkpoint-dir "$work/ck-b" <"$work/in-b" >"$work/b.stream" 2>"$work/b.log" &
launcher=$!
# "go" starts the agent (no manifest: nothing is copied yet)
printf 'go\n' >"$work/in-b"
await_checkpoint "$work/ck-b"
post rebalance "{\"noticeTime\": \"$(iso 0)\"}"
for _ in $(seq 50); do grep -q "spot rebalance recommendation" "$work/b.log" && break; sleep 0.1; done
interrupt_and_wait
kill "$feeder" 2>/dev/null; feeder=
echo "(b) launcher exited $rc ${dt}s after the notice"
[ "$rc" -eq 143 ] || fail "(b) exit code $rc after the notice, expected 143"
"$py" - "$work/b.stream" "$when" <<'PY' || fail "(b) the mirror stream lacks the notes"
import sys
buf = open(sys.argv[1], "rb").read()
notes, names, i, ended = [], set(), 0, False
while i < len(buf):
    nl = buf.index(b"\n", i)
    head = buf[i:nl].decode().split(" ")
    i = nl + 1
    if head[:2] == ["tdm", "data"]:
        names.add(head[2]); i += int(head[4])
    elif head[:2] == ["tdm", "file"]:
        i += int(head[3])
    elif head[:2] == ["tdm", "note"]:
        notes.append((head[2], " ".join(head[3:])))
    elif head == ["tdm", "end"]:
        ended = True
    else:
        sys.exit("unknown frame %r" % head)
keys = [k for k, _ in notes]
assert ("interrupted", "terminate " + sys.argv[2]) in notes, notes
assert keys.count("interrupted") == 1 and keys.count("rebalance") == 1, notes
assert ended, "no tdm end"
print("(b) notes on the stream:", notes, "; files:", sorted(names))
PY
check_stop_checkpoint "$work/logs-b/rank-0.log" "$work/ck-b" b
unpost

# ---- (c) an IMDS that refuses everything (401): one warning, polling goes on, the job ends well
post refuse 1
n0=$(grep -c "^request" "$work/imds.log")
TANDEM_SPOT_WATCH_PERIOD=0.2 "$TANDEM_BIN" launch --standalone --nproc-per-node 2 -- \
    "${train[@]/100000/60}" --checkpoint-dir "$work/ck-c" >"$work/c.log" 2>&1
rc=$?
[ "$rc" -eq 0 ] || fail "(c) the job exited $rc under a refusing IMDS"
[ "$(grep -c "TANDEM_SPOT_WATCH=1 but the instance metadata service at http://127.0.0.1:$port does not answer" "$work/c.log")" = 1 ] ||
    fail "(c) expected exactly one warning about the refusing IMDS"
grep -q "HTTP 401" "$work/c.log" || fail "(c) the warning does not say what IMDS answered"
n=$(($(grep -c "^request" "$work/imds.log") - n0))
((n >= 3)) || fail "(c) the agent asked IMDS $n times; it should keep trying"
echo "(c) 401 everywhere: one warning, $n requests, the job ended 0"
grep -m1 "TANDEM_SPOT_WATCH=1 but" "$work/c.log"
unpost

# ---- (d) no IMDS at all (a closed port): one warning, the job ends well
AWS_EC2_METADATA_SERVICE_ENDPOINT=http://127.0.0.1:1 TANDEM_SPOT_WATCH_PERIOD=0.2 \
    "$TANDEM_BIN" launch --standalone --nproc-per-node 1 -- /bin/sleep 1.5 >"$work/d.log" 2>&1
rc=$?
[ "$rc" -eq 0 ] || fail "(d) the job exited $rc without an IMDS"
[ "$(grep -c "TANDEM_SPOT_WATCH=1 but the instance metadata service at http://127.0.0.1:1 does not answer" "$work/d.log")" = 1 ] ||
    fail "(d) expected exactly one warning about the missing IMDS"
echo "(d) no IMDS: one warning, the job ended 0"
echo ok
