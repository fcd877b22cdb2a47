"""train: the `tandem train` command end to end on Fashion-MNIST (basicnet, small batches).

(1) 50 steps uninterrupted == 25 steps + checkpoint + --resume to 50, bit for bit (dropout on);
(2) a corrupted newest checkpoint: with an older valid one, a warning and resume from it (same
    bits); with none, a refusal naming the file; (3) --batch 16 --accum 2 is reproducible and close
    to --batch 32; (4) SIGTERM mid-run (sent twice in a burst) exits 143 with a checkpoint, and --resume
    finishes with the uninterrupted run's weights; (6) usage errors exit 2 naming the flag."""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

TANDEM = os.environ.get("TANDEM_BIN", "build/tandem")
DATA = os.environ.get("TANDEM_DATA", "/usr/share/datasets/fashion-mnist")
COMMON = ["--model", "basicnet", "--data", DATA, "--seed", "7", "--no-progress", "--json",
          "--threads", "1"]


def fail(msg):
    sys.exit("FAIL: " + msg)


def train(*args, expect=0):
    p = subprocess.run([TANDEM, "train", *COMMON, *args], capture_output=True, text=True)
    if p.returncode != expect:
        fail(f"tandem train {' '.join(args)} exited {p.returncode}, expected {expect}\n"
             f"stderr:\n{p.stderr}")
    lines = p.stdout.strip().splitlines()
    result = json.loads(lines[-1]) if lines and expect in (0, 143, 130) else None
    return result, p.stderr


def read(path):
    with open(path, "rb") as f:
        return f.read()


def weights(path):
    """The flat float32 data section of a safetensors file."""
    raw = read(path)
    n = int.from_bytes(raw[:8], "little")
    return np.frombuffer(raw[8 + n:], dtype=np.float32)


def same_file(a, b, what):
    if read(a) != read(b):
        wa, wb = weights(a), weights(b)
        diff = np.nonzero(wa != wb)[0] if wa.shape == wb.shape else []
        fail(f"{what}: {a} and {b} differ ({len(diff)} floats differ, "
             f"max abs diff {np.max(np.abs(wa - wb)) if len(diff) else 'n/a'})")


def ckpts(d):
    return sorted(f for f in os.listdir(d) if f.endswith(".tdck"))


