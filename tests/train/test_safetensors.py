"""train: `tandem train --save` writes safetensors that plain Python can parse (struct + json +
numpy, no safetensors package) and that PyTorch loads into the same BasicNet with
load_state_dict(strict=True); the loaded model's t10k accuracy equals what tandem reported."""
import gzip
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np
import torch

TANDEM_SOURCE_DIR = os.environ.get("TANDEM_SOURCE_DIR") or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(TANDEM_SOURCE_DIR, "bench", "peers"))
from torch_models import BasicNet  # noqa: E402  (the PyTorch MNIST example's network)

TANDEM = os.environ.get("TANDEM_BIN", "build/tandem")
DATA = os.environ.get("TANDEM_DATA", "/usr/share/datasets/fashion-mnist")


def fail(msg):
    sys.exit("FAIL: " + msg)


def parse(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    if n % 8 != 0:
        fail(f"header length {n} is not a multiple of 8")
    header = json.loads(raw[8:8 + n])
    if list(header) != sorted(header):
        fail(f"header keys are not sorted: {list(header)}")
    data = raw[8 + n:]
    tensors, end = {}, 0
    for name, t in header.items():
        if name == "__metadata__":
            continue
        if t["dtype"] != "F32":
            fail(f"{name}: dtype {t['dtype']}")
        a, b = t["data_offsets"]
        arr = np.frombuffer(data[a:b], dtype=np.float32)
        if arr.size != int(np.prod(t["shape"])):
            fail(f"{name}: {arr.size} floats for shape {t['shape']}")
        tensors[name] = arr.reshape(t["shape"])
        end = max(end, b)
    if end != len(data):
        fail(f"data section has {len(data)} bytes, tensors cover {end}")
    return header, tensors


def load_idx(path):
    with gzip.open(path, "rb") as f:
        raw = f.read()
    magic, n = struct.unpack(">II", raw[:8])
    if magic == 0x803:
        return np.frombuffer(raw[16:], dtype=np.uint8).reshape(n, 28, 28)
    return np.frombuffer(raw[8:], dtype=np.uint8)


def main():
    if not os.path.isdir(DATA):
        print(f"SKIP: Fashion-MNIST not installed at {DATA}")
        sys.exit(77)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "w.safetensors")
        p = subprocess.run([TANDEM, "train", "--model", "basicnet", "--data", DATA, "--steps",
                            "60", "--batch", "32", "--threads", "1", "--no-progress", "--json",
                            "--save", out], capture_output=True, text=True)
        if p.returncode != 0:
            fail(f"tandem train exited {p.returncode}:\n{p.stderr}")
        report = json.loads(p.stdout.strip().splitlines()[-1])
        header, tensors = parse(out)

    model = BasicNet()
    want = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in tensors.items()}
    if want != got:
        fail(f"names/shapes differ from PyTorch's state_dict:\n tandem {got}\n torch  {want}")
    if header["__metadata__"].get("format") != "pt":
        fail(f"metadata {header['__metadata__']}")
    total = sum(v.size for v in tensors.values())
    if total != report["params"]:
        fail(f"file holds {total} parameters, tandem reported {report['params']}")
    model.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in tensors.items()},
                          strict=True)
    model.eval()

    images = load_idx(os.path.join(DATA, "t10k-images-idx3-ubyte.gz"))
    labels = load_idx(os.path.join(DATA, "t10k-labels-idx1-ubyte.gz"))
    x = (torch.from_numpy(images.astype(np.float32)).unsqueeze(1) / 255.0 - 0.2860) / 0.3530
    with torch.no_grad():
        pred = torch.cat([model(x[i:i + 1000]).argmax(1) for i in range(0, 10000, 1000)])
    acc = 100.0 * (pred.numpy() == labels).mean()
    print(f"torch accuracy of tandem's weights {acc:.2f}%, tandem reported "
          f"{report['test_acc']:.2f}% ({total} parameters)")
    # float rounding may flip an argmax near a tie; a couple of samples at most
    if abs(acc - report["test_acc"]) > 0.03:
        fail(f"torch accuracy {acc:.2f}% != tandem's {report['test_acc']:.2f}%")
    if acc < 50:
        fail(f"after 60 steps accuracy is only {acc:.2f}%: the weights are not trained")
    print("test_safetensors: ok")


if __name__ == "__main__":
    main()
