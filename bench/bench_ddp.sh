#!/usr/bin/env bash
# Data-parallel training, tandem vs PyTorch DDP (gloo), in one invocation, PyTorch from two
# interpreters: Debian's 1.13 and PyPI's 2.x from the frameworks venv (bench/peers/
# torch_pythons.sh; a missing one is skipped with a line). Both run with OMP_NUM_THREADS=1 and
# torch.set_num_threads(1) in every process.
#
# Throughput (default, ~1-2 min): BasicNet on Fashion-MNIST, AdamW lr 1e-3, batch 64 per rank,
# 1 thread per process; 2 processes (global batch 128) and 1 process, for both:
#   tandem:  tandem train [--nproc-per-node 2] --threads 1 --batch 64 --steps N --json
#   pytorch: tandem launch --standalone --nproc-per-node 2 -- python3 bench/peers/torch_ddp_train.py
#            (and the script alone for 1 process; Debian's torchrun is broken on this Python)
# Scaling efficiency = samples/s(2 procs) / (2 x samples/s(1 proc)). tandem also reports its
# reducer's time: comm_s_per_step (the comm thread inside allreduce) and comm_wait_s_per_step
# (the training thread blocked in td_ddp_wait: communication not hidden behind backward).
#
# --full adds time to 90% test accuracy: both train 2 epochs (2 x 469 steps of 2 x 64) with a
# test evaluation after each epoch; the wall time of the first evaluation >= 90% is reported,
# counted from when the training process group is up (data loading included), plus the whole
# command's wall time (process start-up included: PyTorch imports take seconds). ~5 min.
#
# usage: bench/bench_ddp.sh [--full] [--repeat R] [BUILD_DIR]   (default: $TANDEM_BUILD_DIR or ./build)
# env:   TANDEM_DATA, PYTHON (default /usr/bin/python3), PYTHON2 (default the frameworks venv's
#        python; none: skip), STEPS (tandem timed steps, default 150),
#        TORCH_STEPS (default 60, after 5 warm-up steps), TORCH_LOADER (slice: batches indexed
#        straight from the data tensors, the default and PyTorch's fastest feed; dataloader:
#        DataLoader(TensorDataset, sampler=DistributedSampler))
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
full=0 repeat=1 build=
while [ $# -gt 0 ]; do
  case $1 in
    --full) full=1 ;;
    --repeat) repeat=$2; shift ;;
    -h|--help) sed -n '2,26p' "$0"; exit 0 ;;
    *) build=$1 ;;
  esac
  shift
