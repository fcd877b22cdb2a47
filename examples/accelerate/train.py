#!/usr/bin/env python3
"""An Accelerate script tracked by tandem: the tracker and the SDK's checkpoints.

    tandem run --nproc-per-node 2 --max-restarts 1 -- python examples/accelerate/train.py

A small CNN on Fashion-MNIST (Debian's dataset-fashion-mnist, or --data DIR); Accelerate runs
DDP over gloo on CPUs. accelerator.log goes to the run's metrics through TandemTracker; the
model and optimizer are saved with tandem.checkpoint every --checkpoint-every steps and loaded
after a restart, which also tells the store where the earlier attempt's points stop counting.
"""
import argparse
import gzip
import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

import tandem
from tandem.accelerate import TandemTracker


def load_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, np.uint8, offset=4 + 4 * ndim).reshape(shape)


def fashion_mnist(root, split, limit):
    x = load_idx(os.path.join(root, f"{split}-images-idx3-ubyte.gz"))[:limit]
    y = load_idx(os.path.join(root, f"{split}-labels-idx1-ubyte.gz"))[:limit]
    x = (torch.from_numpy(x.astype(np.float32)) / 255.0 - 0.2860) / 0.3530
    return TensorDataset(x.unsqueeze(1), torch.from_numpy(y.astype(np.int64)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=os.environ.get("TANDEM_DATA",
                                                     "/usr/share/datasets/fashion-mnist"))
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--train-samples", type=int, default=60000)
    ap.add_argument("--checkpoint-every", type=int, default=25)
    args = ap.parse_args()

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    accelerator = Accelerator(cpu=True, log_with=TandemTracker())
    tandem.init()  # every rank (Accelerate calls a tracker on rank 0 only): the checkpoints need it
    accelerator.init_trackers("fashion-mnist", config=vars(args))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                          nn.Linear(16 * 12 * 12, 10))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    train = fashion_mnist(args.data, "train", args.train_samples)
    test = fashion_mnist(args.data, "t10k", 2000)
    # a fixed order that depends on the step only, so a resume sees the batches it would have
    gen = torch.Generator().manual_seed(0)
    loader = DataLoader(train, batch_size=args.batch, shuffle=True, generator=gen,
                        drop_last=True)
    model, opt, loader = accelerator.prepare(model, opt, loader)

    state, start = tandem.checkpoint.load_latest()  # (None, 0) unless this attempt resumes
    if state is not None:
        accelerator.unwrap_model(model).load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        accelerator.print(f"resumed from the checkpoint of step {start}")

    step = start
    while step < args.steps:
        for x, y in loader:
            step += 1
            if step <= start:
                continue  # the batches before the checkpoint were trained before
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            accelerator.backward(loss)
            opt.step()
            mean = accelerator.reduce(loss.detach(), reduction="mean")
            accelerator.log({"train/loss": mean.item()}, step=step)
            stop = tandem.should_stop()
            if step % args.checkpoint_every == 0 or step == args.steps or stop:
                tandem.checkpoint.save({"model": accelerator.unwrap_model(model).state_dict(),
                                        "opt": opt.state_dict()}, step)
            if stop:
                sys.exit(tandem.STOPPED)
            if step == args.steps:
                break

    model.eval()
    with torch.no_grad():
        x, y = test.tensors
        acc = (accelerator.unwrap_model(model)(x).argmax(1) == y).float().mean().item()
    accelerator.log({"test/acc": acc}, step=step)
    tandem.summary["test_acc"] = acc
    accelerator.end_training()


if __name__ == "__main__":
    main()
