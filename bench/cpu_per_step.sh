#!/usr/bin/env bash
# CPU milliseconds per training step of two tandem binaries on one model, interleaved: for a
# before/after comparison of a kernel change on a machine other work is loading, where wall-clock
# samples/s mostly measure the neighbours. Each figure is perf's task-clock of a run of LONG steps
# minus that of a run of SHORT steps, over LONG - SHORT: process start, data loading and the first
# steps cancel. 1 thread (--threads 1), batch 64; REPS rounds, each runs both binaries, in
# alternating order (odd rounds BEFORE first, even rounds AFTER first): on the shared 2-core
# machine the binary that ran first in a round measured ~5% faster whichever it was (resnet-small,
# 2026-11-29), so a fixed order reads as a change. Columns stay BEFORE, AFTER; medians at the end.
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
per_step() { awk -v s="$1" -v l="$2" -v n=$((long - short)) 'BEGIN {printf "%.2f", (l - s) / n}'; }
median() { tr ' ' '\n' | sort -g | awk '{v[NR] = $1} END {printf "%.2f", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
echo "model $model, data $data, CPU ms per step (1 thread, batch 64), $reps rounds, load average $(cut -d' ' -f1 /proc/loadavg)"
all_b= all_a= all_p=
for r in $(seq 1 "$reps"); do
  order=("$before" "$after")
  [ $((r % 2)) -eq 0 ] && order=("$after" "$before")
  declare -A ms=()
  for b in "${order[@]}"; do
    s=$(task_ms "$b" "$short" "$@") l=$(task_ms "$b" "$long" "$@")
    ms[$b]=$(per_step "$s" "$l")
  done
  line="round $r: ${ms[$before]} ($before) ${ms[$after]} ($after)"
  all_b+=" ${ms[$before]}" all_a+=" ${ms[$after]}"
  if [ -n "$py" ]; then
    s=$(peer_ms "$short") l=$(peer_ms "$long")
    p=$(per_step "$s" "$l")
    line+=" $p (torch $peer_v)" all_p+=" $p"
  fi
  [ $((r % 2)) -eq 0 ] && line+=" [after ran first]"
  echo "$line (load $(cut -d' ' -f1 /proc/loadavg))"
  unset ms
done
mb=$(echo $all_b | median) ma=$(echo $all_a | median)
line="median: $mb ($before) $ma ($after), after/before $(awk -v a="$ma" -v b="$mb" 'BEGIN {printf "%.3f", a / b}')"
if [ -n "$py" ]; then
  mp=$(echo $all_p | median)
  line+="; $mp (torch $peer_v): torch/after $(awk -v a="$ma" -v p="$mp" 'BEGIN {printf "%.2f", p / a}')x, torch/before $(awk -v b="$mb" -v p="$mp" 'BEGIN {printf "%.2f", p / b}')x"
fi
echo "$line"
