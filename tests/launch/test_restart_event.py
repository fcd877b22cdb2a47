"""launch: a group restarted by --max-restarts leaves one `restart` event line per restart in each
worker's metrics file (docs/metrics-format.md), written by the launcher through track's writer,
checked here with Python's own json against the documented schema: exactly the keys event, step
and time; step the step the workers go on from (the newest committed checkpoint, 20, which the
restarted workers get as TANDEM_RESUME_STEP; 0 without one); time between the attempts' own
lines. A group that is not restarted gets no event line."""
import json
import os
import time

from launchtest import check, check_eq, launch, tmpdir, write_script

d = tmpdir()
# each worker writes one point per attempt, with the wall time of its writing; rank 1's first
# attempt fails once rank 0 has written (READY.ATTEMPT: rank 0's point is in its file)
flaky = write_script(d, "flaky.sh", """#!/bin/bash
printf '{"step": %d, "time": %s, "attempt": %d}\\n' "$TANDEM_RESTART_COUNT" "$(date +%s.%N)" \\
    "$TANDEM_RESTART_COUNT" >>"$TANDEM_METRICS"
echo "resume_step=${TANDEM_RESUME_STEP:-none}"
[ "$RANK" = 0 ] && touch "$READY.$TANDEM_RESTART_COUNT"
if [ "$TANDEM_RESTART_COUNT" = 0 ] && [ "$RANK" = 1 ]; then
    # fails once rank 0 has written its point: the teardown must not cut it short
    for _ in $(seq 1 3000); do [ -e "$READY.0" ] && exit 7; sleep 0.01; done
    exit 8
fi
[ "$TANDEM_RESTART_COUNT" = 0 ] && sleep 30
exit 0
""")


def lines_of(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def check_events(metrics, nranks, want_step, t0, t1):
    for r in range(nranks):
        lines = lines_of(os.path.join(metrics, f"rank-{r}.jsonl"))
        events = [l for l in lines if "event" in l]
        check_eq(len(events), 1, f"rank {r}: restart events in {lines}")
        ev = events[0]
        check_eq(sorted(ev), ["event", "step", "time"], f"rank {r}: the event's keys")
        check_eq(ev["event"], "restart", f"rank {r}: the event")
        check(isinstance(ev["step"], int) and not isinstance(ev["step"], bool),
              f"rank {r}: step is not an integer: {ev}")
        check_eq(ev["step"], want_step, f"rank {r}: the restart's step")
        check(isinstance(ev["time"], float) and t0 <= ev["time"] <= t1,
              f"rank {r}: time {ev['time']} outside the launch ({t0}..{t1})")
        attempts = [l for l in lines if "attempt" in l]
        check_eq([a["attempt"] for a in attempts], [0, 1], f"rank {r}: the attempts' points")
        i = lines.index(ev)
        check(lines.index(attempts[0]) < i < lines.index(attempts[1]),
              f"rank {r}: the event is not between the attempts: {lines}")
        check(attempts[0]["time"] <= ev["time"] <= attempts[1]["time"],
              f"rank {r}: the event's time is not between the attempts': {lines}")


# 1. a committed checkpoint at step 20: the restart goes on from it
ck = os.path.join(d, "ck")
os.makedirs(ck)
with open(os.path.join(ck, "ckpt-20.tdck"), "wb") as f:
    f.write(b"x")
metrics = os.path.join(d, "m1")
t0 = time.time()
rc, out, err, _ = launch(["--nproc-per-node", "2", "--max-restarts", "1", "--metrics-dir", metrics,
                          "--", flaky], timeout=60, env={"TANDEM_CHECKPOINT_DIR": ck, "READY": os.path.join(d, "r1")})
t1 = time.time()
check_eq(rc, 0, f"exit code with --max-restarts 1 (stderr: {err!r})")
check("[rank 0] resume_step=20" in out, f"the restarted workers' TANDEM_RESUME_STEP: {out!r}")
check_events(metrics, 2, 20, t0, t1)

# 2. no checkpoint: step 0
metrics = os.path.join(d, "m2")
t0 = time.time()
rc, out, err, _ = launch(["--nproc-per-node", "2", "--max-restarts", "1", "--metrics-dir", metrics,
                          "--", flaky], timeout=60, env={"READY": os.path.join(d, "r2")})
t1 = time.time()
check_eq(rc, 0, f"exit code without a checkpoint (stderr: {err!r})")
check_events(metrics, 2, 0, t0, t1)

# 3. no restart: no event
ok = write_script(d, "ok.sh", "#!/bin/bash\necho '{\"step\": 1, \"time\": 1.5, \"x\": 1}' >>\"$TANDEM_METRICS\"\n")
metrics = os.path.join(d, "m3")
rc, out, err, _ = launch(["--nproc-per-node", "2", "--max-restarts", "2", "--metrics-dir", metrics,
                          "--", ok], timeout=60)
check_eq(rc, 0, f"exit code of a group that succeeds (stderr: {err!r})")
for r in range(2):
    lines = lines_of(os.path.join(metrics, f"rank-{r}.jsonl"))
    check(not any("event" in l for l in lines), f"rank {r}: an event without a restart: {lines}")
print("test_restart_event: ok")
