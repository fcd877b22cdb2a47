"""launch: SIGTERM/SIGINT to the launcher reach every worker (their process groups), the
launcher waits for them and exits 143 when they checkpointed (exit 143), 130 for SIGINT,
and SIGKILLs a worker that ignores SIGTERM after --stop-grace."""
import os
import signal
import subprocess
import time

from launchtest import TANDEM, check, check_eq, tmpdir, write_script

d = tmpdir()
worker = write_script(d, "trap.sh", f"""#!/bin/bash
on_term() {{ sleep 0.3; echo "rank $RANK checkpointed" > {d}/marker-$RANK; exit 143; }}
trap on_term TERM
trap 'echo int > {d}/int-$RANK; exit 130' INT
[ "$MODE" = stubborn ] && trap '' TERM
echo ready > {d}/ready-$RANK
while true; do sleep 0.05; done
""")


def start(mode, extra=()):
    for f in os.listdir(d):
        if f.startswith(("marker-", "ready-", "int-")):
            os.unlink(os.path.join(d, f))
    env = dict(os.environ, MODE=mode)
    p = subprocess.Popen([TANDEM, "launch", "--nproc-per-node", "2", *extra, "--", worker],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.time() + 30
    while not all(os.path.exists(f"{d}/ready-{r}") for r in (0, 1)):
        check(time.time() < deadline and p.poll() is None, "workers did not start")
        time.sleep(0.05)
    return p


p = start("checkpoint")
p.send_signal(signal.SIGTERM)
out, err = p.communicate(timeout=30)
check_eq(p.returncode, 143, f"exit code after SIGTERM (stderr {err!r})")
for r in (0, 1):
    check(os.path.exists(f"{d}/marker-{r}"), f"rank {r} did not get SIGTERM (no marker)")

p = start("checkpoint")
p.send_signal(signal.SIGINT)
out, err = p.communicate(timeout=30)
check_eq(p.returncode, 130, f"exit code after SIGINT (stderr {err!r})")
for r in (0, 1):
    check(os.path.exists(f"{d}/int-{r}"), f"rank {r} did not get SIGINT")

p = start("stubborn", ["--stop-grace", "1"])
t0 = time.time()
p.send_signal(signal.SIGTERM)
out, err = p.communicate(timeout=30)
secs = time.time() - t0
check_eq(p.returncode, 1, f"exit code when workers ignore SIGTERM (stderr {err!r})")
check("SIGKILL" in err, f"escalation not reported: {err!r}")
check(0.9 < secs < 10, f"stop took {secs:.1f} s with --stop-grace 1")
# A second SIGTERM (more than 1 s after the first; a burst counts as one) kills at once.
p = start("stubborn")
t0 = time.time()
p.send_signal(signal.SIGTERM)
time.sleep(0.2)
p.send_signal(signal.SIGTERM)  # same burst: ignored
time.sleep(1.3)
check(p.poll() is None, "a duplicate SIGTERM within 1 s must not escalate")
p.send_signal(signal.SIGTERM)
out, err = p.communicate(timeout=30)
secs = time.time() - t0
check_eq(p.returncode, 1, f"exit code after a second SIGTERM (stderr {err!r})")
check("second SIGTERM" in err, f"escalation not reported: {err!r}")
check(secs < 10, f"second SIGTERM took {secs:.1f} s to stop (stop grace is 30 s)")
print("test_launch_signals: ok")
