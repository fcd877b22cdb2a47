"""ui: the HTTP API of `tandem ui` against a store made by real `tandem run`s (docs/ui-api.md).

Every endpoint, with good input and bad: unknown runs, keys, logs and artifacts (404), malformed,
huge, negative and crossed parameters (400), traversal attempts on artifacts, logs and assets,
unknown routes (404), wrong methods (405), POST without or with a wrong token (401) or from
another origin (403); every GET wants the token too, on loopback as on any other listener
(401 without it, 200 with it), unless `--no-token` (loopback only, with a warning: then GETs
are free for a loopback Host, never for a foreign one: DNS rebinding). Slowloris: 300 sockets
trickling a request header from one address do not keep a normal request from its answer, and
are closed within the guard's 10 s. Downsampling: 100,000 points with
one spike up and one down keep both, and each bucket's first, lowest, highest and last point,
exactly as docs/ui-api.md's rule gives them, in <= 4 * width points per rank, twice the same
bytes; zoom stays in range. A stored artifact whose real path is outside the run's artifacts
directory (a symlinked RUN/artifacts, a symlinked folder below it, a symlinked file, a registered
path with "..") is refused (403), its neighbour served.
Live: a point appended to a running run's metrics file arrives as `event: points`
(latency measured and printed; asserted < 2 s), a log line as `event: log`, a resume event as
`event: reset`, the end as a final `status` and the end of the stream; POST stop stops a run;
/api/events announces a new run. The server survives all of it and stops cleanly on SIGTERM.
Python stdlib only."""
import hashlib
import http.client
import json
import math
import os
import queue
import re
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time

TANDEM = os.environ.get("TANDEM_BIN") or os.path.join(
    os.environ.get("TANDEM_BUILD_DIR", "build"), "tandem")
TANDEM = os.path.abspath(TANDEM)
FAILURES = []
MEASURED = {}


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    FAILURES.append(msg)


def check(cond, msg):
    if not cond:
        fail(msg)
    return cond


def check_eq(got, want, what):
    if got != want:
        fail(f"{what}: got {got!r}, expected {want!r}")
        return False
    return True


def die(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


P = tempfile.mkdtemp(prefix="tandem-ui-api-")
ENV = dict(os.environ, TANDEM_HOME=P)
ENV.pop("TANDEM_UI_TOKEN", None)
os.makedirs(os.path.join(P, ".tandem"))

# Workflows. small: 2 ranks, 20 steps, logs (one line with a byte that is not UTF-8), artifacts.
# big: 100,000 points of "loss" with one spike up (1000 at step 73337) and one down (-1000 at step
# 26111), times 1e9 + step/100.
# live: waits for RUN/release (printing a tick every 0.2 s) or SIGTERM; the test appends to its
# metrics file. quick: ends at once (for /api/events).
BIG_N, SPIKE_STEP, SPIKE, DIP_STEP, DIP = 100000, 73337, 1000.0, 26111, -1000.0


def big_value(i):
    """big's loss at step i, as its command writes it."""
    return SPIKE if i == SPIKE_STEP else DIP if i == DIP_STEP else 1.0 + (i % 97) / 1000.0

with open(os.path.join(P, ".tandem", "workflows.yaml"), "w") as f:
    f.write(r"""workflows:
  - name: small
    nproc_per_node: 2
    params: {lr: 0.5, opt: adam}
    command: |
      for i in $(seq 1 20); do echo "{\"step\": $i, \"train/loss\": $((100 - i)).5, \"test/acc\": 0.$i}" >> "$TANDEM_METRICS"; done
      for i in 1 2 3; do echo "rank $RANK line $i"; done
      printf 'bad byte \377 here\n'
      echo "rank $RANK last line"
      mkdir -p out/sub && echo "model of rank $RANK" > out/model.txt && printf 'x\000y' > out/sub/w.bin
    artifacts: [out/model.txt, out/sub/w.bin]
  - name: big
    command: |
      python3 -c '
      import os
      with open(os.environ["TANDEM_METRICS"], "w") as f:
          for i in range(%d):
              v = %r if i == %d else %r if i == %d else 1.0 + (i %% 97) / 1000.0
              f.write("{\"step\": %%d, \"loss\": %%r, \"time\": %%r}\n" %% (i, v, 1e9 + i / 100.0))
      '
  - name: live
    command: |
      trap 'exit 143' TERM
      i=0
      echo "{\"step\": 0, \"live/x\": 1}" >> "$TANDEM_METRICS"
      while [ ! -e "$TANDEM_RUN_DIR/release" ]; do i=$((i + 1)); echo "tick $i"; sleep 0.2; done
      echo "released"
  - name: sleepy
    command: |
      trap 'echo got TERM; exit 143' TERM
      while :; do sleep 0.1; done
  - name: quick
    command: echo quick
""" % (BIG_N, SPIKE, SPIKE_STEP, DIP, DIP_STEP))


def tandem(*args, timeout=120, check_rc=True):
    p = subprocess.run([TANDEM, *args], env=ENV, cwd=P, capture_output=True, text=True,
                       errors="replace", timeout=timeout)
    if check_rc and p.returncode != 0:
        die(f"tandem {' '.join(args)} exited {p.returncode}: {p.stdout}{p.stderr}")
    return p


t0 = time.time()
tandem("run", "small")
tandem("run", "small")  # small-2: makes the prefix "small" ambiguous
tandem("run", "big")
print(f"store made ({time.time() - t0:.1f} s): small-1, small-2, big-1")


def run_dir(rid):
    return os.path.join(P, ".tandem", "runs", rid)


def wait_for(pred, timeout, what):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.05)
    die(f"timed out after {timeout} s waiting for {what}")


class Server:
    """`tandem ui` on a free port; .base_host/.port/.token from the URL it prints."""

    def __init__(self, *args, env=None):
        self.p = subprocess.Popen([TANDEM, "ui", "--port", "0", *args], env=env or ENV, cwd=P,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines = []
        line = self.p.stdout.readline()
        self.lines.append(line)
        m = re.match(r"tandem ui: http://([^/]+):(\d+)/\?token=([0-9a-f]{32})\n$", line)
        if not m:
            self.p.kill()
            die(f"tandem ui printed {line!r} (stderr {self.p.stderr.read()!r}), expected "
                "'tandem ui: http://HOST:PORT/?token=<32 hex>'")
        self.url_host, self.port, self.token = m.group(1), int(m.group(2)), m.group(3)
        # The rest of its output, in the background (so a full pipe never blocks it).
        self.errors = []
        self.reader = threading.Thread(target=self._drain, args=(self.p.stdout, self.lines),
                                       daemon=True)
        self.reader.start()
        threading.Thread(target=self._drain, args=(self.p.stderr, self.errors), daemon=True).start()

    @staticmethod
    def _drain(f, into):
        for line in f:
            into.append(line)

    def stop(self):
        self.p.send_signal(signal.SIGTERM)
        try:
            rc = self.p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.p.kill()
            return None
        self.reader.join(5)
        return rc


def request(srv, method, path, headers=None, body=None, timeout=30, auth=True):
    """(status, headers dict lower-cased, body bytes); path is sent exactly as given. With auth
    (the default) the server's token goes along as X-Tandem-Token, unless the request carries a
    token of its own (a header, a cookie or ?token=)."""
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=timeout)
    try:
        c.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        h = {"Host": f"127.0.0.1:{srv.port}"}
        own = {k.lower() for k in (headers or {})} & {"x-tandem-token", "cookie"}
        if auth and not own and "token=" not in path:
            h["X-Tandem-Token"] = srv.token
        h.update(headers or {})
        for k, v in h.items():
            if v is not None:
                c.putheader(k, v)
        if body is not None:
            c.putheader("Content-Length", str(len(body)))
        c.endheaders(body)
        r = c.getresponse()
        data = r.read()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, data
    finally:
        c.close()


