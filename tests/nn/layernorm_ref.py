"""Helper for test_layernorm_eps.c: torch.nn.functional.layer_norm in float64 on the C test's
float32 inputs, row by row, forward and backward. argv: DIR ROWS D EPS. Reads DIR/x.bin,
w.bin, b.bin, dy.bin (float32, x and dy [ROWS, D]); writes float64 [ROWS, D] files y.ref
(the output), dx.ref (d(sum y*dy)/dx), dw.ref and db.ref (the weight and bias gradients of
each row alone). Exit 77 when torch cannot be imported."""
import os
import sys

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError as e:
    print(f"SKIP: torch/numpy not importable ({e}); install python3-torch python3-numpy")
    sys.exit(77)

d, rows, dim, eps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
load = lambda n, shape: torch.from_numpy(
    np.fromfile(os.path.join(d, n), dtype=np.float32).astype(np.float64).reshape(shape))
x, dy = load("x.bin", (rows, dim)), load("dy.bin", (rows, dim))
w0, b0 = load("w.bin", (dim,)), load("b.bin", (dim,))
out = {k: [] for k in ("y", "dx", "dw", "db")}
for r in range(rows):
    xr = x[r:r + 1].clone().requires_grad_(True)
    w, b = w0.clone().requires_grad_(True), b0.clone().requires_grad_(True)
    y = F.layer_norm(xr, (dim,), w, b, eps)
    (y * dy[r:r + 1]).sum().backward()
    for k, v in (("y", y), ("dx", xr.grad), ("dw", w.grad), ("db", b.grad)):
        out[k].append(v.detach().reshape(dim).numpy())
for k, v in out.items():
    np.asarray(v, dtype=np.float64).tofile(os.path.join(d, k + ".ref"))
