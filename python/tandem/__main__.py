"""python -m tandem ARGS...: the tandem command, with this interpreter for Python scripts.

`tandem launch train.py` and `tandem run -- ...` start a script with the interpreter named by
TANDEM_PYTHON (docs/launch.md, "PYTHON"); torchrun uses the one that runs torchrun. Started
this way, tandem gets that same behaviour: TANDEM_PYTHON is set to this sys.executable (unless
it is set already), then the tandem binary replaces this process: TANDEM_BIN, else the one the
pip wheel installed with this package (<site-packages>/tandem.scripts/tandem, or
<venv>/bin/tandem), else `tandem` on PATH (tandem.binary()).
"""
import os
import sys

from tandem import binary as _binary


def main():
    binary = _binary()
    if not binary:
        sys.exit("python -m tandem: no tandem binary: install the wheel (pip install . from the "
                 "repository, docs/python.md), or put one on PATH (scripts/build.sh builds "
                 "build/tandem), or set TANDEM_BIN=/path/to/tandem")
    with open(binary, "rb") as f:
        if f.read(2) == b"#!":  # a script named tandem (a console wrapper) would call us again
            sys.exit(f"python -m tandem: {binary} is a script, not the tandem binary; set "
                     f"TANDEM_BIN=/path/to/tandem")
    os.environ.setdefault("TANDEM_PYTHON", sys.executable)
    os.execv(binary, [binary] + sys.argv[1:])


if __name__ == "__main__":
    main()
