#!/usr/bin/env bash
# python: examples/lightning/train.py (a Lightning script with tandem.lightning.TandemLogger)
# as 2 workers of PyTorch 2.x under `tandem run --max-restarts 1`; rank 1 killed by -9 after
# ModelCheckpoint's first checkpoint: Lightning resumes from last.ckpt (ckpt_path="last", the
# logger's save_dir is the run's), every step of train/loss is stored once, the last one is
# logged, and the hyperparameters and the summary are in the store.
set -uo pipefail
SRC=${TANDEM_SOURCE_DIR:?TANDEM_SOURCE_DIR must name the source tree}
. "$SRC/tests/lib/project.sh"
. "$SRC/tests/lib/frameworks.sh"
project_setup fw-lightning
fw_python
fw_run_killed lit 'last.ckpt' "$FW_PY" "$SRC/examples/lightning/train.py" --data "$DATA" \
    --steps 100 --train-samples 8000 --checkpoint-every 20
grep -q "Restoring states from the checkpoint path at $P/.tandem/runs/lit-1/checkpoints/last.ckpt" lit.log ||
    fail "Lightning did not restore from the run's last.ckpt: $(grep -i restor lit.log | head -3)"
fw_resumed_after lit-1 50
fw_check_once lit-1 train/loss 99
fw_check_once lit-1 val/acc 99
fw_show_has lit-1 config lr
fw_show_has lit-1 config hidden
fw_show_has lit-1 summary best_model_score
acc=$("$B" metrics lit-1 --key val/acc --csv | tail -1 | cut -d, -f4)
awk -v a="$acc" 'BEGIN { exit !(a > 0.7) }' || fail "lit-1: val/acc $acc after 100 steps (expected > 0.7)"
echo "lit-1: val/acc $acc; config and summary in the store"
