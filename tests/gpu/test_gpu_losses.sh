#!/usr/bin/env bash
# Real-valued targets on the GPU (tandem train --device cuda --loss mse|bce): a regression with two
# outputs on features of scales 0.1 to 10, and three labels of a multi-label task, each from a
# .npy pair with a held-out fraction:
#   - each learns its data as the CPU does: the held-out MSE far below the targets' variance
#     (the loss of predicting their mean) and within 30% of the CPU's; the held-out label
#     accuracy above 90% and within 5 points of the CPU's;
#   - 20 steps on the GPU end where 20 on the CPU do, to float rounding (within 2% of how far
#     steps 2-20 move the weights): the targets reach the loss in their samples' rows;
#   - 1 process (accum 4) == 2 processes sharing the GPU, bit for bit, with epochs that end in a
#     short and an empty micro-batch (their target rows are padding, not a sample's), and the
#     same streamed a step at a time (TANDEM_GPU_DATA=stream: the targets in the window).
# The data are made here with Python's standard library, fixed seeds. Skips (77) without a CUDA
# device or without the CUDA backend.
set -euo pipefail
. "$(dirname "$0")/gpu_lib.sh"
gpu_or_skip --model mlp7

"${PYTHON:-python3}" - "$work" <<'PY'
import math, random, struct, sys
d = sys.argv[1]
random.seed(9)
n, f = 600, 8
def npy(path, shape, vals):
    hdr = "{'descr': '<f4', 'fortran_order': False, 'shape': %s, }" % (str(shape),)
    hdr += " " * (63 - (len(hdr) + 10) % 64) + "\n"
    with open(path, "wb") as fh:
        fh.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(hdr)) + hdr.encode()
                 + struct.pack("<%df" % len(vals), *vals))
X, R, L = [], [], []
for i in range(n):
    z = [random.gauss(0, 1) for j in range(f)]
    X += [z[j] * 10 ** (j % 3 - 1) for j in range(f)]
    R += [z[0] + 0.5 * z[1] * z[2] + 0.1 * random.gauss(0, 1), 3 * math.tanh(z[3] - z[4]) + 10]
    L += [float(z[0] > 0), float(z[1] + z[2] > 0.5), float(z[5] * z[6] > 0)]
npy(f"{d}/x.npy", (n, f), X)
npy(f"{d}/r.npy", (n, 2), R)
npy(f"{d}/l.npy", (n, 3), L)
var = sum(sum((R[2 * i + k] - sum(R[k::2]) / n) ** 2 for i in range(n)) / n for k in range(2)) / 2
open(f"{d}/variance", "w").write("%.6f\n" % var)
PY
cat >"$work/mlp.yaml" <<'YAML'
layers:
  - linear: {out: 64}
  - gelu
  - linear: {out: 64}
  - gelu
  - linear: {out: outputs}
YAML

last() { # log key -> the last held-out value after KEY ("test loss", "test accuracy")
  grep -o "$2 [0-9.]*" "$work/$1.log" | tail -1 | grep -o '[0-9.]*$' || echo -1
}
check() { # name loss targets.npy
  local name=$1 loss=$2 data="$work/x.npy,$work/$3"
  local args=(--model "$work/mlp.yaml" --data "$data" --loss "$loss" --val-fraction 0.2 --seed 3
              --lr 3e-3 --no-progress)
  run "$name-gpu" "$TANDEM_BIN" train --device cuda "${args[@]}" --epochs 30 --batch 32
  run "$name-cpu" "$TANDEM_BIN" train --device cpu --threads 2 "${args[@]}" --epochs 30 --batch 32
  if [ "$loss" = mse ]; then
    local g c v
    g=$(last "$name-gpu" "test loss") c=$(last "$name-cpu" "test loss") v=$(cat "$work/variance")
    echo "$name: held-out MSE GPU $g, CPU $c (the targets' variance $v)"
    awk -v g="$g" -v c="$c" -v v="$v" \
      'BEGIN { exit !(g >= 0 && c > 0 && g < v / 5 && c < v / 5 && g < 1.3 * c && c < 1.3 * g) }' \
      || { echo "FAIL: $name: held-out MSE GPU $g / CPU $c (want both < $v / 5, within 30%)"
           tail -5 "$work/$name-gpu.log"; exit 1; }
  else
    local g c
    g=$(last "$name-gpu" "test accuracy") c=$(last "$name-cpu" "test accuracy")
    echo "$name: held-out label accuracy GPU $g%, CPU $c% (chance 50%)"
    awk -v g="$g" -v c="$c" 'BEGIN { exit !(g >= 90 && c >= 90 && g - c < 5 && c - g < 5) }' \
      || { echo "FAIL: $name: GPU $g% / CPU $c% (want both >= 90%, within 5 points)"
           tail -5 "$work/$name-gpu.log"; exit 1; }
  fi
  run "$name-g20" "$TANDEM_BIN" train --device cuda "${args[@]}" --batch 32 --steps 20 \
      --save "$work/$name-g20.st"
  run "$name-c20" "$TANDEM_BIN" train --device cpu "${args[@]}" --batch 32 --steps 20 \
      --save "$work/$name-c20.st"
  run "$name-c1" "$TANDEM_BIN" train --device cpu "${args[@]}" --batch 32 --steps 1 \
      --save "$work/$name-c1.st"
  near "$name-g20.st" "$name-c20.st" "$name-c1.st" 0.02 \
      "$name: 20 steps on the GPU end near the CPU's 20 (against its steps 2-20)"
  # micro-batches of 14, global batch 56: the 480 training samples end in slots 14, 14, 4, 0
  run "$name-w1" "$TANDEM_BIN" train --device cuda "${args[@]}" --batch 14 --steps 18 --accum 4 \
      --save "$work/$name-w1.st"
  run "$name-w2" "$TANDEM_BIN" launch --standalone --nproc-per-node 2 -- \
      "$TANDEM_BIN" train --device cuda "${args[@]}" --batch 14 --steps 18 --accum 2 \
      --save "$work/$name-w2.st"
  same "$name-w1.st" "$name-w2.st" "$name: 1 process (accum 4) == 2 processes sharing the GPU"
  run "$name-s1" env TANDEM_GPU_DATA=stream "$TANDEM_BIN" train --device cuda "${args[@]}" \
      --batch 14 --steps 18 --accum 4 --save "$work/$name-s1.st"
  same "$name-w1.st" "$name-s1.st" "$name: streamed == resident, bit for bit"
}
check regression mse r.npy
check multilabel bce l.npy
echo "GPU: regression (mse) and multi-label (bce) targets train on the device as on the CPU,"
echo "reproducibly"
