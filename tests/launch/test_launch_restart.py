"""launch: --max-restarts restarts the whole group with TANDEM_RESTART_COUNT incremented, a
fresh MASTER_PORT, and a restart marker in the logs; without restarts the job fails."""
import os

from launchtest import check, check_eq, launch, tmpdir, write_script

d = tmpdir()
flaky = write_script(d, "flaky.sh", f"""#!/bin/bash
echo "attempt=$TANDEM_RESTART_COUNT torch=$TORCHELASTIC_RESTART_COUNT port=$MASTER_PORT"
if [ "$TANDEM_RESTART_COUNT" = 0 ] && [ "$RANK" = 1 ]; then exit 7; fi
[ "$TANDEM_RESTART_COUNT" = 0 ] && sleep 30
exit 0
""")

logs = os.path.join(d, "logs")
rc, out, err, secs = launch(["--nproc-per-node", "2", "--max-restarts", "1", "--log-dir", logs,
                             "--", flaky], timeout=60)
check_eq(rc, 0, f"exit code with --max-restarts 1 (stderr: {err!r})")
check("[rank 1] attempt=1 torch=1" in out, f"second attempt not seen in: {out!r}")
check("[rank 0] attempt=1 torch=1" in out, f"rank 0 did not restart: {out!r}")
check("exited with code 7" in err, f"first failure not named: {err!r}")
check("restart 1 of 1" in err, f"restart not announced: {err!r}")
ports = {l.split("port=")[1] for l in out.splitlines() if "port=" in l}
check_eq(len(ports), 2, f"distinct MASTER_PORTs across attempts {ports}")
with open(os.path.join(logs, "rank-1.log")) as f:
    log = f.read()
check_eq(log.count("--- restart 1 ---"), 1, f"restart marker in rank-1.log: {log!r}")
check(log.index("attempt=0") < log.index("--- restart 1 ---") < log.index("attempt=1"),
      f"log order: {log!r}")
check(secs < 20, f"rank 0's 30 s sleep should have been cut short by the teardown ({secs:.1f} s)")

rc, out, err, _ = launch(["--nproc-per-node", "2", "--max-restarts", "0", "--", flaky], timeout=60)
check_eq(rc, 1, "exit code with --max-restarts 0")
check("attempt=1" not in out, f"restarted without --max-restarts: {out!r}")
check("worker rank 1 (local rank 1 on node 0" in err and "exited with code 7" in err,
      f"root cause: {err!r}")
# Issue 8: a group that always dies was restarted 50 times in 0.2 s. Restarts now back off: the
# first at once, then TANDEM_RESTART_BACKOFF_MS doubling (here 200, 400, 800 ms), announced.
dies = write_script(d, "dies.sh", "#!/bin/bash\nexit 3\n")
rc, out, err, secs = launch(["--nproc-per-node", "1", "--max-restarts", "4", "--", dies],
                            timeout=60, env={"TANDEM_RESTART_BACKOFF_MS": "200"})
check_eq(rc, 1, "exit code after the restarts are used up")
check("restarting all workers (restart 1 of 4)" in err, f"first restart at once: {err!r}")
for k, wait in ((2, "0.2"), (3, "0.4"), (4, "0.8")):
    check(f"restarting all workers in {wait} s (restart {k} of 4)" in err,
          f"restart {k} should wait {wait} s: {err!r}")
check(secs >= 1.4, f"4 restarts with backoff 0+0.2+0.4+0.8 s took only {secs:.2f} s")
print("test_launch_restart: ok")
