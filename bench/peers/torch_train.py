"""PyTorch peer for bench_train.sh: trains basicnet or mlp7 with AdamW (lr 1e-3) at batch 64 on
Fashion-MNIST (or random data when the dataset is absent) and prints one JSON line with
samples_per_s. Warm-up steps are not timed.

usage: torch_train.py --model basicnet|mlp7 --threads T [--steps N] [--warmup W] [--data DIR]"""
import argparse
import gzip
import json
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

from torch_models import build  # beside this script: sys.path[0]


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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="basicnet")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--data", default=os.environ.get("TANDEM_DATA"))
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    net = build(a.model)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    n = a.batch * 64
    x, y, source = load_images(a.data, n)
    net.train()
    nb = n // a.batch
    t0 = None
    for step in range(a.warmup + a.steps):
        if step == a.warmup:
            t0 = time.perf_counter()
        i = step % nb
        xb, yb = x[i * a.batch:(i + 1) * a.batch], y[i * a.batch:(i + 1) * a.batch]
        opt.zero_grad()
        loss = F.nll_loss(net(xb), yb)
        loss.backward()
        opt.step()
    dt = time.perf_counter() - t0
    print(json.dumps({"peer": "pytorch", "torch": torch.__version__, "model": a.model,
                      "threads": a.threads, "batch": a.batch, "steps": a.steps, "data": source,
                      "samples_per_s": round(a.steps * a.batch / dt, 1),
                      "final_loss": round(loss.item(), 4)}))


if __name__ == "__main__":
    main()
