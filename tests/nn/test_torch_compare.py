"""Compares tandem's basicnet and mlp7 with torch.nn on the same weights and inputs: forward
output, NLL loss and every parameter gradient (dropout off; backward still computed), within
float32 tolerance. The tandem side is tests/nn/nn_dump.c, found via TANDEM_BUILD_DIR."""
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError as e:  # the test machine is meant to have Debian's python3-torch
    print(f"SKIP: torch/numpy not importable ({e}); install python3-torch python3-numpy")
    sys.exit(77)


class BasicNet(nn.Module):
    """PyTorch's examples/mnist Net."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = self.dropout2(x)
        return F.log_softmax(self.fc2(x), dim=1)


class MLP7(nn.Module):
    def __init__(self):
        super().__init__()
        widths = [784, 1024, 1024, 1024, 512, 512, 256, 10]
        for i in range(7):
            setattr(self, f"fc{i + 1}", nn.Linear(widths[i], widths[i + 1]))

    def forward(self, x):
        x = torch.flatten(x, 1)
        for i in range(1, 8):
            x = getattr(self, f"fc{i}")(x)
            if i < 7:
                x = F.relu(x)
        return F.log_softmax(x, dim=1)


def compare(name, got, ref, rtol):
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    scale = max(np.abs(ref).max(), 1e-12)
    err = np.abs(got - ref).max() / scale
    status = "ok" if err <= rtol else "FAIL"
    print(f"  {name:14s} max|diff|/max|ref| = {err:.3e} (tol {rtol:.0e}) {status}")
    return err <= rtol


def run(model_name, net, batch, build_dir):
    helper = os.path.join(build_dir, "tests", "nn", "nn_dump")
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([helper, model_name, "5", str(batch), d, "2"], check=True)
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


def main():
    build_dir = os.environ.get("TANDEM_BUILD_DIR")
    if not build_dir:
        print("TANDEM_BUILD_DIR is not set (run through ctest)")
        return 1
    torch.set_num_threads(1)
    ok = run("basicnet", BasicNet(), 18, build_dir)  # 18: a partial last chunk
    ok &= run("mlp7", MLP7(), 32, build_dir)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
