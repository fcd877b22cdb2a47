#!/usr/bin/env python3
"""A small PyTorch DDP script tracked through the tandem SDK only (no JSON, no signal handler,
no resume logic of its own), for tests/python/test_sdk_run.sh:

- tandem.init(config=...), tandem.log(...) from every rank (only rank 0 writes);
- tandem.checkpoint.save every --checkpoint-every steps and when tandem.should_stop() says a
  SIGTERM came (then exit 143); tandem.checkpoint.load_latest() on a resume or a restart;
- --die-at N: rank 1 kills itself (SIGKILL) after step N of the run's first attempt, so the
  launcher restarts the group (max_restarts) and the steps after the last checkpoint are
  logged again;
- at the end: tandem.summary, tandem.artifact(out/model.txt).
"""
import argparse
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import tandem


def finish(code):
    tandem.finish()
    dist.destroy_process_group()
    # Debian's torch 1.13 can deadlock in ~ProcessGroupGloo at interpreter shutdown
    # (docs/launch.md): leave without running it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--checkpoint-every", type=int, default=4)
    ap.add_argument("--die-at", type=int, default=0)
    ap.add_argument("--sleep", type=float, default=0.2)
    ap.add_argument("--lr", type=float, default=0.05)
    args = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    run = tandem.init(config=args, name="sdk-test", tags=["test", "ddp"])
    rank, world = dist.get_rank(), dist.get_world_size()
    tandem.config["world_size"] = world

    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    state, start = tandem.checkpoint.load_latest()
    if state is not None:
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        print(f"rank {rank} resumed from step {start}", flush=True)

    w_true = torch.randn(8, 1, generator=torch.Generator().manual_seed(1234))
    loss = None
    for step in range(start + 1, args.steps + 1):
        gen = torch.Generator().manual_seed(step * world + rank)
        x = torch.randn(32, 8, generator=gen)
        loss = nn.functional.mse_loss(model(x), torch.tanh(x @ w_true))
        opt.zero_grad()
        loss.backward()
        opt.step()
        # every rank calls; rank 0 writes. "rank" is a name the metric line itself uses (the SDK
        # writes it as a one-point line); a NaN is written as null and not stored.
        tandem.log({"loss": loss, "lr": args.lr, "rank": rank,
                    "gnorm": float("nan") if step == 3 else 1.0 / step}, step=step)
        if args.die_at and step == args.die_at and rank == 1 and not run.resuming:
            os.kill(os.getpid(), signal.SIGKILL)
        stop = tandem.should_stop()
        if step % args.checkpoint_every == 0 or stop:
            tandem.checkpoint.save({"model": model.module.state_dict(),
                                    "opt": opt.state_dict()}, step)
        if stop:
            if rank == 0:
                print(f"stop requested: checkpoint of step {step} saved; exiting 143", flush=True)
            finish(tandem.STOPPED)
        time.sleep(args.sleep)
    if loss is not None:
        tandem.summary["final_loss"] = loss.item()
    if rank == 0:
        os.makedirs("out", exist_ok=True)
        with open("out/model.txt", "w") as f:
            f.write(" ".join(f"{v:.6f}" for v in model.module[0].weight.flatten().tolist()))
    tandem.artifact("out/model.txt")
    finish(0)


if __name__ == "__main__":
    main()
