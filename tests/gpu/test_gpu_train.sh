#!/usr/bin/env bash
# Training on the GPU (tandem train --device cuda), checked bit for bit:
#   - two runs of 60 steps give the same weights;
#   - 1 process (--batch 16 --accum 4), 2 processes (--accum 2) and 4 processes (--accum 1)
#     sharing the GPU give the same weights (global batch 64, dropout on), whether the ranks
#     reduce on the device through CUDA IPC (the default on one host) or through the host;
#   - 25 steps, checkpoint, resume to 50 == 50 uninterrupted steps;
#   - the graph replay and kernel-by-kernel launches (TANDEM_CUDA_GRAPH=0) agree;
#   - a checkpoint written on the GPU resumes on the CPU (and a CPU one on the GPU), and the
#     result stays close to the all-GPU run.
# Skips (77) without a CUDA device or without the CUDA backend.
set -euo pipefail
. "$(dirname "$0")/gpu_lib.sh"
gpu_or_skip --model mlp7
common=(--device cuda --model basicnet --data "$TANDEM_DATA" --seed 7 --lr 1e-3 --no-progress)

run a "$TANDEM_BIN" train "${common[@]}" --steps 60 --batch 64 --save "$work/a.st"
run b "$TANDEM_BIN" train "${common[@]}" --steps 60 --batch 64 --save "$work/b.st"
same a.st b.st "two GPU runs give the same weights"
TANDEM_CUDA_GRAPH=0 run c "$TANDEM_BIN" train "${common[@]}" --steps 60 --batch 64 --save "$work/c.st"
same a.st c.st "CUDA graph replay == kernel-by-kernel launches"

run w1 "$TANDEM_BIN" train "${common[@]}" --steps 60 --batch 16 --accum 4 --save "$work/w1.st"
run w2 "$TANDEM_BIN" launch --standalone --nproc-per-node 2 -- \
    "$TANDEM_BIN" train "${common[@]}" --steps 60 --batch 16 --accum 2 --save "$work/w2.st"
run w4 "$TANDEM_BIN" launch --standalone --nproc-per-node 4 -- \
    "$TANDEM_BIN" train "${common[@]}" --steps 60 --batch 16 --save "$work/w4.st"
grep -q "reduce gradients on the device through CUDA IPC" "$work/w2.log" \
  || { echo "FAIL: 2 ranks on one host did not use the CUDA IPC reduce"; cat "$work/w2.log"; exit 1; }
TANDEM_GPU_REDUCE=host run w2h "$TANDEM_BIN" launch --standalone --nproc-per-node 2 -- \
    "$TANDEM_BIN" train "${common[@]}" --steps 60 --batch 16 --accum 2 --save "$work/w2h.st"
if grep -q "through CUDA IPC" "$work/w2h.log"; then
  echo "FAIL: TANDEM_GPU_REDUCE=host still used CUDA IPC"; exit 1
fi
same w1.st w2.st "1 process (accum 4) == 2 processes (accum 2, CUDA IPC reduce)"
same w1.st w2h.st "1 process (accum 4) == 2 processes (accum 2, reduce staged through the host)"
same w1.st w4.st "1 process (accum 4) == 4 processes sharing the GPU (CUDA IPC reduce)"
if cmp -s "$work/a.st" "$work/w1.st"; then
  echo "FAIL: batch 64 and batch 16 x accum 4 gave the same bytes: the test cannot tell"; exit 1
fi

run full "$TANDEM_BIN" train "${common[@]}" --steps 50 --batch 64 --save "$work/full.st"
run half "$TANDEM_BIN" train "${common[@]}" --steps 25 --batch 64 --checkpoint-dir "$work/ck" \
    --save "$work/half.st"
run rest "$TANDEM_BIN" train "${common[@]}" --steps 50 --batch 64 --checkpoint-dir "$work/ck" \
    --resume --save "$work/resumed.st"
grep -q "resuming from .*ckpt-25.tdck at step 25" "$work/rest.log" \
  || { echo "FAIL: the resume did not start at step 25"; cat "$work/rest.log"; exit 1; }
same full.st resumed.st "25 steps + checkpoint + resume == 50 steps"

# across devices: the checkpoint format is the same; the arithmetic is not (summation orders)
cp -r "$work/ck" "$work/ck-cpu"
rm -f "$work/ck-cpu/ckpt-50.tdck"
cpu_common=("${common[@]/cuda/cpu}")
run oncpu "$TANDEM_BIN" train "${cpu_common[@]}" --threads 2 --steps 50 --batch 64 \
    --checkpoint-dir "$work/ck-cpu" --resume --save "$work/oncpu.st"
grep -q "resuming from .*ckpt-25.tdck at step 25" "$work/oncpu.log" \
  || { echo "FAIL: the CPU did not resume the GPU checkpoint"; cat "$work/oncpu.log"; exit 1; }
run cpu25 "$TANDEM_BIN" train "${cpu_common[@]}" --threads 2 --steps 25 --batch 64 \
    --checkpoint-dir "$work/ck-gpu"
run ongpu "$TANDEM_BIN" train "${common[@]}" --steps 50 --batch 64 --checkpoint-dir "$work/ck-gpu" \
    --resume --save "$work/ongpu.st"
grep -q "resuming from .*ckpt-25.tdck at step 25" "$work/ongpu.log" \
  || { echo "FAIL: the GPU did not resume the CPU checkpoint"; cat "$work/ongpu.log"; exit 1; }
# steps 26-50 on the other device end near the all-GPU run, against how far those steps moved it
near oncpu.st full.st half.st 0.1 "oncpu: steps 26-50 on the CPU after the GPU's checkpoint"
near ongpu.st full.st half.st 0.1 "ongpu: steps 26-50 on the GPU after the CPU's checkpoint"
echo "GPU training: bitwise reproducible across runs, worker counts, graph/eager and resume"