def main():
    if not os.path.isdir(DATA):
        print(f"SKIP: Fashion-MNIST not installed at {DATA} (apt-get install "
              "dataset-fashion-mnist)")
        sys.exit(77)
    tmp = tempfile.mkdtemp(prefix="td_train_cli_")
    full = os.path.join(tmp, "full.safetensors")
    t0 = time.time()

    # (1) uninterrupted vs checkpoint + resume
    r, _ = train("--steps", "50", "--batch", "16", "--save", full)
    assert r["steps"] == 50 and r["world_size"] == 1 and r["global_batch"] == 16, r
    for key in ("samples_per_s", "final_loss", "test_acc", "wall_s", "params"):
        if key not in r:
            fail(f"--json output lacks {key}: {r}")
    if not 0 < r["test_acc"] <= 100:
        fail(f"test_acc {r['test_acc']} is not a percentage")
    ck = os.path.join(tmp, "ck")
    r1, _ = train("--steps", "25", "--batch", "16", "--checkpoint-dir", ck)
    if ckpts(ck) != ["ckpt-25.tdck"]:
        fail(f"after 25 steps expected ckpt-25.tdck, found {ckpts(ck)}")
    resumed = os.path.join(tmp, "resumed.safetensors")
    r2, err = train("--steps", "50", "--batch", "16", "--checkpoint-dir", ck, "--resume",
                    "--save", resumed)
    if "resuming from" not in err or r2["start_step"] != 25 or r2["steps"] != 50:
        fail(f"resume did not start at step 25: {r2}\n{err}")
    same_file(full, resumed, "50 steps vs 25 + resume")
    if abs(r2["final_loss"] - r["final_loss"]) != 0:
        fail(f"final loss differs: {r2['final_loss']} vs {r['final_loss']}")
    print(f"(1) resume bitwise equal ({time.time() - t0:.1f}s)")

    # (2) corruption: ck now holds ckpt-25 and ckpt-50; flip a byte of ckpt-50
    if ckpts(ck) != ["ckpt-25.tdck", "ckpt-50.tdck"]:
        fail(f"expected the last 2 checkpoints, found {ckpts(ck)}")
    p50 = os.path.join(ck, "ckpt-50.tdck")
    raw = bytearray(read(p50))
    raw[len(raw) // 2] ^= 0x01
    with open(p50, "wb") as f:
        f.write(raw)
    again = os.path.join(tmp, "again.safetensors")
    r3, err = train("--steps", "50", "--batch", "16", "--checkpoint-dir", ck, "--resume",
                    "--save", again)
    if "ckpt-50.tdck is corrupt: checksum 0x" not in err or "ckpt-25.tdck" not in err:
        fail(f"no warning naming the corrupt checkpoint and the fallback:\n{err}")
    if r3["start_step"] != 25:
        fail(f"expected the fallback to resume at 25, got {r3['start_step']}")
    same_file(full, again, "resume from the older checkpoint")
    # now only corrupt ones: refuse
    ck2 = os.path.join(tmp, "ck2")
    os.makedirs(ck2)
    with open(os.path.join(ck2, "ckpt-25.tdck"), "wb") as f:
        raw25 = bytearray(read(os.path.join(ck, "ckpt-25.tdck")))
        raw25[100] ^= 0x80
        f.write(raw25)
    _, err = train("--steps", "50", "--batch", "16", "--checkpoint-dir", ck2, "--resume",
                   expect=1)
    if "ckpt-25.tdck is corrupt: checksum 0x" not in err or "delete it" not in err:
        fail(f"corrupt checkpoint not refused with a clear message:\n{err}")
    # and a mismatched config is refused, naming the setting
    _, err = train("--steps", "50", "--batch", "32", "--checkpoint-dir", ck, "--resume",
                   expect=1)
    if "--batch 16" not in err or "--batch 32" not in err:
        fail(f"batch mismatch not explained:\n{err}")
    print(f"(2) corrupt checkpoints handled ({time.time() - t0:.1f}s)")

    # (3) accumulation: reproducible, and close to the single big batch
    a1, a2, b32 = (os.path.join(tmp, n) for n in ("a1.st", "a2.st", "b32.st"))
    ra, _ = train("--steps", "20", "--batch", "16", "--accum", "2", "--save", a1)
    train("--steps", "20", "--batch", "16", "--accum", "2", "--save", a2)
    rb, _ = train("--steps", "20", "--batch", "32", "--save", b32)
    same_file(a1, a2, "--accum 2 run twice")
    if ra["global_batch"] != 32:
        fail(f"global batch {ra['global_batch']} != 32")
    wa, wb = weights(a1), weights(b32)
    rel = np.max(np.abs(wa - wb)) / np.max(np.abs(wb))
    print(f"(3) accum 2x16 vs 32: loss {ra['final_loss']:.6f} vs {rb['final_loss']:.6f}, "
          f"max weight diff {rel:.2e} of the largest weight")
    if abs(ra["final_loss"] - rb["final_loss"]) > 1e-3 * abs(rb["final_loss"]) + 1e-4:
        fail(f"accumulated loss {ra['final_loss']} far from big-batch loss {rb['final_loss']}")
    if rel > 1e-3:
        fail(f"accumulated weights differ from big-batch weights by {rel:.3g} (relative)")

    # (4) SIGTERM: exit 143 with a checkpoint, then resume to the uninterrupted result
    ref = os.path.join(tmp, "ref.safetensors")
    train("--steps", "120", "--batch", "8", "--save", ref)
    ck3 = os.path.join(tmp, "ck3")
    p = subprocess.Popen([TANDEM, "train", *COMMON, "--steps", "120", "--batch", "8",
                          "--checkpoint-dir", ck3, "--log-every", "1"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in p.stderr:  # wait for real progress, then interrupt
        if "step 5/120" in line:
            # twice, as one request often arrives (a launcher signalling the worker's group
            # and the worker, timeout(1), srun): a burst is one stop, not "stop now"
            p.send_signal(signal.SIGTERM)
            time.sleep(0.02)
            p.send_signal(signal.SIGTERM)
            break
    out, err = p.communicate(timeout=120)
    if p.returncode != 143:
        fail(f"SIGTERM run exited {p.returncode}, expected 143\n{err}")
    if "stopped by SIGTERM" not in err:
        fail(f"no stop message:\n{err}")
    stopped = json.loads(out.strip().splitlines()[-1])
    names = ckpts(ck3)
    if len(names) != 1 or not 5 <= stopped["steps"] < 120 or \
            names[0] != f"ckpt-{stopped['steps']}.tdck":
        fail(f"expected one checkpoint at the stop step {stopped['steps']}: {names}")
    fin = os.path.join(tmp, "fin.safetensors")
    r4, _ = train("--steps", "120", "--batch", "8", "--checkpoint-dir", ck3, "--resume",
                  "--save", fin)
    same_file(ref, fin, f"SIGTERM at step {stopped['steps']} + resume vs uninterrupted")
    print(f"(4) SIGTERM at step {stopped['steps']} -> 143, resume bitwise equal "
          f"({time.time() - t0:.1f}s)")

    # (6) usage errors: exit 2 and name the flag
    for args, needle in ((["--batch", "0"], "--batch"), (["--lr", "abc"], "--lr"),
                         (["--epochs", "1", "--steps", "5"], "--steps"),
                         (["--optimizer", "adam"], "--optimizer"), (["--frobnicate"], "--frobnicate"),
                         (["--resume"], "--checkpoint-dir"), (["--accum"], "--accum"),
                         (["--momentum", "0.9"], "--momentum"),
                         (["--precision", "fp16"], "--precision"),
                         (["--precision", "bf16"], "--device cuda")):
        p = subprocess.run([TANDEM, "train", *args], capture_output=True, text=True)
        if p.returncode != 2 or needle not in p.stderr:
            fail(f"tandem train {' '.join(args)}: exit {p.returncode}, stderr {p.stderr!r}; "
                 f"expected exit 2 naming {needle}")
    p = subprocess.run([TANDEM, "train", "--data", os.path.join(tmp, "nothing"), "--steps", "1"],
                       capture_output=True, text=True)
    if p.returncode != 1 or "train-images-idx3-ubyte" not in p.stderr:
        fail(f"missing dataset: exit {p.returncode}, {p.stderr!r}")
    print(f"(6) usage errors ok ({time.time() - t0:.1f}s)")
    subprocess.run(["rm", "-rf", tmp])
    print("test_train_cli: ok")


if __name__ == "__main__":
    main()
