#!/usr/bin/env python3
"""A Hugging Face Trainer script tracked by tandem: one callback, nothing else tandem-specific.

    tandem run --nproc-per-node 2 --max-restarts 1 -- python examples/hf_trainer/train.py

A small GPT-2 built from a config (no download from the hub) learns the bytes of a text file
(default: the GPL-3 text every Debian has) with the Trainer's DDP over gloo on CPUs. The
checkpoints go to the run's checkpoint directory; after a worker was restarted the Trainer
resumes from the newest complete one, and tandem drops the points it trains again.
"""
import argparse
import os

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

import tandem
from tandem.hf import TandemCallback, last_checkpoint


class Bytes(Dataset):
    """Blocks of `block` bytes of a text: the model predicts each next byte."""

    def __init__(self, data, block):
        self.data, self.block = data, block

    def __len__(self):
        return (len(self.data) - 1) // self.block

    def __getitem__(self, i):
        x = torch.tensor(list(self.data[i * self.block:(i + 1) * self.block]), dtype=torch.long)
        return {"input_ids": x, "labels": x.clone()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--text", default="/usr/share/common-licenses/GPL-3")
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--block", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--save-steps", type=int, default=20)
    args = ap.parse_args()

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    with open(args.text, "rb") as f:
        data = f.read()
    cut = len(data) * 9 // 10
    train, val = Bytes(data[:cut], args.block), Bytes(data[cut:], args.block)
    config = GPT2Config(vocab_size=256, n_positions=args.block, n_embd=64, n_layer=2, n_head=4,
                        bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)

    tandem.init(config={"text": os.path.basename(args.text), "train_bytes": cut})
    out = tandem.checkpoint.dir()
    targs = TrainingArguments(
        output_dir=out, max_steps=args.steps, per_device_train_batch_size=args.batch,
        per_device_eval_batch_size=args.batch, learning_rate=args.lr, warmup_steps=10,
        logging_steps=5, eval_strategy="steps", eval_steps=40, save_steps=args.save_steps,
        save_total_limit=2, report_to="none", use_cpu=True, seed=0, data_seed=0,
        dataloader_num_workers=0, disable_tqdm=True, ddp_backend="gloo")
    cb = TandemCallback()
    trainer = Trainer(model=model, args=targs, train_dataset=train, eval_dataset=val,
                      callbacks=[cb])
    resume = last_checkpoint(out)  # None unless this attempt resumes (a restart, --resume)
    if resume and int(os.environ.get("RANK", "0")) == 0:
        print(f"resuming from {resume}", flush=True)
    trainer.train(resume_from_checkpoint=resume)
    if cb.stopped:
        raise SystemExit(tandem.STOPPED)
    tandem.summary["eval_loss"] = trainer.evaluate()["eval_loss"]


if __name__ == "__main__":
    main()
