#!/usr/bin/env bash
# track: issue 31, "one line schema for the C and Python writers". `tandem train` (the C sink)
# writes its metrics and, resumed from its checkpoint, a resume line; an SDK script makes the
# same calls (tandem.log of each key at its step, the resume at the same step). Both files are
# checked line by line against docs/metrics-format.md with Python's own JSON parser (not
# tandem's reader): every line has an integer step and a numeric time taken while its writer
# ran, a points line holds numbers or null besides them, a one-point line exactly key, value,
# step and time, an event line exactly event (resume/restart), step and time. Then the two
# files must have the same shapes: the same kinds of line with the same keys at the same steps.
set -uo pipefail
source "$(dirname "$0")/../lib/project.sh"
project_setup metrics-schema
PY=${PYTHON:-/usr/bin/python3}
SRC=${TANDEM_SOURCE_DIR:?}
mkdir -p c py
t0=$("$PY" -c 'import time; print(time.time())')
common=(--model basicnet --data "$DATA" --batch 32 --checkpoint-dir "$P/ck" --checkpoint-every 3)
TANDEM_METRICS=$P/c/rank-0.jsonl "$B" train "${common[@]}" --steps 3 >"$P/train1.log" 2>&1 \
  || fail "tandem train --steps 3: $(tail -5 "$P/train1.log")"
TANDEM_METRICS=$P/c/rank-0.jsonl "$B" train "${common[@]}" --steps 5 --resume \
  >"$P/train2.log" 2>&1 || fail "tandem train --resume: $(tail -5 "$P/train2.log")"
t1=$("$PY" -c 'import time; print(time.time())')

cat > "$P/check.py" <<'PYEOF'
import json, math, numbers, os, subprocess, sys

FIELDS = {"step", "time", "rank", "key", "value", "event"}


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def shapes(path, t0, t1):
    """[(kind, keys, step)] of a metrics file, each line checked against the documented schema."""
    out = []
    with open(path) as f:
        text = f.read()
    if not text.endswith("\n"):
        fail(f"{path} does not end with a newline")
    for n, line in enumerate(text.splitlines(), 1):
        where = f"{path}:{n}: {line}"
        o = json.loads(line)  # the independent parser
        if not isinstance(o, dict):
            fail(f"{where}: not an object")
        step, t = o.get("step"), o.get("time")
        if not isinstance(step, int) or isinstance(step, bool):
            fail(f"{where}: step is not an integer")
        if not isinstance(t, (int, float)) or isinstance(t, bool) or not t0 <= t <= t1:
            fail(f"{where}: time is not a wall-clock time taken between {t0} and {t1}")
        if "event" in o:
            if set(o) != {"event", "step", "time"} or o["event"] not in ("resume", "restart"):
                fail(f"{where}: an event line is exactly event (resume/restart), step, time")
            out.append(("event:" + o["event"], (), step))
        elif "key" in o:
            if set(o) != {"key", "value", "step", "time"} or not isinstance(o["key"], str) \
                    or not isinstance(o["value"], numbers.Real):
                fail(f"{where}: a one-point line is exactly key (text), value, step, time")
            out.append(("point", (o["key"],), step))
        else:
            keys = sorted(set(o) - {"step", "time"})
            if not keys or set(keys) & FIELDS:
                fail(f"{where}: a points line holds metric keys besides step and time")
            for k in keys:
                v = o[k]
                if v is not None and (not isinstance(v, numbers.Real) or isinstance(v, bool)
                                      or not math.isfinite(v)):
                    fail(f"{where}: {k} is {v!r}, not a number or null")
            out.append(("points", tuple(keys), step))
    return out


t0, t1 = float(sys.argv[1]), float(sys.argv[2])
c = shapes("c/rank-0.jsonl", t0, t1)
if not any(k == "event:resume" for k, _, _ in c):
    fail(f"tandem train --resume wrote no resume line: {c}")
if sum(k == "points" for k, _, _ in c) < 5:
    fail(f"tandem train wrote too few points lines: {c}")

# The same calls through the SDK: each C line's keys and step, the resume at its step.
script = r'''
import json, sys, tandem
run = tandem.init()
with open("c/rank-0.jsonl") as f:
    for line in f:
        o = json.loads(line)
        if "event" in o:
            run.resumed_at(o["step"])
        else:
            tandem.log({k: v for k, v in o.items() if k not in ("step", "time")}, step=o["step"])
tandem.finish()
'''
t2 = __import__("time").time()
env = dict(os.environ, TANDEM_METRICS=os.path.abspath("py/rank-0.jsonl"),
           PYTHONPATH=os.path.join(os.environ["SRC"], "python"),
           TANDEM_OFFLINE_DIR=os.path.abspath("offline"))
r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
if r.returncode != 0:
    fail(f"the SDK script: {r.stdout}{r.stderr}")
t3 = __import__("time").time()
py = shapes("py/rank-0.jsonl", t2, t3)
if c != py:
    diff = [(i, a, b) for i, (a, b) in enumerate(zip(c, py)) if a != b][:5]
    fail(f"tandem train and the SDK wrote different shapes ({len(c)} vs {len(py)} lines); "
         f"first differences: {diff}")
print(f"ok: {len(c)} lines of tandem train and of the SDK, same shapes, schema of "
      f"docs/metrics-format.md")
PYEOF
SRC=$SRC "$PY" "$P/check.py" "$t0" "$t1" || exit 1
