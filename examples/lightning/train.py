#!/usr/bin/env python3
"""A Lightning script tracked by tandem: one logger, nothing else tandem-specific.

    tandem run --nproc-per-node 2 --max-restarts 1 -- python examples/lightning/train.py

An MLP on Fashion-MNIST (Debian's dataset-fashion-mnist, or --data DIR) with DDP over gloo on
CPUs. TandemLogger records the hyperparameters, the curves and the summary; ModelCheckpoint
writes into the run's checkpoint directory, and ckpt_path="last" resumes from the newest one
after a worker was restarted (no step is stored twice).
"""
import argparse
import gzip
import os

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

from tandem.lightning import TandemLogger


def load_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, np.uint8, offset=4 + 4 * ndim).reshape(shape)


def fashion_mnist(root, split, limit):
    x = load_idx(os.path.join(root, f"{split}-images-idx3-ubyte.gz"))[:limit]
    y = load_idx(os.path.join(root, f"{split}-labels-idx1-ubyte.gz"))[:limit]
    x = (torch.from_numpy(x.astype(np.float32)) / 255.0 - 0.2860) / 0.3530
    return TensorDataset(x.reshape(len(x), -1), torch.from_numpy(y.astype(np.int64)))


class MLP(L.LightningModule):
    def __init__(self, hidden=128, lr=0.05):
        super().__init__()
        self.save_hyperparameters()  # -> tandem.config
        self.net = nn.Sequential(nn.Linear(784, hidden), nn.ReLU(), nn.Linear(hidden, 10))

    def training_step(self, batch, _):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch, _):
        x, y = batch
        logits = self.net(x)
        self.log("val/loss", F.cross_entropy(logits, y), sync_dist=True)
        self.log("val/acc", (logits.argmax(1) == y).float().mean(), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=os.environ.get("TANDEM_DATA",
                                                     "/usr/share/datasets/fashion-mnist"))
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--train-samples", type=int, default=60000)
    ap.add_argument("--checkpoint-every", type=int, default=25)
    args = ap.parse_args()

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    L.seed_everything(0, workers=True)
    train = fashion_mnist(args.data, "train", args.train_samples)
    val = fashion_mnist(args.data, "t10k", 2000)
    trainer = L.Trainer(
        accelerator="cpu", devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        num_nodes=int(os.environ.get("WORLD_SIZE", "1")) //
        int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        strategy="ddp" if int(os.environ.get("WORLD_SIZE", "1")) > 1 else "auto",
        max_steps=args.steps, val_check_interval=50, check_val_every_n_epoch=None,
        log_every_n_steps=5, enable_progress_bar=False, enable_model_summary=False,
        logger=TandemLogger(config={"batch": args.batch, "train_samples": len(train)}),
        callbacks=[ModelCheckpoint(save_last=True, every_n_train_steps=args.checkpoint_every,
                                   monitor="val/acc", mode="max")])
    trainer.fit(MLP(lr=args.lr), DataLoader(train, batch_size=args.batch, shuffle=True),
                DataLoader(val, batch_size=500), ckpt_path="last")


if __name__ == "__main__":
    main()
