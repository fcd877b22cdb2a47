"""One rank of bench/bench_torch_comm.sh's DDP part: DistributedDataParallel training steps per
second with the backend named on the command line, on synthetic data (the data path is not what
is measured): BasicNet (PyTorch's MNIST example net, 1.2 M parameters, 28x28x1, batch 32 per rank)
or a ResNet-18-sized CPU net (11 M parameters: 4 stages of 2 basic blocks, 64..512 channels,
32x32x3, batch 16 per rank). AdamW, torch.set_num_threads(1). W untimed steps, then N timed.
Rank 0 prints "steps_per_s <value>"."""
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers"))
from torch_models import BasicNet  # noqa: E402

import tandem.torch  # noqa: E402,F401


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(cout)
        self.skip = None if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.b1(self.c1(x)))
        y = self.b2(self.c2(y))
        return F.relu(y + (x if self.skip is None else self.skip(x)))


class ResNet18(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU())
        layers, cin = [], 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers += [Block(cin, cout, stride), Block(cout, cout, 1)]
            cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(512, classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


backend, model_name, warmup, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
torch.set_num_threads(1)
dist.init_process_group(backend)
rank = dist.get_rank()
torch.manual_seed(0)
if model_name == "basicnet":
    model, shape, batch = BasicNet(), (1, 28, 28), 32
else:
    model, shape, batch = ResNet18(), (3, 32, 32), 16
ddp = DDP(model)
opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(rank)
x = torch.randn((batch,) + shape, generator=g)
y = torch.randint(0, 10, (batch,), generator=g)


def step():
    opt.zero_grad(set_to_none=True)
    F.cross_entropy(ddp(x), y).backward()
    opt.step()


for _ in range(warmup):
    step()
dist.barrier()
t0 = time.perf_counter()
for _ in range(steps):
    step()
dist.barrier()
if rank == 0:
    print("steps_per_s %.3f" % (steps / (time.perf_counter() - t0)), flush=True)
dist.destroy_process_group()
