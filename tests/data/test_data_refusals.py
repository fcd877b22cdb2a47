"""data: what `tandem train --data` must refuse, and say so (issue 29), end to end:

(1) a CSV wider than TD_DATA_MAX_CHANNELS (4,097 and 4,200 feature columns) is refused naming
    the file, the column count and the limit (it used to write past 4,096-float arrays: a
    corrupt --json line, then SIGSEGV); 4,096 columns train, with a --json line that parses and
    holds 4,096 means;
(2) NaN and inf features, with and without --mean/--std: the CSV error names file:line and the
    column, the .npy one the file, the sample and the element; float64 beyond float32 too; a
    file-backed .npy (TANDEM_DATA_IN_MEMORY=0) is refused when the bad sample is read, and
    without --mean/--std the statistics' error names the sample (not --mean, never passed);
(3) a progressive JPEG of 600 repeated scans is refused naming the file and the scan limit;
(4) a FIFO as --data (or --val-data, or an IDX directory's file) is refused before it is opened
    (opening it waits for a writer: tandem hung);
(5) a NUL byte in a CSV is refused as FILE:LINE:COLUMN;
(6) one label of 999999 among a few small ones (a million-class model) is refused naming the
    label and its line (CSV) or sample (.npy); sparse labels below 1,024 classes still train.
Every refusal exits with tandem's error code (1, or 2 for a FIFO: a wrong --data), not a signal."""
import atexit
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile

try:
    import numpy as np
    from PIL import Image
except ImportError:
    print("SKIP: this Python lacks numpy or Pillow (Debian: python3-numpy python3-pil)")
    sys.exit(77)

TANDEM = os.environ.get("TANDEM_BIN", "build/tandem")
COMMON = ["--model", "mlp", "--steps", "2", "--batch", "4", "--threads", "1", "--no-progress"]


def fail(msg):
    sys.exit("FAIL: " + msg)


def train(*args, env=None):
    e = dict(os.environ, **(env or {}))
    try:  # the timeout is a backstop against a hang (a FIFO's old behaviour), not a measurement
        p = subprocess.run([TANDEM, "train", *COMMON, *args], capture_output=True, text=True,
                           env=e, timeout=120)
    except subprocess.TimeoutExpired:
        fail(f"tandem train {' '.join(args)} hung (no exit in 120 s)")
    return p.returncode, p.stdout, p.stderr


def refused(what, needles, *args, env=None, code=1):
    rc, out, err = train(*args, env=env)
    if rc != code:
        fail(f"{what}: exited {rc}, expected {code} (a refusal)\nstderr:\n{err}")
    for n in needles:
        if n not in err:
            fail(f"{what}: the error lacks {n!r}:\n{err}")
    print(f"ok: {what}: {err.strip().splitlines()[-1][:160]}")


def write_csv(path, rows, cols, header=False, bad=None):
    with open(path, "w") as f:
        if header:
            f.write(",".join(f"f{j}" for j in range(cols)) + ",label\n")
        for r in range(rows):
            vals = [str((r * 7 + j) % 5) for j in range(cols)]
            if bad and bad[0] == r:
                vals[bad[1]] = bad[2]
            f.write(",".join(vals) + f",{r % 2}\n")


tmp = tempfile.mkdtemp(prefix="tandem-refusals-")
atexit.register(shutil.rmtree, tmp, True)
os.chdir(tmp)

# (1) wide tables
for cols in (4097, 4200):
    write_csv(f"w{cols}.csv", 8, cols)
    refused(f"CSV of {cols} feature columns", [f"w{cols}.csv", f"{cols} feature columns", "4096"],
            "--data", f"w{cols}.csv", "--json")
write_csv("w4096.csv", 8, 4096)
rc, out, err = train("--data", "w4096.csv", "--json")
if rc != 0:
    fail(f"4096 feature columns: exited {rc}\n{err}")
res = json.loads(out.strip().splitlines()[-1])
if len(res["norm_mean"]) != 4096 or res["status"] != "ok" or res["steps"] != 2:
    fail(f"4096 columns: --json has {len(res['norm_mean'])} means, status {res['status']}")
print("ok: 4096 feature columns train, --json intact")

