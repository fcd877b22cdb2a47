"""PyTorch peer for bench_train.sh: trains the twin of a tandem preset (bench/peers/torch_models.py)
or of a YAML spec (torch_spec.py) with AdamW (lr 1e-3, torch's defaults otherwise, weight decay
0.01 as tandem's) at batch 64 and prints one JSON line with samples_per_s and the model's FLOPs
per sample counted here, from the modules (an independent count of what `tandem train --json`
reports). Warm-up steps are not timed.

Data, the same files tandem reads:
  --data DIR            Fashion-MNIST IDX files (random images when absent): basicnet, mlp7
  --npy X.npy,Y.npy     uint8 images [n, C, H, W] (/255, then each channel's mean and std over
                        the set, as tandem computes them) and int64 labels: resnet-small
  --csv FILE            a header row, features, the target class last (each feature
                        standardised over the set, as tandem does): mlp

usage: torch_train.py --model NAME|SPEC.yaml --threads T [--steps N] [--warmup W] [--batch B]
                      [--data DIR | --npy X,Y | --csv FILE]"""
import argparse
import gzip
import json
import os
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from torch_models import build, is_spec  # beside this script: sys.path[0]


def load_images(data_dir, n):
    path = os.path.join(data_dir or "", "train-images-idx3-ubyte.gz")
    lpath = os.path.join(data_dir or "", "train-labels-idx1-ubyte.gz")
    if not data_dir or not os.path.exists(path):
        g = torch.Generator().manual_seed(0)
        return torch.rand(n, 1, 28, 28, generator=g), torch.randint(0, 10, (n,), generator=g), "random"
    with gzip.open(path) as f:
        x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)[:n]
    with gzip.open(lpath) as f:
        y = np.frombuffer(f.read(), np.uint8, offset=8)[:n]
    x = (torch.from_numpy(x.astype(np.float32)) / 255.0 - 0.2860) / 0.3530
    return x, torch.from_numpy(y.astype(np.int64)), "fashion-mnist"


def load_npy(pair):
    xp, yp = pair.split(",")
    x = np.load(xp).astype(np.float32) / 255.0
    mean = x.mean(axis=(0, 2, 3), keepdims=True)
    std = x.std(axis=(0, 2, 3), keepdims=True)
    x = (x - mean) / std
    return torch.from_numpy(x), torch.from_numpy(np.load(yp).astype(np.int64)), os.path.basename(xp)


def load_csv(path):
    d = np.loadtxt(path, delimiter=",", skiprows=1, dtype=np.float64)
    x, y = d[:, :-1], d[:, -1].astype(np.int64)
    std = x.std(axis=0)
    x = (x - x.mean(axis=0)) / np.where(std > 0, std, 1.0)
    return torch.from_numpy(x.astype(np.float32)), torch.from_numpy(y), os.path.basename(path)


def flops_per_sample(net, x1):
    """Forward multiply-adds x2 of every Conv2d and Linear on one sample, then the backward as
    tandem counts it: a weight gradient for each, an input gradient for all but the first."""
    fwd = []

    def hook(mod, inp, out):
        if isinstance(mod, nn.Conv2d):
            k = mod.kernel_size[0] * mod.kernel_size[1] * mod.in_channels // mod.groups
            fwd.append(2.0 * k * out[0].numel())
        else:
            fwd.append(2.0 * mod.in_features * mod.out_features)

    hs = [m.register_forward_hook(hook) for m in net.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    with torch.no_grad():
        net.eval()
        net(x1)
    for h in hs:
        h.remove()
    return sum(fwd) * 3 - fwd[0] if fwd else 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="basicnet")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--data", default=os.environ.get("TANDEM_DATA"))
    ap.add_argument("--npy")
    ap.add_argument("--csv")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    if a.npy:
        x, y, source = load_npy(a.npy)
    elif a.csv:
        x, y, source = load_csv(a.csv)
    else:
        x, y, source = load_images(a.data, a.batch * 64)
    outputs = int(y.max()) + 1
    net = build(a.model, tuple(x.shape[1:]), outputs)
    flops = flops_per_sample(net, x[:1])
    # basicnet and mlp7 end in log_softmax (nll_loss); mlp and resnet-small give logits; a spec
    # says which by its last layer, as it does to tandem (docs/model-spec.md, "Losses")
    last = net.prog[-1] if is_spec(a.model) else None
    log_probs = a.model in ("basicnet", "mlp7") or (
        last is not None and last[0] == "layer" and isinstance(last[1], nn.LogSoftmax))
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3, weight_decay=0.01)
    net.train()
    nb = len(x) // a.batch
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    t0 = None
    for step in range(a.warmup + a.steps):
        if step == a.warmup:
            t0 = time.perf_counter()
        i = step % nb
        idx = perm[i * a.batch:(i + 1) * a.batch]
        xb, yb = x[idx], y[idx]
        opt.zero_grad()
        out = net(xb)
        loss = F.nll_loss(out, yb) if log_probs else F.cross_entropy(out, yb)
        loss.backward()
        opt.step()
    dt = time.perf_counter() - t0
    print(json.dumps({"peer": "pytorch", "torch": torch.__version__, "model": a.model,
                      "threads": a.threads, "batch": a.batch, "steps": a.steps, "data": source,
                      "samples_per_s": round(a.steps * a.batch / dt, 1),
                      "flops_per_sample": flops, "final_loss": round(loss.item(), 4)}))


if __name__ == "__main__":
    main()