def get_json(srv, path, status=200, headers=None, auth=True):
    st, h, body = request(srv, "GET", path, headers, auth=auth)
    if not check_eq(st, status, f"GET {path} status (body {body[:300]!r})"):
        return None
    if not check(h.get("content-type", "").startswith("application/json"),
                 f"GET {path}: Content-Type {h.get('content-type')!r}, expected JSON"):
        return None
    try:
        return json.loads(body)
    except ValueError:
        fail(f"GET {path}: body is not JSON: {body[:200]!r}")
        return None


def expect_error(srv, method, path, status, needle=None, headers=None, body=None, auth=True):
    st, h, data = request(srv, method, path, headers, body, auth=auth)
    check_eq(st, status, f"{method} {path} status (body {data[:300]!r})")
    try:
        msg = json.loads(data)["error"]
    except (ValueError, KeyError, TypeError):
        fail(f"{method} {path}: a {st} without a JSON error: {data[:200]!r}")
        return None
    check(len(msg) > 10, f"{method} {path}: error message too short to help: {msg!r}")
    if needle:
        check(needle in msg, f"{method} {path}: error {msg!r} does not mention {needle!r}")
    return h


srv = Server()
print(f"tandem ui on port {srv.port}, token {srv.token[:6]}...")
TOK = {"X-Tandem-Token": srv.token}

# ---- the page and its assets ----
st, h, body = request(srv, "GET", "/")
check_eq(st, 200, "GET / status")
check(h.get("content-type", "").startswith("text/html"), f"GET /: Content-Type {h}")
check_eq(h.get("cache-control"), "no-cache", "GET / Cache-Control")
check(b"<html" in body.lower() or b"<!doctype" in body.lower(), f"GET / is not HTML: {body[:80]!r}")
etag = h.get("etag")
check(etag and etag.startswith('"'), f"GET /: ETag {etag!r}")
st, _, body = request(srv, "GET", "/", {"If-None-Match": etag})
check_eq(st, 304, "GET / with If-None-Match status")
check_eq(body, b"", "a 304's body")
for name, ctype, needle in [("app.js", "text/javascript", None), ("style.css", "text/css", None),
                            ("uPlot.iife.min.js", "text/javascript", b"uPlot"),
                            ("uPlot.min.css", "text/css", b".uplot")]:
    st, h, body = request(srv, "GET", "/assets/" + name)
    check_eq(st, 200, f"GET /assets/{name}")
    check(h.get("content-type", "").startswith(ctype), f"/assets/{name}: {h.get('content-type')}")
    check(h.get("etag"), f"/assets/{name}: no ETag")
    check_eq(h.get("x-content-type-options"), "nosniff", f"/assets/{name} nosniff")
    if needle:
        check(needle in body, f"/assets/{name} does not contain {needle!r} ({len(body)} bytes)")
for path, status in [("/assets/nope.js", 404), ("/assets/", 404), ("/assets/index.html", 404),
                     ("/assets/../CMakeLists.txt", 404), ("/assets/..%2fCMakeLists.txt", 404),
                     ("/assets/%2e%2e%2f%2e%2e%2fetc%2fpasswd", 404),
                     ("/assets//etc/passwd", 404), ("/assets/app.js%00.css", 400),
                     ("/assets/app.js/x", 404), ("/assets/%zz", 400)]:
    expect_error(srv, "GET", path, status)
expect_error(srv, "POST", "/assets/app.js", 405, headers=TOK)

# ---- unknown routes and methods ----
for path in ["/nope", "/api", "/api/", "/api/nope", "/api/runs/small-1/nope",
             "/api/runs/small-1/series/x", "/index.html", "/api/runs/small-1/logs"]:
    expect_error(srv, "GET", path, 404)
for method, path, allow in [("PUT", "/api/runs", None), ("DELETE", "/api/runs/small-1", None),
                            ("PATCH", "/", None), ("POST", "/api/runs", "GET, HEAD"),
                            ("GET", "/api/runs/small-1/stop", "POST"),
                            ("POST", "/api/runs/small-1/series", "GET, HEAD")]:
    h = expect_error(srv, method, path, 405, headers=TOK)
    if h is not None and allow:
        check_eq(h.get("allow"), allow, f"{method} {path} Allow header")
st, h, body = request(srv, "HEAD", "/api/runs")
check_eq((st, body), (200, b""), "HEAD /api/runs")

# ---- /api/runs ----
runs = get_json(srv, "/api/runs?all=1")
ids = [r["id"] for r in runs["runs"]]
check_eq(ids, ["big-1", "small-2", "small-1"], "/api/runs ids, newest first")
small = next(r for r in runs["runs"] if r["id"] == "small-1")
for field in ["id", "workflow", "status", "exit_code", "created", "started", "ended", "duration",
              "restarts", "code_version", "params", "nodes", "nproc_per_node", "note", "live",
              "metrics"]:
    check(field in small, f"/api/runs: run object lacks '{field}': {sorted(small)}")
check_eq((small["status"], small["exit_code"], small["live"]), ("succeeded", 0, False),
         "small-1 status, exit code, live")
check_eq(small["params"], {"lr": 0.5, "opt": "adam"}, "small-1 params")
check_eq((small["nodes"], small["nproc_per_node"]), (1, 2), "small-1 nodes x nproc")
check(small["duration"] is not None and 0 <= small["duration"] < 120,
      f"small-1 duration {small['duration']}")
check_eq(small["metrics"].get("train/loss"), {"last": 80.5, "last_step": 20, "min": 80.5,
                                              "max": 99.5}, "small-1 train/loss summary")
check_eq(small["metrics"].get("test/acc", {}).get("max"), 0.9, "small-1 test/acc max (0.9 at step 9)")
check_eq(runs["metric_keys"], sorted(runs["metric_keys"]), "metric_keys sorted")
for k in ["loss", "test/acc", "train/loss"]:
    check(k in runs["metric_keys"], f"metric_keys lacks {k}: {runs['metric_keys']}")
r = get_json(srv, "/api/runs?all=1&metrics=loss,nokey")
big = next(x for x in r["runs"] if x["id"] == "big-1")
check_eq(big["metrics"].get("loss", {}).get("max"), SPIKE, "big-1 loss max (the spike)")
check_eq(big["metrics"].get("loss", {}).get("last_step"), BIG_N - 1, "big-1 loss last step")
check("nokey" not in big["metrics"], "a key the run lacks is left out of its metrics")
check_eq(get_json(srv, "/api/runs?all=1&metrics=")["runs"][0]["metrics"], {}, "metrics= (none)")
check_eq(len(get_json(srv, "/api/runs")["runs"]), 3, "/api/runs without all=1 (few runs: all)")
# The cloud instances' cost (issue 31): small-1 given an instance record in the aws executor's
# documented format (docs/cloud.md): one ended instance, one still billing, one without a price.
# Its cost_usd is price x hours to the time of the answer (bounded by the times before and after
# the request, computed here); big-1 has no record: null.
cost_t = round(time.time(), 1)
cost_rec = {"provider": "aws", "region": "us-east-1", "instances": [
    {"id": "i-0ended", "node": 0, "type": "t3.micro", "market": "on-demand", "zone": "us-east-1a",
     "launched_s": cost_t - 7200, "ended_s": cost_t - 1800, "end": "run ended", "state": "terminated",
     "usd_per_hour": 0.3, "price_source": "aws.prices"},
    {"id": "i-0live", "node": 1, "type": "g5.xlarge", "market": "spot", "zone": "us-east-1b",
     "launched_s": cost_t - 1800, "ended_s": None, "end": None, "state": "running",
     "usd_per_hour": 0.8, "price_source": "DescribeSpotPriceHistory"},
    {"id": "i-0free", "node": 2, "type": "x9.none", "market": "on-demand", "zone": "us-east-1a",
     "launched_s": cost_t - 7200, "ended_s": cost_t - 7100, "end": "run ended", "state": "terminated",
     "usd_per_hour": None, "price_source": None}]}
