#!/usr/bin/env bash
# The user's own data and layers on the GPU (tandem train --device cuda):
#   - a CSV table (float features, per-feature mean and std, a held-out fraction) through
#     linear, LayerNorm, GELU, tanh; 3-channel uint8 images in .npy through conv, GELU, average
#     pooling, LayerNorm, global average pooling, sigmoid; and the same images through the
#     resnet-small preset (BatchNorm, residual blocks; evaluated with the running statistics):
#     each learns its data (test accuracy above 90% where chance is 33%), as the CPU does;
#   - 20 steps on the GPU end where 20 on the CPU do, to float rounding (within 2% of how far
#     steps 2-20 move the weights): each channel or feature normalised as the CPU does;
#   - each is bitwise reproducible: two runs, and 1 process (accum 4) == 2 and 4 processes
#     sharing the GPU, with epochs that end in a short and an empty micro-batch;
#   - streamed a step at a time (TANDEM_GPU_DATA=stream: what a set too large for the device
#     does), by 1 and 2 processes, it trains and evaluates to the resident set's bits;
#   - a GPU checkpoint resumes on the CPU and ends near the all-GPU run.
# The data are made here (awk and Python's standard library): separable classes, fixed seeds.
# Skips (77) without a CUDA device or without the CUDA backend.
set -euo pipefail
. "$(dirname "$0")/gpu_lib.sh"
gpu_or_skip --model mlp7

# 900 rows x 12 features, 3 classes: class k shifts features k, k+3, k+6 by 2.5 (noise ~N(0,1)
# from Irwin-Hall), the features on scales from 0.1 to 1000 (the normalisation must work)
awk 'BEGIN { srand(17); printf "f0"; for (j = 1; j < 12; j++) printf ",f%d", j; print ",label";
  for (i = 0; i < 900; i++) { k = i % 3;
    for (j = 0; j < 12; j++) { z = 0; for (u = 0; u < 12; u++) z += rand(); z -= 6;
      if (j % 3 == k) z += 2.5; printf (j ? ",%.6g" : "%.6g"), z * 10 ^ (j % 5 - 1) }
    print "," k } }' >"$work/table.csv"
cat >"$work/table.yaml" <<'YAML'
layers:
  - linear: {out: 32}
  - layernorm
  - gelu
  - linear: {out: 16}
  - tanh
  - linear: {out: outputs}
YAML
# 600 images 3 x 16 x 16 uint8: class k has a bright disc in channel k on noise
"${PYTHON:-python3}" - "$work" <<'PY'
import random, struct, sys
d = sys.argv[1]
random.seed(5)
n, c, h, w = 600, 3, 16, 16
def npy(path, dtype, shape, data):
    hdr = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (dtype, str(shape))
    hdr += " " * (63 - (len(hdr) + 10) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(hdr)) + hdr.encode() + data)
x, y = bytearray(), []
for i in range(n):
    k = i % 3
    cy, cx = random.randint(5, 10), random.randint(5, 10)
    for ch in range(c):
        for r in range(h):
            for q in range(w):
                v = random.randint(0, 60) + 30 * ch  # each channel its own mean
                if ch == k and (r - cy) ** 2 + (q - cx) ** 2 <= 10:
                    v += 120
                x.append(v)
    y.append(k)
npy(f"{d}/x.npy", "|u1", (n, c, h, w), bytes(x))
npy(f"{d}/y.npy", "<i8", (n,), struct.pack("<%dq" % n, *y))
PY
cat >"$work/images.yaml" <<'YAML'
layers:
  - conv2d: {out: 8, kernel: 3, padding: 1}
  - gelu
  - avgpool2d: {kernel: 2}
  - layernorm
  - conv2d: {out: 16, kernel: 3, padding: 1}
  - gelu
  - global_avgpool
  - linear: {out: 16}
  - sigmoid
  - linear: {out: outputs}
YAML

