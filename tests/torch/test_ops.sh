#!/usr/bin/env bash
# torch: every op and dtype of backend="tandem" against gloo on the same inputs (torch_ops.py
# says which comparisons are bitwise and which within a rounding bound, and why) at 2, 3 and 4
# ranks, under `tandem launch` (tandem's own store and job group) and under torchrun (the group's
# rank 0 serves a tandem store found through torchrun's c10d store); 3 ranks once more over tcp.
set -uo pipefail
SRC=${TANDEM_SOURCE_DIR:?TANDEM_SOURCE_DIR must name the source tree}
. "$SRC/tests/torch/lib.sh"
torch_setup
W=$(mktemp -d /tmp/tandem-torch-ops-XXXXXX)
trap 'rm -rf "$W"' EXIT

run() { # what, then the job
    local what=$1 log
    shift
    log=$W/$(tr ' /=' '___' <<<"$what").log
    if ! "$@" >"$log" 2>&1; then
        grep -E "FAIL|Error|error" "$log" | head -30 >&2
        fail "$what: the job failed (log above)"
    fi
    grep -q "torch_ops: world .*: all ok" "$log" || { tail -20 "$log" >&2; fail "$what: no 'all ok' line"; }
    echo "$what: $(grep -c '\] ok \|^ok ' "$log") checks ok"
}

for n in 2 3 4; do
    run "tandem launch, $n ranks" launch_job "$n" "$FW_PY" "$SRC/tests/torch/torch_ops.py"
    run "torchrun, $n ranks" torchrun_job "$n" "$SRC/tests/torch/torch_ops.py"
done
TANDEM_COMM_TRANSPORT=tcp run "tandem launch, 3 ranks, tcp" launch_job 3 "$FW_PY" "$SRC/tests/torch/torch_ops.py"
echo "PASS"
