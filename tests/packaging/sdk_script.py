# The user's script of the wheel's tests (run as train.py with `tandem run -- python train.py`
# from a venv holding the wheel): 5 steps of two metrics and a config, through the venv's SDK.
import os, sys
import tandem
# The SDK is the venv's, not a checkout's.
assert os.path.realpath(tandem.__file__).startswith(os.path.realpath(sys.prefix)), (tandem.__file__, sys.prefix)
tandem.init(config={"lr": 0.2, "opt": "sgd"})
for step in range(1, 6):
    tandem.log({"loss": 1.0 / step, "acc": step / 10}, step=step)
tandem.summary["best"] = 0.5