with open(os.path.join(run_dir("small-1"), "instances.json"), "w") as f:
    json.dump(cost_rec, f)


def cost_at(t):
    return sum(i["usd_per_hour"] * (min(i["ended_s"] or t, t) - i["launched_s"]) / 3600
               for i in cost_rec["instances"] if i["usd_per_hour"])


t_before = time.time()
listed = {r["id"]: r for r in get_json(srv, "/api/runs?all=1")["runs"]}
one = get_json(srv, "/api/runs/small-1")
t_after = time.time()
for what, r in [("/api/runs", listed["small-1"]), ("/api/runs/small-1", one)]:
    got = r.get("cost_usd")
    check(got is not None and cost_at(t_before) - 1e-9 <= got <= cost_at(t_after) + 1e-9,
          f"{what}: small-1 cost_usd {got}, want price x hours in "
          f"[{cost_at(t_before)}, {cost_at(t_after)}]")
    check(r.get("cost_as_of") and t_before - 1 <= r["cost_as_of"] <= t_after + 1,
          f"{what}: cost_as_of {r.get('cost_as_of')} is the time of the answer")
    check(abs(got - cost_at(r["cost_as_of"])) < 1e-6, f"{what}: cost_usd is the cost at cost_as_of")
    check_eq((r.get("cost_usd_per_hour"), r.get("cost_unpriced")), (0.8, 1),
             f"{what}: small-1's hourly rate now (the live instance) and unpriced count")
check_eq((listed["big-1"].get("cost_usd"), listed["big-1"].get("cost_unpriced")), (None, None),
         "big-1 (no instance record): no cost")
by_id = {i["id"]: i for i in one["instances"]["instances"]}
check_eq([(by_id[i["id"]]["usd_per_hour"], by_id[i["id"]]["price_source"]) for i in cost_rec["instances"]],
         [(i["usd_per_hour"], i["price_source"]) for i in cost_rec["instances"]],
         "each instance's price and its source in /api/runs/small-1")
check(abs(by_id["i-0ended"]["cost_usd"] - 0.3 * 1.5) < 1e-9,
      f"i-0ended cost_usd {by_id['i-0ended']['cost_usd']}, want 0.45 (0.3 $/h x 1.5 h)")
check(by_id["i-0free"]["cost_usd"] is None, "an instance without a price has cost_usd null")
os.remove(os.path.join(run_dir("small-1"), "instances.json"))
# The user's labels (issue 19): set by the CLI, carried by the run objects; an archived run
# leaves the list unless archived=1.
tandem("tag", "small-2", "base", "lr:3e-4")
tandem("group", "small-2", "sweep")
tandem("note", "small-2", "second try")
s2 = get_json(srv, "/api/runs/small-2")
check_eq((s2.get("tags"), s2.get("group"), s2.get("notes"), s2.get("archived")),
         (["base", "lr:3e-4"], "sweep", "second try", False), "small-2 tags, group, notes")
check_eq((small.get("tags"), small.get("group"), small.get("notes")), ([], None, None),
         "small-1 without labels")
tandem("archive", "small-2")
check_eq([r["id"] for r in get_json(srv, "/api/runs?all=1")["runs"]], ["big-1", "small-1"],
         "/api/runs?all=1 leaves the archived small-2 out")
check_eq([r["id"] for r in get_json(srv, "/api/runs?all=1&archived=1")["runs"]],
         ["big-1", "small-2", "small-1"], "/api/runs?all=1&archived=1 ids")
tandem("archive", "--undo", "small-2")
check_eq(len(get_json(srv, "/api/runs?all=1")["runs"]), 3, "small-2 back after archive --undo")
expect_error(srv, "GET", "/api/runs?all=2", 400, "all")
expect_error(srv, "GET", "/api/runs?metrics=" + ",".join(f"k{i}" for i in range(65)), 400, "metrics")
expect_error(srv, "GET", "/api/runs?all=%00", 400)
# Issue 33: the config as columns (hparams: params and the SDK's config, flat), filters over it,
# the keys the runs logged with how many runs logged each, the silent threshold.
check_eq(small.get("hparams"), {"lr": 0.5, "opt": "adam"}, "small-1 hparams: its workflow params")
check_eq(small.get("silent_s"), None, "a finished run is never silent")
check_eq(runs.get("silent_after_s"), 900, "silent_after_s: TANDEM_SILENT_S's default")
logged = {}  # key -> the runs whose metrics files hold it: the reference for common_keys
for rid in ids:
    mdir = os.path.join(P, ".tandem", "runs", rid, "metrics")
    for fn in os.listdir(mdir):
        if fn.startswith("rank-"):
            with open(os.path.join(mdir, fn)) as mf:
                for line in mf:
                    for k in json.loads(line):
                        if k not in ("step", "time"):
                            logged.setdefault(k, set()).add(rid)
common = {c["key"]: c["runs"] for c in runs.get("common_keys", [])}
for k, who in logged.items():
    check_eq(common.get(k), len(who), f"common_keys: {k} logged by {sorted(who)}")
counts = [c["runs"] for c in runs["common_keys"]]
check_eq(counts, sorted(counts, reverse=True), "common_keys most logged first")
for expr, want in [("lr=0.5", ["small-2", "small-1"]), ("lr>0.4", ["small-2", "small-1"]),
                   ("lr<0.5", []), ("opt=adam", ["small-2", "small-1"]), ("opt!=adam", []),
                   ("nosuch=1", []), ("lr>=0.5%20opt=adam", ["small-2", "small-1"])]:
    got = [r["id"] for r in get_json(srv, "/api/runs?filter=" + expr.replace("=", "%3D").replace(
        ">", "%3E").replace("<", "%3C").replace("!", "%21"))["runs"]]
    check_eq(got, want, f"/api/runs?filter={expr}")
expect_error(srv, "GET", "/api/runs?filter=lr", 400, "KEY=VALUE")
expect_error(srv, "GET", "/api/runs?filter=lr%3Efast", 400, "not one")

# ---- /api/runs/{id} ----
one = get_json(srv, "/api/runs/small-1")
check_eq(one["id"], "small-1", "run by id")
check(one["command"] and "TANDEM_METRICS" in one["command"], "run has its command")
check_eq(one["run_dir"], os.path.realpath(run_dir("small-1")), "run_dir")
keys = {k["key"]: k for k in one["keys"]}
check_eq(sorted(keys), ["test/acc", "train/loss"], "small-1 keys")
check_eq({k: keys["train/loss"][k] for k in ["ranks", "count", "first_step", "last_step"]},
         {"ranks": [0, 1], "count": 40, "first_step": 1, "last_step": 20}, "train/loss key summary")
