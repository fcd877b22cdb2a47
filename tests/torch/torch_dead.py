"""One rank of tests/torch/test_dead_rank.sh (not a test by itself): three ranks over a FileStore
(no launcher that could tear the others down first), rank 2 SIGKILLs itself between two
all_reduces; ranks 0 and 1 must get a DistBackendError naming rank 2 and the collective. Prints
one JSON line per surviving rank: {"rank", "error", "type", "waited_s"}."""
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

import tandem.torch  # noqa: F401

rank = int(sys.argv[2])
dist.init_process_group("tandem", init_method="file://" + sys.argv[1], rank=rank, world_size=3)
t = torch.ones(1 << 18)
for _ in range(3):
    dist.all_reduce(t)
dist.barrier()
if rank == 2:
    os.kill(os.getpid(), signal.SIGKILL)
t0 = time.monotonic()
try:
    while True:
        dist.all_reduce(t)
except Exception as e:  # noqa: BLE001  (the test checks the type)
    print(json.dumps({"rank": rank, "error": str(e), "type": type(e).__name__,
                      "waited_s": round(time.monotonic() - t0, 3)}), flush=True)
    os._exit(0)
