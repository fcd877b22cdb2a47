#!/usr/bin/env bash
# torch.distributed collectives on backend="tandem" vs gloo, in the same job on the same tensors
# (bench/torch_comm_peer.py): allreduce, allgather (all_gather_into_tensor) and reduce_scatter
# (reduce_scatter_tensor), float32 sum, 4 KiB .. 64 MiB, at 2 and 4 ranks on this host, under
# `tandem launch`, with PyTorch 2.x from the frameworks venv. tandem over shm (its choice on one
# host) and again over tcp (TANDEM_COMM_TRANSPORT=tcp: what it uses across hosts; gloo is tcp
# either way). Read the speedup column (gloo_us / tandem_us): absolute times move with the
# machine's load, the ratio measured in one run less so. #wrong must be 0.
# Then DDP training steps/s (bench/torch_ddp_steps.py: BasicNet and a ResNet-18-sized net, 2
# ranks, synthetic data), gloo and tandem back to back, each job run twice interleaved
# (gloo, tandem, gloo, tandem) so that a change in the machine's load shows as spread.
# Usage: bench/bench_torch_comm.sh [path/to/tandem]   (default: $TANDEM_BIN, then build*/tandem)
# Env: MIN_BYTES (4096), MAX_BYTES (67108864), RANKS ("2 4"), TRANSPORTS ("shm tcp"),
#      OPS (allreduce,allgather,reduce_scatter), TANDEM_BUILD_DIR (where the extension is),
#      DDP_MODELS ("basicnet resnet18"; "" skips the DDP part), DDP_STEPS (20).
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
echo "# $(date -u +%FT%TZ) $(getconf _NPROCESSORS_ONLN) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg); torch $("$fw/bin/python" -c 'import torch; print(torch.__version__)')"
for n in ${RANKS:-2 4}; do
  for tr in ${TRANSPORTS:-shm tcp}; do
    echo "## $n ranks, tandem over $tr"
    TANDEM_COMM_TRANSPORT=$tr "$tandem" launch --nproc-per-node "$n" -- "$fw/bin/python" \
      "$here/torch_comm_peer.py" "${OPS:-allreduce,allgather,reduce_scatter}" \
      "${MIN_BYTES:-4096}" "${MAX_BYTES:-67108864}" 2>&1 | grep '^\[rank 0\] ' | sed 's/^\[rank 0\] //'
  done
done
for m in ${DDP_MODELS-basicnet resnet18}; do
  echo "## DDP $m, 2 ranks: steps/s"
  for round in 1 2; do
    for be in gloo tandem; do
      v=$("$tandem" launch --nproc-per-node 2 -- "$fw/bin/python" "$here/torch_ddp_steps.py" "$be" "$m" 3 \
            "${DDP_STEPS:-20}" 2>&1 | sed -n 's/^\[rank 0\] steps_per_s //p')
      echo "  $m round $round $be ${v:-FAILED}"
    done
  done
done