check(keys["train/loss"]["first_time"] <= keys["train/loss"]["last_time"], "key times ordered")
arts = {a["name"]: a for a in one["artifacts"]}
check_eq(sorted(arts), ["out/model.txt", "out/sub/w.bin"], "small-1 artifacts")
logs = {str(l["rank"]): l for l in one["logs"]}
check(set(logs) >= {"0", "1"}, f"small-1 logs: {one['logs']}")
check_eq(get_json(srv, "/api/runs/big")["id"], "big-1", "a unique prefix finds the run")
expect_error(srv, "GET", "/api/runs/nosuch-9", 404, "nosuch-9")
expect_error(srv, "GET", "/api/runs/small", 400, "ambiguous")
expect_error(srv, "GET", "/api/runs/..%2f..%2fetc", 404)
expect_error(srv, "GET", "/api/runs/small-1%00x", 400, "NUL")

# ---- series ----
s = get_json(srv, "/api/runs/small-1/series?key=train/loss")
check_eq((s["run"], s["key"], s["x"], s["from"], s["to"], s["width"], s["total"]),
         ("small-1", "train/loss", "step", 1, 20, 1000, 40), "small-1 train/loss series header")
check_eq([(x["rank"], x["n"]) for x in s["series"]], [(0, 20), (1, 20)], "series ranks and counts")
check_eq(s["series"][0]["x"], list(range(1, 21)), "every point kept when width > points")
check_eq(s["series"][0]["y"], [100 - i + 0.5 for i in range(1, 21)], "series values")
s = get_json(srv, "/api/runs/small-1/series?key=train/loss&rank=1&width=2")
check_eq([x["rank"] for x in s["series"]], [1], "rank=1 only")
check_eq(s["series"][0]["x"], [1, 10, 11, 20], "2 buckets of a monotone line: first/last each")
s = get_json(srv, "/api/runs/small-1/series?key=test/acc&x=time")
check_eq(s["x"], "time", "x=time")
check(all(abs(t - time.time()) < 3600 for t in s["series"][0]["x"]), "x=time gives wall times")
for q, status, needle in [
        ("", 400, "key"), ("key=", 400, "key"), ("key=nokey", 404, "nokey"),
        ("key=train/loss&width=0", 400, "width"), ("key=train/loss&width=-5", 400, "width"),
        ("key=train/loss&width=10001", 400, "width"), ("key=train/loss&width=abc", 400, "width"),
        ("key=train/loss&width=1e3", 400, "width"),
        ("key=train/loss&width=99999999999999999999999", 400, "width"),
        ("key=train/loss&from=abc", 400, "from"), ("key=train/loss&to=1x", 400, "to"),
        ("key=train/loss&from=nan", 400, "from"), ("key=train/loss&to=inf", 400, "to"),
        ("key=train/loss&from=1e999", 400, "from"),
        ("key=train/loss&from=5&to=2", 400, "from"), ("key=train/loss&rank=-1", 400, "rank"),
        ("key=train/loss&rank=x", 400, "rank"), ("key=train/loss&rank=7", 404, "rank 7"),
        ("key=train/loss&x=foo", 400, "x"),
        ("key=train/loss&from=-1e308&to=1e308", 400, "range"),
        ("key=train%00loss", 400, "NUL")]:
    expect_error(srv, "GET", "/api/runs/small-1/series?" + q, status, needle)
expect_error(srv, "GET", "/api/runs/nosuch-1/series?key=train/loss", 404)



def downsampled(xs, ys, frm, to, width):
    """docs/ui-api.md's rule, independently: bucket floor((x - from) / (to - from) * width), the
    last closed at `to`; per bucket its first, lowest, highest and last point (ties to the
    earliest), each once, in x order."""
    buckets = {}
    for i, (x, y) in enumerate(zip(xs, ys)):
        f = math.floor((x - frm) / (to - frm) * width) if to > frm else 0
        b = buckets.setdefault(min(max(f, 0), width - 1), {"first": i, "min": i, "max": i})
        if y < ys[b["min"]]:
            b["min"] = i
        if y > ys[b["max"]]:
            b["max"] = i
        b["last"] = i
    keep = sorted({i for b in buckets.values() for i in b.values()})
    return [xs[i] for i in keep], [ys[i] for i in keep]


# Downsampling: 100,000 points, one spike up, one down.
big_x = [float(i) for i in range(BIG_N)]
big_y = [big_value(i) for i in range(BIG_N)]
for width in [1, 100, 1000, 10000]:
    path = f"/api/runs/big-1/series?key=loss&width={width}"
    t = time.time()
    st, _, raw = request(srv, "GET", path)
    dt = time.time() - t
    s = json.loads(raw)
    ser = s["series"][0]
    MEASURED[f"series 100k width={width}"] = f"{dt * 1000:.0f} ms, {len(ser['x'])} points"
    check_eq((s["total"], ser["n"]), (BIG_N, BIG_N), f"width={width}: points in range")
    check(len(ser["x"]) <= 4 * width, f"width={width}: {len(ser['x'])} points > 4*width")
    check(SPIKE in ser["y"], f"width={width}: the spike (y={SPIKE}) was lost")
    if SPIKE in ser["y"]:
        check_eq(ser["x"][ser["y"].index(SPIKE)], SPIKE_STEP, f"width={width}: spike at its step")
    check(DIP in ser["y"], f"width={width}: the downward spike (y={DIP}) was lost")
    if DIP in ser["y"]:
        check_eq(ser["x"][ser["y"].index(DIP)], DIP_STEP, f"width={width}: dip at its step")
    check_eq((min(ser["y"]), max(ser["y"])), (DIP, SPIKE), f"width={width}: the extremes kept")
    want_x, want_y = downsampled(big_x, big_y, 0.0, float(BIG_N - 1), width)
    if (ser["x"], ser["y"]) != (want_x, want_y):
        got = set(zip(ser["x"], ser["y"]))
        lost = [p for p in zip(want_x, want_y) if p not in got]
        extra = sorted(got - set(zip(want_x, want_y)))
        fail(f"width={width}: {len(ser['x'])} points, the rule gives {len(want_x)}; lost "
             f"{len(lost)} (first: {lost[:4]}), extra {len(extra)} (first: {extra[:4]})")
    check(ser["x"][0] == 0 and ser["x"][-1] == BIG_N - 1, f"width={width}: ends kept")
    check(ser["x"] == sorted(ser["x"]), f"width={width}: points in x order")
    st2, _, raw2 = request(srv, "GET", path)
    check(raw == raw2, f"width={width}: the same request gave different bytes")
s = get_json(srv, "/api/runs/big-1/series?key=loss&from=50000&to=50100&width=50")
ser = s["series"][0]
check_eq((s["from"], s["to"], ser["n"]), (50000, 50100, 101), "zoom: range and points in it")
check(all(50000 <= x <= 50100 for x in ser["x"]), f"zoom: x outside [50000, 50100]: {ser['x']}")
check(len(ser["x"]) <= 200, "zoom: <= 4*width points")
s = get_json(srv, f"/api/runs/big-1/series?key=loss&x=time&from={1e9 + 700}&to={1e9 + 800}&width=20")
ser = s["series"][0]
check(all(1e9 + 700 <= x <= 1e9 + 800 for x in ser["x"]), "x=time zoom stays in range")
check(SPIKE in ser["y"], "x=time zoom around the spike keeps it")
check_eq(ser["n"], 10001, "x=time zoom: points in range")
s = get_json(srv, "/api/runs/big-1/series?key=loss&from=200000&to=300000")
check_eq((s["total"], s["series"][0]["x"]), (0, []), "a range past the data: no points")

