#!/usr/bin/env bash
# --precision tf32 and bf16 on the GPU, checked bit for bit as fp32 is (test_gpu_train.sh):
#   - each really changes the arithmetic: its weights after 40 steps differ from fp32's, and
#     from each other's, yet stay close to fp32's (the same training, rounded differently);
#   - two runs give the same weights;
#   - 1 process (--batch 16 --accum 4), 2 processes (--accum 2) and 4 processes sharing the GPU
#     give the same weights (global batch 64, dropout on; CUDA IPC reduce);
#   - a bf16 run's checkpoint (fp32 weights and optimizer state) resumes on the CPU.
# Skips (77) without a CUDA device or without the CUDA backend.
set -euo pipefail
. "$(dirname "$0")/gpu_lib.sh"
gpu_or_skip --precision bf16 --model mlp7
common=(--device cuda --model basicnet --data "$TANDEM_DATA" --seed 7 --lr 1e-3 --no-progress)

run fp32 "$TANDEM_BIN" train "${common[@]}" --steps 40 --batch 64 --save "$work/fp32.st"
run init "$TANDEM_BIN" train "${common[@]}" --steps 1 --lr 0 --batch 64 --save "$work/init.st"
for p in tf32 bf16; do
  run "$p-a" "$TANDEM_BIN" train "${common[@]}" --precision $p --steps 40 --batch 64 --json \
      --save "$work/$p-a.st"
  grep -q '"precision":"'$p'"' "$work/$p-a.log" \
    || { echo "FAIL: --precision $p: the JSON summary does not say $p"; exit 1; }
  grep -q "$p gemms" "$work/$p-a.log" \
    || { echo "FAIL: --precision $p: the training line does not name $p gemms"; exit 1; }
  run "$p-b" "$TANDEM_BIN" train "${common[@]}" --precision $p --steps 40 --batch 64 \
      --save "$work/$p-b.st"
  same "$p-a.st" "$p-b.st" "$p: two runs give the same weights"
  if cmp -s "$work/fp32.st" "$work/$p-a.st"; then
    echo "FAIL: --precision $p gave fp32's bits: the precision was not applied"; exit 1
  fi
  run "$p-w1" "$TANDEM_BIN" train "${common[@]}" --precision $p --steps 40 --batch 16 --accum 4 \
      --save "$work/$p-w1.st"
  run "$p-w2" "$TANDEM_BIN" launch --standalone --nproc-per-node 2 -- \
      "$TANDEM_BIN" train "${common[@]}" --precision $p --steps 40 --batch 16 --accum 2 \
      --save "$work/$p-w2.st"
  run "$p-w4" "$TANDEM_BIN" launch --standalone --nproc-per-node 4 -- \
      "$TANDEM_BIN" train "${common[@]}" --precision $p --steps 40 --batch 16 \
      --save "$work/$p-w4.st"
  same "$p-w1.st" "$p-w2.st" "$p: 1 process (accum 4) == 2 processes (accum 2)"
  same "$p-w1.st" "$p-w4.st" "$p: 1 process (accum 4) == 4 processes sharing the GPU"
done
if cmp -s "$work/tf32-a.st" "$work/bf16-a.st"; then
  echo "FAIL: tf32 and bf16 gave the same bits"; exit 1
fi

# a bf16 checkpoint is fp32 state: it resumes on the CPU
run bf16-half "$TANDEM_BIN" train "${common[@]}" --precision bf16 --steps 20 --batch 64 \
    --checkpoint-dir "$work/ck"
rm -f "$work/ck/ckpt-40.tdck"
cpu_common=("${common[@]/cuda/cpu}")
run bf16-oncpu "$TANDEM_BIN" train "${cpu_common[@]}" --threads 2 --steps 40 --batch 64 \
    --checkpoint-dir "$work/ck" --resume --save "$work/bf16-oncpu.st"
grep -q "resuming from .*ckpt-20.tdck at step 20" "$work/bf16-oncpu.log" \
  || { echo "FAIL: the CPU did not resume the bf16 checkpoint"; cat "$work/bf16-oncpu.log"; exit 1; }

"${PYTHON:-python3}" - "$work" "$GPU_LIB_DIR" <<'PY'
import sys
import numpy as np
sys.path.insert(0, sys.argv[2])
from st_load import flat, load
d = sys.argv[1]
ref, init = flat(load(f"{d}/fp32.st")), flat(load(f"{d}/init.st"))
travel = float(np.abs(ref - init).mean())  # how far fp32's 40 steps moved the weights
# AdamW's steps are lr-sized whatever the gradient's size, so rounding that flips the sign of a
# small gradient moves a weight by a whole step: the runs part by a fraction of the travel, where
# a broken gemm (or another training) would be a whole travel away or more
for name in ("tf32-a", "bf16-a", "bf16-oncpu"):
    w = flat(load(f"{d}/{name}.st"))
    assert np.isfinite(w).all(), f"{name}: non-finite weights"
    diff = float(np.abs(w - ref).mean())
    print(f"ok: {name}: mean |w - w_fp32| = {diff:.2e}; fp32's 40 steps moved {travel:.2e}")
    assert travel > 0 and diff < 0.5 * travel, f"{name} is far from the fp32 run: {diff} vs {travel}"
PY
echo "GPU precisions: tf32 and bf16 change the bits, stay deterministic across runs and worker counts, and resume on the CPU"
