"""PyTorch DDP peer for bench_ddp.sh: BasicNet (the PyTorch MNIST example net) on Fashion-MNIST,
AdamW lr 1e-3, batch B per rank, gloo, DistributedSampler, torch.set_num_threads(T).

Run it under `tandem launch --standalone --nproc-per-node K -- python3 torch_ddp_train.py ...`
(env:// rendezvous from RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT); without WORLD_SIZE it trains
in one process without DDP. Rank 0 prints one JSON line.

  --steps N [--warmup W]  throughput: W untimed steps, then N timed steps -> samples_per_s
                          (global samples per second)
  --epochs E              time to accuracy: E epochs, test accuracy (all 10000 test images,
                          sharded over ranks) after each; evals = [{step, wall_s, test_acc}],
                          wall_s counted from after the process group is up (data loading
                          included), as tandem's --json counts it
  --loader slice|dataloader  slice (default): each batch is one index into the data tensors,
                          the fastest way to feed this model; dataloader: the idiomatic
                          DataLoader(TensorDataset, sampler=DistributedSampler, batch_size=B)
                          with num_workers=0 (per-sample indexing and collate)
"""
import argparse
import gzip
import json
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data.distributed import DistributedSampler

from torch_models import BasicNet  # beside this script: sys.path[0]


def load(data_dir, split):
    with gzip.open(os.path.join(data_dir, f"{split}-images-idx3-ubyte.gz")) as f:
        x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)
    with gzip.open(os.path.join(data_dir, f"{split}-labels-idx1-ubyte.gz")) as f:
        y = np.frombuffer(f.read(), np.uint8, offset=8)
    # the same normalisation as tandem's data layer
    x = (torch.from_numpy(x.astype(np.float32)) / 255.0 - 0.2860) / 0.3530
    return x, torch.from_numpy(y.astype(np.int64))


class Indices(torch.utils.data.Dataset):
    """Only the sampler's length matters: batches are sliced from the tensors directly."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=os.environ.get("TANDEM_DATA",
                                                     "/usr/share/datasets/fashion-mnist"))
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=0)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--loader", choices=("slice", "dataloader"), default="slice")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1:
        dist.init_process_group("gloo")
    t0 = time.perf_counter()

    torch.manual_seed(a.seed)  # the same initial weights on every rank (DDP broadcasts anyway)
    net = BasicNet()
    model = DDP(net) if world > 1 else net
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = load(a.data, "train")
    sampler = DistributedSampler(Indices(len(x)), num_replicas=world, rank=rank, shuffle=True,
                                 seed=a.seed)

    def evaluate():
        xt, yt = test
        lo, hi = len(xt) * rank // world, len(xt) * (rank + 1) // world
        model.eval()
        with torch.no_grad():
            correct = sum(int((net(xt[i:min(i + 500, hi)]).argmax(1) ==
                               yt[i:min(i + 500, hi)]).sum()) for i in range(lo, hi, 500))
        model.train()
        c = torch.tensor([correct, hi - lo], dtype=torch.float64)
        if world > 1:
            dist.all_reduce(c)
        return 100.0 * float(c[0]) / float(c[1])

    loader = None
    if a.loader == "dataloader":
        dsampler = DistributedSampler(torch.utils.data.TensorDataset(x, y), num_replicas=world,
                                      rank=rank, shuffle=True, seed=a.seed)
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y),
                                             batch_size=a.batch, sampler=dsampler, num_workers=0)

    def batches(epoch):
        if loader is not None:
            loader.sampler.set_epoch(epoch)
            yield from loader
            return
        sampler.set_epoch(epoch)
        idx = torch.tensor(list(iter(sampler)))
        for i in range(0, len(idx), a.batch):
            b = idx[i:i + a.batch]
            yield x[b], y[b]

    def train_step(xb, yb):
        opt.zero_grad()
        loss = F.nll_loss(model(xb), yb)
        loss.backward()
        opt.step()
        return loss

    model.train()
    out = {"peer": "pytorch-ddp", "torch": torch.__version__, "backend": "gloo" if world > 1
           else "none", "world_size": world, "threads": a.threads, "batch": a.batch,
           "loader": a.loader}
    if a.epochs:
        test = load(a.data, "t10k")
        evals, step = [], 0
        for epoch in range(a.epochs):
            for xb, yb in batches(epoch):
                loss = train_step(xb, yb)
                step += 1
            acc = evaluate()
            evals.append({"step": step, "wall_s": round(time.perf_counter() - t0, 3),
                          "test_acc": round(acc, 3)})
        out.update(epochs=a.epochs, steps=step, evals=evals, test_acc=evals[-1]["test_acc"],
                   final_loss=round(loss.item(), 4), wall_s=round(time.perf_counter() - t0, 3))
    else:
        it, epoch, done, ts = batches(0), 0, 0, None
        while done < a.warmup + a.steps:
            if done == a.warmup:
                ts = time.perf_counter()
            try:
                xb, yb = next(it)
            except StopIteration:
                epoch += 1
                it = batches(epoch)
                continue
            loss = train_step(xb, yb)
            done += 1
        dt = time.perf_counter() - ts
        out.update(steps=a.steps, warmup=a.warmup,
                   samples_per_s=round(a.steps * a.batch * world / dt, 1),
                   final_loss=round(loss.item(), 4), wall_s=round(time.perf_counter() - t0, 3))
    if rank == 0:
        print(json.dumps(out), flush=True)
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    # Debian's torch 1.13 can deadlock in ~ProcessGroupGloo at interpreter shutdown
    # (docs/launch.md): leave without running finalizers.
    os._exit(0)


if __name__ == "__main__":
    main()