done
build=$(cd "${build:-${TANDEM_BUILD_DIR:-$src/build}}" && pwd)
data=${TANDEM_DATA:-/usr/share/datasets/fashion-mnist}
steps=${STEPS:-150}
tsteps=${TORCH_STEPS:-60}
tandem=$build/tandem
peer=$src/bench/peers/torch_ddp_train.py
[ -x "$tandem" ] || { echo "bench_ddp: $tandem not built" >&2; exit 2; }
# shellcheck source=peers/torch_pythons.sh
. "$src/bench/peers/torch_pythons.sh"
torch_pythons "$src" bench_ddp
[ ${#PEER_PY[@]} -gt 0 ] || { echo "bench_ddp: no python3 with torch (set PYTHON)" >&2; exit 2; }

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "bench_ddp: BasicNet, Fashion-MNIST, AdamW lr 1e-3, batch 64 per rank, 1 thread per process"
echo "  $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "  tandem: $tandem"
for i in "${!PEER_PY[@]}"; do echo "  pytorch ${PEER_TORCH[$i]} gloo: ${PEER_PY[$i]}"; done

# run TAG CMD...: the last JSON line of the command's stdout (rank 0's prefix stripped) appended
# to $out/TAG.jsonl with the command's wall time; stderr kept for a failure report.
run() {
  local tag=$1; shift
  local t0 t1 line
  t0=$(date +%s.%N)
  if ! "$@" >"$out/$tag.out" 2>"$out/$tag.err"; then
    echo "bench_ddp: '$tag' failed: $*" >&2; tail -20 "$out/$tag.err" >&2; exit 1
  fi
  t1=$(date +%s.%N)
  line=$(sed 's/^\[rank 0\] //' "$out/$tag.out" | grep '^{' | tail -n 1)
  [ -n "$line" ] || { echo "bench_ddp: '$tag' printed no JSON" >&2; cat "$out/$tag.err" >&2; exit 1; }
  printf '{"tag": "%s", "cmd_wall_s": %s, "r": %s}\n' "$tag" "$(echo "$t1 - $t0" | bc)" "$line" \
    >>"$out/runs.jsonl"
  printf '  %-14s %6.1f s\n' "$tag" "$(echo "$t1 - $t0" | bc)"
}

td_common=(--model basicnet --data "$data" --mean 0.2860 --std 0.3530 --threads 1 --batch 64 --lr 1e-3 --no-progress --json)
py_common=("$peer" --data "$data" --threads 1 --batch 64 --loader "${TORCH_LOADER:-slice}")
for ((i = 0; i < repeat; i++)); do
  run tandem-2 "$tandem" train --nproc-per-node 2 "${td_common[@]}" --steps "$steps" \
    --no-eval-every-epoch
  run tandem-1 "$tandem" train "${td_common[@]}" --steps "$steps" --no-eval-every-epoch
  for j in "${!PEER_PY[@]}"; do
    v=${PEER_TORCH[$j]} p=${PEER_PY[$j]}
    run "torch$v-2" env OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 "$tandem" launch --standalone \
      --nproc-per-node 2 -- "$p" "${py_common[@]}" --steps "$tsteps" --warmup 5
    run "torch$v-1" env OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 "$p" "${py_common[@]}" \
      --steps "$tsteps" --warmup 5
  done
done
if [ $full = 1 ]; then
  run tandem-2-full "$tandem" train --nproc-per-node 2 "${td_common[@]}" --epochs 2
  for j in "${!PEER_PY[@]}"; do
    run "torch${PEER_TORCH[$j]}-2-full" env OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 "$tandem" launch \
      --standalone --nproc-per-node 2 -- "${PEER_PY[$j]}" "${py_common[@]}" --epochs 2
  done
fi
echo "  load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

"${PEER_PY[0]}" - "$out/runs.jsonl" "$steps" "$tsteps" "${PEER_TORCH[@]}" <<'PY'
import json, sys
runs = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    runs.setdefault(r["tag"], []).append(r)
steps, tsteps, versions = sys.argv[2], sys.argv[3], sys.argv[4:]

def best(tag):  # the fastest of the repeats: the least disturbed by other load
    return max(runs[tag], key=lambda r: r["r"]["samples_per_s"])

t2, t1 = best("tandem-2"), best("tandem-1")
ts2, ts1 = t2["r"]["samples_per_s"], t1["r"]["samples_per_s"]
eff_t = ts2 / (2 * ts1)
peers = [(f"torch {v} ddp", best(f"torch{v}-2")["r"]["samples_per_s"],
          best(f"torch{v}-1")["r"]["samples_per_s"]) for v in versions]
step_ms = 1000 * t2["r"]["global_batch"] / ts2
print()
print(f"config: 2 processes x 1 thread, batch 64 per rank (global 128); tandem {steps} steps "
      f"(all timed), pytorch {tsteps} steps after 5 warm-up; best of {len(runs['tandem-2'])}")
print(f"{'':26s} {'tandem':>10s}" + "".join(f" {n:>17s} {'ratio':>6s}" for n, _, _ in peers))
print(f"{'samples/s, 2 processes':26s} {ts2:10.1f}" +
      "".join(f" {p2:17.1f} {ts2 / p2:5.2f}x" for _, p2, _ in peers) + "   (target >= 1.5x)")
print(f"{'samples/s, 1 process':26s} {ts1:10.1f}" +
      "".join(f" {p1:17.1f} {ts1 / p1:5.2f}x" for _, _, p1 in peers))
print(f"{'scaling efficiency':26s} {100 * eff_t:9.1f}%" +
      "".join(f" {100 * p2 / (2 * p1):16.1f}% {'':6s}" for _, p2, p1 in peers) +
      "   (target >= 95% for tandem)")
print(f"tandem reducer: {t2['r']['buckets']} buckets; per step of {step_ms:.1f} ms: comm thread in "
      f"allreduce {1000 * t2['r']['comm_s_per_step']:.2f} ms, non-overlapped wait "
      f"{1000 * t2['r']['comm_wait_s_per_step']:.2f} ms "
      f"({100 * t2['r']['comm_wait_s_per_step'] * 1000 / step_ms:.1f}% of the step)")
if "tandem-2-full" in runs:
    print()
    print("time to 90% test accuracy (2 epochs max, evaluation after each epoch):")
    res = {}
    sides = [("tandem", "tandem-2-full")] + [(f"torch {v} ddp", f"torch{v}-2-full") for v in versions]
    for side, tag in sides:
        r = runs[tag][0]
        ev = r["r"]["evals"]
        hit = next((e for e in ev if e["test_acc"] >= 90.0), None)
        accs = ", ".join(f"step {e['step']}: {e['test_acc']:.2f}% at {e['wall_s']:.1f} s" for e in ev)
        res[side] = hit["wall_s"] if hit else None
        print(f"  {side:17s} {'%.1f s' % hit['wall_s'] if hit else 'not reached':>12s}   "
              f"[{accs}]; whole command {r['cmd_wall_s']:.1f} s")
    for side, _ in sides[1:]:
        if res["tandem"] and res[side]:
            print(f"  tandem / {side}: {res['tandem'] / res[side]:.2f}   (target <= 0.5)")
PY
