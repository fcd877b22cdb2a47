"""optim: tandem's SGD and AdamW against torch.optim 1.13 on the same params and gradients.

Drives optim_helper (raw float files in, final params + optimizer state out) and compares
elementwise within 1e-6 relative (plus a tiny absolute floor for values near zero)."""
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

HELPER = os.path.join(os.environ.get("TANDEM_BUILD_DIR", "build"), "tests", "optim",
                      "optim_helper")
N = 10007  # odd, so no chunking coincidence hides an off-by-one
RTOL, ATOL = 1e-6, 1e-9


def run_case(tmp, name, kind, steps, lr, wd, momentum=0.0, dampening=0.0, nesterov=False):
    rng = np.random.default_rng(abs(hash(name)) % 2**32)
    params = rng.standard_normal(N).astype(np.float32)
    grads = (rng.standard_normal((steps, N)) * 0.1).astype(np.float32)
    pfile, gfile, ofile = (os.path.join(tmp, f"{name}.{x}") for x in ("p", "g", "out"))
    params.tofile(pfile)
    grads.tofile(gfile)
    subprocess.run([HELPER, kind, repr(lr), repr(wd), repr(momentum), repr(dampening),
                    "1" if nesterov else "0", str(steps), str(N), pfile, gfile, ofile],
                   check=True)
    out = np.fromfile(ofile, dtype=np.float32)

    p = torch.nn.Parameter(torch.from_numpy(params.copy()))
    if kind == "adamw":
        opt = torch.optim.AdamW([p], lr=lr, weight_decay=wd, foreach=False)
    else:
        opt = torch.optim.SGD([p], lr=lr, weight_decay=wd, momentum=momentum,
                              dampening=dampening, nesterov=nesterov, foreach=False)
    for s in range(steps):
        p.grad = torch.from_numpy(grads[s].copy())
        opt.step()
    want = [p.detach().numpy()]
    st = opt.state[p]
    if kind == "adamw":
        want += [st["exp_avg"].numpy(), st["exp_avg_sq"].numpy()]
    elif momentum != 0:
        want += [st["momentum_buffer"].numpy()]
    want = np.concatenate(want)
    if out.shape != want.shape:
        sys.exit(f"FAIL {name}: tandem wrote {out.shape[0]} floats, torch has {want.shape[0]}")
    err = np.abs(out.astype(np.float64) - want) / (np.abs(want) + ATOL / RTOL)
    worst = int(np.argmax(err))
    bitwise = int(np.sum(out.view(np.uint32) == want.view(np.uint32)))
    print(f"{name}: max rel err {err[worst]:.3g} at {worst} (tandem {out[worst]!r}, "
          f"torch {want[worst]!r}); {bitwise}/{out.size} bitwise equal")
    if not err[worst] <= RTOL:
        sys.exit(f"FAIL {name}: relative error {err[worst]:.3g} > {RTOL}")
    # and the update moved the params at all (a no-op optimizer would pass a loose comparison)
    if np.allclose(out[:N], params, rtol=0, atol=0):
        sys.exit(f"FAIL {name}: params did not change")


def main():
    if not os.path.exists(HELPER):
        sys.exit(f"FAIL: optim_helper not found at {HELPER}; build the tests first")
    with tempfile.TemporaryDirectory() as tmp:
        run_case(tmp, "adamw_1step", "adamw", 1, 1e-3, 0.01)
        run_case(tmp, "adamw_5steps", "adamw", 5, 3e-3, 0.1)
        run_case(tmp, "sgd_plain", "sgd", 3, 0.1, 0.0)
        run_case(tmp, "sgd_momentum_wd", "sgd", 4, 0.05, 1e-3, momentum=0.9)
        run_case(tmp, "sgd_dampening", "sgd", 4, 0.05, 0.0, momentum=0.9, dampening=0.3)
        run_case(tmp, "sgd_nesterov_wd", "sgd", 5, 0.05, 5e-4, momentum=0.9, nesterov=True)
    print("test_optim_torch: ok")


if __name__ == "__main__":
    main()
