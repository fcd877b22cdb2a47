#!/usr/bin/env bash
# CPU milliseconds per training step of two tandem binaries on one model, interleaved: for a
# before/after comparison of a kernel change on a machine other work is loading, where wall-clock
# samples/s mostly measure the neighbours. Each figure is perf's task-clock of a run of LONG steps
# minus that of a run of SHORT steps, over LONG - SHORT: process start, data loading and the first
# steps cancel. 1 thread (--threads 1), batch 64; REPS rounds, each runs both binaries.
#
# usage: bench/cpu_per_step.sh BEFORE_TANDEM AFTER_TANDEM MODEL DATA [tandem train options...]
# env:   REPS (default 3), SHORT (15), LONG (40)
# e.g.:  bench/cpu_per_step.sh /tmp/old/tandem build/tandem resnet-small x.npy,y.npy
set -euo pipefail
[ $# -ge 4 ] || { sed -n '2,11p' "$0" >&2; exit 2; }
before=$1 after=$2 model=$3 data=$4
shift 4
reps=${REPS:-3} short=${SHORT:-15} long=${LONG:-40}
command -v perf > /dev/null || { echo "cpu_per_step: needs perf (apt-get install linux-perf)" >&2; exit 2; }
for b in "$before" "$after"; do
  [ -x "$b" ] || { echo "cpu_per_step: $b is not an executable tandem" >&2; exit 2; }
done
task_ms() { # binary steps -> task-clock ms of the whole run
  perf stat -x, -e task-clock "$1" train --model "$model" --data "$data" --steps "$2" --batch 64 \
    --threads 1 --no-eval-every-epoch --no-progress "${@:3}" 2>&1 > /dev/null |
    awk -F, '/task-clock/ {print $1}'
}
echo "model $model, data $data, CPU ms per step (1 thread, batch 64), $reps rounds, load average $(cut -d' ' -f1 /proc/loadavg)"
for r in $(seq 1 "$reps"); do
  line="round $r:"
  for b in "$before" "$after"; do
    s=$(task_ms "$b" "$short" "$@") l=$(task_ms "$b" "$long" "$@")
    line+=" $(awk -v s="$s" -v l="$l" -v n=$((long - short)) 'BEGIN {printf "%.2f", (l - s) / n}') ($b)"
  done
  echo "$line"
done