# ---- logs ----
lg = get_json(srv, "/api/runs/small-1/logs/0")
check_eq((lg["rank"], lg["offset"], lg["end"], lg["size"]), (0, 0, lg["size"], lg["size"]),
         "log 0 whole (tail 200)")
check(lg["text"].endswith("rank 0 last line\n"), f"log 0 ends with its last line: {lg['text']!r}")
check("bad byte \ufffd here" in lg["text"], f"a byte that is not UTF-8 becomes U+FFFD: {lg['text']!r}")
lg1 = get_json(srv, "/api/runs/small-1/logs/1?tail=1")
check_eq(lg1["text"], "rank 1 last line\n", "tail=1")
check_eq(lg1["end"], lg1["size"], "tail end = size")
lg2 = get_json(srv, "/api/runs/small-1/logs/0?offset=2&limit=5")
check_eq((lg2["offset"], lg2["end"], lg2["text"]), (2, 7, lg["text"][2:7]), "offset/limit")
lg3 = get_json(srv, f"/api/runs/small-1/logs/0?offset={lg['size'] + 100}")
check_eq((lg3["offset"], lg3["end"], lg3["text"]), (lg["size"], lg["size"], ""), "offset past end")
check_eq(get_json(srv, "/api/runs/small-1/logs/0?tail=0")["text"], "", "tail=0")
for q, status, needle in [("0?tail=abc", 400, "tail"), ("0?tail=100001", 400, "tail"),
                          ("0?tail=-1", 400, "tail"), ("0?offset=-1", 400, "offset"),
                          ("0?limit=0", 400, "limit"), ("0?limit=16777217", 400, "limit"),
                          ("0?tail=5&offset=0", 400, "tail"), ("9", 404, "9"),
                          ("-1", 404, None), ("00", 404, None), ("rank-0.log", 404, None),
                          ("..%2f..%2f..%2fetc%2fpasswd", 404, None), ("%2fetc%2fpasswd", 404, None),
                          ("0%00", 400, "NUL"), ("setup", 404, None)]:
    expect_error(srv, "GET", "/api/runs/small-1/logs/" + q, status, needle)

# ---- artifacts ----
for path in ["/api/runs/small-1/artifacts/out/model.txt", "/api/runs/small-1/artifacts/out%2Fmodel.txt"]:
    st, h, body = request(srv, "GET", path)
    check_eq(st, 200, f"GET {path}")
    check(h.get("content-disposition", "").startswith("attachment"), f"{path}: {h.get('content-disposition')}")
    check(body in (b"model of rank 0\n", b"model of rank 1\n"), f"{path}: body {body!r}")
    check_eq(hashlib.sha256(body).hexdigest(), arts["out/model.txt"]["sha256"], "artifact SHA-256")
    check_eq(len(body), arts["out/model.txt"]["size"], "artifact size")
st, h, body = request(srv, "GET", arts["out/sub/w.bin"]["url"])
check_eq((st, body), (200, b"x\x00y"), "binary artifact through its url")

# A stored copy reached through a symbolic link, or whose registered path climbs out with "..",
# is refused (403), even where its path reads as inside the artifacts directory: small-2's
# RUN/artifacts itself replaced by a link to a directory elsewhere (comparing realpaths served
# that: the root resolved through the same link), its out/sub/ replaced by one, its
# out/model.txt by one. Everything is put back and served again afterwards.
adb = sqlite3.connect(os.path.join(P, ".tandem", "runs.db"), timeout=10)
seq2 = adb.execute("SELECT seq FROM runs WHERE id = 'small-2'").fetchone()[0]
stored = dict(adb.execute("SELECT name, path FROM artifacts WHERE run = ?", (seq2,)))
art_root = os.path.join(os.path.realpath(run_dir("small-2")), "artifacts")
w_path, m_path = stored["out/sub/w.bin"], stored["out/model.txt"]
check(os.path.realpath(w_path).startswith(art_root + "/") and
      os.path.realpath(m_path).startswith(art_root + "/"),
      f"small-2's artifacts are stored under {art_root}: {stored}")
sub = os.path.dirname(w_path)
elsewhere = os.path.join(P, "elsewhere-sub")
os.rename(sub, elsewhere)
os.symlink(elsewhere, sub)
try:
    check(os.path.isfile(w_path) and w_path.startswith(art_root + "/"),
          "the symlinked artifact reads as inside the artifacts directory")
    h = expect_error(srv, "GET", "/api/runs/small-2/artifacts/out/sub/w.bin", 403,
                     "out/sub is a symbolic link")
    st, _, body = request(srv, "GET", "/api/runs/small-2/artifacts/out/model.txt")
    check_eq((st, body in (b"model of rank 0\n", b"model of rank 1\n")), (200, True),
             "small-2's out/model.txt (a plain stored copy) beside the symlinked one")
finally:
    os.unlink(sub)
    os.rename(elsewhere, sub)
# The whole RUN/artifacts a link: to a copy of it elsewhere whose out/model.txt says something
# else (what a link to any other readable tree would give).
elsewhere = os.path.join(P, "elsewhere-artifacts")
shutil.copytree(art_root, elsewhere)
with open(os.path.join(elsewhere, "out", "model.txt"), "w") as f:
    f.write("not this run's artifact\n")
os.rename(art_root, art_root + ".real")
os.symlink(elsewhere, art_root)
try:
    check(os.path.isfile(m_path), "the artifact reads as present through the symlinked directory")
    expect_error(srv, "GET", "/api/runs/small-2/artifacts/out/model.txt", 403,
                 "artifacts is a symbolic link")
    expect_error(srv, "GET", "/api/runs/small-2/artifacts/out/sub/w.bin", 403, "symbolic link")
finally:
    os.unlink(art_root)
    os.rename(art_root + ".real", art_root)
    shutil.rmtree(elsewhere)
# The file itself a link.
os.rename(m_path, m_path + ".real")
os.symlink(m_path + ".real", m_path)
try:
    expect_error(srv, "GET", "/api/runs/small-2/artifacts/out/model.txt", 403,
                 "model.txt is a symbolic link")
finally:
    os.unlink(m_path)
    os.rename(m_path + ".real", m_path)
secret = os.path.join(os.path.dirname(art_root), "secret.txt")
with open(secret, "w") as f:
    f.write("not an artifact\n")
climb = os.path.join(art_root, "..", "secret.txt")  # text: under art_root/; real: beside it
with adb:
    adb.execute("UPDATE artifacts SET path = ? WHERE run = ? AND name = 'out/model.txt'",
                (climb, seq2))
try:
    expect_error(srv, "GET", "/api/runs/small-2/artifacts/out/model.txt", 403, "outside")
finally:
    with adb:
        adb.execute("UPDATE artifacts SET path = ? WHERE run = ? AND name = 'out/model.txt'",
                    (m_path, seq2))
    adb.close()
    os.unlink(secret)
for name, want in (("out/sub/w.bin", b"x\x00y"), ("out/model.txt", None)):
    st, _, body = request(srv, "GET", "/api/runs/small-2/artifacts/" + name)
    check(st == 200 and (want is None or body == want),
          f"small-2 {name} once put back: {st} {body[:60]!r}")
for name in ["..%2f..%2fetc%2fpasswd", "../../etc/passwd", "%2Fetc%2Fpasswd", "/etc/passwd",
             "out/../out/model.txt", "out/./model.txt", "out//model.txt", "OUT/model.txt",
             "out/model.txt%00", "out/model.txt%00.png", "model.txt", "nope", "out",
             "%2e%2e/%2e%2e/.tandem/runs.db"]:
    expect_error(srv, "GET", "/api/runs/small-1/artifacts/" + name,
                 400 if "%00" in name else 404)
