#!/usr/bin/env bash
# python: an HF Trainer run whose newest checkpoint is its last step finishes when resumed
# (issue 30). tests/python/hf_epochs_final.py trains 2 epochs with the real Trainer and saves a
# checkpoint at each epoch's end (checkpoint-16 is its last step); the first attempt then dies
# before it ends (exit 3, as a worker killed at exit would), so the run fails with its final
# step as its newest checkpoint. `tandem run --resume` restores checkpoint-16: the Trainer has
# no epoch left and logs its end-of-training results at step 16, the step the run resumed
# from. The resume must exit 0 (before the fix the callback's tandem.log raised "step 16 is the
# step of the checkpoint this run resumed from"), store each step of loss once, and put the
# Trainer's final results in the summary.
set -uo pipefail
SRC=${TANDEM_SOURCE_DIR:?TANDEM_SOURCE_DIR must name the source tree}
. "$SRC/tests/lib/project.sh"
. "$SRC/tests/lib/frameworks.sh"
project_init fw-hf-final
fw_python
"$B" run --name hfend -- "$FW_PY" "$SRC/tests/python/hf_epochs_final.py" >first.log 2>&1
rc=$?
[ "$rc" = 1 ] || { tail -30 first.log >&2; fail "the first attempt: tandem run exited $rc, expected 1"; }
ck=$P/.tandem/runs/hfend-1/checkpoints
[ -f "$ck/checkpoint-16/trainer_state.json" ] || fail "no checkpoint-16 in $ck: $(ls "$ck" 2>&1)"
echo "hfend-1 failed after training with checkpoint-16 (its last step) as its newest checkpoint"

"$B" run --resume hfend-1 >resume.log 2>&1
rc=$?
[ "$rc" = 0 ] || { tail -30 resume.log >&2; fail "tandem run --resume hfend-1 exited $rc, expected 0"; }
grep -q "resuming from $ck/checkpoint-16" resume.log ||
    fail "the resume did not restore checkpoint-16: $(grep -i checkpoint resume.log | head -5)"
[ "$(show_field hfend-1 status)" = succeeded ] || fail "hfend-1 is $(show_field hfend-1 status)"
fw_resumed_after hfend-1 16
fw_check_once hfend-1 loss 16
fw_show_has hfend-1 summary train_runtime
fw_show_has hfend-1 summary global_step
echo "hfend-1: the resume at its last step succeeded; loss stored once per step, train results in the summary"
