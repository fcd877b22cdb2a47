"""PyTorch peer for bench_data.sh: trains on a user's data set with the recipe of
`tandem train --data`, and prints one JSON line with the same metrics.

It reads the same files tandem reads (a CSV, a .npz, an X.npy,Y.npy pair, an image folder of
PNG/JPEG or a DIR with train/ and test/ image folders, an IDX directory), normalises as tandem
does (StandardScaler fitted on the training set for tables, ddof 0; uint8 images divided by 255,
then the training set's per-channel mean and std), builds the same model (the `mlp` preset:
flatten, linear 128, relu, linear 128, relu, linear OUTPUTS; or a tandem YAML spec), and trains
with AdamW (lr, betas 0.9/0.999, eps 1e-8, weight decay 0.01, as tandem's defaults) for the same
epochs and batch, the last batch of an epoch partial (drop_last=False). The data order and the
initial weights are PyTorch's own (seeded by --seed), not tandem's.

Output: {"peer": "pytorch", "torch": ..., "test_acc": percent (classification),
"test_loss": the mean loss over the test set (the MSE for --loss mse), "final_loss",
"samples_per_s" (training steps only), "wall_s" (load, train, evaluate), "steps", ...}

usage: torch_tabular.py --data PATH [--val-data PATH] [--target COL] [--model mlp|SPEC.yaml]
           [--loss cross-entropy|mse|bce] [--epochs N] [--batch B] [--lr F] [--seed S]
           [--threads T]"""
import argparse
import gzip
import json
import os
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

IMAGE_EXT = (".png", ".jpg", ".jpeg")


# ---- data: the same PATH forms as tandem train --data ----

def read_csv(path, target):
    with open(path) as f:
        header = f.readline().rstrip("\r\n").split(",")
    try:
        [float(v) for v in header]
        header, skip = None, 0
    except ValueError:
        skip = 1
    raw = np.loadtxt(path, delimiter=",", skiprows=skip, dtype=np.float64, ndmin=2)
    ncol = raw.shape[1]
    if target is None:
        t = ncol - 1
    elif header is not None and target in header:
        t = header.index(target)
    else:
        t = int(target)
    x = np.delete(raw, t, axis=1).astype(np.float32)
    return x, raw[:, t]


def read_image_folder(d):
    classes = sorted(c for c in os.listdir(d) if os.path.isdir(os.path.join(d, c)))
    from PIL import Image  # only image folders need Pillow
    xs, ys = [], []
    for k, c in enumerate(classes):
        for name in sorted(os.listdir(os.path.join(d, c))):
            if name.lower().endswith(IMAGE_EXT):
                img = Image.open(os.path.join(d, c, name)).convert("L")
                xs.append(np.asarray(img, dtype=np.uint8)[None])
                ys.append(k)
    return np.stack(xs), np.array(ys, dtype=np.int64)


