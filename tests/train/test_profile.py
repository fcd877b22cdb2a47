"""train: `tandem train --profile`, where a step's time goes, on BasicNet (Fashion-MNIST).

(1) One row per layer of the model, in order, then loss, optimizer, data and gradient wait; the
    steps after the first 10. (2) Each conv and linear row's FLOPs are those of a direct conv /
    matmul over the batch, counted here from the layer shapes (forward, weight gradient, input
    gradient but the first layer's). (3) conv2, BasicNet's 32 -> 64 channel 3x3 conv over 26x26
    (most of its FLOPs), takes the most time forward and backward (at 1 thread). (4) The rows are the step's own time: at 1 thread
    their sum lies within the steps' wall time (an evaluation's forwards, 10,000 test images
    here, are not counted: they would dwarf 30 training steps of 32), at 2 threads within twice
    it. (5) Profiling does not change the bits: the same weights with and without it. (6) Fewer
    than 11 steps: a warning, no profile; --device cuda: a usage error naming the flag."""
import json
import os
import subprocess
import sys
import tempfile

TANDEM = os.environ.get("TANDEM_BIN", "build/tandem")
DATA = os.environ.get("TANDEM_DATA", "/usr/share/datasets/fashion-mnist")
BATCH = 32
COMMON = ["--model", "basicnet", "--data", DATA, "--seed", "3", "--no-progress", "--json",
          "--batch", str(BATCH)]
LAYERS = ["conv1", "relu1", "conv2", "relu2", "pool1", "dropout1", "flatten1", "fc1", "relu3",
          "dropout2", "fc2", "log_softmax1"]
PHASES = ["loss", "optimizer", "data", "gradient wait"]


def fail(msg):
    sys.exit("FAIL: " + msg)


def train(*args, expect=0):
    p = subprocess.run([TANDEM, "train", *COMMON, *args], capture_output=True, text=True)
    if p.returncode != expect:
        fail(f"tandem train {' '.join(args)} exited {p.returncode}, expected {expect}\n"
             f"stderr:\n{p.stderr}")
    lines = p.stdout.strip().splitlines()
    return (json.loads(lines[-1]) if expect == 0 else None), p.stderr


if not os.path.exists(os.path.join(DATA, "train-images-idx3-ubyte.gz")):
    print(f"SKIP: Fashion-MNIST not found in {DATA}")
    sys.exit(77)

# FLOPs per sample of a direct conv / matmul: 2 x multiply-adds.
conv1 = 2 * 1 * 32 * 3 * 3 * 26 * 26
conv2 = 2 * 32 * 64 * 3 * 3 * 24 * 24
fc1 = 2 * 9216 * 128
fc2 = 2 * 128 * 10
want_flops = {"conv1": 2 * conv1,  # forward, weight gradient (no input gradient: the first)
              "conv2": 3 * conv2, "fc1": 3 * fc1, "fc2": 3 * fc2}

with tempfile.TemporaryDirectory() as d:
    for threads in (1, 2):
        res, err = train("--steps", "40", "--threads", str(threads), "--profile",
                         "--save", os.path.join(d, f"p{threads}.st"))
        prof = res.get("profile")
        if not prof:
            fail(f"--profile --json has no profile: {res}")
        if prof["steps"] != 30 or prof["threads"] != threads:
            fail(f"profile of steps {prof['steps']} at {prof['threads']} threads, expected 30 at "
                 f"{threads}")
        rows = prof["rows"]
        names = [r["name"] for r in rows]
        if names != LAYERS + PHASES:
            fail(f"profile rows {names}, expected the model's layers then {PHASES}")
        for name, f in want_flops.items():
            got = next(r for r in rows if r["name"] == name)["flops"]
            if abs(got - BATCH * f) > 1e-6 * BATCH * f:
                fail(f"{name}: {got:.0f} FLOPs per step, expected {BATCH * f}")
        total = {r["name"]: r["fwd_ms"] + r["bwd_ms"] for r in rows}
        if min(total.values()) < 0:
            fail(f"a negative time: {rows}")
        # At 1 thread each row is the time its layer's work took; at 2 a linear layer counts its
        # wall time twice, and on a loaded machine a descheduled partner makes that anything.
        for part in ("fwd_ms", "bwd_ms") if threads == 1 else ():
            top = max(rows, key=lambda r: r[part])["name"]
            if top != "conv2":
                fail(f"conv2 is not the costliest {part} (it is {top}): {rows}")
        rows_ms = sum(total.values())
        step_ms = prof["step_ms"]
        if not (0.5 * step_ms < rows_ms <= 1.02 * threads * step_ms):
            fail(f"at {threads} thread(s) the rows add up to {rows_ms:.2f} ms of a {step_ms:.2f} "
                 f"ms step: not the step's own time")
        if "conv + linear" not in err or "profile: 30 steps after the first 10" not in err:
            fail(f"no profile table on stderr: {err[-2000:]}")
        print(f"{threads} thread(s): rows {rows_ms:.2f} ms of a {step_ms:.2f} ms step; conv2 "
              f"{total['conv2']:.2f} ms")

    res, _ = train("--steps", "40", "--threads", "1", "--save", os.path.join(d, "plain.st"))
    if "profile" in res:
        fail("a run without --profile reports a profile")
    with open(os.path.join(d, "p1.st"), "rb") as a, open(os.path.join(d, "plain.st"), "rb") as b:
        if a.read() != b.read():
            fail("--profile changed the weights")

    res, err = train("--steps", "8", "--threads", "1", "--profile")
    if "profile" in res or "--profile: no step after the first 10 ran" not in err:
        fail(f"8 steps with --profile: {res.get('profile')}, stderr {err[-500:]}")

    _, err = train("--steps", "20", "--profile", "--device", "cuda", expect=2)
    if "--profile times the CPU engine's layers" not in err:
        fail(f"--profile --device cuda: {err}")
print("test_profile: ok")
