"""One rank of bench/bench_torch_comm.sh's DDP part: DistributedDataParallel training steps per
second with the backend named on the command line ("none": the same training without DDP, the
ceiling), on synthetic data (the data path is not what is measured): BasicNet (PyTorch's MNIST
example net, 1.2 M parameters, 28x28x1, batch 32 per rank) or a ResNet-18-sized CPU net (11 M
parameters: 4 stages of 2 basic blocks, 64..512 channels, 32x32x3, batch 16 per rank). AdamW,
torch.set_num_threads(1). W untimed steps, then N timed. Rank 0 prints "steps_per_s <value>",
then "thread_cpu_ms_per_step <thread>=<ms> ...": the CPU time each of its threads spent per
timed step (from /proc/self/task/*/stat), so a backend whose worker polls instead of sleeping
shows it as CPU taken from the main thread's forward and backward."""
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
# "none": the same ranks train the same model without DDP (no gradient allreduce; a gloo group
# only for the barriers around the timed steps): the ceiling any backend's DDP can reach on this
# machine at this load, since the ranks still compete for the same CPUs.
no_comm = backend == "none"
torch.set_num_threads(1)
dist.init_process_group("gloo" if no_comm else backend)
rank = dist.get_rank()
torch.manual_seed(0)
if model_name == "basicnet":
    model, shape, batch = BasicNet(), (1, 28, 28), 32
else:
    model, shape, batch = ResNet18(), (3, 32, 32), 16
ddp = model if no_comm else DDP(model)
opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(rank)
x = torch.randn((batch,) + shape, generator=g)
y = torch.randint(0, 10, (batch,), generator=g)


def step():
    opt.zero_grad(set_to_none=True)
    F.cross_entropy(ddp(x), y).backward()
    opt.step()


def thread_cpu_ticks():
    """{thread: utime + stime in clock ticks} over this process's threads, each named "main" (the
    one that runs forward and backward) or by its name and id (gloo's are gloo_tcp_loop and
    pt_gloo_runloop, tandem's tandem-worker; a thread that sets none shows its creator's name)."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open("/proc/self/task/%s/stat" % tid) as f:
                stat = f.read()
        except OSError:
            continue  # the thread ended
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        key = "main" if int(tid) == os.getpid() else "%s/%s" % (name, tid)
        out[key] = int(fields[11]) + int(fields[12])
    return out


for _ in range(warmup):
    step()
dist.barrier()
cpu0 = thread_cpu_ticks()
t0 = time.perf_counter()
for _ in range(steps):
    step()
dist.barrier()
elapsed = time.perf_counter() - t0
cpu1 = thread_cpu_ticks()
if rank == 0:
    print("steps_per_s %.3f" % (steps / elapsed), flush=True)
    tick_ms = 1000.0 / os.sysconf("SC_CLK_TCK")
    per = {k: (v - cpu0.get(k, 0)) * tick_ms / steps for k, v in cpu1.items()}
    print("thread_cpu_ms_per_step " + " ".join(
        "%s=%.2f" % (k.replace(" ", "_"), v) for k, v in sorted(per.items(), key=lambda kv: -kv[1])
        if v > 0), flush=True)
dist.destroy_process_group()
