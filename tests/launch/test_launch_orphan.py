"""launch: a `kill -9` of a node's `tandem launch` must take its trainers with it, even behind a
wrapper shell. The launcher's death signal (PR_SET_PDEATHSIG) reaches only its direct child, the
`/bin/sh -c` that the workflow, ssh and slurm executors run the script in, so the `tandem train`
that shell forked trained on as an orphan (writing metrics and checkpoints beside a later
--resume). `tandem train` under the launcher now asks for SIGTERM when its parent dies:
  a. the executors' shape (`/bin/sh -c 'trap : TERM ...; tandem train ...; true'`, a shell that
     does not exec the trainer): after kill -9 of the launcher the trainer is gone within a few
     seconds, and it went the graceful way (a checkpoint written at the stop);
  b. a trainer whose wrapper died before it could ask (orphaned while starting) refuses to train,
     saying why, instead of training unwatched."""
import os
import signal
import subprocess
import sys
import time

from launchtest import TANDEM, check, fail, pid_alive, tmpdir

DATA = os.environ.get("TANDEM_DATA", "/usr/share/datasets/fashion-mnist")
if not os.path.exists(os.path.join(DATA, "train-images-idx3-ubyte.gz")):
    print(f"SKIP: Fashion-MNIST not found in {DATA}")
    sys.exit(77)

d = tmpdir()
ck = os.path.join(d, "ck")
train = (f"{TANDEM} train --model basicnet --data {DATA} --steps 100000 --batch 16 --threads 1 "
         f"--no-progress --checkpoint-dir {ck}")


def trainers():
    """Pids of `tandem train` processes of this test (their command line names our directory)."""
    found = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if len(argv) > 2 and argv[1] == b"train" and ck.encode() in b" ".join(argv) \
                and pid_alive(int(p)):
            found.append(int(p))
    return found


def ckpts():
    return sorted(f for f in os.listdir(ck) if f.startswith("ckpt-")) if os.path.isdir(ck) else []


# --- a. kill -9 of the launcher
script = f"trap : TERM\nmkdir -p {d}/out\n{train}; true"
log = open(os.path.join(d, "launch.log"), "w")
launcher = subprocess.Popen([TANDEM, "launch", "--standalone", "--nproc-per-node", "1", "--",
                             "/bin/sh", "-c", script], stdout=log, stderr=subprocess.STDOUT)
pids = []
deadline = time.time() + 60
while not pids:
    check(time.time() < deadline and launcher.poll() is None,
          f"the trainer did not start under the launcher (exit {launcher.poll()}): "
          + open(os.path.join(d, "launch.log")).read()[-2000:])
    time.sleep(0.1)
    pids = trainers()
trainer = pids[0]
with open(f"/proc/{trainer}/stat") as f:
    parent = int(f.read().split(")")[-1].split()[1])
check(parent != launcher.pid,
      f"the trainer (pid {trainer}) is the launcher's direct child: the test needs the wrapper")
time.sleep(2)  # well into training (its data loaded, steps running)
before = ckpts()
launcher.send_signal(signal.SIGKILL)
launcher.wait()
t0 = time.time()
while pid_alive(trainer) and time.time() - t0 < 15:
    time.sleep(0.05)
secs = time.time() - t0
if pid_alive(trainer):
    os.kill(trainer, signal.SIGKILL)
    fail(f"tandem train (pid {trainer}) still trained {secs:.0f} s after kill -9 of its launcher "
         f"(pid {launcher.pid}): an orphan")
check(secs < 10, f"the trainer took {secs:.1f} s to go after its launcher died")
check(not trainers(), f"trainers left: {trainers()}")
after = ckpts()
check(after and after != before,
      f"no checkpoint written at the stop (before the kill: {before}, after: {after})")
print(f"a. kill -9 of the launcher: the trainer behind /bin/sh went in {secs:.2f} s, "
      f"with a checkpoint ({after[-1]})")

# --- b. orphaned before it could ask: refuses to train
err = os.path.join(d, "orphan.err")
env = dict(os.environ, RANK="0", WORLD_SIZE="1", TANDEM_RUN_ID="orphan-test")
env.pop("TANDEM_STORE_ADDR", None)
# The outer shell exits at once; the subshell, orphaned, becomes the trainer half a second later.
subprocess.run(["/bin/sh", "-c", f"(sleep 0.5; exec {train} --steps 5 2>{err}) >/dev/null & exit 0"],
               env=env, check=True, start_new_session=True)
deadline = time.time() + 30
text = ""
while time.time() < deadline:
    text = open(err).read() if os.path.exists(err) else ""
    if "orphan" in text and not trainers():
        break
    time.sleep(0.1)
check("not running on as an orphan" in text,
      f"an orphaned trainer did not refuse to start; its stderr: {text!r}")
check(not trainers(), f"the orphaned trainer still runs: {trainers()}")
print("b. a trainer orphaned while starting refused: " + text.strip().splitlines()[-1][:200])
print("test_launch_orphan: ok")
