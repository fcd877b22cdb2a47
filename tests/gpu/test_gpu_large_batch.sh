#!/usr/bin/env bash
# Large batches on the GPU: batch 4096 and 16384 train (a max-pool backward over 2^20 channel
# planes, gathers over 16,384 rows: launch shapes past CUDA's 65,535 grid.y limit are strided),
# and a batch of 16384 computes what 16 micro-batches of 1024 do (fp32: the same training to
# float rounding; a skipped row or plane would show as a gradient far off). Every precision runs
# at 4096. Skips (77) without a CUDA device or without the CUDA backend.
set -euo pipefail
. "$(dirname "$0")/gpu_lib.sh"
gpu_or_skip --model mlp7
common=(--device cuda --model basicnet --data "$TANDEM_DATA" --seed 3 --lr 1e-3 --no-progress
        --no-eval-every-epoch --json)
train() { # name args...: a run, and its JSON summary in $work/name.json
  local name=$1; shift
  run "$name" "$TANDEM_BIN" train "${common[@]}" "$@"
  grep '^{' "$work/$name.log" | tail -1 >"$work/$name.json"
}
for p in fp32 tf32 bf16; do
  train "b4096-$p" --precision $p --batch 4096 --steps 8
done
train b16384 --batch 16384 --steps 3 --save "$work/big.st"
train b1024x16 --batch 1024 --accum 16 --steps 3 --save "$work/acc.st"
train init --batch 64 --steps 1 --lr 0 --save "$work/init.st"
"${PYTHON:-python3}" - "$work" "$GPU_LIB_DIR" <<'PY'
import json, math, sys
import numpy as np
sys.path.insert(0, sys.argv[2])
from st_load import load
d = sys.argv[1]
for name in ("b4096-fp32", "b4096-tf32", "b4096-bf16", "b16384", "b1024x16"):
    r = json.load(open(f"{d}/{name}.json"))
    assert r["status"] == "ok" and r["final_loss"] is not None and math.isfinite(r["final_loss"]), r
    print(f"ok: {name}: global batch {r['global_batch']}, {r['steps']} steps, final loss "
          f"{r['final_loss']:.4f}, {r['samples_per_s']:.0f} samples/s")
big, acc, init = load(f"{d}/big.st"), load(f"{d}/acc.st"), load(f"{d}/init.st")
for k in sorted(init):  # per tensor: a wrong conv gradient would hide in fc1's 1.2M weights
    travel = float(np.abs(acc[k] - init[k]).mean())
    diff = float(np.abs(big[k] - acc[k]).mean())
    print(f"ok: {k}: batch 16384 vs 16 x 1024: mean |diff| {diff:.2e}, the 3 steps moved "
          f"{travel:.2e}")
    assert travel > 0 and diff < 0.05 * travel, f"{k}: batch 16384 differs: {diff} vs {travel}"
PY
echo "GPU large batches: 4096 in every precision, 16384 == 16 x 1024 to float rounding"
