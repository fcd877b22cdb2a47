"""Writes a large generated data set as a features/labels .npy pair, without holding it in memory.

usage: big_npy.py OUT_DIR GIGABYTES FASHION_MNIST_DIR

x.npy is float32 [n, 1, 28, 28] (3136 bytes a sample) filled with Fashion-MNIST's training
images, each copy shifted by a different small amount of noise so no two samples are equal;
y.npy is int64 [n] with their labels. Also writes x_small.npy/y_small.npy: the first 60,000
samples, small enough (188 MB) for tandem to read into memory, as the in-memory reference.
"""
import os
import sys

import numpy as np

from export_sklearn import read_idx  # this directory's Fashion-MNIST IDX reader


def main():
    out, gb, fm = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    os.makedirs(out, exist_ok=True)
    images = read_idx(os.path.join(fm, "train-images-idx3-ubyte.gz"), 16, (-1, 28, 28))
    images = images.astype(np.float32) / 255.0
    labels = read_idx(os.path.join(fm, "train-labels-idx1-ubyte.gz"), 8, (-1,)).astype(np.int64)
    per = 28 * 28 * 4
    n = int(gb * 1e9) // per
    base = len(images)
    x = np.lib.format.open_memmap(os.path.join(out, "x.npy"), mode="w+", dtype=np.float32,
                                  shape=(n, 1, 28, 28))
    y = np.lib.format.open_memmap(os.path.join(out, "y.npy"), mode="w+", dtype=np.int64,
                                  shape=(n,))
    rng = np.random.default_rng(0)
    chunk = base
    for start in range(0, n, chunk):
        k = min(chunk, n - start)
        noise = rng.standard_normal((k, 28, 28), dtype=np.float32) * 0.02
        x[start:start + k, 0] = images[:k] + noise
        y[start:start + k] = labels[:k]
        if start == 0:
            np.save(os.path.join(out, "x_small.npy"), np.ascontiguousarray(x[:k]))
            np.save(os.path.join(out, "y_small.npy"), np.ascontiguousarray(y[:k]))
    x.flush()
    y.flush()
    del x, y
    print(f"{out}/x.npy: {n} samples, {n * per / 1e9:.1f} GB")


if __name__ == "__main__":
    main()
