#!/usr/bin/env bash
# python: examples/hf_trainer/train.py (a GPT-2 built from a config, the HF Trainer with
# tandem.hf.TandemCallback) as 2 workers under `tandem run --max-restarts 1`; rank 1 killed by
# -9 after the Trainer's first complete checkpoint: the Trainer resumes from it
# (last_checkpoint), every step of loss is stored once, the TrainingArguments and the model's
# config are the run's config and the train results its summary.
set -uo pipefail
SRC=${TANDEM_SOURCE_DIR:?TANDEM_SOURCE_DIR must name the source tree}
. "$SRC/tests/lib/project.sh"
. "$SRC/tests/lib/frameworks.sh"
project_init fw-hf
fw_python
fw_run_killed hf 'checkpoint-*/trainer_state.json' "$FW_PY" "$SRC/examples/hf_trainer/train.py" \
    --steps 60 --save-steps 20
grep -q "resuming from $P/.tandem/runs/hf-1/checkpoints/checkpoint-" hf.log ||
    fail "the Trainer did not resume from a checkpoint: $(grep -i checkpoint hf.log | head -5)"
fw_resumed_after hf-1 20
fw_check_once hf-1 loss 60
fw_check_once hf-1 eval_loss 40
fw_show_has hf-1 config args/learning_rate
fw_show_has hf-1 config model/n_layer
fw_show_has hf-1 summary train_runtime
fw_show_has hf-1 summary eval_loss
echo "hf-1: config (args/, model/) and summary (train results) in the store"