accuracy() { # log -> the last test accuracy, in percent
  grep -o 'test accuracy [0-9.]*%' "$work/$1.log" | tail -1 | grep -o '[0-9.]*' || echo 0
}
check() { # name model data...: trains on both devices, checks accuracy and bits
  local name=$1 model=$2; shift 2
  local args=(--model "$model" --data "$@" --seed 3 --lr 3e-3 --epochs 6 --batch 32 --no-progress)
  run "$name-gpu" "$TANDEM_BIN" train --device cuda "${args[@]}" --save "$work/$name-a.st"
  run "$name-gpu2" "$TANDEM_BIN" train --device cuda "${args[@]}" --save "$work/$name-b.st"
  run "$name-cpu" "$TANDEM_BIN" train --device cpu --threads 2 "${args[@]}"
  local ga cp
  ga=$(accuracy "$name-gpu") cp=$(accuracy "$name-cpu")
  echo "$name: test accuracy GPU $ga%, CPU $cp% (chance 33%)"
  awk -v a="$ga" -v c="$cp" 'BEGIN { exit !(a >= 90 && c >= 90 && a - c < 5 && c - a < 5) }' \
    || { echo "FAIL: $name: GPU $ga% / CPU $cp% (want both >= 90%, within 5 points)";
         tail -5 "$work/$name-gpu.log"; exit 1; }
  same "$name-a.st" "$name-b.st" "$name: two GPU runs give the same weights"
  local short=(--model "$model" --data "$@" --seed 3 --lr 3e-3 --batch 32 --no-progress)
  run "$name-g20" "$TANDEM_BIN" train --device cuda "${short[@]}" --steps 20 \
      --save "$work/$name-g20.st"
  run "$name-c20" "$TANDEM_BIN" train --device cpu "${short[@]}" --steps 20 \
      --save "$work/$name-c20.st"
  run "$name-c1" "$TANDEM_BIN" train --device cpu "${short[@]}" --steps 1 --save "$work/$name-c1.st"
  near "$name-g20.st" "$name-c20.st" "$name-c1.st" 0.02 \
      "$name: 20 steps on the GPU end near the CPU's 20 (against its steps 2-20)"
  # micro-batches of 14, global batch 56: an epoch's 480 samples end in a step of 32, slots of
  # 14, 14, 4 and 0 (a short one and an empty one for BatchNorm's statistics)
  local w=(--model "$model" --data "$@" --seed 3 --lr 3e-3 --batch 14 --no-progress)
  run "$name-w1" "$TANDEM_BIN" train --device cuda "${w[@]}" --steps 24 --accum 4 \
      --save "$work/$name-w1.st"
  run "$name-w2" "$TANDEM_BIN" launch --standalone --nproc-per-node 2 -- \
      "$TANDEM_BIN" train --device cuda "${w[@]}" --steps 24 --accum 2 --save "$work/$name-w2.st"
  run "$name-w4" "$TANDEM_BIN" launch --standalone --nproc-per-node 4 -- \
      "$TANDEM_BIN" train --device cuda "${w[@]}" --steps 24 --save "$work/$name-w4.st"
  same "$name-w1.st" "$name-w2.st" "$name: 1 process (accum 4) == 2 processes sharing the GPU"
  same "$name-w1.st" "$name-w4.st" "$name: 1 process (accum 4) == 4 processes sharing the GPU"
  run "$name-s1" env TANDEM_GPU_DATA=stream "$TANDEM_BIN" train --device cuda "${w[@]}" --steps 24 \
      --accum 4 --save "$work/$name-s1.st"
  run "$name-s2" env TANDEM_GPU_DATA=stream "$TANDEM_BIN" launch --standalone --nproc-per-node 2 \
      -- "$TANDEM_BIN" train --device cuda "${w[@]}" --steps 24 --accum 2 --save "$work/$name-s2.st"
  grep -q "training set streams to the device" "$work/$name-s1.log" \
    || { echo "FAIL: $name: TANDEM_GPU_DATA=stream did not stream"; cat "$work/$name-s1.log"
         exit 1; }
  same "$name-w1.st" "$name-s1.st" "$name: streamed (1 process) == resident, bit for bit"
  same "$name-w1.st" "$name-s2.st" "$name: streamed (2 processes) == resident, bit for bit"
  local ra sa
  ra=$(grep -o 'test accuracy .*' "$work/$name-w1.log" | tail -1)
  sa=$(grep -o 'test accuracy .*' "$work/$name-s1.log" | tail -1)
  [ -n "$ra" ] && [ "$ra" = "$sa" ] \
    || { echo "FAIL: $name: streamed evaluation '$sa', resident '$ra'"; exit 1; }
  echo "ok: $name: the streamed held-out set evaluates as the resident one ($sa)"
  # a GPU checkpoint at step 12 resumed on the CPU (weights, optimizer, running statistics)
  run "$name-h" "$TANDEM_BIN" train --device cuda "${w[@]}" --steps 12 --accum 4 \
      --checkpoint-dir "$work/$name-ck" --save "$work/$name-h.st"
  run "$name-oncpu" "$TANDEM_BIN" train --device cpu "${w[@]}" --steps 24 --accum 4 \
      --checkpoint-dir "$work/$name-ck" --resume --save "$work/$name-oncpu.st"
  grep -q "resuming from .*ckpt-12.tdck at step 12" "$work/$name-oncpu.log" \
    || { echo "FAIL: $name: the CPU did not resume the GPU checkpoint"; cat "$work/$name-oncpu.log"
         exit 1; }
  near "$name-oncpu.st" "$name-w1.st" "$name-h.st" 0.1 \
      "$name: steps 13-24 on the CPU after the GPU's checkpoint end near the all-GPU run"
}
check table "$work/table.yaml" "$work/table.csv" --val-fraction 0.2
check images "$work/images.yaml" "$work/x.npy,$work/y.npy" --val-fraction 0.2
check resnet resnet-small "$work/x.npy,$work/y.npy" --val-fraction 0.2
echo "GPU: a CSV table, 3-channel images and resnet-small train on the device as on the CPU,"
echo "reproducibly"
