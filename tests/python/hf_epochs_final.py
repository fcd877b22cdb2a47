"""An HF Trainer script that trains by epochs and saves a checkpoint at each epoch's end: its
newest checkpoint is its last step."""
import os

import torch
from torch import nn
from transformers import Trainer, TrainingArguments

import tandem
from tandem.hf import TandemCallback, last_checkpoint


class Points(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        x = torch.randn(4, generator=torch.Generator().manual_seed(i))
        return {"x": x, "y": x.sum().reshape(1)}


class Linear(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(4, 1)

    def forward(self, x, y):
        return {"loss": nn.functional.mse_loss(self.l(x), y)}


torch.manual_seed(0)
tandem.init()
args = TrainingArguments(output_dir=tandem.checkpoint.dir(), num_train_epochs=2,
                         per_device_train_batch_size=8, logging_steps=4, save_strategy="epoch",
                         report_to="none", use_cpu=True, disable_tqdm=True, seed=0)
trainer = Trainer(model=Linear(), args=args, train_dataset=Points(), callbacks=[TandemCallback()])
resume = last_checkpoint(args.output_dir)
print(f"resuming from {resume}", flush=True)
trainer.train(resume_from_checkpoint=resume)
tandem.finish()
if os.environ.get("TANDEM_RESUME") != "1":
    os._exit(3)  # the first attempt ends badly after its last checkpoint
