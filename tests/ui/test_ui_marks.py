"""ui: issues 29 and 31, "one run's huge metrics file stalls every other run's page". A run's
marks (docs/ui-api.md, "marks") come from the store, which the ingest filled from the metrics
files' resume lines; the server never opens a run's metrics files, so neither a huge file nor
one that would block (a FIFO without a writer) can hold up a page.

Two runs record resume lines through `tandem run` (their supervisors ingest them). Then the
"blocked" run's rank-0.jsonl is replaced by a FIFO with no writer and a 1 GiB sparse rank-1.jsonl
holding another resume line is added, and the server (under strace, when it can trace) answers:
  - each run's marks are exactly what was stored (the independent reference: the run_events rows
    read with Python's sqlite3), never the step-7 line of the file written after the ingest;
  - the server opened no file under any run's metrics/ (strace's openat list), and its bytes
    read per request (/proc/PID/io rchar) stay far below the huge file's size;
  - a blocking open would hang the request forever, so the answers themselves show no open;
  - the runs list, with a live run in it (whose "silent" state and last_activity the list
    computes: from the store, issue 33), opens no run's metrics/ either, and gives the live run
    a last_activity.
No timing. Python stdlib only."""
import http.client
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time

TANDEM = os.path.abspath(os.environ.get("TANDEM_BIN") or os.path.join(
    os.environ.get("TANDEM_BUILD_DIR", "build"), "tandem"))
SIZE = 1 << 30
READ_MAX = 8 << 20  # what one request may read: the index and the socket, never the file


