#!/usr/bin/env bash
# torch.distributed collectives on backend="tandem" vs gloo, in the same job on the same tensors
# (bench/torch_comm_peer.py): allreduce, allgather (all_gather_into_tensor) and reduce_scatter
# (reduce_scatter_tensor), float32 sum, 4 KiB .. 64 MiB, at 2 and 4 ranks on this host, under
# `tandem launch`, with PyTorch 2.x from the frameworks venv. tandem over shm (its choice on one
# host) and again over tcp (TANDEM_COMM_TRANSPORT=tcp: what it uses across hosts; gloo is tcp
# either way). Each size is timed in REPS rounds (default 5) alternating tandem and gloo, the
# medians are compared: read the speedup column (gloo_us / tandem_us). #wrong must be 0.
#
# Then the raw allreduce at the C level, the same sizes and rank counts, one after another in this
# invocation: tandem's own (`tandem bench comm`, shm), Open MPI (bench/peers/mpi_allreduce.c,
# mpirun; Debian's openmpi-bin) and oneCCL (bench/peers/oneccl_allreduce.cpp against PyPI's
# oneccl-cpu-devel, installed into a venv of its own, $BENCH_PEERS_VENV, default
# ~/.cache/tandem/bench-peers, made on the first run and reused). A peer that cannot be built or
# run here is skipped with a line saying why.
#
# Then DDP training steps/s (bench/torch_ddp_steps.py: BasicNet and a ResNet-18-sized net, 2
# ranks, synthetic data): gloo, tandem and "none" (the same training without DDP: the ceiling any
# backend can reach at this load), ROUNDS rounds (default 3) interleaved, and the CPU time per
# step of rank 0's threads (a polling worker would show there).
#
# The load average is printed before each part: this machine is shared, and the ratios, measured
# in the same run, are what to read.
# Usage: bench/bench_torch_comm.sh [path/to/tandem]   (default: $TANDEM_BIN, then build*/tandem)
# Env: MIN_BYTES (4096), MAX_BYTES (67108864), RANKS ("2 4"), TRANSPORTS ("shm tcp"; "" skips the torch part),
#      OPS (allreduce,allgather,reduce_scatter), REPS (5), TANDEM_BUILD_DIR (where the
#      extension is), RAW_PEERS ("tandem mpi oneccl"; "" skips the C-level part),
#      DDP_MODELS ("basicnet resnet18"; "" skips the DDP part), DDP_STEPS (20), ROUNDS (3).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
tandem=${1:-${TANDEM_BIN:-}}
if [ -z "$tandem" ]; then
  for c in "$root"/build/tandem "$root"/build-*/tandem; do [ -x "$c" ] && tandem=$c && break; done
fi
[ -x "$tandem" ] || { echo "bench_torch_comm.sh: no tandem binary (pass its path)" >&2; exit 2; }
export TANDEM_BUILD_DIR=${TANDEM_BUILD_DIR:-$(dirname "$tandem")}
fw=${TANDEM_FRAMEWORKS_VENV:-$(bash "$root/scripts/venv.sh" --print-frameworks)}
[ -x "$fw/bin/python" ] || { echo "bench_torch_comm.sh: no frameworks venv at $fw (scripts/venv.sh)" >&2; exit 2; }
export PYTHONPATH=$root/python OMP_NUM_THREADS=1
min=${MIN_BYTES:-4096}
max=${MAX_BYTES:-67108864}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
load() { cut -d' ' -f1-3 /proc/loadavg; }
echo "# $(date -u +%FT%TZ) $(getconf _NPROCESSORS_ONLN) CPUs, load $(load); torch $("$fw/bin/python" -c 'import torch; print(torch.__version__)')"
for n in ${RANKS:-2 4}; do
  for tr in ${TRANSPORTS-shm tcp}; do
    echo "## $n ranks, tandem over $tr (load $(load))"
    TANDEM_COMM_TRANSPORT=$tr "$tandem" launch --nproc-per-node "$n" -- "$fw/bin/python" \
      "$here/torch_comm_peer.py" "${OPS:-allreduce,allgather,reduce_scatter}" \
      "$min" "$max" 2>&1 | grep '^\[rank 0\] ' | sed 's/^\[rank 0\] //'
  done
done

# ---- raw allreduce at the C level: tandem, Open MPI, oneCCL
peers=${RAW_PEERS-tandem mpi oneccl}
mpi_bin="" ccl_bin=""
if [[ " $peers " == *" mpi "* ]]; then
  if command -v mpicc > /dev/null && command -v mpirun > /dev/null; then
    mpicc -O2 -o "$tmp/mpi_allreduce" "$here/peers/mpi_allreduce.c" && mpi_bin=$tmp/mpi_allreduce
  else
    echo "# Open MPI skipped: mpicc/mpirun not found (apt-get install libopenmpi-dev openmpi-bin)"
  fi
