"""The script of tests/executors/test_script_exit_hang.sh (issue 30), as 2 workers.

hang: both ranks log and finish their run (tandem.finish); rank 1 then hangs at interpreter exit
      on a non-daemon thread (as a framework's leftover thread does).
stop: both ranks say they are ready and loop; on a stop rank 0 writes a checkpoint and exits
      143 (tandem.STOPPED); rank 1 never asks tandem.should_stop(), so the SIGTERM kills it.
"""
import os
import sys
import threading
import time

import tandem

mode = sys.argv[1]
run = tandem.init()
if mode == "hang":
    tandem.log({"loss": 1.0}, step=1)
    tandem.finish()
    if run.rank == 1:
        threading.Thread(target=time.sleep, args=(100000,)).start()
    sys.exit(0)

open(os.path.join(os.environ["TANDEM_RUN_DIR"], f"ready-{run.rank}"), "w").close()
step = 0
while True:
    step += 1
    if run.rank == 0:
        tandem.log({"loss": 1.0 / step}, step=step)
        if tandem.should_stop(sync=False):
            path = os.path.join(run.checkpoint_dir, f"ckpt-{step}.txt")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(str(step))
            sys.exit(tandem.STOPPED)
    time.sleep(0.05)