expect_error(srv, "GET", "/api/runs/small-1/artifacts/", 404)

# ---- access ----
# On loopback too, every request needs the token: another user of a shared machine reaches
# 127.0.0.1 as well as its owner does.
COOKIE = f"tandem_token_{srv.port}"
for path in ["/", "/api/runs", "/assets/app.js", "/api/runs/small-1/logs/0",
             "/api/runs/small-1/artifacts/out/model.txt", "/api/runs/small-1/events",
             "/api/events"]:
    expect_error(srv, "GET", path, 401, "needs the access token", auth=False)
expect_error(srv, "GET", "/api/runs", 401, "not this server's",
             headers={"X-Tandem-Token": "0" * 32})
expect_error(srv, "GET", "/api/runs", 401, "not this server's",
             headers={"Cookie": f"{COOKIE}={'0' * 32}"})
expect_error(srv, "GET", "/api/runs", 401, headers={"Cookie": f"tandem_token_1={srv.token}"})
st, _, _ = request(srv, "GET", "/api/runs", {"Cookie": f"{COOKIE}={srv.token}"})
check_eq(st, 200, "loopback GET with the cookie")
st, h, _ = request(srv, "GET", f"/api/runs?token={srv.token}")
cookie = h.get("set-cookie", "")
check(st == 200 and cookie.startswith(f"{COOKIE}={srv.token}") and "HttpOnly" in cookie and
      "SameSite=Strict" in cookie and "Path=/" in cookie,
      f"?token= is served and sets the cookie {COOKIE}: {st} {cookie!r}")
st, h, _ = request(srv, "GET", "/api/runs?token=0123456789abcdef0123456789abcdef")
check_eq((st, h.get("set-cookie")), (401, None), "a wrong ?token= on loopback: 401, no cookie")
st, h, _ = request(srv, "GET", "/api/runs?token=0123456789abcdef0123456789abcdef",
                   {"Cookie": f"{COOKIE}={srv.token}"})
check_eq((st, h.get("set-cookie")), (200, None), "a stale ?token= beside the right cookie: served")
# DNS rebinding: a page of another site whose name resolves to 127.0.0.1.
expect_error(srv, "GET", "/api/runs", 401, "token", headers={"Host": f"evil.example:{srv.port}"},
             auth=False)
st, _, _ = request(srv, "GET", "/api/runs", {"Host": f"evil.example:{srv.port}", **TOK})
check_eq(st, 200, "a foreign Host with the token")
st, _, _ = request(srv, "GET", "/api/runs", {"Host": f"localhost:{srv.port}"})
check_eq(st, 200, "Host localhost")
# POST: token and origin (small-1 has ended: a request that gets through is a 409).
stop = "/api/runs/small-1/stop"
expect_error(srv, "POST", stop, 401, "token", auth=False)
expect_error(srv, "POST", stop, 401, "token", headers={"X-Tandem-Token": "0" * 32})
expect_error(srv, "POST", f"{stop}?token={srv.token}", 401, "token")  # the URL alone is not enough
expect_error(srv, "POST", stop, 401, headers={"Cookie": f"{COOKIE}=" + "1" * 32})
expect_error(srv, "POST", stop, 403, "origin",
             headers={**TOK, "Origin": "http://evil.example"})
expect_error(srv, "POST", stop, 403, "origin",
             headers={**TOK, "Origin": f"http://127.0.0.1:{srv.port + 1}"})
expect_error(srv, "POST", stop, 409, "already ended",
             headers={**TOK, "Origin": f"http://127.0.0.1:{srv.port}"})
expect_error(srv, "POST", stop, 409, headers={"Cookie": f"{COOKIE}={srv.token}"})
expect_error(srv, "POST", stop, 413, headers=TOK, body=b"x" * 100000)
expect_error(srv, "POST", "/api/runs/nosuch-3/stop", 404, headers=TOK)

# Another listener: not loopback, so every request needs the token.
wide = Server("--host", "0.0.0.0")
time.sleep(0.2)
check(any("every request needs the token" in l for l in wide.lines),
      f"tandem ui --host 0.0.0.0 says the token is required: {wide.lines}")
expect_error(wide, "GET", "/api/runs", 401, "token", auth=False)
expect_error(wide, "GET", "/", 401, "token", auth=False)
expect_error(wide, "GET", "/assets/app.js", 401, auth=False)
st, _, _ = request(wide, "GET", "/api/runs", {"X-Tandem-Token": wide.token})
check_eq(st, 200, "non-loopback GET with the token header")
st, h, _ = request(wide, "GET", f"/?token={wide.token}")
check_eq(st, 200, "non-loopback GET / with ?token=")
check(h.get("set-cookie", "").startswith(f"tandem_token_{wide.port}="),
      "non-loopback ?token= sets the cookie")
st, _, _ = request(wide, "GET", "/api/runs", {"Cookie": f"tandem_token_{wide.port}={wide.token}"})
check_eq(st, 200, "non-loopback GET with the cookie")
expect_error(wide, "GET", "/api/runs", 401, headers={"X-Tandem-Token": srv.token})
check_eq(wide.stop(), 0, "the 0.0.0.0 server's exit code on SIGTERM")

# --no-token: GETs on loopback without the token (the old default), with a warning; POST and
# a foreign Host still need it; refused on any other address.
free = Server("--no-token")
time.sleep(0.2)
check(any("warning: --no-token" in l and "every user of this machine" in l for l in free.lines),
      f"tandem ui --no-token warns: {free.lines}")
for path in ["/", "/api/runs", "/api/runs/small-1/logs/0"]:
    st, _, _ = request(free, "GET", path, auth=False)
    check_eq(st, 200, f"--no-token: GET {path} without the token")
expect_error(free, "GET", "/api/runs", 401, "token", headers={"Host": f"evil.example:{free.port}"},
             auth=False)
expect_error(free, "POST", "/api/runs/small-1/stop", 401, "token", auth=False)
expect_error(free, "POST", "/api/runs/small-1/stop", 409, "already ended")
check_eq(free.stop(), 0, "the --no-token server's exit code on SIGTERM")
p = subprocess.run([TANDEM, "ui", "--port", "0", "--host", "0.0.0.0", "--no-token"], env=ENV,
                   cwd=P, capture_output=True, text=True, timeout=30)
check(p.returncode == 2 and "--no-token" in p.stderr and "loopback" in p.stderr,
      f"--no-token on 0.0.0.0 is refused: {p.returncode} {p.stderr!r}")


# ---- live: events of a running run ----
class Events:
    """Reads an event stream in a thread: .q gets (arrival time, event, data) per event and
    (time, None, None) at its end."""

    def __init__(self, srv, path, headers=None):
        self.c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
        self.c.request("GET", path, headers={"X-Tandem-Token": srv.token, **(headers or {})})
        self.r = self.c.getresponse()
        self.status = self.r.status
        self.headers = {k.lower(): v for k, v in self.r.getheaders()}
        self.q = queue.Queue()
        self.t = threading.Thread(target=self._read, daemon=True)
        self.t.start()

    def _read(self):
        ev, data = None, []
        try:
            while True:
                line = self.r.readline()
                if not line:
                    break
                line = line.decode().rstrip("\n")
                if line == "":
                    if ev or data:
                        self.q.put((time.time(), ev or "message", json.loads("\n".join(data))))
                    ev, data = None, []
                elif line.startswith("event: "):
                    ev = line[7:]
                elif line.startswith("data: "):
                    data.append(line[6:])
        except Exception as e:  # noqa: BLE001 (closing the socket under a read lands here)
            self.q.put((time.time(), "error", str(e)))
        self.q.put((time.time(), None, None))

    def next(self, want, timeout, pred=None):
        """The next event named want (matching pred), skipping others; None on timeout/end."""
        deadline = time.time() + timeout
        while True:
            left = deadline - time.time()
            if left <= 0:
                return None
            try:
                t, ev, data = self.q.get(timeout=left)
            except queue.Empty:
                return None
            if ev is None:
                return ("end", t)
            if ev == want and (pred is None or pred(data)):
                return (t, data)

    def close(self):
        try:
            self.c.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.c.close()