# (2) non-finite features
write_csv("nan.csv", 8, 3, header=True, bad=(4, 1, "nan"))
write_csv("inf.csv", 8, 3, header=True, bad=(2, 0, "-inf"))
norm = ["--mean", "0", "--std", "1"]
for extra in ([], norm):
    tag = " with --mean/--std" if extra else ""
    refused("CSV nan" + tag, ["nan.csv:6:", "column f1", "'nan'"], "--data", "nan.csv", *extra)
    refused("CSV -inf" + tag, ["inf.csv:4:", "column f0", "'-inf'"], "--data", "inf.csv", *extra)
rs = np.random.RandomState(0)
y = (np.arange(24) % 2).astype(np.int64)
np.save("y.npy", y)
for name, value, dtype in (("nan", np.nan, np.float32), ("inf", np.inf, np.float32),
                           ("big", 1e300, np.float64)):
    x = rs.rand(24, 3).astype(dtype)
    x[9, 2] = value
    np.save(f"x{name}.npy", x)
    for extra in ([], norm):
        tag = " with --mean/--std" if extra else ""
        refused(f".npy {name}{tag}", [f"x{name}.npy", "sample 9", "element 2"],
                "--data", f"x{name}.npy,y.npy", *extra)
        # file-backed: checked as samples are read (--mean/--std) or by the statistics' pass
        refused(f"file-backed .npy {name}{tag}", [f"x{name}.npy", "sample 9", "element 2"],
                "--data", f"x{name}.npy,y.npy", "--batch", "24", *extra,
                env={"TANDEM_DATA_IN_MEMORY": "0"})

# (3) a progressive JPEG whose last scan is repeated 600 times (libjpeg warns and decodes on)
b = io.BytesIO()
Image.fromarray((np.arange(64).reshape(8, 8) * 3).astype(np.uint8)).save(
    b, "JPEG", progressive=True, quality=90)
jpg = b.getvalue()
last = jpg.rfind(b"\xff\xda")
os.makedirs("img/a")
os.makedirs("img/b")
with open("img/a/scans.jpg", "wb") as f:
    f.write(jpg[:-2] + jpg[last:-2] * 600 + b"\xff\xd9")
with open("img/b/fine.jpg", "wb") as f:
    f.write(jpg)
refused("JPEG of 600 scans", ["img/a/scans.jpg", "more than 500 scans"], "--data", "img")

# (4) a FIFO
os.mkfifo("fifo.csv")
write_csv("good.csv", 8, 3, header=True)
refused("FIFO as --data", ["fifo.csv", "FIFO"], "--data", "fifo.csv", code=2)
refused("FIFO as --val-data", ["--val-data", "fifo.csv", "FIFO"], "--data", "good.csv",
        "--val-data", "fifo.csv", code=2)

os.makedirs("idx")
os.mkfifo("idx/train-images-idx3-ubyte")
open("idx/train-labels-idx1-ubyte", "wb").close()
refused("FIFO inside an IDX directory", ["idx/train-images-idx3-ubyte", "FIFO"], "--data", "idx",
        code=2)

# (5) NUL
with open("nul.csv", "wb") as f:
    f.write(b"a,b,y\n1,2,cat\n3,4\x00x,dog\n5,6,cat\n")
refused("NUL byte in a CSV", ["nul.csv:3:4:", "NUL"], "--data", "nul.csv")

# (6) labels
with open("label.csv", "w") as f:
    f.write("a,b,y\n1,2,0\n3,4,1\n5,6,999999\n7,8,1\n")
refused("label 999999 in a CSV", ["label.csv", "label 999999", "line 4", "remap"],
        "--data", "label.csv")
ys = y.copy()
ys[5] = 5000
np.save("ys.npy", ys)
x = rs.rand(24, 3).astype(np.float32)
np.save("x.npy", x)
refused("label 5000 in a .npy", ["ys.npy", "label 5000", "sample 5", "remap"],
        "--data", "x.npy,ys.npy")
ys[5] = 900  # 901 classes of 3 labels: below 1,024, trained as before
np.save("ys.npy", ys)
rc, out, err = train("--data", "x.npy,ys.npy", "--json")
if rc != 0 or json.loads(out.strip().splitlines()[-1])["outputs"] != 901:
    fail(f"labels 0, 1, 900: exited {rc}, expected 901 outputs\n{out}\n{err}")
print("ok: labels 0, 1 and 900 train as 901 classes")
print("PASS")
