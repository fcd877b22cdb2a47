#!/usr/bin/env bash
# train: basicnet, 2 epochs, AdamW lr 1e-3, batch 64, normalised with the PyTorch recipe's
# --mean 0.2860 --std 0.3530, reaches >= 90% test accuracy on Fashion-MNIST (PyTorch's DDP run
# of the same recipe reaches 90.1%). It gets
# tests/train/properties.cmake with a 900 s timeout and RUN_SERIAL (it wants both cores).
set -euo pipefail
data=${TANDEM_DATA:-/usr/share/datasets/fashion-mnist}
if [ ! -d "$data" ]; then
  echo "SKIP: Fashion-MNIST not installed at $data (apt-get install dataset-fashion-mnist)"
  exit 77
fi
out=$("$TANDEM_BIN" train --model basicnet --data "$data" --mean 0.2860 --std 0.3530 \
      --epochs 2 --batch 64 --lr 1e-3 \
      --optimizer adamw --no-progress --json | tail -n 1)
echo "$out"
"$PYTHON" - "$out" <<'PY'
import json, sys
r = json.loads(sys.argv[1])
assert r["steps"] == 1876, f"2 epochs of 60000/64 should be 1876 steps, got {r['steps']}"
print(f"test accuracy {r['test_acc']:.2f}% after {r['steps']} steps, "
      f"{r['samples_per_s']:.0f} samples/s, {r['wall_s']:.0f} s")
if not r["test_acc"] >= 90.0:
    sys.exit(f"FAIL: test accuracy {r['test_acc']:.2f}% < 90%")
PY