p = tandem("run", "-d", "live")
live_id = "live-1"
wait_for(lambda: os.path.exists(os.path.join(run_dir(live_id), "metrics", "rank-0.jsonl")) and
         get_json(srv, f"/api/runs/{live_id}")["status"] == "running", 60, "live-1 running")
ev = Events(srv, f"/api/runs/{live_id}/events")
check_eq(ev.status, 200, "events status")
check(ev.headers.get("content-type", "").startswith("text/event-stream"), f"events: {ev.headers}")
check_eq(ev.headers.get("cache-control"), "no-cache", "events Cache-Control")
got = ev.next("status", 5)
check(got and got != "end" and got[1]["status"] == "running" and got[1]["live"] is True,
      f"the first event is the run's status: {got}")
got = ev.next("log", 5, lambda d: "tick" in d["text"])
check(got and got[0] != "end" and got[1]["rank"] == 0 and got[1]["end"] > got[1]["offset"],
      f"a log line of a running run arrives as event: log ({got})")

metrics_file = os.path.join(run_dir(live_id), "metrics", "rank-0.jsonl")


def append_line(obj):
    fd = os.open(metrics_file, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, (json.dumps(obj) + "\n").encode())
    finally:
        os.close(fd)


# (a) end to end: a line appended to the worker's metrics file (the supervisor ingests every
# 0.5 s) until the point is on the wire.
lat = []
for i in range(1, 9):
    t = time.time()
    append_line({"step": 1000 + i, "live/x": i * 1.5})
    got = ev.next("points", 5, lambda d, i=i: any(p[0] == "live/x" and p[2] == 1000 + i
                                                  for p in d["points"]))
    if not check(got and got[0] != "end", f"point {i} did not arrive as event: points within 5 s"):
        break
    lat.append(got[0] - t)
    pt = next(p for p in got[1]["points"] if p[2] == 1000 + i)
    check_eq((pt[0], pt[1], pt[2], pt[4]), ("live/x", 0, 1000 + i, i * 1.5), "point fields")
    check(isinstance(got[1]["cursor"], int) and got[1]["cursor"] > 0, "points carry a cursor")
    time.sleep(0.13 * (i % 4))
if lat:
    MEASURED["SSE file append -> event (incl. 0.5 s ingest)"] = (
        f"median {statistics.median(lat) * 1000:.0f} ms, max {max(lat) * 1000:.0f} ms, n={len(lat)}")
    check(max(lat) < 2.0, f"file append -> event: points took {max(lat):.2f} s (limit 2 s)")

# (b) from the store: a row committed to runs.db (as the ingest commits) until it is on the wire.
db = sqlite3.connect(os.path.join(P, ".tandem", "runs.db"), timeout=10)
seq = db.execute("SELECT seq FROM runs WHERE id = ?", (live_id,)).fetchone()[0]
key = db.execute("SELECT id FROM metric_keys WHERE name = 'live/x'").fetchone()[0]
lat = []
for i in range(1, 9):
    t = time.time()
    with db:
        db.execute("INSERT INTO metrics(run, rank, key, step, value, time) VALUES(?,?,?,?,?,?)",
                   (seq, 0, key, 5000 + i, 7.0, time.time()))
    got = ev.next("points", 5, lambda d, i=i: any(p[2] == 5000 + i for p in d["points"]))
    if not check(got and got[0] != "end", f"stored point {i} did not arrive within 5 s"):
        break
    lat.append(got[0] - t)
    time.sleep(0.07 * (i % 5))
db.close()
if lat:
    MEASURED["SSE store commit -> event"] = (
        f"median {statistics.median(lat) * 1000:.0f} ms, max {max(lat) * 1000:.0f} ms, n={len(lat)}")
    check(max(lat) < 2.0, f"store -> event: points took {max(lat):.2f} s (limit 2 s)")

# A second stream resuming from a cursor gets what came after it, and nothing before.
ev2 = Events(srv, f"/api/runs/{live_id}/events?since=0")
got = ev2.next("points", 5, lambda d: any(p[2] == 0 for p in d["points"]))
check(got and got[0] != "end", "since=0 replays the run's points from the start")
ev2.close()
expect_error(srv, "GET", f"/api/runs/{live_id}/events?since=-1", 400, "since")
expect_error(srv, "GET", f"/api/runs/{live_id}/events?since=x", 400, "since")

# reset: a resume event (the worker restarted from a checkpoint) cuts points back.
append_line({"event": "resume", "step": 1002})
append_line({"step": 1003, "live/x": 99.0})
got = ev.next("reset", 5)
check(got and got[0] != "end" and isinstance(got[1].get("cursor"), int),
      f"a resume in the metrics file gives event: reset ({got})")
s = get_json(srv, f"/api/runs/{live_id}/series?key=live/x")
xs = s["series"][0]["x"]
check(1003 in xs and 1004 not in xs and 5001 not in xs, f"after the resume cut the series is {xs}")

# /api/events: a run that appears is announced.
rev = Events(srv, "/api/events")
check_eq(rev.status, 200, "/api/events status")
tandem("run", "quick")
got = rev.next("runs", 5, lambda d: any(r["id"] == "quick-1" for r in d["runs"]))
check(got and got[0] != "end", f"/api/events announced quick-1: {got}")
rev.close()

# The end of a run: a last status, then the end of the stream.
open(os.path.join(run_dir(live_id), "release"), "w").close()
got = ev.next("status", 30, lambda d: d["status"] != "running")
check(got and got[0] != "end" and got[1]["status"] == "succeeded" and got[1]["live"] is False,
      f"the run's end arrives as event: status ({got})")
got = ev.next("never", 10)
check(got and got[0] == "end", f"the stream ends after the final status ({got})")
ev.close()

# ---- POST stop ----
tandem("run", "-d", "sleepy")
wait_for(lambda: get_json(srv, "/api/runs/sleepy-1")["status"] == "running", 60, "sleepy-1 running")
expect_error(srv, "POST", "/api/runs/sleepy-1/stop", 401, auth=False)
st, h, body = request(srv, "POST", "/api/runs/sleepy-1/stop",
                      {**TOK, "Origin": f"http://127.0.0.1:{srv.port}"})
check_eq(st, 200, f"POST stop with the token (body {body[:200]!r})")
if st == 200:
    d = json.loads(body)
    check_eq((d["id"], d["requested"]), ("sleepy-1", True), "stop reply")
end = wait_for(lambda: (lambda r: r if not r["live"] else None)(
    get_json(srv, "/api/runs/sleepy-1")), 60, "sleepy-1 to end after POST stop")
check_eq(end["status"], "stopped", "the run stopped through the API")
expect_error(srv, "POST", "/api/runs/sleepy-1/stop", 409, "already ended", headers=TOK)

