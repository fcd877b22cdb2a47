"""Exports scikit-learn's bundled data sets (and Fashion-MNIST) in the formats `tandem train
--data` reads, for bench/bench_data.sh. The split is fixed: train_test_split(test_size=0.25,
random_state=0), stratified for the classification sets, so tandem and the PyTorch peer see the
same rows.

  OUT/breast_cancer/{train,test}.csv     30 features, header row, target column "target" (0/1)
  OUT/wine/{train,test}.csv              13 features, target 0..2
  OUT/diabetes/{train,test}.csv          10 features, real target (disease progression)
  OUT/diabetes/{x,y}_{train,test}.npy    the same rows, float32 x [n,10], float32 y [n]
  OUT/digits/{train,test}/<class>/<i>.png   8x8 greyscale PNG, values round(v*255/16)
  OUT/digits/digits.npz                  x_train uint8 [n,1,8,8] (same values), y_train int64,
                                         x_test, y_test
  with --fmnist DIR (IDX .gz files):
  OUT/fmnist/{x_train,y_train,x_test,y_test}.npy   uint8 [n,1,28,28], int64 [n]
  with --fmnist-png as well:
  OUT/fmnist_png/{train,test}/<class>/<i>.png       70,000 PNGs (about a minute)

usage: export_sklearn.py OUT [--fmnist DIR] [--fmnist-png]
Needs numpy, scikit-learn and Pillow (Debian: python3-sklearn python3-pil)."""
import argparse
import gzip
import os
import sys

import numpy as np
from PIL import Image
from sklearn.datasets import load_breast_cancer, load_diabetes, load_digits, load_wine
from sklearn.model_selection import train_test_split


def write_csv(path, x, y, names):
    """Header row of feature names plus "target"; values as repr() of the float64 (round trip)."""
    with open(path, "w") as f:
        f.write(",".join(list(names) + ["target"]) + "\n")
        for row, t in zip(x, y):
            f.write(",".join(repr(float(v)) for v in row) + "," + repr(t.item()) + "\n")


def split(x, y, stratify):
    return train_test_split(x, y, test_size=0.25, random_state=0,
                            stratify=y if stratify else None)


def export_table(out, name, bunch, classification):
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    x, y = bunch.data, bunch.target
    x_tr, x_te, y_tr, y_te = split(x, y, classification)
    names = [n.replace(",", " ") for n in bunch.feature_names]
    write_csv(os.path.join(d, "train.csv"), x_tr, y_tr, names)
    write_csv(os.path.join(d, "test.csv"), x_te, y_te, names)
    return x_tr, x_te, y_tr, y_te


def write_png_folder(root, x, y):
    """x uint8 [n,1,H,W] -> root/<class>/<i>.png, zero-padded names so sorted order = index."""
    width = len(str(len(x)))
    for c in sorted(set(int(v) for v in y)):
        os.makedirs(os.path.join(root, str(c)), exist_ok=True)
    for i, (img, c) in enumerate(zip(x, y)):
        Image.fromarray(img[0], mode="L").save(os.path.join(root, str(int(c)), f"{i:0{width}d}.png"))


def export_digits(out):
    d = os.path.join(out, "digits")
    b = load_digits()
    x = np.round(b.images * 255.0 / 16.0).astype(np.uint8).reshape(-1, 1, 8, 8)
    y = b.target.astype(np.int64)
    x_tr, x_te, y_tr, y_te = split(x, y, True)
    write_png_folder(os.path.join(d, "train"), x_tr, y_tr)
    write_png_folder(os.path.join(d, "test"), x_te, y_te)
    np.savez(os.path.join(d, "digits.npz"), x_train=x_tr, y_train=y_tr, x_test=x_te, y_test=y_te)
    return len(y_tr), len(y_te)


def read_idx(path, offset, shape):
    with gzip.open(path) as f:
        return np.frombuffer(f.read(), np.uint8, offset=offset).reshape(shape)


def export_fmnist(out, src, png):
    d = os.path.join(out, "fmnist")
    os.makedirs(d, exist_ok=True)
    sets = {}
    for part, prefix in (("train", "train"), ("test", "t10k")):
        x = read_idx(os.path.join(src, f"{prefix}-images-idx3-ubyte.gz"), 16, (-1, 1, 28, 28))
        y = read_idx(os.path.join(src, f"{prefix}-labels-idx1-ubyte.gz"), 8, (-1,)).astype(np.int64)
        np.save(os.path.join(d, f"x_{part}.npy"), np.ascontiguousarray(x))
        np.save(os.path.join(d, f"y_{part}.npy"), y)
        sets[part] = (x, y)
    if png:
        for part, (x, y) in sets.items():
            write_png_folder(os.path.join(out, "fmnist_png", part), x, y)
    return len(sets["train"][1]), len(sets["test"][1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--fmnist", metavar="DIR", help="Fashion-MNIST IDX directory to export too")
    ap.add_argument("--fmnist-png", action="store_true", help="also a PNG folder of Fashion-MNIST")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    counts = {}
    for name, loader, cls in (("breast_cancer", load_breast_cancer, True),
                              ("wine", load_wine, True)):
        x_tr, x_te, _, _ = export_table(a.out, name, loader(), cls)
        counts[name] = (len(x_tr), len(x_te))
    x_tr, x_te, y_tr, y_te = export_table(a.out, "diabetes", load_diabetes(), False)
    d = os.path.join(a.out, "diabetes")
    for n, v in (("x_train", x_tr), ("x_test", x_te), ("y_train", y_tr), ("y_test", y_te)):
        np.save(os.path.join(d, n + ".npy"), np.ascontiguousarray(v, dtype=np.float32))
    counts["diabetes"] = (len(x_tr), len(x_te))
    counts["digits"] = export_digits(a.out)
    if a.fmnist:
        counts["fmnist"] = export_fmnist(a.out, a.fmnist, a.fmnist_png)
    for k, (n_tr, n_te) in counts.items():
        print(f"{k}: {n_tr} train, {n_te} test", file=sys.stderr)


if __name__ == "__main__":
    main()