def die(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def rchar(pid):
    with open(f"/proc/{pid}/io") as f:
        return int(re.search(r"^rchar: (\d+)$", f.read(), re.M).group(1))


def can_strace():
    if not shutil.which("strace"):
        return False
    return subprocess.run(["strace", "-f", "-e", "trace=openat", "-o", os.devnull, "true"],
                          capture_output=True).returncode == 0


P = tempfile.mkdtemp(prefix="tandem-ui-marks-")
ENV = dict(os.environ, TANDEM_HOME=P)
ENV.pop("TANDEM_UI_TOKEN", None)
srv = ui_pid = None
LIVE = None
try:
    os.makedirs(os.path.join(P, ".tandem"))
    for name, lines in (("small", ['{"event": "resume", "step": 3, "time": 5}']),
                        ("blocked", ['{"step": 1, "time": 4, "loss": 1}',
                                     '{"event": "resume", "step": 1, "time": 10}',
                                     '{"event": "restart", "step": 1, "time": 11}'])):
        script = "".join(f"echo '{l}' >>\"$TANDEM_METRICS\"; " for l in lines)
        r = subprocess.run([TANDEM, "run", "--name", name, "--", "sh", "-c", script], cwd=P,
                           env=ENV, capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            die(f"tandem run --name {name}: {r.stdout}{r.stderr}")

    # The reference: what the store holds, read with SQLite itself.
    db = sqlite3.connect(os.path.join(P, ".tandem", "runs.db"), timeout=30)
    stored = {}
    for run in ("small-1", "blocked-1"):
        stored[run] = [(k, r, s, t) for k, r, s, t in db.execute(
            "SELECT kind, rank, step, time FROM run_events WHERE run ="
            " (SELECT seq FROM runs WHERE id = ?) ORDER BY rank, id", (run,))]
    db.close()
    if stored != {"small-1": [("resume", 0, 3, 5.0)],
                  "blocked-1": [("resume", 0, 1, 10.0), ("restart", 0, 1, 11.0)]}:
        die(f"the ingest stored these events: {stored}")

    # A live run, still live while the server answers (it waits for its release file).
    r = subprocess.run([TANDEM, "run", "-d", "--name", "live", "--", "sh", "-c",
                        "echo '{\"step\": 1, \"loss\": 1}' >>\"$TANDEM_METRICS\"; "
                        "while [ ! -e \"$TANDEM_RUN_DIR/release\" ]; do sleep 0.2; done"],
                       cwd=P, env=ENV, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        die(f"tandem run -d --name live: {r.stdout}{r.stderr}")
    LIVE = r.stdout.strip()
    # Waits for the event (the supervisor marks it started), bounded generously.
    for _ in range(3000):
        r = subprocess.run([TANDEM, "show", LIVE], cwd=P, env=ENV, capture_output=True,
                           text=True, timeout=120)
        if re.search(r"^status\s+running", r.stdout, re.M):
            break
        time.sleep(0.1)
    else:
        die(f"the live run {LIVE} never started: {r.stdout}{r.stderr}")

    mdir = os.path.join(P, ".tandem", "runs", "blocked-1", "metrics")
    os.unlink(os.path.join(mdir, "rank-0.jsonl"))
    os.mkfifo(os.path.join(mdir, "rank-0.jsonl"))
    with open(os.path.join(mdir, "rank-1.jsonl"), "wb") as f:
        f.write(b'{"event": "resume", "step": 7, "time": 20}\n')
        f.seek(SIZE - 1)
        f.write(b"\n")

    trace = os.path.join(P, "strace.log")
    traced = can_strace()
    cmd = [TANDEM, "ui", "--port", "0"]
    if traced:
        cmd = ["strace", "-f", "-qq", "-e", "trace=open,openat,openat2", "-o", trace] + cmd
    srv = subprocess.Popen(cmd, env=ENV, cwd=P, stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, text=True)
    m = re.match(r"tandem ui: http://[^/]+:(\d+)/\?token=([0-9a-f]{32})\n$",
                 srv.stdout.readline())
    if not m:
        die("tandem ui did not print its URL")
    port, token = int(m.group(1)), m.group(2)
    # strace's pid is srv.pid; the server is its child.
    ui_pid = srv.pid
    if traced:
        kids = open(f"/proc/{srv.pid}/task/{srv.pid}/children").read().split()
        ui_pid = int(kids[0]) if kids else srv.pid

    def get(run):
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        c.request("GET", f"/api/runs/{run}", headers={"X-Tandem-Token": token})
        r = c.getresponse()
        body = r.read()
        c.close()
        if r.status != 200:
            die(f"GET /api/runs/{run}: {r.status} {body[:200]!r}")
        return json.loads(body)

    most = 0
    for run in ("blocked-1", "small-1", "blocked-1"):
        before = rchar(ui_pid)
        o = get(run)
        read = rchar(ui_pid) - before
        most = max(most, read)
        if read > READ_MAX:
            die(f"GET /api/runs/{run} read {read >> 20} MiB: the server reads a run's "
                f"metrics files")
        got = [(mk["kind"], mk["rank"], mk["step"], mk["time"]) for mk in o["marks"]]
        if got != stored[run] or o["marks_partial"] is not False:
            die(f"{run}'s marks: {o['marks']} (partial {o['marks_partial']}); the store holds "
                f"{stored[run]}")
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    c.request("GET", "/api/runs?all=1", headers={"X-Tandem-Token": token})
    resp = c.getresponse()
    listed = {o["id"]: o for o in json.loads(resp.read())["runs"]}
    c.close()
    live = listed.get(LIVE)
    if not live or not live["live"] or live["last_activity"] is None:
        die(f"GET /api/runs: the live run {LIVE}: {live}")
    if traced:
        os.kill(ui_pid, 15)  # the server; strace ends with it, its log complete
        srv.wait()
        srv = None
        with open(trace) as f:
            opened = [l.strip() for l in f if "/metrics/" in l or "metrics\"" in l]
        if opened:
            die("the server opened a run's metrics files:\n  " + "\n  ".join(opened[:10]))
        how = "strace: no open under any run's metrics/"
    else:
        how = "strace unavailable: rchar and the FIFO only"
    print(f"marks from the store for both runs, the FIFO and the 1 GiB file never read ({how}); "
          f"at most {most} bytes read per request; the runs list with a live run opened none")
finally:
    if LIVE:
        open(os.path.join(P, ".tandem", "runs", LIVE, "release"), "w").close()
        subprocess.run([TANDEM, "stop", LIVE, "--wait", "30"], cwd=P, env=ENV,
                       capture_output=True, timeout=120)
    if ui_pid and srv and ui_pid != srv.pid:
        try:
            os.kill(ui_pid, 9)  # the server under strace, left by a failure
        except ProcessLookupError:
            pass
    if srv:
        srv.kill()
        srv.wait()
    shutil.rmtree(P, ignore_errors=True)
