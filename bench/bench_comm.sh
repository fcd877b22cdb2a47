#!/usr/bin/env bash
# Allreduce, 2 ranks on this host, float32 sum, 4 KiB .. 64 MiB: tandem shm vs Open MPI and
# tandem tcp vs PyTorch gloo, all in one invocation (numbers drift between runs and machines;
# the ratios are what to read). gloo is measured from two interpreters: Debian's PyTorch 1.13
# and PyPI's 2.x from the frameworks venv (bench/peers/torch_pythons.sh; a missing one is
# skipped with a line), both with OMP_NUM_THREADS=1 and torch.set_num_threads(1). The ceiling,
# memcpy bandwidth with as many processes copying at once as there are ranks
# (bench/peers/memcpy_bw.c), is measured in the same invocation, and shm's busbw is given as a
# share of it. In cache that ceiling says little: memcpy runs from the core's own L1/L2, while
# each rank of a 2-rank allreduce of B bytes must write B bytes into lines its peer's core holds
# (the rings it sends through) and read B bytes out of its peer's core (what the peer sent). That
# exchange, alone, is measured too (bench/peers/xcore_bw.c: 2 processes, B / the exchange's time)
# and shm's busbw given as a share of it ("shm/xc"): a 2-rank allreduce through shared memory does
# that exchange and more, so it stays near or below it. Prints one table of busbw (GB/s, nccl-tests factor 2(n-1)/n).
# Every measurement runs REPEATS times in interleaved rounds (round r runs each of them once) and
# the table gives medians, with the range of the shm / Open MPI ratio over the rounds: on a
# shared VM one pass of each, minutes apart, measured the machine's moods as much as the peers
# (shm against Open MPI at 4 MiB: 0.80x in one invocation, 1.1-1.3x interleaved right after).
# Usage: bench/bench_comm.sh [path/to/tandem]   (default: $TANDEM_BIN, then build*/tandem)
# Env: MIN_BYTES, MAX_BYTES, NRANKS (default 2), REPEATS (default 3), PYTHON (default
#      /usr/bin/python3), PYTHON2 (default the frameworks venv's python; none: skip).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
tandem=${1:-${TANDEM_BIN:-}}
if [ -z "$tandem" ]; then
  for c in "$root"/build/tandem "$root"/build-*/tandem; do [ -x "$c" ] && tandem=$c && break; done
fi
[ -x "$tandem" ] || { echo "bench_comm.sh: no tandem binary (pass its path)" >&2; exit 2; }
min=${MIN_BYTES:-4096}
max=${MAX_BYTES:-67108864}
n=${NRANKS:-2}
repeats=${REPEATS:-3}
# shellcheck source=peers/torch_pythons.sh
. "$here/peers/torch_pythons.sh"
torch_pythons "$root" bench_comm.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

col() { # file -> "bytes busbw" lines from nccl-tests style output (bytes first, busbw 4th/5th)
  awk -v f="$2" '!/^#/ && NF >= 5 {print $1, $f}' "$1"
}

cc -O2 -pthread -o "$tmp/memcpy_bw" "$here/peers/memcpy_bw.c"
cc -O2 -mavx2 -pthread -o "$tmp/xcore_bw" "$here/peers/xcore_bw.c" 2> "$tmp/xcore.err" ||
  echo "bench_comm.sh: cannot build xcore_bw (not x86-64 with AVX2?); skipping that ceiling" >&2
have_mpi=0
if command -v mpicc > /dev/null && command -v mpirun > /dev/null; then
  mpicc -O2 -o "$tmp/mpi_allreduce" "$here/peers/mpi_allreduce.c" && have_mpi=1
else
  echo "bench_comm.sh: mpicc/mpirun not found; skipping Open MPI (apt-get install libopenmpi-dev openmpi-bin)" >&2
