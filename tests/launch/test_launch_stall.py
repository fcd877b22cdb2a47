"""launch: progress, not just liveness (issue 9). Workers publish their collective progress
(tests/launch/pg_worker: td_pg_init_from_env, allreduces in a loop); the launcher's stall check
finds a rank whose process lives but gets nowhere.

1. rank 1 frozen (SIGSTOP) mid-run: the launcher names rank 1, its node, its seq and the other's
   seq within --stall-timeout + a few seconds, tears down and exits 1; no process survives. Not
   too early either: the "no progress for X s" it reports is at least --stall-timeout, and the
   report comes no sooner than --stall-timeout after the freeze, less the up to a second (a
   record's age, a check period) by which the launcher may have seen the last progress before it.
2. the same with --max-restarts 1, frozen in the first attempt only: the group restarts and
   finishes.
3. rank 1 sleeps between collectives for more than twice the stall time while rank 0 waits inside
   the next allreduce: busy, not stuck. Not a stall (a warning says so); the job succeeds.
4. workers that use no collectives (a PyTorch script, `sleep`) are judged by liveness only.
5. --stall-timeout 0 tells the workers to publish nothing; a negative value is a usage error.
Bounded waits only; no speed is asserted."""
import os
import re
import signal
import subprocess
import time

from launchtest import TANDEM, check, check_eq, launch, pid_alive, tmpdir, write_script

WORKER = os.path.join(os.environ.get("TANDEM_BUILD_DIR", "build"), "tests", "launch", "pg_worker")
check(os.access(WORKER, os.X_OK), f"{WORKER} is not built")
STALL = 3  # seconds: short for the test; the default is 120
SLACK = 12  # detection (a stall period, a heartbeat), the grace period, a loaded 2-core machine


def start(args, env=None):
    e = dict(os.environ)
    e.pop("TANDEM_TOKEN", None)
    e.update(env or {})
    return subprocess.Popen([TANDEM, "launch"] + args, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=e)


def wait_file(path, timeout=60):
    end = time.time() + timeout
    while time.time() < end:
        if os.path.exists(path) and open(path).read().endswith("\n"):
            return int(open(path).read())
        time.sleep(0.05)
    raise SystemExit(f"FAIL: {path} did not appear within {timeout} s")


def check_stall_line(err, rank, node):
    """The cause names the rank, its node, where it is and where the others are; returns the two
    seqs."""
    m = re.search(rf"stall: rank {rank} on node {node} \(([^,]+), pid \d+\) is at "
                  r"(?:\w+ )?seq (\d+).*?, the others? at (\w+) seq (\d+) \(inside it\); "
                  r"no progress for ([\d.]+) s", err)
    check(m, f"no stall line naming rank {rank} on node {node} in: {err!r}")
    lag, ahead = int(m.group(2)), int(m.group(4))
    idle = float(m.group(5))
    check(idle >= STALL, f"a stall reported after {idle} s of no progress, under --stall-timeout "
          f"{STALL}: {err!r}")
    check(ahead - 1 <= lag <= ahead, f"rank {rank} at seq {lag}, the other at {ahead}: {err!r}")
    check(f"--stall-timeout {STALL}" in err, f"the flag is not named: {err!r}")
    return lag, ahead


# --- 1. a frozen rank fails the group
d = tmpdir()
p = start(["--nproc-per-node", "2", "--stall-timeout", str(STALL), "--", WORKER, "--iters",
           "1000000", "--interval-ms", "5", "--pid-dir", d])
pids = [wait_file(os.path.join(d, f"rank-{r}.pid")) for r in range(2)]
time.sleep(1.0)  # well inside the loop
os.kill(pids[1], signal.SIGSTOP)
t0 = time.time()
try:
    out, err = p.communicate(timeout=STALL + SLACK + 30)
except subprocess.TimeoutExpired:
    p.kill()
    os.kill(pids[1], signal.SIGKILL)
    raise SystemExit(f"FAIL: the launcher did not notice the frozen rank in {STALL + SLACK + 30} s")
secs = time.time() - t0
check_eq(p.returncode, 1, f"exit code after a stall (stderr: {err[-2000:]!r})")
lag, ahead = check_stall_line(err, 1, 0)
check("sent no heartbeat" in err, f"the frozen process is not called silent: {err!r}")
check(secs <= STALL + SLACK, f"the stall was reported {secs:.1f} s after the freeze (limit "
      f"{STALL} + {SLACK})")
check(secs >= STALL - 1.0, f"the stall was reported {secs:.1f} s after the freeze, before "
      f"--stall-timeout {STALL} (less 1 s of sampling) could have passed")
