"""One rank of tests/torch/test_lightning.sh (not a test by itself): a small Lightning module
(MLP on fixed random data, SGD, 12 steps) trained with DDPStrategy(process_group_backend=ARGV[1])
under a launcher (Lightning reads RANK/WORLD_SIZE/LOCAL_RANK). Rank 0 writes a JSON line
{"backend": the group's backend as torch reports it, "losses": [...], "weights": [...]} to
ARGV[2]."""
import json
import os
import sys

import lightning as L
import torch
import torch.distributed as dist
import torch.nn.functional as F
from lightning.pytorch.strategies import DDPStrategy

import tandem.torch  # noqa: F401

backend, out = sys.argv[1], sys.argv[2]
torch.set_num_threads(1)


class Net(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                         torch.nn.Linear(64, 4))
        self.losses = []

    def training_step(self, batch, _):
        x, y = batch
        loss = F.cross_entropy(self.layer(x), y)
        self.losses.append(float(loss))
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


g = torch.Generator().manual_seed(0)
data = torch.utils.data.TensorDataset(torch.randn(4096, 32, generator=g),
                                      torch.randint(0, 4, (4096,), generator=g))
L.seed_everything(0, verbose=False)
model = Net()
world = int(os.environ.get("WORLD_SIZE", "1"))
trainer = L.Trainer(accelerator="cpu", devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
                    num_nodes=world // int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
                    strategy=DDPStrategy(process_group_backend=backend), max_steps=12,
                    logger=False, enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False)
trainer.fit(model, torch.utils.data.DataLoader(data, batch_size=32, shuffle=False))
if trainer.global_rank == 0:
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    with open(out, "w") as f:
        json.dump({"backend": str(dist.get_backend()), "losses": model.losses,
                   "weights": flat.tolist()}, f)
