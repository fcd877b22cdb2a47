#!/usr/bin/env bash
# python: Lightning started as dstack starts it (one process, Trainer(devices=2, strategy="ddp"))
# under `tandem run` (issue 30), with the real Lightning of the frameworks' venv. tandem starts
# one process per device and Lightning none, so this is refused before the first step with the
# line to change (nproc_per_node: 2 / --nproc-per-node 2) instead of Lightning's bare ValueError;
# then that line, unchanged script, trains on 2 ranks.
set -uo pipefail
SRC=${TANDEM_SOURCE_DIR:?TANDEM_SOURCE_DIR must name the source tree}
. "$SRC/tests/lib/project.sh"
. "$SRC/tests/lib/frameworks.sh"
project_setup lightning-spawn
fw_python
cat >spawn.py <<'EOF'
import lightning as L, torch
from tandem.lightning import TandemLogger
class M(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.l = torch.nn.Linear(2, 1)
    def training_step(self, b, i):
        print("STEP rank %d batch %d" % (self.global_rank, i), flush=True)
        return self.l(b[0]).sum()
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), 0.1)
t = L.Trainer(devices=2, strategy="ddp", accelerator="cpu", max_steps=2, logger=TandemLogger(),
              enable_checkpointing=False, enable_progress_bar=False)
data = torch.utils.data.TensorDataset(torch.randn(16, 2))
t.fit(M(), torch.utils.data.DataLoader(data, batch_size=4))
print("FIT DONE rank %d of %d" % (t.global_rank, t.world_size), flush=True)
EOF
timeout -k 5 240 "$B" run -- "$FW_PY" spawn.py >one.log 2>&1 && fail "devices=2 in 1 worker succeeded: $(tail -5 one.log)"
grep -q "Trainer(devices=2, num_nodes=1) asks Lightning to start 2 processes itself" one.log ||
    fail "no tandem refusal: $(grep -i error one.log | tail -3)"
grep -q "set nproc_per_node: 2 .*tandem run --nproc-per-node 2" one.log || fail "the line to change is missing"
grep -q "STEP rank" one.log && fail "a step ran before the refusal"
echo "one worker, devices=2: refused before the first step, naming nproc_per_node: 2"
timeout -k 5 240 "$B" run --nproc-per-node 2 -- "$FW_PY" spawn.py >two.log 2>&1 ||
    fail "--nproc-per-node 2: exit $?: $(tail -5 two.log)"
grep -q "FIT DONE rank 0 of 2" two.log && grep -q "FIT DONE rank 1 of 2" two.log ||
    fail "not 2 ranks of 2: $(grep 'FIT DONE' two.log)"
echo "the suggested --nproc-per-node 2, script unchanged: Lightning trains on ranks 0 and 1 of 2"
echo OK