for pid in pids:
    check(not pid_alive(pid), f"worker {pid} survived the teardown")
print(f"1. frozen rank 1: reported at seq {lag} vs {ahead} after {secs:.1f} s, exit 1: ok")

# --- 2. frozen in the first attempt only: restarted, then done
d = tmpdir()
wrapper = write_script(d, "w.sh", f"""#!/bin/bash
if [ "$TANDEM_RESTART_COUNT" = 0 ]; then
  mkdir -p {d}/a0
  exec {WORKER} --iters 1000000 --interval-ms 5 --pid-dir {d}/a0
fi
exec {WORKER} --iters 200 --interval-ms 1
""")
p = start(["--nproc-per-node", "2", "--stall-timeout", str(STALL), "--max-restarts", "1", "--",
           wrapper])
pid1 = wait_file(os.path.join(d, "a0", "rank-1.pid"))
time.sleep(1.0)
os.kill(pid1, signal.SIGSTOP)
try:
    out, err = p.communicate(timeout=STALL + SLACK + 90)
except subprocess.TimeoutExpired:
    p.kill()
    raise SystemExit("FAIL: the restart run did not finish")
check_eq(p.returncode, 0, f"exit code after a restart (stderr: {err[-2000:]!r})")
check_stall_line(err, 1, 0)
check("restart 1 of 1" in err, f"no restart announced: {err!r}")
for r in range(2):
    check(f"[rank {r}] pg ok rank {r} of 2 restart 1" in out, f"rank {r} did not finish: {out!r}")
check(not pid_alive(pid1), f"the frozen worker {pid1} survived")
print("2. frozen in attempt 0, --max-restarts 1: restarted and finished: ok")

# --- 3. busy between collectives is not a stall
nap = 3 * STALL
rc, out, err, secs = launch(["--nproc-per-node", "2", "--stall-timeout", str(STALL), "--",
                             WORKER, "--iters", "40", "--interval-ms", "2", "--nap",
                             f"1:20:{nap}"], timeout=nap + 90)
check_eq(rc, 0, f"exit code with a {nap} s nap between collectives (stderr: {err!r})")
check("stall:" not in err, f"a rank busy between collectives was taken for stuck: {err!r}")
check("rank 1 naps" in out and "[rank 1] pg ok rank 1 of 2" in out, f"output: {out!r}")
check(re.search(r"rank 1 on node 0 \(.*\) has been at allreduce seq 20 \(finished it; between "
                r"collectives\) for [\d.]+ s, the other at allreduce seq 21 \(inside it\); its process "
                r"is running .* so this is no stall", err),
      f"the busy rank is not reported as such (once): {err!r}")
check_eq(err.count("so this is no stall"), 1, f"the warning repeats: {err!r}")
print(f"3. rank 1 busy for {nap} s between collectives: no stall, warned once: ok")

# --- 4. no collectives at all: liveness only
rc, out, err, secs = launch(["--nproc-per-node", "2", "--stall-timeout", "1", "--", "sleep",
                             "4"], timeout=60)
check_eq(rc, 0, f"workers without collectives sleeping past the stall time (stderr: {err!r})")
check("stall" not in err, f"workers that publish nothing were judged: {err!r}")
print("4. no collectives, 4 s of sleep with --stall-timeout 1: ok")

# --- 5. off, and the flag's check
d = tmpdir()
dump = write_script(d, "env.sh", "#!/bin/bash\necho \"hb=$TANDEM_HEARTBEAT_MS\"\n")
rc, out, err, _ = launch(["--stall-timeout", "0", "--", dump], env={"TANDEM_HEARTBEAT_MS": "7"})
check_eq(rc, 0, f"exit code ({err!r})")
check("[rank 0] hb=0" in out, f"--stall-timeout 0 must tell workers to publish nothing: {out!r}")
rc, out, err, _ = launch(["--stall-timeout", "60", "--", dump])
check("[rank 0] hb=5000" in out, f"--stall-timeout 60: heartbeat 60/8 capped at 5 s: {out!r}")
rc, out, err, _ = launch(["--stall-timeout", "-1", "--", "true"])
check_eq(rc, 2, f"--stall-timeout -1 is a usage error ({err!r})")
check("--stall-timeout" in err, f"the error names the flag: {err!r}")
rc, out, err, _ = launch(["--", dump], env={"TANDEM_STALL_TIMEOUT_MS": "16000"})
check("[rank 0] hb=2000" in out, f"TANDEM_STALL_TIMEOUT_MS=16000 is the default: {out!r}")
print("5. --stall-timeout 0 / 60 / -1, TANDEM_STALL_TIMEOUT_MS: ok")
print("test_launch_stall: ok")
