"""Peer benchmark: torch.distributed all_reduce over gloo (CPU, TCP loopback), float32 sum.

Started once per rank by bench/bench_comm.sh with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT
set (env:// init; torchrun is broken on this Python). Prints nccl-tests columns from rank 0.
Usage: gloo_allreduce.py [min_bytes max_bytes]
"""
import os
import sys
import time

import torch
import torch.distributed as dist


def main():
    minb = int(sys.argv[1]) if len(sys.argv) > 2 else 4096
    maxb = int(sys.argv[2]) if len(sys.argv) > 2 else 64 << 20
    dist.init_process_group("gloo", init_method="env://")
    rank, n = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    if rank == 0:
        print("# %12s %10s %10s %10s %8s" % ("bytes", "time_us", "algbw_GBs", "busbw_GBs", "wrong"))
    b = minb
    while b <= maxb:
        count = b // 4
        idx = torch.arange(count) % 7 + 1
        buf = (idx * (rank + 1)).float()
        dist.all_reduce(buf)
        wrong = int((buf != idx.float() * (n * (n + 1) // 2)).sum())
        buf = (torch.arange(count) % 5).float() * 1e-3
        iters = max(3, min(500, (128 << 20) // b))
        for _ in range(2):
            dist.all_reduce(buf)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(buf)
        t = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        w = torch.tensor([wrong])
        dist.all_reduce(w)
        if rank == 0:
            algbw = b / t.item() / 1e9
            print("  %12d %10.2f %10.3f %10.3f %8d" % (b, t.item() * 1e6, algbw,
                                                      algbw * 2 * (n - 1) / n, int(w.item())),
                  flush=True)
        b *= 2
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
