#!/usr/bin/env python3
"""A user's Lightning or HF Trainer script for tests/cloud/test_aws_ckpt_fw.sh, tracked through
tandem.lightning.TandemLogger / tandem.hf.TandemCallback, checkpointing into the run's checkpoint
directory every --every steps (Lightning's ModelCheckpoint, the Trainer's checkpoint-N/), and
resuming through the integrations' own helpers (tandem.lightning.ckpt_path(),
tandem.hf.last_checkpoint()) with no resume logic of its own. Prints "rank R resumed from step S
(TANDEM_RESUME_STEP=V)" when it resumes; rank 0 writes the final weights to out/w.pt.

--dropout P: a dropout layer (probability P) between the two linear layers, drawing its masks
from torch's global RNG, the common case that makes each rank's RNG state part of the
checkpoint: the HF Trainer saves it per rank (checkpoint-N/rng_state_R.pth, written on the node
of rank R) and loads it on resume; a rank that lacks it goes on with a fresh RNG and the run ends
on other bits. With --dropout the HF Trainer logs at info on every rank, so that its "Didn't find
an RNG file for process R" reaches the rank's log; each rank also says whether the checkpoint it
resumes from holds its RNG state ("rank R resumes with its RNG state rng_state_R.pth" or "rank R
resumes without its RNG state ...").

--hold N (the cloud test's first attempt only: not a resume, restart count 0): once step N is
trained, logged and checkpointed, every rank holds before step N+1 until SIGTERM (the spot
interruption's stop) ends it with exit 143, so the interruption always lands mid-run; after
--hold-cap seconds without one it exits 1 ("the interruption never came").

Deterministic whatever the data loader's position after a resume: the inputs of a step depend
on the optimizer step and the rank only (the loaders hand out dummy indices), and gradients are
averaged over 2 ranks by DDP (a sum of two is order-free; the HF loss goes through the DDP
wrapper, whose forward arms the allreduce), so an interrupted run ends on the bits of an
uninterrupted one, and only if every rank resumed where it should."""
import argparse
import os
import signal
import sys
import time

import torch
import torch.nn as nn

import tandem

ap = argparse.ArgumentParser()
ap.add_argument("framework", choices=["lightning", "hf"])
ap.add_argument("--steps", type=int, default=40)
ap.add_argument("--every", type=int, default=5)
ap.add_argument("--sleep", type=float, default=0.3)
ap.add_argument("--hold", type=int, default=0)
ap.add_argument("--hold-cap", type=float, default=600)
ap.add_argument("--dropout", type=float, default=0.0)
args = ap.parse_args()
torch.set_num_threads(1)
RANK = int(os.environ.get("RANK", "0"))
WORLD = int(os.environ.get("WORLD_SIZE", "1"))
W_TRUE = torch.randn(8, 1, generator=torch.Generator().manual_seed(1234))


def batch(step):
    """The inputs and targets of optimizer step `step` (1-based) on this rank."""
    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(step * WORLD + RANK))
    return x, torch.tanh(x @ W_TRUE)


def net():
    torch.manual_seed(0)
    drop = [nn.Dropout(args.dropout)] if args.dropout > 0 else []
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), *drop, nn.Linear(16, 1))


class Dummy(torch.utils.data.Dataset):
    def __len__(self):
        return 100000

    def __getitem__(self, i):
        return {"idx": torch.tensor(i)}


def said_resumed(step):
    if step > 0 or os.environ.get("TANDEM_RESUME") == "1":
        print(f"rank {RANK} resumed from step {step} "
              f"(TANDEM_RESUME_STEP={os.environ.get('TANDEM_RESUME_STEP', '-')})", flush=True)


def first_attempt():
    """Not a resume (TANDEM_RESUME, TANDEM_RESUME_STEP) and not a restart (restart counts 0)."""
    if os.environ.get("TANDEM_RESUME") == "1" or os.environ.get("TANDEM_RESUME_STEP", "").strip():
        return False
    return all(int(os.environ.get(v, "0") or 0) == 0
               for v in ("TANDEM_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT"))


def hold(step):
    """Before the step after `step` (trained, logged, checkpointed): with --hold == step on the
    first attempt, wait for SIGTERM and exit 143 (the checkpoint of `step` is the one to resume
    from); exit 1 when none comes within --hold-cap seconds."""
    if args.hold <= 0 or step != args.hold or not first_attempt():
        return
    got = []
    signal.signal(signal.SIGTERM, lambda signum, frame: got.append(signum))
    print(f"rank {RANK} holds at step {step} until the interruption stops it", flush=True)
    end = time.monotonic() + args.hold_cap
    while not got and not tandem.should_stop(sync=False):
        if time.monotonic() > end:
            print(f"rank {RANK}: held at step {step} for {args.hold_cap:g} s: the interruption "
                  f"never came", file=sys.stderr, flush=True)
            os._exit(1)
        time.sleep(0.2)
    print(f"rank {RANK} stopped while holding at step {step}", flush=True)
    tandem.finish()
    sys.stdout.flush()
    os._exit(tandem.STOPPED)


