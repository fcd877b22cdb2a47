"""launch: TANDEM_SYS_METRICS makes the agent sample its workers every 2 s into
METRICS_DIR/sys-HOST.jsonl (a periodic timer on the agent's event loop). The samples go on
across a restart (the loop outlives the attempt); a launcher without TANDEM_SYS_METRICS writes no
such file."""
import glob
import json
import os
import time

from launchtest import PYTHON, check, check_eq, launch, tmpdir, write_script

d = tmpdir()
# Busy for RUN_S in each attempt (a CPU share to sample); the first attempt then fails, so the
# group restarts once. Each worker notes when its attempt started.
RUN_S = 4.5
work = write_script(d, "work.py", f"""#!{PYTHON}
import os, sys, time
attempt = os.environ["TANDEM_RESTART_COUNT"]
with open(os.path.join({d!r}, "start-" + attempt + "-" + os.environ["RANK"]), "w") as f:
    f.write(repr(time.time()))
end = time.time() + {RUN_S}
while time.time() < end:
    sum(i * i for i in range(10000))
sys.exit(1 if attempt == "0" else 0)
""")

metrics = os.path.join(d, "metrics")
t0 = time.time() - 100.0  # steps are whole seconds since t0: about 100 and up
rc, out, err, secs = launch(["--nproc-per-node", "2", "--max-restarts", "1", "--metrics-dir",
                             metrics, "--", work], timeout=90,
                            env={"TANDEM_SYS_METRICS": repr(t0)})
check_eq(rc, 0, "launcher exit code (stderr: " + err[-2000:] + ")")

files = glob.glob(os.path.join(metrics, "sys-*.jsonl"))
check_eq(len(files), 1, f"system metrics files in {metrics} ({os.listdir(metrics)})")
rows = [json.loads(line) for line in open(files[0])]
check(rows, "no samples")
for r in rows:
    check(r["rank"] in (0, 1), f"a sample of rank {r['rank']}: {r}")
    check("sys/cpu_percent" in r and "sys/rss_mb" in r, f"a sample without cpu or rss: {r}")
steps = {rank: sorted({r["step"] for r in rows if r["rank"] == rank}) for rank in (0, 1)}
# About 9 s of workers, one sample every 2 s: the timer runs periodically, not once.
for rank in (0, 1):
    check(len(steps[rank]) >= 3, f"rank {rank} sampled at steps {steps[rank]} only")
# The second attempt (a new monitor on the same loop) is sampled too.
second = min(float(open(os.path.join(d, f"start-1-{rank}")).read()) for rank in (0, 1))
check(any(s >= int(second - t0) for s in steps[0] + steps[1]),
      f"no sample in the second attempt (from step {int(second - t0)}): {steps}")

# Without TANDEM_SYS_METRICS: no sampler, no file.
quiet = os.path.join(d, "quiet")
ok = write_script(d, "ok.sh", "#!/bin/sh\nsleep 0.5\n")
rc, out, err, _ = launch(["--nproc-per-node", "1", "--metrics-dir", quiet, "--", ok],
                         env={"TANDEM_SYS_METRICS": ""})
check_eq(rc, 0, "launcher exit code without sampling (stderr: " + err[-2000:] + ")")
check_eq(glob.glob(os.path.join(quiet, "sys-*.jsonl")), [], "system metrics files without the knob")
print("ok")
