#!/usr/bin/env bash
# BasicNet on the GPU reaches >= 90% test accuracy in 2 epochs (batch 64, AdamW 1e-3, the PyTorch
# recipe's --mean 0.2860 --std 0.3530 as tests/train/test_accuracy.sh) in every precision: fp32,
# tf32 and bf16. Skips (77) without a CUDA device or without the CUDA backend.
set -euo pipefail
. "$(dirname "$0")/gpu_lib.sh"
gpu_or_skip --model mlp7
for p in fp32 tf32 bf16; do
  run "acc-$p" "$TANDEM_BIN" train --device cuda --precision $p --model basicnet \
      --data "$TANDEM_DATA" --mean 0.2860 --std 0.3530 --epochs 2 --batch 64 --lr 1e-3 \
      --no-progress --json
  grep -v '^{' "$work/acc-$p.log"
  grep '^{' "$work/acc-$p.log" | tail -1 >"$work/result-$p.json"
  "${PYTHON:-python3}" - "$work/result-$p.json" "$p" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"BasicNet on {r['device']} ({r['precision']}): {r['test_acc']:.2f}% after {r['steps']} "
      f"steps, {r['samples_per_s']:.0f} samples/s, {r['wall_s']:.1f} s")
assert r["device"] == "cuda" and r["precision"] == sys.argv[2]
assert r["test_acc"] >= 90.0, "test accuracy below 90%"
PY
done
