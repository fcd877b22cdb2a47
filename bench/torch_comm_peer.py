"""One rank of bench/bench_torch_comm.sh: raw torch.distributed collectives on the "tandem" backend
and on gloo, in the same job on the same tensors (the default group is tandem's, a gloo group
over the same ranks is the peer), float32 sum, sizes MIN..MAX bytes by powers of 4.

For each size: one checked call on each backend (#wrong: elements of tandem's result off gloo's
by more than the rounding bound, must be 0), then REPS rounds (env, default 5), each timing a
batch of back-to-back calls on tandem and a batch on gloo, the first backend alternating from
round to round so that a change in the machine's load hits both. A batch starts after a barrier
and times `iters` calls (50 for small messages down to 3 at 64 MiB, the same on every rank), so
the skew with which ranks leave the barrier (gloo's own latency, ~100 us on a loaded machine) is
spread over the batch instead of added to every call, as nccl-tests and the OSU benchmarks time
a loop. A figure is the median over the rounds of a batch's time per call. Rank 0 prints one line
per (op, bytes) in nccl-tests columns."""
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

import tandem.torch  # noqa: F401

ops = sys.argv[1].split(",")
lo, hi = int(sys.argv[2]), int(sys.argv[3])
reps = int(os.environ.get("REPS", "5"))
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


def iters_for(nbytes):
    # at most 50: an in-place sum grows W-fold per call and must stay finite (4^50 * |x| < 1e38)
    return max(3, min(50, (8 << 20) // nbytes))


def batch(op, group, src, x, out, iters):
    x.copy_(src)
    dist.barrier(group=gloo)
    t0 = time.perf_counter()
    for _ in range(iters):
        call(op, group, x, out)
    return (time.perf_counter() - t0) / iters


def checked(op, group, src, n):
    x = src.clone()
    out = torch.empty(n * W if op == "allgather" else max(n // W, 1))
    for _ in range(2):  # warm-up; the second call's result is compared
        x.copy_(src)
        call(op, group, x, out)
    return x if op == "allreduce" else out, x, out


if rank == 0:
    print("# world %d, float32 sum; per size: median over %d interleaved rounds of a batch's time "
          "per call; busbw factors of nccl-tests; load average %s" % (
              W, reps, " ".join(open("/proc/loadavg").read().split()[:3])))
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
        r_tan, x_tan, o_tan = checked(op, None, src, n)
        r_glo, x_glo, o_glo = checked(op, gloo, src, n)
        bound = 4 * W * torch.finfo(torch.float32).eps * (r_glo.abs() + W * 4)
        wrong_all = torch.tensor([int(((r_tan - r_glo).abs() > bound).sum())])
        dist.all_reduce(wrong_all, group=gloo)
        it = iters_for(n * 4)
        t_tan, t_glo = [], []
        for rep in range(reps):
            order = ((t_tan, None, x_tan, o_tan), (t_glo, gloo, x_glo, o_glo))
            for times, group, x, out in (order if rep % 2 == 0 else order[::-1]):
                times.append(batch(op, group, src, x, out, it))
        t_tan, t_glo = statistics.median(t_tan), statistics.median(t_glo)
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
os._exit(0)  # not through finalization with a gloo group alive (docs/torch.md, "Exit")
