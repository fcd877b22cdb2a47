#!/usr/bin/env bash
# torch: under `tandem launch --stall-timeout`, a PyTorch job on backend="tandem" is watched like
# `tandem train`: its default group is the job's group and publishes its progress, so when rank 1
# stops (SIGSTOP: the process lives, nothing moves) the launcher names rank 1 and the allreduce
# the other rank waits in, tears the job down and exits 1 (torch_stall.py). On gloo the same job
# would wait out gloo's 30-minute timeout.
set -uo pipefail
SRC=${TANDEM_SOURCE_DIR:?TANDEM_SOURCE_DIR must name the source tree}
. "$SRC/tests/torch/lib.sh"
torch_setup
W=$(mktemp -d /tmp/tandem-torch-stall-XXXXXX)
trap 'rm -rf "$W"' EXIT
"$B" launch --nproc-per-node 2 --stall-timeout 3 -- "$FW_PY" "$SRC/tests/torch/torch_stall.py" \
    >"$W/out" 2>"$W/err"
rc=$?
[ "$rc" = 1 ] || { tail -20 "$W/err" >&2; fail "tandem launch exited $rc, expected 1 (a stall)"; }
line=$(grep -o 'stall: rank 1 .*' "$W/err" | head -1)
[ -n "$line" ] || { tail -20 "$W/err" >&2; fail "no stall line naming rank 1"; }
grep -q 'allreduce' <<<"$line" || fail "the stall line does not name the allreduce: $line"
echo "launcher: $line"
echo "PASS"
