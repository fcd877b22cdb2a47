"""One rank of bench/bench_torch_comm.sh: raw torch.distributed collectives on the "tandem" backend
and on gloo, in the same job on the same tensors (the default group is tandem's, a gloo group
over the same ranks is the peer), float32 sum, sizes MIN..MAX bytes by powers of 4. For each
size and backend: warm-up calls, then timed calls until ~0.25 s (at least 3), the median. The
result is checked against the other backend at every size (#wrong: elements off by more than
the rounding bound, must be 0). Rank 0 prints one line per (op, bytes) in nccl-tests columns."""
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

import tandem.torch  # noqa: F401

ops = sys.argv[1].split(",")
lo, hi = int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(1)
dist.init_process_group("tandem")
rank, W = dist.get_rank(), dist.get_world_size()
gloo = dist.new_group(backend="gloo")
busfactor = {"allreduce": 2 * (W - 1) / W, "allgather": (W - 1) / W, "reduce_scatter": (W - 1) / W}


def call(op, group, x, out):
    if op == "allreduce":
        dist.all_reduce(x, group=group)
    elif op == "allgather":
        dist.all_gather_into_tensor(out, x, group=group)
    else:
        dist.reduce_scatter_tensor(out, x, group=group)


def timed(op, group, src, n):
    x = src.clone()
    out = torch.empty(n * W if op == "allgather" else max(n // W, 1))
    for _ in range(2):
        x.copy_(src)
        call(op, group, x, out)
    times = []
    t_end = time.perf_counter() + 0.25
    go = torch.ones(1)
    while go.item():
        x.copy_(src)  # sums must not grow without bound
        dist.barrier(group=gloo)
        t0 = time.perf_counter()
        call(op, group, x, out)
        times.append(time.perf_counter() - t0)
        # every rank stops after the same call: the last to reach its time budget decides
        go[0] = float(len(times) < 3 or (time.perf_counter() < t_end and len(times) < 200))
        dist.all_reduce(go, op=dist.ReduceOp.MAX, group=gloo)
    return statistics.median(times), (x if op == "allreduce" else out)


if rank == 0:
    print("# world %d, float32 sum, median of >= 3 calls; busbw factors of nccl-tests" % W)
    print("# %-14s %10s %12s %12s %9s %10s %10s %6s" % ("op", "bytes", "tandem_us", "gloo_us",
                                                     "speedup", "tandem_bus", "gloo_bus", "wrong"))
size = lo
while size <= hi:
    n = size // 4
    if n % W:
        n += W - n % W
    g = torch.Generator().manual_seed(rank * 7 + size)
    src = torch.randn(n, generator=g)
    for op in ops:
        t_tan, r_tan = timed(op, None, src, n)
        t_glo, r_glo = timed(op, gloo, src, n)
        bound = 4 * W * torch.finfo(torch.float32).eps * (r_glo.abs() + W * 4)
        wrong = int(((r_tan - r_glo).abs() > bound).sum())
        wrong_all = torch.tensor([wrong])
        dist.all_reduce(wrong_all, group=gloo)
        if rank == 0:
            nb = n * 4
            bus_t = nb / t_tan / 1e9 * busfactor[op]
            bus_g = nb / t_glo / 1e9 * busfactor[op]
            print("  %-14s %10d %12.1f %12.1f %8.2fx %10.3f %10.3f %6d" % (
                op, nb, t_tan * 1e6, t_glo * 1e6, t_glo / t_tan, bus_t, bus_g, int(wrong_all)),
                flush=True)
    size *= 4
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)  # not through finalization with a gloo group alive (pytorch/pytorch#190489)
