"""One rank of tests/torch/test_hf.sh (not a test by itself): a tiny GPT-2 (config built here, no
download: 2 layers, 32-wide, vocabulary 96) trained for 8 steps on fixed random token sequences
through Hugging Face's stack with the process-group backend named on the command line:

  trainer      transformers' Trainer, TrainingArguments(use_cpu=True, ddp_backend=BACKEND)
  accelerate   Accelerate, Accelerator(cpu=True,
               kwargs_handlers=[InitProcessGroupKwargs(backend=BACKEND)]), a plain AdamW loop
  accelerate-pre  the way that needs no patch of Accelerate: dist.init_process_group(BACKEND)
               first, then Accelerator(cpu=True) with no backend (it adopts the existing group)

usage: torch_hf.py MODE BACKEND OUT_PREFIX. Each rank writes OUT_PREFIX.rank<R>.json:
{"backend": the default group's backend as torch reports it, "distributed": whether the
framework wrapped the model in DistributedDataParallel, "world": the world size, "losses": this
rank's loss at every step, "weights_sha256": of its final weights' bytes, "weights": a sample of
them}."""
import hashlib
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import tandem.torch  # noqa: F401  registers "tandem" and makes Accelerate take the name

mode, backend, prefix = sys.argv[1], sys.argv[2], sys.argv[3]
torch.set_num_threads(1)

from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

STEPS, BATCH, SEQ, VOCAB = 8, 4, 16, 96


def tiny_gpt2():
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=2,
                                      n_head=2))


g = torch.Generator().manual_seed(0)
tokens = torch.randint(0, VOCAB, (STEPS * BATCH * 2, SEQ), generator=g)
losses = []


def finish(model, wrapped):
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    rank = dist.get_rank()
    with open("%s.rank%d.json" % (prefix, rank), "w") as f:
        json.dump({"backend": str(dist.get_backend()), "distributed": isinstance(wrapped, DDP),
                   "world": dist.get_world_size(), "losses": losses,
                   "weights_sha256": hashlib.sha256(flat.numpy().tobytes()).hexdigest(),
                   "weights": flat[:: max(1, flat.numel() // 2000)].tolist()}, f)


if mode == "trainer":
    from transformers import Trainer, TrainingArguments

    class Recording(Trainer):
        def training_step(self, *args, **kwargs):
            loss = super().training_step(*args, **kwargs)
            losses.append(float(loss))
            return loss

    args = TrainingArguments(output_dir=prefix + ".out", use_cpu=True, ddp_backend=backend,
                             per_device_train_batch_size=BATCH, max_steps=STEPS,
                             learning_rate=1e-3, seed=0, save_strategy="no", report_to=[],
                             logging_strategy="no", disable_tqdm=True, dataloader_num_workers=0)
    data = [{"input_ids": t, "labels": t} for t in tokens]
    trainer = Recording(model=tiny_gpt2(), args=args, train_dataset=data)
    trainer.train()
    finish(trainer.model, trainer.model_wrapped)
else:
    from accelerate import Accelerator
    from accelerate.utils import InitProcessGroupKwargs, set_seed

    if mode == "accelerate":
        accelerator = Accelerator(cpu=True, kwargs_handlers=[InitProcessGroupKwargs(backend=backend)])
    elif mode == "accelerate-pre":
        dist.init_process_group(backend)
        accelerator = Accelerator(cpu=True)
    else:
        sys.exit("torch_hf.py: unknown mode %r" % mode)
    set_seed(0)
    model = tiny_gpt2()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = torch.utils.data.DataLoader(tokens, batch_size=BATCH, shuffle=False)
    wrapped, opt, loader = accelerator.prepare(model, opt, loader)
    model.train()
    for step, batch in enumerate(loader):
        if step == STEPS:
            break
        loss = wrapped(input_ids=batch, labels=batch).loss
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(float(loss))
    finish(accelerator.unwrap_model(wrapped), wrapped)
dist.barrier()
dist.destroy_process_group()