def read_idx_dir(d, part):
    prefix = "train" if part == "train" else "t10k"

    def rd(name, off):
        p = os.path.join(d, name)
        opener = gzip.open if os.path.exists(p + ".gz") else open
        with opener(p + ".gz" if os.path.exists(p + ".gz") else p, "rb") as f:
            return np.frombuffer(f.read(), np.uint8, offset=off)
    y = rd(f"{prefix}-labels-idx1-ubyte", 8).astype(np.int64)
    x = rd(f"{prefix}-images-idx3-ubyte", 16)
    side = int(round((len(x) // len(y)) ** 0.5))
    return x.reshape(len(y), 1, side, -1), y


def load(path, target, part):
    """(x, y) for one PATH; part says which half of a file holding both (npz x_train/x_test,
    DIR/train + DIR/test, IDX train/t10k) is wanted."""
    if "," in path:
        xp, yp = path.split(",", 1)
        return np.load(xp), np.load(yp)
    if path.endswith(".csv"):
        return read_csv(path, target)
    if path.endswith(".npz"):
        z = np.load(path)
        if "x" in z.files:
            return z["x"], z[target or "y"]
        return z[f"x_{part}"], z[f"y_{part}"]
    if os.path.isdir(path):
        if any(f.startswith("train-images-idx3-ubyte") for f in os.listdir(path)):
            return read_idx_dir(path, part)
        sub = os.path.join(path, part)
        if part == "test" and not os.path.isdir(sub):
            sub = os.path.join(path, "val")
        if os.path.isdir(os.path.join(path, "train")):
            return read_image_folder(sub)
        return read_image_folder(path)
    raise SystemExit(f"torch_tabular: cannot read {path}")


def normalise(x_tr, x_te):
    """StandardScaler (ddof 0) per feature for tables; per channel for images; uint8 / 255 first."""
    scale = 255.0 if x_tr.dtype == np.uint8 else 1.0
    a = x_tr.astype(np.float64) / scale
    b = x_te.astype(np.float64) / scale
    if a.ndim == 2:      # table [n, k]: per feature
        axes = (0,)
    elif a.ndim == 4:    # images [n, C, H, W]: per channel
        axes = (0, 2, 3)
    else:                # images [n, H, W]: one channel
        axes = tuple(range(a.ndim))
    mean = a.mean(axis=axes, keepdims=True)
    std = a.std(axis=axes, keepdims=True)
    std[std == 0] = 1.0
    return ((a - mean) / std).astype(np.float32), ((b - mean) / std).astype(np.float32)


# ---- models ----

def mlp(in_features, outputs):
    return nn.Sequential(nn.Flatten(), nn.Linear(in_features, 128), nn.ReLU(),
                         nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, outputs))


def from_spec(path, in_shape, outputs):
    """A tandem YAML spec (docs/model-spec.md) as an nn.Sequential; `out: outputs` allowed."""
    import yaml
    spec = yaml.safe_load(open(path))
    shape = list(spec.get("input", in_shape))
    layers = []
    for item in spec["layers"]:
        kind, args = (item, {}) if isinstance(item, str) else next(iter(item.items()))
        args = dict(args or {})
        args.pop("name", None)
        out = args.get("out")
        if out == "outputs":
            out = outputs
        if kind == "conv2d":
            k, s, p = args["kernel"], args.get("stride", 1), args.get("padding", 0)
            layers.append(nn.Conv2d(shape[0], out, k, s, p))
            shape = [out, (shape[1] + 2 * p - k) // s + 1, (shape[2] + 2 * p - k) // s + 1]
        elif kind == "maxpool2d":
            k = args["kernel"]
            s = args.get("stride", k)
            layers.append(nn.MaxPool2d(k, s))
            shape = [shape[0], (shape[1] - k) // s + 1, (shape[2] - k) // s + 1]
        elif kind == "linear":
            layers.append(nn.Linear(shape[0], out))
            shape = [out]
        elif kind in ("batchnorm", "batchnorm2d", "batchnorm1d", "batch_norm"):
            layers.append(nn.BatchNorm2d(shape[0]) if len(shape) == 3 else nn.BatchNorm1d(shape[0]))
        elif kind == "relu":
            layers.append(nn.ReLU())
        elif kind == "dropout":
            layers.append(nn.Dropout(args.get("p", 0.5)))
        elif kind == "flatten":
            layers.append(nn.Flatten())
            shape = [int(np.prod(shape))]
        elif kind == "log_softmax":
            layers.append(nn.LogSoftmax(dim=1))
        else:
            raise SystemExit(f"torch_tabular: {path}: layer kind {kind!r} not supported here")
    return nn.Sequential(*layers)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--val-data")
    ap.add_argument("--target")
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--loss", default="cross-entropy", choices=("cross-entropy", "mse", "bce"))
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    t_start = time.perf_counter()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)

    x_tr, y_tr = load(a.data, a.target, "train")
    x_te, y_te = load(a.val_data, a.target, "test") if a.val_data else load(a.data, a.target, "test")
    x_tr, x_te = normalise(x_tr, x_te)
    if a.loss == "cross-entropy":
        y_tr, y_te = y_tr.astype(np.int64), y_te.astype(np.int64)
        outputs = int(max(y_tr.max(), y_te.max())) + 1
    else:
        y_tr, y_te = y_tr.astype(np.float32), y_te.astype(np.float32)
        if y_tr.ndim == 1:
            y_tr, y_te = y_tr[:, None], y_te[:, None]
        outputs = y_tr.shape[1]
    xt, yt = torch.from_numpy(x_tr), torch.from_numpy(y_tr)
    xe, ye = torch.from_numpy(x_te), torch.from_numpy(y_te)
    in_shape = list(x_tr.shape[1:])
    if a.model == "mlp":
        net = mlp(int(np.prod(in_shape)), outputs)
    else:
        net = from_spec(a.model, in_shape, outputs)
    log_probs = isinstance(net[-1], nn.LogSoftmax)

    def loss_fn(out, y, reduction="mean"):
        if a.loss == "mse":
            return F.mse_loss(out, y, reduction=reduction)
        if a.loss == "bce":
            return F.binary_cross_entropy_with_logits(out, y, reduction=reduction)
        if log_probs:
            return F.nll_loss(out, y, reduction=reduction)
        return F.cross_entropy(out, y, reduction=reduction)

    opt = torch.optim.AdamW(net.parameters(), lr=a.lr, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=a.weight_decay)
    g = torch.Generator().manual_seed(a.seed)
    n = len(xt)
    steps, train_s, loss = 0, 0.0, torch.zeros(())
    for _ in range(a.epochs):
        net.train()
        perm = torch.randperm(n, generator=g)
        t0 = time.perf_counter()
        for i in range(0, n, a.batch):
            idx = perm[i:i + a.batch]
            opt.zero_grad()
            loss = loss_fn(net(xt[idx]), yt[idx])
            loss.backward()
            opt.step()
            steps += 1
        train_s += time.perf_counter() - t0

    net.eval()
    total, correct = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(xe), 1024):
            out = net(xe[i:i + 1024])
            y = ye[i:i + 1024]
            total += loss_fn(out, y, reduction="sum").item()
            if a.loss == "cross-entropy":
                correct += int((out.argmax(1) == y).sum())
    # mean loss per sample; MSE and BCE also per output, as MSELoss / BCEWithLogitsLoss mean
    per = len(xe) * (1 if a.loss == "cross-entropy" else ye.shape[1])
    r = {"peer": "pytorch", "torch": torch.__version__.split("+")[0], "model": a.model,
         "loss": a.loss, "epochs": a.epochs, "batch": a.batch, "lr": a.lr, "seed": a.seed,
         "threads": a.threads, "steps": steps, "train_n": n, "test_n": len(xe),
         "final_loss": round(loss.item(), 6), "test_loss": total / per,
         "samples_per_s": round(steps and a.epochs * n / train_s, 1),
         "wall_s": round(time.perf_counter() - t_start, 3)}
    if a.loss == "cross-entropy":
        r["test_acc"] = 100.0 * correct / len(xe)
    print(json.dumps(r))


if __name__ == "__main__":
    main()
