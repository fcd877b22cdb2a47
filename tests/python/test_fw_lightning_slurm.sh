#!/usr/bin/env bash
# python: Lightning's own Slurm auto-requeue with tandem.lightning.TandemLogger, on a real Slurm
# cluster (tests/lib/slurm.sh), no tandem launcher in between: sbatch --requeue runs a Lightning
# script under srun (Lightning's SLURMEnvironment). While it waits inside training step 30, the
# time-limit signal (USR1, what --signal=USR1@LEAD sends) reaches it: Lightning saves
# hpc_ckpt_1.ckpt and requeues its own job (scontrol requeue). The job runs again with
# SLURM_RESTART_COUNT=1, Lightning restores the hpc checkpoint, and the logger continues the same
# offline run (slurm-<job id>) with a resume line at 30. `tandem import` of that run then holds
# every step of train/loss once (0..120 but 30, the step the signal interrupted), and the
# hyperparameters.
set -uo pipefail
SRC=${TANDEM_SOURCE_DIR:?TANDEM_SOURCE_DIR must name the source tree}
: "${TANDEM_DATA:=/usr/share/datasets/fashion-mnist}"
export TANDEM_DATA
. "$SRC/tests/lib/frameworks.sh"
fw_python
fw_need_wheel # the node runs FW_PY (the wheel's SDK; it sees /root and the build directory)
. "$SRC/tests/executors/exec_test.sh" lightning-slurm
slurm_up 1 || fail "the cluster did not come up"
cd "$P" || exit 1
cat >lit.py <<'PY'
import os, time
import torch, torch.nn as nn, torch.nn.functional as F
import lightning as L
from torch.utils.data import DataLoader, TensorDataset
from tandem.lightning import TandemLogger

class M(L.LightningModule):
    def __init__(self, lr=0.05):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Linear(16, 1)
    def training_step(self, batch, i):
        x, y = batch
        loss = F.mse_loss(self.net(x), y)
        self.log("train/loss", loss)
        if self.global_step == 30 and os.environ.get("SLURM_RESTART_COUNT", "0") == "0":
            # the first attempt waits here for the time-limit signal, and then for the requeue
            # to end it: no step from 30 on is logged by it
            open("in-step-30", "w").close()
            while True:
                time.sleep(0.2)
        return loss
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)

torch.manual_seed(0)
x = torch.randn(4096, 16)
data = TensorDataset(x, x.sum(1, keepdim=True))
print(f"attempt {os.environ.get('SLURM_RESTART_COUNT', '0')}", flush=True)
trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=120, log_every_n_steps=1,
                    enable_progress_bar=False, enable_model_summary=False,
                    enable_checkpointing=False, logger=TandemLogger(name="lit-slurm"))
trainer.fit(M(), DataLoader(data, batch_size=32))   # ckpt_path=None: Lightning restores hpc_ckpt_N
PY
printf '%s\n' '#!/bin/bash' '#SBATCH --requeue' "#SBATCH --output=$P/job-%j.out" \
    '#SBATCH --open-mode=append' \
    "export OMP_NUM_THREADS=1 TANDEM_OFFLINE_DIR=$P/offline" \
    "cd $P" "srun $FW_PY lit.py" >job.sh
jid=$(slurm_exec sbatch --parsable job.sh) || fail "sbatch: $jid"
OUT=$P/job-$jid.out
M=$P/offline/slurm-$jid/metrics/rank-0.jsonl
# Lightning's USR1 handler saves hpc_ckpt_1 wherever the main thread is, and that place says
# which step the restored attempt logs first. Inside training step R, before its optimizer step:
# R+1 (R is logged by neither attempt), and the last step is 120. After R's optimizer step: R+1
# too, but the last is 119; or, between the logger's write of R and Lightning counting the batch
# (_batches_that_stepped), R again, and the last is 118: the same 120 optimizer steps numbered
# otherwise (the logger stores Lightning's steps). Signalled on seeing a step's line, the script
# was at times there, past its wait; now the signal goes once it waits inside training step 30.
slurm_wait 240 "the job to wait inside training step 30" test -e "$P/in-step-30" ||
    fail "the job never reached step 30: $(tail -20 "$OUT" 2>&1)"
slurm_exec scancel --signal=USR1 "$jid" || fail "scancel --signal=USR1 $jid: exit $?"
# Lightning prints the max_steps line before the logger's last write (its finalize, after fit's
# loop): the job leaving the queue, its srun and Python gone, is what says the run is written.
finished() {
    grep -q 'max_steps=120. reached' "$OUT" && [ -z "$(slurm_exec squeue -h -j "$jid" 2>/dev/null)" ]
}
slurm_wait 240 "the requeued attempt to finish and leave the queue" finished ||
    fail "the requeued job did not finish: $(tail -30 "$OUT" 2>&1); squeue: $(slurm_exec squeue 2>&1)"
grep -q "attempt 1" "$OUT" || fail "no second attempt: $(grep attempt "$OUT")"
[ -f "$P/hpc_ckpt_1.ckpt" ] || fail "Lightning saved no hpc_ckpt_1.ckpt: $(ls "$P")"
grep -q "Restoring states from the checkpoint path at $P/hpc_ckpt_1.ckpt" "$OUT" ||
    fail "the second attempt did not restore the hpc checkpoint: $(grep -i restor "$OUT")"
echo "job $jid: USR1 -> Lightning saved hpc_ckpt_1.ckpt and requeued; attempt 1 restored it"
resume=$(grep -o '"event": "resume", "step": [0-9]*' "$M" | grep -o '[0-9]*$')
[ "$resume" = 30 ] || fail "no resume line at the restored step 30 (got '$resume')"

"$B" import "$P/offline/slurm-$jid" >import.log 2>&1 || fail "tandem import: $(cat import.log)"
run=$("$B" ps -a | awk 'NR > 1 { print $1; exit }')
steps=$("$B" metrics "$run" --key train/loss --csv | tail -n +2 | cut -d, -f3 | sort -n)
[ "$(uniq -d <<<"$steps" | wc -w)" = 0 ] || fail "$run: steps stored twice: $(uniq -d <<<"$steps" | head)"
# Steps 0..120, each once across the requeue, but 30: the batch the signal interrupted, which
# the first attempt never finished and the second redid as step 31.
got=$(tr '\n' ' ' <<<"$steps")
[ "$got" = "$(seq 0 120 | grep -vx 30 | tr '\n' ' ')" ] ||
    fail "$run: train/loss at steps $got; expected 0..120 but 30, once each"
show=$("$B" show "$run")
grep -qE '^  lr +0.05' <<<"$show" || fail "$run: no lr in config: $show"
echo "$run (imported): train/loss at $(wc -w <<<"$got") of steps 0..120, each once, across the requeue (resumed at 30); lr in config"
