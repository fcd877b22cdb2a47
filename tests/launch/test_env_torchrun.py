"""launch: the worker environment checked against torchrun itself (issue 30).

The same script runs under `tandem launch` and under `python -m torch.distributed.run` (torch 2.x
of the frameworks' venv) with the same flags, each worker dumping its whole environment. The
variables torchrun sets are found, not listed: whatever a torchrun worker has that the parent
did not. Then, for every worker (matched by GROUP_RANK, LOCAL_RANK):
  - every torchrun variable is set by tandem too, except IGNORED (each with its reason);
  - SAME: equal values;
  - DIFFER: both present and well-formed, values legitimately apart (each with its reason);
  - tandem's own additions NODE_RANK and NUM_NODES equal GROUP_RANK and GROUP_WORLD_SIZE;
  - `tandem env` lists every one of them (the contract is declared once, in one table).
Cases: one node of 2 workers (nothing inherited); 2 nodes x 2 workers with torchrun's static
rendezvous (--node-rank --master-addr --master-port --rdzv-id --max-restarts --role), with
OMP_NUM_THREADS and TORCH_NCCL_ASYNC_ERROR_HANDLING inherited; 2 nodes with c10d
(--rdzv-backend c10d --rdzv-endpoint)."""
import json
import os
import socket
import subprocess
import sys

from launchtest import SOURCE, TANDEM, check, check_eq, fail, tmpdir, write_script

fw = subprocess.run([os.path.join(SOURCE, "scripts", "venv.sh"), "--print-frameworks"],
                    capture_output=True, text=True).stdout.strip()
PY = os.path.join(fw, "bin", "python")
if not os.access(PY, os.X_OK) or subprocess.run(
        [PY, "-c", "import torch.distributed.run"], capture_output=True).returncode != 0:
    print(f"SKIP: no torch 2.x with torch.distributed.run in {fw} (scripts/venv.sh makes it)")
    raise SystemExit(77)

# torchrun's own machinery, not a contract with the script: not set by tandem.
IGNORED = {
    # where torch's @record writes a worker's exception for torchrun's agent to read back;
    # tandem names the root cause from the exit status, and @record without it only logs
    "TORCHELASTIC_ERROR_FILE": "torchrun's agent reads it; tandem has no reader",
    # torchrun's agent's own signal list, inherited by its workers by accident
    "TORCHELASTIC_SIGNALS_TO_HANDLE": "the agent's signal handling, not the worker's",
    "SHLVL": "the shell's", "_": "the shell's",
}
# Present in both, values legitimately apart.
DIFFER = {
    "MASTER_PORT": "a free port picked at run time by each launcher",
    "TORCHELASTIC_USE_AGENT_STORE": "torchrun's agent serves the store at MASTER_PORT (True); "
                                    "tandem's workers build theirs there (False)",
    "TORCHELASTIC_RUN_ID": "random per run when no --rdzv-id is given (one node)",
    "MASTER_ADDR": "c10d and one node: torchrun says localhost, tandem node 0's 127.0.0.1",
    "OMP_NUM_THREADS": "not inherited: torchrun 1 with several workers, tandem cores / workers",
}

d = tmpdir()
dump = write_script(d, "dump.py", """
import json, os, sys
path = os.path.join(sys.argv[1], "%s-%s.json" % (os.environ["GROUP_RANK"], os.environ["LOCAL_RANK"]))
with open(path, "w") as f:
    json.dump(dict(os.environ), f)
""")

