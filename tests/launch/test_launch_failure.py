"""launch: a worker killed by SIGKILL or exiting 3 brings the launcher down at once, names the
root cause, and leaves no worker (or grandchild) behind."""
import os
import re
import time

from launchtest import check, check_eq, launch, pid_alive, tmpdir, write_script

d = tmpdir()
# Each worker records its pid and its child's (a grandchild of the launcher) then sleeps; rank 1
# dies after ~1 s and notes when.
loop = write_script(d, "loop.sh", f"""#!/bin/bash
sleep 1000 &
echo "$$ $!" > {d}/pids-$RANK
if [ "$RANK" = 1 ]; then
  sleep 1
  date +%s.%N > {d}/death-$RANK
  if [ "$MODE" = kill ]; then kill -9 $$; else exit 3; fi
fi
while true; do sleep 0.1; done
""")

for mode in ("kill", "exit"):
    for f in os.listdir(d):
        if f.startswith(("pids-", "death-")):
            os.unlink(os.path.join(d, f))
    rc, out, err, _ = launch(["--nproc-per-node", "2", "--", loop], env={"MODE": mode}, timeout=30)
    end = time.time()
    check_eq(rc, 1, f"[{mode}] launcher exit code (stderr: {err!r})")
    with open(f"{d}/death-1") as f:
        death = float(f.read())
    latency = end - death
    print(f"[{mode}] worker death -> launcher exit: {latency * 1000:.0f} ms")
    check(latency < 2.0, f"[{mode}] launcher took {latency:.2f} s after the death (limit 2 s)")
    with open(f"{d}/pids-1") as f:
        pid1 = int(f.read().split()[0])
    if mode == "kill":
        want = (f"worker rank 1 (local rank 1 on node 0, pid {pid1}) was killed by signal 9 "
                "(SIGKILL)")
    else:
        want = f"worker rank 1 (local rank 1 on node 0, pid {pid1}) exited with code 3"
    check(want in err, f"[{mode}] root cause {want!r} not in stderr: {err!r}")
    # rank 0 was torn down, not reported as the cause
    check(not re.search(r"error: worker rank 0", err), f"[{mode}] rank 0 blamed: {err!r}")
    time.sleep(0.2)
    for r in (0, 1):
        with open(f"{d}/pids-{r}") as f:
            for pid in map(int, f.read().split()):
                check(not pid_alive(pid), f"[{mode}] pid {pid} of rank {r} survived the launcher")
# Issue 8: `--nproc-per-node 1000` on a small machine was started. Now a usage error, at once,
# naming the bound, and no worker runs.
cores = len(os.sched_getaffinity(0))
marker = os.path.join(d, "started")
rc, out, err, secs = launch(["--nproc-per-node", str(32 * cores + 1), "--", "touch", marker],
                            timeout=30)
check_eq(rc, 2, f"exit code for {32 * cores + 1} workers on {cores} cores (stderr: {err!r})")
check(f"at most {32 * cores}" in err, f"the bound is not named: {err!r}")
check(not os.path.exists(marker), "a worker was started anyway")
print("test_launch_failure: ok")
