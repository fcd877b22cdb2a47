#!/usr/bin/env python3
"""A small PyTorch DDP script that speaks tandem's run contract with no library:

- metrics: append one JSON object per line to the file named by TANDEM_METRICS
  ({"step": 10, "loss": 0.5}); `tandem run` ingests it into the run store;
- checkpoints: rank 0 saves to TANDEM_CHECKPOINT_DIR every --checkpoint-every steps and on
  SIGTERM (then exits 143, so the run is recorded as preempted and can be resumed);
- resume: with TANDEM_RESUME=1 (`tandem run --resume`), or on a launcher restart after a worker
  died (TORCHELASTIC_RESTART_COUNT > 0, with max_restarts), it loads the newest checkpoint, writes
  {"event": "resume", "step": S} so the store drops points logged after that checkpoint, and
  continues from step S.

    tandem run -f examples/workflows.yaml torch-ddp
    tandem launch --standalone --nproc-per-node 2 -- python3 examples/torch_metrics/train.py
"""
import argparse
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

stop_requested = False


def on_sigterm(signum, frame):
    global stop_requested
    stop_requested = True


def log_metrics(path, record):
    if path:
        # One write of one line in append mode: lines from a live writer are never torn.
        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--checkpoint-every", type=int, default=50)
    args = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    # Only now: a SIGTERM while connecting would interrupt gloo's TCPStore (RuntimeError, a
    # failure) and leave the other ranks waiting; before this point the default (exit) is right.
    signal.signal(signal.SIGTERM, on_sigterm)
    rank, world = dist.get_rank(), dist.get_world_size()
    metrics = os.environ.get("TANDEM_METRICS")
    ckpt_dir = os.environ.get("TANDEM_CHECKPOINT_DIR", "checkpoints")
    ckpt_path = os.path.join(ckpt_dir, "torch_metrics.pt")

    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    start = 0
    restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0) > 0
    if (os.environ.get("TANDEM_RESUME") == "1" or restarted) and os.path.exists(ckpt_path):
        state = torch.load(ckpt_path)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"]
        log_metrics(metrics, {"event": "resume", "step": start})
        if rank == 0:
            print(f"resumed from step {start}", flush=True)

    def save(step):
        if rank == 0:
            os.makedirs(ckpt_dir, exist_ok=True)
            tmp = ckpt_path + ".tmp"
            torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(),
                        "step": step}, tmp)
            os.replace(tmp, ckpt_path)  # atomic: a kill mid-save leaves the old checkpoint
        dist.barrier()

    w_true = torch.randn(16, 1, generator=torch.Generator().manual_seed(1234))
    for step in range(start, args.steps):
        # the data of a step depends on the step only, so a resumed run sees the same batches
        gen = torch.Generator().manual_seed(step * world + rank)
        x = torch.randn(args.batch, 16, generator=gen)
        y = torch.tanh(0.5 * (x @ w_true))
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        log_metrics(metrics, {"step": step + 1, "loss": loss.item(), "time": time.time()})
        if rank == 0 and (step + 1) % 20 == 0:
            print(f"step {step + 1} loss {loss.item():.5f}", flush=True)
        # every rank must agree to stop at the same step, or the barrier in save() hangs
        stop = torch.tensor([1.0 if stop_requested else 0.0])
        dist.all_reduce(stop)
        if (step + 1) % args.checkpoint_every == 0 or stop.item() > 0:
            save(step + 1)
        if stop.item() > 0:
            if rank == 0:
                print(f"SIGTERM: checkpoint at step {step + 1} saved; exiting 143", flush=True)
            finish(143)
    finish(0)


def finish(code):
    dist.destroy_process_group()
    # Debian's torch 1.13 can deadlock in ~ProcessGroupGloo at interpreter shutdown (see
    # docs/launch.md): leave without running it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
