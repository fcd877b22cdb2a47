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
: "${TANDEM_BIN:?}" "${TANDEM_DATA:?}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if ! out=$("$TANDEM_BIN" train --device cuda --precision bf16 --model mlp7 --data "$TANDEM_DATA" \
      --steps 1 --no-progress 2>&1); then
  case "$out" in
    *"no CUDA device"*|*"without the CUDA backend"*)
      echo "SKIP: $(grep -m1 -o 'error: .*' <<<"$out")"; exit 77 ;;
  esac
  echo "$out"; exit 1
fi
common=(--device cuda --model basicnet --data "$TANDEM_DATA" --seed 7 --lr 1e-3 --no-progress)
run() { # name args...
  local name=$1; shift
  if ! "$@" >"$work/$name.log" 2>&1; then echo "FAIL: $name"; tail -20 "$work/$name.log"; exit 1; fi
}
same() { # a b what
  if ! cmp "$work/$1" "$work/$2"; then echo "FAIL: $3"; exit 1; fi
  echo "ok: $3"
}

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

"${PYTHON:-python3}" - "$work" <<'PY'
import json, struct, sys
import numpy as np
def load(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    body = b[8 + n:]
    return np.concatenate([np.frombuffer(body[v["data_offsets"][0]:v["data_offsets"][1]],
                                         np.float32)
                           for k, v in sorted(h.items()) if k != "__metadata__"])
d = sys.argv[1]
ref, init = load(f"{d}/fp32.st"), load(f"{d}/init.st")
travel = float(np.abs(ref - init).mean())  # how far fp32's 40 steps moved the weights
# AdamW's steps are lr-sized whatever the gradient's size, so rounding that flips the sign of a
# small gradient moves a weight by a whole step: the runs part by a fraction of the travel, where
# a broken gemm (or another training) would be a whole travel away or more
for name in ("tf32-a", "bf16-a", "bf16-oncpu"):
    w = load(f"{d}/{name}.st")
    assert np.isfinite(w).all(), f"{name}: non-finite weights"
    diff = float(np.abs(w - ref).mean())
    print(f"ok: {name}: mean |w - w_fp32| = {diff:.2e}; fp32's 40 steps moved {travel:.2e}")
    assert travel > 0 and diff < 0.5 * travel, f"{name} is far from the fp32 run: {diff} vs {travel}"
PY
echo "GPU precisions: tf32 and bf16 change the bits, stay deterministic across runs and worker counts, and resume on the CPU"