def save_weights(sd):
    if RANK == 0:
        os.makedirs("out", exist_ok=True)
        torch.save({k: v.detach().clone() for k, v in sd.items()}, "out/w.pt")


def lightning():
    try:
        import lightning.pytorch as L
        from lightning.pytorch.callbacks import ModelCheckpoint
    except ImportError:
        import pytorch_lightning as L
        from pytorch_lightning.callbacks import ModelCheckpoint
    from tandem.lightning import TandemLogger, ckpt_path

    class M(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.save_hyperparameters({"lr": 0.05, "every": args.every})
            self.net = net()

        def training_step(self, b, i):
            x, y = batch(self.global_step + 1)
            loss = nn.functional.mse_loss(self.net(x), y)
            self.log("train/loss", loss)
            return loss

        def on_train_start(self):
            said_resumed(self.global_step)

        def on_train_batch_start(self, b, i):
            hold(self.global_step)  # step global_step is logged and checkpointed by now

        def on_train_batch_end(self, *a):
            time.sleep(args.sleep)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)

    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    trainer = L.Trainer(
        accelerator="cpu", devices=local, num_nodes=WORLD // local,
        strategy="ddp" if WORLD > 1 else "auto", max_steps=args.steps, log_every_n_steps=1,
        enable_progress_bar=False, enable_model_summary=False, logger=TandemLogger(),
        callbacks=[ModelCheckpoint(dirpath=os.environ["TANDEM_CHECKPOINT_DIR"],
                                   every_n_train_steps=args.every, save_top_k=-1)])
    m = M()
    trainer.fit(m, torch.utils.data.DataLoader(Dummy(), batch_size=1), ckpt_path=ckpt_path())
    save_weights(m.net.state_dict())


def hf():
    from transformers import Trainer, TrainerCallback, TrainingArguments
    from tandem.hf import TandemCallback, last_checkpoint

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = net()

        def forward(self, idx=None, x=None):
            return {} if x is None else {"out": self.net(x)}

    class T(Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, **kw):
            x, y = batch(self.state.global_step + 1)
            # through the DDP wrapper, whose forward arms the gradients' allreduce: rank 1's
            # batches (and dropout masks) reach rank 0's weights
            out = model(x=x)["out"]
            loss = nn.functional.mse_loss(out, y)
            return (loss, {}) if return_outputs else loss

    class Slow(TrainerCallback):
        def on_train_begin(self, a, state, control, **kw):
            said_resumed(state.global_step)

        def on_step_begin(self, a, state, control, **kw):
            hold(state.global_step)  # step global_step is logged and saved by now

        def on_step_end(self, *a, **kw):
            time.sleep(args.sleep)

    tandem.init(config={"every": args.every})
    out = tandem.checkpoint.dir()
    targs = TrainingArguments(
        output_dir=out, max_steps=args.steps, per_device_train_batch_size=1, learning_rate=0.01,
        lr_scheduler_type="constant", logging_steps=1, save_steps=args.every,
        report_to="none", use_cpu=True, seed=0, data_seed=0, dataloader_num_workers=0,
        disable_tqdm=True, ddp_backend="gloo", remove_unused_columns=False,
        **({"log_level": "info", "log_level_replica": "info"} if args.dropout > 0 else {}))
    model = Model()
    cb = TandemCallback()
    trainer = T(model=model, args=targs, train_dataset=Dummy(), callbacks=[cb, Slow()])
    resume = last_checkpoint(out)
    if resume and args.dropout > 0:
        rng = f"rng_state_{RANK}.pth" if WORLD > 1 else "rng_state.pth"
        have = os.path.isfile(os.path.join(resume, rng))
        print(f"rank {RANK} resumes {'with' if have else 'without'} its RNG state {rng} "
              f"({os.path.basename(resume)})", flush=True)
    trainer.train(resume_from_checkpoint=resume)
    if cb.stopped:
        raise SystemExit(tandem.STOPPED)
    save_weights(model.net.state_dict())


lightning() if args.framework == "lightning" else hf()
tandem.finish()
sys.stdout.flush()
# The process group goes before the interpreter does, as PyTorch asks and as the other test
# scripts end theirs: left to the exit, the HF Trainer's gloo group once aborted rank 0 after
# its last step ("terminate called without an active exception", exit 134).
if torch.distributed.is_available() and torch.distributed.is_initialized():
    torch.distributed.destroy_process_group()
