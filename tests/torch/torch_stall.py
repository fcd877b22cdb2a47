"""One rank of tests/torch/test_stall.sh (not a test by itself): all_reduces in a loop on
backend="tandem"; rank 1 stops itself (SIGSTOP: alive, stuck) after the fifth."""
import os
import signal

import torch
import torch.distributed as dist

import tandem.torch  # noqa: F401

dist.init_process_group("tandem")
t = torch.ones(1000)
for i in range(100000):
    dist.all_reduce(t)
    t.fill_(1)
    if i == 4 and dist.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
