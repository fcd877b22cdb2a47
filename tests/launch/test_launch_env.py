"""launch: the worker environment contract, per-rank output prefixes, whole lines only."""
import json
import os
import socket

from launchtest import PYTHON, check, check_eq, fail, launch, tmpdir, write_script

d = tmpdir()
dump = write_script(d, "dump.py", f"""#!{PYTHON}
import json, os, sys
keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
        "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
        "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID", "OMP_NUM_THREADS",
        "TANDEM_STORE_ADDR", "TANDEM_TOKEN", "TANDEM_RUN_ID", "TANDEM_RESTART_COUNT",
        "TANDEM_NODE_RANK", "TANDEM_NUM_THREADS", "TANDEM_METRICS", "INHERITED"]
env = {{k: os.environ.get(k) for k in keys}}
print("ENV " + json.dumps(env), flush=True)
# Many long lines on both streams, written in small pieces: the launcher must re-assemble them.
r = os.environ["RANK"]
for i in range(200):
    line = ("r" + r + "-" + str(i) + ":") + (r * 3000) + "\\n"
    for j in range(0, len(line), 700):
        sys.stdout.write(line[j:j + 700]); sys.stdout.flush()
    sys.stderr.write("e" + r + "-" + str(i) + "\\n"); sys.stderr.flush()
sys.stdout.write("tail-without-newline-" + r)
""")

metrics = os.path.join(d, "metrics")
logs = os.path.join(d, "logs")
rc, out, err, _ = launch(["--nproc-per-node", "3", "--rdzv-id", "envtest", "--metrics-dir", metrics,
                          "--log-dir", logs, "--", dump], env={"INHERITED": "yes",
                                                               "OMP_NUM_THREADS": ""})
check_eq(rc, 0, "launcher exit code (stderr: " + err[-2000:] + ")")

envs = {}
for line in out.splitlines():
    check(line.startswith("[rank "), f"stdout line without a rank prefix: {line[:80]!r}")
    prefix, _, rest = line.partition("] ")
    rank = int(prefix[len("[rank "):])
    if rest.startswith("ENV "):
        envs[rank] = json.loads(rest[4:])
    elif rest.startswith("r"):
        # A whole line of this rank: header then 3000 copies of the rank digit.
        head, _, body = rest.partition(":")
        check_eq(head.split("-")[0], "r" + str(rank), "line owner vs prefix")
        check_eq(body, str(rank) * 3000, f"rank {rank} line {head} body (interleaved or cut?)")
    else:
        check_eq(rest, f"tail-without-newline-{rank}", "last partial line")
for r in range(3):
    n = sum(1 for l in out.splitlines() if l.startswith(f"[rank {r}] r{r}-"))
    check_eq(n, 200, f"long lines of rank {r}")
    ne = sum(1 for l in err.splitlines() if l.startswith(f"[rank {r}] e{r}-"))
    check_eq(ne, 200, f"stderr lines of rank {r}")
check_eq(sorted(envs), [0, 1, 2], "ranks that printed their env")

cores = len(os.sched_getaffinity(0))
threads = str(max(1, cores // 3))
port = envs[0]["MASTER_PORT"]
for r in range(3):
    e = envs[r]
    want = {"RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "3", "LOCAL_WORLD_SIZE": "3",
            "GROUP_RANK": "0", "ROLE_RANK": str(r), "ROLE_WORLD_SIZE": "3",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "TORCHELASTIC_RESTART_COUNT": "0",
            "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_RUN_ID": "envtest",
            "OMP_NUM_THREADS": threads, "TANDEM_RUN_ID": "envtest", "TANDEM_RESTART_COUNT": "0",
            "TANDEM_NODE_RANK": "0", "TANDEM_NUM_THREADS": threads,
            "TANDEM_METRICS": os.path.join(metrics, f"rank-{r}.jsonl"), "INHERITED": "yes",
            "TANDEM_TOKEN": envs[0]["TANDEM_TOKEN"], "TANDEM_STORE_ADDR": envs[0]["TANDEM_STORE_ADDR"]}
    for k, v in want.items():
        check_eq(e[k], v, f"rank {r} {k}")
tok = envs[0]["TANDEM_TOKEN"]
check(tok and len(tok) >= 16, f"TANDEM_TOKEN should be a generated secret, got {tok!r}")
host, _, sport = envs[0]["TANDEM_STORE_ADDR"].rpartition(":")
check_eq(host, "127.0.0.1", "store host")
check(int(sport) > 0, "store port")

# MASTER_PORT is picked at run time (bind port 0), not a fixed default.
ports = {int(port)}
for _ in range(2):
    rc, out2, err2, _ = launch(["--nproc-per-node", "1", "--", dump])
    check_eq(rc, 0, "second run exit code")
    line = next(l for l in out2.splitlines() if "] ENV " in l)
    e = json.loads(line.partition("] ENV ")[2])
    ports.add(int(e["MASTER_PORT"]))
    check(e["TANDEM_TOKEN"] != tok, "each single-node run generates its own token")
check(29500 not in ports, f"MASTER_PORT should not be torchrun's fixed 29500: {ports}")
check(len(ports) >= 2, f"MASTER_PORT should vary between runs (picked free), got {ports}")
# and it was free: we can bind it now that the job is over
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(port)))
s.close()

# TANDEM_TOKEN from the environment is passed through unchanged.
rc, out3, _, _ = launch(["--", dump], env={"TANDEM_TOKEN": "sekrit-123"})
line = next(l for l in out3.splitlines() if "] ENV " in l)
check_eq(json.loads(line.partition("] ENV ")[2])["TANDEM_TOKEN"], "sekrit-123", "inherited token")

# --log-dir: raw lines (no prefix) per rank
with open(os.path.join(logs, "rank-1.log")) as f:
    log = f.read().splitlines()
check(any(l.startswith("ENV ") for l in log), "rank-1.log holds the ENV line unprefixed")
check_eq(sum(1 for l in log if l.startswith("r1-")), 200, "rank-1.log long lines")

# A shipped tandem's libraries (TANDEM_BUNDLE_LIB, set by its wrapper) are tandem's own: the
# workers' LD_LIBRARY_PATH loses that directory and keeps the rest (unset when nothing is left)
ldp = write_script(d, "ldp.py", f"""#!{PYTHON}
import os
print("LDP", repr(os.environ.get("LD_LIBRARY_PATH")), flush=True)
""")
bundle = os.path.join(d, "bundle-lib")
for given, want in [(f"{bundle}:/opt/x/lib:{bundle}", "/opt/x/lib"), (bundle, None),
                    ("/opt/y/lib", "/opt/y/lib")]:
    rc, out5, err5, _ = launch(["--nproc-per-node", "1", "--", ldp],
                               env={"LD_LIBRARY_PATH": given, "TANDEM_BUNDLE_LIB": bundle})
    check_eq(rc, 0, f"launch with LD_LIBRARY_PATH={given} (stderr: {err5[-500:]})")
    got = [l.partition("] LDP ")[2] for l in out5.splitlines() if "] LDP " in l]
    check_eq(got, [repr(want)], f"the worker's LD_LIBRARY_PATH from {given}")

# usage errors exit 2
rc, _, err4, _ = launch(["--nproc-per-node", "0", "--", "true"])
check_eq(rc, 2, "exit code for --nproc-per-node 0")
rc, _, err4, _ = launch(["--", "no-such-command-xyz"])
check_eq(rc, 2, "exit code for a missing command")
check("no-such-command-xyz" in err4, f"missing command named in: {err4!r}")
print("test_launch_env: ok")
