"""launch: on a resume every rank gets one TANDEM_RESUME_STEP, node 0's newest committed
checkpoint (tandem/ckpt.h), handed to the other node through the rendezvous store, whatever the
other node's own checkpoint directory holds. Two agents on this host (--nnodes 2, --node-rank
0|1), one worker each, each node with a checkpoint directory of its own (no shared disk):
  - TANDEM_RESUME=1: node 0 holds steps 10 and 20 (and an uncommitted checkpoint-90/), node 1
    a newer step 30 and checkpoint-40/: both ranks get 20;
  - no resume: neither rank gets the variable;
  - a restart (--max-restarts 1): rank 0 commits step-25 in its attempt 0, rank 1 fails; in
    attempt 1 both ranks get 25;
  - TANDEM_RESUME_STEP=10 given to node 0 (the user's choice): both ranks get 10."""
import os
import socket
import subprocess

from launchtest import TANDEM, check, check_eq, tmpdir, write_script


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def touch(path, text="x"):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


d = tmpdir()
worker = write_script(d, "worker.sh", """#!/bin/bash
echo "rank=$RANK attempt=$TANDEM_RESTART_COUNT step=${TANDEM_RESUME_STEP-unset}"
if [ "$FLAKY" = 1 ] && [ "$TANDEM_RESTART_COUNT" = 0 ]; then
    if [ "$RANK" = 0 ]; then
        echo x > "$TANDEM_CHECKPOINT_DIR/.tmp" && mv "$TANDEM_CHECKPOINT_DIR/.tmp" "$TANDEM_CHECKPOINT_DIR/step-000000000025.pt"
        echo committed > "$TANDEM_CHECKPOINT_DIR/../committed-25"
        sleep 30
    else
        while [ ! -e "$FLAG" ]; do sleep 0.05; done
        exit 7
    fi
fi
exit 0
""")


def run_nodes(tag, env0=None, env_all=None, extra=()):
    port = free_port()
    procs = []
    for node in range(2):
        env = dict(os.environ, TANDEM_TOKEN=f"resume-step-{tag}",
                   TANDEM_CHECKPOINT_DIR=os.path.join(d, tag, f"node{node}", "checkpoints"))
        env.pop("TANDEM_RESUME_STEP", None)
        env.update(env_all or {})
        if node == 0:
            env.update(env0 or {})
        procs.append(subprocess.Popen(
            [TANDEM, "launch", "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "1",
             "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", tag, "--rdzv-timeout", "60",
             *extra, "--", worker],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    outs = []
    for node, p in enumerate(procs):
        try:
            out, err = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise SystemExit(f"FAIL: {tag}: node {node} did not end in 120 s")
        check_eq(p.returncode, 0, f"{tag}: node {node}'s exit code (stderr: {err!r})")
        outs.append((out, err))
    return outs


def steps_seen(outs, attempt="0"):
    got = {}
    for out, _ in outs:
        for line in out.splitlines():
            f = dict(kv.split("=", 1) for kv in line.split("] ", 1)[-1].split())
            if f.get("attempt") == attempt:
                got[f["rank"]] = f["step"]
    return got


def node_dir(tag, node):
    return os.path.join(d, tag, f"node{node}", "checkpoints")


# resume: node 0's newest committed wins over node 1's newer ones
touch(os.path.join(node_dir("resume", 0), "step-000000000010.pt"))
touch(os.path.join(node_dir("resume", 0), "step-000000000020.pt"))
touch(os.path.join(node_dir("resume", 0), "checkpoint-90", "model.safetensors"))  # uncommitted
touch(os.path.join(node_dir("resume", 1), "step-000000000030.pt"))
touch(os.path.join(node_dir("resume", 1), "checkpoint-40", "trainer_state.json"), "{}")
outs = run_nodes("resume", env_all={"TANDEM_RESUME": "1"})
check_eq(steps_seen(outs), {"0": "20", "1": "20"}, "TANDEM_RESUME_STEP per rank on a resume")
check("resuming from step 20 (the newest committed checkpoint on node 0)" in outs[0][1],
      f"node 0 did not say which step: {outs[0][1]!r}")
check("resuming from step 20, node 0's choice" in outs[1][1],
      f"node 1 did not say it took node 0's step: {outs[1][1]!r}")

# a fresh start: no step
outs = run_nodes("fresh")
check_eq(steps_seen(outs), {"0": "unset", "1": "unset"}, "TANDEM_RESUME_STEP on a fresh start")

# a restart: the step node 0's rank 0 committed in the failed attempt
flag = os.path.join(node_dir("restart", 0), "..", "committed-25")
os.makedirs(node_dir("restart", 0), exist_ok=True)
os.makedirs(node_dir("restart", 1), exist_ok=True)
touch(os.path.join(node_dir("restart", 1), "step-000000000030.pt"))
outs = run_nodes("restart", env_all={"FLAKY": "1", "FLAG": flag}, extra=("--max-restarts", "1"))
check_eq(steps_seen(outs, "0"), {"0": "unset", "1": "unset"}, "TANDEM_RESUME_STEP in attempt 0")
check_eq(steps_seen(outs, "1"), {"0": "25", "1": "25"}, "TANDEM_RESUME_STEP after the restart")

# the user names the step on node 0
touch(os.path.join(node_dir("named", 0), "step-000000000010.pt"))
touch(os.path.join(node_dir("named", 0), "step-000000000020.pt"))
outs = run_nodes("named", env0={"TANDEM_RESUME_STEP": "10"}, env_all={"TANDEM_RESUME": "1"})
check_eq(steps_seen(outs), {"0": "10", "1": "10"}, "TANDEM_RESUME_STEP named on node 0")
print("resume: both ranks 20 (node 0's newest); fresh: unset; restart: 25; named: 10")
