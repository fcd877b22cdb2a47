#!/usr/bin/env bash
# CPU milliseconds per training step of two tandem binaries on one model, interleaved: for a
# before/after comparison of a kernel change on a machine other work is loading, where wall-clock
# samples/s mostly measure the neighbours. Each figure is perf's task-clock of a run of LONG steps
# minus that of a run of SHORT steps, over LONG - SHORT: process start, data loading and the first
# steps cancel. 1 thread (--threads 1), batch 64; REPS rounds, each runs both binaries.
#
# PEER_DATA (the peer's data options, e.g. "--npy x.npy,y.npy" or "--data DIR") adds PyTorch 2.x
# in the same rounds: bench/peers/torch_train.py (the bench_train.sh peer, OMP_NUM_THREADS=1),
# its task-clock over SHORT and LONG timed steps the same way (its 5 warm-up steps cancel too).
#
# usage: bench/cpu_per_step.sh BEFORE_TANDEM AFTER_TANDEM MODEL DATA [tandem train options...]
# env:   REPS (default 3), SHORT (15), LONG (40), PEER_DATA (none)
# e.g.:  PEER_DATA="--npy x.npy,y.npy" bench/cpu_per_step.sh /tmp/old/tandem build/tandem \
#          resnet-small x.npy,y.npy
set -euo pipefail
[ $# -ge 4 ] || { sed -n '2,15p' "$0" >&2; exit 2; }
before=$1 after=$2 model=$3 data=$4
shift 4
reps=${REPS:-3} short=${SHORT:-15} long=${LONG:-40} peer_data=${PEER_DATA:-}
command -v perf > /dev/null || { echo "cpu_per_step: needs perf (apt-get install linux-perf)" >&2; exit 2; }
for b in "$before" "$after"; do
  [ -x "$b" ] || { echo "cpu_per_step: $b is not an executable tandem" >&2; exit 2; }
done
task_ms() { # binary steps -> task-clock ms of the whole run
  perf stat -x, -e task-clock "$1" train --model "$model" --data "$data" --steps "$2" --batch 64 \
    --threads 1 --no-eval-every-epoch --no-progress "${@:3}" 2>&1 > /dev/null |
    awk -F, '/task-clock/ {print $1}'
}
py= peer_v=
if [ -n "$peer_data" ]; then
  src=$(cd "$(dirname "$0")/.." && pwd)
  # shellcheck source=peers/torch_pythons.sh
  . "$src/bench/peers/torch_pythons.sh"
  PYTHON=${PYTHON:-none} torch_pythons "$src" cpu_per_step
  [ ${#PEER_PY[@]} -gt 0 ] || { echo "cpu_per_step: PEER_DATA set but no python3 with torch 2.x (bash scripts/venv.sh makes the frameworks venv)" >&2; exit 2; }
  py=${PEER_PY[0]} peer_v=${PEER_TORCH[0]}
fi
peer_ms() { # steps -> task-clock ms of a whole peer run
  # shellcheck disable=SC2086
  OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 perf stat -x, -e task-clock "$py" \
    "$src/bench/peers/torch_train.py" --model "$model" --threads 1 --steps "$1" --warmup 5 \
    $peer_data 2>&1 > /dev/null | awk -F, '/task-clock/ {print $1}'
}
echo "model $model, data $data, CPU ms per step (1 thread, batch 64), $reps rounds, load average $(cut -d' ' -f1 /proc/loadavg)"
for r in $(seq 1 "$reps"); do
  line="round $r:"
  for b in "$before" "$after"; do
    s=$(task_ms "$b" "$short" "$@") l=$(task_ms "$b" "$long" "$@")
    line+=" $(awk -v s="$s" -v l="$l" -v n=$((long - short)) 'BEGIN {printf "%.2f", (l - s) / n}') ($b)"
  done
  if [ -n "$py" ]; then
    s=$(peer_ms "$short") l=$(peer_ms "$long")
    line+=" $(awk -v s="$s" -v l="$l" -v n=$((long - short)) 'BEGIN {printf "%.2f", (l - s) / n}') (torch $peer_v)"
  fi
  echo "$line (load $(cut -d' ' -f1 /proc/loadavg))"
done