fi
for ((round = 1; round <= repeats; round++)); do
  echo "== round $round/$repeats" >&2
  echo "== tandem shm" >&2
  "$tandem" bench comm --backend shm --op allreduce --nranks "$n" --min-bytes "$min" --max-bytes "$max" > "$tmp/shm.txt"
  echo "== tandem tcp" >&2
  "$tandem" bench comm --backend tcp --op allreduce --nranks "$n" --min-bytes "$min" --max-bytes "$max" > "$tmp/tcp.txt"
  col "$tmp/shm.txt" 5 > "$tmp/shm.$round.col"
  col "$tmp/tcp.txt" 5 > "$tmp/tcp.$round.col"
  # every size must have checked out
  awk '!/^#/ && NF >= 6 && $6 != 0 {bad=1} END {exit bad}' "$tmp/shm.txt" "$tmp/tcp.txt" ||
    { echo "bench_comm.sh: tandem reported wrong elements" >&2; cat "$tmp"/*.txt >&2; exit 1; }

  echo "== memcpy, $n processes at once" >&2
  "$tmp/memcpy_bw" "$min" "$max" "$n" > "$tmp/memcpy.txt"
  awk '!/^#/ && NF >= 3 {print $1, $3}' "$tmp/memcpy.txt" > "$tmp/memcpy.$round.col"

  echo "== cross-core exchange, 2 processes" >&2
  : > "$tmp/xcore.$round.col"
  if [ -x "$tmp/xcore_bw" ]; then
    "$tmp/xcore_bw" "$min" "$max" > "$tmp/xcore.txt" && awk '!/^#/ && NF >= 5 {print $1, $5}' "$tmp/xcore.txt" > "$tmp/xcore.$round.col"
  fi

  : > "$tmp/mpi.$round.col"
  if [ "$have_mpi" = 1 ]; then
    echo "== Open MPI" >&2
    mpirun --allow-run-as-root --oversubscribe -np "$n" "$tmp/mpi_allreduce" "$min" "$max" > "$tmp/mpi.txt" 2> "$tmp/mpi.err" ||
      { echo "bench_comm.sh: mpirun failed:" >&2; cat "$tmp/mpi.err" >&2; }
    [ -f "$tmp/mpi.txt" ] && col "$tmp/mpi.txt" 4 > "$tmp/mpi.$round.col"
  fi

  # gloo from each interpreter: $tmp/gloo<i>.<round>.col
  for i in "${!PEER_PY[@]}"; do
    py=${PEER_PY[$i]}
    echo "== PyTorch ${PEER_TORCH[$i]} gloo ($py)" >&2
    port=$("$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    pids=()
    for ((r = 0; r < n; r++)); do
      RANK=$r WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$port OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 \
        "$py" "$here/peers/gloo_allreduce.py" "$min" "$max" > "$tmp/gloo$i.$r.txt" 2> "$tmp/gloo$i.$r.err" &
      pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || echo "bench_comm.sh: a gloo rank failed: $(cat "$tmp"/gloo$i.*.err)" >&2; done
    awk '!/^#/ && NF >= 5 && $5 != 0 {bad=1} END {exit bad}' "$tmp/gloo$i.0.txt" ||
      echo "bench_comm.sh: gloo (torch ${PEER_TORCH[$i]}) reported wrong elements" >&2
    col "$tmp/gloo$i.0.txt" 4 > "$tmp/gloo$i.$round.col"
  done
done

# medians over the rounds: median NAME -> $tmp/NAME.col ("bytes busbw"), from NAME.<round>.col
median() {
  awk '{ v[$1] = v[$1] " " $2; if (!($1 in seen)) { seen[$1] = 1; order[++n] = $1 } }
       END { for (i = 1; i <= n; i++) { k = split(substr(v[order[i]], 2), a, " ")
               for (x = 1; x <= k; x++) for (y = x + 1; y <= k; y++) if (a[y] + 0 < a[x] + 0) { t = a[x]; a[x] = a[y]; a[y] = t }
               print order[i], (k % 2 ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2) } }' \
    "$tmp/$1".*.col > "$tmp/$1.col" 2> /dev/null || : > "$tmp/$1.col"
}
for name in shm tcp memcpy xcore mpi; do median $name; done
gloo_cols=() gloo_names=()
for i in "${!PEER_PY[@]}"; do
  median gloo$i
  gloo_cols+=("$tmp/gloo$i.col") gloo_names+=("gloo${PEER_TORCH[$i]%.*}")
done
# the shm / Open MPI ratio's range over the rounds, per size
: > "$tmp/range.col"
if [ -s "$tmp/mpi.col" ]; then
  for ((round = 1; round <= repeats; round++)); do
    join <(sort "$tmp/shm.$round.col") <(sort "$tmp/mpi.$round.col") | awk '$3 > 0 {print $1, $2 / $3}'
  done | awk '{ if (!($1 in lo) || $2 < lo[$1]) lo[$1] = $2; if (!($1 in hi) || $2 > hi[$1]) hi[$1] = $2 }
              END { for (b in lo) printf "%s %.2f-%.2f\n", b, lo[b], hi[b] }' > "$tmp/range.col"
fi

echo "# allreduce float32 sum, $n ranks on $(hostname), busbw GB/s (nccl-tests factor), medians of $repeats interleaved rounds (rounds: the shm / Open MPI ratio's range); load average $(cut -d' ' -f1-3 /proc/loadavg)"
# one awk over: shm, mpi, tcp, memcpy, xcore, the ratio's range, then each gloo column (files
# separated by an end marker line)
awk -v names="${gloo_names[*]}" '
  BEGIN { ng = split(names, gname, " ") }
  /^__end$/ { file++; next }
  file == 0 { shm[$1] = $2; order[++n] = $1 }
  file == 1 { mpi[$1] = $2 }
  file == 2 { tcp[$1] = $2 }
  file == 3 { mc[$1] = $2 }
  file == 4 { xc[$1] = $2 }
  file == 5 { rg[$1] = $2 }
  file >= 6 { g[file - 5, $1] = $2 }
  END {
    h = sprintf("%12s %12s %12s %8s %11s %10s %8s %8s %8s %12s", "bytes", "tandem_shm",
                "open_mpi", "ratio", "rounds", "memcpy", "shm/mc", "xcore", "shm/xc", "tandem_tcp")
    for (j = 1; j <= ng; j++) h = h sprintf(" %12s %8s", gname[j], "ratio")
    print h
    for (i = 1; i <= n; i++) {
      b = order[i]
      r1 = (b in mpi && mpi[b] > 0) ? sprintf("%.2fx", shm[b] / mpi[b]) : "-"
      r3 = (b in mc && mc[b] > 0) ? sprintf("%.0f%%", 100 * shm[b] / mc[b]) : "-"
      r4 = (b in xc && xc[b] > 0) ? sprintf("%.0f%%", 100 * shm[b] / xc[b]) : "-"
      line = sprintf("%12s %12.3f %12s %8s %11s %10s %8s %8s %8s %12.3f", b, shm[b],
                     (b in mpi) ? mpi[b] : "-", r1, (b in rg) ? rg[b] : "-",
                     (b in mc) ? mc[b] : "-", r3,
                     (b in xc) ? sprintf("%.2f", xc[b]) : "-", r4, tcp[b])
      for (j = 1; j <= ng; j++) {
        v = ((j, b) in g) ? g[j, b] : ""
        r2 = (v != "" && v > 0) ? sprintf("%.2fx", tcp[b] / v) : "-"
        line = line sprintf(" %12s %8s", v != "" ? v : "-", r2)
      }
      print line
    }
  }' <(cat "$tmp/shm.col"; echo "__end") <(cat "$tmp/mpi.col"; echo "__end") \
     <(cat "$tmp/tcp.col"; echo "__end") <(cat "$tmp/memcpy.col"; echo "__end") \
     <(cat "$tmp/xcore.col"; echo "__end") <(cat "$tmp/range.col"; echo "__end") \
     <(for c in "${gloo_cols[@]}"; do cat "$c"; echo "__end"; done)
