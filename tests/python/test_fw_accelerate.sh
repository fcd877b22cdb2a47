#!/usr/bin/env bash
# python: examples/accelerate/train.py (Accelerate with tandem.accelerate.TandemTracker and
# tandem.checkpoint) as 2 workers under `tandem run --max-restarts 1`; rank 1 killed by -9
# after the SDK's first checkpoint: both ranks resume from it, every step of train/loss is
# stored once, init_trackers' config and the test accuracy are in the store.
set -uo pipefail
SRC=${TANDEM_SOURCE_DIR:?TANDEM_SOURCE_DIR must name the source tree}
. "$SRC/tests/lib/project.sh"
. "$SRC/tests/lib/frameworks.sh"
project_setup fw-accelerate
fw_python
fw_run_killed acc 'step-*.pt' "$FW_PY" "$SRC/examples/accelerate/train.py" --data "$DATA" \
    --steps 100 --checkpoint-every 20
grep -q "resumed from the checkpoint of step" acc.log || fail "no rank resumed: $(tail -5 acc.log)"
fw_resumed_after acc-1 20
fw_check_once acc-1 train/loss 100
fw_show_has acc-1 config lr
fw_show_has acc-1 summary test_acc
acc=$("$B" metrics acc-1 --key test/acc --csv | tail -1 | cut -d, -f4)
awk -v a="$acc" 'BEGIN { exit !(a > 0.7) }' || fail "acc-1: test/acc $acc (expected > 0.7)"
echo "acc-1: test/acc $acc"