# A run whose supervisor dies (kill -9) is marked failed by the server within seconds (as
# tandem ps would), and its event stream ends.
tandem("run", "-d", "sleepy")
wait_for(lambda: get_json(srv, "/api/runs/sleepy-2")["status"] == "running", 60, "sleepy-2 running")
with open(os.path.join(run_dir("sleepy-2"), "run.json")) as f:
    sup = json.load(f)["supervisor_pid"]
ev = Events(srv, "/api/runs/sleepy-2/events")
check(ev.next("status", 5), "sleepy-2: first status")
os.kill(sup, signal.SIGKILL)
got = ev.next("status", 20, lambda d: not d["live"])
check(got and got[0] != "end" and got[1]["status"] == "failed" and "supervisor" in (got[1]["note"] or ""),
      f"a run whose supervisor died is shown failed, with why ({got})")
check_eq((ev.next("never", 10) or ("?",))[0], "end", "its stream ends")
ev.close()

# ---- load, odd requests, and still alive ----
errors = []


def hammer():
    for path in ["/api/runs?all=1", "/api/runs/big-1/series?key=loss&width=500",
                 "/api/runs/small-1/logs/0?tail=3", "/assets/app.js"] * 5:
        try:
            st, _, _ = request(srv, "GET", path)
            if st != 200:
                errors.append(f"{path}: {st}")
        except OSError as e:
            errors.append(f"{path}: {e}")


threads = [threading.Thread(target=hammer) for _ in range(8)]
t = time.time()
for th in threads:
    th.start()
for th in threads:
    th.join()
MEASURED["160 requests from 8 threads"] = f"{(time.time() - t) * 1000:.0f} ms"
check_eq(errors, [], "concurrent requests")
with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as sk:
    sk.sendall(b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    check(sk.recv(100).startswith(b"HTTP/1.1 4"), "a 20 kB path gets a 4xx")
with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as sk:
    sk.sendall(b"GARBAGE\r\n\r\n")
    sk.recv(100)

# Slowloris: 300 sockets from this address (the same one as the real client: on loopback every
# local user is 127.0.0.1), each sending a request header a line at a time and never its end.
# A real request beside them is answered at once; none of them lives past the guard's 10 s
# (TD__UI_REQUEST_S; most are closed on arrival: one address holds at most 32 such).
import select  # noqa: E402 (only here)
SLOW_N, GUARD_S = 300, 10.0
slow, opened, closed_at = [], {}, {}
for i in range(SLOW_N):
    sk = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    sk.sendall(b"GET /api/runs HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    sk.setblocking(False)
    slow.append(sk)
    opened[sk] = time.time()


def slow_loop(until):
    """Trickles a header line into every open slow socket every 0.5 s, notes when each closes."""
    next_drip = 0.0
    while time.time() < until and len(closed_at) < len(slow):
        live = [sk for sk in slow if sk not in closed_at]
        r, _, _ = select.select(live, [], [], 0.1)
        for sk in r:
            try:
                data = sk.recv(4096)
            except OSError:
                data = b""
            if not data:
                closed_at[sk] = time.time()
        if time.time() >= next_drip:
            next_drip = time.time() + 0.5
            for sk in live:
                if sk in closed_at:
                    continue
                try:
                    sk.send(b"X-Slow: 1\r\n")
                except OSError:
                    closed_at[sk] = time.time()


slow_t = threading.Thread(target=slow_loop, args=(time.time() + GUARD_S + 8,), daemon=True)
slow_t.start()
time.sleep(1.0)  # every socket trickling
answers = []
for i in range(5):
    t = time.time()
    try:
        st, _, body = request(srv, "GET", "/api/runs?all=1", timeout=10)
    except OSError as e:  # refused or reset: what a full server did before the guard
        st = repr(e)
    answers.append((st, time.time() - t))
    time.sleep(0.5)
MEASURED["a request beside 300 slowloris sockets"] = (
    f"max {max(a[1] for a in answers) * 1000:.0f} ms over {len(answers)}")
check(all(st == 200 for st, _ in answers), f"requests beside the slowloris sockets: {answers}")
check(max(dt for _, dt in answers) < 2.0,
      f"a request beside the slowloris sockets took {max(dt for _, dt in answers):.2f} s")
slow_t.join()
lives = sorted(closed_at[sk] - opened[sk] for sk in slow if sk in closed_at)
check_eq(len(closed_at), SLOW_N, "slowloris sockets closed by the server")
if lives:
    MEASURED["slowloris sockets closed"] = (
        f"{sum(1 for x in lives if x < GUARD_S - 1)} early (over the bound per address), the "
        f"rest after {lives[SLOW_N - 32 if len(lives) == SLOW_N else 0]:.1f} to {lives[-1]:.1f} s")
    check(lives[-1] < GUARD_S + 3, f"a slowloris socket lived {lives[-1]:.1f} s (guard: {GUARD_S} s)")
    check(lives[-1] > GUARD_S - 1,
          f"the last slowloris socket was closed after {lives[-1]:.1f} s, before the guard's "
          f"{GUARD_S} s: the bound per address should leave 32 of them to time out")
for sk in slow:
    sk.close()
st, _, _ = request(srv, "GET", "/api/runs")
check_eq(st, 200, "the server still answers after everything above")

# ---- the command line ----
for args, needle in [(["--port", "abc"], "--port"), (["--port", "70000"], "--port"),
                     (["--port"], "--port"), (["--host"], "--host"), (["--bogus"], "--bogus"),
                     (["--port=-1"], "--port")]:
    p = subprocess.run([TANDEM, "ui", *args], env=ENV, cwd=P, capture_output=True, text=True,
                       timeout=30)
    check_eq(p.returncode, 2, f"tandem ui {' '.join(args)} exit code")
    check(needle in p.stderr, f"tandem ui {' '.join(args)}: stderr {p.stderr!r} lacks {needle!r}")
p = subprocess.run([TANDEM, "ui", "--help"], env=ENV, capture_output=True, text=True, timeout=30)
check(p.returncode == 0 and "--port" in p.stdout, f"tandem ui --help: {p.returncode} {p.stdout!r}")
p = subprocess.run([TANDEM, "ui", "--port", str(srv.port)], env=ENV, cwd=P, capture_output=True,
                   text=True, timeout=30)
check(p.returncode == 1 and str(srv.port) in p.stderr, f"a port in use: {p.returncode} {p.stderr!r}")
env = dict(ENV, TANDEM_UI_TOKEN="fixed-token-0123456789")
p = subprocess.Popen([TANDEM, "ui", "--port", "0"], env=env, cwd=P, stdout=subprocess.PIPE,
                     stderr=subprocess.PIPE, text=True)
line = p.stdout.readline()
check(line.rstrip().endswith("?token=fixed-token-0123456789"), f"TANDEM_UI_TOKEN: {line!r}")
p.send_signal(signal.SIGINT)
check_eq(p.wait(timeout=10), 0, "tandem ui exit code on SIGINT")

rc = srv.stop()
check_eq(rc, 0, f"tandem ui exit code on SIGTERM (stderr: {''.join(srv.errors)[-2000:]!r})")
check(not any("ERROR" in l or "Sanitizer" in l for l in srv.errors),
      f"tandem ui complained on stderr: {''.join(srv.errors)[-2000:]!r}")
check(any("stopped" in l for l in srv.lines), f"tandem ui says it stopped: {srv.lines[-2:]}")

for k, v in MEASURED.items():
    print(f"measured: {k}: {v}")
if FAILURES:
    print(f"{len(FAILURES)} check(s) failed; store kept in {P}", file=sys.stderr)
    sys.exit(1)
shutil.rmtree(P, ignore_errors=True)
print("ui api: ok")
