"""Writes CIFAR-shaped data as a .npy pair: X.npy uint8 [2048, 3, 32, 32], Y.npy int64 [2048]
labels of 10 classes, from a fixed seed (the same files on every machine). Throughput does not
depend on the pixels: bench_train.sh, bench_gpu.sh and scripts/gpu-profile.sh train resnet-small
on it, both sides from the same files.

usage: cifar_like.py X.npy Y.npy
"""
import sys

import numpy as np

rng = np.random.default_rng(0)
np.save(sys.argv[1], rng.integers(0, 256, (2048, 3, 32, 32), dtype=np.uint8))
np.save(sys.argv[2], rng.integers(0, 10, 2048).astype(np.int64))
