"""launch: progress across nodes (issue 9). Two node agents on loopback (`--nnodes 2
--node-rank 0|1 --rdzv-endpoint 127.0.0.1:PORT`), one pg_worker each.

1. node 1's agent frozen (SIGSTOP of the launcher; its worker runs on): node 0 reports that node
   1's agent stopped heartbeating, tears down and exits 1 within --stall-timeout + a few seconds,
   without waiting for node 1 to check out. Resumed, node 1's agent exits non-zero too.
2. rank 1's worker (on node 1) frozen: both nodes print the same cause, naming rank 1 on node 1
   with its seq and the other's.
Bounded waits only; no speed is asserted."""
import os
import re
import signal
import socket
import subprocess
import time

from launchtest import TANDEM, check, check_eq, pid_alive, tmpdir

WORKER = os.path.join(os.environ.get("TANDEM_BUILD_DIR", "build"), "tests", "launch", "pg_worker")
check(os.access(WORKER, os.X_OK), f"{WORKER} is not built")
STALL = 3
SLACK = 15  # detection, the grace period, the store host's check-out wait, a loaded machine


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def start_nodes(tag, d):
    port = free_port()
    env = dict(os.environ, TANDEM_TOKEN=f"stall-nodes-{tag}")
    procs = []
    for node in range(2):
        procs.append(subprocess.Popen(
            [TANDEM, "launch", "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "1",
             "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", tag, "--rdzv-timeout", "60",
             "--stall-timeout", str(STALL), "--", WORKER, "--iters", "1000000", "--interval-ms",
             "5", "--pid-dir", d],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    pids = []
    for r in range(2):
        path = os.path.join(d, f"rank-{r}.pid")
        end = time.time() + 60
        while not (os.path.exists(path) and open(path).read().endswith("\n")):
            if time.time() > end:
                for p in procs:
                    p.kill()
                raise SystemExit(f"FAIL: {path} did not appear: {[p.communicate() for p in procs]}")
            time.sleep(0.05)
        pids.append(int(open(path).read()))
    time.sleep(1.0)  # well inside the loop
    return procs, pids


def finish(p, timeout, what):
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        raise SystemExit(f"FAIL: {what} did not exit within {timeout} s: {err[-2000:]!r}")
    return out, err


# --- 1. a frozen node agent
d = tmpdir()
(n0, n1), pids = start_nodes("agentfreeze", d)
n1.send_signal(signal.SIGSTOP)
t0 = time.time()
try:
    out0, err0 = finish(n0, STALL + SLACK + 30, "node 0 (with node 1's agent frozen)")
    secs = time.time() - t0
finally:
    n1.send_signal(signal.SIGCONT)
out1, err1 = finish(n1, 60, "node 1 after SIGCONT")
check_eq(n0.returncode, 1, f"node 0's exit code (stderr: {err0[-2000:]!r})")
m = re.search(r"stall: the node agent of node 1 \(([^)]*)\) has not updated its heartbeat for "
              r"([\d.]+) s: it is stopped, dead, or cut off from the store; its rank 1 was last "
              r"seen at allreduce seq \d+", err0)
check(m, f"node 0 does not name node 1's agent: {err0!r}")
check(float(m.group(2)) >= STALL, f"node 1's agent was declared silent under "
      f"--stall-timeout {STALL}: {err0!r}")
check(f"--stall-timeout {STALL}" in err0, f"the flag is not named: {err0!r}")
check(secs <= STALL + SLACK, f"node 0 took {secs:.1f} s after the freeze (limit {STALL} + {SLACK})")
check("node agents checked out" not in err0, f"node 0 waited for the frozen agent: {err0!r}")
check(n1.returncode not in (0, None), f"node 1 after SIGCONT exited {n1.returncode}: {err1!r}")
for pid in pids:
    check(not pid_alive(pid), f"worker {pid} survived")
print(f"1. node 1's agent frozen: node 0 reported it after {secs:.1f} s and exited 1; node 1 "
      f"exited {n1.returncode} once resumed: ok")

# --- 2. a frozen worker on node 1, reported on both nodes
d = tmpdir()
(n0, n1), pids = start_nodes("workerfreeze", d)
os.kill(pids[1], signal.SIGSTOP)
t0 = time.time()
out0, err0 = finish(n0, STALL + SLACK + 30, "node 0 (rank 1 frozen)")
out1, err1 = finish(n1, 30, "node 1 (rank 1 frozen)")
secs = time.time() - t0
for node, p, err in ((0, n0, err0), (1, n1, err1)):
    check_eq(p.returncode, 1, f"node {node}'s exit code (stderr: {err[-2000:]!r})")
    m = re.search(r"stall: rank 1 on node 1 \([^,]+, pid (\d+)\) is at (?:\w+ )?seq (\d+).*?, "
                  r"the other at (\w+) seq (\d+) \(inside it\); no progress for ([\d.]+) s", err)
    check(m, f"node {node} does not name rank 1 on node 1: {err!r}")
    check(float(m.group(5)) >= STALL, f"node {node}: a stall after {m.group(5)} s of no progress, "
          f"under --stall-timeout {STALL}: {err!r}")
    check_eq(int(m.group(1)), pids[1], f"node {node}: the frozen worker's pid")
    lag, ahead = int(m.group(2)), int(m.group(4))
    check(ahead - 1 <= lag <= ahead, f"node {node}: rank 1 at seq {lag}, the other at {ahead}")
check(secs <= STALL + SLACK, f"the group went down {secs:.1f} s after the freeze")
for pid in pids:
    check(not pid_alive(pid), f"worker {pid} survived")
print(f"2. rank 1 frozen on node 1: both nodes named it ({lag} vs {ahead}) within {secs:.1f} s: ok")
print("test_launch_stall_nodes: ok")
