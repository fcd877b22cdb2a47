#!/usr/bin/env python3
"""python: the SDK's mirror of the checkpoint contract (python/tandem/checkpoint.py) against the
vectors the C side reads too (tests/core/ckpt_names.txt, tests/core/test_ckpt_names.c), and the
commit rule on real files: the two sides cannot drift apart without one of the tests failing."""
import os
import shutil
import sys
import tempfile

SRC = os.environ.get("TANDEM_SOURCE_DIR") or os.path.dirname(os.path.dirname(
    os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(SRC, "python"))
from tandem import checkpoint as ck  # noqa: E402


def fail(msg):
    print("FAIL:", msg, file=sys.stderr)
    sys.exit(1)


names = builds = 0
with open(os.path.join(SRC, "tests", "core", "ckpt_names.txt")) as f:
    for line in f:
        w = line.split()
        if not w or w[0].startswith("#"):
            continue
        if w[0] == "build":
            got = ck.build_name(w[1], int(w[2]))
            if got != w[3]:
                fail(f"build_name({w[1]!r}, {w[2]}) = {got!r}, expected {w[3]!r}")
            builds += 1
            continue
        name, kind, step = w[0], w[1], int(w[2])
        got = ck.parse_name(name)
        want = None if kind == "-" else (kind, step)
        if got != want:
            fail(f"parse_name({name!r}) = {got!r}, expected {want!r}")
        names += 1
if names < 30 or builds < 4:
    fail(f"only {names} names and {builds} builds in the vectors")
for bad in (-1, 10 ** 18):
    try:
        ck.build_name("sdk", bad)
        fail(f"build_name('sdk', {bad}) did not refuse")
    except ValueError:
        pass

d = tempfile.mkdtemp(prefix="tandem-ckpt-names-")
try:
    def touch(rel):
        with open(os.path.join(d, rel), "w") as f:
            f.write("x")
    touch("ckpt-5.tdck")
    touch(".ckpt-9.tdck.tmp.1")
    os.mkdir(os.path.join(d, "ckpt-7.tdck"))
    touch("step-000000000006.pt")
    os.symlink(os.path.join(d, "step-000000000006.pt"), os.path.join(d, "step-000000000008.pt"))
    os.mkdir(os.path.join(d, "checkpoint-20"))
    touch("checkpoint-20/model.safetensors")
    os.mkdir(os.path.join(d, "checkpoint-10"))
    touch("checkpoint-10/trainer_state.json")
    os.makedirs(os.path.join(d, "checkpoint-12", "trainer_state.json"))
    touch("last.ckpt")
    touch("epoch=0-step=4.ckpt")
    got = [n for _, _, n in ck.committed(d)]
    want = ["checkpoint-10", "step-000000000006.pt", "ckpt-5.tdck", "epoch=0-step=4.ckpt",
            "last.ckpt"]
    if got != want:
        fail(f"committed() = {got}, expected {want}")
    os.mkdir(os.path.join(d, "checkpoint-30"))
    if ck.is_committed(d, "checkpoint-30"):
        fail("a directory without its marker counted as committed")
    touch("checkpoint-30/" + ck.MARKER)
    if ck.committed(d, (ck.HF, ck.SDK))[0][:2] != (30, "hf"):
        fail(f"tandem's marker does not commit checkpoint-30: {ck.committed(d)}")
    if ck.committed(os.path.join(d, "nonexistent")) != []:
        fail("a missing directory is not an empty list")
finally:
    shutil.rmtree(d)
print(f"checkpoint contract: {names} names and {builds} builds agree with the C vectors; "
      f"the commit rule holds on files, links, directories and markers")
