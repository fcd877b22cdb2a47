"""One rank of tests/torch/test_ddp.sh (not a test by itself): DistributedDataParallel training of
BasicNet (PyTorch's MNIST example net, bench/peers/torch_models.py) on the first Fashion-MNIST
images, AdamW, dropout on, with the process-group backend named on the command line. Rank 0
writes a JSON line {"losses": [every step's loss, averaged over ranks], "sha256": of the final
weights' bytes} to --out, and the weights themselves to --out.pt.

  --backend tandem|gloo|cpu:tandem   --steps N   --batch B (per rank)   --hook none|fp16
  --unused   a parameter no forward uses (find_unused_parameters=True: DDP's bitmap allreduce)
  --zero     ZeroRedundancyOptimizer(AdamW) instead of AdamW (optimizer state sharded; each
             rank's updated shard is broadcast)
  --fsdp     FSDP2's fully_shard on CPU instead of DDP (all_gather_into_tensor of parameters,
             reduce_scatter_tensor of gradients)
"""
import argparse
import gzip
import hashlib
import json
import os
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

SRC = os.environ["TANDEM_SOURCE_DIR"]
sys.path.insert(0, os.path.join(SRC, "bench", "peers"))
from torch_models import BasicNet  # noqa: E402

import tandem.torch  # noqa: E402,F401  (registers "tandem")


def load_images(data, n):
    with gzip.open(os.path.join(data, "train-images-idx3-ubyte.gz")) as f:
        x = np.frombuffer(f.read(), np.uint8, offset=16)[: n * 784]
    with gzip.open(os.path.join(data, "train-labels-idx1-ubyte.gz")) as f:
        y = np.frombuffer(f.read(), np.uint8, offset=8)[:n]
    x = torch.from_numpy(x.astype(np.float32) / 255.0).view(n, 1, 28, 28)
    return (x - 0.2860) / 0.3530, torch.from_numpy(y.astype(np.int64))


class WithUnused(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = BasicNet()
        self.unused = nn.Linear(4, 4)  # never called: DDP must find it unused on every step

    def forward(self, x):
        return self.net(x)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", required=True)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--hook", choices=("none", "fp16"), default="none")
    ap.add_argument("--unused", action="store_true")
    ap.add_argument("--zero", action="store_true")
    ap.add_argument("--fsdp", action="store_true")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group(a.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = load_images(os.environ.get("TANDEM_DATA", "/usr/share/datasets/fashion-mnist"),
                       a.steps * a.batch * world)
    torch.manual_seed(1)  # the same initial weights everywhere (DDP broadcasts rank 0's anyway)
    model = WithUnused() if a.unused else BasicNet()
    torch.manual_seed(100 + rank)  # dropout masks: per rank, the same in every run
    if a.fsdp:
        from torch.distributed.fsdp import fully_shard
        for layer in (model.conv1, model.conv2, model.fc1, model.fc2):
            fully_shard(layer)
        ddp = fully_shard(model)
    else:
        ddp = DDP(model, find_unused_parameters=a.unused)
    if a.hook == "fp16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    if a.zero:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-3)
    else:
        opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    losses = []
    for step in range(a.steps):
        base = (step * world + rank) * a.batch
        xb, yb = x[base:base + a.batch], y[base:base + a.batch]
        opt.zero_grad(set_to_none=True)
        loss = F.nll_loss(ddp(xb), yb)
        loss.backward()
        opt.step()
        # every rank's loss, through gloo-free means: a float64 all_reduce on this backend
        mean = loss.detach().double().clone()
        dist.all_reduce(mean)
        losses.append(mean.item() / world)
    if a.fsdp:  # the full parameters, gathered from the shards
        from torch.distributed.tensor import DTensor
        flat = torch.cat([(p.full_tensor() if isinstance(p, DTensor) else p).detach().reshape(-1)
                          for p in model.parameters()])
    else:
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    digests = [None] * world
    dist.all_gather_object(digests, hashlib.sha256(flat.numpy().tobytes()).hexdigest())
    if rank == 0:
        if len(set(digests)) != 1:
            print("FAIL: replicas differ after training: %s" % digests, flush=True)
            sys.exit(1)
        torch.save(flat, a.out + ".pt")
        with open(a.out, "w") as f:
            json.dump({"losses": losses, "sha256": digests[0], "world": world,
                       "backend": a.backend}, f)
            f.write("\n")
    if a.backend == "gloo":
        # The reference run: PyTorch's gloo group at times aborts a rank while it is torn down
        # ("terminate called without an active exception", SIGABRT) after every result is
        # written. Once all ranks are past the barrier nothing is left to check, so its
        # ranks end without the teardown; tandem's backends go through destroy_process_group.
        dist.barrier()
        sys.stdout.flush(), sys.stderr.flush()
        os._exit(0)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