base = {k: v for k, v in os.environ.items()
        if k not in ("OMP_NUM_THREADS", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "TANDEM_TOKEN",
                     "TANDEM_NUM_THREADS", "NODE_RANK", "NUM_NODES", "CUDA_VISIBLE_DEVICES")
        and not k.startswith(("TORCHELASTIC_", "MASTER_", "GROUP_", "ROLE_"))
        and k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")}
base["PYTHON"] = PY


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def run_nodes(argvs, extra_env, out):
    """Starts one launcher per argv (the nodes, at once), waits for all; the workers' dumps."""
    os.makedirs(out)
    env = dict(base)
    env.update(extra_env)
    procs = [subprocess.Popen(a + [dump, out], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for a in argvs]
    for a, p in zip(argvs, procs):
        text, _ = p.communicate(timeout=180)
        check_eq(p.returncode, 0, f"{' '.join(a)} exit code (output: {text[-3000:]})")
    dumps = {}
    for name in os.listdir(out):
        g, l = name[:-5].split("-")
        with open(os.path.join(out, name)) as f:
            dumps[(int(g), int(l))] = json.load(f)
    return env, dumps


def compare(case, flags_per_node, extra_env, same_extra=()):
    torchrun = [[PY, "-m", "torch.distributed.run"] + f for f in flags_per_node]
    tandem = [[TANDEM, "launch"] + f for f in flags_per_node]
    parent, tr = run_nodes(torchrun, extra_env, os.path.join(d, case, "torchrun"))
    _, td = run_nodes(tandem, extra_env, os.path.join(d, case, "tandem"))
    check_eq(sorted(td), sorted(tr), f"{case}: workers (group rank, local rank)")
    names = set()
    for key in sorted(tr):
        t, m = tr[key], td[key]
        # torchrun's variables: what its worker has that the parent had not, or had otherwise
        set_by_torchrun = {k for k in t if parent.get(k) != t[k] and k not in IGNORED}
        set_by_torchrun |= {k for k in extra_env if k in t}  # inherited ones it passes on
        names |= set_by_torchrun
        for k in sorted(set_by_torchrun):
            check(k in m, f"{case} worker {key}: torchrun sets {k}={t[k]!r}, tandem does not")
            if k in DIFFER and k not in same_extra:
                continue
            check_eq(m[k], t[k], f"{case} worker {key}: {k} (tandem vs torchrun)")
        # the ones that differ: present and well-formed
        check(1 <= int(m["MASTER_PORT"]) <= 65535, f"{case}: tandem MASTER_PORT {m['MASTER_PORT']}")
        check_eq(m["TORCHELASTIC_USE_AGENT_STORE"], "False", f"{case}: tandem's agent store")
        check(t["TORCHELASTIC_USE_AGENT_STORE"] in ("True", "False"), "torchrun's agent store")
        check(m["TORCHELASTIC_RUN_ID"] != "", f"{case}: tandem TORCHELASTIC_RUN_ID empty")
        socket.getaddrinfo(m["MASTER_ADDR"], int(m["MASTER_PORT"]))  # resolvable
        check(int(m["OMP_NUM_THREADS"]) >= 1, f"{case}: tandem OMP_NUM_THREADS")
        # tandem's additions for the node (Lightning reads NODE_RANK)
        check_eq(m.get("NODE_RANK"), m["GROUP_RANK"], f"{case} worker {key}: NODE_RANK")
        check_eq(m.get("NUM_NODES"), m["GROUP_WORLD_SIZE"], f"{case} worker {key}: NUM_NODES")
        check("NODE_RANK" not in t, "torchrun does not set NODE_RANK (else it joins SAME)")
    return names


# ---- one node, 2 workers, nothing inherited
names = compare("one", [["--nnodes", "1", "--nproc-per-node", "2"]], {})

# ---- 2 nodes x 2 workers, torchrun's static rendezvous; inherited values passed through
port = free_port()
flags = [["--nnodes", "2", "--nproc-per-node", "2", "--node-rank", str(r), "--master-addr",
          "127.0.0.1", "--master-port", str(port), "--rdzv-id", "job7", "--max-restarts", "1",
          "--role", "trainer"] for r in (0, 1)]
names |= compare("static", flags, {"OMP_NUM_THREADS": "3", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"},
                 same_extra=("TORCHELASTIC_RUN_ID", "MASTER_ADDR", "OMP_NUM_THREADS"))

# ---- 2 nodes with c10d: node ranks by arrival in torchrun, so workers are matched by rank
port = free_port()
flags = [["--nnodes", "2", "--nproc-per-node", "1", "--node-rank", str(r), "--rdzv-backend", "c10d",
          "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "job8"] for r in (0, 1)]
names |= compare("c10d", flags, {}, same_extra=("TORCHELASTIC_RUN_ID",))

# ---- the table `tandem env` prints holds every one of them, and tandem's additions
out = subprocess.run([TANDEM, "env"], capture_output=True, text=True).stdout
listed = {line.split()[0] for line in out.splitlines() if line.strip()}
for k in sorted(names | {"NODE_RANK", "NUM_NODES"}):
    check(k in listed, f"`tandem env` does not list {k}")
print("torchrun's variables compared:", ", ".join(sorted(names)))
print("test_env_torchrun: ok")
