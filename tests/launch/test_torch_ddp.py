"""launch: an unchanged PyTorch DDP script (gloo, env:// rendezvous) trains under
`tandem launch --standalone --nproc-per-node 2`: both replicas end bitwise equal and the loss
goes down."""
import os

from launchtest import PYTHON, SOURCE, check, check_eq, launch, tmpdir

try:
    import torch
except ImportError:
    print("SKIP: torch is not importable by " + PYTHON)
    raise SystemExit(77)

d = tmpdir()
script = os.path.join(SOURCE, "examples", "torch_ddp", "train_ddp.py")
rc, out, err, secs = launch(["--standalone", "--nproc-per-node", "2", "--", PYTHON, script,
                             "--out", d], timeout=240)
check_eq(rc, 0, f"launcher exit code (stderr: {err[-3000:]!r})")
print(f"torch ddp run: {secs:.1f} s")
check("[rank 0] step   0 loss" in out, f"rank 0's loss lines missing: {out!r}")

p0 = torch.load(os.path.join(d, "params-rank0.pt"))
p1 = torch.load(os.path.join(d, "params-rank1.pt"))
check_eq(len(p0), len(p1), "parameter tensors per rank")
for i, (a, b) in enumerate(zip(p0, p1)):
    check(torch.equal(a, b), f"param {i} differs between ranks: max |diff| "
          f"{(a - b).abs().max().item()}")
check(os.path.exists(os.path.join(d, "final.pt")), "rank 0 saved final.pt")

with open(os.path.join(d, "loss-rank0.txt")) as f:
    losses = [float(v) for v in f.read().split()]
first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
print(f"loss: first 5 steps {first:.4f}, last 5 steps {last:.4f}")
check(last < 0.5 * first, f"loss did not go down: first {first:.4f} last {last:.4f}")
print("test_torch_ddp: ok")
