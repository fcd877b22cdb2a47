"""ui: issue 29, "one run's huge metrics file stalls every other run's page". A run's marks
(docs/ui-api.md, "marks") are read from its raw metrics files; a request must read a bounded
share of them (64 MiB and a chunk) and say so (`marks_partial`), the next request going on from
there, so the page of a run with a 1 GiB file answers at once and another run's page is never
held up behind it.

Bytes read are the server's own count (/proc/PID/io rchar) around each request: no timing.
The 1 GiB file is sparse (fast to make and to read): 512 KiB lines, one line of 3 MiB (longer
than a read chunk: skipped whole), a resume mark at the start and one at the end.
Python stdlib only."""
import http.client
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

TANDEM = os.path.abspath(os.environ.get("TANDEM_BIN") or os.path.join(
    os.environ.get("TANDEM_BUILD_DIR", "build"), "tandem"))
BUDGET = 64 << 20  # docs/ui-api.md: what one request reads of a run's metrics files
CHUNK = 1 << 20    # and the read chunk it may overrun by
SLACK = 8 << 20    # the rest of a request's reads: the index, the socket
SIZE = 1 << 30


def die(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def rchar(pid):
    with open(f"/proc/{pid}/io") as f:
        return int(re.search(r"^rchar: (\d+)$", f.read(), re.M).group(1))


P = tempfile.mkdtemp(prefix="tandem-ui-marks-")
ENV = dict(os.environ, TANDEM_HOME=P)
ENV.pop("TANDEM_UI_TOKEN", None)
srv = None
try:
    os.makedirs(os.path.join(P, ".tandem"))
    for name, cmd in (("small", 'echo \'{"event": "resume", "step": 3, "time": 5}\' '
                                '>>"$TANDEM_METRICS"'),
                      ("huge", "true")):
        r = subprocess.run([TANDEM, "run", "--name", name, "--", "sh", "-c", cmd], cwd=P,
                           env=ENV, capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            die(f"tandem run --name {name}: {r.stdout}{r.stderr}")
    path = os.path.join(P, ".tandem", "runs", "huge-1", "metrics", "rank-0.jsonl")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(b'{"event": "resume", "step": 1, "time": 10}\n')
        line = 512 << 10
        for off in range(line, SIZE - (8 << 20), line):
            if off < (100 << 20) or off >= (104 << 20):  # 100-104 MiB: one 4 MiB line
                f.seek(off)
                f.write(b"\n")
        f.seek(SIZE - 1)
        f.write(b'\n{"event": "resume", "step": 7, "time": 20}\n')

    srv = subprocess.Popen([TANDEM, "ui", "--port", "0"], env=ENV, cwd=P,
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    m = re.match(r"tandem ui: http://[^/]+:(\d+)/\?token=([0-9a-f]{32})\n$",
                 srv.stdout.readline())
    if not m:
        die("tandem ui did not print its URL")
    port, token = int(m.group(1)), m.group(2)

    def get(run):
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        c.request("GET", f"/api/runs/{run}", headers={"X-Tandem-Token": token})
        r = c.getresponse()
        body = r.read()
        c.close()
        if r.status != 200:
            die(f"GET /api/runs/{run}: {r.status} {body[:200]!r}")
        return json.loads(body)

    def steps(o):
        return [(mk["kind"], mk["step"]) for mk in o["marks"]]

    requests, seen = 0, []
    while True:
        before = rchar(srv.pid)
        o = get("huge-1")
        read = rchar(srv.pid) - before
        requests += 1
        if read > BUDGET + CHUNK + SLACK:
            die(f"request {requests} for the huge run's page read {read >> 20} MiB; at most "
                f"{(BUDGET + CHUNK) >> 20} MiB of its metrics files are read per request")
        if "marks_partial" not in o:
            die(f"the run's answer has no marks_partial: {sorted(o)}")
        seen.append(steps(o))
        # Between two shares of the huge run's file, another run's page answers whole.
        s = get("small-1")
        if (steps(s), s["marks_partial"]) != ([("resume", 3)], False):
            die(f"the small run's marks: {s['marks']}, partial {s['marks_partial']}")
        if not o["marks_partial"]:
            break
        if requests > SIZE // BUDGET + 3:
            die(f"{requests} requests and the huge run's marks are still partial")
    if seen[0] != [("resume", 1)] or requests < 2:
        die(f"the first answer for the huge run: {seen[0]} after {requests} request(s); expected "
            f"the mark at its start and marks_partial true")
    if seen[-1] != [("resume", 1), ("resume", 7)]:
        die(f"the huge run's marks once read to its end: {seen[-1]}")
    again = get("huge-1")
    if (steps(again), again["marks_partial"]) != (seen[-1], False):
        die(f"the huge run's marks from the cache: {again['marks']}")
    print(f"huge run's marks: {requests} requests of <= {(BUDGET + CHUNK) >> 20} MiB each; "
          f"the small run's page answered between each")
finally:
    if srv:
        srv.kill()
        srv.wait()
    shutil.rmtree(P, ignore_errors=True)