fi
if [[ " $peers " == *" oneccl "* ]]; then
  # PyPI's oneccl-cpu-devel is a static C++ library with no Python binding (no oneccl_bind_pt
  # wheel exists on PyPI for torch 2.x), so the peer is a C++ program linked against it.
  # --no-deps: its declared dependencies (oneccl-cpu, whose libccl.so.1 needs a libccl.so.2 that
  # no wheel ships, and libfabric>=2.6, not on PyPI) are not what the static library needs; it
  # loads the system's libfabric at run time (Debian's libfabric1).
  venv=${BENCH_PEERS_VENV:-$HOME/.cache/tandem/bench-peers}
  why=""
  if [ ! -f "$venv/lib/ccl/cpu/lib/libccl.a" ]; then
    { "$fw/bin/python" -m venv "$venv" && "$venv/bin/pip" install -q --no-deps 'oneccl-cpu-devel==2022.2.0'; } \
      > "$tmp/ccl.log" 2>&1 || why="pip install oneccl-cpu-devel==2022.2.0 into $venv failed: $(tail -1 "$tmp/ccl.log")"
  fi
  if [ -z "$why" ] && ! { gcc -O2 -c "$here/peers/oneccl_shim.c" -o "$tmp/oneccl_shim.o" &&
      g++ -O2 -std=c++17 -I"$venv/include" "$here/peers/oneccl_allreduce.cpp" "$tmp/oneccl_shim.o" \
        "$venv/lib/ccl/cpu/lib/libccl.a" -lhwloc -lpthread -ldl -lrt -o "$tmp/oneccl_allreduce"; } \
      > "$tmp/ccl.log" 2>&1; then
    why="building bench/peers/oneccl_allreduce.cpp failed (needs g++, libhwloc-dev): $(grep -m1 -E 'error|undefined' "$tmp/ccl.log")"
  fi
  [ -z "$why" ] && ccl_bin=$tmp/oneccl_allreduce || echo "# oneCCL skipped: $why"
fi
# bytes time_us wrong, from the rows of nccl-tests style output (a peer's log lines are not rows)
rows() { awk '$1 ~ /^[0-9]+$/ && NF >= 5 {print $1, $(NF-3), $NF}' "$1"; }
if [ -n "$peers" ]; then
  for n in ${RANKS:-2 4}; do
    echo "## raw allreduce, C level, $n ranks on this host, float32 sum, time_us per call (load $(load))"
    : > "$tmp/t.rows"; : > "$tmp/m.rows"; : > "$tmp/c.rows"
    if [[ " $peers " == *" tandem "* ]]; then
      "$tandem" bench comm --backend shm --op allreduce --nranks "$n" --min-bytes "$min" \
        --max-bytes "$max" > "$tmp/t.txt" 2>&1 && rows "$tmp/t.txt" > "$tmp/t.rows" ||
        { echo "# tandem bench comm failed:"; tail -3 "$tmp/t.txt"; }
    fi
    if [ -n "$mpi_bin" ]; then
      mpirun --allow-run-as-root --oversubscribe -np "$n" "$mpi_bin" "$min" "$max" > "$tmp/m.txt" 2>&1 &&
        rows "$tmp/m.txt" > "$tmp/m.rows" || { echo "# mpirun failed:"; tail -3 "$tmp/m.txt"; }
    fi
    if [ -n "$ccl_bin" ]; then
      rm -f "$tmp/ccl.addr"
      "$tandem" launch --nproc-per-node "$n" -- "$ccl_bin" "$tmp/ccl.addr" "$min" "$max" > "$tmp/c.txt" 2>&1 &&
        sed -n 's/^\[rank 0\] //p' "$tmp/c.txt" | rows /dev/stdin > "$tmp/c.rows" ||
        { echo "# oneCCL failed:"; tail -3 "$tmp/c.txt"; }
    fi
    awk 'FNR == 1 {f++} NF == 0 {next} {t[f, $1] = $2; w[f, $1] = $3; if (!($1 in seen)) {seen[$1] = 1; order[++k] = $1}}
      END {
        printf "  %10s %10s %10s %10s %10s %10s %6s\n", "bytes", "tandem", "open_mpi", "mpi/tan", "oneccl", "ccl/tan", "wrong"
        for (i = 1; i <= k; i++) {
          b = order[i]; tt = t[1, b]; mm = t[2, b]; cc = t[3, b]
          printf "  %10s %10s %10s %10s %10s %10s %6d\n", b, tt == "" ? "-" : tt, mm == "" ? "-" : mm,
            (tt > 0 && mm > 0) ? sprintf("%.2fx", mm / tt) : "-", cc == "" ? "-" : cc,
            (tt > 0 && cc > 0) ? sprintf("%.2fx", cc / tt) : "-", w[1, b] + w[2, b] + w[3, b]
        }
      }' <(cat "$tmp/t.rows"; echo) <(cat "$tmp/m.rows"; echo) <(cat "$tmp/c.rows"; echo)
  done
fi

# ---- DDP steps/s
for m in ${DDP_MODELS-basicnet resnet18}; do
  echo "## DDP $m, 2 ranks: steps/s, then rank 0's CPU ms per step by thread (load $(load))"
  for round in $(seq 1 "${ROUNDS:-3}"); do
    for be in gloo tandem none; do
      out=$("$tandem" launch --nproc-per-node 2 -- "$fw/bin/python" "$here/torch_ddp_steps.py" "$be" "$m" 3 \
            "${DDP_STEPS:-20}" 2>&1 || true)
      v=$(sed -n 's/^\[rank 0\] steps_per_s //p' <<< "$out")
      cpu=$(sed -n 's/^\[rank 0\] thread_cpu_ms_per_step //p' <<< "$out")
      echo "  $m round $round $be ${v:-FAILED}  [$cpu]"
    done
  done
done
