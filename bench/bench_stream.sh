#!/usr/bin/env bash
# Larger than memory: 2 workers train from a generated .npy data set of GB gigabytes (default 20,
# on a machine of 24 GiB) against the same model on 60,000 of its samples held in memory, in one
# invocation. Reports samples/s of each (the ratio is the target: within 10%) and the peak
# resident memory of every worker (the target: under 1 GiB), polled from /proc while they run.
# The big file is read through the page cache; the streamed runs start after
# `echo 1 > /proc/sys/vm/drop_caches` (when root may) so the first is a cold read, and a second
# streamed run shows the warm figure. Generating 20 GB takes a few minutes the first time; it is
# kept in DIR for the next invocation.
#
# usage: bench/bench_stream.sh [BUILD_DIR]      (default: $TANDEM_BUILD_DIR or ./build)
# env:   GB (default 20), DIR (default /var/tmp/tandem-stream), MODELS (default "mlp basicnet"),
#        STEPS (default 300), TANDEM_DATA (Fashion-MNIST dir), PYTHON (default /usr/bin/python3)
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-${TANDEM_BUILD_DIR:-$src/build}}" && pwd)
tandem=$build/tandem
gb=${GB:-20}
dir=${DIR:-/var/tmp/tandem-stream}
models=${MODELS:-mlp basicnet}
steps=${STEPS:-300}
fm=${TANDEM_DATA:-/usr/share/datasets/fashion-mnist}
python=${PYTHON:-/usr/bin/python3}

want=$("$python" -c "print(int($gb * 1e9) // 3136 * 3136 + 128)")
have=$(stat -c %s "$dir/x.npy" 2> /dev/null || echo 0)
if [ "$have" != "$want" ]; then
  echo "bench_stream: generating $gb GB in $dir (kept for the next run)"
  avail=$(df -B1 --output=avail "$(dirname "$dir")" | tail -1)
  [ "$avail" -gt "$((${gb%.*} * 1100000000))" ] || {
    echo "bench_stream: $(dirname "$dir") has $((avail / 1000000000)) GB free; $gb GB needed" >&2
    exit 2
  }
  "$python" "$src/bench/data/big_npy.py" "$dir" "$gb" "$fm"
fi
echo "bench_stream: $(du -h "$dir/x.npy" | cut -f1) in $dir/x.npy; memory $(free -g | awk '/Mem:/{print $2}') GiB; load $(cut -d' ' -f1-3 /proc/loadavg)"

# Peak resident memory (VmHWM) of each running worker of this run, polled until the run ends.
watch_rss() { # pattern outfile
  local pattern=$1 out=$2
  : > "$out"
  while :; do
    for pid in $(pgrep -f -- "$pattern" || true); do
      hwm=$(awk '/VmHWM/{print $2}' "/proc/$pid/status" 2> /dev/null || true)
      [ -n "$hwm" ] && echo "$pid $hwm" >> "$out"
    done
    sleep 0.5
  done
}

run() { # label model data: a line on stderr, samples/s on stdout
  local label=$1 model=$2 data=$3 rss
  rss=$(mktemp)
  watch_rss "^/proc/self/exe train .*--data $data" "$rss" &
  local watcher=$!
  local json
  json=$("$tandem" train --nproc-per-node 2 --threads 1 --model "$model" --data "$data" \
         --mean 0.2860 --std 0.3530 --steps "$steps" --batch 64 --no-progress --json 2> /dev/null |
         tail -n 1 | sed 's/^[^{]*//')
  kill "$watcher" 2> /dev/null || true
  wait "$watcher" 2> /dev/null || true
  local peak
  peak=$(sort -k1,1 -k2,2n "$rss" | awk '{m[$1] = $2} END {s = ""; for (p in m) s = s sprintf("%.0f ", m[p] / 1024); print s}')
  rm -f "$rss"
  local sps
  sps=$(echo "$json" | "$python" -c 'import json,sys; print("%.0f" % json.load(sys.stdin)["samples_per_s_steady"])')
  printf '%-8s %-15s %8s samples/s   worker peak RSS (MiB): %s\n' "$model" "$label" "$sps" \
    "$peak" >&2
  echo "$sps"
}

drop_caches() {
  sync
  if echo 1 > /proc/sys/vm/drop_caches 2> /dev/null; then return 0; fi
  echo "(cannot drop the page cache here: the streamed runs may read a warm cache)"
}

for model in $models; do
  mem=$(run "in memory" "$model" "$dir/x_small.npy,$dir/y_small.npy")
  drop_caches
  cold=$(run "streamed, cold" "$model" "$dir/x.npy,$dir/y.npy")
  warm=$(run "streamed, warm" "$model" "$dir/x.npy,$dir/y.npy")
  "$python" -c "print('%-8s streamed / in memory: cold %.2f, warm %.2f' % ('$model', $cold / $mem, $warm / $mem))" >&2
done
