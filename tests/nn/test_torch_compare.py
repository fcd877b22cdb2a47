"""Compares tandem's basicnet and mlp7 with torch.nn on the same weights and inputs: forward
output, NLL loss and every parameter gradient (dropout off; backward still computed), within
float32 tolerance. The tandem side is tests/nn/nn_dump.c, found via TANDEM_BUILD_DIR."""
import os
import subprocess
import sys
import tempfile

# the torch twins of the presets live beside the benchmark peers, which use them too
SOURCE_DIR = os.environ.get("TANDEM_SOURCE_DIR") or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(SOURCE_DIR, "bench", "peers"))
try:
    import numpy as np
    import torch
    import torch.nn.functional as F
    from torch_models import MLP7, BasicNet
except ImportError as e:  # the test machine is meant to have Debian's python3-torch
    print(f"SKIP: torch/numpy not importable ({e}); install python3-torch python3-numpy")
    sys.exit(77)


def compare(name, got, ref, rtol):
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    scale = max(np.abs(ref).max(), 1e-12)
    err = np.abs(got - ref).max() / scale
    status = "ok" if err <= rtol else "FAIL"
    print(f"  {name:14s} max|diff|/max|ref| = {err:.3e} (tol {rtol:.0e}) {status}")
    return err <= rtol


class NoDevice(Exception):
    pass


def run(model_name, net, batch, build_dir, device="cpu"):
    helper = os.path.join(build_dir, "tests", "nn", "nn_dump")
    with tempfile.TemporaryDirectory() as d:
        p = subprocess.run([helper, model_name, "5", str(batch), d, "2", device],
                           stdout=subprocess.PIPE, text=True)
        print(p.stdout, end="")
        if p.returncode == 77:
            raise NoDevice(p.stdout.strip())
        p.check_returncode()
        load = lambda f, t: np.fromfile(os.path.join(d, f), dtype=t)
        params, grads = load("params.bin", np.float32), load("grads.bin", np.float32)
        x, labels = load("x.bin", np.float32), load("labels.bin", np.int32)
        out, loss = load("out.bin", np.float32), load("loss.bin", np.float64)[0]
    names = [n for n, _ in net.named_parameters()]
    total = sum(p.numel() for p in net.parameters())
    ok = total == params.size
    print(f"{model_name}: {total} torch parameters, {params.size} tandem parameters")
    off = 0
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.from_numpy(params[off:off + p.numel()].reshape(p.shape)))
            off += p.numel()
    net.eval()  # dropout off, as in nn_dump
    xt = torch.from_numpy(x.reshape(batch, 1, 28, 28))
    yt = torch.from_numpy(labels.astype(np.int64))
    logp = net(xt)
    ref_loss = F.nll_loss(logp, yt)
    ref_loss.backward()
    ok &= compare("output", out, logp.detach().numpy().ravel(), 1e-5)
    ok &= compare("loss", [loss], [ref_loss.item()], 1e-5)
    off = 0
    for n, p in zip(names, net.parameters()):
        ok &= compare(n + ".grad", grads[off:off + p.numel()], p.grad.numpy().ravel(), 1e-4)
        off += p.numel()
    return ok


def main(device="cpu"):
    """device: which tandem engine to compare (cuda: tests/gpu/test_gpu_torch.py)."""
    build_dir = os.environ.get("TANDEM_BUILD_DIR")
    if not build_dir:
        print("TANDEM_BUILD_DIR is not set (run through ctest)")
        return 1
    torch.set_num_threads(1)
    try:
        ok = run("basicnet", BasicNet(), 18, build_dir, device)  # 18: a partial last chunk
        ok &= run("mlp7", MLP7(), 32, build_dir, device)
    except NoDevice as e:
        print(e)
        return 77
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
