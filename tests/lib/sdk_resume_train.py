#!/usr/bin/env python3
"""A plain PyTorch DDP script tracked and checkpointed through the tandem SDK only, the user's
own script of tests/cloud/test_aws_ckpt_{sdk,fw}.sh and tests/executors/test_script_resume_*.sh:
tandem.init (its arguments as config, a tag), tandem.log every step, tandem.checkpoint.save every
--every steps (and when a stop or preemption asks, then exit 143), tandem.checkpoint.load_latest
on a resume; prints "rank R resumed from step S"; rank 0 writes the final weights with
torch.save to out/w.pt, records them with tandem.artifact and sets the summary. Deterministic:
the data of a step depends on the step and rank only, gradients are averaged over 2 ranks (a sum
of two is order-free).
--hold N (only when not resuming): after the checkpoint of step N every rank waits for the stop
(the spot interruption's SIGTERM) and exits 143, so the interruption always lands mid-run; after
--hold-cap seconds without one it exits 1."""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import tandem

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=60)
ap.add_argument("--every", type=int, default=5)
ap.add_argument("--sleep", type=float, default=0.3)
ap.add_argument("--hold", type=int, default=0)
ap.add_argument("--hold-cap", type=float, default=600)
args = ap.parse_args()
torch.set_num_threads(1)
dist.init_process_group("gloo")
tandem.init(config=args, tags=["resumed-script"])
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
state, start = tandem.checkpoint.load_latest()
if state is not None:
    model.module.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
print(f"rank {rank} resumed from step {start}" if tandem.run.resuming else
      f"rank {rank} starts at step 0", flush=True)
w_true = torch.randn(8, 1, generator=torch.Generator().manual_seed(1234))
for step in range(start + 1, args.steps + 1):
    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(step * world + rank))
    loss = nn.functional.mse_loss(model(x), torch.tanh(x @ w_true))
    opt.zero_grad()
    loss.backward()
    opt.step()
    tandem.log({"train/loss": loss}, step=step)
    stop = tandem.should_stop()
    if step % args.every == 0 or stop:
        tandem.checkpoint.save({"model": model.module.state_dict(), "opt": opt.state_dict()}, step)
    if step == args.hold and not stop and not tandem.run.resuming:
        print(f"rank {rank} holds at step {step} until the interruption stops it", flush=True)
        end = time.monotonic() + args.hold_cap
        while not tandem.should_stop(sync=False):
            if time.monotonic() > end:
                print(f"rank {rank}: held at step {step} for {args.hold_cap:g} s: the "
                      f"interruption never came", file=sys.stderr, flush=True)
                os._exit(1)
            time.sleep(0.2)
        print(f"rank {rank} stopped while holding at step {step}", flush=True)
        stop = True
    if stop:
        tandem.finish()
        sys.stdout.flush()
        os._exit(tandem.STOPPED)
    time.sleep(args.sleep)
if rank == 0:
    os.makedirs("out", exist_ok=True)
    torch.save(model.module.state_dict(), "out/w.pt")
    tandem.artifact("out/w.pt")
    tandem.summary["final_loss"] = float(loss)
tandem.finish()
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)
