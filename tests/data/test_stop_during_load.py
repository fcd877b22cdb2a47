"""data: a stop signal ends `tandem train` while the data set is still loading (issue 29: it used
to be ignored until training started, so a long load could not be stopped).

The data is an image folder of progressive JPEGs of 4096x4096 pixels, each with its last scan
repeated 240 times (within the decoder's limits: 256 scans at that size), so every image takes
a large fraction of a second to decode and the whole load many seconds, while the files total
under 1 MB. The test waits for the line tandem prints as it starts reading the data, then sends
the signal: SIGTERM must end the process with 143 and SIGINT with 130 (the codes of a stop; there
is nothing to checkpoint yet), before the load finishes (no "data: images ..." line), without
training a step and without a --json line. No timing is asserted: the slow load only makes sure
the signal lands inside it."""
import atexit
import io
import os
import shutil
import signal
import subprocess
import sys
import tempfile

try:
    from PIL import Image
except ImportError:
    print("SKIP: this Python lacks Pillow (Debian: python3-pil)")
    sys.exit(77)

TANDEM = os.environ.get("TANDEM_BIN", "build/tandem")


def fail(msg):
    sys.exit("FAIL: " + msg)


tmp = tempfile.mkdtemp(prefix="tandem-stop-load-")
atexit.register(shutil.rmtree, tmp, True)
b = io.BytesIO()
Image.new("L", (4096, 4096), 128).save(b, "JPEG", progressive=True, quality=90)
jpg = b.getvalue()
last = jpg.rfind(b"\xff\xda")
slow = jpg[:-2] + jpg[last:-2] * 240 + b"\xff\xd9"
data = os.path.join(tmp, "slow")
for cls in ("a", "b"):
    os.makedirs(os.path.join(data, cls))
    for i in range(4):
        with open(os.path.join(data, cls, f"{i}.jpg"), "wb") as f:
            f.write(slow)

for sig, code in ((signal.SIGTERM, 143), (signal.SIGINT, 130)):
    p = subprocess.Popen([TANDEM, "train", "--model", "mlp", "--data", data, "--image-size", "8",
                          "--steps", "1", "--threads", "1", "--no-progress", "--json",
                          "--checkpoint-dir", os.path.join(tmp, "ck")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = []
    for line in p.stderr:  # the event: tandem has started reading the data
        seen.append(line)
        if "data: reading" in line:
            p.send_signal(sig)
            break
    # the timeout is a backstop against a hang, not a measurement
    out, err = p.communicate(timeout=600)
    err = "".join(seen) + err
    name = signal.Signals(sig).name
    if not any("data: reading" in s for s in seen):
        fail(f"tandem never said it was reading the data:\n{err}")
    if p.returncode != code:
        fail(f"{name} during the load: exit {p.returncode}, expected {code}\n{err}")
    if "data: images" in err or "training " in err:
        fail(f"{name} during the load: the load went on (or training started):\n{err}")
    if out.strip():
        fail(f"{name} during the load: stdout should be empty, got {out!r}")
    if os.path.exists(os.path.join(tmp, "ck")) and os.listdir(os.path.join(tmp, "ck")):
        fail(f"{name} during the load wrote checkpoints: {os.listdir(os.path.join(tmp, 'ck'))}")
    print(f"ok: {name} while loading -> exit {code}, no training")
print("PASS")
